// The compute precision of a training run (precision.dtype): what activations and the
// weights the layers read are stored in. Master weights, gradients and AdamW state stay
// fp32 in every precision; only the compute copy and the activations are narrowed.
#pragma once

#include <string>

#include "common/status.h"

namespace drover::engine {

enum class Precision {
  kFp32,
  kBf16,  // 8 exponent bits, 8 significant bits: fp32's range, no loss scaling needed
  kFp16,  // 5 exponent bits, 11 significant bits: largest finite 65504, needs loss scaling
};

// "fp32" | "bf16" | "fp16"; InvalidArgument naming precision.dtype otherwise.
StatusOr<Precision> ParsePrecision(const std::string& dtype);
const char* PrecisionName(Precision p);

}  // namespace drover::engine
