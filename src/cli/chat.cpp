// `vlm chat`: a conversation on the terminal, as llama.cpp's llama-cli and llama-mtmd-cli
// interactive modes. Each input line is a user turn (a line ending in '\' goes on to the next);
// "/image FILE" attaches an image to the next turn, "/regen" answers the last message again (with
// the next seed), "/clear" starts over, "/exit" or the end of input quits. The answer streams to
// stdout, one line after it; Ctrl-C stops an answer (what was said stays in the conversation).
// Each turn is the whole conversation through the chat template, as `vlm run --messages` would
// take it, run by one engine whose prefix and image caches hold the turns before: only what is
// new is prefilled, no image is encoded twice (docs/gemma3/decoder.md, "Prefix cache").
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prompt_args.h"
#include "cli/run_to_end.h"
#include "core/error.h"
#include "engine/engine.h"

namespace vlm::cli {

namespace {

constexpr const char* kHelp =
    "commands: /image FILE (attach an image to your next message), /regen (answer the last message again),\n"
    "          /clear (start over), /exit\n";

// One line of input, or several joined where a line ends in '\'; false at the end of input.
bool read_message(std::string& out, bool tty) {
  out.clear();
  std::string line;
  for (bool more = true; more;) {
    if (tty) std::fputs(out.empty() ? "> " : ". ", stderr);
    if (!std::getline(std::cin, line)) return !out.empty();
    more = !line.empty() && line.back() == '\\';
    if (more) line.pop_back();
    out += (out.empty() ? "" : "\n") + line;
  }
  return true;
}

}  // namespace

int cmd_chat(int argc, char** argv) {
  CLI::App app{"Chat with a model on the terminal (llama-cli's conversation mode)"};
  std::string model_dir, precision, system;
  ImageArgs ia;
  SamplingParams sp;
  int threads = default_threads(), max_tokens = 0, draft = 0;
  int64_t context = 0;
  app.add_option("--model", model_dir, "checkpoint folder, GGUF model file or folder of GGUF files")->required();
  app.add_option("--system", system, "system prompt");
  app.add_option("--max-tokens", max_tokens, "most tokens an answer takes (0: until the end of the context)")
      ->check(CLI::Range(0, 1 << 30));
  add_sampling_options(app, sp);
  app.add_option("--context", context, "context limit (default: max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024));
  add_precision_option(app, precision);
  add_draft_option(app, draft);
  ia.add(app);  // --image files go with the first message
  CLI11_PARSE(app, argc, argv);
  validate(sp);

  engine::ModelOptions mo = ia.model_options();
  mo.vision = true;  // images may come with any turn (a text-only checkpoint has no tower to map)
  mo.threads = threads;
  mo.context = context;
  mo.precision = precision_of(precision);
  std::vector<vision::RgbImage> pending = ia.load(model_dir);  // for the next user turn
  const std::shared_ptr<const engine::Model> model = engine::Model::load(model_dir, mo);
  if (!model->tokenizer()) fail("{} has no tokenizer.json", model_dir);
  engine::StepBudget budget;
  budget.prefix_cache_bytes = size_t(1) << 30;
  budget.image_cache_bytes = size_t(256) << 20;
  budget.draft_tokens = draft;
  engine::Engine eng(*model, budget);

  std::vector<text::ChatMessage> messages;
  std::vector<vision::RgbImage> images;  // the conversation's, in order
  auto clear = [&] {
    messages.clear();
    images.clear();
    if (!system.empty()) messages.push_back({"system", {{false, system}}});
  };
  clear();
  // Answers the conversation so far (its last message a user's) with `seed_offset` added to the
  // seed; false, with a message, when it cannot be answered (nothing changed then).
  int regenerations = 0;  // of the last message: /regen's seeds
  auto answer = [&](int seed_offset) {
    engine::Request req;
    try {
      req.prompt = model->chat_prompt(messages, images);
      const int64_t room = model->context() - int64_t(req.prompt.size());
      if (room <= 0) fail("the conversation ({} tokens) fills the context of {}; /clear starts over", req.prompt.size(),
                          model->context());
      req.max_tokens = int(max_tokens > 0 ? std::min<int64_t>(max_tokens, room) : room);
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return false;
    }
    req.images = images;
    req.sampling = sp;  // each turn as `vlm run --messages` with the same flags would answer it
    req.sampling.seed += uint64_t(seed_offset);

    std::string text;
    engine::Callbacks cb;
    cb.on_text = [&text](std::string_view t) {
      text += t;
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    };
    auto seq = std::make_shared<engine::Sequence>(*model, std::move(req), std::move(cb));
    const auto t0 = std::chrono::steady_clock::now();
    run_to_end(eng, seq);
    std::printf("\n");
    std::fflush(stdout);
    if (seq->finish_reason() == engine::FinishReason::Error) fail("{}", seq->error());
    messages.push_back({"assistant", {{false, text}}});
    const engine::Usage& u = seq->usage();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[%d prompt tokens, %d of them reused, %d generated in %.2f s, finish: %s]\n",
                 u.prompt_tokens, u.cached_tokens, u.completion_tokens, s,
                 std::string(finish_name(seq->finish_reason())).c_str());
    return true;
  };
  const bool tty = isatty(0);
  if (tty) std::fprintf(stderr, "%s", kHelp);
  std::string line;
  while (read_message(line, tty)) {
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/clear") {
      clear();
      pending.clear();
      std::fprintf(stderr, "[the conversation starts over]\n");
      continue;
    }
    if (line.rfind("/image ", 0) == 0) {
      try {
        if (!model->has_vision()) fail("{}", model->no_vision_tower());
        pending.push_back(vision::load_image(line.substr(7)));
        std::fprintf(stderr, "[image %zu: %dx%d, with your next message]\n", pending.size(), pending.back().width,
                     pending.back().height);
      } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
      }
      continue;
    }
    if (line == "/regen") {
      if (messages.empty() || messages.back().role != "assistant") {
        std::fprintf(stderr, "[no answer to regenerate]\n");
        continue;
      }
      const text::ChatMessage last = messages.back();
      messages.pop_back();
      if (!answer(++regenerations)) messages.push_back(last);
      continue;
    }
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command '%s'; %s", line.c_str(), kHelp);
      continue;
    }

    text::ChatMessage user{"user", {}};
    for (size_t i = 0; i < pending.size(); ++i) user.content.push_back({true, {}});
    user.content.push_back({false, line});
    messages.push_back(std::move(user));
    images.insert(images.end(), pending.begin(), pending.end());
    regenerations = 0;
    if (!answer(0)) {
      images.resize(images.size() - pending.size());
      messages.pop_back();
      continue;
    }
    pending.clear();
  }
  return 0;
}

}  // namespace vlm::cli
