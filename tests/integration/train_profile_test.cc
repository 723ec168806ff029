// `drover train --profile-ops`: the real binary trains a small model and prints where the
// steps' time went, op by op (kernels/profiled_ops.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/token_shard.h"
#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

namespace fs = std::filesystem;

class TrainProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("train_profile_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::vector<uint16_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 64);
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), tokens).ok());
    std::ofstream(dir_ / "job.yaml")
        << "name: profile\noutput_dir: " << (dir_ / "out").string()
        << "\ndata: {train: " << (dir_ / "train.bin").string()
        << "}\nmodel: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
           "train: {steps: 3, global_batch: 2, micro_batch: 2, seq_len: 16, eval_every: 0}\n"
           "checkpoint: {every_steps: 0}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

TEST_F(TrainProfileTest, PrintsEveryLayerOpWithTheGemmRates) {
  CliResult r = RunCli(dir_, {"train", (dir_ / "job.yaml").string(), "--profile-ops"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ops profile over 3 steps (cpu):"), std::string::npos) << r.out;
  for (const char* op :
       {"MatmulForward", "MatmulBackward", "AttentionForward", "AttentionBackward",
        "LayerNormBackward", "CrossEntropyForward", "AdamWUpdate", "EncoderBackward"}) {
    EXPECT_NE(r.out.find(op), std::string::npos) << op << "\n" << r.out;
  }
  // The GEMMs report a rate; the row of a memory op has none.
  const size_t matmul = r.out.find("\nMatmulForward");
  ASSERT_NE(matmul, std::string::npos) << r.out;
  const std::string row = r.out.substr(matmul + 1, r.out.find('\n', matmul + 1) - matmul - 1);
  EXPECT_NE(row.find('.'), std::string::npos) << row;
  EXPECT_NE(r.out.find("(each op synchronised: no overlap)"), std::string::npos) << r.out;
}

TEST_F(TrainProfileTest, WithSeveralProcessesItIsRefused) {
  CliResult r =
      RunCli(dir_, {"train", (dir_ / "job.yaml").string(), "--profile-ops", "--nproc", "2"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--profile-ops profiles the training of one process"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace drover::testing
