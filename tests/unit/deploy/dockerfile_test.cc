// deploy/Dockerfile, checked without a Docker daemon (none runs where the tests run): it
// builds from Debian images and Debian packages only, and the image holds every program
// that the Kubernetes manifests and the systemd units start. Whether the runtime packages
// carry every shared library the programs need is image_libraries_test.sh's business.
#include "tests/unit/deploy/dockerfile.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>

namespace drover::testing {
namespace {

const std::string kSource = DROVER_SOURCE_DIR;

std::string ReadAllText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(DockerfileTest, EveryStageStartsFromADebianImage) {
  auto stages = ReadDockerfile(kSource + "/deploy/Dockerfile");
  ASSERT_EQ(stages.size(), 2u) << "expected a build stage and a runtime stage";
  for (const DockerStage& s : stages) {
    EXPECT_TRUE(std::regex_match(s.image, std::regex("debian:[a-z]+(-slim)?")))
        << "FROM " << s.image << " is not an official Debian image";
  }
  EXPECT_EQ(stages[0].name, "build");
}

// Everything installed comes from Debian's archive through apt-get (directly, or through
// install-deps.sh): nothing fetched with curl, wget, pip, git or an ADD of a URL.
TEST(DockerfileTest, InstallsOnlyDebianPackagesThroughAptGet) {
  const std::regex foreign(R"((^|[\s;&|(])(curl|wget|pip3?|npm|git|gem|cargo|go)\s)");
  int apt_installs = 0;
  for (const DockerStage& s : ReadDockerfile(kSource + "/deploy/Dockerfile")) {
    for (const DockerInstruction& ins : s.instructions) {
      if (ins.keyword == "ADD") {
        EXPECT_EQ(ins.args.find("://"), std::string::npos)
            << "line " << ins.line << ": ADD of a URL";
      }
      if (ins.keyword != "RUN") continue;
      EXPECT_FALSE(std::regex_search(ins.args, foreign))
          << "line " << ins.line << " fetches outside apt: " << ins.args;
      if (ins.args.find("apt-get install") != std::string::npos ||
          ins.args.find("install-deps.sh") != std::string::npos) {
        ++apt_installs;
      }
    }
  }
  EXPECT_EQ(apt_installs, 2) << "one install per stage (install-deps.sh, then apt-get)";
  // The build stage's package list: apt-get and nothing else.
  const std::string deps = ReadAllText(kSource + "/deploy/install-deps.sh");
  ASSERT_FALSE(deps.empty());
  EXPECT_NE(deps.find("apt-get install"), std::string::npos);
  EXPECT_FALSE(std::regex_search(deps, foreign)) << "install-deps.sh fetches outside apt";
}

TEST(DockerfileTest, TheImageHoldsEveryProgramItBuilds) {
  auto stages = ReadDockerfile(kSource + "/deploy/Dockerfile");
  ASSERT_FALSE(stages.empty());
  std::set<std::string> targets;
  for (const DockerInstruction& ins : stages[0].instructions) {
    const size_t at = ins.args.find("--target");
    if (ins.keyword != "RUN" || at == std::string::npos) continue;
    for (const std::string& w : SplitWords(ins.args.substr(at + 8))) {
      if (w.rfind("-", 0) == 0 || w == "&&") break;
      targets.insert(w);
    }
  }
  const std::set<std::string> want = {"drover", "drover-coordinator", "drover-worker",
                                      "drover-trainer"};
  EXPECT_EQ(targets, want) << "cmake --build --target in the build stage";
  EXPECT_EQ(ImageBinaries(stages), want) << "COPY --from=build ... /usr/local/bin/";
}

// The systemd units start /usr/local/bin/<program>: the same programs the image installs
// there (systemd_verify_test.sh checks the units themselves).
TEST(DockerfileTest, SystemdUnitsStartProgramsTheImageInstalls) {
  const std::set<std::string> bins = ImageBinaries(ReadDockerfile(kSource + "/deploy/Dockerfile"));
  for (const char* unit : {"drover-coordinator", "drover-worker"}) {
    const std::string text = ReadAllText(kSource + "/deploy/systemd/" + unit + ".service");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(ExecStart=/usr/local/bin/(\S+))")))
        << unit;
    EXPECT_TRUE(bins.count(m[1].str())) << unit << " starts " << m[1] << ", not in the image";
  }
}

}  // namespace
}  // namespace drover::testing
