// The compatibility identity: every setting that changes the numbers a run
// produces (architecture, run options, shapes, RoPE, layer kinds, weight dtypes,
// a fingerprint of the weights themselves, every image preprocessing value),
// as ordered "field=value" pairs plus a stable 64-bit hash of them. Two runs
// (or a cache and a run) may share results only when their identities match.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/checkpoint.h"

namespace vlm {

// Bump when canonical names or the meaning of a field change.
constexpr int kIdentityLayoutVersion = 4;  // 3: the precision field; 4: bf16 covers vision attention

struct Identity {
  std::vector<std::pair<std::string, std::string>> fields;  // in a fixed order

  // FNV-1a 64 over the lines "field=value\n" in order.
  uint64_t hash() const;
  std::string hash_hex() const;  // 16 lowercase hex digits
};

// Run-option defaults: VLMs follow HF's image-aware mask, text models are
// causal; the embedding normalizer is rounded to bf16 exactly when the
// embedding matrix is bf16 (docs/gemma3/merge-and-scaling.md#text).
std::string default_mask_mode(const ModelConfig& c);
std::string default_scaling_policy(DType embedding_dtype);
// The matrix-product precision (kernels/exec.h): "bf16" when the decoder's matrices are
// stored in bf16 (what the checkpoint was trained to run in) or block-quantized (whose
// rounding is coarser than bf16's: docs/gguf.md), "f32" for f32 and f16.
std::string default_precision(DType matrix_dtype);
// Adds the run's precision ("f32" or "bf16") as the field "precision", after the other run
// options: the same weights give other numbers at another precision.
void add_precision(Identity& id, std::string_view precision);

// `weights` is Checkpoint::weights_fingerprint(); "none" when only a config is at hand.
Identity make_identity(const ModelConfig& c, const std::string& weight_dtypes, std::string_view mask_mode,
                       std::string_view scaling_policy, std::string_view weights = "none");
Identity make_identity(const Checkpoint& ck, std::string_view mask_mode, std::string_view scaling_policy);

// Names of the fields whose values differ (or that only one side has), in a's
// order followed by b's extras; empty when the identities match.
std::vector<std::string> identity_diff(const Identity& a, const Identity& b);

// {"hash": hex, "fields": {name: value}} and back; `where` names the source in errors.
nlohmann::json identity_to_json(const Identity& id);
Identity identity_from_json(const nlohmann::json& j, const std::string& where);
// Fails "<where> was made for another model identity; differing fields: f (saved vs ours), …".
void require_same_identity(const Identity& saved, const Identity& ours, const std::string& where);

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);
// A fast 64-bit checksum of bytes (8 at a time; not cryptographic), chainable through
// `h`: checksum64(b, nb, checksum64(a, na)) covers a then b. Detects corruption, not forgery.
uint64_t checksum64(const void* data, size_t n, uint64_t h = 0x6a09e667f3bcc909ull);

}  // namespace vlm
