// The safetensors file format (Hugging Face): how drover hands a model to PyTorch /
// transformers tooling without pickles (write side, fp32), and takes one from them (read
// side: F32, F16, BF16 and F64 tensors, widened or narrowed to fp32).
//
// Layout: an 8-byte little-endian unsigned header length N, then N bytes of UTF-8 JSON,
// then the raw tensor bytes. The JSON maps each tensor name to {"dtype": "F32", "shape":
// [...], "data_offsets": [begin, end]} (byte offsets into the data that follows the header)
// and "__metadata__" to a string-to-string map. Tensors are written back to back in the
// order given, without gaps, as the format requires; the header is padded with spaces to a
// multiple of 8 bytes so that every tensor starts 8-byte aligned in the file (readers that
// map the file can then use the floats in place).
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_system.h"
#include "common/status.h"

namespace drover::engine {

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, product(shape) values
};

// The dtype the writer stores every tensor in: fp32 as it is, or narrowed to bf16 or fp16
// (round to nearest, ties to even, as a cast in PyTorch rounds; fp16 past its largest
// finite value becomes +-inf).
enum class SafetensorsDtype { kF32, kBF16, kF16 };

// The header (length prefix and padded JSON) for `tensors` in this order. InvalidArgument
// when a name is empty, repeated or "__metadata__", or a tensor's data does not hold
// product(shape) values.
StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        SafetensorsDtype dtype = SafetensorsDtype::kF32);

// Writes header and data to `path` with WriteFileAtomic: a crash leaves the old file or the
// new one. Errors as SafetensorsHeader, plus the file system's, naming the path.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        FileSystem* fs = FileSystem::Default(),
                        SafetensorsDtype dtype = SafetensorsDtype::kF32);

// True when `head` (a file's first bytes, at least 9 of them) can open a safetensors file:
// a little-endian header length, then the header's opening brace. An llm.c model file starts
// with its magic 20240326 and zeros, which never can.
bool LooksLikeSafetensors(std::string_view head);

// One tensor of a file's header. `begin` and `end` are byte offsets into the data that
// follows the header.
struct SafetensorsEntry {
  std::string dtype;  // "F32", "F16", "BF16", "F64", or another the reader refuses to read
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t numel() const;
};

// A safetensors file opened for reading: its header parsed and checked against the file's
// size, the data read tensor by tensor on request (a model several times the size of memory's
// spare room is never read whole). Not thread-safe; the file stays open while it lives.
class SafetensorsFile {
 public:
  // NotFound / the OS's error when the file cannot be opened; DataLoss when it is not a
  // safetensors file or its header is malformed (a header over 100 MB, as the format caps
  // it; JSON that does not parse; an entry without a dtype, shape or data offsets; offsets
  // past the file's end, or that do not match the shape and dtype). Messages name the path
  // and the tensor.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Tensor `name`'s numel() values as fp32, row-major, into `out`: F16 and BF16 widen
  // exactly, F64 rounds to nearest. NotFound for an unknown name, InvalidArgument for a dtype
  // it cannot read, DataLoss for a short read.
  Status ReadFloats(const std::string& name, float* out) const;

 private:
  SafetensorsFile(std::string path, int fd, uint64_t data_offset)
      : path_(std::move(path)), fd_(fd), data_offset_(data_offset) {}
  Status ParseHeader(std::string_view json, uint64_t data_bytes);

  std::string path_;
  int fd_;
  uint64_t data_offset_;  // where the data begins in the file: 8 + the header's length
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace drover::engine
