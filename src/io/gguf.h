// GGUF files (llama.cpp's container, versions 2 and 3): a read-only memory map
// plus a strictly validated header. docs/gguf.md describes the layout and what
// is checked.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 key/value
// count, the key/values, the tensor infos, zero padding to the alignment, then
// the data section. Every offset, size, count, string length, alignment and
// type is checked against the bytes that are actually there before it is used
// (so no allocation is driven by an unchecked count); errors are one line and
// name the file and the key or tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/safetensors.h"  // MappedFile

namespace vlm {

// ggml tensor types that vlm reads (numbers as in ggml.h `enum ggml_type`).
// Any other type id is refused by name when a file is parsed.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
  IQ4_NL = 20, IQ4_XS = 23, BF16 = 30
};

struct GgmlTypeTraits {
  int64_t block_elems;  // values per block along ne[0]
  size_t block_bytes;   // bytes per block
};
GgmlTypeTraits ggml_traits(GgmlType t);
std::string_view ggml_type_name(GgmlType t);
// Name of any ggml type id (known but unsupported ones by their ggml name), for messages.
std::string ggml_type_id_name(uint32_t id);
// The weight format (DType) of a GGUF tensor type and back (every GgmlType vlm reads has one).
DType dtype_of(GgmlType t);
GgmlType ggml_type_of(DType t);  // throws for DType::Q8Act/Q8KAct (activations only)
// Parses "f32", "Q8_0", ... (case-insensitive); nullopt when not a supported type.
std::optional<GgmlType> ggml_type_from_name(std::string_view name);

// Metadata value types (gguf.h `enum gguf_type`).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata entry; every view (key included) points into the parsed buffer.
struct GgufKv {
  std::string_view key;
  GgufType type = GgufType::U8;
  GgufType elem = GgufType::U8;        // arrays: element type (never Array)
  uint64_t count = 0;                  // arrays: element count
  std::span<const std::byte> bytes;    // scalars and fixed-size arrays: the raw little-endian payload
  std::string_view str;                // strings
  std::vector<std::string_view> strs;  // string arrays (count checked against the bytes first)
};

struct GgufTensor {
  std::string_view name;  // points into the parsed buffer
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;  // ne[0] fastest-varying (PyTorch shape reversed)
  uint64_t offset = 0;      // byte offset within the data section
  uint64_t bytes = 0;
  int64_t elements() const;
  // ne reversed: the row-major shape with the slowest dimension first.
  std::vector<int64_t> shape() const;
};

class GgufHeader {
 public:
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // file offset of the data section
  uint64_t data_size = 0;    // bytes from data_offset to the end of the file
  std::vector<GgufKv> kvs;          // in file order
  std::vector<GgufTensor> tensors;  // in file order
  std::string where;                // file name, starts every error message

  const GgufKv* find(std::string_view key) const;
  const GgufTensor* tensor(std::string_view name) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access; a missing key or a different type fails naming the key and both types.
  // Integers of any GGUF integer type are accepted when the value fits.
  uint64_t get_uint(std::string_view key) const;
  float get_f32(std::string_view key) const;  // f32, or f64 that converts exactly
  bool get_bool(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;
  std::span<const std::string_view> get_strings(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;  // i32 (or u8/i8/u16/i16) arrays

  // Defaults when the key is absent; still fail on a wrong type.
  uint64_t get_uint_or(std::string_view key, uint64_t def) const { return has(key) ? get_uint(key) : def; }
  float get_f32_or(std::string_view key, float def) const { return has(key) ? get_f32(key) : def; }
  bool get_bool_or(std::string_view key, bool def) const { return has(key) ? get_bool(key) : def; }

  void index();  // builds the lookup tables (the parser calls it)

 private:
  const GgufKv& need(std::string_view key) const;
  std::unordered_map<std::string_view, size_t> kv_index_, tensor_index_;
};

// Limits against hostile files (real files are far below them).
constexpr uint64_t kGgufMaxKeyBytes = 65535;
constexpr size_t kGgufMaxTensorName = 63;  // ggml's GGML_MAX_NAME (64) minus the terminator
constexpr uint32_t kGgufMaxDims = 4;        // GGML_MAX_DIMS

// Validates a whole GGUF file image; views in the result point into `file`.
GgufHeader parse_gguf(std::span<const std::byte> file, const std::string& where);

// A mapped GGUF file and its header; tensor bytes are read lazily through the map.
class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);
  const GgufHeader& header() const { return header_; }
  std::span<const std::byte> data(const GgufTensor& t) const;
  const std::filesystem::path& path() const { return map_->path(); }

 private:
  std::unique_ptr<MappedFile> map_;
  GgufHeader header_;
};

}  // namespace vlm
