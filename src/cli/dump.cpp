// `vlm dump`: every intermediate of a prefill (text, or text and images through the
// host preprocessor) plus greedy decode, as float32 .npy files (little endian, C order)
// and JSON, for comparison with any reference.
//   inputs_embeds.npy [Lp,H] (merged rows)  embed_norms.npy [L] (L2 norm of each valid row)
//   mask_global.npy / mask_sliding.npy [1,1,Lp,Lp] (the masks used)  identity.json
//   with images: image_positions.json, pixel_values.npy, vision_raw.npy, image_features.npy
//   hidden_<i>.npy [Lp,H] after decoder layer i   logits.npy [Lp,V]
//   tokens.json (prompt ids)  greedy.json (N greedy ids)  decode_logits.npy [N,V]
// decode_logits[i] are the logits of the decode step fed greedy[i]. Rows ≥ valid
// length (with --pad-to) are padding: finite, meaningless. Greedy ignores stop ids and,
// on VLM checkpoints, never picks ids ≥ image_token_id (Model::vocab_limit). The prefill
// runs once, observed layer by layer; the greedy tokens come from an engine::Engine
// resuming from it.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prompt_args.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/file.h"
#include "io/identity.h"
#include "io/json.h"
#include "io/npy.h"

namespace vlm::cli {

namespace {
void write_json(const std::filesystem::path& p, const nlohmann::json& j) { write_file(p, j.dump() + "\n"); }
}  // namespace

int cmd_dump(int argc, char** argv) {
  CLI::App app{"Write a prefill's intermediates and greedy decode as .npy/.json"};
  std::string model_dir, out_dir, scaling = "reference", identity_file, precision;
  PromptArgs pa;
  ImageArgs ia;
  int pad_to = 0, steps = 32, threads = default_threads();
  std::vector<int> block_cell;
  app.add_option("--model", model_dir, "checkpoint folder, GGUF model file or folder of GGUF files")->required();
  pa.add(app);
  app.add_option("--out", out_dir, "output folder")->required();
  app.add_option("--pad-to", pad_to, "right-pad the prefill to this many positions")->check(CLI::Range(0, 1 << 30));
  app.add_option("--steps", steps, "greedy tokens to generate")->check(CLI::Range(0, 1 << 20));
  app.add_option("--embed-scaling", scaling, "reference (HF, weight dtype) or f32");
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024));
  add_precision_option(app, precision);
  app.add_option("--check-identity", identity_file,
                 "identity.json of an earlier dump: refuse (naming the fields) unless this run's identity matches");
  app.add_option("--block-cell", block_cell,
                 "TEST HOOK: Q K — block mask cell (query Q, key K) in every mask, after writing the masks")
      ->expected(2);
  ia.add(app);
  CLI11_PARSE(app, argc, argv);
  if (scaling != "reference" && scaling != "f32")
    fail("--embed-scaling: expected reference or f32, got '{}'", scaling);

  engine::ModelOptions mo = ia.model_options();
  mo.embed_scaling = scaling == "f32" ? EmbedScaling::F32 : EmbedScaling::Reference;
  mo.threads = threads;
  mo.precision = precision_of(precision);
  const std::vector<vision::RgbImage> images = ia.load(model_dir);
  const std::shared_ptr<const engine::Model> model = engine::Model::load(model_dir, mo);
  if (!identity_file.empty()) {
    const nlohmann::json j = parse_json(read_text_file(identity_file, 1 << 20, "--check-identity: "), identity_file);
    require_same_identity(identity_from_json(j, identity_file), model->identity(), identity_file);
  }
  const std::vector<int32_t> ids = pa.ids(*model, images);
  const int n = int(ids.size());
  if (int64_t(n) + steps > model->context())
    fail("prompt of {} tokens plus {} steps exceeds the context limit of {}", n, steps, model->context());
  const int H = model->config().text.hidden_size, V = model->vocab();
  // A dump holds every logits row it writes: [Lp, V] from the prefill and [steps, V] decoding.
  // Within the context, those still reach 100+ GiB on a long-context model: a stated cap.
  constexpr uint64_t kMaxLogitsBytes = uint64_t(4) << 30;
  for (const auto& [what, rows] : {std::pair{"--pad-to / the prompt", std::max(n, pad_to)}, std::pair{"--steps", steps}})
    if (uint64_t(rows) * uint64_t(V) * sizeof(float) > kMaxLogitsBytes)
      fail("{}: {} rows of logits over a vocabulary of {} take {:.1f} GiB, more than dump's limit of 4 GiB", what,
           rows, V, double(uint64_t(rows) * uint64_t(V) * sizeof(float)) / double(1 << 30));

  MultimodalPrefill pre = model->prefill_input(ids, images, pad_to);
  PrefillInput& in = pre.input;
  const int Lp = in.Lp;
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path out(out_dir);
  write_json(out / "identity.json", identity_to_json(model->identity()));
  if (pre.encoding) {
    const vision::ImageEncoding& e = *pre.encoding;
    const int64_t ni = e.pixels.count;
    write_npy(out / "pixel_values.npy", e.pixels.values.data(), {ni, 3, e.pixels.height, e.pixels.width});
    write_npy(out / "vision_raw.npy", e.vision_raw.data(), {ni, e.patches, e.vision_hidden});
    write_npy(out / "image_features.npy", e.features.data(), {ni, e.tokens, e.hidden});
    write_json(out / "num_crops.json", e.pixels.num_crops);
    write_json(out / "image_positions.json", pre.image_positions);
  }
  write_json(out / "tokens.json", ids);
  write_npy(out / "inputs_embeds.npy", in.embeds.data(), {Lp, H});
  write_npy(out / "embed_norms.npy", pre.embed_norms.data(), {int64_t(pre.embed_norms.size())});
  write_npy(out / "mask_global.npy", in.mask_global.data(), {1, 1, Lp, Lp});
  const std::vector<float>& sliding = in.mask_sliding.empty() ? in.mask_global : in.mask_sliding;
  write_npy(out / "mask_sliding.npy", sliding.data(), {1, 1, Lp, Lp});
  if (!block_cell.empty()) {
    const int q = block_cell[0], k = block_cell[1];
    if (q < 0 || k < 0 || q >= Lp || k >= Lp) fail("--block-cell {} {}: outside the {}x{} mask", q, k, Lp, Lp);
    for (std::vector<float>* m : {&in.mask_global, &in.mask_sliding})
      if (!m->empty()) (*m)[size_t(q) * size_t(Lp) + size_t(k)] = kMaskBlocked;
  }

  // hidden_<i>: the residual stream leaving layer i, from the decoder's observation points.
  const models::Observer hidden = [&](std::string_view name, int layer, const float* h, size_t rows, size_t cols) {
    if (name == "l_out")
      write_npy(out / ("hidden_" + std::to_string(layer) + ".npy"), h, {int64_t(rows), int64_t(cols)});
  };
  models::gemma3::PrefillOptions opts;
  opts.all_logits = true;
  opts.observer = &hidden;
  auto prefilled = std::make_shared<engine::Prefilled>(
      engine::Prefilled{model->decoder().new_cache(model->context()), {}});
  const std::vector<float> logits = model->decoder().prefill_from_embeddings(in, prefilled->cache, opts);
  write_npy(out / "logits.npy", logits.data(), {Lp, V});

  // Greedy from the prefill above. The engine samples from each logits row it gets; one token
  // past `steps` makes it run the decode step fed the last kept token.
  prefilled->logits.assign(logits.begin() + int64_t(n - 1) * V, logits.begin() + int64_t(n) * V);
  engine::Request req;
  req.prompt = ids;
  req.max_tokens = steps + 1;
  req.ignore_eos = true;
  req.prefilled = prefilled;
  std::vector<int32_t> tokens;
  std::vector<float> decode_logits;
  decode_logits.reserve(size_t(steps) * size_t(V));
  engine::Callbacks cb;
  cb.on_token = [&](const engine::TokenEvent& e) {
    if (int(tokens.size()) < steps) tokens.push_back(e.id);
  };
  cb.on_logits = [&, first = true](std::span<const float> row) mutable {
    if (!first) decode_logits.insert(decode_logits.end(), row.begin(), row.end());
    first = false;
  };
  auto seq = std::make_shared<engine::Sequence>(*model, std::move(req), std::move(cb));
  engine::Engine eng(*model);
  eng.add(seq);
  eng.run_until_idle();
  if (seq->finish_reason() == engine::FinishReason::Error) fail("{}", seq->error());
  if (int(tokens.size()) != steps) fail("greedy stopped after {} of {} steps", tokens.size(), steps);
  write_json(out / "greedy.json", tokens);
  write_npy(out / "decode_logits.npy", decode_logits.data(), {steps, V});
  return 0;
}

}  // namespace vlm::cli
