// Prompt inputs shared by `vlm run` and `vlm dump`: --tokens (a JSON id list, used as
// the raw prompt), --prompt (the Gemma 3 chat template around one user turn: the images
// first, in order, then the text; unless --raw: then the text as HF's tokenizer(text)
// reads it — special tokens parsed, <bos> prepended unless the text already starts with
// it, each "<start_of_image>" an image slot) or --messages FILE (an OpenAI-style message
// list; its image parts take the --image files in order).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "multimodal/host.h"
#include "text/chat.h"
#include "text/tokenizer.h"

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
};

struct Prompt {
  std::vector<int32_t> ids;
  std::optional<text::Tokenizer> tokenizer;  // loaded when the folder has tokenizer.json
};

// Exactly one of --prompt / --tokens / --messages must be given; the text forms need
// tokenizer.json. Image slots are expanded with `it` (crops[k] Pan & Scan crops for
// image k; crops.size() images), failing unless the slots and the images agree.
Prompt make_prompt(const PromptArgs& a, const std::filesystem::path& model_dir,
                   const text::ImageTokens& it = {}, std::span<const int> crops = {});
// The image side of a request, shared by `vlm run` and `vlm dump`.
struct ImageArgs {
  std::vector<std::string> files;  // --image, in prompt order
  std::string mask_mode;           // --mask-mode; empty = the checkpoint's default
  std::string image_scaling = "reference";
  std::string layout = "hf";
  bool pan_and_scan = false;
  // Adds --image, --mask-mode, --image-scaling, --layout, --pan-and-scan.
  void add(CLI::App& app);
  HostOptions host_options(const ModelConfig& mc) const;
};

struct ImageInputs {
  std::vector<vision::RgbImage> images;
  std::optional<vision::VisionEncoder> encoder;  // only when images were given
  std::vector<int> crops;                        // per image
  text::ImageTokens tokens;                      // of the checkpoint, in the chosen layout
};
// Decodes the images (a checkpoint opened with its vision part when there are any).
ImageInputs load_image_inputs(const ImageArgs& a, const Checkpoint& ck);

// Parses a JSON list of token ids; `what` names the option in errors.
std::vector<int32_t> parse_token_list(const std::string& json, const char* what);

}  // namespace vlm::cli
