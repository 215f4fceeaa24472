// Host preprocessor and image-row merge (issue 6): cardinality and context checks
// before compute, the scaling policies, the fault switch, and the no-image path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "io/checkpoint.h"
#include "models/gemma3/registry.h"
#include "io/identity.h"
#include "models/gemma3/decoder.h"
#include "multimodal/host.h"
#include "multimodal/merge.h"

namespace vlm {
namespace {

using models::gemma3::DecodeItem;
using models::gemma3::Decoder;
using models::gemma3::PrefillOptions;

namespace fs = std::filesystem;

TEST(MergeImageRows, ReferenceCopiesInOrderAndCountsMustAgree) {
  const int H = 3;
  const std::vector<int32_t> ids = {2, 9, 9, 5, 9};
  std::vector<float> rows(ids.size() * H, -1.0f);
  const std::vector<float> feats = {1, 2, 3, 4, 5, 6, 7.5f, 8, 9};
  merge_image_rows(ids, 9, feats, H, 1.0f, 1.0f, rows.data());
  const std::vector<float> want = {-1, -1, -1, 1, 2, 3, 4, 5, 6, -1, -1, -1, 7.5f, 8, 9};
  EXPECT_EQ(rows, want);
  try {
    merge_image_rows(ids, 9, std::vector<float>(6), H, 1.0f, 1.0f, rows.data());
    FAIL() << "count mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 image tokens, 2 feature rows"), std::string::npos) << e.what();
  }
}

TEST(MergeImageRows, MlxOrderReachesTheReferenceMagnitude) {
  const std::vector<int32_t> ids = {7, 7};
  const std::vector<float> feats = {0.3f, -1.7f, 2.9f, 1e-3f};
  std::vector<float> rows(4);
  const float s = std::sqrt(64.0f);
  merge_image_rows(ids, 7, feats, 2, s, s, rows.data());
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(rows[i], feats[i], 1e-6f * std::fabs(feats[i]));
  merge_image_rows(ids, 7, feats, 2, 1.0f, s, rows.data());  // the pre-division dropped
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(rows[i], feats[i] * s);
}

TEST(RowNorms, L2PerRow) {
  const std::vector<float> r = {3, 4, 0, 0, 1, 1};
  const std::vector<float> n = row_norms(r.data(), 3, 2);
  EXPECT_FLOAT_EQ(n[0], 5.0f);
  EXPECT_FLOAT_EQ(n[1], 0.0f);
  EXPECT_FLOAT_EQ(n[2], std::sqrt(2.0f));
}

TEST(Fault, ParsedAndUnknownRefused) {
  EXPECT_EQ(parse_fault(""), Fault::None);
  EXPECT_EQ(parse_fault("double_scale"), Fault::DoubleScale);
  EXPECT_THROW(parse_fault("bogus"), Error);
}

TEST(ScalingPolicy, NamedForTheIdentity) {
  EXPECT_EQ(scaling_policy_name(EmbedScaling::Reference, DType::BF16, ImageScaling::Reference), "bf16-normalizer");
  EXPECT_EQ(scaling_policy_name(EmbedScaling::F32, DType::BF16, ImageScaling::Reference), "f32-normalizer");
  EXPECT_EQ(scaling_policy_name(EmbedScaling::Reference, DType::F32, ImageScaling::Mlx),
            "f32-normalizer+mlx-image-prescale");
  EXPECT_THROW(parse_image_scaling("none"), Error);
}

TEST(UserTurn, ImagesFirstThenText) {
  const text::ChatMessage m = user_turn("hi", 2);
  ASSERT_EQ(m.content.size(), 3u);
  EXPECT_TRUE(m.content[0].is_image && m.content[1].is_image);
  EXPECT_FALSE(m.content[2].is_image);
  EXPECT_EQ(m.content[2].text, "hi");
}

class HostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* root = std::getenv("VLM_FIXTURES");
    const fs::path dir = root ? fs::path(root) / "tiny-f32" : fs::path();
    if (dir.empty() || !fs::exists(dir / "config.json")) GTEST_SKIP() << "VLM_FIXTURES not built";
    // Text part only: any path that touched the vision tower would fail.
    ckpt_ = std::make_unique<Checkpoint>(models::gemma3::open_checkpoint(dir, Parts{.text = true, .vision = false}));
    pool_ = std::make_unique<ThreadPool>(2);
    model_ = std::make_unique<Decoder>(*ckpt_, *pool_);
  }
  std::string error_of(const std::vector<int32_t>& ids, const HostOptions& o) {
    try {
      build_prefill(*model_, ckpt_->config(), nullptr, ids, {}, o, *pool_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Decoder> model_;
};

TEST_F(HostTest, SoftTokensWithoutImagesRefusedBeforeCompute) {
  const std::vector<int32_t> ids = {2, 105, 255999, 262144, 262144, 256000, 106};
  const std::string e = error_of(ids, HostOptions{});
  EXPECT_NE(e.find("2 image soft tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("0 image(s) need 0"), std::string::npos) << e;
}

TEST_F(HostTest, ContextOverflowAndShortPadRefused) {
  std::vector<int32_t> ids(30, 2);
  HostOptions o;
  o.context = 20;
  EXPECT_NE(error_of(ids, o).find("exceeds the context limit of 20"), std::string::npos);
  o = {};
  o.pad_to = 10;
  EXPECT_NE(error_of(ids, o).find("shorter than the prompt"), std::string::npos);
}

// A request without images on a VLM is the text path: in the hf mode with no image block to
// open, the same rows and masks as the plain causal mode, so the same logits.
TEST_F(HostTest, NoImagePrefillEqualsTextPrefill) {
  const std::vector<int32_t> ids = {2, 105, 2364, 107, 9259, 236764, 1041, 4799, 563, 12864, 106, 107};
  HostOptions o;
  o.mask_mode = MaskMode::Hf;
  const MultimodalPrefill mm = build_prefill(*model_, ckpt_->config(), nullptr, ids, {}, o, *pool_);
  o.mask_mode = MaskMode::Causal;
  const PrefillInput txt = build_prefill(*model_, ckpt_->config(), nullptr, ids, {}, o, *pool_).input;
  EXPECT_EQ(mm.input.embeds, txt.embeds);
  EXPECT_EQ(mm.input.mask_global, txt.mask_global);
  EXPECT_EQ(mm.input.mask_sliding, txt.mask_sliding);
  EXPECT_FALSE(mm.encoding.has_value());
  EXPECT_TRUE(mm.image_positions.empty());
  KvCache a = model_->new_cache(64), b = model_->new_cache(64);
  EXPECT_EQ(model_->prefill_from_embeddings(mm.input, a), model_->prefill_from_embeddings(txt, b));
}

// The fault switch changes exactly the step it names.
TEST_F(HostTest, FaultsChangeTheirIntermediate) {
  const std::vector<int32_t> ids = {2, 105, 2364, 107, 9259, 106};
  const MultimodalPrefill clean = build_prefill(*model_, ckpt_->config(), nullptr, ids, {}, {}, *pool_);
  const MultimodalPrefill twice =
      build_prefill(*model_, ckpt_->config(), nullptr, ids, {}, HostOptions{.fault = Fault::DoubleScale}, *pool_);
  const MultimodalPrefill mult = build_prefill(*model_, ckpt_->config(), nullptr, ids, {},
                                               HostOptions{.fault = Fault::MultiplicativeMask}, *pool_);
  const float s = model_->embedder().normalizer();
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_FLOAT_EQ(twice.embed_norms[i], clean.embed_norms[i] * s);
  EXPECT_EQ(mult.input.embeds, clean.input.embeds);
  for (size_t i = 0; i < clean.input.mask_global.size(); ++i)
    EXPECT_EQ(mult.input.mask_global[i], clean.input.mask_global[i] == kMaskAllowed ? 1.0f : 0.0f);
}

}  // namespace
}  // namespace vlm
