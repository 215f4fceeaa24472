#include "io/checkpoint.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

#include "core/error.h"
#include "io/file.h"
#include "io/identity.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace vlm {

namespace fs = std::filesystem;

std::string_view naming_name(Naming n) {
  switch (n) {
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

struct Found {
  size_t file;
  const SafetensorsEntry* entry;
};

// See Checkpoint::weights_fingerprint(). Read with pread, so unloaded parts count too.
std::string fingerprint(const fs::path& dir, const std::vector<File>& files,
                        const std::map<std::string, Found, std::less<>>& tensors) {
  constexpr uint64_t kWhole = 64 << 10, kWindow = 4 << 10, kWindows = 8;
  std::vector<std::unique_ptr<InputFile>> inputs(files.size());
  std::vector<char> buf(kWhole);
  uint64_t h = checksum64(nullptr, 0);
  for (const auto& [name, f] : tensors) {
    const SafetensorsEntry& t = *f.entry;
    const std::string table = fmt::format("{}:{}:{}\n", name, dtype_name(t.dtype), shape_str(t.shape));
    h = checksum64(table.data(), table.size(), h);
    std::unique_ptr<InputFile>& in = inputs[f.file];
    if (!in) in = std::make_unique<InputFile>(dir / files[f.file].name);
    const uint64_t base = files[f.file].header.data_offset + t.begin, bytes = t.end - t.begin;
    auto sample = [&](uint64_t off, uint64_t n) {
      in->read_at(buf.data(), size_t(n), base + off);
      h = checksum64(buf.data(), size_t(n), h);
    };
    if (bytes <= kWhole) {
      sample(0, bytes);
      continue;
    }
    for (uint64_t w = 0; w < kWindows; ++w) sample((bytes - kWindow) / (kWindows - 1) * w, kWindow);
  }
  return fmt::format("{:016x}", h);
}

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

  std::map<std::string, Found, std::less<>> found;
  for (size_t i = 0; i < files.size(); ++i) {
    for (const auto& t : files[i].header.tensors) {
      const std::optional<std::string> canonical = to_canonical(ck.naming_, t.name);
      if (canonical && ignored(t.name, *canonical)) continue;
      if (canonical && !found.emplace(*canonical, Found{i, &t}).second)
        fail("{}: tensor '{}' appears twice (as {})", dir.string(), *canonical, t.name);
      if (!canonical) ck.unknown_.push_back(t.name);
    }
  }

  std::map<std::string, TensorSpec, std::less<>> expected;
  for (TensorSpec& t : registry(cfg)) expected.emplace(t.name, std::move(t));
  std::map<std::string, std::set<std::string>> dtypes;  // part -> dtype names
  for (auto it = found.begin(); it != found.end();) {
    if (!expected.count(it->first)) {
      ck.unknown_.push_back(it->second.entry->name);
      it = found.erase(it);
      continue;
    }
    dtypes[std::string(part_of(it->first))].insert(std::string(dtype_name(it->second.entry->dtype)));
    ++it;
  }
  std::sort(ck.unknown_.begin(), ck.unknown_.end());
  ck.weights_fingerprint_ = fingerprint(dir, files, found);

  // Validate and map only the parts this run needs.
  auto wanted = [&](std::string_view canonical) { return part_of(canonical) == "text" ? parts.text : parts.vision; };
  std::vector<std::shared_ptr<MappedFile>> maps(files.size());
  for (const auto& [name, exp] : expected) {
    if (!wanted(name)) continue;
    auto it = found.find(name);
    if (it == found.end()) {
      if (!exp.required) continue;
      if (name == "lm_head.weight")
        fail("{}: tensor '{}' is missing and tie_word_embeddings is false", dir.string(),
             to_file_name(ck.naming_, name));
      fail("{}: missing tensor '{}' (expected shape {})", dir.string(), to_file_name(ck.naming_, name),
           shape_str(exp.shape));
    }
    const File& file = files[it->second.file];
    const SafetensorsEntry& t = *it->second.entry;
    if (t.shape != exp.shape)
      fail("{}: tensor '{}' has shape {}, expected {} from config.json", (dir / file.name).string(), t.name,
           shape_str(t.shape), shape_str(exp.shape));
    std::shared_ptr<MappedFile>& map = maps[it->second.file];
    if (!map) {
      map = std::make_shared<MappedFile>(dir / file.name);
      if (map->size() != file.header.data_offset + file.header.data_size)
        fail("{}: file changed size while loading", (dir / file.name).string());
      ck.files_.push_back(map);
    }
    TensorView v;
    v.name = name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = map->data() + file.header.data_offset + t.begin;
    v.nbytes = size_t(t.end - t.begin);
    // The decoder's norm weights are small and scale whole rows: one NaN or Inf there turns
    // every logit into NaN, so they are checked here (large matrices are not read at load;
    // the vision tower's output is checked where it joins the prompt: Engine::forward).
    if (v.shape.size() == 1 && part_of(name) == "text")
      if (const std::vector<float> f = v.to_f32(); first_non_finite(f) < f.size())
        fail("{}: tensor '{}' holds a non-finite value (NaN or Inf) at index {}", (dir / file.name).string(),
             t.name, first_non_finite(f));
    ck.tensors_.emplace(name, std::move(v));
    ck.origins_.emplace(name, Origin{t.name, file.name});
  }

  std::set<std::string> all;
  for (const auto& [part, ds] : dtypes) all.insert(ds.begin(), ds.end());
  if (all.size() == 1) {
    ck.weight_dtypes_ = *all.begin();
  } else {
    std::vector<std::string> per_part;
    for (const char* part : {"text", "vision", "projector"})
      if (dtypes.count(part)) per_part.push_back(fmt::format("{}={}", part, fmt::join(dtypes[part], "+")));
    ck.weight_dtypes_ = fmt::format("{}", fmt::join(per_part, ","));
  }
  return ck;
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
