#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "core/error.h"

namespace vlm {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

}  // namespace

InputFile::InputFile(const std::filesystem::path& path) : where_(path.string()) {
  // O_NONBLOCK: open() on a FIFO with no writer returns at once instead of waiting.
  fd_ = ::open(where_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail("{}: cannot read: {}", where_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    fail("{}: cannot stat: {}", where_, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail("{}: not a regular file ({})", where_, kind_of(st.st_mode));
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = uint64_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(void* dst, size_t n, uint64_t off) const {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, static_cast<char*>(dst) + got, n - got, off_t(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("{}: read failed at offset {}: {}", where_, off + got, std::strerror(errno));
    if (r == 0) fail("{}: truncated: {} bytes wanted at offset {}, the file ends at {}", where_, n, off, off + got);
    got += size_t(r);
  }
}

std::string read_text_file(const std::filesystem::path& path, size_t max_bytes, std::string_view what) {
  try {
    const InputFile f(path);
    if (f.size() > max_bytes)
      fail("{}: file too large ({} bytes, limit {})", f.where(), f.size(), max_bytes);
    std::string text(size_t(f.size()), '\0');
    f.read_at(text.data(), text.size(), 0);
    return text;
  } catch (const Error& e) {
    if (what.empty()) throw;
    fail("{}{}", what, e.what());
  }
}

AtomicWriter::AtomicWriter(const std::filesystem::path& target) : target_(target) {
  struct stat st {};
  if (::lstat(target_.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) fail("{}: is a symbolic link; refusing to write through it", target_.string());
    if (!S_ISREG(st.st_mode)) fail("{}: exists and is not a regular file ({})", target_.string(), kind_of(st.st_mode));
  }
  // A name nobody can predict, created exclusively: never an existing file or link.
  std::random_device rd;
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    tmp_ = target_;
    tmp_ += fmt::format(".tmp{:08x}{:08x}", rd(), rd());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) fail("{}: cannot create {}: {}", target_.string(), tmp_.string(), std::strerror(errno));
  }
  if (fd_ < 0) fail("{}: cannot create a temporary file next to it", target_.string());
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::write(fd_, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("{}: write failed: {}", target_.string(), std::strerror(r < 0 ? errno : EIO));
    p += r;
    n -= size_t(r);
  }
}

void AtomicWriter::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail("{}: write failed: {}", target_.string(), std::strerror(e));
  }
  // Checked again: a symlink planted at the target since the constructor is still refused.
  struct stat st {};
  if (::lstat(target_.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    ::unlink(tmp_.c_str());
    fail("{}: is a symbolic link; refusing to replace it", target_.string());
  }
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail("{}: cannot replace: {}", target_.string(), std::strerror(e));
  }
}

void write_file(const std::filesystem::path& target, std::string_view bytes) {
  AtomicWriter w(target);
  w.write(bytes);
  w.commit();
}

}  // namespace vlm
