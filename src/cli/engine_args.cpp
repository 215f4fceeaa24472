#include "cli/engine_args.h"

#include <CLI/CLI.hpp>

#include "cli/options.h"
#include "models/mask.h"

namespace vlm::cli {

void EngineArgs::add(CLI::App& app) {
  app.add_option("--model", model_dir, "checkpoint folder")->required();
  app.add_option("--mask-mode", mask_mode, "prefill mask: hf, mlx or causal (default: hf for VLMs, causal for text)");
  add_precision_option(app, precision);
  app.add_option("--ctx", context, "context length per request (default: max_position_embeddings)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_option("--threads", threads, "compute threads (default: the cores)")->check(CLI::Range(0, 1024));
  app.add_option("--max-seqs", max_seqs, "requests decoded together at most")->check(CLI::Range(1, 4096));
  app.add_option("--max-queue", max_queue, "requests waiting for a place in the batch at most")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--prefill-rows", prefill_rows, "prompt rows per engine step (an image block stays whole)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--images-per-step", images_per_step, "image encodes per engine step")->check(CLI::Range(1, 64));
  app.add_option("--max-images", max_images, "images per request at most")->check(CLI::Range(0, 1024));
}

engine::ModelOptions EngineArgs::model_options() const {
  engine::ModelOptions o;
  if (!mask_mode.empty()) o.mask_mode = parse_mask_mode(mask_mode);
  o.precision = precision_of(precision);
  o.context = context;
  o.threads = threads;
  return o;
}

server::SchedulerOptions EngineArgs::scheduler_options() const {
  server::SchedulerOptions s;
  s.budget.max_seqs = max_seqs;
  s.budget.prefill_rows = prefill_rows;
  s.budget.images = images_per_step;
  s.max_queue = max_queue;
  return s;
}

}  // namespace vlm::cli
