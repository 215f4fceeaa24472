#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/tensor.h"
#include "engine/draft.h"
#include "engine/prompt_cache.h"

namespace vlm::engine {

// A run of prompt rows [begin, end) of one sequence in this step's pass.
struct Engine::Chunk {
  Sequence* seq;
  size_t begin, end;
};

Engine::Engine(const Model& model, StepBudget budget)
    : model_(model),
      budget_(budget),
      image_cache_(budget.image_cache_bytes),
      prefix_cache_(budget.prefix_cache_bytes) {
  if (budget.prefill_rows < 1) fail("prefill rows per step must be >= 1, got {}", budget.prefill_rows);
  if (budget.images < 1) fail("images per step must be >= 1, got {}", budget.images);
  if (budget.vision_layers < 0) fail("vision layers per step must be >= 0, got {}", budget.vision_layers);
  if (budget.max_seqs < 0) fail("max sequences must be >= 0, got {}", budget.max_seqs);
}

Engine::~Engine() {
  // Whatever is left ends here, so on_finish still comes exactly once.
  std::deque<std::shared_ptr<Sequence>> inbox;
  {
    std::lock_guard lock(inbox_mu_);
    inbox.swap(inbox_);
  }
  for (auto* list : {&inbox, &queue_})
    for (auto& s : *list) finish(*s, FinishReason::Cancelled);
  for (auto& s : active_) finish(*s, FinishReason::Cancelled);
}

void Engine::add(std::shared_ptr<Sequence> seq) {
  if (!seq) fail("Engine::add: null sequence");
  if (&seq->model() != &model_) fail("Engine::add: the sequence was made for another model");
  std::lock_guard lock(inbox_mu_);
  inbox_.push_back(std::move(seq));
  waiting_.fetch_add(1);
}

void Engine::run_until_idle() {
  while (!idle()) step();
}

void Engine::fail_request(Sequence& s, const std::string& message) {
  s.error_ = message;
  finish(s, FinishReason::Error);
}

void Engine::finish(Sequence& s, FinishReason r) {
  if (s.phase() == Phase::Finished) return;
  if (r != FinishReason::Error && s.cb_.on_text) {
    std::string tail;
    if (s.detok_) {
      const std::string rest = s.detok_->finish();  // an unfinished character at the end
      if (s.stops_ && !s.stops_->stopped()) tail = s.stops_->feed(rest, s.may_stop_at(s.tokens_.size()));
    }
    if (s.stops_) tail += s.stops_->flush();
    if (!tail.empty()) s.cb_.on_text(tail);
  }
  s.finish_ = r;
  if (r == FinishReason::Stop || r == FinishReason::Length) drop_draft(s);
  // A finished answer's rows serve the next turn of its chat (PrefixCache): its ids are the prompt
  // and the generated tokens already in the cache.
  if (budget_.prefix_cache_bytes > 0 && (r == FinishReason::Stop || r == FinishReason::Length) && s.cache_ &&
      !whole_prompt() && size_t(s.cache_->length()) >= s.req_.prompt.size() &&
      size_t(s.cache_->length()) - s.req_.prompt.size() <= s.tokens_.size()) {
    std::vector<int32_t> ids = s.ids();
    ids.resize(size_t(s.cache_->length()));
    prefix_cache_.put(std::move(ids), block_keys(s.image_keys_, s.crops_), std::move(*s.cache_));
    prefix_cache_bytes_.store(prefix_cache_.bytes());
  }
  s.cache_.reset();  // the KV memory goes now, whatever holds the Sequence
  kv_reserved_.fetch_sub(s.kv_reserved_);
  s.kv_reserved_ = 0;
  s.features_ = {};
  s.encode_.reset();
  s.logits_ = {};
  s.phase_.store(Phase::Finished, std::memory_order_release);
  if (s.cb_.on_finish) s.cb_.on_finish(r, s.usage_);
}

bool Engine::start(Sequence& s) {
  const Request& req = s.req_;
  const ModelConfig& mc = model_.config();
  try {
    validate_request(model_, req);
    s.usage_.prompt_tokens = int(req.prompt.size());
    if (mc.is_vlm())
      s.usage_.image_tokens = int(std::count(req.prompt.begin(), req.prompt.end(), mc.image_token_id));
    if (!req.ignore_eos) s.stop_ids_.assign(mc.eos_token_ids.begin(), mc.eos_token_ids.end());
    s.stop_ids_.insert(s.stop_ids_.end(), req.stop_ids.begin(), req.stop_ids.end());
    SamplingParams sp = req.sampling;
    if (sp.vocab_limit == 0) sp.vocab_limit = model_.vocab_limit();
    s.sampler_.emplace(sp);
    s.sampler_->add_prompt(req.prompt);
    if (const text::Tokenizer* tok = model_.tokenizer()) {
      s.detok_.emplace(*tok, text::DecodeOptions{.skip_special = true});
      s.stops_.emplace(req.stop_strings, req.include_stop_string);
    }
    if (req.response_schema) s.matcher_.emplace(req.response_schema);
    if (req.prefilled) {
      s.cache_.emplace(std::move(req.prefilled->cache));
      s.logits_ = std::move(req.prefilled->logits);
      s.req_.prefilled.reset();
      s.phase_.store(Phase::Decode, std::memory_order_release);
      return true;
    }
    if (!req.prompt_cache.empty()) {
      // The same request under the same identity resumes from the file: no vision tower, no
      // prefill. Another identity is refused, naming the fields.
      s.request_hash_ = request_hash(req.prompt, req.images);
      if (std::filesystem::exists(req.prompt_cache)) {
        std::optional<SavedPrefill> saved = load_prompt_cache(req.prompt_cache, model_.identity(), s.request_hash_,
                                                              mc.text, model_.context(),
                                                              model_.decoder().kv_dtype(), model_.vocab());
        if (saved) {
          saved->cache.limit_context(kv_positions(model_, req));  // within its reservation
          s.cache_.emplace(std::move(saved->cache));
          s.logits_ = std::move(saved->logits);
          s.usage_.cached_tokens = s.usage_.prompt_tokens;
          s.phase_.store(Phase::Decode, std::memory_order_release);
          return true;
        }
      }
    }
    s.crops_ = model_.crops_of(req.images);
    if (budget_.image_cache_bytes > 0 || budget_.prefix_cache_bytes > 0)
      for (const vision::RgbImage& im : req.images) s.image_keys_.push_back(image_key(im));
    s.cache_.emplace(model_.decoder().new_cache(kv_positions(model_, req)));  // never more than its reservation
    s.cache_->keep_overwritten(whole_prompt() ? budget_.draft_tokens : logged_rows(req, budget_.row_log()));
    if (restore_prompt(s)) return true;
    take_prefix(s);
    s.phase_.store(s.images_done_ == req.images.size() ? Phase::Prefill : Phase::Encoding, std::memory_order_release);
  } catch (const Error& e) {
    fail_request(s, e.what());
    return false;
  }
  return true;
}

bool Engine::whole_prompt() const {
  return model_.host_options().mask_mode == MaskMode::Mlx && model_.host_options().fault != Fault::CausalMask;
}

bool Engine::takes_prefixes(const Sequence& s) const {
  return budget_.prefix_cache_bytes > 0 && !whole_prompt() && s.req_.prompt_logprobs < 0;
}

bool Engine::restore_prompt(Sequence& s) {
  if (!takes_prefixes(s)) return false;
  const PrefixCache::Prompt p = prefix_cache_.find_prompt(s.req_.prompt, block_keys(s.image_keys_, s.crops_));
  if (!p.cache) return false;
  s.cache_->copy_prefix(*p.cache, p.cache->length());
  s.logits_ = *p.logits;
  s.usage_.cached_tokens = s.usage_.prompt_tokens;
  s.images_done_ = s.req_.images.size();
  s.phase_.store(Phase::Decode, std::memory_order_release);
  return true;
}

void Engine::keep_prompt(Sequence& s) {
  if (!takes_prefixes(s)) return;
  KvCache copy = model_.decoder().new_cache(s.cache_->length());
  copy.keep_overwritten(s.cache_->logged());  // so that it gives back shorter prompts too
  copy.copy_prefix(*s.cache_, s.cache_->length());
  prefix_cache_.put(s.req_.prompt, block_keys(s.image_keys_, s.crops_), std::move(copy), s.logits_);
  prefix_cache_bytes_.store(prefix_cache_.bytes());
}

void Engine::take_prefix(Sequence& s) {
  if (!takes_prefixes(s)) return;
  const ModelConfig& mc = model_.config();
  const int32_t image_id = mc.is_vlm() ? mc.image_token_id : -1;
  const PrefixCache::Match m = prefix_cache_.find(s.req_.prompt, block_keys(s.image_keys_, s.crops_), image_id, *s.cache_);
  if (m.positions == 0) return;
  s.cache_->copy_prefix(*m.cache, m.positions);
  s.prefilled_rows_ = size_t(m.positions);
  s.usage_.cached_tokens = int(m.positions);
  // The images whose blocks lie in the taken rows (whole images only: PrefixCache::find) are not
  // encoded; the rows of the others follow them in features_.
  const auto taken_end = s.req_.prompt.begin() + m.positions;
  s.taken_image_rows_ = size_t(std::count(s.req_.prompt.begin(), taken_end, image_id));
  for (size_t covered = 0; s.images_done_ < s.crops_.size(); ++s.images_done_) {
    covered += 1 + size_t(s.crops_[s.images_done_]);
    if (covered > m.blocks) break;
  }
}

// Requests that run at the same time often share a prefix (several questions about one image, a
// batch's system prompt), which the prefix cache, holding finished sequences only, cannot give
// them. Before a prefill chunk, a sequence takes the rows a running one (or the prefix cache)
// holds beyond its own, and waits while an earlier one is still computing rows it shares, rather
// than computing them twice. Its images were encoded before (from the image cache when the earlier
// one encoded them), so its features cover every image and no image bookkeeping changes.
bool Engine::share_prefix(Sequence& s) {
  if (!takes_prefixes(s)) return false;
  const ModelConfig& mc = model_.config();
  const int32_t image_id = mc.is_vlm() ? mc.image_token_id : -1;
  const std::vector<BlockKey> blocks = block_keys(s.image_keys_, s.crops_);
  const KvCache* from = nullptr;
  int64_t best = int64_t(s.prefilled_rows_), coming = 0;  // coming: what earlier ones are computing
  bool earlier = true;
  for (auto& ap : active_) {
    Sequence& a = *ap;
    if (&a == &s) {
      earlier = false;
      continue;
    }
    if (!a.cache_ || a.phase() == Phase::Queued || a.phase() == Phase::Finished) continue;
    // a's ids at the positions its prompt will fill, and at those its cache holds.
    std::vector<int32_t> held = a.ids();
    const std::vector<BlockKey> held_blocks = block_keys(a.image_keys_, a.crops_);
    const size_t later = shared_prefix(held, held_blocks, s.req_.prompt, blocks, image_id);
    held.resize(std::min(held.size(), size_t(a.cache_->length())));
    const int64_t now = int64_t(shared_prefix(held, held_blocks, s.req_.prompt, blocks, image_id));
    if (now > best && s.cache_->can_copy_prefix(*a.cache_, now)) from = &*a.cache_, best = now;
    if (earlier && (a.phase() == Phase::Encoding || a.phase() == Phase::Prefill)) coming = std::max(coming, int64_t(later));
  }
  const PrefixCache::Match m = prefix_cache_.find(s.req_.prompt, blocks, image_id, *s.cache_);
  if (m.positions > best) from = m.cache, best = m.positions;
  if (from) {
    s.cache_->copy_prefix(*from, best);
    s.prefilled_rows_ = size_t(best);
    s.usage_.cached_tokens = int(best);
  }
  return coming > best;
}

void Engine::admit(StepStats& st) {
  std::deque<std::shared_ptr<Sequence>> inbox;
  {
    std::lock_guard lock(inbox_mu_);
    inbox.swap(inbox_);
  }
  for (auto& s : inbox) queue_.push_back(std::move(s));
  // Cancelled sequences go first, wherever they are.
  for (auto* list : {&queue_})
    std::erase_if(*list, [&](const std::shared_ptr<Sequence>& s) {
      if (!s->cancel_requested()) return false;
      finish(*s, FinishReason::Cancelled);
      ++st.finished;
      return true;
    });
  for (auto& s : active_)
    if (s->cancel_requested()) {
      finish(*s, FinishReason::Cancelled);
      ++st.finished;
    }
  std::erase_if(active_, [](const std::shared_ptr<Sequence>& s) { return s->phase() == Phase::Finished; });
  while (!queue_.empty() && (budget_.max_seqs == 0 || active_.size() < size_t(budget_.max_seqs))) {
    const size_t need = kv_reservation(model_, queue_.front()->req_, budget_.row_log());
    const bool never = budget_.kv_bytes > 0 && need > budget_.kv_bytes;
    if (!never && budget_.kv_bytes > 0 && kv_reserved_.load() + need > budget_.kv_bytes) break;  // waits in order
    std::shared_ptr<Sequence> s = std::move(queue_.front());
    queue_.pop_front();
    ++st.admitted;
    if (never) {
      fail_request(*s, kv_budget_error(model_, s->req_, budget_.kv_bytes, budget_.row_log()));
      ++st.finished;
      continue;
    }
    s->kv_reserved_ = need;
    kv_reserved_.fetch_add(need);
    if (!start(*s)) {
      ++st.finished;
      continue;
    }
    active_.push_back(s);
    if (s->phase() == Phase::Decode) sample(*s);  // a restored prefill: its first token now
  }
}

void Engine::encode_images(StepStats& st) {
  const vision::VisionEncoder* enc = model_.vision();
  // Bounded even when nothing else runs: a request that arrives mid-encode waits one step only.
  size_t layers = budget_.vision_layers > 0 ? size_t(budget_.vision_layers) : SIZE_MAX;
  // The image's rows are the sequence's next ones; with that its encoding phase may end.
  auto append = [&](Sequence& s, const std::vector<float>& rows) {
    s.features_.insert(s.features_.end(), rows.begin(), rows.end());
    if (++s.images_done_ == s.req_.images.size()) s.phase_.store(Phase::Prefill, std::memory_order_release);
  };
  for (auto& sp : active_) {
    Sequence& s = *sp;
    while (s.phase() == Phase::Encoding) {
      const bool keyed = !s.image_keys_.empty();
      if (!s.encode_) {
        if (const std::vector<float>* rows = keyed ? image_cache_.find(s.image_keys_[s.images_done_]) : nullptr) {
          append(s, *rows);  // the vision tower's own output for these pixels: nothing to run
          ++st.images_cached;
          continue;
        }
        if (st.images >= budget_.images || layers == 0) break;
        s.encode_ = enc->start({s.req_.images[s.images_done_]}, model_.exec(), model_.options().pan_and_scan);
      }
      layers -= std::min(layers, enc->advance(*s.encode_, layers, model_.exec()));
      if (!s.encode_->done) break;  // this step's layers are spent
      const std::vector<float>& f = s.encode_->result.features;
      if (keyed) {
        image_cache_.put(s.image_keys_[s.images_done_], f);
        image_cache_bytes_.store(image_cache_.bytes());
      }
      append(s, f);
      s.encode_.reset();
      ++st.images;
    }
    if (st.images >= budget_.images || layers == 0) break;
  }
}

namespace {
// Where a prompt chunk starting at `begin` may end within `budget` rows: never inside an image
// block (its rows attend to each other, so they share one chunk), and under the mlx mode (every
// prompt row sees every other) only at the prompt's end. 0 = nothing fits.
size_t chunk_end(std::span<const int32_t> ids, size_t begin, size_t budget, int32_t image_id, bool whole) {
  const size_t n = ids.size();
  if (whole) return begin == 0 && n <= budget ? n : 0;
  size_t end = std::min(n, begin + budget);
  while (end < n && end > begin && ids[end - 1] == image_id && ids[end] == image_id) --end;
  return end > begin && !(end < n && ids[end] == image_id && ids[end - 1] == image_id) ? end : 0;
}

// How far a block that cannot be cut extends from `begin` (an oversized first chunk).
size_t unit_end(std::span<const int32_t> ids, size_t begin, int32_t image_id, bool whole) {
  if (whole) return ids.size();
  size_t end = begin + 1;
  while (end < ids.size() && ids[end] == image_id && ids[end - 1] == image_id) ++end;
  return end;
}
}  // namespace

StepStats Engine::step() {
  StepStats st;
  admit(st);

  // Decode rows: every running sequence with a sampled token not yet in its cache.
  std::vector<Sequence*> decode;
  for (auto& s : active_)
    if (s->phase() == Phase::Decode && s->pending_ >= 0) decode.push_back(s.get());
  // Prompt chunks within the row budget, in admission order.
  const ModelConfig& mc = model_.config();
  const int32_t image_id = mc.is_vlm() ? mc.image_token_id : -1;
  const bool whole = whole_prompt();
  std::vector<Chunk> chunks;
  size_t left = size_t(budget_.prefill_rows);
  for (auto& sp : active_) {
    Sequence& s = *sp;
    if (s.phase() != Phase::Prefill || left == 0 || share_prefix(s)) continue;
    const std::span<const int32_t> ids(s.req_.prompt);
    const size_t rows = s.req_.prompt_logprobs >= 0 ? std::min(left, kPromptLogprobRows) : left;
    size_t end = chunk_end(ids, s.prefilled_rows_, rows, image_id, whole);
    // A block larger than the whole budget goes alone, so every prompt makes progress.
    if (end == 0 && chunks.empty() && left == size_t(budget_.prefill_rows))
      end = unit_end(ids, s.prefilled_rows_, image_id, whole);
    if (end == 0) break;  // keep admission order: later prompts wait for this one
    chunks.push_back({&s, s.prefilled_rows_, end});
    left -= std::min(left, end - s.prefilled_rows_);
    st.prefill_rows += int(end - s.prefilled_rows_);
  }
  // Drafts take what the prompt chunks leave.
  if (budget_.draft_tokens > 0)
    for (Sequence* s : decode) left -= draft(*s, left, decode.size());
  st.decode_rows = int(decode.size());
  st.prefill_seqs = int(chunks.size());

  if (!decode.empty() || !chunks.empty()) {
    try {
      const auto t0 = std::chrono::steady_clock::now();
      forward(decode, chunks);
      // Passes of decode rows alone time what a row costs (RowCost).
      if (chunks.empty() && budget_.draft_tokens > 0 && !budget_.draft_row_cost) {
        size_t rows = 0;
        for (const Sequence* s : decode) rows += 1 + s->draft_.size();
        row_cost_.pass(rows, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    } catch (const Error& e) {
      // The pass failed as a whole: every sequence in it ends with the message.
      for (Sequence* s : decode) fail_request(*s, e.what());
      for (const Chunk& c : chunks) fail_request(*c.seq, e.what());
    }
    for (Sequence* s : decode)
      if (s->phase() == Phase::Decode) sample_draft(*s, st);
    for (const Chunk& c : chunks) {
      Sequence& s = *c.seq;
      if (s.phase() != Phase::Prefill || s.prefilled_rows_ < s.req_.prompt.size()) continue;
      s.features_ = {};
      s.phase_.store(Phase::Decode, std::memory_order_release);
      keep_prompt(s);
      if (!s.req_.prompt_cache.empty()) {
        try {
          save_prompt_cache(s.req_.prompt_cache, model_.identity(), s.request_hash_, mc.text, *s.cache_, s.logits_);
        } catch (const std::exception& e) {
          fail_request(s, e.what());
          continue;
        }
      }
      sample(s);
    }
  }
  // Vision work last: the tokens above go out before this step's tower layers run.
  encode_images(st);
  for (auto& s : active_)
    if (s->phase() == Phase::Finished) ++st.finished;
  std::erase_if(active_, [](const std::shared_ptr<Sequence>& s) { return s->phase() == Phase::Finished; });
  update_counters();
  return st;
}

// One pass through the decoder's batch door: a decode row for each sequence in `decode` (its
// sampled token at its next position, no mask; with a draft, the draft's rows after it, each
// seeing what a step of its own would), then each prompt chunk's rows (merged prompt rows with
// their MaskSpec); logits for the decode and draft rows and for the last row of a prompt.
void Engine::forward(const std::vector<Sequence*>& decode, const std::vector<Chunk>& chunks) {
  const models::gemma3::Decoder& dec = model_.decoder();
  const ModelConfig& mc = model_.config();
  const HostOptions& host = model_.host_options();
  const size_t H = size_t(mc.text.hidden_size), V = size_t(model_.vocab());
  const int32_t image_id = mc.is_vlm() ? mc.image_token_id : -1;
  size_t n = 0;
  for (const Sequence* s : decode) n += 1 + s->draft_.size();
  for (const Chunk& c : chunks) n += c.end - c.begin;
  if (!act_ || act_->max_rows < n)  // grows geometrically, so a steady batch allocates nothing
    act_ = std::make_unique<models::gemma3::Activations>(mc.text, std::max(n, act_ ? 2 * act_->max_rows : size_t(0)));
  embeds_.resize(n * H);
  pos_.resize(n);
  seq_.resize(n);
  want_.resize(n);
  ids_.clear();
  slots_.clear();
  size_t row = 0;
  for (Sequence* s : decode) {
    ids_.push_back(s->pending_);
    ids_.insert(ids_.end(), s->draft_.begin(), s->draft_.end());
    for (size_t i = 0; i <= s->draft_.size(); ++i, ++row) {
      pos_[row] = s->cache_->length() + int64_t(i);
      seq_[row] = int32_t(slots_.size());
      want_[row] = 1;
    }
    slots_.push_back({&*s->cache_, nullptr});
  }
  size_t wanted = row;
  dec.embedder().embed(ids_, embeds_.data());
  // MaskSpecs (and the dense masks of a test fault) stay put while the pass runs.
  std::vector<models::MaskSpec> specs(chunks.size());
  std::vector<PrefillMasks> dense(chunks.size());
  for (size_t k = 0; k < chunks.size(); ++k) {
    const Chunk& c = chunks[k];
    Sequence& s = *c.seq;
    const std::span<const int32_t> prompt(s.req_.prompt);
    const std::span<const int32_t> ids = prompt.subspan(c.begin, c.end - c.begin);
    // The features of the images whose blocks lie in this chunk.
    const size_t f0 =
        (size_t(std::count(prompt.begin(), prompt.begin() + std::ptrdiff_t(c.begin), image_id)) - s.taken_image_rows_) * H;
    const size_t nf = size_t(std::count(ids.begin(), ids.end(), image_id)) * H;
    if (f0 + nf > s.features_.size())  // an engine bug, never a request's: fail the pass, not memory
      fail("forward: image rows {}..{} of a chunk, {} encoded", f0 / H, (f0 + nf) / H, s.features_.size() / H);
    const std::vector<float> rows =
        prefill_rows(dec.embedder(), mc, ids, int(ids.size()), std::span<const float>(s.features_).subspan(f0, nf), host);
    std::copy(rows.begin(), rows.end(), embeds_.begin() + std::ptrdiff_t(row * H));
    specs[k] = prefill_mask_spec(mc, ids, host, dense[k]);
    const int64_t P = s.cache_->length();
    for (size_t i = 0; i < ids.size(); ++i, ++row) {
      pos_[row] = P + int64_t(i);
      seq_[row] = int32_t(slots_.size());
      want_[row] = (c.end == prompt.size() && i + 1 == ids.size()) || s.req_.prompt_logprobs >= 0;
      wanted += want_[row];
    }
    slots_.push_back({&*s.cache_, &specs[k]});
  }
  logits_.resize(wanted * V);
  const models::Batch b{embeds_.data(), n, pos_.data(), seq_.data(), want_.data(), -1};
  // NaN/Inf from bad weights, config values or inputs would otherwise be sampled silently;
  // the residual stream is checked as it leaves each layer, so the error names the first.
  bad_layer_.assign(slots_.size(), kFinite);
  for (size_t r = 0; r < n; ++r)
    if (first_non_finite({embeds_.data() + r * H, H}) < H) bad_layer_[size_t(seq_[r])] = kBadInput;
  const models::Observer watch = [this](std::string_view name, int layer, const float* x, size_t rows,
                                        size_t cols) {
    if (name != "l_out") return;
    for (size_t r = 0; r < rows; ++r)
      if (bad_layer_[size_t(seq_[r])] == kFinite && first_non_finite({x + r * cols, cols}) < cols)
        bad_layer_[size_t(seq_[r])] = layer;
  };
  dec.forward(b, slots_, *act_, logits_.data(), &watch);
  if (first_non_finite(logits_) < logits_.size() ||
      std::any_of(bad_layer_.begin(), bad_layer_.end(), [](int l) { return l != kFinite; }))
    non_finite(decode, chunks);

  size_t at = 0;
  for (Sequence* s : decode) {
    const size_t rows = 1 + s->draft_.size();
    s->logits_.assign(logits_.begin() + std::ptrdiff_t(at * V), logits_.begin() + std::ptrdiff_t((at + rows) * V));
    s->pending_ = -1;
    at += rows;
  }
  for (const Chunk& c : chunks) {
    Sequence& s = *c.seq;
    s.prefilled_rows_ = c.end;
    const std::vector<int32_t>& prompt = s.req_.prompt;
    if (s.req_.prompt_logprobs >= 0)  // row p gives the logprob of prompt token p + 1
      for (size_t p = c.begin; p < c.end && p + 1 < prompt.size(); ++p, ++at) {
        TokenEvent ev;
        ev.id = prompt[p + 1];
        logprobs_of({logits_.data() + at * V, size_t(model_.vocab_limit())}, ev.id, s.req_.prompt_logprobs, ev);
        if (s.cb_.on_prompt_token) s.cb_.on_prompt_token(ev);
      }
    if (c.end != prompt.size()) continue;
    s.logits_.assign(logits_.begin() + std::ptrdiff_t(at * V), logits_.begin() + std::ptrdiff_t((at + 1) * V));
    ++at;
  }
}

// Ends every sequence of the pass whose rows or logits went non-finite, naming the layer.
void Engine::non_finite(const std::vector<Sequence*>& decode, const std::vector<Chunk>& chunks) {
  const size_t V = size_t(model_.vocab());
  size_t slot = 0, at = 0;
  auto check = [&](Sequence& s, size_t rows) {  // rows: its logits rows
    const int layer = bad_layer_[slot++];
    const bool bad_logits = first_non_finite({logits_.data() + at * V, rows * V}) < rows * V;
    at += rows;
    if (layer == kBadInput)
      fail_request(s, "non-finite values (NaN/Inf) in the input rows (check the image features and the embedding table)");
    else if (layer != kFinite)
      fail_request(s, fmt::format("non-finite values (NaN/Inf) in the residual stream: decoder layer {} was the "
                                   "first to output them (check the weights and config.json)", layer));
    else if (bad_logits)
      fail_request(s, "non-finite logits (NaN/Inf) though every decoder layer's output was finite (check the "
                       "final norm and the output head)");
  };
  for (Sequence* s : decode) check(*s, 1 + s->draft_.size());
  for (const Chunk& c : chunks)
    check(*c.seq, c.seq->req_.prompt_logprobs >= 0 ? c.end - c.begin : c.end == c.seq->req_.prompt.size());
}

namespace {

// A response schema as the sampler's filter: the ids whose bytes continue the JSON, and the stop
// ids once it is whole.
class SchemaFilter final : public TokenFilter {
 public:
  SchemaFilter(const grammar::Matcher& m, const grammar::Vocabulary& v, std::span<const int32_t> stops)
      : m_(m), v_(v), stops_(stops) {}

  bool allows(int32_t id) override {
    if (std::find(stops_.begin(), stops_.end(), id) != stops_.end()) return m_.complete();
    return size_t(id) < v_.size() && v_.allows(m_.state(), id);
  }

  bool mask(std::span<float> logits) override {
    thread_local std::vector<uint8_t> allowed;
    allowed.resize(v_.size());
    v_.allowed(m_.state(), allowed);
    if (m_.complete())
      for (int32_t id : stops_)
        if (size_t(id) < allowed.size()) allowed[size_t(id)] = 1;
    bool any = false;
    for (size_t id = 0; id < logits.size(); ++id) {
      if (id < allowed.size() && allowed[id]) any = true;
      else logits[id] = -std::numeric_limits<float>::infinity();
    }
    return any;
  }

 private:
  const grammar::Matcher& m_;
  const grammar::Vocabulary& v_;
  std::span<const int32_t> stops_;
};

}  // namespace

void logprobs_of(std::span<const float> logits, int32_t id, int k, TokenEvent& ev) {
  const float mx = logits[size_t(argmax(logits))], mine = logits[size_t(id)];
  double sum = 0;
  int above = 0;  // ids with a larger logit, counted in the same pass
  for (float x : logits) {
    sum += std::exp(double(x) - double(mx));
    above += x > mine;
  }
  const double lse = double(mx) + std::log(sum);
  ev.logprob = float(double(mine) - lse);
  ev.rank = 1 + above;
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t n = std::min(idx.size(), size_t(k));
  std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(n), idx.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  ev.top.clear();
  for (size_t i = 0; i < n; ++i) ev.top.emplace_back(idx[i], float(double(logits[size_t(idx[i])]) - lse));
}

void Engine::sample(Sequence& s) {
  const Request& req = s.req_;
  if (s.cb_.on_logits) s.cb_.on_logits(s.logits_);
  if (int(s.tokens_.size()) >= req.max_tokens) return finish(s, FinishReason::Length);
  TokenEvent ev;
  std::vector<float> raw;
  if (req.top_logprobs >= 0) raw.assign(s.logits_.begin(), s.logits_.begin() + model_.vocab_limit());
  if (!s.may_stop_at(s.tokens_.size() + 1))  // min_tokens: no stop id can be drawn yet
    for (int32_t stop : s.stop_ids_)
      if (stop < model_.vocab_limit()) s.logits_[size_t(stop)] = -std::numeric_limits<float>::infinity();
  int32_t id = -1;
  try {
    std::optional<SchemaFilter> filter;
    if (s.matcher_) filter.emplace(*s.matcher_, model_.vocabulary(), s.stop_ids_);
    id = s.sampler_->sample(s.logits_, filter ? &*filter : nullptr);
  } catch (const Error& e) {
    return fail_request(s, e.what());
  }
  if (std::find(s.stop_ids_.begin(), s.stop_ids_.end(), id) != s.stop_ids_.end()) {
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end()) s.stop_reason_ = id;
    return finish(s, FinishReason::Stop);
  }
  if (s.matcher_ && !s.matcher_->feed(model_.vocabulary().bytes(id)))
    return fail_request(s, fmt::format("internal: token {} was allowed by the response format but does not continue it", id));
  s.tokens_.push_back(id);
  ++s.usage_.completion_tokens;
  ev.id = id;
  if (!raw.empty()) logprobs_of(raw, id, req.top_logprobs, ev);
  if (s.detok_) ev.text = s.detok_->push(id);
  if (s.cb_.on_token) s.cb_.on_token(ev);
  if (s.stops_) {
    const std::string out = s.stops_->feed(ev.text, s.may_stop_at(s.tokens_.size()));
    if (!out.empty() && s.cb_.on_text) s.cb_.on_text(out);
    if (s.stops_->stopped()) {
      s.stop_reason_ = s.stops_->matched();
      return finish(s, FinishReason::Stop);
    }
  }
  if (s.matcher_ && s.matcher_->closed()) return finish(s, FinishReason::Stop);  // the JSON is whole
  // The token just sampled needs a position of its own before the next one.
  if (s.cache_->length() >= s.cache_->context()) return finish(s, FinishReason::Length);
  if (int(s.tokens_.size()) >= req.max_tokens) return finish(s, FinishReason::Length);
  s.pending_ = id;
}

size_t Engine::draft(Sequence& s, size_t rows, size_t decode_rows) {
  const KvCache& c = *s.cache_;
  // Each draft row must leave a position for the token drawn after it, stay within max_tokens, be
  // one the cache can give back, and fit the sliding layers' rings with the sequence's own row.
  const int64_t room = std::min({int64_t(budget_.draft_tokens), int64_t(rows), c.max_rewind(),
                                 c.context() - c.length() - 2,
                                 int64_t(s.req_.max_tokens) - int64_t(s.tokens_.size()) - 1,
                                 int64_t(model_.config().text.sliding_window) - 1});
  if (room <= 0) return 0;
  s.draft_ = lookup_draft(s.ids(), size_t(room), model_.vocab_limit());
  s.draft_odds_.pick(s.draft_, batch_row_cost(draft_row_cost(), decode_rows));
  s.draft_base_ = s.tokens_.size();
  return s.draft_.size();
}

// The pass gave a row of logits for the pending token and one for each draft id, each what a
// step of its own would have given after the ids before it. Each is sampled in turn as that step
// would; the next row counts only while the draws agree with the draft.
void Engine::sample_draft(Sequence& s, StepStats& st) {
  auto draws = [&s] { return std::span<const int32_t>(s.tokens_).subspan(s.draft_base_); };
  if (s.draft_.empty()) {
    sample(s);
    s.draft_odds_.drawn({}, draws());
    return;
  }
  const size_t V = size_t(model_.vocab());
  const std::vector<float> rows = std::move(s.logits_);
  const std::vector<int32_t> draft = s.draft_;
  for (size_t i = 0; i <= draft.size(); ++i) {
    s.logits_.assign(rows.begin() + std::ptrdiff_t(i * V), rows.begin() + std::ptrdiff_t((i + 1) * V));
    sample(s);
    if (s.phase() == Phase::Finished || i == draft.size() || s.pending_ != draft[i]) break;
  }
  const int took = int(s.draft_odds_.drawn(draft, draws()));
  st.drafted += int(draft.size());
  st.accepted += took;
  s.usage_.draft_tokens += int(draft.size());
  s.usage_.draft_accepted += took;
  if (s.phase() != Phase::Finished) drop_draft(s);
}

void Engine::drop_draft(Sequence& s) {
  if (s.draft_.empty()) return;
  if (s.cache_) {
    const size_t took = agreed(s.draft_, std::span<const int32_t>(s.tokens_).subspan(s.draft_base_));
    s.cache_->rewind(s.cache_->length() - int64_t(s.draft_.size() - took));
  }
  s.draft_.clear();
}

void Engine::update_counters() {
  size_t kv = 0;
  for (auto& s : active_) kv += s->kv_bytes();
  kv_bytes_.store(kv);
  running_.store(active_.size());
  std::lock_guard lock(inbox_mu_);
  waiting_.store(inbox_.size() + queue_.size());
}

}  // namespace vlm::engine
