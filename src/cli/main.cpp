#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "kernels/exec.h"

namespace {

using vlm::cli::Command;

// Also the kernel paths this CPU takes (as llama.cpp's system info does): which ISA, and where
// bf16 products of more than 32 rows run (kernels/exec.h, Bf16Gemm), for bug reports and
// for the tests whose expectations depend on it.
int version(int, char**) {
  namespace k = vlm::kernels;
  std::printf("vlm %s\n", VLM_VERSION);
  std::printf("isa: %s\nbf16_gemm: %s\n", k::isa_name(k::best_isa()),
              !k::bf16_dot_supported() ? "none" : k::bf16_gemm_name(k::fastest_bf16_gemm()));
  return 0;
}

// Each subcommand lives in a file of its own in this folder.
const Command kCommands[] = {
    {"version", "print the version", version},
    {"tokenize", "print the token ids of a text or chat (JSON)", vlm::cli::cmd_tokenize},
    {"detokenize", "print the text of token ids", vlm::cli::cmd_detokenize},
    {"inspect", "describe a checkpoint folder (tensors, config, identity)", vlm::cli::cmd_inspect},
    {"run", "generate text from a prompt (streamed)", vlm::cli::cmd_run},
    {"chat", "a conversation on the terminal, images included (/image FILE)", vlm::cli::cmd_chat},
    {"dump", "write prefill intermediates and greedy decode as .npy", vlm::cli::cmd_dump},
    {"serve", "OpenAI-compatible HTTP server with continuous batching", vlm::cli::cmd_serve},
    {"batch", "run a JSONL file of chat requests (continuous batching, resumable)", vlm::cli::cmd_batch},
    {"bench", "measure prefill, decode, batched decode and image speed against the machine's limits",
     vlm::cli::cmd_bench},
    {"quantize", "write a checkpoint folder as a block-quantized GGUF (and mmproj) file", vlm::cli::cmd_quantize},
};

void usage() {
  std::fprintf(stderr, "usage: vlm <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(stderr, "  %-12s %s\n", c.name, c.help);
  std::fprintf(stderr, "\n`vlm <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    std::string name = std::string("vlm ") + c.name;
    argv[1] = name.data();
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const std::bad_alloc&) {
      // Last resort: inputs are checked against stated limits before allocating, so this
      // means the machine has less memory than a valid request needs.
      std::fprintf(stderr, "vlm %s: error: out of memory (the request needs more memory than is available)\n",
                   c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vlm %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "vlm: unknown command '%s'\n", argv[1]);
  usage();
  return 2;
}
