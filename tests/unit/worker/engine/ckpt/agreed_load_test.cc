#include "worker/engine/ckpt/agreed_load.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/ckpt/checkpoint_format.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;

class AgreedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("agreed_load_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Dir(const std::string& name) { return (root_ / name).string(); }
  void Save(const std::string& dir, int64_t step) {
    ASSERT_TRUE(WriteCheckpoint(dir, MakeSnapshot(step, 1000)).ok());
  }
  // Flips one byte of the params shard of step_N/: same size, wrong CRC32C.
  void Corrupt(const std::string& dir, int64_t step) {
    for (const auto& e : fs::directory_iterator(fs::path(dir) / StepDirName(step))) {
      if (e.path().filename().string().rfind("params", 0) != 0) continue;
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x5a');
      return;
    }
    FAIL() << "no params shard in step " << step;
  }

  struct Loaded {
    StatusOr<CheckpointPart> snap = NotFoundError("not run");
    std::string path;
  };
  // Both ranks at once (threads sharing one store); rank r reads from dirs[r].
  std::vector<Loaded> LoadOnTwoRanks(const std::vector<std::string>& dirs) {
    std::vector<Loaded> out(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        AgreedLoadOptions o;
        o.dir = dirs[static_cast<size_t>(r)];
        o.rank = r;
        o.world_size = 2;
        o.store = &store_;
        o.key = "resume";
        o.timeout = std::chrono::seconds(10);
        out[static_cast<size_t>(r)].snap =
            LoadAgreedCheckpoint(o, Everything, &out[static_cast<size_t>(r)].path);
      });
    }
    for (auto& t : ranks) t.join();
    return out;
  }

  // Every element of every arena, as one process resumes.
  static StatusOr<PartRequest> Everything(const std::string&, const v1::CheckpointManifest& m) {
    const auto n = static_cast<size_t>(m.num_params());
    return PartRequest{{{0, n}}, {{0, n}}};
  }
  static std::vector<float> Values(const GlobalPart& part) {
    return std::vector<float>(part.At(0, part.size()), part.At(0, part.size()) + part.size());
  }

  fs::path root_;
  parallel::InMemoryKvStore store_;
};

TEST_F(AgreedLoadTest, EveryRankLoadsTheNewestCheckpoint) {
  Save(Dir("c"), 1);
  Save(Dir("c"), 2);
  auto got = LoadOnTwoRanks({Dir("c"), Dir("c")});
  for (const Loaded& l : got) {
    ASSERT_TRUE(l.snap.ok()) << l.snap.status();
    EXPECT_EQ(l.snap->meta.step(), 2);
    EXPECT_EQ(Values(l.snap->params), MakeSnapshot(2, 1000).params);
    EXPECT_EQ(l.path, Dir("c") + "/step_2");
  }
}

TEST_F(AgreedLoadTest, ACheckpointOneRankFindsBrokenIsSkippedByAll) {
  // Rank 1 sees a copy whose newest checkpoint is corrupt (say, a bad disk on its node);
  // rank 0's copy is sound. Both must resume from step 1.
  Save(Dir("good"), 1);
  Save(Dir("good"), 2);
  fs::copy(Dir("good"), Dir("bad"), fs::copy_options::recursive);
  Corrupt(Dir("bad"), 2);
  auto got = LoadOnTwoRanks({Dir("good"), Dir("bad")});
  for (const Loaded& l : got) {
    ASSERT_TRUE(l.snap.ok()) << l.snap.status();
    EXPECT_EQ(l.snap->meta.step(), 1);
    EXPECT_EQ(Values(l.snap->adam_v), MakeSnapshot(1, 1000).adam_v);
  }
}

TEST_F(AgreedLoadTest, NoUsableCheckpointFailsEveryRankAndRankZeroSaysWhy) {
  Save(Dir("c"), 1);
  Save(Dir("c"), 2);
  Corrupt(Dir("c"), 2);
  fs::remove(fs::path(Dir("c")) / "step_1" / "manifest.json");
  auto got = LoadOnTwoRanks({Dir("c"), Dir("c")});
  for (const Loaded& l : got) {
    EXPECT_EQ(l.snap.status().code(), StatusCode::kFailedPrecondition) << l.snap.status();
  }
  const std::string why(got[0].snap.status().message());
  EXPECT_NE(why.find("CRC32C mismatch"), std::string::npos) << why;
  EXPECT_NE(why.find("step_1: no readable manifest.json"), std::string::npos) << why;
}

TEST_F(AgreedLoadTest, NoCheckpointIsNotFoundOnEveryRank) {
  auto got = LoadOnTwoRanks({Dir("none"), Dir("none")});
  for (const Loaded& l : got) EXPECT_EQ(l.snap.status().code(), StatusCode::kNotFound);
}

TEST(CheckCheckpointShapeTest, CatchesWhatNeedsNoShardRead) {
  const fs::path dir = fs::path(::testing::TempDir()) / "shape_check";
  fs::remove_all(dir);
  ASSERT_TRUE(WriteCheckpoint(dir.string(), MakeSnapshot(3, 500)).ok());
  const std::string step_dir = (dir / "step_3").string();
  EXPECT_TRUE(CheckCheckpointShape(step_dir, 3).ok());
  EXPECT_EQ(CheckCheckpointShape(step_dir, 4).code(), StatusCode::kDataLoss);
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (e.path().filename().string().rfind("adam_m", 0) == 0) fs::resize_file(e.path(), 12);
  }
  Status st = CheckCheckpointShape(step_dir, 3);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("the file is 12 bytes, the manifest says 2000"), std::string::npos)
      << st;
  fs::remove_all(dir);
}

// Found by tests/fuzz (checkpoint target): the manifest is believed about num_params only
// as far as the files on disk go, and shard names stay inside the step directory.
TEST(CheckCheckpointShapeTest, RefusesHugeNumParamsAndShardsOutsideTheDirectory) {
  const fs::path dir = fs::path(::testing::TempDir()) / "shape_check_hostile";
  fs::remove_all(dir);
  ASSERT_TRUE(WriteCheckpoint(dir.string(), MakeSnapshot(3, 500)).ok());
  const std::string step_dir = (dir / "step_3").string();
  auto rewrite = [&](auto edit) {
    auto m = ReadManifest(step_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    edit(&*m);
    auto json = internal::SealManifest(*m);  // sealed anew: the edit is the test's
    ASSERT_TRUE(json.ok()) << json.status();
    std::ofstream(fs::path(step_dir) / "manifest.json", std::ios::trunc) << *json;
  };
  rewrite([](v1::CheckpointManifest* m) {
    m->set_num_params(1'000'000'000'000);
    for (auto& sh : *m->mutable_shards()) {
      for (auto& r : *sh.mutable_runs()) r.set_length(1'000'000'000'000);
    }
  });
  auto huge = ReadCheckpoint(step_dir);  // allocated terabytes before the fix
  EXPECT_EQ(huge.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(huge.status().message().find("1000000000000 fp32 parameters"), std::string::npos)
      << huge.status();
  rewrite([](v1::CheckpointManifest* m) {
    m->set_num_params(500);
    m->mutable_shards(0)->set_file("../../etc/hostname");
  });
  Status outside = CheckCheckpointShape(step_dir, 3);
  EXPECT_EQ(outside.code(), StatusCode::kDataLoss);
  EXPECT_NE(outside.message().find("not a file in the checkpoint directory"), std::string::npos)
      << outside;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace drover::engine::ckpt
