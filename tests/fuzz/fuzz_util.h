// Helpers of the file-based fuzz targets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace drover::fuzz {

// An empty directory of this process's own (created on first use, emptied on each call),
// for the files one input becomes.
std::string FreshScratchDir();

// Writes `bytes` to `path`, replacing it; aborts if it cannot (the harness is broken, not
// the code under test).
void WriteFileOrDie(const std::string& path, std::string_view bytes);

// Splits at the first kSplit: (before, after); (all, "") when there is none.
std::pair<std::string_view, std::string_view> SplitInput(const uint8_t* data, size_t size);

}  // namespace drover::fuzz
