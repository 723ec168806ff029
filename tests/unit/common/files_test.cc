#include "common/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace drover {
namespace {

// A fresh directory per test under the GoogleTest temp dir, removed afterwards.
class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "/files_test_" + std::to_string(::getpid()) + "_" + info->name();
    ASSERT_TRUE(RemoveAll(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
  }
  void TearDown() override { EXPECT_TRUE(RemoveAll(dir_).ok()); }
  std::string dir_;
};

TEST_F(FilesTest, WriteThenReadBack) {
  const std::string path = dir_ + "/a.bin";
  std::string data = "hello";
  data.push_back('\0');
  data += std::string(200000, 'x');  // larger than one read buffer
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);
}

TEST_F(FilesTest, ReadInChunksGivesWholeChunksInOrderThenTheRest) {
  const std::string path = dir_ + "/chunks.bin";
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 7));
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  std::vector<size_t> sizes;
  std::string back;
  auto got = ReadFileInChunks(path, 256, [&](const char* p, size_t n) {
    sizes.push_back(n);
    back.append(p, n);
    return OkStatus();
  });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 1000u);
  EXPECT_EQ(sizes, (std::vector<size_t>{256, 256, 256, 232}));
  EXPECT_EQ(back, data);

  int calls = 0;
  auto stopped = ReadFileInChunks(path, 256, [&](const char*, size_t) {
    return ++calls == 2 ? DataLossError("enough") : OkStatus();
  });
  EXPECT_EQ(stopped.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(ReadFileInChunks(dir_ + "/none", 256, [](const char*, size_t) { return OkStatus(); })
                .status()
                .code(),
            StatusCode::kNotFound);
}

TEST_F(FilesTest, ReadSpansGivesEachSpanInChunksFromItsOffset) {
  const std::string path = dir_ + "/spans.bin";
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 7));
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  std::vector<std::pair<uint64_t, size_t>> pieces;
  std::string back;
  auto got = ReadFileSpansInChunks(path, {{100, 300}, {512, 488}}, 256,
                                   [&](uint64_t at, const char* p, size_t n) {
                                     pieces.emplace_back(at, n);
                                     back.append(p, n);
                                     return OkStatus();
                                   });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 788u);
  EXPECT_EQ(pieces, (std::vector<std::pair<uint64_t, size_t>>{
                        {100, 256}, {356, 44}, {512, 256}, {768, 232}}));
  EXPECT_EQ(back, data.substr(100, 300) + data.substr(512));

  auto past = ReadFileSpansInChunks(path, {{900, 200}}, 256,
                                    [](uint64_t, const char*, size_t) { return OkStatus(); });
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("the file ends at byte 1000, before the end of bytes "
                                         "[900, 1100)"),
            std::string::npos)
      << past.status();
}

// A pipe (`drover train <(...)`) cannot pread: it is read in order from its start. (The
// data fits the pipe's buffer, so the writer is done before the read.)
TEST_F(FilesTest, APipeIsReadWholeInOrder) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string data(20000, 'p');
  ASSERT_EQ(::write(fds[1], data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::close(fds[1]);
  auto got = ReadFileToString("/dev/fd/" + std::to_string(fds[0]));
  ::close(fds[0]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, data);
}

TEST_F(FilesTest, WriteReplacesAndLeavesNoTemporaryFile) {
  const std::string path = dir_ + "/state.json";
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "new").ok());
  EXPECT_EQ(*ReadFileToString(path), "new");
  StatusOr<std::vector<std::string>> all = ListGlob(dir_ + "/*");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<std::string>{path});
}

TEST_F(FilesTest, WriteIntoMissingDirectoryFailsNamingIt) {
  const std::string path = dir_ + "/missing/x";
  Status st = WriteFileAtomic(path, "x");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find(dir_ + "/missing/x"), std::string::npos) << st;
}

TEST_F(FilesTest, ReadMissingFileIsNotFoundNamingThePath) {
  StatusOr<std::string> read = ReadFileToString(dir_ + "/nope");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(dir_ + "/nope"), std::string::npos);
}

TEST_F(FilesTest, ReadDirectoryIsAnError) {
  StatusOr<std::string> read = ReadFileToString(dir_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument) << read.status();
}

TEST_F(FilesTest, MakeDirsCreatesParentsAndIsIdempotent) {
  const std::string deep = dir_ + "/a/b/c";
  ASSERT_TRUE(MakeDirs(deep).ok());
  EXPECT_TRUE(IsDirectory(deep));
  EXPECT_TRUE(MakeDirs(deep).ok());
  EXPECT_TRUE(MakeDirs(deep + "/").ok());
}

TEST_F(FilesTest, MakeDirsThroughAFileFails) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/f", "x").ok());
  Status st = MakeDirs(dir_ + "/f");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  st = MakeDirs(dir_ + "/f/sub");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir_ + "/f"), std::string::npos) << st;
}

TEST_F(FilesTest, RemoveAllRemovesTreesAndAcceptsMissingPaths) {
  ASSERT_TRUE(MakeDirs(dir_ + "/t/u").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/t/u/f", "x").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/t/g", "x").ok());
  ASSERT_TRUE(RemoveAll(dir_ + "/t").ok());
  EXPECT_FALSE(PathExists(dir_ + "/t"));
  EXPECT_TRUE(RemoveAll(dir_ + "/t").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/single", "x").ok());
  EXPECT_TRUE(RemoveAll(dir_ + "/single").ok());
  EXPECT_FALSE(PathExists(dir_ + "/single"));
}

TEST_F(FilesTest, RemoveAllDoesNotFollowSymlinks) {
  ASSERT_TRUE(MakeDirs(dir_ + "/keep").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/keep/f", "x").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/gone").ok());
  ASSERT_EQ(::symlink((dir_ + "/keep").c_str(), (dir_ + "/gone/link").c_str()), 0);
  ASSERT_TRUE(RemoveAll(dir_ + "/gone").ok());
  EXPECT_TRUE(PathExists(dir_ + "/keep/f"));
}

TEST_F(FilesTest, ListGlobIsSortedAndEmptyWithoutMatches) {
  for (const char* name : {"train_002.bin", "train_000.bin", "train_001.bin", "val.bin"}) {
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + name, "x").ok());
  }
  StatusOr<std::vector<std::string>> shards = ListGlob(dir_ + "/train_*.bin");
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, (std::vector<std::string>{dir_ + "/train_000.bin", dir_ + "/train_001.bin",
                                               dir_ + "/train_002.bin"}));
  StatusOr<std::vector<std::string>> none = ListGlob(dir_ + "/*.nothing");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(FilesTest, RenameAtomicMovesDirectories) {
  ASSERT_TRUE(MakeDirs(dir_ + "/step_5.tmp").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/step_5.tmp/shard", "s").ok());
  ASSERT_TRUE(RenameAtomic(dir_ + "/step_5.tmp", dir_ + "/step_5").ok());
  EXPECT_FALSE(PathExists(dir_ + "/step_5.tmp"));
  EXPECT_EQ(*ReadFileToString(dir_ + "/step_5/shard"), "s");
}

TEST_F(FilesTest, RenameAtomicOntoNonEmptyDirectoryFails) {
  ASSERT_TRUE(MakeDirs(dir_ + "/a").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/b").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/b/f", "x").ok());
  Status st = RenameAtomic(dir_ + "/a", dir_ + "/b");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find(dir_ + "/b"), std::string::npos);
}

TEST_F(FilesTest, RenameMissingSourceIsNotFound) {
  Status st = RenameAtomic(dir_ + "/none", dir_ + "/other");
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
}

TEST_F(FilesTest, FsyncHelpers) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/f", "x").ok());
  EXPECT_TRUE(FsyncFile(dir_ + "/f").ok());
  EXPECT_TRUE(FsyncDir(dir_).ok());
  EXPECT_EQ(FsyncDir(dir_ + "/none").code(), StatusCode::kNotFound);
  EXPECT_FALSE(FsyncDir(dir_ + "/f").ok());  // not a directory
}

TEST(DirnameTest, Cases) {
  EXPECT_EQ(Dirname("a/b/c"), "a/b");
  EXPECT_EQ(Dirname("c"), ".");
  EXPECT_EQ(Dirname("/c"), "/");
  EXPECT_EQ(Dirname("/x/y"), "/x");
}

// Points TMPDIR at `dir` for one scope.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const std::string& dir) {
    const char* old = std::getenv("TMPDIR");
    if (old != nullptr) saved_ = old;
    setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (saved_.has_value()) {
      setenv("TMPDIR", saved_->c_str(), 1);
    } else {
      unsetenv("TMPDIR");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST_F(FilesTest, MakeTempDirCreatesAPrivateDirectoryUnderTmpdir) {
  ScopedTmpdir tmpdir(dir_);
  StatusOr<std::string> a = MakeTempDir("run-");
  StatusOr<std::string> b = MakeTempDir("run-");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->rfind(dir_ + "/run-", 0), 0u) << *a;
  EXPECT_TRUE(IsDirectory(*a));
  struct stat st;
  ASSERT_EQ(stat(a->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(FilesTest, MakeTempDirInAMissingDirectoryIsNotFound) {
  ScopedTmpdir tmpdir(dir_ + "/missing");
  EXPECT_EQ(MakeTempDir("run-").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace drover
