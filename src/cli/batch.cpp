// `vlm batch`: OpenAI-style chat requests from a JSONL file through the same scheduler as
// `vlm serve` (continuous batching), one result line per request, in input order.
//
// Input lines: {"custom_id": "...", "body": {chat request}} (the OpenAI Batch API shape; "method"
// and "url" are ignored) or the chat request itself with a "custom_id" key. Images are data
// URIs or, for this local command, file paths (relative ones from the input file's folder).
// Output lines: {"custom_id", "response": {"status_code", "body"}, "error"}; a request that
// fails gets its error there and the batch goes on. A rerun skips the custom_ids the output
// already holds (a cut-off last line is dropped first), so an interrupted batch resumes.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "io/json.h"
#include "server/prepare.h"
#include "server/protocol.h"
#include "server/scheduler.h"
#include "server/tools.h"

namespace vlm::cli {

namespace {

using json = server::Json;
using server::ApiError;

struct Item {
  std::string custom_id;
  json body;                          // the chat request
  std::optional<ApiError> error;      // refused before the engine
  server::JobGroup jobs;              // submitted, one per choice
  bool token_ids = false;             // return_token_ids
  bool tool_answer = false;           // tools: the answer is read as calls (server/tools.h)
  bool ready = false;                 // error or job set
};

// The custom_ids already in `path`; a last line cut off mid-write is removed from the file.
std::set<std::string> done_ids(const std::filesystem::path& path) {
  std::set<std::string> ids;
  std::ifstream f(path);
  if (!f) return ids;
  std::string line, kept;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    try {
      const json j = json::parse(line);
      ids.insert(j.at("custom_id").get<std::string>());
      kept += line + "\n";
    } catch (const std::exception&) {
      if (f.peek() != EOF) fail("{}: line is not a result line: {}", path.string(), printable(line.substr(0, 80)));
      std::fprintf(stderr, "vlm batch: dropping the cut-off last line of %s\n", path.string().c_str());
    }
  }
  f.close();
  std::ofstream(path, std::ios::trunc) << kept;
  return ids;
}

json result_line(const std::string& id, int status, const json& body) {
  json err = nullptr;
  if (status != 200) err = {{"code", body["error"]["code"]}, {"message", body["error"]["message"]}};
  return {{"id", "batch_req_" + id}, {"custom_id", id}, {"response", {{"status_code", status}, {"body", body}}},
          {"error", err}};
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  CLI::App app{"Run a JSONL file of chat requests with continuous batching"};
  EngineArgs ea;
  ea.add(app);
  std::string input, output;
  bool progress = isatty(2);
  app.add_option("--input", input, "requests, one JSON object per line (custom_id + body)")->required();
  app.add_option("--output", output, "results, one line per request in input order (appended; resumes)")->required();
  app.add_flag("--progress,!--no-progress", progress, "progress bar on stderr (default: when it is a terminal)");
  CLI11_PARSE(app, argc, argv);

  // Read and check every line first: a malformed file fails before the model loads.
  std::vector<Item> items;
  {
    std::ifstream f(input);
    if (!f) fail("{}: cannot open the input file", input);
    std::set<std::string> seen;
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", input, n);
      json j = parse_ordered_json(line, where, 64);
      if (!j.is_object()) fail("{}: a line must be a JSON object", where);
      auto id = j.find("custom_id");
      if (id == j.end() || !id->is_string() || id->get_ref<const std::string&>().empty())
        fail("{}: 'custom_id' must be a non-empty string", where);
      Item it;
      it.custom_id = id->get<std::string>();
      if (!seen.insert(it.custom_id).second) fail("{}: custom_id '{}' appears twice", where, it.custom_id);
      if (auto b = j.find("body"); b != j.end()) {
        it.body = std::move(*b);
      } else {
        j.erase("custom_id");
        it.body = std::move(j);
      }
      items.push_back(std::move(it));
    }
  }
  const std::set<std::string> done = done_ids(output);
  std::erase_if(items, [&](const Item& it) { return done.count(it.custom_id) > 0; });
  if (!done.empty()) std::fprintf(stderr, "vlm batch: %zu request(s) already in %s; skipped\n", done.size(), output.c_str());
  std::ofstream out(output, std::ios::app);
  if (!out) fail("{}: cannot open the output file for appending", output);
  if (items.empty()) return 0;

  auto model = engine::Model::load(ea.model_dir, ea.model_options());
  const server::GenerationDefaults defaults = server::load_generation_defaults(ea.model_dir);
  server::Metrics metrics;
  server::Scheduler sched(*model, ea.scheduler_options(), metrics);
  server::ImagePolicy policy{.allow_files = true, .max_images = ea.max_images};
  const std::filesystem::path base = std::filesystem::absolute(input).parent_path();
  const std::string model_id = std::filesystem::absolute(ea.model_dir).lexically_normal().filename().string();

  // The submitter prepares (decodes images) and queues in input order, waiting for room; the
  // main thread writes results in input order as they finish.
  std::mutex mu;
  std::condition_variable cv;
  std::thread submitter([&] {
    for (Item& it : items) {
      server::JobGroup jobs;
      std::optional<ApiError> err;
      try {
        server::ApiRequest r = server::parse_request(it.body, server::Endpoint::Chat, policy);
        if (r.stream) server::refuse(400, "'stream' is not available in a batch", "stream");
        if (r.top_logprobs >= 0) server::refuse(400, "'logprobs' is not available in a batch", "logprobs");
        for (auto& im : r.images)
          if (!im.path.empty() && std::filesystem::path(im.path).is_relative()) im.path = (base / im.path).string();
        it.token_ids = r.return_token_ids;
        it.tool_answer = r.tool_answer;
        jobs = sched.submit(server::prepare_requests(*model, r, defaults, {}), /*block=*/true);
      } catch (const ApiError& e) {
        err = e;
      } catch (const std::exception& e) {
        err = ApiError{500, e.what(), {}, "internal_error"};
      }
      std::lock_guard lk(mu);
      it.jobs = std::move(jobs);
      it.error = std::move(err);
      it.ready = true;
      cv.notify_all();
    }
  });

  const auto t0 = server::Clock::now();
  size_t finished = 0, tokens = 0, failed = 0;
  auto show = [&](bool last) {
    if (!progress) return;
    const double s = std::chrono::duration<double>(server::Clock::now() - t0).count();
    const int width = 30, fill = int(width * finished / items.size());
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests  %.2f req/s  %.1f tok/s%s%s", std::string(fill, '#').c_str(),
                 std::string(width - fill, '.').c_str(), finished, items.size(), finished / std::max(s, 1e-9),
                 tokens / std::max(s, 1e-9), failed ? fmt::format("  {} failed", failed).c_str() : "",
                 last ? "\n" : "");
  };
  for (size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return it.ready; });
    }
    json line;
    if (it.error) {
      line = result_line(it.custom_id, it.error->status, server::error_json(*it.error));
      failed++;
    } else {
      std::vector<server::JobOutput> outs(it.jobs.size());
      for (size_t c = 0; c < outs.size(); ++c)
        while (!it.jobs[c]->take(outs[c], std::chrono::milliseconds(200))) show(false);
      auto failed_out = std::find_if(outs.begin(), outs.end(),
                                     [](const server::JobOutput& o) { return *o.finish == engine::FinishReason::Error; });
      const engine::Usage& u = outs[0].usage;  // the prompt once, every choice's tokens
      server::UsageOut usage{u.prompt_tokens, 0, u.image_tokens, u.cached_tokens};
      for (const server::JobOutput& o : outs) usage.completion_tokens += o.usage.completion_tokens;
      if (failed_out != outs.end()) {
        line = result_line(it.custom_id, 500, server::error_json({500, failed_out->error, {}, "internal_error"}));
        failed++;
      } else {
        server::ResponseMeta meta{"chatcmpl-batch-" + it.custom_id, int64_t(std::time(nullptr)), model_id,
                                  "fp_" + model->identity().hash_hex()};
        std::vector<server::ChoiceOut> choices;
        for (size_t c = 0; c < outs.size(); ++c) {
          server::ChoiceOut ch;
          ch.index = int(c);
          ch.text = outs[c].text;
          ch.finish = server::finish_text(*outs[c].finish);
          ch.stop_reason = outs[c].stop_reason;
          if (it.token_ids) {
            ch.token_ids.emplace();
            for (const auto& t : outs[c].tokens) ch.token_ids->push_back(t.id);
          }
          if (it.tool_answer) server::read_tool_answer(ch);
          choices.push_back(std::move(ch));
        }
        line = result_line(it.custom_id, 200, server::chat_response(meta, choices, false, usage));
      }
      tokens += usage.completion_tokens;
      it.jobs.clear();
    }
    out << server::dump(line) << "\n" << std::flush;
    finished++;
    show(i + 1 == items.size());
  }
  submitter.join();
  std::fprintf(stderr, "vlm batch: %zu request(s), %zu failed, %zu tokens generated\n", items.size(), failed, tokens);
  return 0;
}

}  // namespace vlm::cli
