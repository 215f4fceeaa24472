#include "io/checkpoint.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "core/error.h"
#include "io/file.h"
#include "io/gguf.h"
#include "io/gguf_config.h"
#include "io/identity.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace vlm {

namespace fs = std::filesystem;

std::string_view naming_name(Naming n) {
  switch (n) {
    case Naming::Gguf: return "gguf";
    case Naming::Old: return "old";
    case Naming::New: return "new";
    case Naming::CausalLM: return "causal_lm";
  }
  return "?";
}

std::string_view part_of(std::string_view canonical) {
  if (canonical.starts_with("vision.")) return "vision";
  if (canonical.starts_with("projector.")) return "projector";
  return "text";
}

namespace {

// File-name prefix per canonical prefix, per naming scheme (docs/gemma3/checkpoint.md#naming).
struct Prefix {
  std::string_view file, canonical;
};
constexpr Prefix kOld[] = {{"language_model.model.", "text."},
                           {"language_model.lm_head.", "lm_head."},
                           {"vision_tower.vision_model.", "vision."},
                           {"multi_modal_projector.", "projector."}};
constexpr Prefix kNew[] = {{"model.language_model.", "text."},
                           {"lm_head.", "lm_head."},
                           {"model.vision_tower.vision_model.", "vision."},
                           {"model.multi_modal_projector.", "projector."}};
constexpr Prefix kCausal[] = {{"model.", "text."}, {"lm_head.", "lm_head."}};

std::span<const Prefix> prefixes(Naming n) {
  switch (n) {
    case Naming::Old: return kOld;
    case Naming::New: return kNew;
    case Naming::CausalLM: return kCausal;
    case Naming::Gguf: break;  // GGUF names map through gguf_name_of, not by prefix
  }
  return {};
}

std::optional<std::string> to_canonical(Naming n, std::string_view file_name) {
  for (const Prefix& p : prefixes(n))
    if (file_name.starts_with(p.file)) return std::string(p.canonical) + std::string(file_name.substr(p.file.size()));
  return std::nullopt;
}

std::string to_file_name(Naming n, std::string_view canonical) {
  for (const Prefix& p : prefixes(n))
    if (canonical.starts_with(p.canonical))
      return std::string(p.file) + std::string(canonical.substr(p.canonical.size()));
  return std::string(canonical);
}

// Keys that carry no weights: precomputed RoPE tables and SigLIP's unused pooling head.
bool ignored(std::string_view file_name, std::string_view canonical) {
  return file_name.ends_with(".rotary_emb.inv_freq") || canonical.starts_with("vision.head.");
}

bool starts_with_any(std::string_view s, std::initializer_list<std::string_view> ps) {
  return std::any_of(ps.begin(), ps.end(), [&](std::string_view p) { return s.starts_with(p); });
}

// Decides the scheme from the tensor names; a VLM file must use exactly one.
Naming detect_naming(const ModelConfig& c, const std::vector<std::string>& names, const fs::path& dir) {
  const std::string* old_name = nullptr;
  const std::string* new_name = nullptr;
  for (const std::string& n : names) {
    if (n.ends_with(".rotary_emb.inv_freq")) continue;
    if (starts_with_any(n, {"model.language_model.", "model.vision_tower.", "model.multi_modal_projector."}))
      new_name = new_name ? new_name : &n;
    else if (starts_with_any(n, {"language_model.", "vision_tower.", "multi_modal_projector."}))
      old_name = old_name ? old_name : &n;
  }
  if (!c.is_vlm()) {
    if (old_name || new_name)
      fail("{}: config.json says {} but tensor '{}' uses the Gemma3ForConditionalGeneration naming",
           dir.string(), c.architecture, old_name ? *old_name : *new_name);
    return Naming::CausalLM;
  }
  if (old_name && new_name)
    fail("{}: tensors mix the older naming ('{}') and the newer naming ('{}')", dir.string(), *old_name, *new_name);
  if (!old_name && !new_name)
    fail("{}: no tensor uses a Gemma3ForConditionalGeneration naming scheme "
         "(language_model.model.* or model.language_model.*)",
         dir.string());
  return new_name ? Naming::New : Naming::Old;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Shard file names come from index.json: plain names inside the folder only.
void check_shard_name(const std::string& name, const fs::path& index) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    fail("{}: weight_map: '{}' is not a plain file name in the model folder", index.string(), printable(name));
}

struct File {
  std::string name;  // basename
  SafetensorsHeader header;
};

std::vector<File> read_headers(const fs::path& dir) {
  std::vector<File> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = parse_json(read_text_file(index), index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: weight_map: missing or not an object", index.string());
    std::map<std::string, std::string> where;  // tensor -> shard
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) fail("{}: weight_map: '{}' must map to a file name", index.string(), printable(tensor));
      check_shard_name(shard.get<std::string>(), index);
      where[tensor] = shard.get<std::string>();
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : where) shards.insert(shard);
    for (const std::string& shard : shards) {
      if (!fs::exists(dir / shard)) fail("{}: shard '{}' named in index.json is missing", index.string(), printable(shard));
      files.push_back({shard, read_safetensors_header(dir / shard)});
    }
    // The index and the shards must agree tensor by tensor.
    for (const File& f : files) {
      std::set<std::string> in_file;
      for (const auto& t : f.header.tensors) {
        in_file.insert(t.name);
        auto it = where.find(t.name);
        if (it == where.end())
          fail("{}: tensor '{}' is not listed in {}", (dir / f.name).string(), t.name, index.filename().string());
        if (it->second != f.name)
          fail("{}: tensor '{}' is listed in {} under {}", (dir / f.name).string(), t.name,
               index.filename().string(), it->second);
      }
      for (const auto& [tensor, shard] : where)
        if (shard == f.name && !in_file.count(tensor))
          fail("{}: tensor '{}' listed in {} is absent from the shard", (dir / f.name).string(), printable(tensor),
               index.filename().string());
    }
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back({"model.safetensors", read_safetensors_header(dir / "model.safetensors")});
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir.string());
  }
  return files;
}

// GGUF tensor names (docs/gguf.md §3, §5: llama.cpp's converter tables read backwards).
struct NamePair {
  std::string_view gguf, canonical;
};
constexpr NamePair kGgufFixed[] = {
    {"token_embd.weight", "text.embed_tokens.weight"},
    {"output_norm.weight", "text.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"v.patch_embd.weight", "vision.embeddings.patch_embedding.weight"},
    {"v.patch_embd.bias", "vision.embeddings.patch_embedding.bias"},
    {"v.position_embd.weight", "vision.embeddings.position_embedding.weight"},
    {"v.post_ln.weight", "vision.post_layernorm.weight"},
    {"v.post_ln.bias", "vision.post_layernorm.bias"},
    {"mm.input_projection.weight", "projector.mm_input_projection_weight"},
    {"mm.soft_emb_norm.weight", "projector.mm_soft_emb_norm.weight"},
};
// After blk.N. / text.layers.N.
constexpr NamePair kGgufLayer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};
// After v.blk.N. / vision.encoder.layers.N., before .weight / .bias.
constexpr NamePair kGgufVisionLayer[] = {
    {"ln1", "layer_norm1"},           {"ln2", "layer_norm2"},          {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},   {"attn_v", "self_attn.v_proj"},  {"attn_out", "self_attn.out_proj"},
    {"ffn_up", "mlp.fc1"},            {"ffn_down", "mlp.fc2"},
};

// "<prefix>N.<rest>" → N and rest; nullopt when name has another form.
std::optional<std::pair<std::string, std::string_view>> split_layer(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return std::nullopt;
  const std::string_view n = name.substr(0, dot);
  if (!std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) || (n.size() > 1 && n[0] == '0'))
    return std::nullopt;
  return std::pair{std::string(n), name.substr(dot + 1)};
}

// Both directions: GGUF → canonical (to_canon) or canonical → GGUF.
std::optional<std::string> map_gguf_name(std::string_view name, bool to_canon) {
  for (const NamePair& p : kGgufFixed)
    if ((to_canon ? p.gguf : p.canonical) == name) return std::string(to_canon ? p.canonical : p.gguf);
  const std::string_view text_from = to_canon ? "blk." : "text.layers.", text_to = to_canon ? "text.layers." : "blk.";
  if (auto l = split_layer(name, text_from))
    for (const NamePair& p : kGgufLayer)
      if ((to_canon ? p.gguf : p.canonical) == l->second)
        return std::string(text_to) + l->first + "." + std::string(to_canon ? p.canonical : p.gguf);
  const std::string_view vis_from = to_canon ? "v.blk." : "vision.encoder.layers.",
                         vis_to = to_canon ? "vision.encoder.layers." : "v.blk.";
  if (auto l = split_layer(name, vis_from)) {
    const size_t dot = l->second.rfind('.');
    const std::string_view mod = l->second.substr(0, dot), kind = dot == std::string_view::npos ? "" : l->second.substr(dot);
    if (kind == ".weight" || kind == ".bias")
      for (const NamePair& p : kGgufVisionLayer)
        if ((to_canon ? p.gguf : p.canonical) == mod)
          return std::string(vis_to) + l->first + "." + std::string(to_canon ? p.canonical : p.gguf) + std::string(kind);
  }
  return std::nullopt;
}

// Gemma's RMSNorm weights, which GGUF stores as 1 + w (SigLIP's LayerNorms are plain).
bool shifted_norm(std::string_view canonical) {
  return part_of(canonical) != "vision" && canonical.ends_with("norm.weight");
}

}  // namespace

struct Checkpoint::Found {
  std::string file_name;  // name in its file
  std::string file;       // file basename
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  bool shifted = false;                                 // stored as 1 + w (GGUF norms)
  std::function<const std::byte*()> data;               // the bytes, mapping the file on first use
  std::function<void(char*, size_t, uint64_t)> read;    // bytes [off, off + n) without mapping
};

namespace {

// See Checkpoint::weights_fingerprint(). Read through Found::read, so unloaded parts count too.
template <class FoundMap>
std::string fingerprint(const FoundMap& tensors) {
  constexpr uint64_t kWhole = 64 << 10, kWindow = 4 << 10, kWindows = 8;
  std::vector<char> buf(kWhole);
  uint64_t h = checksum64(nullptr, 0);
  for (const auto& entry : tensors) {
    const auto& f = entry.second;  // a named reference: clang 14 cannot capture a structured binding
    const std::string table = fmt::format("{}:{}:{}\n", entry.first, dtype_name(f.dtype), shape_str(f.shape));
    h = checksum64(table.data(), table.size(), h);
    auto sample = [&](uint64_t off, uint64_t n) {
      f.read(buf.data(), size_t(n), off);
      h = checksum64(buf.data(), size_t(n), h);
    };
    if (f.nbytes <= kWhole) {
      sample(0, f.nbytes);
      continue;
    }
    for (uint64_t w = 0; w < kWindows; ++w) sample((f.nbytes - kWindow) / (kWindows - 1) * w, kWindow);
  }
  return fmt::format("{:016x}", h);
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir, Parts parts, const TensorRegistry& registry) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a directory", dir.string());
  if (!fs::exists(dir / "config.json")) fail("{}: not a model folder (no config.json)", dir.string());

  Checkpoint ck;
  ck.dir_ = dir;
  ck.config_ = load_config(dir);
  const ModelConfig& cfg = ck.config_;
  if (!cfg.is_vlm()) parts.vision = false;

  const std::vector<File> files = read_headers(dir);
  std::vector<std::string> names;
  for (const File& f : files)
    for (const auto& t : f.header.tensors) names.push_back(t.name);
  ck.naming_ = detect_naming(cfg, names, dir);

  std::vector<std::shared_ptr<MappedFile>> maps(files.size());
  auto inputs = std::make_shared<std::vector<std::unique_ptr<InputFile>>>(files.size());
  FoundMap found;
  for (size_t i = 0; i < files.size(); ++i) {
    const File& file = files[i];
    for (const auto& t : file.header.tensors) {
      const std::optional<std::string> canonical = to_canonical(ck.naming_, t.name);
      if (canonical && ignored(t.name, *canonical)) continue;
      if (!canonical) {
        ck.unknown_.push_back(t.name);
        continue;
      }
      const uint64_t base = file.header.data_offset + t.begin;
      Found f{t.name, file.name, t.dtype, t.shape, t.end - t.begin, false, {}, {}};
      f.data = [&ck, &maps, &files, &dir, i, base] {
        const File& file = files[i];
        std::shared_ptr<MappedFile>& map = maps[i];
        if (!map) {
          map = std::make_shared<MappedFile>(dir / file.name);
          if (map->size() != file.header.data_offset + file.header.data_size)
            fail("{}: file changed size while loading", (dir / file.name).string());
          ck.files_.push_back(map);
        }
        return map->data() + base;
      };
      f.read = [inputs, path = dir / file.name, i, base](char* dst, size_t n, uint64_t off) {
        std::unique_ptr<InputFile>& in = (*inputs)[i];
        if (!in) in = std::make_unique<InputFile>(path);
        in->read_at(dst, n, base + off);
      };
      if (!found.emplace(*canonical, std::move(f)).second)
        fail("{}: tensor '{}' appears twice (as {})", dir.string(), *canonical, t.name);
    }
  }
  const Naming naming = ck.naming_;
  ck.finish(found, parts, registry, "config.json", [naming](std::string_view c) { return to_file_name(naming, c); });
  return ck;
}

Checkpoint Checkpoint::open_gguf(const fs::path& model, const fs::path& mmproj, Parts parts,
                                 const TensorRegistry& registry) {
  Checkpoint ck;
  ck.dir_ = model;
  ck.naming_ = Naming::Gguf;
  ck.gguf_ = std::make_shared<const GgufFile>(model);
  if (!mmproj.empty()) ck.mmproj_ = std::make_shared<const GgufFile>(mmproj);
  ck.config_ = config_from_gguf(ck.gguf_->header(), ck.mmproj_ ? &ck.mmproj_->header() : nullptr);
  // llama.cpp ties the head to token_embd unless output.weight is present.
  ck.config_.text.tie_word_embeddings = !ck.gguf_->header().tensor("output.weight");
  if (!ck.config_.is_vlm()) parts.vision = false;

  FoundMap found;
  for (const std::shared_ptr<const GgufFile>& file : {ck.gguf_, ck.mmproj_}) {
    if (!file) continue;
    const std::string base = file->path().filename().string();
    for (const GgufTensor& t : file->header().tensors) {
      const std::optional<std::string> canonical = map_gguf_name(t.name, true);
      if (!canonical) {
        ck.unknown_.push_back(std::string(t.name));
        continue;
      }
      const std::byte* bytes = file->data(t).data();
      Found f{std::string(t.name), base, dtype_of(t.type), t.shape(), t.bytes, shifted_norm(*canonical), {}, {}};
      f.data = [bytes] { return bytes; };
      f.read = [bytes](char* dst, size_t n, uint64_t off) { std::memcpy(dst, bytes + off, n); };
      if (!found.emplace(*canonical, std::move(f)).second)
        fail("{}: tensor '{}' appears twice (as {})", file->path().string(), *canonical, t.name);
    }
  }
  ck.finish(found, parts, registry, "the GGUF metadata",
            [](std::string_view c) { return map_gguf_name(c, false).value_or(std::string(c)); });
  return ck;
}

Checkpoint Checkpoint::open_path(const fs::path& path, const fs::path& mmproj, Parts parts,
                                 const TensorRegistry& registry) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (path.extension() != ".gguf") fail("{}: not a .gguf file or a model folder", path.string());
    return open_gguf(path, mmproj, parts, registry);
  }
  if (!fs::is_directory(path, ec)) fail("{}: not a directory (nor a .gguf file)", path.string());
  if (fs::exists(path / "config.json")) {
    if (!mmproj.empty()) fail("--mmproj {}: only GGUF models take an mmproj file ({} is a safetensors folder)",
                              mmproj.string(), path.string());
    return open(path, parts, registry);
  }
  std::vector<fs::path> models, projs;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".gguf") continue;
    (e.path().filename().string().starts_with("mmproj") ? projs : models).push_back(e.path());
  }
  std::sort(models.begin(), models.end());
  std::sort(projs.begin(), projs.end());
  if (models.empty()) fail("{}: not a model folder (no config.json and no model .gguf)", path.string());
  if (models.size() > 1)
    fail("{}: {} model .gguf files ({}, {}, ...); name one with --model", path.string(), models.size(),
         models[0].filename().string(), models[1].filename().string());
  if (mmproj.empty() && projs.size() > 1)
    fail("{}: {} mmproj*.gguf files ({}, {}, ...); name one with --mmproj", path.string(), projs.size(),
         projs[0].filename().string(), projs[1].filename().string());
  return open_gguf(models[0], mmproj.empty() && !projs.empty() ? projs[0] : mmproj, parts, registry);
}

std::optional<std::string> gguf_name_of(std::string_view canonical) { return map_gguf_name(canonical, false); }

const GgufHeader* Checkpoint::gguf() const { return gguf_ ? &gguf_->header() : nullptr; }

void Checkpoint::finish(FoundMap& found, Parts parts, const TensorRegistry& registry, std::string_view config_name,
                        const std::function<std::string(std::string_view)>& file_name) {
  std::map<std::string, TensorSpec, std::less<>> expected;
  for (TensorSpec& t : registry(config_)) expected.emplace(t.name, std::move(t));
  std::map<std::string, std::set<std::string>> dtypes;  // part -> dtype names
  for (auto it = found.begin(); it != found.end();) {
    if (!expected.count(it->first)) {
      unknown_.push_back(it->second.file_name);
      it = found.erase(it);
      continue;
    }
    dtypes[std::string(part_of(it->first))].insert(std::string(dtype_name(it->second.dtype)));
    ++it;
  }
  std::sort(unknown_.begin(), unknown_.end());
  weights_fingerprint_ = fingerprint(found);

  // Validate and map only the parts this run needs.
  auto wanted = [&](std::string_view canonical) { return part_of(canonical) == "text" ? parts.text : parts.vision; };
  for (const auto& [name, exp] : expected) {
    if (!wanted(name)) continue;
    auto it = found.find(name);
    if (it == found.end()) {
      if (!exp.required) continue;
      if (name == "lm_head.weight")
        fail("{}: tensor '{}' is missing and tie_word_embeddings is false", dir_.string(), file_name(name));
      fail("{}: missing tensor '{}' (expected shape {})", dir_.string(), file_name(name), shape_str(exp.shape));
    }
    const Found& t = it->second;
    const std::string where = naming_ == Naming::Gguf ? t.file : (dir_ / t.file).string();
    if (t.shape != exp.shape)
      fail("{}: tensor '{}' has shape {}, expected {} from {}", where, t.file_name, shape_str(t.shape),
           shape_str(exp.shape), config_name);
    TensorView v;
    v.name = name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = t.data();
    v.nbytes = size_t(t.nbytes);
    if (t.shifted) {
      // GGUF holds f32(1 + w); the models multiply by 1 + w themselves, so they get w back:
      // for stored values in [0.5, 2] the subtraction is exact (Sterbenz) and 1 + w is the
      // stored value again, bit for bit (docs/gguf.md §7).
      if (v.shape.size() != 1 || is_block_quantized(v.dtype))
        fail("{}: norm tensor '{}' is stored {} with shape {}; expected a float vector", where, t.file_name,
             dtype_name(v.dtype), shape_str(v.shape));
      auto w = std::make_shared<std::vector<float>>(v.to_f32());
      for (float& x : *w) x -= 1.0f;
      v.dtype = DType::F32;
      v.data = reinterpret_cast<const std::byte*>(w->data());
      v.nbytes = w->size() * 4;
      owned_.push_back(std::move(w));
    }
    // The decoder's norm weights are small and scale whole rows: one NaN or Inf there turns
    // every logit into NaN, so they are checked here (large matrices are not read at load;
    // the vision tower's output is checked where it joins the prompt: Engine::forward).
    if (v.shape.size() == 1 && part_of(name) == "text")
      if (const std::vector<float> f = v.to_f32(); first_non_finite(f) < f.size())
        fail("{}: tensor '{}' holds a non-finite value (NaN or Inf) at index {}", where, t.file_name,
             first_non_finite(f));
    tensors_.emplace(name, std::move(v));
    origins_.emplace(name, Origin{t.file_name, t.file});
  }

  std::set<std::string> all;
  for (const auto& [part, ds] : dtypes) all.insert(ds.begin(), ds.end());
  if (all.size() == 1) {
    weight_dtypes_ = *all.begin();
  } else {
    std::vector<std::string> per_part;
    for (const char* part : {"text", "vision", "projector"})
      if (dtypes.count(part)) per_part.push_back(fmt::format("{}={}", part, fmt::join(dtypes[part], "+")));
    weight_dtypes_ = fmt::format("{}", fmt::join(per_part, ","));
  }
}

const TensorView* Checkpoint::find(std::string_view canonical) const {
  auto it = tensors_.find(canonical);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& Checkpoint::get(std::string_view canonical) const {
  if (const TensorView* t = find(canonical)) return *t;
  fail("{}: tensor '{}' is not loaded (absent, or its part was not requested)", dir_.string(), canonical);
}

const TensorView& Checkpoint::get(std::string_view canonical, std::initializer_list<int64_t> shape) const {
  return get(canonical, std::vector<int64_t>(shape));
}

const TensorView& Checkpoint::get(std::string_view canonical, const std::vector<int64_t>& shape) const {
  const TensorView& t = get(canonical);
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end()))
    fail("{}: tensor '{}' has shape {}, expected {}", dir_.string(), canonical, shape_str(t.shape),
         shape_str(shape));
  return t;
}

std::vector<std::pair<uintptr_t, uintptr_t>> Checkpoint::page_spans() const {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const auto& [name, t] : tensors_) {
    if (t.nbytes == 0) continue;
    const auto b = reinterpret_cast<uintptr_t>(t.data);
    spans.emplace_back(b / page * page, (b + t.nbytes + page - 1) / page * page);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& [b, e] : spans)
    if (!merged.empty() && b <= merged.back().second) merged.back().second = std::max(merged.back().second, e);
    else merged.emplace_back(b, e);
  return merged;
}

void Checkpoint::map_pages() const {
  for (const auto& [b, e] : page_spans())
    ::madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_READ);  // a hint: failure leaves faults
}

void Checkpoint::lock_pages() const {
  const auto spans = page_spans();
  for (const auto& [b, e] : spans) {
    if (::mlock(reinterpret_cast<const void*>(b), e - b) == 0) continue;
    const int err = errno;
    uint64_t total = 0;
    for (const auto& [sb, se] : spans) total += se - sb;
    rlimit lim{};
    ::getrlimit(RLIMIT_MEMLOCK, &lim);
    const std::string limit =
        lim.rlim_cur == RLIM_INFINITY ? "unlimited" : fmt::format("{} KiB", uint64_t(lim.rlim_cur) / 1024);
    fail("{}: cannot lock the {:.2f} GB of weights in memory: {} (the memlock limit is {}: raise it with "
         "ulimit -l or a service's LimitMEMLOCK, or run with CAP_IPC_LOCK)",
         dir_.string(), double(total) / 1e9, std::strerror(err), limit);
  }
}

const TensorView& Checkpoint::lm_head() const {
  if (const TensorView* t = find("lm_head.weight")) return *t;
  return get("text.embed_tokens.weight");
}

std::string Checkpoint::file_name_of(std::string_view canonical) const {
  auto it = origins_.find(canonical);
  if (it == origins_.end()) fail("{}: tensor '{}' is not loaded", dir_.string(), canonical);
  return it->second.file_name;
}

std::string Checkpoint::file_of(std::string_view canonical) const {
  auto it = origins_.find(canonical);
  if (it == origins_.end()) fail("{}: tensor '{}' is not loaded", dir_.string(), canonical);
  return it->second.file;
}

}  // namespace vlm
