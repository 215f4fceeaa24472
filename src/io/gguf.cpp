#include "io/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/json.h"  // printable

namespace vlm {

namespace {

struct TypeRow {
  uint32_t id;
  const char* name;
  GgmlTypeTraits traits;  // block_elems 0: known to ggml but not read by vlm
};

// ggml.c `type_traits` (blck_size, type_size) for the types vlm reads; names of the others
// so that a refusal says which type a file uses.
constexpr TypeRow kTypes[] = {
    {0, "F32", {1, 4}},        {1, "F16", {1, 2}},        {2, "Q4_0", {32, 18}},     {3, "Q4_1", {32, 20}},
    {6, "Q5_0", {32, 22}},     {7, "Q5_1", {32, 24}},     {8, "Q8_0", {32, 34}},     {9, "Q8_1", {0, 0}},
    {10, "Q2_K", {256, 84}},   {11, "Q3_K", {256, 110}},      {12, "Q4_K", {256, 144}},  {13, "Q5_K", {256, 176}},
    {14, "Q6_K", {256, 210}},  {15, "Q8_K", {0, 0}},      {16, "IQ2_XXS", {0, 0}},   {17, "IQ2_XS", {0, 0}},
    {18, "IQ3_XXS", {0, 0}},   {19, "IQ1_S", {0, 0}},     {20, "IQ4_NL", {32, 18}},  {21, "IQ3_S", {0, 0}},
    {22, "IQ2_S", {0, 0}},     {23, "IQ4_XS", {256, 136}}, {24, "I8", {0, 0}},       {25, "I16", {0, 0}},
    {26, "I32", {0, 0}},       {27, "I64", {0, 0}},       {28, "F64", {0, 0}},       {29, "IQ1_M", {0, 0}},
    {30, "BF16", {1, 2}},      {34, "TQ1_0", {0, 0}},     {35, "TQ2_0", {0, 0}},     {39, "MXFP4", {0, 0}},
};

const TypeRow* type_row(uint32_t id) {
  for (const TypeRow& r : kTypes)
    if (r.id == id) return &r;
  return nullptr;
}

// "F32, F16, ...": the types vlm reads, for a refusal.
const std::string& read_type_names() {
  static const std::string names = [] {
    std::string s;
    for (const TypeRow& r : kTypes)
      if (r.traits.block_elems) s += (s.empty() ? "" : ", ") + std::string(r.name);
    return s;
  }();
  return names;
}

constexpr const char* kValueTypeNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};

size_t value_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: case GgufType::Array: return 0;
  }
  return 0;
}

// A bounds-checked little-endian cursor over the file image.
class Cursor {
 public:
  Cursor(std::span<const std::byte> file, const std::string& where) : file_(file), where_(where) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return file_.size() - pos_; }

  // `what` names the field for the error ("tensor 'x': type").
  template <typename T>
  T read(const std::string& what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, file_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const std::byte> take(uint64_t n, const std::string& what) {
    need(n, what);
    auto s = file_.subspan(size_t(pos_), size_t(n));
    pos_ += n;
    return s;
  }
  std::string_view string(const std::string& what, uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > max_len) fail("{}: {}: string length {} exceeds the limit of {}", where_, what, n, max_len);
    if (n > left())
      fail("{}: {}: string length {} at offset {} runs past the end of the file ({} bytes)", where_, what, n,
           pos_ - 8, file_.size());
    auto s = take(n, what);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

 private:
  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail("{}: truncated: {} needs {} bytes at offset {} but the file has {}", where_, what, n, pos_,
           file_.size());
  }
  std::span<const std::byte> file_;
  const std::string& where_;
  uint64_t pos_ = 0;
};

GgufType value_type(uint32_t raw, const std::string& where, const std::string& what) {
  if (raw > uint32_t(GgufType::F64)) fail("{}: {}: unknown value type {}", where, what, raw);
  return GgufType(raw);
}

// Keys and tensor names are echoed in one-line messages and compared as text.
void check_name(std::string_view s, const std::string& where, const char* what) {
  if (s.empty()) fail("{}: empty {}", where, what);
  if (printable(s) != s) fail("{}: {} '{}' contains control characters", where, what, printable(s));
}

void read_value(Cursor& c, GgufKv& kv, const std::string& where) {
  const std::string what = fmt::format("key '{}'", kv.key);
  if (kv.type == GgufType::String) {
    kv.str = c.string(what);
    return;
  }
  if (kv.type != GgufType::Array) {
    kv.bytes = c.take(value_size(kv.type), what);
    if (kv.type == GgufType::Bool && uint8_t(kv.bytes[0]) > 1)
      fail("{}: {}: bool value {} is neither 0 nor 1", where, what, unsigned(kv.bytes[0]));
    return;
  }
  kv.elem = value_type(c.read<uint32_t>(what + " array type"), where, what + " array element");
  if (kv.elem == GgufType::Array) fail("{}: {}: nested arrays are not supported", where, what);
  kv.count = c.read<uint64_t>(what + " array count");
  if (kv.elem == GgufType::String) {
    // Each string needs at least its 8-byte length: bound the count before reserving.
    if (kv.count > c.left() / 8)
      fail("{}: {}: array of {} strings cannot fit in the {} bytes left", where, what, kv.count, c.left());
    kv.strs.reserve(size_t(kv.count));
    for (uint64_t i = 0; i < kv.count; ++i) kv.strs.push_back(c.string(fmt::format("{} element {}", what, i)));
    return;
  }
  const size_t es = value_size(kv.elem);
  if (kv.count > c.left() / es)
    fail("{}: {}: array of {} {} values ({} bytes each) runs past the end of the file ({} bytes left)", where,
         what, kv.count, gguf_type_name(kv.elem), es, c.left());
  kv.bytes = c.take(kv.count * es, what);
  if (kv.elem == GgufType::Bool)
    for (uint64_t i = 0; i < kv.count; ++i)
      if (uint8_t(kv.bytes[size_t(i)]) > 1)
        fail("{}: {}: bool element {} is {} (neither 0 nor 1)", where, what, i, unsigned(kv.bytes[size_t(i)]));
}

GgufTensor read_tensor_info(Cursor& c, const std::string& where, uint64_t index) {
  GgufTensor t;
  t.name = c.string(fmt::format("tensor {} name", index), kGgufMaxTensorName);
  check_name(t.name, where, "tensor name");
  const std::string what = fmt::format("tensor '{}'", t.name);
  const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
  if (n_dims == 0 || n_dims > kGgufMaxDims)
    fail("{}: {}: n_dims {} is outside [1, {}]", where, what, n_dims, kGgufMaxDims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t n = c.read<uint64_t>(what + " ne");
    if (n > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: {}: ne[{}] = {} is negative as int64", where, what, d, n);
    t.ne.push_back(int64_t(n));
  }
  const uint32_t type = c.read<uint32_t>(what + " type");
  const TypeRow* row = type_row(type);
  if (!row) fail("{}: {}: unknown ggml type {}", where, what, type);
  if (row->traits.block_elems == 0)
    fail("{}: {}: ggml type {} ({}) is not supported (supported: {})", where, what, row->name, type,
         read_type_names());
  t.type = GgmlType(type);
  t.offset = c.read<uint64_t>(what + " offset");

  // Byte size with overflow checks; blocks run along ne[0].
  const GgmlTypeTraits tr = row->traits;
  if (t.ne[0] % tr.block_elems != 0)
    fail("{}: {}: ne[0] = {} is not a multiple of the {} block size {}", where, what, t.ne[0], row->name,
         tr.block_elems);
  uint64_t n = uint64_t(t.ne[0]) / uint64_t(tr.block_elems), bytes = 0, elems = uint64_t(t.ne[0]);
  for (size_t d = 1; d < t.ne.size(); ++d)
    if (__builtin_mul_overflow(n, uint64_t(t.ne[d]), &n) || __builtin_mul_overflow(elems, uint64_t(t.ne[d]), &elems) ||
        elems > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: {}: element count overflows", where, what);
  if (__builtin_mul_overflow(n, uint64_t(tr.block_bytes), &bytes))
    fail("{}: {}: byte size overflows", where, what);
  t.bytes = bytes;
  return t;
}

uint64_t pad_to(uint64_t x, uint64_t a, const std::string& where) {
  uint64_t r = 0;
  if (__builtin_add_overflow(x, (a - x % a) % a, &r)) fail("{}: offset {} overflows when aligned", where, x);
  return r;
}

}  // namespace

GgmlTypeTraits ggml_traits(GgmlType t) { return type_row(uint32_t(t))->traits; }

DType dtype_of(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    case GgmlType::Q8_0: return DType::Q8_0;
    case GgmlType::Q4_0: return DType::Q4_0;
    case GgmlType::Q4_1: return DType::Q4_1;
    case GgmlType::Q5_0: return DType::Q5_0;
    case GgmlType::Q5_1: return DType::Q5_1;
    case GgmlType::Q2_K: return DType::Q2_K;
    case GgmlType::Q3_K: return DType::Q3_K;
    case GgmlType::Q4_K: return DType::Q4_K;
    case GgmlType::Q5_K: return DType::Q5_K;
    case GgmlType::Q6_K: return DType::Q6_K;
    case GgmlType::IQ4_NL: return DType::IQ4_NL;
    case GgmlType::IQ4_XS: return DType::IQ4_XS;
  }
  fail("gguf: no weight format for ggml type {}", uint32_t(t));
}

GgmlType ggml_type_of(DType t) {
  for (const TypeRow& r : kTypes)
    if (r.traits.block_elems && dtype_of(GgmlType(r.id)) == t) return GgmlType(r.id);
  fail("gguf: weight format {} has no ggml type", dtype_name(t));
}

std::string_view ggml_type_name(GgmlType t) { return type_row(uint32_t(t))->name; }

std::string ggml_type_id_name(uint32_t id) {
  const TypeRow* r = type_row(id);
  return r ? std::string(r->name) : fmt::format("type {}", id);
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const TypeRow& r : kTypes) {
    if (r.traits.block_elems == 0 || std::strlen(r.name) != name.size()) continue;
    if (std::equal(name.begin(), name.end(), r.name,
                   [](char a, char b) { return std::toupper(static_cast<unsigned char>(a)) == b; }))
      return GgmlType(r.id);
  }
  return std::nullopt;
}

std::string_view gguf_type_name(GgufType t) {
  return uint32_t(t) <= uint32_t(GgufType::F64) ? kValueTypeNames[uint32_t(t)] : "?";
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // checked against overflow when parsed
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return {ne.rbegin(), ne.rend()}; }

void GgufHeader::index() {
  kv_index_.clear();
  tensor_index_.clear();
  for (size_t i = 0; i < kvs.size(); ++i)
    if (!kv_index_.emplace(kvs[i].key, i).second) fail("{}: duplicate key '{}'", where, kvs[i].key);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!tensor_index_.emplace(tensors[i].name, i).second)
      fail("{}: duplicate tensor '{}'", where, tensors[i].name);
}

const GgufKv* GgufHeader::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs[it->second];
}

const GgufTensor* GgufHeader::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors[it->second];
}

const GgufKv& GgufHeader::need(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) fail("{}: missing key '{}'", where, key);
  return *kv;
}

namespace {

template <typename T>
T load(std::span<const std::byte> b, size_t i = 0) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Any integer scalar as (value, negative?) without loss.
bool integer_of(const GgufKv& kv, int64_t& s, uint64_t& u, bool& neg) {
  neg = false;
  switch (kv.type) {
    case GgufType::U8: u = load<uint8_t>(kv.bytes); break;
    case GgufType::U16: u = load<uint16_t>(kv.bytes); break;
    case GgufType::U32: u = load<uint32_t>(kv.bytes); break;
    case GgufType::U64: u = load<uint64_t>(kv.bytes); break;
    case GgufType::I8: s = load<int8_t>(kv.bytes); neg = s < 0; u = uint64_t(s); return true;
    case GgufType::I16: s = load<int16_t>(kv.bytes); neg = s < 0; u = uint64_t(s); return true;
    case GgufType::I32: s = load<int32_t>(kv.bytes); neg = s < 0; u = uint64_t(s); return true;
    case GgufType::I64: s = load<int64_t>(kv.bytes); neg = s < 0; u = uint64_t(s); return true;
    default: return false;
  }
  s = int64_t(u);
  return true;
}

}  // namespace

uint64_t GgufHeader::get_uint(std::string_view key) const {
  const GgufKv& kv = need(key);
  int64_t s;
  uint64_t u;
  bool neg;
  if (!integer_of(kv, s, u, neg)) fail("{}: key '{}' is {}, expected an integer", where, key, gguf_type_name(kv.type));
  if (neg) fail("{}: key '{}' is negative ({})", where, key, s);
  return u;
}

float GgufHeader::get_f32(std::string_view key) const {
  const GgufKv& kv = need(key);
  if (kv.type == GgufType::F32) return load<float>(kv.bytes);
  if (kv.type == GgufType::F64) {
    const double d = load<double>(kv.bytes);
    if (double(float(d)) != d && !std::isnan(d))
      fail("{}: key '{}' = {} (f64) is not exactly an f32", where, key, d);
    return float(d);
  }
  fail("{}: key '{}' is {}, expected f32", where, key, gguf_type_name(kv.type));
}

bool GgufHeader::get_bool(std::string_view key) const {
  const GgufKv& kv = need(key);
  if (kv.type != GgufType::Bool) fail("{}: key '{}' is {}, expected bool", where, key, gguf_type_name(kv.type));
  return uint8_t(kv.bytes[0]) != 0;
}

std::string_view GgufHeader::get_string(std::string_view key) const {
  const GgufKv& kv = need(key);
  if (kv.type != GgufType::String) fail("{}: key '{}' is {}, expected string", where, key, gguf_type_name(kv.type));
  return kv.str;
}

std::span<const std::string_view> GgufHeader::get_strings(std::string_view key) const {
  const GgufKv& kv = need(key);
  if (kv.type != GgufType::Array || kv.elem != GgufType::String)
    fail("{}: key '{}' is {}{}, expected an array of strings", where, key, gguf_type_name(kv.type),
         kv.type == GgufType::Array ? fmt::format(" of {}", gguf_type_name(kv.elem)) : "");
  return kv.strs;
}

std::vector<float> GgufHeader::get_f32_array(std::string_view key) const {
  const GgufKv& kv = need(key);
  if (kv.type != GgufType::Array || kv.elem != GgufType::F32)
    fail("{}: key '{}' is {}{}, expected an array of f32", where, key, gguf_type_name(kv.type),
         kv.type == GgufType::Array ? fmt::format(" of {}", gguf_type_name(kv.elem)) : "");
  std::vector<float> v(size_t(kv.count));
  if (!v.empty()) std::memcpy(v.data(), kv.bytes.data(), v.size() * 4);
  return v;
}

std::vector<int32_t> GgufHeader::get_i32_array(std::string_view key) const {
  const GgufKv& kv = need(key);
  const bool ok = kv.type == GgufType::Array &&
                  (kv.elem == GgufType::I32 || kv.elem == GgufType::U8 || kv.elem == GgufType::I8 ||
                   kv.elem == GgufType::U16 || kv.elem == GgufType::I16);
  if (!ok)
    fail("{}: key '{}' is {}{}, expected an array of i32", where, key, gguf_type_name(kv.type),
         kv.type == GgufType::Array ? fmt::format(" of {}", gguf_type_name(kv.elem)) : "");
  std::vector<int32_t> v(size_t(kv.count));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (kv.elem) {
      case GgufType::I32: v[i] = load<int32_t>(kv.bytes, i); break;
      case GgufType::U8: v[i] = load<uint8_t>(kv.bytes, i); break;
      case GgufType::I8: v[i] = load<int8_t>(kv.bytes, i); break;
      case GgufType::U16: v[i] = load<uint16_t>(kv.bytes, i); break;
      default: v[i] = load<int16_t>(kv.bytes, i); break;
    }
  }
  return v;
}

GgufHeader parse_gguf(std::span<const std::byte> file, const std::string& where) {
  GgufHeader h;
  h.where = where;
  Cursor c(file, where);
  const auto magic = c.take(4, "magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) fail("{}: not a GGUF file (magic is not \"GGUF\")", where);
  h.version = c.read<uint32_t>("version");
  if (h.version == 1) fail("{}: GGUF version 1 is not supported (versions 2 and 3 are)", where);
  if (h.version != 2 && h.version != 3) {
    // A big-endian file shows its version byte-swapped (llama.cpp's gguf.cpp reads the same way).
    if (__builtin_bswap32(h.version) == 2 || __builtin_bswap32(h.version) == 3)
      fail("{}: big-endian GGUF files are not supported", where);
    fail("{}: unsupported GGUF version {} (versions 2 and 3 are)", where, h.version);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("key/value count");
  // The smallest key/value is 8 (key length) + 1 (key) + 4 (type) + 1 (u8) bytes; the smallest
  // tensor info 8 + 1 + 4 + 8 + 4 + 8. Counts beyond what the file can hold are refused before
  // anything is reserved for them.
  if (n_kv > c.left() / 14)
    fail("{}: key/value count {} cannot fit in the {} bytes of the file", where, n_kv, file.size());
  h.kvs.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    kv.key = c.string(fmt::format("key {}", i), kGgufMaxKeyBytes);
    check_name(kv.key, where, "key");
    kv.type = value_type(c.read<uint32_t>(fmt::format("key '{}' type", kv.key)), where,
                         fmt::format("key '{}'", kv.key));
    read_value(c, kv, where);
    h.kvs.push_back(std::move(kv));
  }
  if (n_tensors > c.left() / 33)
    fail("{}: tensor count {} cannot fit in the {} bytes of the file", where, n_tensors, file.size());
  h.tensors.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) h.tensors.push_back(read_tensor_info(c, where, i));
  h.index();

  if (const GgufKv* a = h.find("general.alignment")) {
    if (a->type != GgufType::U32)
      fail("{}: key 'general.alignment' is {}, expected u32", where, gguf_type_name(a->type));
    h.alignment = load<uint32_t>(a->bytes);
    if (h.alignment == 0 || (h.alignment & (h.alignment - 1)) != 0)
      fail("{}: key 'general.alignment' = {} is not a power of two", where, h.alignment);
  }

  h.data_offset = pad_to(c.pos(), h.alignment, where);
  if (h.data_offset > file.size()) {
    if (!h.tensors.empty())
      fail("{}: truncated: the data section would start at offset {} but the file has {} bytes", where,
           h.data_offset, file.size());
    h.data_offset = file.size();
  }
  h.data_size = file.size() - h.data_offset;

  for (const GgufTensor& t : h.tensors) {
    if (t.offset % h.alignment != 0)
      fail("{}: tensor '{}': offset {} is not a multiple of the alignment {}", where, t.name, t.offset, h.alignment);
    if (t.offset > h.data_size || t.bytes > h.data_size - t.offset)
      fail("{}: tensor '{}': bytes [{}, +{}) run past the data section ({} bytes)", where, t.name, t.offset,
           t.bytes, h.data_size);
  }
  // No two tensors may share bytes.
  std::vector<const GgufTensor*> by_offset;
  for (const auto& t : h.tensors)
    if (t.bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
      fail("{}: tensors '{}' and '{}' overlap (offsets {} and {})", where, by_offset[i - 1]->name,
           by_offset[i]->name, by_offset[i - 1]->offset, by_offset[i]->offset);
  return h;
}

GgufFile::GgufFile(const std::filesystem::path& path) : map_(std::make_unique<MappedFile>(path)) {
  header_ = parse_gguf({map_->data(), map_->size()}, path.string());
}

std::span<const std::byte> GgufFile::data(const GgufTensor& t) const {
  return {map_->data() + header_.data_offset + t.offset, size_t(t.bytes)};
}

}  // namespace vlm
