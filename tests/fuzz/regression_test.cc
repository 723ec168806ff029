// Replays, in the normal build, every input a fuzzer once crashed on
// (tests/fuzz/regressions/<target>/) and the seed corpus (tests/fuzz/corpus/<target>/)
// through the entry points the fuzzers run. Catches only crashes, aborts and (under
// `make test SANITIZE=address`) memory errors: the targets check no outputs beyond the
// properties they abort on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>

#include "tests/fuzz/targets.h"

namespace drover::fuzz {

// Names the parameter in test listings (gtest would print its bytes). Outside the
// anonymous namespace, where argument-dependent lookup finds it.
void PrintTo(const Target& t, std::ostream* os) { *os << t.name; }

namespace {

int ReplayDir(const Target& t, const std::string& kind) {
  const std::filesystem::path dir =
      std::filesystem::path(DROVER_SOURCE_DIR) / "tests/fuzz" / kind / t.name;
  if (!std::filesystem::is_directory(dir)) return 0;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(entry.path().string());
    EXPECT_EQ(t.entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
    ++n;
  }
  return n;
}

class FuzzRegressionTest : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzRegressionTest, EveryKeptCrashAndSeedRunsWithoutCrashing) {
  const int seeds = ReplayDir(GetParam(), "corpus");
  ReplayDir(GetParam(), "regressions");
  EXPECT_GT(seeds, 0) << "tests/fuzz/corpus/" << GetParam().name << " has no seeds";
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegressionTest, ::testing::ValuesIn(kTargets),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace drover::fuzz
