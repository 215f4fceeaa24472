// The peer side of tests/e2e/test_mtmd.py: llama.cpp's libmtmd + libllama (built from the source
// node-llama-cpp bundles, see bench/peer.sh) run a prompt with images and greedy decoding, and
// this prints what vlm's side is compared with. Built by the test against that build; never
// part of vlm.
//
//   mtmd_logits MODEL.gguf MMPROJ.gguf PROMPT STEPS OUT.f32 IMAGE...
//
// PROMPT is the whole text, chat turns included, with one "<__media__>" marker per image; the
// BOS is added, special tokens are parsed. Around each image mtmd places its own markers (for
// Gemma 3: "<start_of_image>", the image rows, "<end_of_image>"; docs/gemma3/prompt.md, Layouts)
// and decodes the image rows non-causally. Stdout: one JSON object {"prompt": ids, with every
// image row as -1, "tokens": greedy ids}. OUT.f32: the logits (f32, vocab each) at the prompt's
// last position and after each greedy token but the last, one after the other.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mtmd_logits: %s\n", what.c_str());
  std::exit(1);
}

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) die("usage: mtmd_logits MODEL.gguf MMPROJ.gguf PROMPT STEPS OUT.f32 IMAGE...");
  const int steps = std::atoi(argv[4]);
  llama_log_set(quiet, nullptr);
  mtmd_helper_log_set(quiet, nullptr);
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die(std::string("cannot load ") + argv[1]);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024, cp.n_batch = 1024, cp.n_ubatch = 1024, cp.n_threads = cp.n_threads_batch = 2;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = GGML_TYPE_F32;  // the default f16 cache rounds every key and value
  llama_context* lctx = llama_init_from_model(model, cp);
  if (!lctx) die("cannot create a context");

  mtmd_context_params vp = mtmd_context_params_default();
  vp.use_gpu = false, vp.n_threads = 2, vp.print_timings = false, vp.warmup = false;
  vp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  mtmd_context* mctx = mtmd_init_from_file(argv[2], model, vp);
  if (!mctx) die(std::string("cannot load ") + argv[2]);

  std::vector<mtmd_bitmap*> images;
  for (int i = 6; i < argc; ++i) {
    mtmd_helper_bitmap_wrapper w = mtmd_helper_bitmap_init_from_file(mctx, argv[i], false, mtmd_helper_init_opt_default());
    if (!w.bitmap) die(std::string("cannot read image ") + argv[i]);
    images.push_back(w.bitmap);
  }
  const mtmd_input_text text{argv[3], std::strlen(argv[3]), true, true};
  mtmd_input_chunks* chunks = mtmd_input_chunks_init();
  if (mtmd_tokenize(mctx, chunks, &text, images.data(), images.size()) != 0)
    die("mtmd_tokenize failed (one marker per image?)");

  std::string prompt;
  for (size_t c = 0; c < mtmd_input_chunks_size(chunks); ++c) {
    const mtmd_input_chunk* chunk = mtmd_input_chunks_get(chunks, c);
    if (mtmd_input_chunk_get_type(chunk) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
      size_t n = 0;
      const llama_token* ids = mtmd_input_chunk_get_tokens_text(chunk, &n);
      for (size_t i = 0; i < n; ++i) prompt += (prompt.empty() ? "" : ",") + std::to_string(ids[i]);
    } else {
      for (size_t i = 0; i < mtmd_input_chunk_get_n_tokens(chunk); ++i) prompt += prompt.empty() ? "-1" : ",-1";
    }
  }

  llama_pos n_past = 0;
  if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, cp.n_batch, true, &n_past) != 0) die("prefill failed");
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[5], "wb");
  if (!out) die(std::string("cannot write ") + argv[5]);
  std::string tokens;
  for (int s = 0; s < steps; ++s) {
    const float* logits = llama_get_logits_ith(lctx, -1);
    if (std::fwrite(logits, sizeof(float), size_t(vocab), out) != size_t(vocab)) die("write failed");
    llama_token best = 0;
    for (llama_token t = 1; t < vocab; ++t)
      if (logits[t] > logits[best]) best = t;
    tokens += (tokens.empty() ? "" : ",") + std::to_string(best);
    if (s + 1 == steps) break;
    llama_batch one = llama_batch_get_one(&best, 1);
    if (llama_decode(lctx, one) != 0) die("decode failed");
  }
  std::fclose(out);
  std::printf("{\"prompt\": [%s], \"tokens\": [%s]}\n", prompt.c_str(), tokens.c_str());

  mtmd_input_chunks_free(chunks);
  for (mtmd_bitmap* b : images) mtmd_bitmap_free(b);
  mtmd_free(mctx);
  llama_free(lctx);
  llama_model_free(model);
  llama_backend_free();
}
