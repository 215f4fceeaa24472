// Prompt inputs shared by `vlm run` and `vlm dump`: --tokens (a JSON id list, used as
// the raw prompt), --prompt (the Gemma 3 chat template around one user turn: the images
// first, in order, then the text; unless --raw: then the text as HF's tokenizer(text)
// reads it — special tokens parsed, <bos> prepended unless the text already starts with
// it, each "<start_of_image>" an image slot) or --messages FILE (an OpenAI-style message
// list; its image parts take the --image files in order). The prompt itself is built by
// engine::Model; this file maps options to it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "vision/image.h"

namespace CLI {
class App;
}

namespace vlm::cli {

struct PromptArgs {
  std::string prompt;  // --prompt
  std::string tokens;  // --tokens "[2,105,...]"
  std::string messages;  // --messages FILE
  bool raw = false;    // --raw: no chat template
  // Adds --prompt, --tokens, --messages and --raw.
  void add(CLI::App& app);
  // Exactly one of --prompt / --tokens / --messages must be given; the text forms need
  // tokenizer.json. Image slots take `images` in order, failing unless slots and images agree.
  std::vector<int32_t> ids(const engine::Model& model, const std::vector<vision::RgbImage>& images) const;
};

// The image side of a request, shared by `vlm run` and `vlm dump`.
// The kernel path VLM_ISA (scalar, avx2 or avx512) forces; nullopt when it is unset: tests and
// benchmarks compare paths.
std::optional<kernels::Isa> isa_from_env();

struct ImageArgs {
  std::vector<std::string> files;  // --image, in prompt order
  std::string mask_mode;           // --mask-mode; empty = the checkpoint's default
  std::string image_scaling = "reference";
  std::string layout = "hf";
  std::string mmproj;              // --mmproj: a GGUF model's vision tower + projector
  bool pan_and_scan = false;
  bool mlock = false;
  // Adds --image, --mask-mode, --image-scaling, --mmproj, --layout, --pan-and-scan, --mlock.
  void add(CLI::App& app);
  // The model options these flags (and the environment's VLM_ISA and VLM_FAULT) ask for;
  // checks every value before anything is loaded.
  engine::ModelOptions model_options() const;
  // Decodes the images (a text-only checkpoint refuses them first). Runs before the model
  // loads, so a bad image fails fast.
  std::vector<vision::RgbImage> load(const std::filesystem::path& model_dir) const;
};

// Parses a JSON list of token ids; `what` names the option in errors.
std::vector<int32_t> parse_token_list(const std::string& json, const char* what);

}  // namespace vlm::cli
