#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model_folder.h"

namespace vlm {
namespace {

using test::raw_safetensors;
using test::TempDir;

using test::bytes_of;

std::string parse_error(const std::string& file) { return test::parse_error(parse_safetensors, file, "bad.safetensors"); }
void expect_refused(const std::string& file, std::initializer_list<const char*> fragments) {
  test::expect_refused(parse_safetensors, file, "bad.safetensors", fragments);
}

TEST(Safetensors, ParsesValidFile) {
  const std::string file = test::make_safetensors(
      {{"b", DType::BF16, {2, 3}}, {"a", DType::F32, {4}}, {"c", DType::F16, {0, 5}}});
  const SafetensorsHeader h = parse_safetensors(bytes_of(file), "x");
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by name
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, DType::BF16);
  EXPECT_EQ(h.tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].begin, 0u);
  EXPECT_EQ(h.tensors[1].end, 12u);
  EXPECT_EQ(h.tensors[0].begin, 12u);
  EXPECT_EQ(h.tensors[0].end, 28u);
  EXPECT_EQ(h.tensors[2].begin, h.tensors[2].end);  // empty tensor
  EXPECT_EQ(h.data_offset % 8, 0u);
  EXPECT_EQ(h.data_offset + h.data_size, file.size());
}

TEST(Safetensors, DiskHeaderMatchesMemoryAndMapSeesData) {
  TempDir tmp;
  const std::string file = test::make_safetensors({{"w", DType::F32, {3}}});
  test::write_file(tmp / "m.safetensors", file);
  const SafetensorsHeader h = read_safetensors_header(tmp / "m.safetensors");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.data_offset, parse_safetensors(bytes_of(file), "x").data_offset);
  MappedFile map(tmp / "m.safetensors");
  ASSERT_EQ(map.size(), file.size());
  float v[3];
  std::memcpy(v, map.data() + h.data_offset, sizeof v);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v[i], test::pattern_value(0, i));
}

TEST(Safetensors, MetadataAllowed) {
  const std::string hdr = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string padded = hdr + std::string((8 - hdr.size() % 8) % 8, ' ');
  const SafetensorsHeader h = parse_safetensors(bytes_of(raw_safetensors(padded, "abcd")), "x");
  EXPECT_EQ(h.metadata.at("format"), "pt");
  ASSERT_EQ(h.tensors.size(), 1u);
  expect_refused(raw_safetensors(R"({"__metadata__":{"n":1}})", ""), {"__metadata__", "'n'"});
  expect_refused(raw_safetensors(R"({"__metadata__":[]})", ""), {"__metadata__"});
}

TEST(Safetensors, TruncatedFile) {
  expect_refused("\x10\0\0", {"truncated"});
  // A valid file cut inside its data section: the last tensor now ends past the end.
  std::string file = test::make_safetensors({{"a", DType::F32, {4}}, {"zz", DType::F32, {4}}});
  file.resize(file.size() - 3);
  expect_refused(file, {"data_offsets", "past the data section"});
}

TEST(Safetensors, HeaderLengthLargerThanFile) {
  expect_refused(test::le64(1000) + "{}", {"header length 1000", "larger than"});
  expect_refused(test::le64(~0ull) + "{}", {"exceeds the limit"});
  expect_refused(test::le64(kMaxSafetensorsHeader + 1) + "{}", {"exceeds the limit"});
}

TEST(Safetensors, HeaderNotJson) {
  expect_refused(raw_safetensors("{\"a\": [1, 2", ""), {"not valid JSON"});
  expect_refused(raw_safetensors("\xff\xfe\x00garbage", ""), {"not valid JSON"});
  expect_refused(raw_safetensors("", ""), {"not valid JSON"});
  expect_refused(raw_safetensors("[1, 2]", ""), {"must be a JSON object"});
  expect_refused(raw_safetensors(std::string(5000, '[') + std::string(5000, ']'), ""), {"nested deeper"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                 std::string(8, 'x')),
                 {"duplicate", "'w'"});
}

TEST(Safetensors, UnknownDtype) {
  for (const char* dt : {"I8", "F64", "BOOL", "F8_E4M3", "bf16"}) {
    const std::string hdr = fmt::format(R"({{"layer.w":{{"dtype":"{}","shape":[4],"data_offsets":[0,4]}}}})", dt);
    expect_refused(raw_safetensors(hdr, "abcd"), {"layer.w", "unsupported dtype", dt});
  }
  expect_refused(raw_safetensors(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "abcd"), {"'w'", "dtype"});
}

TEST(Safetensors, ShapeOverflow) {
  // 2^32 * 2^32 elements overflow before the element size is even applied.
  expect_refused(raw_safetensors(R"({"big":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "abcd"),
                 {"'big'", "overflows"});
  // 2^62 elements fit in 64 bits but not their 4-byte size.
  expect_refused(raw_safetensors(R"({"big":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", "abcd"),
                 {"'big'", "overflows"});
  expect_refused(raw_safetensors(R"({"big":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", "abcd"),
                 {"'big'", "integers"});
  expect_refused(raw_safetensors(R"({"neg":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
                 {"'neg'", "negative"});
  expect_refused(raw_safetensors(R"({"f":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd"),
                 {"'f'", "integers"});
  expect_refused(raw_safetensors(R"({"s":{"dtype":"F32","shape":"4","data_offsets":[0,4]}})", "abcd"),
                 {"'s'", "shape must be an array"});
}

TEST(Safetensors, OffsetsChecked) {
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"),
                 {"'w'", "past the data section"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", "abcdabcd"),
                 {"'w'", "begin 8 > end 4"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcdabcd"),
                 {"'w'", "needs 8 bytes", "span 4"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"),
                 {"'w'", "data_offsets must be [begin, end]"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"), {"'w'", "missing data_offsets"});
  expect_refused(raw_safetensors(R"({"a\nb":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd"),
                 {"'a\\x0ab'", "control characters"});
  expect_refused(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", "abcd"),
                 {"'w'", "unexpected key 'x'"});
  // Header of 55 bytes puts the data at file offset 63: no 4-byte tensor may start there.
  const std::string hdr = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} )";
  ASSERT_EQ(hdr.size() % 4, 3u);
  expect_refused(raw_safetensors(hdr, "abcd"), {"'w'", "not aligned"});
}

TEST(Safetensors, OverlappingTensors) {
  expect_refused(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 std::string(12, 'x')),
                 {"'a'", "'b'", "overlap"});
  // Identical ranges overlap too; empty tensors occupy nothing.
  expect_refused(raw_safetensors(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                                 R"("b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
                                 std::string(4, 'x')),
                 {"overlap"});
  std::string ok = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  ok.append((8 - ok.size() % 8) % 8, ' ');
  EXPECT_EQ(parse_error(raw_safetensors(ok, std::string(4, 'x'))), "");
}

TEST(Safetensors, FileErrorsNameThePath) {
  TempDir tmp;
  try {
    read_safetensors_header(tmp / "absent.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos) << e.what();
  }
  test::write_file(tmp / "short.safetensors", "abc");
  try {
    read_safetensors_header(tmp / "short.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short.safetensors: truncated"), std::string::npos) << e.what();
  }
  test::write_file(tmp / "long.safetensors", test::le64(64) + "{}");
  try {
    read_safetensors_header(tmp / "long.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("long.safetensors: header length 64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vlm
