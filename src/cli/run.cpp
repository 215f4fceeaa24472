// `vlm run`: generate from a prompt and images, streaming the answer to stdout. Ctrl-C stops
// generation at the next token; what was produced stays printed (exit code 130). A front end
// over engine::Engine with one sequence.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prompt_args.h"
#include "cli/run_to_end.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/file.h"
#include "io/json.h"

namespace vlm::cli {

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt"};
  std::string model_dir, cache_file, precision;
  PromptArgs pa;
  ImageArgs ia;
  engine::Request req;
  SamplingParams& sp = req.sampling;
  int threads = default_threads();
  int64_t context = 0;
  int draft = 0;
  bool print_ids = false, json_object = false;
  std::string json_schema, json_schema_file;
  app.add_option("--model", model_dir, "checkpoint folder, GGUF model file or folder of GGUF files")->required();
  pa.add(app);
  app.add_flag("--ids", print_ids, "print generated token ids instead of text");
  app.add_option("--max-tokens", req.max_tokens, "most tokens to generate")->check(CLI::Range(0, 1 << 30));
  add_sampling_options(app, sp);
  app.add_option("--stop", req.stop_strings, "stop string (repeatable)");
  // As llama.cpp's flags; the server's response_format (docs/structured-output.md).
  auto* j = app.add_flag("--json", json_object, "answer with a JSON object");
  auto* js = app.add_option("--json-schema", json_schema, "answer with JSON matching this JSON Schema (text)");
  auto* jf = app.add_option("--json-schema-file", json_schema_file, "answer with JSON matching the JSON Schema in FILE");
  j->excludes(js)->excludes(jf);
  js->excludes(jf);
  app.add_option("--context", context, "context limit (default: max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024));
  add_precision_option(app, precision);
  add_draft_option(app, draft);
  ia.add(app);
  app.add_option("--prompt-cache", cache_file,
                 "file with this request's prefill (KV cache): reused when the model identity and the "
                 "request (ids, images) match, else computed and written; another identity is refused");
  CLI11_PARSE(app, argc, argv);
  validate(sp);
  if (json_object) req.response_schema = grammar::Schema::any_object();
  if (!json_schema_file.empty())
    json_schema = read_text_file(json_schema_file, 1 << 20, "--json-schema-file: ");
  if (!json_schema.empty())
    req.response_schema = grammar::Schema::compile(parse_ordered_json(json_schema, "--json-schema"));

  // Everything about the request is checked before the vision tower or the decoder runs.
  engine::ModelOptions mo = ia.model_options();
  mo.threads = threads;
  mo.context = context;
  mo.precision = precision_of(precision);
  req.images = ia.load(model_dir);
  const std::shared_ptr<const engine::Model> model = engine::Model::load(model_dir, mo);
  req.prompt = pa.ids(*model, req.images);
  req.prompt_cache = cache_file;
  if (!model->tokenizer() && !print_ids) fail("{} has no tokenizer.json; use --ids to print token ids", model_dir);

  engine::Callbacks cb;
  if (print_ids) {
    cb.on_token = [first = true](const engine::TokenEvent& e) mutable {
      std::printf(first ? "%d" : " %d", e.id);
      first = false;
      std::fflush(stdout);
    };
  } else {
    cb.on_text = [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    };
  }
  auto seq = std::make_shared<engine::Sequence>(*model, std::move(req), std::move(cb));
  engine::Engine eng(*model, engine::StepBudget{.draft_tokens = draft});
  run_to_end(eng, seq);
  if (seq->finish_reason() == engine::FinishReason::Error) fail("{}", seq->error());
  const engine::Usage& u = seq->usage();
  if (u.cached_tokens > 0) std::fprintf(stderr, "[prompt cache: reusing %s]\n", cache_file.c_str());
  std::printf("\n");
  std::fflush(stdout);
  std::string finish(finish_name(seq->finish_reason()));
  if (const auto* s = std::get_if<std::string>(&seq->stop_reason()))  // which --stop ended it
    finish += " at " + nlohmann::json(*s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string drafts =
      draft > 0 ? fmt::format(" (drafts: {} of {} ids taken)", u.draft_accepted, u.draft_tokens) : std::string();
  std::fprintf(stderr, "[%d prompt tokens, %d generated%s, finish: %s]\n", u.prompt_tokens, u.completion_tokens,
               drafts.c_str(), finish.c_str());
  return seq->finish_reason() == engine::FinishReason::Cancelled ? 130 : 0;
}

}  // namespace vlm::cli
