// A model's weights as one tensor source, opened from either file format:
//  * open(): a Gemma 3 checkpoint folder as HF ships it (config files plus one
//    model.safetensors or shards with model.safetensors.index.json);
//  * open_gguf(): a GGUF model file (general.architecture gemma3) and optionally its mmproj
//    file (clip, projector gemma3), config from the metadata (docs/gguf.md §3, §5).
// Both openers list what they found and share the rest: validation against the family's
// registry, the dtype summary, the weights fingerprint.
//
// Tensors are views into mmapped files: no copies at load (except GGUF's norm vectors, stored
// as 1 + w, which get w back in f32). Names are made canonical whichever naming scheme the
// file uses (docs/gemma3/checkpoint.md#naming; GGUF names per docs/gguf.md §3/§5):
//   text.<rest>        decoder: text.embed_tokens.weight, text.layers.N.…, text.norm.weight
//   lm_head.weight     only when the file carries an explicit head (normally tied)
//   vision.<rest>      SigLIP, after `vision_model.`: vision.embeddings.…, vision.encoder.layers.N.…
//   projector.<rest>   projector.mm_input_projection_weight, projector.mm_soft_emb_norm.weight
#pragma once
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace vlm {

enum class Naming { Old, New, CausalLM, Gguf };  // docs/gemma3/checkpoint.md#naming columns; GGUF names
std::string_view naming_name(Naming n);

// Which parts a run needs; only those tensors are validated against the
// config and made available (a text-only run never touches vision tensors).
struct Parts {
  bool text = true;
  bool vision = true;  // vision tower + projector (ignored for CausalLM)
};

// One tensor a model family expects: canonical name, exact shape (from the config), and
// whether the file must hold it. The family's registry lists them (io knows no family).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;
};
using TensorRegistry = std::function<std::vector<TensorSpec>(const ModelConfig&)>;

class MappedFile;
class GgufFile;
class GgufHeader;

class Checkpoint {
 public:
  // Validates the loaded parts' tensors against `registry`'s list for this folder's config.
  static Checkpoint open(const std::filesystem::path& dir, Parts parts, const TensorRegistry& registry);
  // A GGUF model file and its mmproj file (empty: text only), validated the same way.
  static Checkpoint open_gguf(const std::filesystem::path& model, const std::filesystem::path& mmproj, Parts parts,
                              const TensorRegistry& registry);
  // Whatever `path` is: a .gguf file, a folder without config.json holding exactly one model
  // .gguf (and at most one mmproj*.gguf, used unless `mmproj` names one), or a safetensors
  // folder (then `mmproj` must be empty).
  static Checkpoint open_path(const std::filesystem::path& path, const std::filesystem::path& mmproj, Parts parts,
                              const TensorRegistry& registry);

  // The GGUF model file's header (tokenizer, chat template); null for safetensors.
  const GgufHeader* gguf() const;

  const ModelConfig& config() const { return config_; }
  Naming naming() const { return naming_; }
  // The folder (safetensors) or the GGUF model file.
  const std::filesystem::path& dir() const { return dir_; }

  // Throws Error naming the tensor when it is absent.
  const TensorView& get(std::string_view canonical) const;
  const TensorView* find(std::string_view canonical) const;
  // Same, checked against the shape the caller's math assumes (open() already checked the
  // config's shapes; this guards a caller that derives them differently).
  const TensorView& get(std::string_view canonical, std::initializer_list<int64_t> shape) const;
  const TensorView& get(std::string_view canonical, const std::vector<int64_t>& shape) const;
  // The output head: lm_head.weight when present, else the tied embedding.
  const TensorView& lm_head() const;

  // Maps the loaded tensors' pages into this process now, where the kernel can
  // (MADV_POPULATE_READ, Linux 5.14): from the page cache that takes a tenth of the time the
  // first step's page faults do (docs/performance.md, "2026-12-03, night: start"); elsewhere the pages fault in
  // on first use as before.
  void map_pages() const;
  // Locks the same pages in memory (mlock), so that the kernel never pages them out while this
  // process runs (a server idle for a while finds its weights still there). Fails naming the
  // bytes and the memlock limit where the kernel refuses (RLIMIT_MEMLOCK without CAP_IPC_LOCK).
  void lock_pages() const;

  // All tensors of the loaded parts, by canonical name.
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  // File names of tensors that no part uses (reported, not an error), sorted.
  const std::vector<std::string>& unknown() const { return unknown_; }
  // Original (file) name of a canonical tensor, and the file that holds it.
  std::string file_name_of(std::string_view canonical) const;
  std::string file_of(std::string_view canonical) const;  // shard basename
  // Stored dtypes of all known tensors (loaded parts or not), from the headers:
  // "BF16" when uniform, else per part, e.g. "text=BF16,vision=F32,projector=F32" or
  // "text=F32+Q4_K+Q6_K,vision=F16+F32,projector=F16+F32" (the quantization types).
  const std::string& weight_dtypes() const { return weight_dtypes_; }
  // 16 hex digits telling these weights from others of the same shapes, cheap on a
  // multi-GB folder: a checksum over every known tensor's canonical name, dtype and
  // shape, its whole bytes when small (norms, biases) and 8 spread 4 KiB windows of
  // it otherwise. Independent of naming scheme and sharding; all parts, loaded or not.
  const std::string& weights_fingerprint() const { return weights_fingerprint_; }

 private:
  struct Origin {
    std::string file_name;  // name in the safetensors header / GGUF tensor name
    std::string file;       // shard (or GGUF file) basename
  };
  struct Found;  // a tensor an opener found, before validation (checkpoint.cpp)
  using FoundMap = std::map<std::string, Found, std::less<>>;
  // Validates `found` against the registry, maps the wanted parts, fills the summaries.
  void finish(FoundMap& found, Parts parts, const TensorRegistry& registry, std::string_view config_name,
              const std::function<std::string(std::string_view)>& file_name);
  // The loaded tensors' whole pages as address ranges, sorted, merged where they meet.
  std::vector<std::pair<uintptr_t, uintptr_t>> page_spans() const;

  std::filesystem::path dir_;
  ModelConfig config_;
  Naming naming_ = Naming::New;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::shared_ptr<const GgufFile> gguf_, mmproj_;
  std::vector<std::shared_ptr<const std::vector<float>>> owned_;  // GGUF norms as w, f32
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, Origin, std::less<>> origins_;
  std::vector<std::string> unknown_;
  std::string weight_dtypes_;
  std::string weights_fingerprint_;
};

// The GGUF name of a canonical tensor name (docs/gguf.md §3, §5), nullopt when it has none.
std::optional<std::string> gguf_name_of(std::string_view canonical);

// Canonical name -> part: "text" (decoder and lm_head), "vision" or "projector".
std::string_view part_of(std::string_view canonical);

}  // namespace vlm
