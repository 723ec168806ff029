#include "worker/engine/kernels/precision.h"

namespace drover::engine {

StatusOr<Precision> ParsePrecision(const std::string& dtype) {
  if (dtype == "fp32") return Precision::kFp32;
  if (dtype == "bf16") return Precision::kBf16;
  if (dtype == "fp16") return Precision::kFp16;
  return InvalidArgumentError("precision.dtype: '" + dtype +
                              "' is not a precision; valid: fp32 | bf16 | fp16");
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

}  // namespace drover::engine
