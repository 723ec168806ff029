// drover-fake-trainer: a scripted trainer for control-plane tests. It speaks the real
// agent protocol (worker/trainer_env.h, worker/trainer_reporter.h) but trains nothing.
//
// From the job spec it reads train.steps, output_dir and checkpoint.{dir,every_steps}.
// What it does is scripted by environment variables (inherited from its worker, set by the
// test) or by key=value lines in <output_dir>/fake_trainer.conf (same keys, lower case
// without the prefix, e.g. "crash_at_step=5"); the file wins:
//   DROVER_FAKE_STEP_MS         time per step (default 50)
//   DROVER_FAKE_CRASH_AT_STEP   crash when about to run this step ...
//   DROVER_FAKE_CRASH_ATTEMPT   ... only in this attempt (default 1; 0 = every attempt)
//   DROVER_FAKE_CRASH_RANK      ... only on this rank (default 0; -1 = every rank)
//   DROVER_FAKE_CRASH_MODE      exit:N (default exit:4: a crash, not a GPU fault) | abort
//   DROVER_FAKE_HANG_AT_STEP    stop making progress at this step (same attempt/rank
//   DROVER_FAKE_HANG_ATTEMPT    filters as crash; default attempt 1, rank 0)
//   DROVER_FAKE_HANG_RANK
//   DROVER_FAKE_IGNORE_SIGTERM  1: ignore SIGTERM (tests the SIGKILL escalation)
//   DROVER_FAKE_MFU             model FLOPs utilisation to report (default 0: unknown)
//   DROVER_FAKE_HELLASWAG       1: evaluation steps also report a HellaSwag accuracy
// Each step reports loss 5/step, lr train.lr (default 1e-3) on a cosine over train.steps,
// and, every train.eval_every steps, a validation loss 1.1x the step's loss (and with
// hellaswag=1 an accuracy of 0.25 + step / 10000, at most 1).
// Checkpoints (rank 0, every checkpoint.every_steps): <dir>/step_N.tmp/manifest.json, then
// renamed to step_N/ and reported. A resume starts after DROVER_RESUME_CHECKPOINT's step.
#include <signal.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "worker/trainer_env.h"
#include "worker/trainer_reporter.h"

namespace {

using Config = std::map<std::string, std::string>;

std::string Get(const Config& c, const std::string& key, const std::string& def) {
  auto it = c.find(key);
  return it == c.end() ? def : it->second;
}
int64_t GetInt(const Config& c, const std::string& key, int64_t def) {
  std::string v = Get(c, key, "");
  return v.empty() ? def : std::stoll(v);
}

Config LoadConfig(const std::string& output_dir) {
  Config c;
  const char* keys[] = {"step_ms",        "crash_at_step", "crash_attempt", "crash_rank",
                        "crash_mode",     "hang_at_step",  "hang_attempt",  "hang_rank",
                        "ignore_sigterm", "mfu",           "hellaswag"};
  for (const char* k : keys) {
    std::string env = "DROVER_FAKE_" + std::string(k);
    for (char& ch : env) ch = static_cast<char>(toupper(ch));
    if (const char* v = std::getenv(env.c_str())) c[k] = v;
  }
  std::ifstream in(output_dir + "/fake_trainer.conf");
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) c[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return c;
}

bool Applies(const Config& c, const std::string& what, const drover::TrainerEnv& env) {
  int64_t attempt = GetInt(c, what + "_attempt", 1);
  int64_t rank = GetInt(c, what + "_rank", 0);
  return (attempt == 0 || attempt == env.attempt) && (rank < 0 || rank == env.rank);
}

int64_t ResumeStep(const std::string& dir) {
  if (dir.empty()) return 0;
  std::ifstream in(dir + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = text.find("\"step\":");
  if (pos == std::string::npos) return -1;
  return std::stoll(text.substr(pos + 7));
}

}  // namespace

int main() {
  auto env_or = drover::ReadTrainerEnv();
  if (!env_or.ok()) {
    std::cerr << "fake-trainer: " << env_or.status() << "\n";
    return 2;
  }
  const drover::TrainerEnv env = *env_or;
  YAML::Node spec;
  try {
    spec = YAML::LoadFile(env.spec_path);
  } catch (const std::exception& e) {
    std::cerr << "fake-trainer: cannot read spec '" << env.spec_path << "': " << e.what() << "\n";
    return 2;
  }
  const std::string name = spec["name"] ? spec["name"].as<std::string>() : "job";
  const std::string output_dir =
      spec["output_dir"] ? spec["output_dir"].as<std::string>() : "runs/" + name;
  const int64_t steps = spec["train"]["steps"] ? spec["train"]["steps"].as<int64_t>() : 2000;
  std::string ckpt_dir = output_dir + "/ckpt";
  int64_t every = 200;
  if (spec["checkpoint"]) {
    if (spec["checkpoint"]["dir"] && !spec["checkpoint"]["dir"].as<std::string>().empty()) {
      ckpt_dir = spec["checkpoint"]["dir"].as<std::string>();
    }
    if (spec["checkpoint"]["every_steps"]) every = spec["checkpoint"]["every_steps"].as<int64_t>();
  }
  const double base_lr = spec["train"]["lr"] ? spec["train"]["lr"].as<double>() : 1e-3;
  const int64_t eval_every =
      spec["train"]["eval_every"] ? spec["train"]["eval_every"].as<int64_t>() : 0;
  const Config conf = LoadConfig(output_dir);
  const double mfu = std::stod(Get(conf, "mfu", "0"));
  const bool hellaswag = Get(conf, "hellaswag", "0") == "1";
  const int64_t step_ms = GetInt(conf, "step_ms", 50);
  if (GetInt(conf, "ignore_sigterm", 0) != 0) signal(SIGTERM, SIG_IGN);
  const int64_t crash_at = Applies(conf, "crash", env) ? GetInt(conf, "crash_at_step", -1) : -1;
  const int64_t hang_at = Applies(conf, "hang", env) ? GetInt(conf, "hang_at_step", -1) : -1;

  drover::TrainerReporter reporter = drover::TrainerReporter::FromEnv();
  int64_t start = ResumeStep(env.resume_checkpoint);
  if (start < 0) {
    std::cerr << "fake-trainer: bad resume checkpoint " << env.resume_checkpoint << "\n";
    return 1;
  }
  std::printf("fake-trainer job %s attempt %lld rank %d/%d pid %d starting after step %lld\n",
              env.job_id.c_str(), static_cast<long long>(env.attempt), env.rank, env.world_size,
              getpid(), static_cast<long long>(start));
  std::fflush(stdout);
  reporter.Phase("started");
  for (int64_t step = start + 1; step <= steps; ++step) {
    if (step == crash_at) {
      std::printf("fake-trainer: crashing at step %lld as scripted\n",
                  static_cast<long long>(step));
      std::fflush(stdout);
      std::string mode = Get(conf, "crash_mode", "exit:4");
      if (mode == "abort") std::abort();
      return std::stoi(mode.substr(mode.find(':') + 1));
    }
    if (step == hang_at) {
      std::printf("fake-trainer: hanging at step %lld as scripted\n", static_cast<long long>(step));
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    double loss = 5.0 / static_cast<double>(step);
    std::printf("step %lld loss %.4f\n", static_cast<long long>(step), loss);
    std::fflush(stdout);
    drover::TrainerReporter::StepExtras extras;
    extras.lr = base_lr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(step) / steps));
    if (eval_every > 0 && step % eval_every == 0) {
      extras.val_loss = 1.1 * loss;
      if (hellaswag) extras.hellaswag = std::min(1.0, 0.25 + static_cast<double>(step) / 10000);
    }
    extras.mfu = mfu;
    reporter.Progress(step, static_cast<double>(step_ms), loss, 1000.0, extras);
    if (env.rank == 0 && every > 0 && step % every == 0) {
      namespace fs = std::filesystem;
      const std::string final_dir = ckpt_dir + "/step_" + std::to_string(step);
      const std::string tmp_dir = final_dir + ".tmp";
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
      fs::create_directories(tmp_dir, ec);
      std::ofstream(tmp_dir + "/manifest.json")
          << "{\"step\":" << step << ",\"attempt\":" << env.attempt << "}\n";
      fs::remove_all(final_dir, ec);
      fs::rename(tmp_dir, final_dir, ec);
      if (!ec) {
        drover::v1::CheckpointRecord record;
        record.set_job_id(env.job_id);
        record.set_attempt(env.attempt);
        record.set_step(step);
        record.set_path(fs::absolute(final_dir).string());
        record.set_consumed_samples(step);
        record.set_world_size(env.world_size);
        reporter.Checkpoint(record);
      }
    }
  }
  std::printf("fake-trainer: done after step %lld\n", static_cast<long long>(steps));
  std::fflush(stdout);
  reporter.Done();
  return 0;
}
