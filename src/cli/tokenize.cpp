// `vlm tokenize` and `vlm detokenize`: the tokenizer, chat template and image
// placeholder expansion from the command line (ids as JSON arrays).
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "core/error.h"
#include "io/config.h"
#include "io/json.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace vlm::cli {

namespace {

struct Source {
  std::string model_dir, tokenizer_dir;

  void add(CLI::App& app) {
    auto* m = app.add_option("--model", model_dir, "checkpoint folder (tokenizer.json, tokenizer_config.json, config.json)");
    auto* t = app.add_option("--tokenizer", tokenizer_dir, "folder holding just tokenizer.json and tokenizer_config.json");
    m->excludes(t);
  }
  std::string dir() const {
    if (model_dir.empty() && tokenizer_dir.empty()) fail("give --model DIR or --tokenizer DIR");
    return model_dir.empty() ? tokenizer_dir : model_dir;
  }
};

void print_line(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

// Calls fn(line, where) for each non-empty line of standard input.
template <typename Fn>
void for_each_stdin_line(Fn fn) {
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n)
    if (!line.empty()) fn(line, "stdin line " + std::to_string(n));
}

// Image token ids and count: config.json of a --model folder, else the
// tokenizer's own tokens with --image-tokens N.
std::optional<text::ImageTokens> image_tokens(const Source& src, const text::Tokenizer& tok, int count_override,
                                              text::ImageLayout layout) {
  text::ImageTokens it;
  it.layout = layout;
  if (!src.model_dir.empty()) {
    const ModelConfig cfg = load_config(src.model_dir);
    if (!cfg.is_vlm()) return std::nullopt;
    it.boi = cfg.boi_token_id;
    it.eoi = cfg.eoi_token_id;
    it.soft = cfg.image_token_id;
    it.tokens_per_image = cfg.mm_tokens_per_image;
  } else {
    it.boi = tok.token_id("<start_of_image>").value_or(-1);
    it.eoi = tok.token_id("<end_of_image>").value_or(-1);
    it.soft = tok.token_id("<image_soft_token>").value_or(-1);
  }
  if (count_override > 0) it.tokens_per_image = count_override;
  return it;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Print the token ids of TEXT (no <bos> added) as a JSON array"};
  Source src;
  src.add(app);
  std::string input;
  bool parse_special = false, jsonl = false, chat = false, no_gen = false, continue_final = false;
  int image_count = 0, crops = 0;
  std::string layout_name = "hf";
  auto* text_opt = app.add_option("text", input, "text to tokenize (with --chat: a JSON array of messages)");
  app.add_flag("--parse-special", parse_special,
               "match every added token in the text as HF does by default (otherwise special control "
               "tokens typed in text stay literal)");
  app.add_flag("--jsonl", jsonl, "read standard input: one JSON string (or messages array with --chat) per line");
  app.add_flag("--chat", chat,
               "input is OpenAI-style messages: render the Gemma 3 chat template with the generation prompt "
               "and expand every image");
  auto* ng = app.add_flag("--no-generation-prompt", no_gen, "with --chat: leave out the final <start_of_turn>model");
  app.add_flag("--continue-final-message", continue_final,
               "with --chat: end inside the final assistant message, after its text (HF's continue_final_message)")
      ->excludes(ng);
  app.add_option("--image-tokens", image_count, "soft tokens per image (default: mm_tokens_per_image of --model)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--crops", crops, "Pan & Scan crops per image (0 = none)")->check(CLI::Range(0, 64));
  app.add_option("--layout", layout_name, "tokens around images: hf (string expansion) or google (token splice)")
      ->check(CLI::IsMember({"hf", "google"}));
  CLI11_PARSE(app, argc, argv);

  if (jsonl == (text_opt->count() > 0)) fail("give TEXT or --jsonl (one of them)");
  const text::Tokenizer tok = text::Tokenizer::load(src.dir());
  const auto layout = layout_name == "google" ? text::ImageLayout::Google : text::ImageLayout::HF;

  std::optional<text::ImageTokens> images;
  if (chat) {
    if (!text::is_gemma3_chat_template(tok.chat_template()))
      fail("{}/tokenizer_config.json: chat_template is not the Gemma 3 template (the only one vlm renders)", src.dir());
    images = image_tokens(src, tok, image_count, layout);
  }

  auto run_chat = [&](const std::string& line, const std::string& where) {
    const auto messages = text::parse_messages(parse_json(line, where), where);
    const auto segments = text::render_gemma3_chat(messages, tok,
                                                   continue_final ? text::ChatEnd::ContinueFinal
                                                   : no_gen       ? text::ChatEnd::LastTurn
                                                                  : text::ChatEnd::GenerationPrompt);
    size_t n_images = 0;  // images given; tokenize_prompt checks them against the slots
    for (const auto& m : messages)
      for (const auto& p : m.content) n_images += p.is_image;
    if (n_images > 0 && !images)
      fail("{}: the messages hold images but the model in {} is text-only", where, src.dir());
    if (n_images > 0 && images->tokens_per_image <= 0)
      fail("{}: the messages hold images: give --image-tokens N (or --model with config.json)", where);
    const std::vector<int> crop_counts(n_images, crops);
    return ids_json(text::tokenize_prompt(segments, tok, images.value_or(text::ImageTokens{}), crop_counts,
                                          parse_special)
                        .ids);
  };

  auto run = [&](const std::string& line, const std::string& where) -> std::string {
    try {
      return chat ? run_chat(line, where) : ids_json(tok.encode(line, {.parse_special = parse_special}));
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(where)) throw;
      fail("{}: {}", where, e.what());
    }
  };

  if (!jsonl) {
    print_line(run(input, "TEXT"));
    return 0;
  }
  for_each_stdin_line([&](const std::string& line, const std::string& where) {
    if (chat) return print_line(run(line, where));
    const nlohmann::json j = parse_json(line, where);
    if (!j.is_string()) fail("{}: expected a JSON string", where);
    print_line(run(j.get_ref<const std::string&>(), where));
  });
  return 0;
}

namespace {

std::vector<int32_t> parse_ids(const std::string& arg) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t v) {
    if (v < INT32_MIN || v > INT32_MAX) fail("token id {} out of range", v);
    ids.push_back(int32_t(v));
  };
  if (!arg.empty() && arg[0] == '[') {
    const nlohmann::json j = parse_json(arg, "IDS");
    for (const auto& v : j) {
      if (!v.is_number_integer()) fail("IDS: {} is not an integer", v.dump());
      add(v.get<int64_t>());
    }
    return ids;
  }
  // Integers separated by commas and/or spaces.
  const char* p = arg.data();
  const char* end = p + arg.size();
  while (p < end) {
    if (*p == ',' || std::isspace(static_cast<unsigned char>(*p))) {
      ++p;
      continue;
    }
    int64_t v = 0;
    auto [q, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || (q < end && *q != ',' && !std::isspace(static_cast<unsigned char>(*q))))
      fail("IDS: '{}' is not a list of integers", arg);
    add(v);
    p = q;
  }
  return ids;
}

}  // namespace

int cmd_detokenize(int argc, char** argv) {
  CLI::App app{"Print the text of token ids"};
  Source src;
  src.add(app);
  std::vector<std::string> args;
  bool jsonl = false, json = false, skip_special = false;
  app.add_option("ids", args, "ids: a JSON array, or integers separated by spaces/commas");
  app.add_flag("--jsonl", jsonl, "read standard input, one JSON array per line; print one JSON string per line");
  app.add_flag("--json", json, "print the text as a JSON string");
  app.add_flag("--skip-special", skip_special, "leave out special tokens (<bos>, <end_of_turn>, ...)");
  CLI11_PARSE(app, argc, argv);

  if (jsonl == !args.empty()) fail("give IDS or --jsonl (one of them)");
  const text::Tokenizer tok = text::Tokenizer::load(src.dir());
  const text::DecodeOptions opt{.skip_special = skip_special};
  if (!jsonl) {
    std::vector<int32_t> ids;
    for (const std::string& a : args)
      for (int32_t id : parse_ids(a)) ids.push_back(id);
    const std::string s = tok.decode(ids, opt);
    print_line(json ? nlohmann::json(s).dump() : s);
    return 0;
  }
  for_each_stdin_line([&](const std::string& line, const std::string& where) {
    if (line.empty() || line[0] != '[') fail("{}: expected a JSON array of ids", where);
    try {
      print_line(nlohmann::json(tok.decode(parse_ids(line), opt)).dump());
    } catch (const Error& e) {
      fail("{}: {}", where, e.what());
    }
  });
  return 0;
}

}  // namespace vlm::cli
