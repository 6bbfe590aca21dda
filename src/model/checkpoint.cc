#include "model/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

namespace fs = std::filesystem;
using json = nlohmann::json;

const TensorView& Checkpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(dir_, ": tensor ", name, " is not in the checkpoint");
  return *it->second;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) n += t->nbytes;
  return n;
}

std::vector<std::string> validate_tensors(const std::map<std::string, const TensorView*>& tensors,
                                          const std::vector<ExpectedTensor>& manifest) {
  std::vector<std::string> problems;
  for (const ExpectedTensor& e : manifest) {
    auto it = tensors.find(e.name);
    if (it == tensors.end()) {
      problems.push_back("missing tensor " + e.name);
      continue;
    }
    const TensorView& t = *it->second;
    bool dtype_ok = false;
    for (DType d : e.dtypes) dtype_ok |= (d == t.dtype);
    if (!dtype_ok) {
      std::string want;
      for (DType d : e.dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
      problems.push_back(t.file + ": tensor " + e.name + " has dtype " + dtype_name(t.dtype) + ", expected " + want);
    }
    if (t.shape != e.shape)
      problems.push_back(t.file + ": tensor " + e.name + " has shape " + shape_str(t.shape) + ", expected " +
                         shape_str(e.shape));
  }
  return problems;
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  if (!fs::is_directory(dir)) fail(dir, ": not a checkpoint directory");
  ck->config_ = load_config((fs::path(dir) / "config.json").string());

  // Which files hold which tensors.
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    json j;
    try {
      j = json::parse(ss.str());
    } catch (const std::exception& e) {
      fail(index.string(), ": not valid JSON: ", e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": has no weight_map object");
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(index.string(), ": weight_map entry for ", it.key(), " is not a file name");
      std::string file = it.value().get<std::string>();
      weight_map[it.key()] = file;
      if (seen.insert(file).second) shard_names.push_back(file);
    }
    for (const auto& s : shard_names)
      if (!fs::exists(fs::path(dir) / s))
        fail(index.string(), ": shard ", s, " is missing (listed in the index, not found in ", dir, ")");
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail(dir, ": no model.safetensors.index.json and no .safetensors files");
  }

  for (const auto& s : shard_names) {
    ck->files_.push_back(SafetensorsFile::open((fs::path(dir) / s).string()));
    const SafetensorsFile& f = *ck->files_.back();
    for (const auto& [name, view] : f.tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || it->second != s) continue;  // the index names another file for it
      }
      if (ck->tensors_.count(name))
        fail(f.path(), ": tensor ", name, " also appears in ", ck->tensors_[name]->file);
      ck->tensors_[name] = &view;
    }
  }
  for (const auto& [name, file] : weight_map)
    if (!ck->tensors_.count(name))
      fail((fs::path(dir) / file).string(), ": tensor ", name, " is listed in the index but not in this file");

  auto problems = validate_tensors(ck->tensors_, expected_tensors(ck->config_));
  if (!problems.empty()) {
    std::string msg = dir + ": checkpoint does not match config.json (" + std::to_string(problems.size()) +
                      " problem" + (problems.size() > 1 ? "s" : "") + "):";
    for (size_t i = 0; i < problems.size() && i < 8; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 8) msg += "\n  ...";
    throw Error(msg);
  }
  return ck;
}

}  // namespace dsv4
