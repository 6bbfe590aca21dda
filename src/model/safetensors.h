// Reading (memory-mapped) and writing safetensors files. Every header is validated before use: header
// length inside the file, JSON well formed, known dtype, shape * dtype size == byte span, spans inside the
// data section and not overlapping. Errors name the file and the tensor.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dsv4 {

struct TensorView {
  std::string name;
  std::string file;
  DType dtype;
  Shape shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const { return shape_numel(shape); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// A tensor to write: bytes are copied as given (little-endian, row-major).
struct TensorBlob {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const std::string& path, const std::vector<const TensorBlob*>& tensors);

}  // namespace dsv4
