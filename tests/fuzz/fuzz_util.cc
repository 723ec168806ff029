#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/targets.h"

namespace drover::fuzz {

std::string FreshScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  static const std::string dir = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") +
                                 "/drover_fuzz_" + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "fuzz harness: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    std::abort();
  }
  return dir;
}

void WriteFileOrDie(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

std::pair<std::string_view, std::string_view> SplitInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::string_view split(kSplit);
  const size_t at = all.find(split);
  if (at == std::string_view::npos) return {all, {}};
  return {all.substr(0, at), all.substr(at + split.size())};
}

}  // namespace drover::fuzz
