#include "io/config.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "model_folder.h"

namespace vlm {
namespace {

using nlohmann::json;
using test::TempDir;

ModelConfig parse(const json& j) { return parse_config(j.dump(), "config.json"); }

// Expects parse to fail with a one-line message containing every fragment.
void expect_refused(const json& j, std::initializer_list<const char*> fragments) {
  try {
    parse(j);
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("config.json: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

std::vector<int> globals(const TextConfig& t) {
  std::vector<int> g;
  for (size_t i = 0; i < t.layer_kinds.size(); ++i)
    if (t.layer_kinds[i] == LayerKind::Global) g.push_back(int(i));
  return g;
}

TEST(Config, Minimal4BTextConfigTakesClassDefaults) {
  // The shape of Google's published 4B config.json (docs/gemma3/config.md#text-config): text_config states
  // only six keys; the rest must come from Gemma3TextConfig's defaults.
  const json j = json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "sliding_window": 1024},
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
      "patch_size": 14, "vision_use_head": false}})");
  const ModelConfig c = parse(j);
  EXPECT_TRUE(c.is_vlm());
  EXPECT_EQ(c.text.num_heads, 8);
  EXPECT_EQ(c.text.num_kv_heads, 4);
  EXPECT_EQ(c.text.head_dim, 256);
  EXPECT_EQ(c.text.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.text.vocab_size, 262208);
  EXPECT_EQ(c.text.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.text.max_position_embeddings, 131072);
  EXPECT_EQ(c.text.sliding_window, 1024);
  EXPECT_EQ(c.text.rope_theta, 1e6);
  EXPECT_EQ(c.text.rope_local_base_freq, 1e4);
  EXPECT_EQ(c.text.rope_scaling_type, "linear");
  EXPECT_EQ(c.text.rope_scaling_factor, 8.0);
  EXPECT_TRUE(c.text.tie_word_embeddings);
  EXPECT_EQ(globals(c.text), (std::vector<int>{5, 11, 17, 23, 29}));  // pattern absent -> 6
  ASSERT_TRUE(c.vision);
  EXPECT_EQ(c.vision->layer_norm_eps, 1e-6);
  EXPECT_EQ(c.vision->patches_per_side(), 64);
  EXPECT_EQ(c.tokens_per_side(), 16);
  EXPECT_EQ(c.pool_kernel(), 4);
  EXPECT_EQ(c.boi_token_id, 255999);
  EXPECT_EQ(c.eoi_token_id, 256000);
  EXPECT_EQ(c.image_token_id, 262144);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 106}));
  EXPECT_EQ(c.torch_dtype, DType::BF16);
}

TEST(Config, LayerKinds) {
  json j = test::small_vlm_config();
  j["text_config"]["num_hidden_layers"] = 6;
  EXPECT_EQ(globals(parse(j).text), (std::vector<int>{2, 5}));  // sliding_window_pattern 3
  j["text_config"].erase("sliding_window_pattern");
  j["text_config"]["_sliding_window_pattern"] = 2;
  EXPECT_EQ(globals(parse(j).text), (std::vector<int>{1, 3, 5}));
  // layer_types wins over any pattern.
  j["text_config"]["layer_types"] = {"full_attention",    "sliding_attention", "sliding_attention",
                                     "sliding_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(globals(parse(j).text), (std::vector<int>{0, 5}));
  j["text_config"]["layer_types"].erase(5);
  expect_refused(j, {"text_config.layer_types", "5 entries", "num_hidden_layers is 6"});
  j["text_config"]["layer_types"] = {"full_attention",    "sliding_attention", "chunked_attention",
                                     "sliding_attention", "sliding_attention", "full_attention"};
  expect_refused(j, {"text_config.layer_types[2]", "chunked_attention"});
  j["text_config"].erase("layer_types");
  j["text_config"]["_sliding_window_pattern"] = 0;
  expect_refused(j, {"text_config._sliding_window_pattern: must be > 0"});
}

TEST(Config, Rope) {
  json j = test::small_text_config();
  ModelConfig c = parse(j);
  EXPECT_EQ(c.text.rope_scaling_type, "default");
  EXPECT_EQ(c.text.rope_scaling_factor, 1.0);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4}};  // older key name
  EXPECT_EQ(parse(j).text.rope_scaling_factor, 4.0);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
  expect_refused(j, {"rope_scaling.rope_type", "yarn"});
  j["rope_scaling"] = {{"rope_type", "linear"}};
  expect_refused(j, {"rope_scaling.factor: missing required field"});
  j.erase("rope_scaling");
  // Newer HF: per-layer-type rope_parameters replaces the legacy keys.
  j["rope_theta"] = 5.0;
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  c = parse(j);
  EXPECT_EQ(c.text.rope_theta, 1e6);
  EXPECT_EQ(c.text.rope_local_base_freq, 1e4);
  EXPECT_EQ(c.text.rope_scaling_type, "linear");
  EXPECT_EQ(c.text.rope_scaling_factor, 8.0);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  j["rope_parameters"]["sliding_attention"]["factor"] = 2;
  expect_refused(j, {"rope_parameters.sliding_attention.rope_type"});
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", -1}}},
                          {"sliding_attention", {{"rope_type", "default"}}}};
  expect_refused(j, {"rope_parameters.full_attention.rope_theta: must be > 0"});
}

TEST(Config, CausalLM) {
  const ModelConfig c = parse(test::small_text_config());
  EXPECT_EQ(c.arch, Arch::CausalLM);
  EXPECT_FALSE(c.is_vlm());
  EXPECT_FALSE(c.vision);
  EXPECT_EQ(c.text.vocab_size, 300);
  EXPECT_EQ(globals(c.text), (std::vector<int>{1}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 106}));
  // model_type decides when architectures is absent.
  json j = test::small_text_config();
  j.erase("architectures");
  EXPECT_EQ(parse(j).architecture, "Gemma3ForCausalLM");
  j["model_type"] = "llama";
  expect_refused(j, {"architectures"});
  j["architectures"] = {"LlamaForCausalLM"};
  expect_refused(j, {"architectures", "LlamaForCausalLM"});
  j["architectures"] = {"Evil\nArch"};  // echoed escaped, on one line
  expect_refused(j, {"architectures", "Evil\\x0aArch"});
}

TEST(Config, MissingRequiredField) {
  json j = test::small_vlm_config();
  j["text_config"].erase("hidden_size");
  expect_refused(j, {"config.json: text_config.hidden_size: missing required field"});
  j = test::small_vlm_config();
  j["vision_config"].erase("patch_size");
  expect_refused(j, {"vision_config.patch_size: missing required field"});
  j = test::small_vlm_config();
  j.erase("text_config");
  expect_refused(j, {"text_config: missing required field"});
  j = test::small_text_config();
  j["num_hidden_layers"] = nullptr;  // null counts as absent
  expect_refused(j, {"config.json: num_hidden_layers: missing required field"});
}

TEST(Config, InconsistentFields) {
  auto with = [](const char* section, const char* key, json v) {
    json j = test::small_vlm_config();
    (section ? j[section] : j)[key] = std::move(v);
    return j;
  };
  expect_refused(with("text_config", "num_attention_heads", 0), {"config.json: text_config.num_attention_heads: must be > 0"});
  expect_refused(with("text_config", "num_key_value_heads", 3), {"text_config.num_attention_heads", "multiple of num_key_value_heads 3"});
  expect_refused(with("text_config", "head_dim", 7), {"text_config.head_dim", "even"});
  expect_refused(with("text_config", "hidden_size", "16"), {"text_config.hidden_size", "must be an integer"});
  expect_refused(with("text_config", "hidden_size", 1e12), {"text_config.hidden_size", "must be <="});
  expect_refused(with("text_config", "rms_norm_eps", -1e-6), {"text_config.rms_norm_eps: must be > 0"});
  expect_refused(with("text_config", "hidden_activation", "silu"), {"text_config.hidden_activation", "silu"});
  expect_refused(with("vision_config", "image_size", 18), {"vision_config.image_size", "patch_size 4"});
  expect_refused(with("vision_config", "num_attention_heads", 3), {"vision_config.num_attention_heads"});
  expect_refused(with(nullptr, "mm_tokens_per_image", 5), {"mm_tokens_per_image", "perfect square"});
  // 4x4 patches do not pool evenly to 3x3 tokens.
  expect_refused(with(nullptr, "mm_tokens_per_image", 9), {"vision_config.image_size", "pool evenly"});
  expect_refused(with(nullptr, "boi_token_index", 300), {"boi_token_index", "vocab_size 300"});
  expect_refused(with(nullptr, "boi_token_id", 254), {"boi_token_id", "disagrees"});
  expect_refused(with(nullptr, "eos_token_id", json::array({1, 999})), {"eos_token_id", "999"});
  expect_refused(with(nullptr, "eos_token_id", json::array()), {"eos_token_id", "empty"});
  json j = with(nullptr, "tie_word_embeddings", false);
  EXPECT_FALSE(parse(j).text.tie_word_embeddings);  // the outer key alone decides
  j["text_config"]["tie_word_embeddings"] = true;
  expect_refused(j, {"config.json: tie_word_embeddings", "disagrees"});
  j = test::small_vlm_config();
  j["text_config"]["tie_word_embeddings"] = false;
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse(j).text.tie_word_embeddings);
}

TEST(Config, RefusedFeatures) {
  json j = test::small_text_config();
  j["use_bidirectional_attention"] = true;
  expect_refused(j, {"use_bidirectional_attention"});
  j = test::small_text_config();
  j["final_logit_softcapping"] = 30.0;
  expect_refused(j, {"final_logit_softcapping", "not supported"});
  j = test::small_text_config();
  j["attn_logit_softcapping"] = 50.0;
  expect_refused(j, {"attn_logit_softcapping"});
  j = test::small_text_config();
  j["attn_logit_softcapping"] = nullptr;  // null = off, as published
  j["final_logit_softcapping"] = nullptr;
  j["use_bidirectional_attention"] = false;
  EXPECT_NO_THROW(parse(j));
  j["attention_bias"] = true;
  expect_refused(j, {"attention_bias"});
}

TEST(Config, NotJson) {
  try {
    parse_config("{\"architectures\": [", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: not valid JSON"), std::string::npos) << e.what();
  }
  expect_refused(json::array({1}), {"must be a JSON object"});
}

TEST(Config, EosFallsBackToGenerationConfig) {
  TempDir tmp;
  json j = test::small_text_config();
  j.erase("eos_token_id");
  test::write_file(tmp / "config.json", j.dump());
  EXPECT_EQ(load_config(tmp.path).eos_token_ids, (std::vector<int>{1}));  // class default
  test::write_file(tmp / "generation_config.json", R"({"eos_token_id": [1, 106], "bos_token_id": 2})");
  EXPECT_EQ(load_config(tmp.path).eos_token_ids, (std::vector<int>{1, 106}));
  test::write_file(tmp / "generation_config.json", R"({"eos_token_id": 106})");
  EXPECT_EQ(load_config(tmp.path).eos_token_ids, (std::vector<int>{106}));
  test::write_file(tmp / "generation_config.json", R"({"eos_token_id": "x"})");
  try {
    load_config(tmp.path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: eos_token_id"), std::string::npos) << e.what();
  }
  j["eos_token_id"] = 1;  // config.json wins when it has one
  test::write_file(tmp / "config.json", j.dump());
  EXPECT_EQ(load_config(tmp.path).eos_token_ids, (std::vector<int>{1}));
}

TEST(Config, Preprocessor) {
  const ModelConfig m = parse(test::small_vlm_config());
  // The published Gemma 3 file, with nulls and size set to this model's image size.
  const std::string text = R"({"do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
    "do_rescale": true, "do_resize": true, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 4, "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
    "pan_and_scan_min_ratio_to_activate": null, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 16, "width": 16}})";
  const PreprocessorConfig p = parse_preprocessor_config(text, "preprocessor_config.json", m);
  EXPECT_EQ(p.height, 16);
  EXPECT_EQ(p.width, 16);
  EXPECT_EQ(p.resample, 2);
  EXPECT_TRUE(p.do_convert_rgb);
  EXPECT_FALSE(p.do_pan_and_scan);
  EXPECT_EQ(p.pan_and_scan_min_crop_size, 256);
  EXPECT_EQ(p.pan_and_scan_max_num_crops, 4);
  EXPECT_EQ(p.pan_and_scan_min_ratio_to_activate, 1.2);
  EXPECT_EQ(p.rescale_factor, 0.00392156862745098);
  EXPECT_EQ(p.image_mean[2], 0.5f);

  auto refused = [&](const json& patch, const char* fragment) {
    json j = json::parse(text);
    j.merge_patch(patch);
    try {
      parse_preprocessor_config(j.dump(), "preprocessor_config.json", m);
      ADD_FAILURE() << "accepted " << patch.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  refused({{"size", {{"height", 896}, {"width", 896}}}}, "preprocessor_config.json: size: 896x896");
  refused({{"image_std", {0.5, 0.0, 0.5}}}, "image_std");
  refused({{"image_mean", {0.5, 0.5}}}, "image_mean");
  refused({{"resample", 9}}, "resample");
  refused({{"image_seq_length", 256}}, "image_seq_length");
  refused({{"image_processor_type", "CLIPImageProcessor"}}, "image_processor_type");
}

}  // namespace
}  // namespace vlm
