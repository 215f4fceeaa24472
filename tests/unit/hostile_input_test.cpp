// Hostile input, round two (issue #13): files that are not files, writes through
// symlinks, absurd config values, allocations before validation, the prompt cache's
// identity, checksum and size checks, and SIGBUS on a checkpoint truncated while mapped.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/tensor.h"
#include "engine/prompt_cache.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/file.h"
#include "io/identity.h"
#include "io/safetensors.h"
#include "model_folder.h"
#include "models/gemma3/registry.h"
#include "models/kv_cache.h"
#include "text/chat.h"
#include "vision/image.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using nlohmann::json;

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// ---- files that are not files ----

TEST(InputFile, RefusesDirectoriesFifosAndDevicesWithoutBlocking) {
  TempDir tmp;
  const fs::path fifo = tmp / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { InputFile f(fifo); }).find("fifo: not a regular file (a FIFO)"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(error_of([&] { InputFile f(tmp.path); }).find("not a regular file (a directory)"), std::string::npos);
  EXPECT_NE(error_of([&] { InputFile f("/dev/zero"); }).find("/dev/zero: not a regular file (a device)"),
            std::string::npos);
  // Every loader goes through it: safetensors (header and mmap), images, JSON files.
  EXPECT_NE(error_of([&] { read_safetensors_header(fifo); }).find("(a FIFO)"), std::string::npos);
  EXPECT_NE(error_of([&] { MappedFile m(fifo); }).find("(a FIFO)"), std::string::npos);
  EXPECT_NE(error_of([&] { vision::load_image(fifo); }).find("(a FIFO)"), std::string::npos);
  EXPECT_NE(error_of([&] { read_text_file(tmp.path, 100, "--messages: "); }).find("--messages: "), std::string::npos);
}

TEST(InputFile, ReadsAndReportsTruncation) {
  TempDir tmp;
  test::write_file(tmp / "f", "hello");
  const InputFile f(tmp / "f");
  EXPECT_EQ(f.size(), 5u);
  char b[3];
  f.read_at(b, 3, 2);
  EXPECT_EQ(std::string(b, 3), "llo");
  EXPECT_NE(error_of([&] { f.read_at(b, 3, 4); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { read_text_file(tmp / "f", 4); }).find("file too large (5 bytes, limit 4)"),
            std::string::npos);
}

// ---- symlink-safe writes ----

TEST(AtomicWriter, NeverFollowsOrReplacesSymlinks) {
  TempDir tmp;
  test::write_file(tmp / "victim", "precious");
  // The old writer used TARGET.tmp: a link planted there must not be written through.
  fs::create_symlink(tmp / "victim", tmp / "out.tmp");
  write_file(tmp / "out", "new");
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
  EXPECT_EQ(slurp(tmp / "out"), "new");
  EXPECT_FALSE(fs::is_symlink(tmp / "out"));
  // A target that is a link is refused, the link and its target left alone.
  fs::create_symlink(tmp / "victim", tmp / "link");
  EXPECT_NE(error_of([&] { write_file(tmp / "link", "x"); }).find("link: is a symbolic link"), std::string::npos);
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
  EXPECT_TRUE(fs::is_symlink(tmp / "link"));
  // Nothing is left behind: no temporary after a commit or after an abandoned writer.
  { AtomicWriter w(tmp / "abandoned"); w.write("x"); }
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) n += e.path().filename().string().find(".tmp") != std::string::npos;
  EXPECT_EQ(n, 1u);  // only the planted out.tmp
  EXPECT_FALSE(fs::exists(tmp / "abandoned"));
}

// ---- silent garbage ----

TEST(ConfigBounds, AbsurdValuesRefused) {
  auto refused = [](const char* key, double v, const char* frag) {
    json j = test::small_text_config();
    j[key] = v;
    const std::string e = error_of([&] { parse_config(j.dump(), "config.json"); });
    EXPECT_NE(e.find(frag), std::string::npos) << key << " " << v << ": " << e;
  };
  refused("rms_norm_eps", 1e300, "rms_norm_eps: must be in (0, 0.1]");
  refused("rope_theta", 1e-300, "rope_theta: must be in (1, 1000000000000], got 1e-300");
  refused("rope_local_base_freq", 1e300, "rope_local_base_freq");
  refused("query_pre_attn_scalar", 1e-300, "query_pre_attn_scalar");
  json v = test::small_vlm_config();
  v["vision_config"]["layer_norm_eps"] = 1e300;
  EXPECT_NE(error_of([&] { parse_config(v.dump(), "c"); }).find("vision_config.layer_norm_eps"), std::string::npos);

  const ModelConfig mc = parse_config(test::small_vlm_config().dump(), "c");
  auto pre_refused = [&](json extra, const char* frag) {
    json p = {{"size", {{"height", 16}, {"width", 16}}}};
    p.update(extra);
    const std::string e = error_of([&] { parse_preprocessor_config(p.dump(), "preprocessor_config.json", mc); });
    EXPECT_NE(e.find(frag), std::string::npos) << extra.dump() << ": " << e;
  };
  pre_refused({{"rescale_factor", 1e300}}, "rescale_factor: must be in");
  pre_refused({{"image_std", 1e-45}}, "image_std: values must be in [1e-06, 1e+06]");
  pre_refused({{"image_mean", {0.5, 1e30, 0.5}}}, "image_mean");
}

TEST(FirstNonFinite, FindsNanAndInf) {
  std::vector<float> v = {1, 2, 3};
  EXPECT_EQ(first_non_finite(v), 3u);
  v[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_non_finite(v), 1u);
  v[1] = 0;
  v[2] = std::nanf("");
  EXPECT_EQ(first_non_finite(v), 2u);
}

TEST(Checkpoint, NanInANormWeightRefusedAtLoad) {
  TempDir tmp;
  const json cfg = test::small_text_config();
  test::write_model(tmp.path, cfg, test::model_tensors(cfg, Naming::CausalLM, DType::F32));
  // Overwrite one value of model.norm.weight with NaN, in place.
  const SafetensorsHeader h = read_safetensors_header(tmp / "model.safetensors");
  uint64_t off = 0;
  for (const auto& t : h.tensors)
    if (t.name == "model.norm.weight") off = h.data_offset + t.begin + 4 * 3;
  std::string bytes = slurp(tmp / "model.safetensors");
  const float nan = std::nanf("");
  std::memcpy(bytes.data() + off, &nan, 4);
  test::write_file(tmp / "model.safetensors", bytes);
  const std::string e = error_of([&] { models::gemma3::open_checkpoint(tmp.path); });
  EXPECT_NE(e.find("'model.norm.weight' holds a non-finite value (NaN or Inf) at index 3"), std::string::npos) << e;
}

// ---- the weights fingerprint ----

TEST(Identity, WeightsFingerprintTellsSameShapedCheckpointsApart) {
  TempDir tmp;
  const json cfg = test::small_text_config();
  const auto specs = test::model_tensors(cfg, Naming::CausalLM, DType::F32);
  test::write_model(tmp / "a", cfg, specs);
  test::write_model(tmp / "b", cfg, specs);
  const Checkpoint a = models::gemma3::open_checkpoint(tmp / "a");
  EXPECT_EQ(a.weights_fingerprint().size(), 16u);
  EXPECT_EQ(a.weights_fingerprint(), models::gemma3::open_checkpoint(tmp / "b").weights_fingerprint());
  // One value of a large matrix changed: same shapes, another fingerprint, and the
  // identity names the field.
  const SafetensorsHeader h = read_safetensors_header(tmp / "b" / "model.safetensors");
  std::string bytes = slurp(tmp / "b" / "model.safetensors");
  bytes[h.data_offset + 16] ^= 0x40;
  test::write_file(tmp / "b" / "model.safetensors", bytes);
  const Checkpoint b = models::gemma3::open_checkpoint(tmp / "b");
  EXPECT_NE(a.weights_fingerprint(), b.weights_fingerprint());
  EXPECT_EQ(identity_diff(make_identity(a, "causal", "f32-normalizer"), make_identity(b, "causal", "f32-normalizer")),
            std::vector<std::string>{"weights"});
}

TEST(Identity, EveryPreprocessingValueIsAField) {
  ModelConfig a = parse_config(test::small_vlm_config().dump(), "c");
  ModelConfig b = a;
  b.preprocessor = effective_preprocessor(a);
  b.preprocessor->image_mean[1] = 0.25f;
  b.preprocessor->rescale_factor = 0.5;
  EXPECT_EQ(identity_diff(make_identity(a, "F32", "hf", "x"), make_identity(b, "F32", "hf", "x")),
            (std::vector<std::string>{"preprocessor.rescale_factor", "preprocessor.image_mean"}));
}

TEST(Checksum64, ChainsOverPieces) {
  const std::string s = "the quick brown fox jumps over the lazy dog";
  EXPECT_EQ(checksum64(s.data() + 16, s.size() - 16, checksum64(s.data(), 16)),
            checksum64(s.data() + 16, s.size() - 16, checksum64(s.data(), 16)));
  std::string t = s;
  t[20] ^= 1;
  EXPECT_NE(checksum64(s.data(), s.size()), checksum64(t.data(), t.size()));
}

// ---- the prompt cache ----

class PromptCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = parse_config(test::small_text_config().dump(), "c").text;
    id_ = make_identity(parse_config(test::small_text_config().dump(), "c"), "F32", "causal", "f32", "0123");
    KvCache c(cfg_, 16, DType::F32);
    c.reserve(5);
    for (int l = 0; l < cfg_.num_layers; ++l)
      for (int64_t p = 0; p < 5; ++p)
        for (size_t i = 0; i < c.row_size(); ++i) {
          reinterpret_cast<float*>(c.key_slot(l, p))[i] = float(l * 100 + p) + float(i) / 64;
          reinterpret_cast<float*>(c.value_slot(l, p))[i] = -float(l * 100 + p) - float(i) / 64;
        }
    c.advance(5);
    logits_.assign(size_t(cfg_.vocab_size), 0.5f);
    save_prompt_cache(file(), id_, 42, cfg_, c, logits_);
  }
  fs::path file() const { return tmp_ / "prompt.cache"; }
  std::string load_error(int64_t context = 16) {
    return error_of([&] { load_prompt_cache(file(), id_, 42, cfg_, context, DType::F32, cfg_.vocab_size); });
  }
  // Rewrites the header (JSON) keeping everything after it.
  void edit_header(const std::function<void(json&)>& f) {
    std::string b = slurp(file());
    uint64_t n;
    std::memcpy(&n, b.data() + 8, 8);
    json h = json::parse(b.substr(16, n));
    f(h);
    const std::string t = h.dump();
    const uint64_t m = t.size();
    test::write_file(file(), b.substr(0, 8) + std::string(reinterpret_cast<const char*>(&m), 8) + t + b.substr(16 + n));
  }
  TempDir tmp_;
  TextConfig cfg_;
  Identity id_;
  std::vector<float> logits_;
};

TEST_F(PromptCacheTest, RoundTrips) {
  auto s = load_prompt_cache(file(), id_, 42, cfg_, 16, DType::F32, cfg_.vocab_size);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->logits, logits_);
  EXPECT_EQ(s->cache.length(), 5);
  EXPECT_EQ(reinterpret_cast<const float*>(s->cache.key_slot(2, 4))[3], 204 + 3.0f / 64);
  EXPECT_FALSE(load_prompt_cache(file(), id_, 43, cfg_, 16, DType::F32, cfg_.vocab_size));  // another request: a miss
}

// Rows of f32 are not read as bf16 ones (nor the other way), whatever the identity says.
TEST_F(PromptCacheTest, KvRowTypeMustMatch) {
  const std::string e = error_of([&] { load_prompt_cache(file(), id_, 42, cfg_, 16, DType::BF16, cfg_.vocab_size); });
  EXPECT_NE(e.find("KV rows of \"F32\" do not match this precision's BF16"), std::string::npos) << e;
  edit_header([](json& h) { h.erase("kv"); });
  EXPECT_NE(load_error().find("KV rows of null"), std::string::npos) << load_error();
}

TEST_F(PromptCacheTest, CorruptedDataRefusedByChecksum) {
  std::string b = slurp(file());
  const float big = 1e30f;
  std::memcpy(b.data() + b.size() - 8 - 64, &big, 4);  // inside the last value rows
  test::write_file(file(), b);
  EXPECT_NE(load_error().find("checksum mismatch"), std::string::npos) << load_error();
}

TEST_F(PromptCacheTest, LimitsOfAFreshPromptHold) {
  // A context past the model's limit is refused on a hit as on a miss.
  const std::string e = load_error(cfg_.max_position_embeddings + 1);
  EXPECT_NE(e.find("outside (0, max_position_embeddings"), std::string::npos) << e;
  EXPECT_NE(load_error(4).find("length 5 outside (0, 4]"), std::string::npos) << load_error(4);
}

TEST_F(PromptCacheTest, HeaderSizesCheckedAgainstTheFileBeforeAllocating) {
  // Ten million positions within a large context: the size check refuses it, unallocated.
  edit_header([](json& h) {
    h["length"] = 10'000'000;
    for (auto& v : h["visible"]) v = v.get<int64_t>() == 5 ? 10'000'000 : v.get<int64_t>();
  });
  auto load_large = [&] {
    return error_of([&] { load_prompt_cache(file(), id_, 42, cfg_, 100'000'000, DType::F32, cfg_.vocab_size); });
  };
  const std::string e = load_large();
  EXPECT_TRUE(e.find("max_position_embeddings") != std::string::npos || e.find("truncated") != std::string::npos) << e;
  cfg_.max_position_embeddings = 100'000'000;
  const std::string e2 = load_large();
  EXPECT_NE(e2.find("truncated"), std::string::npos) << e2;
  EXPECT_NE(e2.find("the header needs"), std::string::npos) << e2;
}

TEST_F(PromptCacheTest, MalformedHeaderFieldsGiveOneLineErrors) {
  edit_header([](json& h) { h["vocab"] = "many"; });
  const std::string e = load_error();
  EXPECT_NE(e.find("'vocab' is missing or not an integer"), std::string::npos) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST_F(PromptCacheTest, TruncatedFileRefused) {
  const std::string b = slurp(file());
  for (size_t keep : {b.size() - 1, b.size() / 2, size_t(20), size_t(3)}) {
    test::write_file(file(), b.substr(0, keep));
    const std::string e = load_error();
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("bad magic") != std::string::npos) << keep << ": " << e;
  }
}

TEST_F(PromptCacheTest, SaveDoesNotFollowSymlinks) {
  test::write_file(tmp_ / "victim", "precious");
  fs::remove(file());
  fs::create_symlink(tmp_ / "victim", file());
  KvCache c(cfg_, 16, DType::F32);
  c.reserve(1);
  c.advance(1);
  EXPECT_NE(error_of([&] { save_prompt_cache(file(), id_, 1, cfg_, c, logits_); }).find("symbolic link"),
            std::string::npos);
  EXPECT_EQ(slurp(tmp_ / "victim"), "precious");
}

// ---- allocations before validation ----

TEST(ImageBudget, ImagesDecodedOneAtATimeWithinATotal) {
  TempDir tmp;
  // 2x2 BMP (24-bit): 4 pixels each.
  auto bmp = [] {
    std::string b = "BM";
    auto u32 = [&](uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); };
    auto u16 = [&](uint16_t v) { b.append(reinterpret_cast<const char*>(&v), 2); };
    u32(54 + 16); u32(0); u32(54);
    u32(40); u32(2); u32(2); u16(1); u16(24); u32(0); u32(16); u32(0); u32(0); u32(0); u32(0);
    b.append(16, '\x7f');
    return b;
  }();
  std::vector<std::string> paths;
  for (int i = 0; i < 3; ++i) {
    paths.push_back((tmp / ("i" + std::to_string(i) + ".bmp")).string());
    test::write_file(paths.back(), bmp);
  }
  EXPECT_EQ(vision::load_images(paths, 12).size(), 3u);
  const std::string e = error_of([&] { vision::load_images(paths, 10); });
  EXPECT_NE(e.find("i2.bmp: image of 2x2 pixels exceeds the limit of 2 pixels"), std::string::npos) << e;
  EXPECT_NE(e.find("over all 3 images of the request"), std::string::npos) << e;
}

TEST(Png, TextChunkClaimingTwoGigabytesRefusedQuickly) {
  // Signature, IHDR 1x1 RGB, then a tEXt chunk whose length field says 0x7fffffff.
  std::string png = "\x89PNG\r\n\x1a\n";
  auto be32 = [&](uint32_t v) { for (int s = 24; s >= 0; s -= 8) png += char((v >> s) & 0xff); };
  be32(13);
  png += "IHDR";
  be32(1); be32(1);
  png += std::string("\x08\x02\x00\x00\x00", 5);
  be32(0x907753de);  // CRC of this IHDR
  be32(0x7fffffff);
  png += "tEXtComment";
  png.append(71 - std::min<size_t>(png.size(), 71), '\0');
  const std::vector<uint8_t> bytes(png.begin(), png.end());
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { vision::decode_image(bytes, "evil.png"); });
  EXPECT_NE(e.find("evil.png: corrupt PNG: file is truncated"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(PromptLimits, ExpandedImageTokensAndTextBoundedBeforeWork) {
  const fs::path dir = std::getenv("VLM_FIXTURES") ? fs::path(std::getenv("VLM_FIXTURES")) / "tiny-f32" : fs::path();
  if (dir.empty() || !fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << "VLM_FIXTURES not built";
  const text::Tokenizer tok = text::Tokenizer::load(dir);
  const ModelConfig mc = load_config(dir);
  text::ImageTokens it{mc.boi_token_id, mc.eoi_token_id, mc.image_token_id, 65536, text::ImageLayout::HF};
  std::vector<text::Segment> seg;
  for (int i = 0; i < 40; ++i) seg.push_back({text::Segment::Kind::Image, -1, {}});
  const std::vector<int> crops(40, 64);
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { text::tokenize_prompt(seg, tok, it, crops); });
  EXPECT_NE(e.find("expand to 170393600 image tokens, more than the limit of 4194304"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  const std::vector<text::Segment> big = {{text::Segment::Kind::Text, -1, std::string(text::kMaxPromptBytes + 1, 'a')}};
  e = error_of([&] { text::tokenize_prompt(big, tok, it, {}); });
  EXPECT_NE(e.find("exceeds the limit of 4194304 bytes"), std::string::npos) << e;
}

// ---- SIGBUS ----

TEST(MappedFileDeathTest, TruncatedWhileMappedIsAOneLineError) {
  TempDir tmp;
  test::write_file(tmp / "w.safetensors", std::string(1 << 16, 'x'));
  EXPECT_EXIT(
      {
        MappedFile m(tmp / "w.safetensors");
        ::truncate((tmp / "w.safetensors").c_str(), 0);
        volatile std::byte b = m.data()[1 << 15];
        (void)b;
      },
      ::testing::ExitedWithCode(1), "w.safetensors: the file changed \\(truncated\\?\\) while its weights were in use");
}

}  // namespace
}  // namespace vlm
