// Opening input files and writing output files, the one way every module does it.
//
// Inputs (checkpoints, images, JSON, caches) are opened without blocking and refused
// unless they are regular files: a FIFO would block open() forever, a directory or a
// device would give a library's cryptic read error instead of one naming the file.
// Outputs are written to a fresh temporary in the target's folder (created with
// O_CREAT|O_EXCL|O_NOFOLLOW, so an existing name or a planted symlink is never
// followed) and renamed over the target; a target that is a symlink is refused.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace vlm {

// A regular file opened read-only; closed on destruction.
class InputFile {
 public:
  // Fails "<path>: not a regular file (a directory)" etc. without blocking.
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open time
  const std::string& where() const { return where_; }
  // Reads exactly n bytes at offset `off`; fails "<path>: truncated …" at the end of the file.
  void read_at(void* dst, size_t n, uint64_t off) const;

 private:
  std::string where_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A whole (small) file; refuses files larger than max_bytes before reading them.
// `what` (e.g. "--messages: ") prefixes errors when the file came from an option.
std::string read_text_file(const std::filesystem::path& path, size_t max_bytes = 64u << 20,
                           std::string_view what = {});

// Writes `target` through a temporary in its folder, renamed over it on commit().
// Dropped without commit(), the temporary is removed and `target` is untouched.
class AtomicWriter {
 public:
  explicit AtomicWriter(const std::filesystem::path& target);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();

 private:
  std::filesystem::path target_, tmp_;
  int fd_ = -1;
};

// One-shot AtomicWriter.
void write_file(const std::filesystem::path& target, std::string_view bytes);

}  // namespace vlm
