// The POSIX file system, the durable-write helpers on top of it, and the fault-injecting
// fake the other tests put under their writers.
#include "common/file_system.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "common/files.h"
#include "tests/unit/common/fault_injection_fs.h"

namespace drover {
namespace {

using ::testing::HasSubstr;
using Fake = testing::FaultInjectionFileSystem;
using Op = Fake::Op;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "/file_system_test_" + std::to_string(::getpid()) + "_" +
           info->name();
    ASSERT_TRUE(RemoveAll(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
  }
  void TearDown() override { EXPECT_TRUE(RemoveAll(dir_).ok()); }

  std::vector<std::string> Names(const std::string& dir) const {
    auto names = real_->ListDir(dir);
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>{};
  }
  std::string Content(const std::string& path) const {
    auto data = real_->ReadFile(path);
    return data.ok() ? *data : data.status().ToString();
  }

  FileSystem* const real_ = FileSystem::Default();
  std::string dir_;
};

TEST_F(FileSystemTest, DefaultWritesSyncsListsAndReadsBack) {
  auto file = real_->NewWritableFile(dir_ + "/b");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("hello ").ok());
  ASSERT_TRUE((*file)->Append(std::string(100000, 'x')).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Content(dir_ + "/b"), "hello " + std::string(100000, 'x'));
  auto info = real_->Stat(dir_ + "/b");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, 100006u);
  EXPECT_FALSE(info->is_directory);
  ASSERT_TRUE(real_->MakeDirs(dir_ + "/a/deep").ok());
  EXPECT_TRUE(real_->Stat(dir_ + "/a")->is_directory);
  EXPECT_EQ(Names(dir_), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(real_->Rename(dir_ + "/b", dir_ + "/c").ok());
  ASSERT_TRUE(real_->SyncDir(dir_).ok());
  ASSERT_TRUE(real_->RemoveFile(dir_ + "/c").ok());
  ASSERT_TRUE(real_->RemoveAll(dir_ + "/a").ok());
  EXPECT_TRUE(Names(dir_).empty());
}

TEST_F(FileSystemTest, DefaultErrorsNameThePath) {
  const std::string missing = dir_ + "/missing/f";
  auto created = real_->NewWritableFile(missing);
  EXPECT_EQ(created.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(created.status().message(), HasSubstr(missing));
  for (Status st : {real_->ReadFile(missing).status(), real_->Stat(missing).status(),
                    real_->ListDir(missing).status(), real_->RemoveFile(missing),
                    real_->SyncDir(missing), real_->Rename(missing, dir_ + "/x")}) {
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
    EXPECT_THAT(st.message(), HasSubstr(missing));
  }
  ASSERT_TRUE(real_->MakeDirs(dir_ + "/full/sub").ok());
  ASSERT_TRUE(real_->MakeDirs(dir_ + "/empty").ok());
  Status st = real_->Rename(dir_ + "/empty", dir_ + "/full");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(real_->RemoveAll(missing).ok());
}

TEST_F(FileSystemTest, WriteFileSyncedRemovesTheFileWhenTheWriterFails) {
  const std::string path = dir_ + "/shard";
  Status st = WriteFileSynced(real_, path, [](WritableFile& f) {
    RETURN_IF_ERROR(f.Append("partial"));
    return ResourceExhaustedError("write " + f.path() + ": No space left on device");
  });
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(dir_).empty());
}

TEST_F(FileSystemTest, WriteFileAtomicStreamsPiecesThroughTheWriter) {
  const std::string path = dir_ + "/model.bin";
  ASSERT_TRUE(WriteFileAtomic(real_, path, [](WritableFile& f) {
                for (char c = 'a'; c <= 'z'; ++c) RETURN_IF_ERROR(f.Append(std::string(1000, c)));
                return OkStatus();
              }).ok());
  const std::string data = Content(path);
  ASSERT_EQ(data.size(), 26000u);
  EXPECT_EQ(data.substr(25999), "z");
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"model.bin"});
}

// --- the fake ------------------------------------------------------------------------------

TEST_F(FileSystemTest, FakeFailsTheNthCallWithTheErrnoAndCountsCalls) {
  Fake fake(real_);
  fake.FailNth(Op::kAppend, 2, ENOSPC);
  auto file = fake.NewWritableFile(dir_ + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append("one").ok());
  Status st = (*file)->Append("two");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr(dir_ + "/f"));
  EXPECT_TRUE((*file)->Append("three").ok());
  fake.FailFrom(Op::kSync, 1, EIO);
  EXPECT_FALSE((*file)->Sync().ok());
  EXPECT_FALSE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Content(dir_ + "/f"), "onethree");
  EXPECT_EQ(fake.Count(Op::kAppend), 3);
  EXPECT_EQ(fake.Count(Op::kSync), 2);
  EXPECT_EQ(fake.Count(Op::kAny), 7);
}

TEST_F(FileSystemTest, FakeShortWriteLeavesHalfTheDataThenFails) {
  Fake fake(real_);
  fake.ShortWriteNth(1, ENOSPC);
  auto file = fake.NewWritableFile(dir_ + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Append("0123456789").code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Content(dir_ + "/f"), "01234");
}

TEST_F(FileSystemTest, FakeCrashDropsUnsyncedBytesAndNamesInUnsyncedDirectories) {
  Fake fake(real_);
  // Named durably, half its data synced: truncated to the synced part.
  auto file = fake.NewWritableFile(dir_ + "/half");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(fake.SyncDir(dir_).ok());
  ASSERT_TRUE((*file)->Append("kept").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Append("lost").ok());
  ASSERT_TRUE((*file)->Close().ok());
  // Synced data, but the directory entry never synced: the file is lost.
  ASSERT_TRUE(WriteFileSynced(&fake, dir_ + "/unnamed", "data").ok());
  // A directory made but never synced in its parent: gone with what is inside.
  ASSERT_TRUE(fake.MakeDirs(dir_ + "/new/sub").ok());
  ASSERT_TRUE(WriteFileAtomic(&fake, dir_ + "/new/sub/f", "x").ok());
  fake.DropUnsyncedData();
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"half"});
  EXPECT_EQ(Content(dir_ + "/half"), "kept");
}

TEST_F(FileSystemTest, FakeCrashUndoesAnUnsyncedRenameAndRestoresTheReplacedFile) {
  ASSERT_TRUE(WriteFileAtomic(real_, dir_ + "/target", "old").ok());
  Fake fake(real_);
  ASSERT_TRUE(WriteFileSynced(&fake, dir_ + "/next", "new").ok());
  ASSERT_TRUE(fake.SyncDir(dir_).ok());  // "next" is durable
  ASSERT_TRUE(fake.Rename(dir_ + "/next", dir_ + "/target").ok());
  EXPECT_EQ(Content(dir_ + "/target"), "new");
  fake.DropUnsyncedData();
  EXPECT_EQ(Content(dir_ + "/target"), "old");
  EXPECT_EQ(Content(dir_ + "/next"), "new");
  // Once the directory is synced the rename stays.
  ASSERT_TRUE(fake.Rename(dir_ + "/next", dir_ + "/target").ok());
  ASSERT_TRUE(fake.SyncDir(dir_).ok());
  fake.DropUnsyncedData();
  EXPECT_EQ(Content(dir_ + "/target"), "new");
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"target"});
}

// A directory's files follow it through a rename: syncing it under its new name makes them
// durable, and undoing the rename takes them back with it.
TEST_F(FileSystemTest, FakeTracksFilesThroughADirectoryRename) {
  ASSERT_TRUE(MakeDirs(dir_ + "/a.tmp").ok());
  Fake fake(real_);
  ASSERT_TRUE(WriteFileSynced(&fake, dir_ + "/a.tmp/f", "f").ok());
  ASSERT_TRUE(fake.Rename(dir_ + "/a.tmp", dir_ + "/a").ok());
  ASSERT_TRUE(fake.SyncDir(dir_).ok());  // the rename is durable, "f" in it is not
  fake.DropUnsyncedData();
  EXPECT_TRUE(Names(dir_ + "/a").empty());
  ASSERT_TRUE(WriteFileSynced(&fake, dir_ + "/a/g", "g").ok());
  ASSERT_TRUE(fake.Rename(dir_ + "/a", dir_ + "/b").ok());
  ASSERT_TRUE(fake.SyncDir(dir_ + "/b").ok());  // "g" is durable, the rename is not
  fake.DropUnsyncedData();
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"a"});
  EXPECT_EQ(Content(dir_ + "/a/g"), "g");
}

TEST_F(FileSystemTest, FakeAfterACrashFailsEverythingUntilCleared) {
  Fake fake(real_);
  fake.CrashBeforeNth(Op::kRename, 1);
  Status st = WriteFileAtomic(&fake, dir_ + "/f", "x");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(fake.crashed());
  EXPECT_FALSE(fake.MakeDirs(dir_ + "/d").ok());
  EXPECT_TRUE(Names(dir_).empty());  // the crash took the unsynced temporary file too
  fake.ClearFaults();
  EXPECT_TRUE(WriteFileAtomic(&fake, dir_ + "/f", "x").ok());
}

// --- the atomic write under every fault ----------------------------------------------------

class AtomicWriteFaultTest : public FileSystemTest {
 protected:
  // A fresh target holding "old" (durable: the fake counts what it did not see as durable).
  std::string Reset() {
    EXPECT_TRUE(RemoveAll(dir_).ok());
    EXPECT_TRUE(MakeDirs(dir_).ok());
    EXPECT_TRUE(WriteFileAtomic(real_, Path(), "old").ok());
    return Path();
  }
  std::string Path() const { return dir_ + "/state.json"; }
  // The calls of `op` in one clean atomic write.
  int CleanCount(Op op) {
    Reset();
    Fake fake(real_);
    EXPECT_TRUE(WriteFileAtomic(&fake, Path(), "new").ok());
    return fake.Count(op);
  }
  // What must hold whatever failed: the old or the new content, nothing else in the dir.
  void ExpectOldOrNew(const std::string& what) {
    EXPECT_THAT(Content(Path()), ::testing::AnyOf("old", "new")) << what;
    EXPECT_EQ(Names(dir_), std::vector<std::string>{"state.json"}) << what;
  }
};

TEST_F(AtomicWriteFaultTest, EveryFailedStepLeavesOldOrNewContentAndNoTemporaryFile) {
  for (Op op : {Op::kCreate, Op::kAppend, Op::kSync, Op::kClose, Op::kRename, Op::kSyncDir}) {
    const int calls = CleanCount(op);
    ASSERT_GT(calls, 0);
    for (int nth = 1; nth <= calls; ++nth) {
      for (int error : {ENOSPC, EIO}) {
        Reset();
        Fake fake(real_);
        fake.FailNth(op, nth, error);
        Status st = WriteFileAtomic(&fake, Path(), "new");
        const std::string what = st.ToString();
        EXPECT_FALSE(st.ok()) << what;
        EXPECT_THAT(st.message(), HasSubstr(Path())) << "the error names the file";
        // Only a failed directory fsync comes after the rename.
        if (op != Op::kSyncDir) {
          EXPECT_EQ(Content(Path()), "old") << what;
        }
        ExpectOldOrNew(what);
        fake.DropUnsyncedData();
        ExpectOldOrNew(what + ", then a crash");
      }
    }
  }
  Reset();
  Fake fake(real_);
  fake.ShortWriteNth(1, ENOSPC);
  EXPECT_EQ(WriteFileAtomic(&fake, Path(), "new").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Content(Path()), "old");
  ExpectOldOrNew("short write");
}

TEST_F(AtomicWriteFaultTest, ACrashAtEveryStepLeavesOldOrNewAndAfterReturningNew) {
  const int steps = CleanCount(Op::kAny);
  for (int k = 1; k <= steps + 1; ++k) {
    Reset();
    Fake fake(real_);
    fake.CrashBeforeNth(Op::kAny, k);
    Status st = WriteFileAtomic(&fake, Path(), "new");
    const std::string what = "crash before step " + std::to_string(k) + " of " +
                             std::to_string(steps) + ": " + st.ToString();
    if (k > steps) {
      // It returned OK: a crash now must keep the new content, whole.
      ASSERT_TRUE(st.ok()) << what;
      fake.DropUnsyncedData();
      EXPECT_EQ(Content(Path()), "new") << what;
    }
    ExpectOldOrNew(what);
  }
}

}  // namespace
}  // namespace drover
