// Kernel throughput against this machine's measured limits (2 threads unless
// VLM_THREADS says otherwise): GEMV (decode) as a fraction of read bandwidth, GEMM
// (prefill, vision encoder) as a fraction of the f32 FMA peak, and the scalar path
// for comparison. Usage: bench_kernels [--quick]
//        bench_kernels --decode-profile MODEL_DIR [CONTEXT] [STEPS] [BATCH]
// The second form replays one decode step of a checkpoint op by op on the kernels (every
// layer's norms, q/k/v/o, gate/up/down, attention over CONTEXT cached positions, the
// head) for BATCH sequences at once (1 unless given), and prints each op's weight and cache
// bytes, time and share, next to the bandwidth probe and the FMA peak.
//        bench_kernels --prefill-profile MODEL_DIR [TOKENS] [STEPS]
// The third replays a prefill of TOKENS tokens the same way: each op's time and share of the
// FMA peak, to compare across thread counts (VLM_THREADS).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <string>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "models/gemma3/decoder.h"
#include "models/gemma3/registry.h"
#include "models/mask.h"
#include "models/kv_cache.h"
#include "core/thread_pool.h"
#include "io/identity.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/roofline.h"
#include "nn/attention.h"

using namespace vlm;
using namespace vlm::kernels;

namespace {

// 2 threads (the machines these figures are compared on), or VLM_THREADS when it is set.
int bench_threads() { return std::getenv("VLM_THREADS") ? default_threads() : std::min(2, default_threads()); }

struct Buffer {
  std::vector<std::byte> bytes;
  Weight w;
};

// Random weights in the given dtype (values in [-1, 1)).
Buffer make_weight(DType dt, size_t rows, size_t cols) {
  Buffer b;
  const size_t n = rows * cols, es = dtype_size(dt);
  b.bytes.resize(n * es);
  std::mt19937 rng(1);
  for (size_t i = 0; i < n; ++i) {
    const float v = float(int32_t(rng() >> 8) - (1 << 23)) / float(1 << 23);
    if (dt == DType::F32) {
      std::memcpy(b.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
    }
  }
  b.w = Weight{b.bytes.data(), dt, rows, cols};
  return b;
}

// Best seconds per call over `reps` timed calls after one warm-up call.
template <class F>
double best_time(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Other processes on a shared machine skew every figure; print the load with them.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string line;
  std::getline(f, line);
  return line.substr(0, line.find(' ')) + "\n";
}

// A checkpoint's decoder weights at the precision the engine runs it at by default, for the
// replays below.
struct Replay {
  struct Layer {
    Weight q, k, v, o, gate, up, down;
    bool sliding;
  };
  ThreadPool pool;
  Checkpoint ck;
  Exec ex;
  const TextConfig& c;
  std::vector<Layer> layers;
  Weight head;
  std::vector<float> norm_w;  // every norm's weights: the values do not change the time

  explicit Replay(const char* dir)
      : pool(bench_threads()),
        ck(models::gemma3::open_checkpoint(dir, Parts{.text = true, .vision = false})),
        ex(pool, best_isa(),
           parse_precision(
               default_precision(models::gemma3::layer_tensor(ck, 0, models::gemma3::LayerTensor::Q).dtype),
               "precision")),
        c(ck.config().text),
        head(as_weight(ck.lm_head())),
        norm_w(size_t(std::max(c.hidden_size, c.head_dim)), 0.1f) {
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "text.layers." + std::to_string(l) + ".";
      auto w = [&](const char* n) { return as_weight(ck.get(p + n)); };
      layers.push_back({w("self_attn.q_proj.weight"), w("self_attn.k_proj.weight"), w("self_attn.v_proj.weight"),
                        w("self_attn.o_proj.weight"), w("mlp.gate_proj.weight"), w("mlp.up_proj.weight"),
                        w("mlp.down_proj.weight"), c.layer_kinds.at(size_t(l)) == LayerKind::Sliding});
    }
  }
  nn::AttnShape shape() const {
    return {size_t(c.num_heads), size_t(c.num_kv_heads), size_t(c.head_dim), 0.0625f};
  }
};

enum Op { RowWise, QKV, Attn, O, GateUp, Down, Head, kOps };

// Each op's bytes (weights, and the cache it reads) and FLOPs for `rows` rows through every layer
// and the head; attention's are added by the caller.
struct OpTable {
  double bytes[kOps] = {}, flops[kOps] = {}, best[kOps], best_total = 1e30;
  OpTable(const Replay& r, size_t rows) {
    for (double& b : best) b = 1e30;
    auto wb = [](const Weight& w) { return double(w.stride_bytes() * w.rows); };
    auto fl = [&](const Weight& w) { return 2.0 * double(rows * w.rows * w.cols); };
    for (const Replay::Layer& ly : r.layers) {
      bytes[QKV] += wb(ly.q) + wb(ly.k) + wb(ly.v);
      bytes[O] += wb(ly.o);
      bytes[GateUp] += wb(ly.gate) + wb(ly.up);
      bytes[Down] += wb(ly.down);
      flops[QKV] += fl(ly.q) + fl(ly.k) + fl(ly.v);
      flops[O] += fl(ly.o);
      flops[GateUp] += fl(ly.gate) + fl(ly.up);
      flops[Down] += fl(ly.down);
    }
    bytes[Head] = wb(r.head);
    flops[Head] = fl(r.head);
  }
  // Runs step(timed) steps + 1 times (the first pages the weights in) and keeps each op's best
  // time; step calls timed(op, f) around each op.
  template <class Step>
  void time(int steps, Step&& step) {
    for (int s = 0; s < steps + 1; ++s) {
      double t[kOps] = {};
      step([&](Op op, auto&& f) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        t[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
      if (s == 0) continue;
      double total = 0;
      for (int op = 0; op < kOps; ++op) {
        best[op] = std::min(best[op], t[op]);
        total += t[op];
      }
      best_total = std::min(best_total, total);
    }
  }
  void print(const char* const names[kOps], int steps, double tokens, double bw, double peak) const {
    fmt::print("read bandwidth probe {:.1f} GB/s, f32 FMA peak {:.1f} GFLOP/s; best of {} steps per op:\n", bw / 1e9,
               peak / 1e9, steps);
    double all_bytes = 0, all_flops = 0;
    for (int op = 0; op < kOps; ++op) {
      all_bytes += bytes[op], all_flops += flops[op];
      fmt::print("  {:<10} {:9.1f} MB {:9.2f} ms {:7.1f} GB/s {:6.1f}% of probe {:6.1f}% of peak\n", names[op],
                 bytes[op] / 1e6, best[op] * 1e3, bytes[op] / best[op] / 1e9, 100 * bytes[op] / best[op] / bw,
                 100 * flops[op] / best[op] / peak);
    }
    fmt::print("  best whole step {:.2f} ms = {:.2f} tokens/s for {:.3f} GB: {:.1f} GB/s, {:.1f}% of probe, "
               "{:.1f}% of peak (limit {:.2f} tokens/s)\n",
               best_total * 1e3, tokens / best_total, all_bytes / 1e9, all_bytes / best_total / 1e9,
               100 * all_bytes / best_total / bw, 100 * all_flops / best_total / peak,
               tokens * std::min(bw / all_bytes, peak / all_flops));
  }
};

}  // namespace

// One decode step replayed on the kernels, op by op (see the usage note at the top).
int decode_profile(const char* dir, int context, int steps, int batch) {
  Replay r(dir);
  const Exec& ex = r.ex;
  const TextConfig& c = r.c;
  const size_t H = size_t(c.hidden_size), I = size_t(c.intermediate_size), d = size_t(c.head_dim);
  const size_t nH = size_t(c.num_heads), nKV = size_t(c.num_kv_heads), L = size_t(context);
  const size_t B = size_t(std::max(1, batch));
  std::vector<float> x(B * H, 0.01f), a(B * H), q(B * nH * d), kk(B * nKV * d), vv(B * nKV * d),
      att(B * nH * d), g(B * I), u(B * I), logits(B * r.head.rows);
  const float* norm_w = r.norm_w.data();
  // A KV cache of L positions for every layer and sequence in the rows the decoder keeps at this
  // precision (bf16 under bf16, else f32), random-ish values.
  const size_t cache = L * nKV * d;
  const DType kv = vlm::KvCache::dtype_for(ex.precision);
  const size_t es = dtype_size(kv);
  std::vector<std::byte> kc(B * r.layers.size() * cache * es), vc(kc.size());
  for (size_t i = 0; i < kc.size() / es; ++i) {
    const float f = float(i % 97) * 1e-3f;
    if (kv == DType::BF16) {
      const uint16_t h = f32_to_bf16(f);
      std::memcpy(kc.data() + 2 * i, &h, 2), std::memcpy(vc.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(kc.data() + 4 * i, &f, 4), std::memcpy(vc.data() + 4 * i, &f, 4);
    }
  }
  const nn::AttnShape shape = r.shape();
  nn::AttnScratch scratch;
  std::vector<nn::DecodeRow> rows(B);
  OpTable ops(r, B);
  ops.bytes[Attn] = double(r.layers.size() * B) * 2.0 * double(cache * es);
  ops.flops[Attn] = double(r.layers.size() * B) * 4.0 * double(L * nH * d);
  const double bw = measure_read_bandwidth(r.pool.size());
  const double peak = measure_peak_flops(r.pool.size());
  ops.time(steps, [&](auto&& timed) {
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const Replay::Layer& ly = r.layers[l];
      timed(RowWise, [&] { rms_norm(x.data(), norm_w, a.data(), B, H, 1e-6f, ex.isa); });
      timed(QKV, [&] {
        const Product qkv[] = {{ly.q, q.data()}, {ly.k, kk.data()}, {ly.v, vv.data()}};
        matmul_each(a.data(), B, qkv, ex);
      });
      timed(RowWise, [&] {
        rms_norm(q.data(), norm_w, q.data(), B * nH, d, 1e-6f, ex.isa);
        rms_norm(kk.data(), norm_w, kk.data(), B * nKV, d, 1e-6f, ex.isa);
      });
      timed(Attn, [&] {
        for (size_t b = 0; b < B; ++b) {
          const size_t at = (b * r.layers.size() + l) * cache * es;
          rows[b] = {q.data() + b * nH * d, kc.data() + at, vc.data() + at, L, att.data() + b * nH * d};
        }
        nn::attention_decode(rows, shape, kv, scratch, ex);
      });
      timed(O, [&] { matmul(att.data(), B, ly.o, a.data(), ex); });
      timed(RowWise, [&] { rms_norm(a.data(), norm_w, a.data(), B, H, 1e-6f, ex.isa); });
      timed(GateUp, [&] {
        const Product gate_up[] = {{ly.gate, g.data()}, {ly.up, u.data()}};
        matmul_each(a.data(), B, gate_up, ex);
        gelu_tanh_mul(g.data(), u.data(), B * I, ex.isa);
      });
      timed(Down, [&] { matmul(g.data(), B, ly.down, a.data(), ex); });
      timed(RowWise, [&] { rms_norm(a.data(), norm_w, a.data(), B, H, 1e-6f, ex.isa); });
    }
    timed(Head, [&] { matmul(x.data(), B, r.head, logits.data(), ex); });
  });
  fmt::print("decode step replayed on the kernels: {} ({} layers, context {}, batch {}), {} threads, {}, "
             "precision {}, load average {}",
             dir, c.num_layers, L, B, r.pool.size(), isa_name(ex.isa), precision_name(ex.precision), load_average());
  const char* names[kOps] = {"norms", "q/k/v", "attention", "o", "gate/up", "down", "head"};
  ops.print(names, steps, double(B), bw, peak);
  return 0;
}

// One prefill of `n` tokens replayed on the kernels, op by op, as Decoder::layer runs it: the
// row-wise work over the pool in ranges of Decoder::kRowGrain rows, causal attention over the
// chunk's own keys (sliding layers within the window), the head on the last row only.
int prefill_profile(const char* dir, int tokens, int steps) {
  Replay r(dir);
  const Exec& ex = r.ex;
  const TextConfig& c = r.c;
  const size_t H = size_t(c.hidden_size), I = size_t(c.intermediate_size), d = size_t(c.head_dim);
  const size_t nH = size_t(c.num_heads), nKV = size_t(c.num_kv_heads), n = size_t(std::max(1, tokens));
  std::vector<float> x(n * H, 0.01f), a(n * H), t(n * H), q(n * nH * d), kk(n * nKV * d), vv(n * nKV * d),
      att(n * nH * d), g(n * I), u(n * I), logits(r.head.rows), cs(n * d / 2, 1.f), sn(n * d / 2, 0.f);
  const float* norm_w = r.norm_w.data();
  const nn::AttnShape shape = r.shape();
  nn::AttnScratch scratch;
  const models::MaskSpec spec{.mode = MaskMode::Causal, .window = c.sliding_window};
  const DType kv = vlm::KvCache::dtype_for(ex.precision);
  OpTable ops(r, n);
  ops.flops[Head] = 2.0 * double(r.head.rows * r.head.cols);  // the last row only
  for (const Replay::Layer& ly : r.layers) {
    double keys = 0;  // keys per row summed: row i sees min(i + 1, W) on a sliding layer
    for (size_t i = 0; i < n; ++i) keys += double(ly.sliding ? std::min(i + 1, size_t(c.sliding_window)) : i + 1);
    ops.flops[Attn] += 4.0 * keys * double(nH * d);
  }
  auto rows = [&](auto&& f) {
    r.pool.parallel_for(n, [&](size_t r0, size_t r1) { f(r0, r1 - r0); }, models::gemma3::Decoder::kRowGrain);
  };
  const double bw = measure_read_bandwidth(r.pool.size());
  const double peak = measure_peak_flops(r.pool.size());
  ops.time(steps, [&](auto&& timed) {
    for (const Replay::Layer& ly : r.layers) {
      timed(RowWise, [&] {
        rows([&](size_t r0, size_t m) { rms_norm(x.data() + r0 * H, norm_w, a.data() + r0 * H, m, H, 1e-6f, ex.isa); });
      });
      timed(QKV, [&] {
        const Product qkv[] = {{ly.q, q.data()}, {ly.k, kk.data()}, {ly.v, vv.data()}};
        matmul_each(a.data(), n, qkv, ex);
      });
      timed(RowWise, [&] {
        rows([&](size_t r0, size_t m) {
          rms_norm(q.data() + r0 * nH * d, norm_w, q.data() + r0 * nH * d, m * nH, d, 1e-6f, ex.isa);
          rms_norm(kk.data() + r0 * nKV * d, norm_w, kk.data() + r0 * nKV * d, m * nKV, d, 1e-6f, ex.isa);
          for (size_t i = r0; i < r0 + m; ++i) {
            rope_rotate_half(q.data() + i * nH * d, nH, d, cs.data() + i * d / 2, sn.data() + i * d / 2);
            rope_rotate_half(kk.data() + i * nKV * d, nKV, d, cs.data() + i * d / 2, sn.data() + i * d / 2);
          }
          if (kv == DType::BF16) {  // the cache's rows, as the decoder rounds them
            round_to_bf16(kk.data() + r0 * nKV * d, kk.data() + r0 * nKV * d, m * nKV * d, ex.isa);
            round_to_bf16(vv.data() + r0 * nKV * d, vv.data() + r0 * nKV * d, m * nKV * d, ex.isa);
          }
        });
      });
      timed(Attn, [&] {
        const models::SpecTiles tiles(spec, ly.sliding, 0, int(n), 0);
        nn::attention(q.data(), n, kk.data(), vv.data(), n, &tiles, shape, att.data(), scratch, ex.exact());
      });
      timed(O, [&] { matmul(att.data(), n, ly.o, t.data(), ex); });
      timed(RowWise, [&] {
        rows([&](size_t r0, size_t m) {
          rms_norm(t.data() + r0 * H, norm_w, t.data() + r0 * H, m, H, 1e-6f, ex.isa);
          for (size_t i = r0 * H; i < (r0 + m) * H; ++i) x[i] += t[i];
        });
        rows([&](size_t r0, size_t m) { rms_norm(x.data() + r0 * H, norm_w, a.data() + r0 * H, m, H, 1e-6f, ex.isa); });
      });
      timed(GateUp, [&] {
        const Product gate_up[] = {{ly.gate, g.data()}, {ly.up, u.data()}};
        matmul_each(a.data(), n, gate_up, ex);
      });
      timed(RowWise, [&] {
        rows([&](size_t r0, size_t m) { gelu_tanh_mul(g.data() + r0 * I, u.data() + r0 * I, m * I, ex.isa); });
      });
      timed(Down, [&] { matmul(g.data(), n, ly.down, t.data(), ex); });
      timed(RowWise, [&] {
        rows([&](size_t r0, size_t m) {
          rms_norm(t.data() + r0 * H, norm_w, t.data() + r0 * H, m, H, 1e-6f, ex.isa);
          for (size_t i = r0 * H; i < (r0 + m) * H; ++i) x[i] = 0.01f + 1e-3f * t[i];  // x stays small
        });
      });
    }
    timed(Head, [&] { matmul(x.data() + (n - 1) * H, 1, r.head, logits.data(), ex); });
  });
  fmt::print("prefill replayed on the kernels: {} ({} layers, {} tokens), {} threads, {}, precision {}, load average {}",
             dir, c.num_layers, n, r.pool.size(), isa_name(ex.isa), precision_name(ex.precision), load_average());
  const char* names[kOps] = {"row-wise", "q/k/v", "attention", "o", "gate/up", "down", "head"};
  ops.print(names, steps, double(n), bw, peak);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 2 && (std::string_view(argv[1]) == "--decode-profile" || std::string_view(argv[1]) == "--prefill-profile")) {
    try {
      if (std::string_view(argv[1]) == "--prefill-profile")
        return prefill_profile(argv[2], argc > 3 ? std::atoi(argv[3]) : 512, argc > 4 ? std::atoi(argv[4]) : 3);
      return decode_profile(argv[2], argc > 3 ? std::atoi(argv[3]) : 512, argc > 4 ? std::atoi(argv[4]) : 5,
                            argc > 5 ? std::atoi(argv[5]) : 1);
    } catch (const std::exception& e) {
      fmt::print(stderr, "bench_kernels: error: {}\n", e.what());
      return 1;
    }
  }
  const bool quick = argc > 1 && std::string_view(argv[1]) == "--quick";
  const int threads = bench_threads();
  ThreadPool pool(threads);
  const Isa best = best_isa();
  const Exec scalar(pool, Isa::Scalar);

  const double bw = measure_read_bandwidth(threads);
  const double peak = measure_peak_flops(threads);
  const double peak1 = measure_peak_flops(1);
  fmt::print("machine: {} threads, matmul path {}, load average {}", threads, isa_name(best),
             load_average());
  fmt::print("  read bandwidth      {:8.1f} GB/s  (1 GiB streamed)\n", bw / 1e9);
  fmt::print("  f32 FMA peak        {:8.1f} GFLOP/s ({:.1f} on 1 thread)\n", peak / 1e9, peak1 / 1e9);

  fmt::print("\nGEMV (M = 1, decode): weight bytes / time vs read bandwidth\n");
  struct GemvCase {
    DType dt;
    size_t N, K;
    const char* what;
  };
  std::vector<GemvCase> gemv = {{DType::BF16, 10240, 2560, "4B gate/up"},
                                {DType::BF16, 2560, 10240, "4B down"},
                                {DType::BF16, 2048, 2560, "4B q"},
                                {DType::F16, 10240, 2560, "4B gate/up"},
                                {DType::F32, 10240, 2560, "4B gate/up"}};
  if (!quick) gemv.push_back({DType::BF16, 262208, 2560, "4B LM head"});
  for (const auto& c : gemv) {
    // Decode streams every layer's weights once per token, so nothing is in cache:
    // cycle through copies that together exceed the last-level cache (32 MiB here).
    const Buffer b = make_weight(c.dt, c.N, c.K);
    const size_t copies = std::max<size_t>(1, (size_t(256) << 20) / b.bytes.size());
    std::vector<std::vector<std::byte>> more(copies - 1, b.bytes);
    std::vector<float> x(c.K, 0.5f), y(c.N);
    size_t next = 0;
    const double t = best_time(copies > 5 ? copies : 5, [&] {
      Weight w = b.w;
      if (next % copies) w.data = more[next % copies - 1].data();
      ++next;
      matmul(x.data(), 1, w, y.data(), pool);
    });
    const double gbs = double(b.bytes.size()) / t;
    fmt::print("  {:<4} [{:6}, {:5}] {:<11} {:8.3f} ms {:7.1f} GB/s  {:5.1f}% of bandwidth\n",
               dtype_name(c.dt), c.N, c.K, c.what, t * 1e3, gbs / 1e9, 100 * gbs / bw);
  }
  {
    const Buffer b = make_weight(DType::BF16, 10240, 2560);
    std::vector<float> x(2560, 0.5f), y(10240);
    const double t = best_time(2, [&] { matmul(x.data(), 1, b.w, y.data(), scalar); });
    const double gbs = double(b.bytes.size()) / t;
    fmt::print("  scalar path, BF16 [10240, 2560]: {:8.3f} ms {:7.1f} GB/s  {:5.1f}% of bandwidth\n",
               t * 1e3, gbs / 1e9, 100 * gbs / bw);
  }

  fmt::print("\nGEMM (prefill, vision): 2·M·N·K / time vs f32 FMA peak\n");
  struct GemmCase {
    size_t M, N, K;
    const char* what;
  };
  std::vector<GemmCase> gemm = {{256, 4304, 1152, "vision fc1"}, {256, 1152, 1152, "vision attn"},
                                {256, 10240, 2560, "text gate"}, {4096, 1152, 1152, "vision attn"}};
  if (!quick) {
    gemm.push_back({4096, 4304, 1152, "vision fc1"});
    gemm.push_back({4096, 1152, 4304, "vision fc2"});
    gemm.push_back({4096, 10240, 2560, "text gate"});
  }
  // "bf16dot" and "amx" rows: Precision::Bf16 on the AVX512-BF16 dot and on AMX tiles (x rounded
  // to bf16), against the same f32 peak, so they can exceed 100%.
  struct Variant {
    DType dt;
    Precision precision;
    Bf16Gemm kernels;
    const char* label;
  };
  std::vector<Variant> variants = {{DType::BF16, Precision::F32, Bf16Gemm::Fma, "bf16"},
                                   {DType::F32, Precision::F32, Bf16Gemm::Fma, "f32"}};
  if (bf16_dot_supported()) variants.push_back({DType::BF16, Precision::Bf16, Bf16Gemm::Dot, "bf16dot"});
  if (amx_supported()) variants.push_back({DType::BF16, Precision::Bf16, Bf16Gemm::Amx, "amx"});
  for (const Variant& v : variants) {
    const DType dt = v.dt;
    Exec ex(pool, best, v.precision);
    ex.bf16_gemm = v.kernels;
    for (const auto& c : gemm) {
      if (dt == DType::F32 && c.M == 4096 && c.N == 10240) continue;
      const Buffer b = make_weight(dt, c.N, c.K);
      std::vector<float> x(c.M * c.K, 0.25f), y(c.M * c.N);
      const double flop = 2.0 * double(c.M) * double(c.N) * double(c.K);
      const double t = best_time(c.M == 4096 ? 1 : 3, [&] { matmul(x.data(), c.M, b.w, y.data(), ex); });
      fmt::print("  {:<7} M={:4} [{:5}, {:5}] {:<11} {:9.2f} ms {:7.1f} GFLOP/s  {:5.1f}% of peak\n",
                 v.label, c.M, c.N, c.K, c.what, t * 1e3,
                 flop / t / 1e9, 100 * flop / t / peak);
    }
  }
  {
    const Buffer b = make_weight(DType::BF16, 1152, 1152);
    std::vector<float> x(256 * 1152, 0.25f), y(256 * 1152);
    const double t = best_time(1, [&] { matmul(x.data(), 256, b.w, y.data(), scalar); });
    const double flop = 2.0 * 256 * 1152 * 1152;
    fmt::print("  scalar path, BF16 M=256 [1152, 1152]: {:9.2f} ms {:7.1f} GFLOP/s  {:5.1f}% of peak\n",
               t * 1e3, flop / t / 1e9, 100 * flop / t / peak);
  }
  {
    // Small M (several sequences decoding at once, short prefill chunks).
    const Buffer b = make_weight(DType::BF16, 10240, 2560);
    fmt::print("\nsmall M, BF16 [10240, 2560]:\n");
    for (size_t M : {1, 2, 4, 5, 8, 16, 32, 64}) {
      std::vector<float> x(M * 2560, 0.25f), y(M * 10240);
      const double t = best_time(3, [&] { matmul(x.data(), M, b.w, y.data(), pool); });
      const double flop = 2.0 * double(M) * 10240 * 2560;
      fmt::print("  M={:3} {:8.3f} ms  {:6.1f} GB/s weights  {:7.1f} GFLOP/s\n", M, t * 1e3,
                 double(b.bytes.size()) / t / 1e9, flop / t / 1e9);
    }
    if (bf16_dot_supported()) {  // decode under --precision bf16: x rounded, then the same GEMV
      const Exec ex(pool, best, Precision::Bf16);
      std::vector<float> x(2560, 0.25f), y(10240);
      const double t = best_time(3, [&] { matmul(x.data(), 1, b.w, y.data(), ex); });
      fmt::print("  M=  1 bf16dot {:8.3f} ms  {:6.1f} GB/s weights\n", t * 1e3, double(b.bytes.size()) / t / 1e9);
    }
  }
  {
    // Element-wise ops at vision-encoder sizes, one thread (callers split rows).
    fmt::print("\nops, 1 thread (vision sizes):\n");
    std::vector<float> g(4096 * 4304), sm(4096 * 4096);
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(int(i % 2001) - 1000) / 250.f;
    for (size_t i = 0; i < sm.size(); ++i) sm[i] = float(int(i % 997)) / 50.f;
    for (Isa isa : {best, Isa::Scalar}) {
      const double tg = best_time(1, [&] { gelu_tanh(g.data(), g.size(), isa); });
      const double ts = best_time(1, [&] {
        for (size_t r = 0; r < 4096; ++r) softmax(sm.data() + r * 4096, 4096, isa);
      });
      fmt::print("  {:<7} gelu_tanh {:6.2f} ns/elem   softmax rows of 4096 {:6.2f} ns/elem\n",
                 isa_name(isa), tg / double(g.size()) * 1e9, ts / double(sm.size()) * 1e9);
    }
  }
  return 0;
}
