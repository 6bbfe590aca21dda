// A checkpoint directory as shipped on Hugging Face: config.json plus sharded safetensors with
// model.safetensors.index.json, or a single model.safetensors. All files are memory-mapped and every
// tensor is checked against the config's manifest (name, dtype, shape) before any compute.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/manifest.h"
#include "model/safetensors.h"

namespace dsv4 {

class Checkpoint {
 public:
  // Throws dsv4::Error naming the file and tensor on a missing shard, truncated file, malformed header,
  // wrong dtype or shape, or missing tensor.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& tensor(const std::string& name) const;
  const std::map<std::string, const TensorView*>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t total_bytes() const;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
};

// Checks the tensors against the manifest; returns a list of problems, each naming the file and tensor.
std::vector<std::string> validate_tensors(const std::map<std::string, const TensorView*>& tensors,
                                          const std::vector<ExpectedTensor>& manifest);

}  // namespace dsv4
