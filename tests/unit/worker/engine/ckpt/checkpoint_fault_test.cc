// Checkpoint saves under a failing or crashing file system (the fault-injecting fake): a
// full disk, EIO on fsync, a short write or a power loss at any step of a save must leave
// the previous checkpoint loadable, no *.tmp behind after a reported failure, and never a
// step_N/ that does not load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/common/fault_injection_fs.h"
#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/ckpt/async_writer.h"
#include "worker/engine/ckpt/checkpoint.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using Fake = testing::FaultInjectionFileSystem;
using Op = Fake::Op;

constexpr size_t kParams = 256;

class CkptFaultTest : public ::testing::Test {
 protected:
  // The test's root exists and is durable (made outside the fake); the checkpoint directory
  // below it is made by the first save, through the fake.
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("ckpt_fault_test_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Dir() const { return (root_ / "ckpt").string(); }

  // A fresh checkpoint directory holding a durable step_1, and a fresh fake.
  void ResetWithStep1() {
    fs::remove_all(Dir());
    fake_ = std::make_unique<Fake>(FileSystem::Default());
    ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(1, kParams), fake_.get()).ok());
    fake_->ResetCounts();
  }

  // The calls of `op` in one clean save of step 2 over step 1.
  int CleanCount(Op op) {
    ResetWithStep1();
    EXPECT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get()).ok());
    return fake_->Count(op);
  }

  std::vector<std::string> TmpEntries() const {
    std::vector<std::string> tmp;
    for (const auto& e : fs::directory_iterator(Dir())) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp") != std::string::npos) tmp.push_back(name);
    }
    return tmp;
  }

  // Every step_N/ verifies, and the newest is step 1 or 2. Returns the step loaded.
  int64_t ExpectOnlyLoadableCheckpoints(const std::string& what) {
    for (const auto& [step, path] : ListCheckpoints(Dir())) {
      auto snap = VerifyCheckpoint(path, step);
      EXPECT_TRUE(snap.ok()) << what << ": " << snap.status();
    }
    auto latest = LoadLatestCheckpoint(Dir());
    EXPECT_TRUE(latest.ok()) << what << ": " << latest.status();
    if (!latest.ok()) return -1;
    EXPECT_THAT(latest->meta.step(), AnyOf(1, 2)) << what;
    EXPECT_EQ(latest->params, MakeSnapshot(latest->meta.step(), kParams).params) << what;
    return latest->meta.step();
  }

  fs::path root_;
  std::unique_ptr<Fake> fake_;
};

TEST_F(CkptFaultTest, FullDiskOnEachWriteFailsNamingTheFileAndKeepsThePrevious) {
  const int writes = CleanCount(Op::kAppend);
  ASSERT_EQ(writes, 4);  // three arenas and the manifest
  const char* files[] = {"params.r0.bin", "adam_m.r0.bin", "adam_v.r0.bin", kManifestFile};
  for (int nth = 1; nth <= writes; ++nth) {
    ResetWithStep1();
    fake_->FailNth(Op::kAppend, nth, ENOSPC);
    auto saved = WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get());
    const std::string what = "ENOSPC on write " + std::to_string(nth);
    ASSERT_FALSE(saved.ok()) << what;
    EXPECT_EQ(saved.status().code(), StatusCode::kResourceExhausted) << saved.status();
    EXPECT_THAT(saved.status().message(), HasSubstr(files[nth - 1])) << what;
    EXPECT_TRUE(TmpEntries().empty()) << what;
    EXPECT_FALSE(fs::exists(fs::path(Dir()) / "step_2")) << what;
    EXPECT_EQ(ExpectOnlyLoadableCheckpoints(what), 1);
  }
}

TEST_F(CkptFaultTest, EioOnEachFsyncFailsTheSaveAndLeavesNoTmp) {
  const int syncs = CleanCount(Op::kSync);
  ASSERT_EQ(syncs, 4);
  for (int nth = 1; nth <= syncs; ++nth) {
    ResetWithStep1();
    fake_->FailNth(Op::kSync, nth, EIO);
    auto saved = WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get());
    const std::string what = "EIO on fsync " + std::to_string(nth);
    ASSERT_FALSE(saved.ok()) << what;
    EXPECT_THAT(saved.status().message(), HasSubstr("fsync " + Dir())) << what;
    EXPECT_TRUE(TmpEntries().empty()) << what;
    EXPECT_EQ(ExpectOnlyLoadableCheckpoints(what), 1);
  }
}

TEST_F(CkptFaultTest, ShortWriteOfAShardFailsTheSaveAndLeavesNoTmp) {
  ResetWithStep1();
  fake_->ShortWriteNth(2, ENOSPC);
  auto saved = WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get());
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("adam_m.r0.bin"));
  EXPECT_TRUE(TmpEntries().empty());
  EXPECT_EQ(ExpectOnlyLoadableCheckpoints("short write"), 1);
  // The disk has room again: the next save goes through.
  fake_->ClearFaults();
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get()).ok());
  EXPECT_EQ(ExpectOnlyLoadableCheckpoints("after the disk recovered"), 2);
}

// Whatever single step of a save fails, what is on disk loads, before and after a crash.
TEST_F(CkptFaultTest, EveryFailedStepLeavesOnlyCheckpointsThatLoad) {
  for (Op op : {Op::kMakeDirs, Op::kCreate, Op::kAppend, Op::kSync, Op::kClose, Op::kRemove,
                Op::kRename, Op::kSyncDir}) {
    const int calls = CleanCount(op);
    for (int nth = 1; nth <= calls; ++nth) {
      ResetWithStep1();
      fake_->FailNth(op, nth, EIO);
      auto saved = WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get());
      const std::string what = "EIO on call " + std::to_string(nth) + " of op " +
                               std::to_string(static_cast<int>(op)) + ": " +
                               saved.status().ToString();
      if (!saved.ok()) {
        EXPECT_TRUE(TmpEntries().empty()) << what;
      }
      ExpectOnlyLoadableCheckpoints(what);
      fake_->DropUnsyncedData();
      ExpectOnlyLoadableCheckpoints(what + ", then a crash");
    }
  }
}

// Power lost after the shards and the manifest are durable in step_2.a0.tmp/ but before the
// rename publishes it: step 1 is still the newest complete checkpoint.
TEST_F(CkptFaultTest, CrashBeforeTheCommitRenameLeavesThePreviousAsNewest) {
  ResetWithStep1();
  fake_->CrashBeforeNth(Op::kRename, 1);
  EXPECT_FALSE(WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get()).ok());
  ASSERT_TRUE(fake_->crashed());
  ASSERT_EQ(ListCheckpoints(Dir()).size(), 1u);
  EXPECT_EQ(ExpectOnlyLoadableCheckpoints("crash before the rename"), 1);
  // After the reboot the same step saves again over its leftover.
  fake_->ClearFaults();
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get()).ok());
  EXPECT_EQ(ExpectOnlyLoadableCheckpoints("saved again"), 2);
}

// Power lost after the rename but before the fsync of the checkpoint directory: the rename
// may or may not have reached the disk, so either checkpoint may be the newest, but each
// that exists loads.
TEST_F(CkptFaultTest, CrashAfterTheRenameBeforeTheDirFsyncLeavesOldOrNew) {
  ResetWithStep1();
  fake_->CrashBeforeNth(Op::kSyncDir, 2);  // 1: step_2.a0.tmp/, 2: the checkpoint directory
  EXPECT_FALSE(WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get()).ok());
  ASSERT_TRUE(fake_->crashed());
  ExpectOnlyLoadableCheckpoints("crash after the rename");
}

// A power loss before each step of a save in turn, and one right after it returned: only
// loadable checkpoints survive, and a save that returned OK survives whole.
TEST_F(CkptFaultTest, CrashAtEveryStepOfASaveLeavesOnlyCheckpointsThatLoad) {
  const int steps = CleanCount(Op::kAny);
  for (int k = 1; k <= steps + 1; ++k) {
    ResetWithStep1();
    fake_->CrashBeforeNth(Op::kAny, k);
    auto saved = WriteCheckpoint(Dir(), MakeSnapshot(2, kParams), fake_.get());
    const std::string what = "crash before step " + std::to_string(k) + " of " +
                             std::to_string(steps) + ": " + saved.status().ToString();
    if (k > steps) {
      ASSERT_TRUE(saved.ok()) << what;
      fake_->DropUnsyncedData();
      EXPECT_EQ(ExpectOnlyLoadableCheckpoints(what), 2);
    } else {
      ExpectOnlyLoadableCheckpoints(what);
    }
  }
}

// The background writer saves through the file system it is given: a full disk fails that
// save (reported to on_failure), and the next one succeeds once there is room.
TEST_F(CkptFaultTest, AsyncWriterReportsAFullDiskAndTheNextSaveSucceeds) {
  ResetWithStep1();
  std::vector<std::string> failures;
  AsyncCheckpointWriter::Options o;
  o.dir = Dir();
  o.fs = fake_.get();
  o.on_failure = [&](int64_t, const Status& st) { failures.push_back(st.ToString()); };
  AsyncCheckpointWriter writer(o);
  auto snapshot = [](int64_t step) {
    CheckpointSnapshot whole = MakeSnapshot(step, kParams);
    ShardSnapshot s;
    s.meta = whole.meta;
    s.shard.runs.emplace_back();
    s.shard.runs[0].set_begin(0);
    s.shard.runs[0].set_length(kParams);
    s.shard.runs[0].set_stride(kParams);
    s.shard.runs[0].set_count(1);
    s.shard.params.assign(whole.params.begin(), whole.params.end());
    s.shard.adam_m.assign(whole.adam_m.begin(), whole.adam_m.end());
    s.shard.adam_v.assign(whole.adam_v.begin(), whole.adam_v.end());
    return s;
  };
  fake_->FailFrom(Op::kAppend, 1, ENOSPC);
  EXPECT_EQ(writer.WriteNow(snapshot(2)).code(), StatusCode::kResourceExhausted);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("params.r0.bin"));
  EXPECT_TRUE(TmpEntries().empty());
  fake_->ClearFaults();
  ASSERT_TRUE(writer.WriteNow(snapshot(3)).ok());
  EXPECT_EQ(LoadLatestCheckpoint(Dir())->meta.step(), 3);
}

}  // namespace
}  // namespace drover::engine::ckpt
