// worker/engine/ckpt/checkpoint_model.h: a checkpoint is a model to sample, evaluate and
// export, through the same LoadModelFile every model-taking command calls.
#include "worker/engine/ckpt/checkpoint_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/model/model_file.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;

class CheckpointModelTest : public ::testing::Test {
 protected:
  CheckpointModelTest() {
    dir_ = fs::path(::testing::TempDir()) /
           ("checkpoint_model_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  ~CheckpointModelTest() override { fs::remove_all(dir_); }

  static GptConfig Config() { return GptConfig{16, 64, 128, 2, 2, 8}; }
  // Writes step `step` of a model initialised from `seed`, as a trainer records it.
  std::vector<float> Write(int64_t step, uint64_t seed, GptConfig config = Config(),
                           int64_t num_params = -1) {
    Gpt model(Config());
    model.InitRandom(seed);
    CheckpointSnapshot s;
    s.meta.set_step(step);
    s.meta.set_world_size(1);
    *s.meta.mutable_model() = ModelConfigProto(config);
    s.meta.set_num_params(num_params >= 0 ? num_params : static_cast<int64_t>(model.num_params()));
    s.params.assign(model.params(), model.params() + model.num_params());
    s.adam_m.assign(model.num_params(), 0.5f);
    s.adam_v.assign(model.num_params(), 0.25f);
    EXPECT_TRUE(WriteCheckpoint(dir_.string(), s).ok());
    return s.params;
  }
  static std::vector<float> ParamsOf(const Gpt& m) {
    return std::vector<float>(m.params(), m.params() + m.num_params());
  }

  fs::path dir_;
};

TEST_F(CheckpointModelTest, AStepDirectoryOrTheNewestOfADirectoryLoadsAsAModel) {
  const std::vector<float> five = Write(5, 1);
  const std::vector<float> nine = Write(9, 2);
  EXPECT_FALSE(IsCheckpointPath((dir_ / "nope").string()));
  EXPECT_TRUE(IsCheckpointPath(dir_.string()));
  EXPECT_TRUE(IsCheckpointPath((dir_ / "step_5").string()));

  auto at5 = LoadModelFile((dir_ / "step_5").string());
  ASSERT_TRUE(at5.ok()) << at5.status();
  EXPECT_EQ((*at5)->config(), Config());
  EXPECT_EQ(ParamsOf(**at5), five);
  std::string chosen;
  auto newest = LoadCheckpointModel(dir_.string(), &chosen);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(ParamsOf(**newest), nine);
  EXPECT_EQ(chosen, (dir_ / "step_9").string());
  auto config = ReadModelFileConfig(dir_.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, Config());
}

// A broken newest checkpoint (a flipped byte of its parameters) is skipped for the one before,
// as a resume skips it; asked for by name, it is refused naming the damage.
TEST_F(CheckpointModelTest, ABrokenNewestCheckpointIsSkippedAndRefusedByName) {
  const std::vector<float> five = Write(5, 1);
  Write(9, 2);
  std::string params_file;
  for (const auto& e : fs::directory_iterator(dir_ / "step_9")) {
    if (e.path().filename().string().rfind("params", 0) == 0) params_file = e.path().string();
  }
  ASSERT_FALSE(params_file.empty());
  {
    std::fstream f(params_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  std::string chosen;
  auto model = LoadCheckpointModel(dir_.string(), &chosen);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(chosen, (dir_ / "step_5").string());
  EXPECT_EQ(ParamsOf(**model), five);
  auto broken = LoadModelFile((dir_ / "step_9").string());
  ASSERT_EQ(broken.status().code(), StatusCode::kDataLoss) << broken.status();
  EXPECT_NE(broken.status().message().find("params"), std::string::npos) << broken.status();
}

TEST_F(CheckpointModelTest, AManifestWhoseModelIsNoModelOrDisagreesWithItsSizeIsRefused) {
  GptConfig no_heads = Config();
  no_heads.num_heads = 0;
  Write(3, 1, no_heads);
  auto refused = LoadModelFile((dir_ / "step_3").string());
  ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find("its model is no model"), std::string::npos)
      << refused.status();
  EXPECT_EQ(ReadModelFileConfig((dir_ / "step_3").string()).status().code(), StatusCode::kDataLoss);

  fs::remove_all(dir_);
  GptConfig wider = Config();
  wider.channels = 16;  // more parameters than the arenas hold
  Write(4, 1, wider, static_cast<int64_t>(GptNumParams(Config())));
  refused = LoadModelFile((dir_ / "step_4").string());
  ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find("which its model"), std::string::npos)
      << refused.status();
  // A layer count no file could hold is refused in closed form, not by walking its layers.
  fs::remove_all(dir_);
  GptConfig deep = Config();
  deep.num_layers = 458753;
  Write(6, 1, deep, static_cast<int64_t>(GptNumParams(Config())));
  EXPECT_EQ(LoadModelFile((dir_ / "step_6").string()).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace drover::engine::ckpt
