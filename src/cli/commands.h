// dsv4 subcommands. Each returns the process exit code; errors are dsv4::Error caught in main.
#pragma once
#include <string>

namespace dsv4::cli {

int cmd_run(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_random_checkpoint(int argc, char** argv);

// The model directory to use: --model if given, else the embedded default model (written on first use
// under $DSV4_HOME, default ~/.cache/dsv4).
std::string resolve_model_dir(const std::string& model_flag);

}  // namespace dsv4::cli
