// A long prompt through the decoder with its masks held as MaskSpec tiles: prefill time and
// peak resident memory (VmHWM), next to what the two dense [L, L] f32 masks alone would need.
// Usage: bench_long_prompt MODEL_DIR [TOKENS] [CHUNK]
//   (defaults: 32768 tokens, one forward; CHUNK > 0 prefills in chunks of that many rows).
// The context is TOKENS whatever max_position_embeddings says (random weights: the numbers
// are meaningless, the memory and time are not).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/batch.h"
#include "models/gemma3/decoder.h"
#include "models/gemma3/registry.h"

using namespace vlm;

namespace {
// Peak resident set size of this process so far, in MiB.
double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_long_prompt MODEL_DIR [TOKENS] [CHUNK]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 32768;
  const int64_t chunk = argc > 3 && std::atoll(argv[3]) > 0 ? std::atoll(argv[3]) : n;
  const char* env = std::getenv("VLM_THREADS");
  const int threads = env ? std::max(1, std::atoi(env)) : 2;
  try {
    if (n < 1) fail("TOKENS must be positive");
    const Checkpoint ck = models::gemma3::open_checkpoint(dir, Parts{.text = true, .vision = false});
    ThreadPool pool(threads);
    const models::gemma3::Decoder model(ck, pool);
    const TextConfig& c = model.config();
    fmt::print("model {} ({} layers, H {}, window {}), {} tokens, chunks of {}, {} threads\n", dir.string(),
               c.num_layers, c.hidden_size, c.sliding_window, n, chunk, threads);
    fmt::print("peak RSS after load: {:.1f} MiB\n", peak_rss_mib());

    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = i == 0 ? 2 : int32_t(1000 + (i * 7919) % 200000);
    KvCache cache = model.new_cache(n);
    models::gemma3::Activations act(c, size_t(chunk));
    const models::MaskSpec spec{.mode = MaskMode::Causal, .window = c.sliding_window};
    std::vector<float> rows, logits(size_t(model.vocab()));
    std::vector<int64_t> pos;
    std::vector<int32_t> seq;
    std::vector<uint8_t> want;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < n; b += chunk) {
      const size_t m = size_t(std::min(chunk, n - b));
      rows.resize(m * size_t(c.hidden_size));
      model.embedder().embed({ids.data() + b, m}, rows.data());
      pos.resize(m);
      seq.assign(m, 0);
      want.assign(m, 0);
      for (size_t i = 0; i < m; ++i) pos[i] = b + int64_t(i);
      if (b + int64_t(m) == n) want[m - 1] = 1;  // logits of the last prompt row only
      const models::SeqSlot slot{&cache, &spec};
      model.forward(models::Batch{rows.data(), m, pos.data(), seq.data(), want.data()}, {&slot, 1}, act,
                    logits.data());
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double dense = 2.0 * double(n) * double(n) * 4 / (1024.0 * 1024 * 1024);
    fmt::print("prefill: {} tokens in {:.2f} s = {:.1f} tokens/s\n", n, dt, double(n) / dt);
    fmt::print("peak RSS: {:.1f} MiB (KV cache {:.1f} MiB; two dense f32 masks alone would be {:.2f} GiB)\n",
               peak_rss_mib(),
               double(n) * double(cache.row_bytes()) * 2 *
                   double(std::count(c.layer_kinds.begin(), c.layer_kinds.end(), LayerKind::Global)) /
                   (1024.0 * 1024),
               dense);
  } catch (const Error& e) {
    fmt::print(stderr, "bench_long_prompt: {}\n", e.what());
    return 1;
  }
  return 0;
}
