#include "io/gguf_write.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace vlm {

namespace {
constexpr uint64_t kAlign = 32;  // ggml's GGUF_DEFAULT_ALIGNMENT

template <class T>
void put(std::vector<std::byte>& out, T v) {  // little-endian hosts only (x86-64)
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

void put_str(std::vector<std::byte>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}
}  // namespace

void GgufWriter::key(std::string_view k, GgufType t) {
  put_str(kv_, k);
  put<uint32_t>(kv_, uint32_t(t));
  ++n_kv_;
}

void GgufWriter::add_u32(std::string_view k, uint32_t v) {
  key(k, GgufType::U32);
  put(kv_, v);
}

void GgufWriter::add_f32(std::string_view k, float v) {
  key(k, GgufType::F32);
  put(kv_, v);
}

void GgufWriter::add_bool(std::string_view k, bool v) {
  key(k, GgufType::Bool);
  put<uint8_t>(kv_, v ? 1 : 0);
}

void GgufWriter::add_string(std::string_view k, std::string_view v) {
  key(k, GgufType::String);
  put_str(kv_, v);
}

void GgufWriter::add_strings(std::string_view k, const std::vector<std::string>& v) {
  key(k, GgufType::Array);
  put<uint32_t>(kv_, uint32_t(GgufType::String));
  put<uint64_t>(kv_, v.size());
  for (const std::string& s : v) put_str(kv_, s);
}

void GgufWriter::add_f32s(std::string_view k, const std::vector<float>& v) {
  key(k, GgufType::Array);
  put<uint32_t>(kv_, uint32_t(GgufType::F32));
  put<uint64_t>(kv_, v.size());
  for (float x : v) put(kv_, x);
}

void GgufWriter::add_i32s(std::string_view k, const std::vector<int32_t>& v) {
  key(k, GgufType::Array);
  put<uint32_t>(kv_, uint32_t(GgufType::I32));
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
}

void GgufWriter::add_tensor(std::string_view name, const std::vector<int64_t>& shape, GgmlType type,
                            std::vector<std::byte> data) {
  if (name.size() > kGgufMaxTensorName) fail("gguf writer: tensor name '{}' is longer than {}", name, kGgufMaxTensorName);
  const GgmlTypeTraits tr = ggml_traits(type);
  std::vector<int64_t> ne(shape.rbegin(), shape.rend());
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  if (ne.empty() || ne[0] % tr.block_elems || data.size() != size_t(n / tr.block_elems) * tr.block_bytes)
    fail("gguf writer: tensor '{}': {} bytes do not hold {} values of {}", name, data.size(), n, ggml_type_name(type));
  tensors_.push_back({std::string(name), std::move(ne), type, std::move(data)});
}

void GgufWriter::write(const std::filesystem::path& path) const {
  std::vector<std::byte> head;
  for (char c : std::string_view("GGUF")) head.push_back(std::byte(c));
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_str(head, t.name);
    put<uint32_t>(head, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, uint64_t(d));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset += (t.data.size() + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign);

  const std::filesystem::path tmp = path.string() + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) fail("{}: cannot open for writing", tmp.string());
  auto write = [&](const std::byte* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) fail("{}: write failed (disk full?)", tmp.string());
  };
  write(head.data(), head.size());
  const std::byte zeros[kAlign] = {};
  for (const Tensor& t : tensors_) {
    write(t.data.data(), t.data.size());
    write(zeros, (kAlign - t.data.size() % kAlign) % kAlign);
  }
  if (std::fflush(f.get()) != 0) fail("{}: write failed (disk full?)", tmp.string());
  f.reset();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename to {}: {}", tmp.string(), path.string(), ec.message());
}

}  // namespace vlm
