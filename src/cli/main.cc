// dsv4: command-line entry point.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

static void usage() {
  std::fprintf(stderr,
               "usage: dsv4 <command> [flags]\n"
               "  run                generate from a prompt (token ids or text); streams tokens, prints tok/s\n"
               "  inspect            config summary, tensor table, bytes per component, KV and memory plan\n"
               "  random-checkpoint  write a deterministic random checkpoint in the official layout\n"
               "Run 'dsv4 <command> --help' for its flags. Without --model, the embedded default model is used.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "run") return dsv4::cli::cmd_run(argc, argv);
    if (cmd == "inspect") return dsv4::cli::cmd_inspect(argc, argv);
    if (cmd == "random-checkpoint") return dsv4::cli::cmd_random_checkpoint(argc, argv);
    std::fprintf(stderr, "dsv4: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 %s: internal error: %s\n", cmd.c_str(), e.what());
    return 3;
  }
}
