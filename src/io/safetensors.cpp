#include "io/safetensors.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <limits>
#include <mutex>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace vlm {

using nlohmann::json;

namespace {

DType parse_dtype(const json& v, const std::string& where, const std::string& name) {
  if (!v.is_string()) fail("{}: tensor '{}': dtype must be a string", where, name);
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  fail("{}: tensor '{}': unsupported dtype '{}' (supported: F32, F16, BF16)", where, name, printable(s));
}

// A JSON integer in [0, INT64_MAX]; floats, negatives and huge values are refused.
uint64_t non_negative(const json& v, const std::string& where, const std::string& name, const char* what) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
    return v.get<uint64_t>();
  if (v.is_number_integer() && !v.is_number_unsigned())
    fail("{}: tensor '{}': {} entry {} is negative", where, name, what, v.get<int64_t>());
  fail("{}: tensor '{}': {} entries must be integers in [0, 2^63), got {}", where, name, what, v.dump());
}

SafetensorsEntry parse_entry(const std::string& name, const json& e, uint64_t data_offset, uint64_t data_size,
                             const std::string& where) {
  if (name.empty()) fail("{}: empty tensor name", where);
  // Names are echoed in one-line error messages; refuse control characters.
  if (printable(name) != name) fail("{}: tensor name '{}' contains control characters", where, printable(name));
  if (!e.is_object()) fail("{}: tensor '{}': entry must be an object", where, name);
  for (const auto& [k, v] : e.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail("{}: tensor '{}': unexpected key '{}'", where, name, printable(k));
  if (!e.contains("dtype")) fail("{}: tensor '{}': missing dtype", where, name);
  if (!e.contains("shape")) fail("{}: tensor '{}': missing shape", where, name);
  if (!e.contains("data_offsets")) fail("{}: tensor '{}': missing data_offsets", where, name);

  SafetensorsEntry t;
  t.name = name;
  t.dtype = parse_dtype(e["dtype"], where, name);

  const json& shape = e["shape"];
  if (!shape.is_array()) fail("{}: tensor '{}': shape must be an array", where, name);
  uint64_t bytes = dtype_size(t.dtype);
  for (const json& d : shape) {
    const uint64_t n = non_negative(d, where, name, "shape");
    t.shape.push_back(int64_t(n));
    if (__builtin_mul_overflow(bytes, n, &bytes))
      fail("{}: tensor '{}': shape {} overflows 64-bit byte size", where, name, shape.dump());
  }

  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail("{}: tensor '{}': data_offsets must be [begin, end]", where, name);
  t.begin = non_negative(off[0], where, name, "data_offsets");
  t.end = non_negative(off[1], where, name, "data_offsets");
  if (t.begin > t.end) fail("{}: tensor '{}': data_offsets begin {} > end {}", where, name, t.begin, t.end);
  if (t.end > data_size)
    fail("{}: tensor '{}': data_offsets end {} is past the data section ({} bytes)", where, name, t.end, data_size);
  if (t.end - t.begin != bytes)
    fail("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets span {}", where, name, shape.dump(),
         dtype_name(t.dtype), bytes, t.end - t.begin);
  // Kernels read elements in place; a misaligned tensor would be undefined behaviour.
  if ((data_offset + t.begin) % dtype_size(t.dtype) != 0)
    fail("{}: tensor '{}': data at file offset {} is not aligned to its {}-byte elements", where, name,
         data_offset + t.begin, dtype_size(t.dtype));
  return t;
}

}  // namespace

namespace {

// A file truncated while mapped makes reads past its new end raise SIGBUS. The handler
// names the file from this table (fixed slots, read without locks: it runs in a signal)
// and exits with status 1, one line like every other error.
struct MapSlot {
  std::atomic<const std::byte*> begin{nullptr};
  std::atomic<size_t> size{0};
  char path[512] = {};
};
MapSlot g_maps[64];

extern "C" void on_sigbus(int, siginfo_t* info, void*) {
  const auto* addr = static_cast<const std::byte*>(info->si_addr);
  const char* path = "a mapped file";
  for (MapSlot& m : g_maps) {
    const std::byte* b = m.begin.load();
    if (b && addr >= b && addr < b + m.size.load()) path = m.path;
  }
  const char* parts[] = {"vlm: error: ", path,
                         ": the file changed (truncated?) while its weights were in use (SIGBUS)\n"};
  for (const char* p : parts) (void)!::write(2, p, std::strlen(p));
  ::_exit(1);
}

void register_map(const std::byte* data, size_t size, const std::string& path) {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
  static std::mutex mu;  // writers only; the handler reads the atomics
  std::lock_guard<std::mutex> lock(mu);
  for (MapSlot& m : g_maps) {
    if (m.begin.load()) continue;
    std::snprintf(m.path, sizeof m.path, "%s", printable(path).c_str());
    m.size.store(size);
    m.begin.store(data);
    return;
  }  // more maps than slots: the handler still reports, without the file name
}

void unregister_map(const std::byte* data) {
  for (MapSlot& m : g_maps)
    if (m.begin.load() == data) m.begin.store(nullptr);
}

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const InputFile f(path);
  size_ = size_t(f.size());
  if (size_ == 0) return;  // mmap refuses empty files; callers see size() == 0
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  if (p == MAP_FAILED) fail("{}: cannot mmap: {}", f.where(), std::strerror(errno));
  data_ = static_cast<const std::byte*>(p);
  // Pages this mapping reads from disk come as 2 MiB page-cache folios where the kernel caches
  // files in large folios (seen on Linux 6.18 with ext4; a no-op where THP is off), whatever the
  // readahead size: decode streams them faster (docs/gguf.md, "Decode streams"). Pages already
  // cached keep their size.
  ::madvise(p, size_, MADV_HUGEPAGE);
  register_map(data_, size_, f.where());
}

MappedFile::~MappedFile() {
  if (!data_) return;
  unregister_map(data_);
  ::munmap(const_cast<std::byte*>(data_), size_);
}

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t file_size, const std::string& where) {
  SafetensorsHeader h;
  if (file_size < 8 || text.size() > file_size - 8)
    fail("{}: header of {} bytes does not fit in a file of {} bytes", where, text.size(), file_size);
  h.data_offset = 8 + text.size();
  h.data_size = file_size - h.data_offset;

  // Valid headers nest three levels deep (object, entry, shape array).
  const json j = parse_json(text, where + ": header", 3);
  if (!j.is_object()) fail("{}: header must be a JSON object", where);

  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail("{}: __metadata__ must be an object", where);
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) fail("{}: __metadata__ '{}' must be a string", where, printable(k));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(name, e, h.data_offset, h.data_size, where));
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& t : h.tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", where, by_offset[i - 1]->name,
           by_offset[i - 1]->begin, by_offset[i - 1]->end, by_offset[i]->name, by_offset[i]->begin,
           by_offset[i]->end);

  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return h;
}

namespace {

uint64_t header_length(const unsigned char b[8], uint64_t file_size, const std::string& where) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  if (n > kMaxSafetensorsHeader)
    fail("{}: header length {} exceeds the limit of {} bytes", where, n, kMaxSafetensorsHeader);
  if (n > file_size - 8)
    fail("{}: header length {} is larger than the rest of the file ({} bytes)", where, n, file_size - 8);
  return n;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& where) {
  if (file.size() < 8) fail("{}: truncated: {} bytes, too short for a safetensors header", where, file.size());
  const uint64_t n = header_length(reinterpret_cast<const unsigned char*>(file.data()), file.size(), where);
  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, size_t(n));
  return parse_safetensors_header(text, file.size(), where);
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const InputFile f(path);
  const std::string& where = f.where();
  const uint64_t size = f.size();
  if (size < 8) fail("{}: truncated: {} bytes, too short for a safetensors header", where, size);
  unsigned char len8[8];
  f.read_at(len8, 8, 0);
  const uint64_t n = header_length(len8, size, where);
  std::string text(size_t(n), '\0');
  f.read_at(text.data(), text.size(), 8);
  return parse_safetensors_header(text, size, where);
}

}  // namespace vlm
