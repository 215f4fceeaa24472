// `vlm inspect`: what a checkpoint folder holds and the identity it implies.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/checkpoint.h"
#include "models/gemma3/registry.h"
#include "io/identity.h"

namespace vlm::cli {

namespace {

using ojson = nlohmann::ordered_json;

const char* const kParts[] = {"text", "vision", "projector"};

struct Totals {
  std::map<std::string, int64_t> params, bytes;
};

Totals totals(const Checkpoint& ck) {
  Totals t;
  for (const char* p : kParts) t.params[p] = t.bytes[p] = 0;
  for (const auto& [name, v] : ck.tensors()) {
    const std::string part(part_of(name));
    t.params[part] += v.numel();
    t.bytes[part] += int64_t(v.nbytes);
  }
  for (auto* m : {&t.params, &t.bytes}) {
    int64_t sum = 0;
    for (const char* p : kParts) sum += (*m)[p];
    (*m)["total"] = sum;
  }
  return t;
}

ojson to_json(const Checkpoint& ck, const Identity& id, bool checksums) {
  const ModelConfig& c = ck.config();
  const TextConfig& t = c.text;
  ojson j;
  j["architecture"] = c.architecture;
  j["arch"] = c.is_vlm() ? "ConditionalGeneration" : "CausalLM";
  j["naming"] = naming_name(ck.naming());
  ojson kinds = ojson::array();
  for (LayerKind k : t.layer_kinds) kinds.push_back(layer_kind_name(k));
  j["text"] = {{"vocab_size", t.vocab_size},
               {"hidden_size", t.hidden_size},
               {"intermediate_size", t.intermediate_size},
               {"num_layers", t.num_layers},
               {"num_heads", t.num_heads},
               {"num_kv_heads", t.num_kv_heads},
               {"head_dim", t.head_dim},
               {"query_pre_attn_scalar", t.query_pre_attn_scalar},
               {"rms_norm_eps", t.rms_norm_eps},
               {"max_position_embeddings", t.max_position_embeddings},
               {"sliding_window", t.sliding_window},
               {"rope_theta", t.rope_theta},
               {"rope_local_base_freq", t.rope_local_base_freq},
               {"rope_scaling_factor", t.rope_scaling_factor},
               {"layer_kinds", kinds}};
  if (c.vision) {
    const VisionConfig& v = *c.vision;
    j["vision"] = {{"hidden_size", v.hidden_size}, {"intermediate_size", v.intermediate_size},
                   {"num_layers", v.num_layers},   {"num_heads", v.num_heads},
                   {"image_size", v.image_size},   {"patch_size", v.patch_size},
                   {"layer_norm_eps", v.layer_norm_eps}};
    j["mm_tokens_per_image"] = c.mm_tokens_per_image;
  } else {
    j["vision"] = nullptr;
    j["mm_tokens_per_image"] = nullptr;
  }

  ojson tensors = ojson::array();
  for (const auto& [name, v] : ck.tensors()) {  // std::map: sorted by canonical name
    ojson e = {{"name", name},
               {"file_name", ck.file_name_of(name)},
               {"file", ck.file_of(name)},
               {"dtype", dtype_name(v.dtype)},
               {"shape", v.shape},
               {"nbytes", v.nbytes}};
    if (checksums) {
      e["fnv1a64"] = fmt::format("{:016x}", fnv1a64(v.data, v.nbytes));
      double sum = 0;
      for (int64_t i = 0; i < v.numel(); ++i) sum += double(v.at(i));
      e["sum"] = sum;
    }
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  j["unknown_tensors"] = ck.unknown();

  const Totals tot = totals(ck);
  for (const char* key : {"params", "bytes"}) {
    const auto& m = key[0] == 'p' ? tot.params : tot.bytes;
    j[key] = ojson::object();
    for (const char* p : {"text", "vision", "projector", "total"}) j[key][p] = m.at(p);
  }
  ojson fields = ojson::object();
  for (const auto& [k, v] : id.fields) fields[k] = v;
  j["identity"] = {{"hash", id.hash_hex()}, {"fields", std::move(fields)}};
  return j;
}

void print_human(const Checkpoint& ck, const Identity& id) {
  const ModelConfig& c = ck.config();
  const TextConfig& t = c.text;
  std::printf("model:        %s\n", ck.dir().string().c_str());
  std::printf("architecture: %s\n", c.architecture.c_str());
  std::printf("naming:       %s\n", std::string(naming_name(ck.naming())).c_str());
  std::printf("weights:      %s\n", ck.weight_dtypes().c_str());
  std::printf("\ntext: vocab %d, hidden %d, intermediate %d, %d layers, %d heads / %d kv heads x %d, "
              "query_pre_attn_scalar %g, rms_norm_eps %g, context %d\n",
              t.vocab_size, t.hidden_size, t.intermediate_size, t.num_layers, t.num_heads, t.num_kv_heads,
              t.head_dim, t.query_pre_attn_scalar, t.rms_norm_eps, t.max_position_embeddings);
  std::printf("      sliding window %d; rope global base %g (%s x%g), local base %g; lm_head %s\n",
              t.sliding_window, t.rope_theta, t.rope_scaling_type.c_str(), t.rope_scaling_factor,
              t.rope_local_base_freq, ck.find("lm_head.weight") ? "explicit" : "tied to embed_tokens");
  std::printf("layers:");
  for (size_t i = 0; i < t.layer_kinds.size(); ++i)
    std::printf("%s %zu:%s", i % 8 ? "" : "\n ", i, std::string(layer_kind_name(t.layer_kinds[i])).c_str());
  std::printf("\n");
  if (c.vision) {
    const VisionConfig& v = *c.vision;
    std::printf("\nvision: image %d, patch %d (%dx%d patches), hidden %d, intermediate %d, %d layers, %d heads, "
                "layer_norm_eps %g\n",
                v.image_size, v.patch_size, v.patches_per_side(), v.patches_per_side(), v.hidden_size,
                v.intermediate_size, v.num_layers, v.num_heads, v.layer_norm_eps);
    std::printf("projector: %d tokens per image (pool kernel %d), [%d, %d]\n", c.mm_tokens_per_image,
                c.pool_kernel(), v.hidden_size, t.hidden_size);
  }
  const Totals tot = totals(ck);
  std::printf("\n%-10s %16s %16s\n", "part", "params", "bytes");
  for (const char* p : {"text", "vision", "projector", "total"})
    std::printf("%-10s %16lld %16lld\n", p, (long long)tot.params.at(p), (long long)tot.bytes.at(p));
  std::printf("\nunknown tensors: %zu\n", ck.unknown().size());
  for (const std::string& u : ck.unknown()) std::printf("  %s\n", u.c_str());
  std::printf("\nidentity %s\n", id.hash_hex().c_str());
  for (const auto& [k, v] : id.fields) std::printf("  %-28s %s\n", k.c_str(), v.c_str());
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"Describe a checkpoint folder: config, tensors, sizes, compatibility identity", argv[0]};
  std::string model;
  bool json = false, checksums = false, text_only = false;
  app.add_option("--model", model, "checkpoint folder")->required();
  app.add_flag("--json", json, "machine-readable output");
  app.add_flag("--checksums", checksums, "add per-tensor FNV-1a 64 and element sums (reads every byte)");
  app.add_flag("--text-only", text_only, "load only the text decoder (vision tensors untouched)");
  CLI11_PARSE(app, argc, argv);

  const Checkpoint ck = models::gemma3::open_checkpoint(model, Parts{true, !text_only});
  const ModelConfig& c = ck.config();
  Identity id = make_identity(ck, default_mask_mode(c), default_scaling_policy(ck.get("text.embed_tokens.weight").dtype));
  add_precision(id, default_precision(models::gemma3::layer_tensor(ck, 0, models::gemma3::LayerTensor::Q).dtype));
  if (json)
    std::printf("%s\n", to_json(ck, id, checksums).dump(1).c_str());
  else
    print_human(ck, id);
  return 0;
}

}  // namespace vlm::cli
