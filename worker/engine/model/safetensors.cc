#include "worker/engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "common/fd.h"
#include "worker/engine/kernels/cpu/round.h"

namespace drover::engine {
namespace {

// safetensors stores little-endian data; drover writes the host's floats as they are.
static_assert(std::endian::native == std::endian::little, "safetensors needs little-endian");

constexpr char kMetadataKey[] = "__metadata__";
// The format's own cap on the header, which also bounds what a damaged length field makes
// the reader allocate.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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

// Bytes per element of the dtypes the format defines; 0 for a name it does not.
uint64_t DtypeBytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
  auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

// IEEE half (1 sign, 5 exponent, 10 mantissa bits) to fp32, exactly: subnormals, infinities
// and NaN included.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf or NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // A subnormal half is a normal float: shift the mantissa up to its leading one.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// The bits of a value that the engine's rounding (kernels/cpu/round.h, the one rounding to
// 16 bits drover has) made exact in the narrower type, so nothing is rounded here: bf16 is
// fp32's upper half; fp16 rebiases the exponent, its subnormals whole multiples of 2^-24.
// NaN becomes a quiet NaN (its payload may lie in the bits that go).
uint16_t Bf16BitsOfExact(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x7FC0u);
  return static_cast<uint16_t>(x >> 16);
}

uint16_t HalfBitsOfExact(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;
  if (abs == 0x7F800000u) return sign | 0x7C00u;
  if (abs < 0x38800000u) {  // below 2^-14: a count of 2^-24 steps, exact
    return sign | static_cast<uint16_t>(std::bit_cast<float>(abs) * 0x1p24f);
  }
  return sign | static_cast<uint16_t>((abs >> 13) - (112u << 10));  // exponent 127 -> 15
}

const char* DtypeName(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kBF16:
      return "BF16";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kF32:
      break;
  }
  return "F32";
}

uint64_t ElementBytes(SafetensorsDtype d) { return d == SafetensorsDtype::kF32 ? 4 : 2; }

// A JSON array of non-negative integers that fit in T.
template <typename T>
bool ToUnsignedList(const nlohmann::json& j, std::vector<T>* out) {
  if (!j.is_array()) return false;
  for (const auto& v : j) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      return false;
    }
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
    out->push_back(static_cast<T>(u));
  }
  return true;
}

}  // namespace

StatusOr<std::string> SafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        SafetensorsDtype dtype) {
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
    const uint64_t bytes = t.data.size() * ElementBytes(dtype);
    header[t.name] = {{"dtype", DtypeName(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
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
                        const std::map<std::string, std::string>& metadata, FileSystem* fs,
                        SafetensorsDtype dtype) {
  ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(tensors, metadata, dtype));
  std::vector<float> rounded;
  std::vector<uint16_t> narrow;
  return WriteFileAtomic(fs, path, [&](WritableFile& file) {
    RETURN_IF_ERROR(file.Append(header));
    for (const SafetensorsTensor& t : tensors) {
      if (dtype == SafetensorsDtype::kF32) {
        RETURN_IF_ERROR(file.Append(std::string_view(reinterpret_cast<const char*>(t.data.data()),
                                                     t.data.size() * sizeof(float))));
        continue;
      }
      rounded.assign(t.data.begin(), t.data.end());
      const bool bf16 = dtype == SafetensorsDtype::kBF16;
      bf16 ? cpu::RoundToBf16(rounded.data(), rounded.size())
           : cpu::RoundToFp16(rounded.data(), rounded.size());
      narrow.resize(rounded.size());
      for (size_t i = 0; i < rounded.size(); ++i) {
        narrow[i] = bf16 ? Bf16BitsOfExact(rounded[i]) : HalfBitsOfExact(rounded[i]);
      }
      RETURN_IF_ERROR(file.Append(std::string_view(reinterpret_cast<const char*>(narrow.data()),
                                                   narrow.size() * sizeof(uint16_t))));
    }
    return OkStatus();
  });
}

bool LooksLikeSafetensors(std::string_view head) {
  if (head.size() < 9) return false;
  uint64_t n = 0;
  std::memcpy(&n, head.data(), sizeof(n));
  return n >= 2 && n <= kMaxHeaderBytes && head[8] == '{';
}

uint64_t SafetensorsEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "opening " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t n = 0;
  if (size < sizeof(n)) return DataLossError(path + ": too short for a safetensors header");
  RETURN_IF_ERROR(ReadAllAt(fd.get(), reinterpret_cast<char*>(&n), sizeof(n), 0, path));
  if (n > kMaxHeaderBytes || n > size - sizeof(n)) {
    return DataLossError(path + ": not a safetensors file (its header length " + std::to_string(n) +
                         " exceeds " + (n > kMaxHeaderBytes ? "the format's 100 MB" : "the file") +
                         ")");
  }
  std::string json(n, '\0');
  RETURN_IF_ERROR(ReadAllAt(fd.get(), json.data(), n, sizeof(n), path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, fd.get(), sizeof(n) + n));
  fd.Forget();
  RETURN_IF_ERROR(file->ParseHeader(json, size - sizeof(n) - n));
  return file;
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

Status SafetensorsFile::ParseHeader(std::string_view json, uint64_t data_bytes) {
  const nlohmann::json header = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLossError(path_ + ": the safetensors header is not a JSON object");
  }
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) return DataLossError(path_ + ": __metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path_ + ": tensor '" + name + "'";
    if (!value.is_object() || !value.contains("dtype") || !value["dtype"].is_string()) {
      return DataLossError(where + " has no dtype");
    }
    SafetensorsEntry e;
    e.dtype = value["dtype"].get<std::string>();
    std::vector<uint64_t> offsets;
    if (!value.contains("shape") || !ToUnsignedList(value["shape"], &e.shape)) {
      return DataLossError(where + " has no shape of non-negative integers");
    }
    if (!value.contains("data_offsets") || !ToUnsignedList(value["data_offsets"], &offsets) ||
        offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes) {
      return DataLossError(where + " has data offsets outside the file's " +
                           std::to_string(data_bytes) + " bytes of data");
    }
    e.begin = offsets[0];
    e.end = offsets[1];
    // The bytes the shape needs, without overflowing on a damaged shape.
    const uint64_t bytes = DtypeBytes(e.dtype);
    if (bytes != 0) {
      uint64_t need = bytes;
      bool overflow = false;
      for (int64_t d : e.shape) {
        const uint64_t u = static_cast<uint64_t>(d);
        overflow = overflow || (u != 0 && need > std::numeric_limits<uint64_t>::max() / u);
        need = overflow ? 0 : need * u;
      }
      if (overflow || need != e.end - e.begin) {
        return DataLossError(where + " holds " + std::to_string(e.end - e.begin) +
                             " bytes, its shape and dtype " + e.dtype + " need " +
                             (overflow ? "over 2^64" : std::to_string(need)));
      }
    }
    tensors_[name] = std::move(e);
  }
  // The format lays tensors back to back; overlapping ones would let a small damaged file
  // describe a model many times its size.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, e] : tensors_) {
    if (e.end > e.begin) spans.emplace_back(e.begin, e.end);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return DataLossError(path_ + ": two tensors share the bytes from " +
                           std::to_string(spans[i].first) + " of the data");
    }
  }
  return OkStatus();
}

Status SafetensorsFile::ReadFloats(const std::string& name, float* out) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return NotFoundError(path_ + ": no tensor '" + name + "'");
  const SafetensorsEntry& e = it->second;
  const uint64_t n = e.numel();
  const uint64_t at = data_offset_ + e.begin;
  if (e.dtype == "F32") {
    return ReadAllAt(fd_, reinterpret_cast<char*>(out), n * 4, at, path_);
  }
  if (e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64") {
    return InvalidArgumentError(path_ + ": tensor '" + name + "' has dtype " + e.dtype +
                                "; only F32, F16, BF16 and F64 tensors can be read");
  }
  std::string raw(e.end - e.begin, '\0');
  RETURN_IF_ERROR(ReadAllAt(fd_, raw.data(), raw.size(), at, path_));
  for (uint64_t i = 0; i < n; ++i) {
    if (e.dtype == "F64") {
      double d;
      std::memcpy(&d, raw.data() + 8 * i, 8);
      out[i] = static_cast<float>(d);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    out[i] =
        e.dtype == "F16" ? HalfToFloat(h) : std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
  }
  return OkStatus();
}

}  // namespace drover::engine
