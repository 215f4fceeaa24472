// config.json and preprocessor_config.json, parsed once and validated.
// Every value the math uses is here; a missing field either gets the HF class
// default (docs/gemma3/config.md, documented per field in config.cpp) or is an error
// naming the field.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace vlm {

// Bounds that every config source (config.json, GGUF metadata) applies: far above any real
// Gemma 3 value, low enough that products of two sizes cannot overflow int64 when shapes are
// computed, and that no count read from a file drives a huge allocation before the tensors
// are checked against it.
namespace config_limits {
inline constexpr int64_t kMaxDim = 1 << 24;        // widths, vocabulary
inline constexpr int64_t kMaxLayers = 1 << 12;
inline constexpr int64_t kMaxHeads = 1 << 12;
inline constexpr int64_t kMaxHeadDim = 1 << 16;
inline constexpr int64_t kMaxSide = 1 << 16;       // image and patch sides, in pixels
inline constexpr int64_t kMaxPositions = 1 << 26;
inline constexpr double kMaxScalar = 1e12;         // scales, RoPE bases, ratios
inline constexpr double kMaxEps = 0.1;             // added to a variance: near 1 it drowns the signal
inline constexpr double kMaxPixelStat = 1e6;       // see pixel_stat_in_range

// |image_mean| at most kMaxPixelStat, image_std within [1 / kMaxPixelStat, kMaxPixelStat]: pixels
// reach the tower as (x·rescale − mean) / std, which then stays finite in f32.
inline bool pixel_stat_in_range(float v, bool is_std) {
  return is_std ? v >= float(1 / kMaxPixelStat) && v <= kMaxPixelStat : v >= -kMaxPixelStat && v <= kMaxPixelStat;
}
}  // namespace config_limits

enum class Arch { ConditionalGeneration, CausalLM };  // Gemma3ForConditionalGeneration / Gemma3ForCausalLM
enum class LayerKind { Sliding, Global };

struct TextConfig {
  int vocab_size = 0;
  int hidden_size = 0;         // H
  int intermediate_size = 0;   // I
  int num_layers = 0;
  int num_heads = 0;           // nH
  int num_kv_heads = 0;        // nKV
  int head_dim = 0;            // d
  double query_pre_attn_scalar = 0;  // attention scale = this^-0.5
  double rms_norm_eps = 0;
  int max_position_embeddings = 0;   // context limit
  int sliding_window = 0;            // W
  std::vector<LayerKind> layer_kinds;  // size num_layers, docs/gemma3/config.md#layer-kinds
  double rope_theta = 0;             // global layers
  double rope_local_base_freq = 0;   // sliding layers, never scaled
  double rope_scaling_factor = 1;    // linear factor on global layers (1 = none)
  std::string rope_scaling_type = "default";  // "default" or "linear"
  bool tie_word_embeddings = true;
  std::string hidden_activation = "gelu_pytorch_tanh";
};

struct VisionConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_channels = 3;
  int image_size = 0;
  int patch_size = 0;
  double layer_norm_eps = 0;
  std::string hidden_act = "gelu_pytorch_tanh";
  int patches_per_side() const { return image_size / patch_size; }
};

struct PreprocessorConfig {
  int height = 0, width = 0;   // resize target
  int resample = 2;            // PIL filter id; 2 = BILINEAR
  bool do_resize = true, do_rescale = true, do_normalize = true, do_convert_rgb = true;
  double rescale_factor = 1.0 / 255;
  float image_mean[3] = {0.5f, 0.5f, 0.5f};
  float image_std[3] = {0.5f, 0.5f, 0.5f};
  bool do_pan_and_scan = false;
  int pan_and_scan_min_crop_size = 256;
  int pan_and_scan_max_num_crops = 4;
  double pan_and_scan_min_ratio_to_activate = 1.2;
};

struct ModelConfig {
  Arch arch = Arch::CausalLM;
  std::string architecture;  // as written in config.json
  TextConfig text;
  std::optional<VisionConfig> vision;            // VLM only
  std::optional<PreprocessorConfig> preprocessor;  // VLM only
  int mm_tokens_per_image = 0;  // VLM only
  int boi_token_id = 0, eoi_token_id = 0, image_token_id = 0;  // VLM only
  int bos_token_id = 2, pad_token_id = 0;
  std::vector<int> eos_token_ids;  // generation stops on any
  std::optional<DType> torch_dtype;  // declared storage dtype, if any

  bool is_vlm() const { return arch == Arch::ConditionalGeneration; }
  // Side of the pooled token grid, sqrt(mm_tokens_per_image), and the average-pool
  // kernel that maps the patch grid onto it (docs/gemma3/vision.md#projector). VLM only.
  int tokens_per_side() const;
  int pool_kernel() const { return vision->patches_per_side() / tokens_per_side(); }
};

// Reads config.json (and preprocessor_config.json for VLMs, when present) from a
// checkpoint folder; eos ids absent from config.json come from generation_config.json.
ModelConfig load_config(const std::filesystem::path& dir);
// Parses config.json text; `where` names the file in errors. eos_token_ids stays
// empty when the text has none (load_config then looks further).
ModelConfig parse_config(const std::string& json_text, const std::string& where);
// Parses preprocessor_config.json text for a parsed VLM config (checked against
// its image size and token count); nulls take the processor defaults (docs/gemma3/preprocessing.md#config).
PreprocessorConfig parse_preprocessor_config(const std::string& json_text, const std::string& where,
                                             const ModelConfig& model);
// The processor settings a VLM runs with: preprocessor_config.json's, or without one
// HF's defaults at the tower's image size.
PreprocessorConfig effective_preprocessor(const ModelConfig& c);
std::string_view layer_kind_name(LayerKind k);  // "sliding" / "global"

}  // namespace vlm
