#include "io/checkpoint.h"
#include "models/gemma3/registry.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "io/identity.h"
#include "kernels/roofline.h"
#include "model_folder.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::model_tensors;
using test::Spec;
using test::TempDir;
using test::write_model;

std::string open_error(const fs::path& dir, Parts parts = {}) {
  try {
    models::gemma3::open_checkpoint(dir, parts);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const fs::path& dir, std::initializer_list<std::string> fragments, Parts parts = {}) {
  const std::string msg = open_error(dir, parts);
  ASSERT_FALSE(msg.empty()) << "opened " << dir;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
}

TEST(Checkpoint, VlmNewNamingSingleFile) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  const auto specs = model_tensors(cfg, Naming::New, DType::BF16);
  write_model(tmp.path, cfg, specs);
  const Checkpoint ck = models::gemma3::open_checkpoint(tmp.path);
  EXPECT_EQ(ck.naming(), Naming::New);
  EXPECT_EQ(ck.tensors().size(), specs.size());
  EXPECT_TRUE(ck.unknown().empty());
  EXPECT_EQ(ck.weight_dtypes(), "BF16");

  const TensorView& q = ck.get("text.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(q.dtype, DType::BF16);
  EXPECT_EQ(ck.file_name_of("text.layers.1.self_attn.q_proj.weight"), "model.language_model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(ck.file_of("text.layers.1.self_attn.q_proj.weight"), "model.safetensors");
  // The view reads the bytes written for this tensor (its position k in the file).
  size_t k = 0;
  while (specs[k].name != "model.language_model.layers.1.self_attn.q_proj.weight") ++k;
  for (int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.at(i), test::pattern_value(k, i)) << i;

  EXPECT_EQ(ck.get("projector.mm_input_projection_weight").shape, (std::vector<int64_t>{8, 16}));  // [vision, text]
  EXPECT_EQ(ck.get("vision.embeddings.position_embedding.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(&ck.lm_head(), &ck.get("text.embed_tokens.weight"));  // tied
  EXPECT_EQ(ck.find("lm_head.weight"), nullptr);
  EXPECT_EQ(ck.find("vision.nonexistent"), nullptr);
  try {
    ck.get("text.nonexistent");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.nonexistent"), std::string::npos);
  }
}

TEST(Checkpoint, BothNamingSchemesGiveTheSameModel) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  write_model(tmp / "new", cfg, model_tensors(cfg, Naming::New, DType::F32));
  write_model(tmp / "old", cfg, model_tensors(cfg, Naming::Old, DType::F32), 3);
  const Checkpoint a = models::gemma3::open_checkpoint(tmp / "new");
  const Checkpoint b = models::gemma3::open_checkpoint(tmp / "old");
  EXPECT_EQ(b.naming(), Naming::Old);
  EXPECT_EQ(b.file_name_of("vision.post_layernorm.bias"), "vision_tower.vision_model.post_layernorm.bias");
  EXPECT_EQ(b.file_of("text.embed_tokens.weight"), "model-00001-of-00003.safetensors");
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, t] : a.tensors()) {
    const TensorView* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(t.shape, u->shape) << name;
  }
  const Identity ia = make_identity(a, "hf", "f32-normalizer"), ib = make_identity(b, "hf", "f32-normalizer");
  EXPECT_EQ(ia.hash_hex(), ib.hash_hex());
  EXPECT_TRUE(identity_diff(ia, ib).empty());
}

TEST(Checkpoint, MixedNamingRefused) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  auto specs = model_tensors(cfg, Naming::New, DType::F32);
  specs[0].name = "language_model.model.embed_tokens.weight";
  write_model(tmp.path, cfg, specs);
  expect_refused(tmp.path, {"mix", "language_model.model.embed_tokens.weight"});
  // A text-only config over VLM-named tensors.
  TempDir t2;
  write_model(t2.path, test::small_text_config(), model_tensors(test::small_text_config(), Naming::New, DType::F32));
  expect_refused(t2.path, {"Gemma3ForCausalLM", "model.language_model."});
}

TEST(Checkpoint, CausalLMAndExplicitHead) {
  TempDir tmp;
  json cfg = test::small_text_config();
  write_model(tmp / "tied", cfg, model_tensors(cfg, Naming::CausalLM, DType::F16));
  const Checkpoint tied = models::gemma3::open_checkpoint(tmp / "tied");
  EXPECT_EQ(tied.naming(), Naming::CausalLM);
  EXPECT_EQ(tied.file_name_of("text.norm.weight"), "model.norm.weight");
  EXPECT_EQ(&tied.lm_head(), &tied.get("text.embed_tokens.weight"));
  EXPECT_EQ(tied.weight_dtypes(), "F16");

  cfg["tie_word_embeddings"] = false;
  write_model(tmp / "untied", cfg, model_tensors(cfg, Naming::CausalLM, DType::F16, true));
  const Checkpoint untied = models::gemma3::open_checkpoint(tmp / "untied");
  EXPECT_EQ(untied.lm_head().name, "lm_head.weight");
  EXPECT_NE(untied.lm_head().data, untied.get("text.embed_tokens.weight").data);
  EXPECT_NE(make_identity(tied, "causal", "f32-normalizer").hash(), make_identity(untied, "causal", "f32-normalizer").hash());

  write_model(tmp / "headless", cfg, model_tensors(cfg, Naming::CausalLM, DType::F16, false));
  expect_refused(tmp / "headless", {"lm_head.weight", "tie_word_embeddings is false"});

  // The older VLM naming puts an explicit head under language_model.lm_head.
  json vcfg = test::small_vlm_config();
  write_model(tmp / "vlm-head", vcfg, model_tensors(vcfg, Naming::Old, DType::F32, true));
  const Checkpoint vh = models::gemma3::open_checkpoint(tmp / "vlm-head");
  EXPECT_EQ(vh.lm_head().name, "lm_head.weight");
  EXPECT_EQ(vh.file_name_of("lm_head.weight"), "language_model.lm_head.weight");
}

TEST(Checkpoint, WrongShapeNamesTensorAndShapes) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  auto specs = model_tensors(cfg, Naming::New, DType::F32);
  for (Spec& s : specs)
    if (s.name == "model.language_model.layers.2.self_attn.k_proj.weight") s.shape = {16, 8};
  write_model(tmp.path, cfg, specs);
  expect_refused(tmp.path, {"model.language_model.layers.2.self_attn.k_proj.weight", "[16, 8]", "expected [8, 16]",
                            "model.safetensors"});

  // The projector is [vision, text]; the transposed matrix is refused.
  TempDir t2;
  specs = model_tensors(cfg, Naming::New, DType::F32);
  for (Spec& s : specs)
    if (s.name == "model.multi_modal_projector.mm_input_projection_weight") s.shape = {16, 8};
  write_model(t2.path, cfg, specs);
  expect_refused(t2.path, {"mm_input_projection_weight", "[16, 8]", "expected [8, 16]"});
  // ... but a text-only load never looks at vision or projector tensors.
  const Checkpoint text = models::gemma3::open_checkpoint(t2.path, Parts{true, false});
  EXPECT_EQ(text.find("projector.mm_input_projection_weight"), nullptr);
  EXPECT_EQ(text.find("vision.post_layernorm.weight"), nullptr);
  EXPECT_NE(text.find("text.embed_tokens.weight"), nullptr);
  EXPECT_TRUE(text.unknown().empty());
}

// A text-only run does not even map a shard that holds only vision tensors.
TEST(Checkpoint, TextOnlyLeavesVisionShardUnmapped) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  std::vector<Spec> text, vision;
  for (const Spec& s : model_tensors(cfg, Naming::New, DType::BF16))
    (s.name.starts_with("model.language_model.") ? text : vision).push_back(s);
  json index = {{"weight_map", json::object()}};
  for (const Spec& s : text) index["weight_map"][s.name] = "model-00001-of-00002.safetensors";
  for (const Spec& s : vision) index["weight_map"][s.name] = "model-00002-of-00002.safetensors";
  test::write_file(tmp / "config.json", cfg.dump());
  test::write_file(tmp / "model.safetensors.index.json", index.dump());
  test::write_file(tmp / "model-00001-of-00002.safetensors", test::make_safetensors(text));
  test::write_file(tmp / "model-00002-of-00002.safetensors", test::make_safetensors(vision));
  auto mapped = [](const fs::path& p) {
    std::ifstream maps("/proc/self/maps");
    const std::string all((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    return all.find(fs::canonical(p).string()) != std::string::npos;
  };
  {
    const Checkpoint ck = models::gemma3::open_checkpoint(tmp.path, Parts{true, false});
    EXPECT_TRUE(mapped(tmp / "model-00001-of-00002.safetensors"));
    EXPECT_FALSE(mapped(tmp / "model-00002-of-00002.safetensors"));
  }
  const Checkpoint full = models::gemma3::open_checkpoint(tmp.path);
  EXPECT_TRUE(mapped(tmp / "model-00002-of-00002.safetensors"));
  EXPECT_EQ(full.file_of("vision.post_layernorm.bias"), "model-00002-of-00002.safetensors");
}

// map_pages maps every loaded tensor's pages at once; opening touches only the header and the
// fingerprint's windows. The 8 MiB embedding is the tensor opening leaves mostly unmapped.
TEST(Checkpoint, MapPagesMapsTheLoadedTensors) {
  {  // kernels before 5.14 refuse the advice, and the pages fault in as before
    void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const bool known = ::madvise(p, 4096, MADV_POPULATE_READ) == 0;
    ::munmap(p, 4096);
    if (!known) GTEST_SKIP() << "MADV_POPULATE_READ refused by this kernel";
  }
  TempDir tmp;
  json cfg = test::small_text_config();
  cfg["vocab_size"] = 131072;  // 131072 x 16 f32
  write_model(tmp.path, cfg, model_tensors(cfg, Naming::CausalLM, DType::F32));
  const Checkpoint ck = models::gemma3::open_checkpoint(tmp.path);
  const TensorView& embed = ck.get("text.embed_tokens.weight");
  const std::span<const std::byte> region(embed.data, embed.nbytes);
  const double embed_kb = double(embed.nbytes >> 10);
  const double before = kernels::mapped_kb({&region, 1}).rss;  // the file's mapping, this process
  ASSERT_GE(before, 0) << "no /proc/self/smaps";
  EXPECT_LT(before, embed_kb / 2);
  ck.map_pages();
  EXPECT_GE(kernels::mapped_kb({&region, 1}).rss, embed_kb);
}

// smaps as Linux 6.18 writes it: the mappings that hold a region count, a file's 2 MiB pages as
// FilePmdMapped and a tmpfs file's as ShmemPmdMapped.
TEST(Checkpoint, MappedKbCountsBothKindsOfHugePages) {
  const std::string smaps =
      "7f0000000000-7f0000400000 r--p 00000000 00:28 2    /mnt/hp/model.gguf\n"
      "Size:               4096 kB\nRss:                4096 kB\nShmemPmdMapped:     2048 kB\n"
      "FilePmdMapped:         0 kB\n"
      "7f0000400000-7f0000800000 r--p 00000000 fd:00 77   /data/model.gguf\n"
      "Rss:                3072 kB\nShmemPmdMapped:        0 kB\nFilePmdMapped:      2048 kB\n"
      "7f0000800000-7f0000c00000 rw-p 00000000 00:00 0\n"
      "Rss:                4096 kB\nFilePmdMapped:      4096 kB\n";
  const auto* at = reinterpret_cast<const std::byte*>(uintptr_t(0x7f0000000000));
  const std::span<const std::byte> both[] = {{at + 0x100000, 0x100000}, {at + 0x7ff000, 0x1000}};
  std::istringstream in(smaps);
  const kernels::MappedKb kb = kernels::mapped_kb(in, both);
  EXPECT_EQ(kb.rss, 4096 + 3072);  // not the third mapping, which no region touches
  EXPECT_EQ(kb.pmd, 2048 + 2048);
  std::istringstream again(smaps);
  const std::span<const std::byte> tmpfs_only(at, 0x400000);
  EXPECT_EQ(kernels::mapped_kb(again, {&tmpfs_only, 1}).pmd, 2048);
}

TEST(Checkpoint, MissingTensor) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  auto specs = model_tensors(cfg, Naming::Old, DType::F32);
  std::erase_if(specs, [](const Spec& s) { return s.name == "vision_tower.vision_model.encoder.layers.0.mlp.fc2.bias"; });
  write_model(tmp.path, cfg, specs, 2);
  expect_refused(tmp.path, {"missing tensor", "vision_tower.vision_model.encoder.layers.0.mlp.fc2.bias", "[8]"});
  EXPECT_NO_THROW(models::gemma3::open_checkpoint(tmp.path, Parts{true, false}));
}

TEST(Checkpoint, UnknownAndIgnoredTensors) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  auto specs = model_tensors(cfg, Naming::New, DType::F32);
  specs.push_back({"model.language_model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {4}});
  specs.push_back({"model.vision_tower.vision_model.head.probe", DType::F32, {1, 1, 8}});
  specs.push_back({"model.language_model.layers.7.mlp.gate_proj.weight", DType::F32, {2}});
  specs.push_back({"model.vision_tower.vision_model.extra", DType::F32, {2}});
  specs.push_back({"something.else", DType::F32, {2}});
  write_model(tmp.path, cfg, specs);
  const Checkpoint ck = models::gemma3::open_checkpoint(tmp.path);
  EXPECT_EQ(ck.unknown(), (std::vector<std::string>{"model.language_model.layers.7.mlp.gate_proj.weight",
                                                    "model.vision_tower.vision_model.extra", "something.else"}));
  EXPECT_EQ(ck.find("vision.head.probe"), nullptr);
  // Text-only runs report the same unknowns (names are checked from the header alone).
  EXPECT_EQ(models::gemma3::open_checkpoint(tmp.path, Parts{true, false}).unknown(), ck.unknown());
}

TEST(Checkpoint, MixedDtypesPerPart) {
  TempDir tmp;
  const json cfg = test::small_vlm_config();
  auto specs = model_tensors(cfg, Naming::New, DType::BF16);
  for (Spec& s : specs)
    if (!s.name.starts_with("model.language_model.")) s.dtype = DType::F32;
  write_model(tmp.path, cfg, specs);
  const Checkpoint ck = models::gemma3::open_checkpoint(tmp.path);
  EXPECT_EQ(ck.weight_dtypes(), "text=BF16,vision=F32,projector=F32");
  EXPECT_EQ(models::gemma3::open_checkpoint(tmp.path, Parts{true, false}).weight_dtypes(), ck.weight_dtypes());
}

TEST(Checkpoint, ShardErrors) {
  const json cfg = test::small_vlm_config();
  const auto specs = model_tensors(cfg, Naming::Old, DType::BF16);
  {
    TempDir tmp;
    write_model(tmp.path, cfg, specs, 3);
    fs::remove(tmp / "model-00002-of-00003.safetensors");
    expect_refused(tmp.path, {"model.safetensors.index.json", "model-00002-of-00003.safetensors", "missing"});
  }
  {
    TempDir tmp;
    write_model(tmp.path, cfg, specs, 2);
    // The index lists a tensor the shard does not hold.
    json index = json::parse(std::ifstream(tmp / "model.safetensors.index.json"));
    index["weight_map"]["language_model.model.layers.9.extra"] = "model-00001-of-00002.safetensors";
    test::write_file(tmp / "model.safetensors.index.json", index.dump());
    expect_refused(tmp.path, {"language_model.model.layers.9.extra", "absent from the shard",
                              "model-00001-of-00002.safetensors"});
    // A shard holds a tensor that the index places elsewhere.
    index["weight_map"].erase("language_model.model.layers.9.extra");
    index["weight_map"]["language_model.model.norm.weight"] =
        index["weight_map"]["language_model.model.norm.weight"] == "model-00001-of-00002.safetensors"
            ? "model-00002-of-00002.safetensors"
            : "model-00001-of-00002.safetensors";
    test::write_file(tmp / "model.safetensors.index.json", index.dump());
    expect_refused(tmp.path, {"language_model.model.norm.weight"});
    index["weight_map"]["language_model.model.norm.weight"] = "../evil.safetensors";
    test::write_file(tmp / "model.safetensors.index.json", index.dump());
    expect_refused(tmp.path, {"../evil.safetensors", "plain file name"});
    test::write_file(tmp / "model.safetensors.index.json", "{\"weight_map\": ");
    expect_refused(tmp.path, {"model.safetensors.index.json: not valid JSON"});
  }
  {
    // A corrupt shard is named.
    TempDir tmp;
    write_model(tmp.path, cfg, specs, 2);
    test::write_file(tmp / "model-00002-of-00002.safetensors", test::le64(1u << 20) + "{}");
    expect_refused(tmp.path, {"model-00002-of-00002.safetensors", "header length"});
  }
}

TEST(Checkpoint, NotAModelFolder) {
  TempDir tmp;
  expect_refused(tmp / "absent", {"absent", "not a directory"});
  expect_refused(tmp.path, {"not a model folder", "config.json"});
  test::write_file(tmp / "config.json", test::small_text_config().dump());
  expect_refused(tmp.path, {"no model.safetensors"});
  test::write_file(tmp / "model.safetensors", "");
  expect_refused(tmp.path, {"model.safetensors", "truncated"});
  test::write_file(tmp / "config.json", "not json");
  expect_refused(tmp.path, {"config.json: not valid JSON"});
}

TEST(Identity, FieldsHashAndDiff) {
  json cfg = test::small_vlm_config();
  const ModelConfig a = parse_config(cfg.dump(), "a");
  cfg["text_config"]["sliding_window"] = 5;
  cfg["vision_config"]["layer_norm_eps"] = 1e-5;
  const ModelConfig b = parse_config(cfg.dump(), "b");
  const Identity ia = make_identity(a, "BF16", "hf", "bf16-normalizer");
  const Identity ib = make_identity(b, "BF16", "hf", "bf16-normalizer");
  EXPECT_EQ(ia.hash_hex().size(), 16u);
  EXPECT_EQ(ia.hash_hex(), make_identity(a, "BF16", "hf", "bf16-normalizer").hash_hex());  // deterministic
  EXPECT_EQ(identity_diff(ia, ib), (std::vector<std::string>{"text.sliding_window", "vision.layer_norm_eps"}));
  EXPECT_NE(ia.hash(), ib.hash());
  EXPECT_EQ(identity_diff(ia, make_identity(a, "BF16", "causal", "f32-normalizer")),
            (std::vector<std::string>{"mask_mode", "scaling_policy"}));
  EXPECT_EQ(identity_diff(ia, make_identity(a, "F32", "hf", "bf16-normalizer")),
            (std::vector<std::string>{"weight_dtypes"}));

  std::map<std::string, std::string> f(ia.fields.begin(), ia.fields.end());
  EXPECT_EQ(f.at("text.layer_kinds"), "SSG");
  EXPECT_EQ(f.at("projector.pool_kernel"), "2");
  EXPECT_EQ(f.at("text.rope_scaling_factor"), "8");
  EXPECT_EQ(f.at("boi_token_id"), "255");
  // The hash is FNV-1a 64 over "field=value\n" lines, computed here independently.
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [k, v] : ia.fields)
    for (char ch : k + "=" + v + "\n") h = (h ^ uint8_t(ch)) * 0x100000001b3ull;
  EXPECT_EQ(ia.hash(), h);

  const Identity text = make_identity(parse_config(test::small_text_config().dump(), "t"), "F32", "causal", "f32-normalizer");
  std::map<std::string, std::string> tf(text.fields.begin(), text.fields.end());
  EXPECT_EQ(tf.at("vision.image_size"), "none");
  EXPECT_EQ(tf.at("text.layer_kinds"), "SGS");
  EXPECT_EQ(default_mask_mode(parse_config(test::small_text_config().dump(), "t")), "causal");
  EXPECT_EQ(default_mask_mode(a), "hf");
  EXPECT_EQ(default_scaling_policy(DType::BF16), "bf16-normalizer");
  EXPECT_EQ(default_scaling_policy(DType::F16), "f32-normalizer");
}

// The generated fixtures (tests/make_fixtures.py) load with the expected scheme.
TEST(Checkpoint, Fixtures) {
  const char* root = std::getenv("VLM_FIXTURES");
  if (!root || !fs::exists(fs::path(root) / "tiny-f32")) GTEST_SKIP() << "VLM_FIXTURES not built";
  const struct {
    const char* dir;
    Naming naming;
    const char* dtypes;
  } cases[] = {{"tiny-f32", Naming::New, "F32"},          {"tiny-bf16", Naming::New, "BF16"},
               {"tiny-f16", Naming::New, "F16"},          {"tiny-old-sharded", Naming::Old, "BF16"},
               {"tiny-text-f32", Naming::CausalLM, "F32"}, {"tiny-text-bf16", Naming::CausalLM, "BF16"},
               {"tiny-text-f16", Naming::CausalLM, "F16"}, {"tiny-text-sharded", Naming::CausalLM, "F32"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dir);
    const Checkpoint ck = models::gemma3::open_checkpoint(fs::path(root) / c.dir);
    EXPECT_EQ(ck.naming(), c.naming);
    EXPECT_EQ(ck.weight_dtypes(), c.dtypes);
    EXPECT_TRUE(ck.unknown().empty());
    const TextConfig& t = ck.config().text;
    EXPECT_EQ(t.num_layers, 6);
    ASSERT_EQ(t.layer_kinds.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.layer_kinds[size_t(i)], i == 2 || i == 5 ? LayerKind::Global : LayerKind::Sliding);
    if (ck.config().is_vlm()) {
      EXPECT_EQ(ck.config().pool_kernel(), 2);
      EXPECT_TRUE(ck.config().preprocessor);
    }
  }
}

}  // namespace
}  // namespace vlm
