// CLI11 validators shared by the subcommands.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

#include "engine/sampler.h"
#include "kernels/exec.h"

namespace vlm::cli {

// A decimal integer in [0, 2^64 − 1]. CLI11 2.1 converts unsigned options with strtoull,
// which wraps "-1" to 2^64 − 1, saturates values past 2^64 and reads "010" as octal.
inline CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return "expected an integer in [0, 18446744073709551615], got '" + s.substr(0, 32) +
                 (s.size() > 32 ? "…'" : "'");
        return {};
      },
      "UINT64");
}

// --precision bf16|f32 (kernels/exec.h) into `value`; empty (not given): the checkpoint's
// default, nullopt from precision_of.
inline void add_precision_option(CLI::App& app, std::string& value) {
  app.add_option("--precision", value,
                 "matrix products: bf16 (inputs rounded to bf16, f32 sums) or f32 (exact); default: bf16 for a "
                 "bf16 checkpoint, else f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
}
inline std::optional<kernels::Precision> precision_of(const std::string& value) {
  if (value.empty()) return std::nullopt;
  return kernels::parse_precision(value, "--precision");
}

// --draft N (engine::StepBudget::draft_tokens) into `value`.
inline void add_draft_option(CLI::App& app, int& value) {
  app.add_option("--draft", value,
                 "draft ids an answer checks per step at most, by prompt lookup: where its last 2-4 ids "
                 "appeared before, the ids that followed them, as many as the answer's odds of taking them "
                 "pay for; the answer stays the same and takes fewer steps where text repeats (0 = off)")
      ->check(CLI::Range(0, 64));
}

// --mlock (engine::ModelOptions::mlock) into `value`.
inline void add_mlock_option(CLI::App& app, bool& value) {
  app.add_flag("--mlock", value,
               "lock the weights in memory, so that the kernel never pages them out (the memlock limit, "
               "ulimit -l, must hold them, or the process needs CAP_IPC_LOCK)");
}

// The sampling flags of `vlm run` and `vlm chat`, into `sp` (its defaults: greedy).
inline void add_sampling_options(CLI::App& app, SamplingParams& sp) {
  app.add_option("--temperature", sp.temperature, "0 = greedy");
  app.add_option("--top-k", sp.top_k, "0 = off");
  app.add_option("--top-p", sp.top_p, "1 = off");
  app.add_option("--min-p", sp.min_p, "0 = off");
  app.add_option("--repetition-penalty", sp.repetition_penalty, "1 = off");
  app.add_option("--presence-penalty", sp.presence_penalty, "0 = off");
  app.add_option("--frequency-penalty", sp.frequency_penalty, "0 = off");
  app.add_option("--seed", sp.seed, "sampling seed")->check(unsigned64());
}

}  // namespace vlm::cli
