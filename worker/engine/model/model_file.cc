#include "worker/engine/model/model_file.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/files.h"
#include "worker/engine/ckpt/checkpoint_model.h"
#include "worker/engine/model/hf_gpt2.h"
#include "worker/engine/model/safetensors.h"

namespace drover::engine {
namespace {

constexpr int kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);
constexpr int kLayerTensors = 12;  // ln1w .. fcprojb, as in gpt.h's layout

// One contiguous piece of the arena, in file order.
struct Segment {
  size_t offset;
  size_t numel;
};

// The arena segments in llm.c's tensor-major file order: wte, wpe, then each per-layer
// tensor stacked over layers, then lnfw, lnfb.
std::vector<Segment> FileOrder(const std::vector<TensorInfo>& t, int L) {
  std::vector<Segment> s;
  s.push_back({t[0].offset, t[0].numel});
  s.push_back({t[1].offset, t[1].numel});
  for (int k = 0; k < kLayerTensors; k++) {
    for (int l = 0; l < L; l++) {
      const TensorInfo& x = t[2 + l * kLayerTensors + k];
      s.push_back({x.offset, x.numel});
    }
  }
  s.push_back({t[t.size() - 2].offset, t[t.size() - 2].numel});
  s.push_back({t[t.size() - 1].offset, t[t.size() - 1].numel});
  return s;
}

// The file size the header's shapes imply, in closed form and 128-bit arithmetic (every
// shape is below 2^31, so nothing overflows). LoadModelFile compares it with the real size
// before building anything: GptNumParams walks a tensor table per layer, and a fuzzed
// header of 458753 layers took it 13 s before the size check could refuse the file.
unsigned __int128 ExpectedFileBytes(const GptConfig& c) {
  return kHeaderBytes + GptNumParamsWide(c) * sizeof(float);
}

std::string ToString(unsigned __int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

// A FILE* closed on every path.
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

StatusOr<GptConfig> ParseHeader(const int32_t* h, const std::string& path) {
  if (h[0] != kModelFileMagic) {
    return DataLossError(path + ": not an llm.c model file (header magic " + std::to_string(h[0]) +
                         ", expected " + std::to_string(kModelFileMagic) + ")");
  }
  if (h[1] != kModelFileVersionFp32) {
    return InvalidArgumentError(path + ": unsupported model file version " + std::to_string(h[1]) +
                                " (only version 3, fp32 with padded vocabulary, is supported)");
  }
  GptConfig c;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.num_layers = h[4];
  c.num_heads = h[5];
  c.channels = h[6];
  c.padded_vocab_size = h[7];
  Status s = c.Validate();
  if (!s.ok()) return InvalidArgumentError(path + ": header: " + s.message());
  return c;
}

StatusOr<GptConfig> ReadLlmcConfig(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) return ErrnoToStatus(errno, "opening model file " + path);
  int32_t header[kHeaderInts];
  if (std::fread(header, 1, kHeaderBytes, f.get()) != kHeaderBytes) {
    return DataLossError(path + ": file too short for the 1024-byte model header");
  }
  return ParseHeader(header, path);
}

StatusOr<std::unique_ptr<Gpt>> LoadLlmcModelFile(const std::string& path) {
  ASSIGN_OR_RETURN(GptConfig config, ReadLlmcConfig(path));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  const unsigned __int128 expected = ExpectedFileBytes(config);
  if (static_cast<unsigned __int128>(st.st_size) != expected) {
    return DataLossError(path + ": file size " + std::to_string(st.st_size) +
                         " bytes does not match the header's shapes (expected " +
                         ToString(expected) + " bytes)");
  }
  // The closed form must agree with the layout the model is built from.
  DROVER_CHECK(kHeaderBytes + GptNumParams(config) * sizeof(float) == expected);
  auto model = std::make_unique<Gpt>(config);
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) return ErrnoToStatus(errno, "opening model file " + path);
  if (std::fseek(f.get(), kHeaderBytes, SEEK_SET) != 0) {
    return ErrnoToStatus(errno, "seeking in " + path);
  }
  for (const Segment& s : FileOrder(model->tensors(), config.num_layers)) {
    if (std::fread(model->params() + s.offset, sizeof(float), s.numel, f.get()) != s.numel) {
      return DataLossError(path + ": short read of the parameters");
    }
  }
  return model;
}

// The file a model path names: itself, or for a directory (as transformers' from_pretrained
// takes one) the model.safetensors in it.
StatusOr<std::string> ModelPathIn(const std::string& path) {
  if (!IsDirectory(path)) return path;
  const std::string inside = path + "/model.safetensors";
  if (PathExists(inside)) return inside;
  return InvalidArgumentError(path +
                              " is a directory, not a model file, and holds no "
                              "model.safetensors");
}

// True when `path` opens as a safetensors file rather than an llm.c one. A file too short to
// tell is left to the llm.c reader, whose message names what is missing.
bool IsSafetensors(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  char head[9];
  return f && std::fread(head, 1, sizeof(head), f.get()) == sizeof(head) &&
         LooksLikeSafetensors(std::string_view(head, sizeof(head)));
}

// A run that diverged still saves its model. Evaluated, it printed "loss nan" as if that were
// a result; sampled, it gave noise. Either way the file is unusable: say so at the load.
Status CheckFinite(const Gpt& model, const std::string& path) {
  for (const TensorInfo& t : model.tensors()) {
    const float* p = model.params() + t.offset;
    const float* bad = std::find_if(p, p + t.numel, [](float v) { return !std::isfinite(v); });
    if (bad != p + t.numel) {
      return DataLossError(path + ": the model file has non-finite weights in tensor " + t.name +
                           " (element " + std::to_string(bad - p) + " is " +
                           (std::isnan(*bad) ? "nan" : "inf") + ")");
    }
  }
  return OkStatus();
}

}  // namespace

Status SaveModelFile(const Gpt& model, const std::string& path, FileSystem* fs) {
  return SaveModelFile(model.config(), model.params(), path, fs);
}

Status SaveModelFile(const GptConfig& c, const float* params, const std::string& path,
                     FileSystem* fs) {
  int32_t header[kHeaderInts] = {};
  header[0] = kModelFileMagic;
  header[1] = kModelFileVersionFp32;
  header[2] = c.max_seq_len;
  header[3] = c.vocab_size;
  header[4] = c.num_layers;
  header[5] = c.num_heads;
  header[6] = c.channels;
  header[7] = c.padded_vocab_size;

  // Streamed in file order straight from the arena: no second copy of the model in memory.
  return WriteFileAtomic(fs, path, [&](WritableFile& file) {
    RETURN_IF_ERROR(
        file.Append(std::string_view(reinterpret_cast<const char*>(header), kHeaderBytes)));
    for (const Segment& s : FileOrder(GptTensorTable(c), c.num_layers)) {
      RETURN_IF_ERROR(file.Append(std::string_view(reinterpret_cast<const char*>(params + s.offset),
                                                   s.numel * sizeof(float))));
    }
    return OkStatus();
  });
}

StatusOr<GptConfig> ReadModelFileConfig(const std::string& given) {
  if (ckpt::IsCheckpointPath(given)) return ckpt::ReadCheckpointModelConfig(given);
  ASSIGN_OR_RETURN(const std::string path, ModelPathIn(given));
  if (IsSafetensors(path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    return ReadHfGpt2Config(*file);
  }
  return ReadLlmcConfig(path);
}

StatusOr<std::unique_ptr<Gpt>> LoadModelFile(const std::string& given) {
  std::string path;
  std::unique_ptr<Gpt> model;
  if (ckpt::IsCheckpointPath(given)) {
    ASSIGN_OR_RETURN(model, ckpt::LoadCheckpointModel(given, &path));
    // Which one, when a directory was given: the newest usable may not be the newest.
    if (path != given) spdlog::info("model of checkpoint {}", path);
  } else {
    ASSIGN_OR_RETURN(path, ModelPathIn(given));
    ASSIGN_OR_RETURN(model, IsSafetensors(path) ? LoadHfGpt2(path) : LoadLlmcModelFile(path));
  }
  RETURN_IF_ERROR(CheckFinite(*model, path));
  return model;
}

}  // namespace drover::engine
