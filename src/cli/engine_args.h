// Options shared by the commands that run the scheduler (`vlm serve`, `vlm batch`): the
// model folder and how it loads, the batch bounds and the image policy.
#pragma once
#include <cstdint>
#include <string>

#include "engine/model.h"
#include "server/http_server.h"

namespace CLI {
class App;
}

namespace vlm::cli {

struct EngineArgs {
  std::string model_dir;
  std::string mmproj;  // GGUF models: the mmproj file
  std::string mask_mode;  // empty: the checkpoint's default
  std::string precision;  // empty: the checkpoint's default
  int64_t context = 0;
  int threads = 0;
  int max_seqs = 8;
  std::string kv_memory = "auto";  // MiB, or auto: half the memory available at start
  int max_queue = 64;
  int prefill_rows = 512;
  int images_per_step = 1;
  int vision_layers = 2;
  int max_images = 8;
  int64_t image_cache_mib = 256;    // projector rows of recent images kept for reuse (0: none)
  int64_t prefix_cache_mib = 1024;  // KV caches of finished requests and prompts kept for reuse (0: none)
  int draft = 0;                    // draft ids per step and answer (0: none)
  bool mlock = false;               // lock the weights in memory
  // Adds --model, --mask-mode, --precision, --ctx, --threads, --max-seqs, --kv-memory, --max-queue,
  // --prefill-rows, --images-per-step, --vision-layers-per-step, --max-images, --image-cache,
  // --prefix-cache, --draft, --mlock.
  void add(CLI::App& app);
  engine::ModelOptions model_options() const;
  server::SchedulerOptions scheduler_options() const;
};

}  // namespace vlm::cli
