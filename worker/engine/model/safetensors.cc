#include "worker/engine/model/safetensors.h"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

namespace drover::engine {
namespace {

// safetensors stores little-endian data; drover writes the host's floats as they are.
static_assert(std::endian::native == std::endian::little, "safetensors needs little-endian");

constexpr char kMetadataKey[] = "__metadata__";

Status CheckTensors(const std::vector<SafetensorsTensor>& tensors) {
  std::set<std::string> seen;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return InvalidArgumentError("safetensors: invalid tensor name '" + t.name + "'");
    }
    if (!seen.insert(t.name).second) {
      return InvalidArgumentError("safetensors: tensor '" + t.name + "' appears twice");
    }
    size_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return InvalidArgumentError("safetensors: tensor '" + t.name +
                                    "' has a negative dimension");
      }
      numel *= static_cast<size_t>(d);
    }
    if (numel != t.data.size()) {
      return InvalidArgumentError("safetensors: tensor '" + t.name + "' has " +
                                  std::to_string(t.data.size()) + " values, its shape needs " +
                                  std::to_string(numel));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  RETURN_IF_ERROR(CheckTensors(tensors));
  // ordered_json keeps the tensors in file order, so the header reads like the file.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  std::string out(sizeof(n), '\0');
  std::memcpy(out.data(), &n, sizeof(n));
  return out + json;
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata, FileSystem* fs) {
  ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(tensors, metadata));
  return WriteFileAtomic(fs, path, [&](WritableFile& file) {
    RETURN_IF_ERROR(file.Append(header));
    for (const SafetensorsTensor& t : tensors) {
      RETURN_IF_ERROR(file.Append(std::string_view(reinterpret_cast<const char*>(t.data.data()),
                                                   t.data.size() * sizeof(float))));
    }
    return OkStatus();
  });
}

}  // namespace drover::engine
