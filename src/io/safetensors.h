// safetensors files: a read-only memory map plus a strictly validated header.
//
// Layout: u64 little-endian N, then N bytes of JSON, then the data section.
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) and may hold "__metadata__" (string map).
// Every check happens before any tensor byte is used; errors name the file and,
// where there is one, the tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace vlm {

// A whole file mapped read-only; unmapped on destruction. Pages are read
// lazily, so tensors that are never touched are never read from disk.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // file offset of the data section (8 + N)
  uint64_t data_size = 0;    // bytes from data_offset to the end of the file
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// Headers larger than this are refused (real ones are well under 1 MB).
constexpr uint64_t kMaxSafetensorsHeader = 100u << 20;

// Validates the JSON header `json` of a file of `file_size` bytes. `where`
// (the file name) starts every error message.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t file_size,
                                           const std::string& where);
// Same, from an in-memory image of a whole file (fuzzing, tests).
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& where);
// Reads and validates only the header of a file on disk; nothing is mapped.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

}  // namespace vlm
