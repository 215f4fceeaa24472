#include "cli/engine_args.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cli/options.h"
#include "core/error.h"
#include "models/mask.h"

namespace vlm::cli {

namespace {
// --kv-memory: MiB, 0 (no limit) or auto (half of MemAvailable, which counts the page cache that
// the mmapped weights may occupy as available: the other half leaves them room).
size_t kv_budget_bytes(const std::string& v) {
  if (v == "auto") {
    std::ifstream in("/proc/meminfo");
    std::string line;
    unsigned long long kib = 0;
    while (std::getline(in, line))
      if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return size_t(kib / 2 * 1024);
    return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE)) / 4;
  }
  char* end = nullptr;
  const double mib = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(mib >= 0) || mib > double(uint64_t(1) << 30))
    fail("--kv-memory: expected MiB (0 for no limit) or auto, got '{}'", v.substr(0, 40));
  return size_t(mib * 1024 * 1024);
}
}  // namespace

void EngineArgs::add(CLI::App& app) {
  app.add_option("--model", model_dir, "checkpoint folder, GGUF model file or folder of GGUF files")->required();
  app.add_option("--mmproj", mmproj, "GGUF models: the mmproj .gguf (default: the model folder's mmproj*.gguf)");
  app.add_option("--mask-mode", mask_mode, "prefill mask: hf, mlx or causal (default: hf for VLMs, causal for text)");
  add_precision_option(app, precision);
  app.add_option("--ctx", context, "context length per request (default: max_position_embeddings)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_option("--threads", threads, "compute threads (default: the cores)")->check(CLI::Range(0, 1024));
  app.add_option("--max-seqs", max_seqs, "requests decoded together at most")->check(CLI::Range(1, 4096));
  app.add_option("--kv-memory", kv_memory,
                 "KV cache memory for running requests in MiB, 0 for no limit, or auto (half the memory "
                 "available at start); each request reserves what its prompt plus max_tokens can take");
  app.add_option("--max-queue", max_queue, "requests waiting for a place in the batch at most")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--prefill-rows", prefill_rows, "prompt rows per engine step (an image block stays whole)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--images-per-step", images_per_step, "image encodes per engine step")->check(CLI::Range(1, 64));
  app.add_option("--vision-layers-per-step", vision_layers,
                 "vision tower layers per engine step, so other requests run between them (0 = whole images)")
      ->check(CLI::Range(0, 1 << 10));
  app.add_option("--max-images", max_images, "images per request at most")->check(CLI::Range(0, 1024));
  app.add_option("--image-cache", image_cache_mib,
                 "MiB of recently encoded images' projector rows kept, so an image sent again (each turn of a "
                 "chat about it) skips the vision tower; 0 for none")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_option("--prefix-cache", prefix_cache_mib,
                 "MiB of finished requests' KV caches, and prompts' where their prefill ended, kept so that a "
                 "prompt that begins the same way (the next turn of a chat) starts from their rows and the same "
                 "prompt again (a regenerated answer) computes nothing; 0 for none")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  add_draft_option(app, draft);
  add_mlock_option(app, mlock);
}

engine::ModelOptions EngineArgs::model_options() const {
  engine::ModelOptions o;
  if (!mask_mode.empty()) o.mask_mode = parse_mask_mode(mask_mode);
  o.precision = precision_of(precision);
  o.context = context;
  o.threads = threads;
  o.mmproj = mmproj;
  o.mlock = mlock;
  return o;
}

server::SchedulerOptions EngineArgs::scheduler_options() const {
  server::SchedulerOptions s;
  s.budget.max_seqs = max_seqs;
  s.budget.kv_bytes = kv_budget_bytes(kv_memory);
  s.budget.prefill_rows = prefill_rows;
  s.budget.images = images_per_step;
  s.budget.vision_layers = vision_layers;
  s.budget.image_cache_bytes = size_t(image_cache_mib) << 20;
  s.budget.prefix_cache_bytes = size_t(prefix_cache_mib) << 20;
  s.budget.draft_tokens = draft;
  s.max_queue = max_queue;
  return s;
}

}  // namespace vlm::cli
