// A loaded model: checkpoint, config, tokenizer, chat template, vision encoder (when wanted),
// decoder and compatibility identity. Immutable after load(); every front end (vlm run, vlm
// dump, vlm serve, vlm batch) shares one through std::shared_ptr<const Model>.
//
// Prompts are built here, not in the front ends: chat messages through the Gemma 3 template or
// raw text as HF's tokenizer reads it, each image slot expanded into its soft-token block (and
// its Pan & Scan crops' blocks), so a Request's ids are final.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/thread_pool.h"
#include "grammar/token_mask.h"
#include "kernels/exec.h"
#include "io/checkpoint.h"
#include "io/identity.h"
#include "models/gemma3/decoder.h"
#include "multimodal/host.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "models/gemma3/vision_encoder.h"

namespace vlm::engine {

// Everything that changes the numbers a run produces is in the identity.
struct ModelOptions {
  bool vision = true;                  // map the vision tower (false: text-only use)
  std::optional<MaskMode> mask_mode;   // nullopt: default_mask_mode (hf for VLMs, causal for text)
  ImageScaling image_scaling = ImageScaling::Reference;
  EmbedScaling embed_scaling = EmbedScaling::Reference;
  std::optional<bool> pan_and_scan;    // nullopt: preprocessor_config.json decides
  text::ImageLayout layout = text::ImageLayout::HF;
  Fault fault = Fault::None;           // TEST-ONLY (multimodal/host.h); the CLI maps VLM_FAULT
  int threads = 0;                     // 0: default_threads()
  std::optional<kernels::Isa> isa;     // kernel ISA path; nullopt: the best this CPU has
  // Matrix-product precision; nullopt: default_precision of the decoder's matrices (bf16
  // for a bf16 checkpoint, else f32). Part of the identity.
  std::optional<kernels::Precision> precision;
  int64_t context = 0;                 // 0: max_position_embeddings
  std::filesystem::path mmproj;        // GGUF models: the mmproj file (empty: the folder's, if any)
  bool mlock = false;                  // lock the weights in memory (Checkpoint::lock_pages)
};

class Model {
 public:
  // Opens and validates the checkpoint; fails naming the file/field at fault.
  static std::shared_ptr<const Model> load(const std::filesystem::path& dir, const ModelOptions& opt = {});

  const std::filesystem::path& dir() const { return ck_.dir(); }
  const Checkpoint& checkpoint() const { return ck_; }
  const ModelConfig& config() const { return ck_.config(); }
  const ModelOptions& options() const { return opt_; }
  const Identity& identity() const { return identity_; }
  // Null when the folder has no tokenizer.json (then prompts are ids only).
  const text::Tokenizer* tokenizer() const { return tok_ ? &*tok_ : nullptr; }
  // True when the tokenizer's chat template is the Gemma 3 one (chat_prompt works).
  bool has_chat_template() const;
  // For errors about images on a model without a vision tower: "the checkpoint (…) has no vision
  // tower", saying where a GGUF model's is.
  std::string no_vision_tower() const;
  // Null unless the checkpoint is a VLM and the options asked for vision.
  const vision::VisionEncoder* vision() const { return enc_ ? &*enc_ : nullptr; }
  bool has_vision() const { return enc_.has_value(); }
  // The decoder (its weights are views of the checkpoint).
  const models::gemma3::Decoder& decoder() const { return *decoder_; }
  // Positions one sequence may hold (options.context or max_position_embeddings).
  int64_t context() const { return context_; }
  // Ids ≥ this are never sampled: image_token_id on VLMs (the vocabulary padding past it), else
  // the head's row count.
  int vocab_limit() const;
  int vocab() const { return decoder_->vocab(); }
  // The image tokens of this checkpoint in the chosen layout (boi/eoi/soft = -1 for text-only).
  const text::ImageTokens& image_tokens() const { return image_tokens_; }
  // The settings the host preprocessor runs with (mask mode, scaling, Pan & Scan, context, fault).
  const HostOptions& host_options() const { return host_; }

  // What each sampled id adds to the answer's text, for response formats: special tokens and ids
  // from vocab_limit() up add nothing. Built on first use (thread-safe); needs the tokenizer.
  const grammar::Vocabulary& vocabulary() const;

  // Pan & Scan crops each image will get (all 0 when off). Needs vision() for any image.
  std::vector<int> crops_of(const std::vector<vision::RgbImage>& images) const;
  // Prompt ids from chat messages through the Gemma 3 template, ending as `end` says (by default
  // with the generation prompt); the messages' image parts take `images` in order. Needs the
  // tokenizer and the Gemma 3 template.
  std::vector<int32_t> chat_prompt(std::span<const text::ChatMessage> messages,
                                   const std::vector<vision::RgbImage>& images,
                                   text::ChatEnd end = text::ChatEnd::GenerationPrompt) const;
  // Raw text as HF's tokenizer(text) reads it: special tokens parsed, <bos> prepended unless the
  // text starts with it; with images, each "<start_of_image>" in it is an image slot.
  std::vector<int32_t> raw_prompt(std::string_view text, const std::vector<vision::RgbImage>& images) const;

  // The whole prefill of a prompt at once through the host preprocessor (vlm dump; tests):
  // rows, masks, image encoding, right-padded to pad_to rows (0 = none). Checks first.
  MultimodalPrefill prefill_input(std::span<const int32_t> ids, const std::vector<vision::RgbImage>& images,
                                  int pad_to = 0) const;

  // How the decoder and the vision tower run their kernels (threads, ISA, precision). The pool
  // runs one job at a time: one Engine drives a Model.
  const kernels::Exec& exec() const { return *exec_; }
  kernels::Precision precision() const { return exec_->precision; }

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

 private:
  Model(Checkpoint ck, const ModelOptions& opt);
  std::vector<int32_t> expand(std::span<const text::Segment> segments, const std::vector<vision::RgbImage>& images,
                              bool parse_special) const;

  Checkpoint ck_;
  ModelOptions opt_;
  HostOptions host_;
  Identity identity_;
  int64_t context_ = 0;
  text::ImageTokens image_tokens_;
  std::optional<text::Tokenizer> tok_;
  std::optional<vision::VisionEncoder> enc_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<const kernels::Exec> exec_;
  std::unique_ptr<const models::gemma3::Decoder> decoder_;
  mutable std::once_flag vocabulary_once_;
  mutable std::unique_ptr<const grammar::Vocabulary> vocabulary_;
};

}  // namespace vlm::engine
