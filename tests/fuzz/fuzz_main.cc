// One libFuzzer binary per target: CMake compiles this file once per entry point of
// targets.h, naming it in DROVER_FUZZ_ENTRY.
#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return drover::fuzz::DROVER_FUZZ_ENTRY(data, size);
}
