// The safetensors file format (Hugging Face), write side, fp32 only: how drover hands a
// model to PyTorch / transformers tooling without pickles.
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
#include <string>
#include <vector>

#include "common/file_system.h"
#include "common/status.h"

namespace drover::engine {

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, product(shape) values
};

// The header (length prefix and padded JSON) for `tensors` in this order. InvalidArgument
// when a name is empty, repeated or "__metadata__", or a tensor's data does not hold
// product(shape) values.
StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata);

// Writes header and data to `path` with WriteFileAtomic: a crash leaves the old file or the
// new one. Errors as SafetensorsHeader, plus the file system's, naming the path.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        FileSystem* fs = FileSystem::Default());

}  // namespace drover::engine
