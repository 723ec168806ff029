// The training programs run as processes, for the integration tests of `drover train`
// and drover-trainer: a scratch directory with a token shard, a job spec writer, and
// fork/exec/wait helpers whose output goes to one log file.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/token_shard.h"

namespace drover {

namespace fs = std::filesystem;

inline const std::string kBin = std::string(DROVER_BIN_DIR) + "/bin/";

// The parameters of an llm.c model file (after its 1024-byte header).
inline std::vector<float> ModelParams(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(1024);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> params(bytes.size() / sizeof(float));
  std::memcpy(params.data(), bytes.data(), params.size() * sizeof(float));
  return params;
}

class TrainProcessFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kBin + "drover") || !fs::exists(kBin + "drover-trainer")) {
      GTEST_SKIP() << "drover and drover-trainer are not built in " << kBin;
    }
    dir_ = fs::path(::testing::TempDir()) /
           ("train_process_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_suite()->name()) + "_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937_64 rng(5);
    std::vector<uint16_t> tokens(6000);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng() % 8 == 0 ? rng() % 32 : static_cast<uint16_t>((i * 7) % 29);
    }
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), tokens).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A spec of `steps` steps checkpointing every `every` steps.
  std::string WriteSpec(int steps, int every, int n_embd = 32) {
    const fs::path path = dir_ / "job.yaml";
    std::ofstream(path) << "name: proc\noutput_dir: " << (dir_ / "out").string()
                        << "\nmodel: {n_layer: 2, n_head: 2, n_embd: " << n_embd
                        << ", block_size: 16, vocab_size: 32}\n"
                        << "data: {train: " << (dir_ / "train.bin").string() << "}\n"
                        << "train: {steps: " << steps
                        << ", global_batch: 4, micro_batch: 4, seq_len: 16, lr: 0.005, "
                           "warmup_steps: 2, eval_every: 0}\n"
                        << "checkpoint: {every_steps: " << every << ", keep_last: 2}\n";
    return path.string();
  }

  // Starts argv with extra environment, output appended to log.txt; inherited fds stay open.
  pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    pid_t pid = fork();
    if (pid == 0) {
      int log = open((dir_ / "log.txt").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log, 1);
      dup2(log, 2);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    return pid;
  }

  static int Wait(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::vector<std::string> MetricsLines() const {
    std::ifstream in(dir_ / "out" / "metrics.jsonl");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }

  std::string Log() const {
    std::ifstream in(dir_ / "log.txt");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

}  // namespace drover
