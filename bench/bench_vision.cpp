// Image encode time of one 896x896 image through gemma3-4b-shaped SigLIP + projector
// weights (27 layers, hidden 1152, 4096 patches -> 256 tokens of 2560), 2 threads
// unless VLM_THREADS says otherwise, at the engine's default precision for these weights
// (io/identity.h), with the achieved FLOP/s as a fraction of that precision's peak
// measured in the same run (bf16 dot or f32 FMA), then once more in the engine's steps of a few
// layers (what a server request meets), as a ratio to the whole encode.
// Usage: bench_vision [MODEL_DIR] (default build/ckpt/gemma3-4b; make one with
//   tools/make_checkpoint.py --preset gemma3-4b). Only the vision tensors are read.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kernels/matmul.h"
#include "io/identity.h"
#include "kernels/roofline.h"
#include "models/gemma3/registry.h"
#include "models/gemma3/vision_encoder.h"

using namespace vlm;

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "build/ckpt/gemma3-4b";
  const char* env = std::getenv("VLM_THREADS");
  const int threads = env ? std::max(1, std::atoi(env)) : 2;
  try {
    if (!std::filesystem::exists(dir / "config.json"))
      fail("{}: no checkpoint here; make one with tools/make_checkpoint.py --preset gemma3-4b", dir.string());
    Checkpoint ck = models::gemma3::open_checkpoint(dir, Parts{.text = false, .vision = true});
    vision::VisionEncoder enc(ck);
    const int S = enc.processor().width;
    // A synthetic photo-like image at the model's size (the resize is then a copy).
    vision::RgbImage im;
    im.width = im.height = S;
    im.rgb.resize(size_t(S) * size_t(S) * 3);
    for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t((i * 2654435761u) >> 24);
    ThreadPool pool(threads);
    const kernels::Precision precision =
        kernels::parse_precision(default_precision(enc.tower().weight_dtype()), "precision");
    const kernels::Exec ex(pool, kernels::best_isa(), precision);
    fmt::print("model {} ({}), image {}x{}, {} patches x {} -> {} tokens x {}, {} threads, matmul {} at {}\n",
               dir.string(), dtype_name(enc.tower().weight_dtype()), S, S, enc.tower().num_patches(),
               enc.tower().hidden(), enc.projector().tokens(), enc.projector().out_dim(), threads,
               kernels::isa_name(kernels::best_isa()), kernels::precision_name(precision));
    const double flops = enc.tower().flops(1) + enc.projector().flops(1);
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const vision::ImageEncoding e = enc.encode({im}, ex);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      fmt::print("  run {}: {:.3f} s ({} features)\n", rep, s, e.features.size());
    }
    // The peak of the kernels the matrices ran on (kernels/exec.h, Exec::gemm_kernels).
    const double peak = kernels::measure_peak_flops(threads, ex.isa, ex.gemm_kernels());
    fmt::print("encode: {:.3f} s best of 2, {:.1f} GFLOP -> {:.1f} GFLOP/s = {:.1f}% of measured peak "
               "{:.1f} GFLOP/s\n",
               best, flops * 1e-9, flops / best * 1e-9, 100.0 * flops / best / peak, peak * 1e-9);
    // The server's way: a few tower layers per engine step (engine::StepBudget::vision_layers).
    const size_t layers = size_t(engine::StepBudget{}.vision_layers);
    const auto t0 = std::chrono::steady_clock::now();
    vision::VisionEncoder::Job job = enc.start({im}, ex, std::nullopt);
    while (!job.done) enc.advance(job, layers, ex);
    const double stepped = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("encode in steps of {} layers (the engine's default): {:.3f} s = {:.2f}x the best whole encode\n",
               layers, stepped, stepped / best);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_vision: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
