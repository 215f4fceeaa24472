// One function per `vlm` subcommand; each parses its own arguments (CLI11)
// and returns the process exit code. main.cpp holds the table.
#pragma once

namespace vlm::cli {

struct Command {
  const char* name;
  const char* help;
  int (*run)(int argc, char** argv);  // argv[0] is "vlm <name>"
};

int cmd_inspect(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_dump(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_batch(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_quantize(int argc, char** argv);

}  // namespace vlm::cli
