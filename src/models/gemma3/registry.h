// The one list of a Gemma 3 checkpoint's tensors (canonical names, shapes from the config,
// part), as gemma.cpp's ForEachTensor: checkpoint validation (Checkpoint::open) and model
// building (Decoder, SiglipTower, Projector) both read it, so a tensor is named once.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "kernels/matmul.h"

namespace vlm::models::gemma3 {

// Tensors of one decoder layer.
enum class LayerTensor {
  Q, K, V, O, Gate, Up, Down,  // matrices [out, in]
  InputNorm, PostAttnNorm, PreFfNorm, PostFfNorm, QNorm, KNorm,  // vectors
};
std::string layer_tensor_name(int layer, LayerTensor t);
std::vector<int64_t> layer_tensor_shape(const TextConfig& c, LayerTensor t);

// Every tensor of a checkpoint with this config: the decoder's, SigLIP's (vision/siglip.h)
// and the projector's.
std::vector<TensorSpec> tensor_registry(const ModelConfig& c);

// Opens a Gemma 3 checkpoint (safetensors folder, GGUF file or GGUF folder; `mmproj`: a GGUF
// mmproj file), validated against tensor_registry().
Checkpoint open_checkpoint(const std::filesystem::path& path, Parts parts = {},
                           const std::filesystem::path& mmproj = {});

// A tensor from the checkpoint, shape-checked against the registry.
const TensorView& registry_tensor(const Checkpoint& ck, std::string_view name);
// A decoder layer's tensor from the checkpoint, shape-checked against the registry.
const TensorView& layer_tensor(const Checkpoint& ck, int layer, LayerTensor t);

}  // namespace vlm::models::gemma3
