// Text decoder speed on a gemma3-4b-shaped checkpoint: prefill tokens/s and decode
// tokens/s (2 threads unless VLM_THREADS says otherwise), with decode stated as a
// fraction of the memory-bandwidth limit: every decode step streams all decoder
// matrices and the tied output head once, so the limit is
//   read bandwidth (measured in this run) / weight bytes per token.
// Usage: bench_decoder [MODEL_DIR | MODEL.gguf] [PROMPT_TOKENS] [DECODE_TOKENS]
//   (defaults build/ckpt/gemma3-4b, 128, 16; make the folder with
//   tools/make_checkpoint.py --preset gemma3-4b). Random weights: tokens are meaningless.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "models/gemma3/registry.h"
#include "kernels/matmul.h"
#include "kernels/roofline.h"
#include "models/gemma3/decoder.h"
#include "multimodal/host.h"

using namespace vlm;

namespace {
// A text prompt at the prefill door, built by the host as every front end builds it.
PrefillInput text_input(const models::gemma3::Decoder& model, const Checkpoint& ck, std::span<const int32_t> ids) {
  HostOptions o;
  o.mask_mode = MaskMode::Causal;
  return build_prefill(model, ck.config(), nullptr, ids, {}, o, model.exec()).input;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "build/ckpt/gemma3-4b";
  const int n_prompt = argc > 2 ? std::atoi(argv[2]) : 128;
  const int n_decode = argc > 3 ? std::atoi(argv[3]) : 16;
  const char* env = std::getenv("VLM_THREADS");
  const int threads = env ? std::max(1, std::atoi(env)) : 2;
  try {
    if (!std::filesystem::exists(dir / "config.json") && dir.extension() != ".gguf")
      fail("{}: no checkpoint here; make one with tools/make_checkpoint.py --preset gemma3-4b", dir.string());
    if (n_prompt < 1 || n_decode < 1) fail("prompt and decode token counts must be positive");
    Checkpoint ck = models::gemma3::open_checkpoint(dir, Parts{.text = true, .vision = false});
    ThreadPool pool(threads);
    const models::gemma3::Decoder model(ck, pool);
    const TextConfig& c = model.config();

    // Bytes one decode step reads from weights: every decoder matrix plus the head.
    size_t weight_bytes = ck.lm_head().nbytes;
    for (const auto& [name, t] : ck.tensors())
      if (name.starts_with("text.layers.") && t.shape.size() == 2) weight_bytes += t.nbytes;
    fmt::print("model {} ({} layers, H {}, V {}, {}), {} threads, matmul {}\n", dir.string(),
               c.num_layers, c.hidden_size, model.vocab(), dtype_name(ck.lm_head().dtype), threads,
               kernels::isa_name(kernels::best_isa()));
    fmt::print("weight bytes per decode token: {:.3f} GB\n", double(weight_bytes) * 1e-9);

    std::vector<int32_t> ids(static_cast<size_t>(n_prompt));
    for (int i = 0; i < n_prompt; ++i) ids[size_t(i)] = i == 0 ? 2 : 1000 + (i * 7919) % 200000;
    {  // Untimed one-token pass: pages the mmapped weights in, so no timing below reads disk.
      KvCache warm = model.new_cache(1);
      model.prefill_from_embeddings(text_input(model, ck, {ids.data(), 1}), warm);
    }
    KvCache cache = model.new_cache(n_prompt + n_decode + 1);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = model.prefill_from_embeddings(text_input(model, ck, ids), cache);
    const double t_prefill = seconds_since(t0);
    fmt::print("prefill: {} tokens in {:.2f} s = {:.1f} tokens/s\n", n_prompt, t_prefill, n_prompt / t_prefill);

    // This VM's bandwidth drifts by up to 2x within a minute: measure it right before and
    // right after the decode loop and judge decode against the higher figure.
    const double bw_before = kernels::measure_read_bandwidth(threads);
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    double best = 1e30, total = 0;
    for (int s = 0; s < n_decode; ++s) {
      const models::gemma3::DecodeItem item{&cache, next};
      t0 = std::chrono::steady_clock::now();
      logits = model.decode_step({&item, 1});
      const double dt = seconds_since(t0);
      best = std::min(best, dt);
      total += dt;
      next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    const double bw_after = kernels::measure_read_bandwidth(threads);
    const double bw = std::max(bw_before, bw_after);
    const double limit = bw / double(weight_bytes);
    const double rate = n_decode / total;
    fmt::print("decode: {} tokens in {:.2f} s = {:.3f} tokens/s (best step {:.3f} s)\n", n_decode, total, rate, best);
    fmt::print("read bandwidth {:.2f} GB/s before, {:.2f} GB/s after ({} threads) -> limit {:.3f} tokens/s; "
               "decode at {:.1f}% of the bandwidth limit (best step: {:.1f}%)\n",
               bw_before * 1e-9, bw_after * 1e-9, threads, limit, 100.0 * rate / limit,
               100.0 / best / limit);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_decoder: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
