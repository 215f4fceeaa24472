// `vlm run`: generate from a prompt and images, streaming the answer to stdout. Ctrl-C stops
// generation at the next token; what was produced stays printed (exit code 130).
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <optional>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prompt_args.h"
#include "core/error.h"
#include "engine/generate.h"
#include "io/checkpoint.h"
#include "models/gemma3.h"
#include "io/identity.h"
#include "multimodal/host.h"
#include "multimodal/prompt_cache.h"
#include "text/detokenizer.h"

namespace vlm::cli {

namespace {
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}
}  // namespace

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt"};
  std::string model_dir;
  PromptArgs pa;
  GenerateOptions opt;
  SamplingParams& sp = opt.sampling;
  int threads = default_threads();
  bool print_ids = false;
  app.add_option("--model", model_dir, "checkpoint folder")->required();
  pa.add(app);
  app.add_flag("--ids", print_ids, "print generated token ids instead of text");
  app.add_option("--max-tokens", opt.max_tokens, "most tokens to generate")->check(CLI::Range(0, 1 << 30));
  app.add_option("--temperature", sp.temperature, "0 = greedy");
  app.add_option("--top-k", sp.top_k, "0 = off");
  app.add_option("--top-p", sp.top_p, "1 = off");
  app.add_option("--min-p", sp.min_p, "0 = off");
  app.add_option("--repetition-penalty", sp.repetition_penalty, "1 = off");
  app.add_option("--presence-penalty", sp.presence_penalty, "0 = off");
  app.add_option("--frequency-penalty", sp.frequency_penalty, "0 = off");
  app.add_option("--seed", sp.seed, "sampling seed")->check(unsigned64());
  app.add_option("--stop", opt.stop_strings, "stop string (repeatable)");
  app.add_option("--context", opt.context, "context limit (default: max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024));
  ImageArgs ia;
  ia.add(app);
  std::string cache_file;
  app.add_option("--prompt-cache", cache_file,
                 "file with this request's prefill (KV cache): reused when the model identity and the "
                 "request (ids, images) match, else computed and written; another identity is refused");
  CLI11_PARSE(app, argc, argv);
  validate(sp);

  // Everything about the request is checked before the vision tower or the decoder runs.
  Checkpoint ck = Checkpoint::open(model_dir, Parts{.text = true, .vision = !ia.files.empty()});
  const ModelConfig& mc = ck.config();
  HostOptions ho = ia.host_options(mc);
  ho.context = opt.context;
  ImageInputs inputs = load_image_inputs(ia, ck);
  Prompt prompt = make_prompt(pa, model_dir, inputs.tokens, inputs.crops);
  if (mc.is_vlm()) sp.vocab_limit = mc.image_token_id;  // ids past it are vocabulary padding
  opt.stop_ids = mc.eos_token_ids;
  ThreadPool pool(threads);
  Gemma3 model(ck, pool);
  // A saved prefill of the same request under the same identity skips the vision tower
  // and the prefill; one saved under another identity is refused, naming the fields.
  std::optional<SavedPrefill> saved;
  uint64_t request = 0;
  Identity identity;
  if (!cache_file.empty()) {
    identity = request_identity(ck, ho);
    request = request_hash(prompt.ids, inputs.images);
    if (std::filesystem::exists(cache_file))
      saved = load_prompt_cache(cache_file, identity, request, mc.text,
                                opt.context > 0 ? opt.context : mc.text.max_position_embeddings, model.vocab());
  }
  std::optional<MultimodalPrefill> pre;
  if (!saved)
    pre = build_prefill(model, mc, inputs.encoder ? &*inputs.encoder : nullptr, prompt.ids, inputs.images, ho, pool);

  GenerateIO io;
  io.cancel = &g_interrupted;
  std::optional<text::StreamDecoder> detok;
  if (prompt.tokenizer) {
    detok.emplace(*prompt.tokenizer, text::DecodeOptions{.skip_special = true});
    io.piece = [&](int32_t id) { return detok->push(id); };
  } else if (!print_ids) {
    fail("{} has no tokenizer.json; use --ids to print token ids", model_dir);
  }
  if (print_ids) {
    bool first = true;
    io.on_token = [&](int32_t id) {
      std::printf(first ? "%d" : " %d", id);
      first = false;
      std::fflush(stdout);
    };
  } else {
    io.on_text = [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    };
  }
  g_interrupted = false;
  std::signal(SIGINT, on_sigint);
  GenerateResult r;
  if (saved) {
    std::fprintf(stderr, "[prompt cache: reusing %s]\n", cache_file.c_str());
    r = generate_from(model, saved->cache, std::move(saved->logits), prompt.ids, opt, io);
  } else {
    auto save = [&](KvCache& c, std::span<const float> logits) {
      if (!cache_file.empty()) save_prompt_cache(cache_file, identity, request, mc.text, c, logits);
    };
    r = generate(model, pre->input, prompt.ids, opt, io, save);
  }
  std::signal(SIGINT, SIG_DFL);
  if (detok && !print_ids) {
    const std::string tail = detok->finish();  // an unfinished character at the end
    std::fwrite(tail.data(), 1, tail.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "[%d prompt tokens, %zu generated, finish: %s]\n", r.prompt_tokens,
               r.tokens.size(), std::string(finish_name(r.finish)).c_str());
  return r.finish == FinishReason::Cancelled ? 130 : 0;
}

}  // namespace vlm::cli
