// `drover version`: prints the build's version.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"

namespace drover::cli {
namespace {

DROVER_REGISTER_COMMAND("version", "Print drover's version", [](CLI::App*, GlobalOptions*) {
  return CommandRun([] {
    std::printf("drover %s\n", kDroverVersion);
    return static_cast<int>(kExitOk);
  });
});

}  // namespace
}  // namespace drover::cli
