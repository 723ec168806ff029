// `drover ckpt ls DIR` and `drover ckpt verify DIR|STEP_DIR`: what a checkpoint directory
// holds and whether a resume could use it, without a coordinator.
//
// ls reads manifests only (fast); verify reads every shard and checks its size and CRC32C,
// as a resuming trainer does. verify exits 0 when every checkpoint it checked is usable, 1
// when one is not (naming it and why), 2 when there is nothing to check.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "worker/engine/ckpt/checkpoint.h"

namespace drover::cli {
namespace {

namespace fs = std::filesystem;

struct CkptFlags {
  std::string dir;
};

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

std::string HumanBytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / double(1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / double(1ull << 20));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  }
  return buf;
}

std::string ModifiedTime(const std::string& path) {
  std::error_code ec;
  auto t = fs::last_write_time(path, ec);
  if (ec) return "?";
  const std::time_t tt = std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(t));
  char buf[32];
  std::tm tm{};
  localtime_r(&tt, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int RunLs(const CkptFlags& f) {
  const auto all = engine::ckpt::ListCheckpoints(f.dir);
  if (all.empty()) {
    std::fprintf(stderr, "drover ckpt ls: no checkpoint (step_N/) in %s\n", f.dir.c_str());
    return kExitUsage;
  }
  std::printf("%-10s %-10s %-12s %-10s %-20s %s\n", "STEP", "SAMPLES", "WORLD", "SIZE", "WRITTEN",
              "PATH");
  for (const auto& [step, path] : all) {
    auto m = engine::ckpt::ReadManifest(path);
    const std::string samples = m.ok() ? std::to_string(m->consumed_samples()) : "-";
    const std::string world = m.ok() ? std::to_string(m->world_size()) : "-";
    std::printf("%-10lld %-10s %-12s %-10s %-20s %s%s\n", static_cast<long long>(step),
                samples.c_str(), world.c_str(), HumanBytes(DirBytes(path)).c_str(),
                ModifiedTime(path).c_str(), path.c_str(),
                m.ok() ? "" : ("   BROKEN: " + m.status().message()).c_str());
  }
  return kExitOk;
}

int RunVerify(const CkptFlags& f) {
  // A step directory itself, or a checkpoint directory holding several.
  std::vector<std::pair<int64_t, std::string>> checks;
  if (fs::exists(fs::path(f.dir) / engine::ckpt::kManifestFile)) {
    auto m = engine::ckpt::ReadManifest(f.dir);
    checks.emplace_back(m.ok() ? m->step() : -1, f.dir);
  } else {
    checks = engine::ckpt::ListCheckpoints(f.dir);
  }
  if (checks.empty()) {
    std::fprintf(stderr, "drover ckpt verify: no checkpoint (step_N/) in %s\n", f.dir.c_str());
    return kExitUsage;
  }
  int bad = 0;
  for (const auto& [step, path] : checks) {
    auto snap = engine::ckpt::VerifyCheckpoint(path, step);
    if (snap.ok()) {
      std::printf("ok      %s  (step %lld, %lld parameters, %d shards)\n", path.c_str(),
                  static_cast<long long>(step), static_cast<long long>(snap->meta.num_params()),
                  snap->meta.shards_size());
    } else {
      ++bad;
      std::printf("BROKEN  %s\n", snap.status().message().c_str());
    }
  }
  if (bad > 0) {
    std::fprintf(stderr, "drover ckpt verify: %d of %zu checkpoints cannot be used\n", bad,
                 checks.size());
    return kExitFailure;
  }
  return kExitOk;
}

CommandRun SetupCkpt(CLI::App* app, GlobalOptions*) {
  auto f = std::make_shared<CkptFlags>();
  app->require_subcommand(1);
  CLI::App* ls = app->add_subcommand("ls", "List the checkpoints in DIR, newest first");
  ls->add_option("dir", f->dir, "checkpoint directory (checkpoint.dir)")->required();
  CLI::App* verify = app->add_subcommand(
      "verify", "Read every shard and check sizes and CRC32C, as a resume does");
  verify->add_option("dir", f->dir, "checkpoint directory, or one step_N directory")->required();
  return [f, ls] { return ls->parsed() ? RunLs(*f) : RunVerify(*f); };
}

DROVER_REGISTER_COMMAND("ckpt", "List and verify checkpoints", SetupCkpt);

}  // namespace
}  // namespace drover::cli
