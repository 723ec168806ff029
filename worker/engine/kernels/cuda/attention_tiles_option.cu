// DROVER_CUDA_ATTENTION_TILES (ops_cuda.h: MmaAttentionTiles): the text a user writes and
// the choice the fused attention's launchers (attention_mma.cu) take, read once per kernel
// table (cuda_ops.cu) and printed back by the same names. Host code only.
#include <algorithm>
#include <string>

#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

// The forward shapes' names, in MmaAttentionTiles::Forward's order.
constexpr const char* kForwardNames[] = {"16x64", "32x64", "32x64s"};
constexpr int kForwardShapes = sizeof(kForwardNames) / sizeof(kForwardNames[0]);

}  // namespace

bool ParseMmaAttentionTiles(const char* text, MmaAttentionTiles* tiles, std::string* error) {
  MmaAttentionTiles parsed = *tiles;
  const std::string all(text);
  size_t at = 0;
  while (at <= all.size()) {
    const size_t comma = std::min(all.find(',', at), all.size());
    const std::string pair = all.substr(at, comma - at);
    at = comma + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string key = pair.substr(0, eq),
                      value = eq == std::string::npos ? "" : pair.substr(eq + 1);
    bool ok = false;
    if (key == "forward") {
      for (int i = 0; i < kForwardShapes; ++i) {
        if (value == kForwardNames[i]) {
          parsed.forward = static_cast<MmaAttentionTiles::Forward>(i);
          ok = true;
        }
      }
    } else if ((key == "dq" || key == "dkv") && (value == "2" || value == "3")) {
      (key == "dq" ? parsed.dq_blocks : parsed.dkv_blocks) = value[0] - '0';
      ok = true;
    }
    if (!ok) {
      std::string shapes;
      for (int i = 0; i < kForwardShapes; ++i) {
        if (i > 0) shapes += '|';
        shapes += kForwardNames[i];
      }
      *error = "\"" + pair + "\" is not one of forward=" + shapes + ", dq=2|3, dkv=2|3";
      return false;
    }
  }
  *tiles = parsed;
  return true;
}

std::string MmaAttentionTilesName(const MmaAttentionTiles& tiles) {
  return std::string("forward=") + kForwardNames[static_cast<int>(tiles.forward)] +
         ",dq=" + std::to_string(tiles.dq_blocks) + ",dkv=" + std::to_string(tiles.dkv_blocks);
}

}  // namespace drover::engine::cuda
