// Writing GGUF files (version 3, the layout of docs/gguf.md §1): key/values in the order
// added, tensor infos, padding to the alignment (32), then each tensor's bytes at an aligned
// offset. Used by `vlm quantize`; what it writes is what parse_gguf reads and llama.cpp loads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"

namespace vlm {

class GgufWriter {
 public:
  void add_u32(std::string_view key, uint32_t v);
  void add_f32(std::string_view key, float v);
  void add_bool(std::string_view key, bool v);
  void add_string(std::string_view key, std::string_view v);
  void add_strings(std::string_view key, const std::vector<std::string>& v);
  void add_f32s(std::string_view key, const std::vector<float>& v);
  void add_i32s(std::string_view key, const std::vector<int32_t>& v);
  // A tensor of PyTorch shape `shape` (slowest first) stored as `type`; `data` holds exactly
  // its bytes (checked).
  void add_tensor(std::string_view name, const std::vector<int64_t>& shape, GgmlType type, std::vector<std::byte> data);
  // Writes the file (to a temporary name first, renamed at the end).
  void write(const std::filesystem::path& path) const;

 private:
  void key(std::string_view k, GgufType t);
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    std::vector<std::byte> data;
  };
  std::vector<std::byte> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace vlm
