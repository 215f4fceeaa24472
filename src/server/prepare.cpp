#include "server/prepare.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace vlm::server {

GenerationDefaults load_generation_defaults(const std::filesystem::path& dir) {
  GenerationDefaults d;
  const std::filesystem::path f = dir / "generation_config.json";
  if (!std::filesystem::exists(f)) return d;
  const nlohmann::json j = parse_json(read_text_file(f, 1 << 20), f.string());
  auto num = [&](const char* key, auto& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number()) fail("{}: '{}' must be a number", f.string(), key);
    out = it->get<std::remove_reference_t<decltype(out)>>();
  };
  if (auto it = j.find("do_sample"); it != j.end() && it->is_boolean()) d.do_sample = it->get<bool>();
  num("temperature", d.temperature);
  num("top_p", d.top_p);
  num("top_k", d.top_k);
  num("min_p", d.min_p);
  num("repetition_penalty", d.repetition_penalty);
  return d;
}

namespace {

std::vector<vision::RgbImage> decode_images(std::vector<ImageRef>& refs, const PrepareLimits& limits) {
  std::vector<vision::RgbImage> out;
  for (ImageRef& r : refs) {
    try {
      out.push_back(r.path.empty() ? vision::decode_image(r.bytes, r.param, limits.decode)
                                   : vision::load_image(r.path, limits.decode));
    } catch (const Error& e) {
      refuse(400, fmt::format("'{}': the image could not be used: {}", r.param, e.what()), r.param, "invalid_image");
    }
    r.bytes = {};
    if (out.back().width < 1 || out.back().height < 1)
      refuse(400, fmt::format("'{}': the image has no pixels", r.param), r.param, "invalid_image");
  }
  return out;
}

}  // namespace

std::vector<vision::RgbImage> request_images(const engine::Model& model, ApiRequest& r, const PrepareLimits& limits) {
  if (!r.images.empty() && !model.has_vision())
    refuse(400, fmt::format("this model ({}) takes no images: it has no vision tower", model.config().architecture),
           r.images.front().param, "images_not_supported");
  return decode_images(r.images, limits);
}

std::vector<int32_t> prompt_ids(const engine::Model& model, const ApiRequest& r, size_t i,
                                const std::vector<vision::RgbImage>& images) {
  try {
    if (r.endpoint == Endpoint::Chat) return model.chat_prompt(r.messages, images, r.chat_end);
    const Prompt& p = r.prompts.at(i);
    return p.ids ? *p.ids : model.raw_prompt(p.text, images);
  } catch (const Error& e) {
    refuse(400, e.what(), r.endpoint == Endpoint::Chat ? "messages" : "prompt");
  }
}

std::vector<engine::Request> prepare_requests(const engine::Model& model, ApiRequest& r,
                                              const GenerationDefaults& defaults, const PrepareLimits& limits) {
  const std::vector<vision::RgbImage> images = request_images(model, r, limits);
  const size_t prompts = r.endpoint == Endpoint::Chat ? 1 : r.prompts.size();
  const char* prompt_param = r.endpoint == Endpoint::Chat ? "messages" : "prompt";
  std::vector<engine::Request> out;
  for (size_t i = 0; i < prompts; ++i) {
    engine::Request req;
    req.prompt = prompt_ids(model, r, i, images);
    if (const text::Tokenizer* tok = model.tokenizer())  // a chat needs one; a prompt of ids may not
      req.edit_from = r.endpoint == Endpoint::Chat ? text::last_user_turn(r.messages, req.prompt, *tok)
                                                   : text::last_user_turn(req.prompt, *tok);
    req.images = images;
    const int64_t ctx = model.context(), n = int64_t(req.prompt.size());
    if (n >= ctx || (r.max_tokens && n + *r.max_tokens > ctx))
      refuse(400,
             fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
                         "the {}, {} for the completion). Please reduce the length of the {} or the completion.",
                         ctx, n + r.max_tokens.value_or(1), n, prompt_param, r.max_tokens.value_or(1), prompt_param),
             r.max_tokens && n < ctx ? r.max_tokens_param : prompt_param, "context_length_exceeded");
    // Chat default: until a stop token or the end of the context; completions: 16 (OpenAI, vLLM).
    req.max_tokens = r.max_tokens.value_or(r.endpoint == Endpoint::Chat ? int(ctx - n) : 16);

    SamplingParams& s = req.sampling;
    s.temperature = r.temperature.value_or(defaults.do_sample ? defaults.temperature : 0.f);
    s.top_p = r.top_p.value_or(defaults.do_sample ? defaults.top_p : 1.f);
    s.top_k = r.top_k.value_or(defaults.do_sample ? defaults.top_k : 0);
    s.min_p = r.min_p.value_or(defaults.do_sample ? defaults.min_p : 0.f);
    s.repetition_penalty = r.repetition_penalty.value_or(defaults.repetition_penalty);
    s.presence_penalty = r.presence_penalty.value_or(0.f);
    s.frequency_penalty = r.frequency_penalty.value_or(0.f);
    s.logit_bias = r.logit_bias;
    s.vocab_limit = model.vocab_limit();  // so that validate_request refuses ids outside it
    req.stop_strings = r.stop;
    req.response_schema = r.response_schema;
    req.ignore_eos = r.ignore_eos;
    req.stop_ids = r.stop_token_ids;
    for (int32_t id : req.stop_ids)
      if (id >= model.vocab())
        refuse(400, fmt::format("'stop_token_ids' has {}, outside the vocabulary [0, {})", id, model.vocab()),
               "stop_token_ids");
    req.min_tokens = r.min_tokens;
    req.include_stop_string = r.include_stop_str_in_output;
    req.top_logprobs = r.top_logprobs;
    // Completions with echo and logprobs score the prompt too (OpenAI's legacy API), as does vLLM's
    // prompt_logprobs; the engine gives the larger number of alternatives asked.
    req.prompt_logprobs = std::max(r.endpoint == Endpoint::Completion && r.echo ? r.top_logprobs : -1, r.prompt_logprobs);
    try {
      engine::validate_request(model, req);
    } catch (const Error& e) {
      refuse(400, e.what(), r.endpoint == Endpoint::Completion && r.prompts[i].ids ? "prompt" : "");
    }
    for (int j = 0; j < r.n; ++j) {
      // Without a seed every choice draws its own (OpenAI); with one, the same tokens every time.
      s.seed = r.seed ? *r.seed + uint64_t(j) : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
      out.push_back(req);
    }
  }
  return out;
}

}  // namespace vlm::server
