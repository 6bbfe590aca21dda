#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using json = nlohmann::json;

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, ": cannot open safetensors file (", std::strerror(errno), ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, ": cannot stat safetensors file");
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    fail(path, ": truncated safetensors file (", f->size_, " bytes, no header length)");
  }
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail(path, ": mmap failed (", std::strerror(errno), ")");
  f->map_ = m;
  const uint8_t* base = static_cast<const uint8_t*>(m);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian hosts only (x86-64, aarch64)
  if (header_len > f->size_ - 8)
    fail(path, ": malformed safetensors header: header length ", header_len, " exceeds file size ", f->size_);
  json h;
  try {
    h = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const std::exception& e) {
    fail(path, ": malformed safetensors header: ", e.what());
  }
  if (!h.is_object()) fail(path, ": malformed safetensors header: not a JSON object");
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = f->size_ - 8 - header_len;

  std::vector<std::pair<size_t, size_t>> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& e = it.value();
    auto where = [&]() { return path + ": tensor " + name; };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(where(), ": malformed header entry (needs dtype, shape, data_offsets)");
    if (!e["dtype"].is_string()) fail(where(), ": dtype is not a string");
    auto dt = parse_dtype(e["dtype"].get<std::string>());
    if (!dt) fail(where(), ": unknown dtype '", e["dtype"].get<std::string>(), "'");
    Shape shape;
    if (!e["shape"].is_array()) fail(where(), ": shape is not an array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where(), ": bad shape ", e["shape"].dump());
      shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where(), ": bad data_offsets ", off.dump());
    size_t b = off[0].get<size_t>(), en = off[1].get<size_t>();
    if (b > en) fail(where(), ": data_offsets begin > end");
    if (en > data_size)
      fail(where(), ": data ends at byte ", en, " but the file holds only ", data_size,
           " data bytes (truncated file?)");
    size_t expect = static_cast<size_t>(shape_numel(shape)) * dtype_size(*dt);
    if (en - b != expect)
      fail(where(), ": ", en - b, " data bytes for ", dtype_name(*dt), " ", shape_str(shape), " (expected ", expect,
           ")");
    TensorView v{name, path, *dt, shape, data + b, en - b};
    f->tensors_.emplace(name, std::move(v));
    if (en > b) spans.emplace_back(b, en);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) fail(path, ": malformed safetensors file: tensor data overlaps");
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

void write_safetensors(const std::string& path, const std::vector<const TensorBlob*>& tensors) {
  json h = json::object();
  size_t off = 0;
  for (const TensorBlob* t : tensors) {
    size_t expect = static_cast<size_t>(shape_numel(t->shape)) * dtype_size(t->dtype);
    if (expect != t->bytes.size()) fail("write ", path, ": tensor ", t->name, " has wrong byte count");
    h[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + expect}}};
    off += expect;
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';  // align the data section to 8 bytes, as safetensors does
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, ": cannot open for writing");
  uint64_t n = hs.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (const TensorBlob* t : tensors) out.write(reinterpret_cast<const char*>(t->bytes.data()), t->bytes.size());
  if (!out) fail(path, ": write failed");
}

}  // namespace dsv4
