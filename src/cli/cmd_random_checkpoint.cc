// dsv4 random-checkpoint: writes a deterministic random checkpoint in the official layout; with no
// --config it writes the embedded default model. Also resolves the default model directory for `run`.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/random_checkpoint.h"

namespace dsv4::cli {

namespace fs = std::filesystem;

std::string resolve_model_dir(const std::string& model_flag) {
  if (!model_flag.empty()) return model_flag;
  std::string home;
  if (const char* h = std::getenv("DSV4_HOME")) home = h;
  else if (const char* u = std::getenv("HOME")) home = std::string(u) + "/.cache/dsv4";
  else home = ".dsv4";
  const fs::path dir = fs::path(home) / "default-model";
  if (!fs::exists(dir / "model.safetensors.index.json")) {
    std::fprintf(stderr, "writing the embedded default model to %s\n", dir.c_str());
    // Written under a private name, then renamed: the directory is complete or absent, never half
    // written, also when two processes start at once (the loser drops its copy).
    const fs::path tmp = fs::path(home) / ("default-model.partial." + std::to_string(::getpid()));
    fs::remove_all(tmp);
    write_random_checkpoint(default_model_config_json(), tmp.string(), RandomCheckpointOptions{});
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {
      fs::remove_all(tmp);
      if (!fs::exists(dir / "model.safetensors.index.json"))
        fail("cannot create the default model in ", dir.string(), ": ", ec.message());
    }
  }
  return dir.string();
}

int cmd_random_checkpoint(int argc, char** argv) {
  Args a(argc, argv, 2, {"out", "config", "seed", "shards", "layers"}, {"help"});
  if (a.has("help") || !a.has("out")) {
    std::printf("dsv4 random-checkpoint --out DIR [--config config.json] [--seed 0] [--shards 2] [--layers N]\n"
                "  Without --config, writes the embedded default model. --layers N writes only layers [0, N)\n"
                "  (the config is rewritten to N layers without MTP), for full-width single-layer benchmarks.\n");
    return a.has("help") ? 0 : 2;
  }
  std::string cfg = default_model_config_json();
  if (a.has("config")) {
    std::ifstream in(a.get("config"));
    if (!in) fail(a.get("config"), ": cannot open config");
    std::stringstream ss;
    ss << in.rdbuf();
    cfg = ss.str();
  }
  RandomCheckpointOptions opt;
  opt.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  opt.shards = static_cast<int>(a.get_int("shards", 2));
  opt.layers_limit = static_cast<int>(a.get_int("layers", -1));
  write_random_checkpoint(cfg, a.get("out"), opt);
  std::printf("wrote %s\n", a.get("out").c_str());
  return 0;
}

}  // namespace dsv4::cli
