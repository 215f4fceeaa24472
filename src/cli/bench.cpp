// `vlm bench`: how fast this machine runs a checkpoint, each figure next to the machine's
// limit measured in the same run and the fraction reached.
//   prefill  a --pp-token prompt through the engine's step (all rows in one step), the second of two
//            in one engine (the first, cold, printed beside it) →
//            tokens/s vs the peak of the kernels it runs on (the f32 FMA, or under --precision
//            bf16 the bf16 dot or AMX tiles where the CPU has them): FLOPs = 2 × the decoder's matrix weights × tokens (+ the head
//            for the last row; attention's own products are left out, < 1 % at 512 tokens)
//   decode   --tg tokens of one sequence after a one-token prompt (as llama-bench's tg), or after
//            a --depth-token one (as llama-bench -d) → tokens/s vs the roofline: read bandwidth
//            (probe run before and after, the higher) ÷ the bytes one step reads (every decoder
//            matrix + the head, and the KV rows the step's attention reads, on average over the
//            steps: all positions on global layers, the window on sliding ones)
//   batch    --batch sequences decoding together through the engine's step: aggregate
//            tokens/s over the steps where all of them decode, vs its limit: one weight read
//            serves every sequence (the roofline × B) unless B rows' FLOPs at the peak take
//            longer; and as a multiple of batch 1
//   draft    (--draft K) the decode test again with drafts of up to K ids (engine::StepBudget::
//            draft_tokens) → tokens/s as a multiple of decode's, the draft ids taken, and what a
//            step that checks K ids costs against a plain step: drafts pay where the answer takes
//            more than that ratio − 1 of them a step (a random checkpoint's answer repeats, so
//            nearly all are taken here: the best case)
//   image    (--image) one synthetic image through preprocessing, SigLIP and the projector
//            → seconds vs the same peak as prefill (FLOPs from the tower's matrices and attention)
//   start    Model::load, then the first token of a one-token prompt (page cache as found)
//   weights  the decode step's weight bytes read where they are mapped, as the probe reads
//            (kernels::measure_regions_bandwidth): the rate their pages allow, and the share
//            of their files' resident pages mapped as 2 MiB pages
//   rss      peak resident memory (the bandwidth probe's buffer left out) vs the bytes of the
//            weights used (the vision part only with --image) + the KV caches
// Random-weight checkpoints give meaningless tokens; only the time matters. With --json the
// last line is one JSON object with every figure.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prompt_args.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "kernels/format.h"
#include "kernels/roofline.h"
#include "models/gemma3/registry.h"

namespace vlm::cli {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::shared_ptr<engine::Sequence> make_seq(const engine::Model& m, std::vector<int32_t> prompt, int max_tokens,
                                           engine::Callbacks cb = {}) {
  engine::Request req;
  req.prompt = std::move(prompt);
  req.max_tokens = max_tokens;
  req.ignore_eos = true;  // every run produces exactly max_tokens
  return std::make_shared<engine::Sequence>(m, std::move(req), std::move(cb));
}

// Milliseconds that Sampler::sample takes on a copy of `logits` under p, best of five.
double sample_ms(const SamplingParams& p, std::span<const float> logits) {
  Sampler s(p);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> l(logits.begin(), logits.end());
    const auto t0 = Clock::now();
    s.sample(l);
    best = std::min(best, seconds_since(t0));
  }
  return best * 1e3;
}

// Prompt ids: <bos> then ids spread over the ordinary vocabulary.
std::vector<int32_t> prompt_ids(int n, int salt, int vocab) {
  std::vector<int32_t> ids(size_t(n), 2);
  for (int i = 1; i < n; ++i) ids[size_t(i)] = 1000 + int32_t((int64_t(i) * 7919 + salt * 104729) % (vocab - 2000));
  return ids;
}

// Peak resident bytes (VmHWM) of this process.
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  123 kB"
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// The bandwidth probe's 1 GiB buffer is not the model's memory: the peak before it is kept,
// then the high-water mark is reset to the current RSS (Linux: "5" to /proc/self/clear_refs).
double probe_bandwidth(int threads, int64_t& rss_peak) {
  rss_peak = std::max(rss_peak, peak_rss_bytes());
  const double bw = kernels::measure_read_bandwidth(threads);
  std::ofstream("/proc/self/clear_refs") << "5";
  return bw;
}

double pct(double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; }
}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Measure prefill, decode, batched decode and image speed against this machine's limits"};
  std::string model_dir, mmproj, precision;
  int threads = default_threads(), pp = 512, tg = 128, batch = 8, depth = 0, draft = 0;
  bool image = false, json = false, mlock = false;
  app.add_option("--model", model_dir, "checkpoint folder, GGUF model file or folder of GGUF files")->required();
  app.add_option("--mmproj", mmproj, "GGUF models: the mmproj .gguf (default: the model folder's mmproj*.gguf)");
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024));
  app.add_option("--pp", pp, "prompt tokens of the prefill test")->check(CLI::Range(1, 1 << 20));
  app.add_option("--tg", tg, "tokens of the decode test")->check(CLI::Range(1, 1 << 20));
  app.add_option("--depth", depth, "prompt tokens before the decode test (as llama-bench -d; 0: one)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--batch", batch, "sequences of the batched decode test (their --tg/4 steps, at least 4)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--draft", draft, "also time the decode test with drafts of up to this many ids")
      ->check(CLI::Range(0, 64));
  app.add_flag("--image", image, "also time one image through the vision tower and projector");
  app.add_flag("--json", json, "print every figure as one JSON object on the last line");
  add_precision_option(app, precision);
  add_mlock_option(app, mlock);
  CLI11_PARSE(app, argc, argv);

  engine::ModelOptions mo;
  mo.mlock = mlock;
  mo.vision = image;
  mo.mmproj = mmproj;
  mo.threads = threads;
  mo.precision = precision_of(precision);
  mo.isa = isa_from_env();
  const auto t_load = Clock::now();
  const std::shared_ptr<const engine::Model> model = engine::Model::load(model_dir, mo);
  const double load_s = seconds_since(t_load);
  const engine::Model& m = *model;
  if (image && !m.has_vision()) fail("--image: {}", m.no_vision_tower());
  const TextConfig& tc = m.config().text;
  const int batch_steps = std::max(4, tg / 4);
  if (int64_t(pp) + 2 > m.context() || int64_t(depth) + int64_t(tg) + 2 > m.context() ||
      int64_t(batch_steps) + 3 > m.context())
    fail("--pp {} / --depth {} + --tg {}: beyond the context of {} positions", pp, depth, tg, m.context());
  const kernels::Precision prec = m.precision();
  // The kernels prefill and the image run on (kernels/exec.h, Exec::gemm_kernels) set the peak.
  const kernels::Bf16Gemm gemm = m.exec().gemm_kernels();
  const Checkpoint& ck = m.checkpoint();
  // Block-quantized matrices run on their int8 kernels unless a bf16 GEMM takes their prefill.
  const DType matrices = models::gemma3::layer_tensor(ck, 0, models::gemma3::LayerTensor::Q).dtype;
  const bool int8_blocks = kernels::format_of(matrices).act != DType::F32;

  // What one decode step reads and one prefill row multiplies.
  double layer_bytes = 0, layer_params = 0;
  std::vector<std::span<const std::byte>> step_regions;
  for (const auto& [name, t] : ck.tensors())
    if (name.starts_with("text.layers.") && t.shape.size() == 2) {
      layer_bytes += double(t.nbytes);
      layer_params += double(t.shape[0]) * double(t.shape[1]);
      step_regions.emplace_back(t.data, t.nbytes);
    }
  const TensorView& head = ck.lm_head();
  step_regions.emplace_back(head.data, head.nbytes);
  const double head_params = double(head.shape[0]) * double(head.shape[1]);
  const double step_bytes = layer_bytes + double(head.nbytes);
  double mapped_bytes = 0;
  for (const auto& [name, t] : ck.tensors())
    if (image || !(name.starts_with("vision.") || name.starts_with("projector."))) mapped_bytes += double(t.nbytes);

  auto say = [&](const std::string& s) {
    std::fprintf(json ? stderr : stdout, "%s\n", s.c_str());
    std::fflush(json ? stderr : stdout);
  };
  say(fmt::format("model {} ({} layers, H {}, vocab {}, weights {}), {} threads, isa {}, precision {}{}",
                  model_dir, tc.num_layers, tc.hidden_size, m.vocab(), ck.weight_dtypes(), threads,
                  kernels::isa_name(m.exec().isa), kernels::precision_name(prec),
                  gemm == kernels::Bf16Gemm::Dot   ? " (AVX512-BF16 dot)"
                  : gemm == kernels::Bf16Gemm::Amx ? " (AMX tiles: past 32 rows, bf16 weights from 6)"
                  : int8_blocks ? " (int8 kernels on the blocks)"
                  : prec == kernels::Precision::Bf16 ? " (rounded x, f32 FMA GEMMs)"
                                                     : ""));

  const double peak_f32 = kernels::measure_peak_flops(threads, m.exec().isa);
  const double peak = gemm != kernels::Bf16Gemm::Fma ? kernels::measure_peak_flops(threads, m.exec().isa, gemm) : peak_f32;
  say(fmt::format("peak: {:.1f} GFLOP/s f32 FMA{}", peak_f32 * 1e-9,
                  gemm == kernels::Bf16Gemm::Dot   ? fmt::format(", {:.1f} GFLOP/s bf16 dot", peak * 1e-9)
                  : gemm == kernels::Bf16Gemm::Amx ? fmt::format(", {:.1f} GFLOP/s AMX tiles", peak * 1e-9)
                                                   : std::string()));

  // The first token of a one-token prompt, which also pages the mapped weights in, so no timing
  // below reads the disk; with the page cache warm, load + this is what a user waits at start.
  double first_token_s = 0;
  {
    const auto t0 = Clock::now();
    engine::Engine eng(m);
    eng.add(make_seq(m, {2}, 1));
    eng.run_until_idle();
    first_token_s = seconds_since(t0);
  }
  say(fmt::format("start: load {:.2f} s + first token {:.2f} s = {:.2f} s", load_s, first_token_s,
                  load_s + first_token_s));

  // Prefill: every prompt row in one step (the budget allows pp rows), twice in one engine: the
  // first prompt meets its activations and the threads' buffers untouched (cold), the second, of
  // other ids, as a serving engine's prompts do (the figure; llama-bench likewise times the run
  // after a warm-up).
  double pp_s = 0, pp_cold_s = 0;
  {
    engine::Engine eng(m, engine::StepBudget{.prefill_rows = pp, .images = 1, .max_seqs = 0});
    for (int salt : {1, 2}) {
      auto s = make_seq(m, prompt_ids(pp, salt, m.vocab_limit()), 1);
      eng.add(s);
      const auto t0 = Clock::now();
      while (s->tokens().empty() && !eng.idle()) eng.step();
      (salt == 1 ? pp_cold_s : pp_s) = seconds_since(t0);
      eng.run_until_idle();
      if (s->finish_reason() == engine::FinishReason::Error) fail("prefill: {}", s->error());
    }
  }
  const double pp_tok_s = pp / pp_s;
  const double pp_flops = 2.0 * (layer_params * pp + head_params);
  say(fmt::format("prefill: {} tokens in {:.3f} s = {:.2f} tok/s; {:.1f} GFLOP/s = {:.1f}% of the peak (the first "
                  "prompt, cold: {:.3f} s)",
                  pp, pp_s, pp_tok_s, pp_flops / pp_s * 1e-9, pct(pp_flops / pp_s, peak), pp_cold_s));

  // Decode: tg tokens after a one-token prompt (<bos>) or a --depth-token one; the probe runs right
  // before and after (a shared machine's bandwidth drifts; the higher figure is the limit).
  const int64_t prompt = std::max(depth, 1);
  int64_t rss = 0;
  const double bw_before = probe_bandwidth(threads, rss);
  std::vector<double> step_s;
  std::vector<float> logits;  // the prompt step's, for the sampling figures below
  {
    engine::Engine eng(m);
    engine::Callbacks keep_first;
    keep_first.on_logits = [&](std::span<const float> l) {
      if (logits.empty()) logits.assign(l.begin(), l.end());
    };
    auto s = make_seq(m, prompt_ids(int(prompt), 3, m.vocab_limit()), tg + 1, std::move(keep_first));
    eng.add(s);
    while (s->tokens().empty() && !eng.idle()) eng.step();  // the prompt step
    while (!eng.idle()) {
      const auto t0 = Clock::now();
      eng.step();
      step_s.push_back(seconds_since(t0));
    }
    if (s->finish_reason() == engine::FinishReason::Error) fail("decode: {}", s->error());
  }
  const double bw_after = probe_bandwidth(threads, rss);
  const double bw = std::max(bw_before, bw_after);
  // The same bytes read where they lie: mapped weights stream as fast as the memory the page
  // cache gave them (docs/gguf.md, "Decode streams"), which can be well below the probe's.
  const double weights_bw = kernels::measure_regions_bandwidth(step_regions, threads);
  double tg_s = 0;
  for (double t : step_s) tg_s += t;
  const double tg_tok_s = double(step_s.size()) / tg_s;
  const double best_step = *std::min_element(step_s.begin(), step_s.end());
  // The median step beside the mean: on a shared VM a few steps run while a vCPU is away (1.7x
  // the others on the Xeon VM: docs/performance.md) and pull the mean down, not the median.
  std::vector<double> sorted = step_s;
  std::nth_element(sorted.begin(), sorted.begin() + ptrdiff_t(sorted.size() / 2), sorted.end());
  const double median_step = sorted[sorted.size() / 2];
  // The KV rows each decode step's attention reads, on average: step i attends over the prompt's
  // positions and i + 1 more, every one on a global layer, the last W on a sliding one.
  const double kv_row = 2.0 * tc.num_kv_heads * tc.head_dim * dtype_size(m.decoder().kv_dtype());
  double kv_read = 0;
  for (size_t i = 0; i < step_s.size(); ++i)
    for (LayerKind k : tc.layer_kinds) {
      const int64_t seen = prompt + int64_t(i) + 1;
      kv_read += kv_row * double(k == LayerKind::Sliding ? std::min<int64_t>(seen, tc.sliding_window) : seen);
    }
  kv_read /= double(step_s.size());
  const double roofline = bw / (step_bytes + kv_read);
  say(fmt::format("read bandwidth: {:.2f} GB/s before, {:.2f} after; {:.3f} GB per step (weights {:.3f} + KV {:.3f} "
                  "after {} prompt tokens) -> roofline {:.3f} tok/s",
                  bw_before * 1e-9, bw_after * 1e-9, (step_bytes + kv_read) * 1e-9, step_bytes * 1e-9,
                  kv_read * 1e-9, prompt, roofline));
  say(fmt::format("decode: {} tokens in {:.3f} s = {:.3f} tok/s = {:.1f}% of the roofline (median step {:.1f}%, "
                  "best {:.1f}%)",
                  step_s.size(), tg_s, tg_tok_s, pct(tg_tok_s, roofline), pct(1.0 / median_step, roofline),
                  pct(1.0 / best_step, roofline)));
  // What sampling adds to each step, on those logits (only the ids the tokenizer can produce).
  const std::span<const float> row = std::span<const float>(logits).first(size_t(m.vocab_limit()));
  SamplingParams warm;
  warm.temperature = 1.f;
  const double greedy_ms = sample_ms({}, row), t1_ms = sample_ms(warm, row);
  warm.top_k = 64, warm.top_p = 0.95f;  // Gemma 3's generation_config
  const double gemma_ms = sample_ms(warm, row);
  const double step_ms = 1e3 * tg_s / double(step_s.size());
  say(fmt::format("sampling {} logits: greedy {:.3f} ms, temperature 1 {:.3f} ms, top-k 64 + top-p 0.95 {:.3f} ms "
                  "({:.1f}% / {:.1f}% / {:.1f}% of a decode step)",
                  row.size(), greedy_ms, t1_ms, gemma_ms, pct(greedy_ms, step_ms), pct(t1_ms, step_ms),
                  pct(gemma_ms, step_ms)));
  const double huge = kernels::huge_page_share(step_regions);
  // On some VMs the plain read loop over the mapped pages is slower than the decode kernels (a Zen 5
  // VM: 40-42 GB/s against decode's 52-66; docs/performance.md): then this rate is no limit.
  const double of_weights = pct(tg_tok_s * step_bytes, weights_bw);
  say(fmt::format("the step's weights read where they are mapped: {:.2f} GB/s ({:.1f}% of the probe{}) -> decode at "
                  "{:.1f}% of that rate{}",
                  weights_bw * 1e-9, pct(weights_bw, bw),
                  huge < 0 ? "" : fmt::format("; {:.0f}% of their files' pages are 2 MiB", 100 * huge), of_weights,
                  of_weights > 100 ? " (decode read faster than the read loop did: not a limit here)" : ""));

  // Batched decode: B sequences admitted together; timed over the steps where all decode.
  double batch_tok_s = 0;
  {
    engine::Engine eng(m, engine::StepBudget{.prefill_rows = 512, .images = 1, .max_seqs = 0});
    std::vector<std::shared_ptr<engine::Sequence>> seqs;
    for (int b = 0; b < batch; ++b) {
      seqs.push_back(make_seq(m, prompt_ids(2, b + 2, m.vocab_limit()), batch_steps + 1));
      eng.add(seqs.back());
    }
    auto all_started = [&] {
      return std::all_of(seqs.begin(), seqs.end(), [](const auto& s) { return !s->tokens().empty(); });
    };
    while (!all_started() && !eng.idle()) eng.step();
    size_t before = 0;
    for (const auto& s : seqs) before += s->tokens().size();
    const auto t0 = Clock::now();
    eng.run_until_idle();
    const double dt = seconds_since(t0);
    size_t after = 0;
    for (const auto& s : seqs) {
      if (s->finish_reason() == engine::FinishReason::Error) fail("batched decode: {}", s->error());
      after += s->tokens().size();
    }
    batch_tok_s = double(after - before) / dt;
  }
  // Its limit: a step reads the weights once (its sequences' few KV rows left out) and multiplies
  // them by B rows, so it takes at least the longer of the read and B rows' FLOPs at the peak of
  // the kernels they take (the AMX tiles: bf16 weights from 6 rows). The int8 block kernels' peak
  // is not measured (it is above the f32 one): there only the read counts.
  const double batch_memory = double(batch) * bw / step_bytes;
  const bool tiles = gemm == kernels::Bf16Gemm::Amx && matrices == DType::BF16 &&
                     size_t(batch) >= kernels::kAmxDotMinRows;
  const double dot_peak = gemm == kernels::Bf16Gemm::Dot || tiles ? peak : peak_f32;
  const double batch_limit =
      int8_blocks ? batch_memory : std::min(batch_memory, dot_peak / (2.0 * (layer_params + head_params)));
  say(fmt::format("batched decode: {} sequences x {} steps = {:.3f} tok/s aggregate = {:.2f}x batch 1; "
                  "{:.1f}% of its limit {:.3f} tok/s = {:.2f}x the batch-1 roofline ({}-bound)",
                  batch, batch_steps, batch_tok_s, batch_tok_s / tg_tok_s, pct(batch_tok_s, batch_limit),
                  batch_limit, batch_limit / roofline, batch_limit < batch_memory ? "compute" : "memory"));

  // Decode with drafts: the same prompt and tokens (the answer does not change), timed per step.
  double draft_tok_s = 0, draft_step_s = 0, plain_step_s = 0;
  int drafted = 0, accepted = 0;
  if (draft > 0) {
    engine::Engine eng(m, engine::StepBudget{.draft_tokens = draft});
    auto s = make_seq(m, prompt_ids(int(prompt), 3, m.vocab_limit()), tg + 1);
    eng.add(s);
    while (s->tokens().empty() && !eng.idle()) eng.step();
    double total = 0, full = 0, plain = 0;
    int n_full = 0, n_plain = 0;
    const size_t before = s->tokens().size();
    while (!eng.idle()) {
      const auto t0 = Clock::now();
      const engine::StepStats st = eng.step();
      const double dt = seconds_since(t0);
      total += dt;
      drafted += st.drafted;
      accepted += st.accepted;
      if (st.drafted == draft) full += dt, ++n_full;
      if (st.drafted == 0 && st.decode_rows == 1) plain += dt, ++n_plain;
    }
    if (s->finish_reason() == engine::FinishReason::Error) fail("decode with drafts: {}", s->error());
    draft_tok_s = double(s->tokens().size() - before) / total;
    draft_step_s = n_full ? full / n_full : 0;
    // Plain steps from the decode test above where this run had too few.
    plain_step_s = n_plain >= 4 ? plain / n_plain : tg_s / double(step_s.size());
    say(fmt::format("decode with drafts of up to {} ids: {} tokens in {:.3f} s = {:.3f} tok/s = {:.2f}x decode; {} of {} "
                    "draft ids taken; a step checking {} ids {:.1f} ms, a plain step {:.1f} ms ({:.2f}x: drafts pay "
                    "from {:.2f} ids taken a step); a draft row {:.2f} of a step as the engine timed its passes",
                    draft, s->tokens().size() - before, total, draft_tok_s, draft_tok_s / tg_tok_s, accepted,
                    drafted, draft, draft_step_s * 1e3, plain_step_s * 1e3, draft_step_s / plain_step_s,
                    draft_step_s / plain_step_s - 1, eng.draft_row_cost()));
  }

  double image_s = 0, image_flops = 0;
  if (image) {
    const vision::VisionEncoder& enc = *m.vision();
    const VisionConfig& vc = *m.config().vision;
    const double P = double(vc.patches_per_side()) * vc.patches_per_side();
    for (const auto& [name, t] : ck.tensors()) {
      if (!(name.starts_with("vision.") || name.starts_with("projector.")) || t.shape.size() < 2) continue;
      if (name.find("position_embedding") != std::string::npos) continue;
      double elems = 1;
      for (int64_t d : t.shape) elems *= double(d);
      image_flops += 2.0 * elems * (name.starts_with("projector.") ? m.config().mm_tokens_per_image : P);
    }
    image_flops += 4.0 * P * P * vc.hidden_size * vc.num_layers;  // scores and weighted values
    vision::RgbImage img;
    img.width = img.height = vc.image_size;
    img.rgb.resize(size_t(img.width) * size_t(img.height) * 3);
    for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = uint8_t((i * 2654435761u) >> 24);
    const auto t0 = Clock::now();
    const vision::ImageEncoding e = enc.encode({img}, m.exec(), false);
    image_s = seconds_since(t0);
    if (e.features.empty()) fail("image: no features");
    say(fmt::format("image: one {}x{} image in {:.4g} s; {:.1f} GFLOP/s = {:.1f}% of the peak", img.width,
                    img.height, image_s, image_flops / image_s * 1e-9, pct(image_flops / image_s, peak)));
  }

  // KV bytes the runs above held at most: the widest is the batch (B sequences), the prefill or
  // the decode after --depth.
  const double kv_bytes = kv_row * tc.num_layers *
                          std::max({double(pp) + 1, double(batch) * (batch_steps + 3), double(prompt) + tg + 1});
  rss = std::max(rss, peak_rss_bytes());
  say(fmt::format("peak RSS: {:.3f} GB; weights used {:.3f} GB + KV {:.3f} GB = {:.3f} GB ({:.1f}%)", rss * 1e-9,
                  mapped_bytes * 1e-9, kv_bytes * 1e-9, (mapped_bytes + kv_bytes) * 1e-9,
                  pct(double(rss), mapped_bytes + kv_bytes)));

  if (json) {
    nlohmann::json j = {
        {"model", model_dir},
        {"threads", threads},
        {"isa", kernels::isa_name(m.exec().isa)},
        {"precision", kernels::precision_name(prec)},
        {"pp", pp},
        {"tg", tg},
        {"depth", depth},
        {"batch", batch},
        {"batch_steps", batch_steps},
        {"pp_tok_s", pp_tok_s},
        {"pp_cold_s", pp_cold_s},
        {"pp_gflops", pp_flops / pp_s * 1e-9},
        {"tg_tok_s", tg_tok_s},
        {"tg_best_step_s", best_step},
        {"tg_median_step_s", median_step},
        {"tg_step_s", step_s},
        {"sample_ms", {{"greedy", greedy_ms}, {"temperature_1", t1_ms}, {"top_k_64_top_p_0.95", gemma_ms}}},
        {"batch_tok_s", batch_tok_s},
        {"batch_speedup", batch_tok_s / tg_tok_s},
        {"batch_limit_tok_s", batch_limit},
        {"draft", draft},
        {"draft_tok_s", draft > 0 ? nlohmann::json(draft_tok_s) : nlohmann::json(nullptr)},
        {"draft_ids", drafted},
        {"draft_ids_taken", accepted},
        {"draft_step_s", draft > 0 ? nlohmann::json(draft_step_s) : nlohmann::json(nullptr)},
        {"plain_step_s", draft > 0 ? nlohmann::json(plain_step_s) : nlohmann::json(nullptr)},
        {"image_s", image ? nlohmann::json(image_s) : nlohmann::json(nullptr)},
        {"image_gflops", image ? nlohmann::json(image_flops / image_s * 1e-9) : nlohmann::json(nullptr)},
        {"rss_bytes", rss},
        {"weight_bytes_per_token", step_bytes},
        {"kv_bytes_per_token", kv_read},
        {"read_gb_s", bw * 1e-9},
        {"roofline_tg_tok_s", roofline},
        {"tg_fraction_of_roofline", tg_tok_s / roofline},
        {"weights_read_gb_s", weights_bw * 1e-9},
        {"weights_huge_page_share", huge},
        {"tg_fraction_of_weights_read", tg_tok_s * step_bytes / weights_bw},
        {"load_s", load_s},
        {"first_token_s", first_token_s},
        {"peak_gflops", peak * 1e-9},
        {"peak_f32_gflops", peak_f32 * 1e-9},
        {"pp_fraction_of_peak", pp_flops / pp_s / peak},
    };
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace vlm::cli
