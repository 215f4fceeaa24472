// One sequence run to its end on the terminal, as `vlm run` and `vlm chat` do: the first Ctrl-C
// stops the answer at its next token (what was produced stays), a second ends the process at
// once; outside the run Ctrl-C ends the process.
#pragma once
#include <atomic>
#include <csignal>
#include <memory>

#include "engine/engine.h"

namespace vlm::cli {

inline std::atomic<bool> g_interrupted{false};

extern "C" inline void on_sigint(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);
}

inline void run_to_end(engine::Engine& eng, const std::shared_ptr<engine::Sequence>& seq) {
  eng.add(seq);
  g_interrupted = false;
  std::signal(SIGINT, on_sigint);
  while (!eng.idle()) {
    if (g_interrupted.load()) seq->cancel();
    eng.step();
  }
  std::signal(SIGINT, SIG_DFL);
}

}  // namespace vlm::cli
