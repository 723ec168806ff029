// Checkpoint directories: format round trip, corruption handling, pruning, and a resumed
// run that continues the exact loss curve of an uninterrupted one.
#include "worker/engine/ckpt/checkpoint.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/token_shard.h"
#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/ckpt/async_writer.h"
#include "worker/engine/ckpt/checkpoint_format.h"
#include "worker/engine/ckpt/shard_exchange.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;

class CkptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("ckpt_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Dir() const { return dir_.string(); }
  fs::path dir_;
};

void FlipByte(const fs::path& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x40));
}

// A write that fails midway (here the file-size limit makes write() fail with EFBIG, as a
// full disk fails it with ENOSPC) removes its partial step_N.tmp/ and leaves the previous
// checkpoint as it was.
TEST_F(CkptTest, FailedWriteRemovesItsPartialFilesAndKeepsThePreviousCheckpoint) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(1, 1000)).ok());
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1000;  // bytes: less than one arena of 1000 floats
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  auto failed = WriteCheckpoint(Dir(), MakeSnapshot(2, 1000));
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(failed.ok());
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(2, 0)));
  EXPECT_FALSE(fs::exists(dir_ / "step_2"));
  std::string path;
  auto latest = LoadLatestCheckpoint(Dir(), &path);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.step(), 1);
}

TEST_F(CkptTest, RoundTripKeepsEveryArenaAndField) {
  const CheckpointSnapshot s = MakeSnapshot(7, 1000);
  auto path = WriteCheckpoint(Dir(), s);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(fs::path(*path).filename(), "step_7");
  EXPECT_FALSE(fs::exists(dir_ / "step_7.tmp"));
  auto r = ReadCheckpoint(*path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params, s.params);
  EXPECT_EQ(r->adam_m, s.adam_m);
  EXPECT_EQ(r->adam_v, s.adam_v);
  EXPECT_EQ(r->meta.step(), 7);
  EXPECT_EQ(r->meta.consumed_samples(), 84);
  EXPECT_EQ(r->meta.rng_state(), 0xfeedface12345678ull);
  EXPECT_EQ(r->meta.model().num_layers(), 2);
  ASSERT_EQ(r->meta.tensors_size(), 1);
  EXPECT_EQ(r->meta.tensors(0).name(), "wte");
  ASSERT_EQ(r->meta.shards_size(), 3);
  for (const auto& sh : r->meta.shards()) {
    EXPECT_EQ(sh.begin(), 0);
    EXPECT_EQ(sh.end(), 1000);
    EXPECT_EQ(sh.bytes(), 4000);
  }
  std::ifstream manifest(dir_ / "step_7" / kManifestFile);
  std::string text((std::istreambuf_iterator<char>(manifest)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::HasSubstr("\"crc32c\""));
  EXPECT_THAT(text, ::testing::HasSubstr("\"arena\": \"adam_v\""));
}

TEST_F(CkptTest, CorruptShardIsSkippedForThePreviousCheckpoint) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(10, 500)).ok());
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(20, 500)).ok());
  FlipByte(dir_ / "step_20" / "adam_m.r0.bin", 123);
  auto bad = ReadCheckpoint((dir_ / "step_20").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("CRC32C mismatch"));
  std::string path;
  auto latest = LoadLatestCheckpoint(Dir(), &path);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.step(), 10);
  EXPECT_EQ(fs::path(path).filename(), "step_10");
}

// The manifest is sealed with its own CRC32C: every byte of it, changed in any of three
// ways, makes it DataLoss. Unsealed, a manifest that still parsed was believed, and the
// reader ignores keys it does not know (newer writers may add some), so a damaged key
// dropped its field without a word: "consumed_samples" -> "consumed_sampleq" resumed the
// data from its start, and the RNG, the optimizer's step count or the loss scaler could go
// the same way.
TEST_F(CkptTest, EveryByteOfTheManifestIsCoveredByItsSeal) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(7, 300)).ok());
  const fs::path path = dir_ / "step_7" / kManifestFile;
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_TRUE(ReadManifest((dir_ / "step_7").string()).ok());
  EXPECT_THAT(text, ::testing::HasSubstr("\"manifest_crc32c\": "));
  int missed = 0;
  std::string first_missed;
  for (size_t at = 0; at < text.size(); ++at) {
    for (char mask : {'\x01', '\x20', '\x5a'}) {
      std::string damaged = text;
      damaged[at] = static_cast<char>(damaged[at] ^ mask);
      { std::ofstream(path, std::ios::trunc) << damaged; }
      auto m = ReadManifest((dir_ / "step_7").string());
      if (m.ok()) {
        if (missed++ == 0) first_missed = damaged.substr(at > 20 ? at - 20 : 0, 40);
      } else {
        EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status();
      }
    }
  }
  EXPECT_EQ(missed, 0) << missed << " of " << 3 * text.size()
                       << " damaged manifests were read, the first around '" << first_missed << "'";
  { std::ofstream(path, std::ios::trunc) << text; }
  ASSERT_TRUE(ReadManifest((dir_ / "step_7").string()).ok());
}

// Manifests of earlier writers (format 1 and 2) have no seal and are read as before; one of
// format 3 without its seal is damaged.
TEST_F(CkptTest, AnUnsealedManifestIsReadOnlyFromAnEarlierFormat) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(7, 300)).ok());
  const std::string step_dir = (dir_ / "step_7").string();
  auto m = ReadManifest(step_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  m->clear_manifest_crc32c();
  for (int version : {2, 3}) {
    m->set_format_version(version);
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*m, &json).ok());
    { std::ofstream(fs::path(step_dir) / kManifestFile, std::ios::trunc) << json; }
    auto read = ReadCheckpoint(step_dir);
    if (version == 2) {
      EXPECT_TRUE(read.ok()) << read.status();
    } else {
      EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
      EXPECT_THAT(read.status().message(), ::testing::HasSubstr("has no seal"));
    }
  }
}

TEST_F(CkptTest, TruncatedShardAndBrokenManifestAreSkipped) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(1, 300)).ok());
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(2, 300)).ok());
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(3, 300)).ok());
  fs::resize_file(dir_ / "step_3" / "params.r0.bin", 100);
  { std::ofstream(dir_ / "step_2" / kManifestFile) << "{\"step\": "; }
  auto latest = LoadLatestCheckpoint(Dir());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->meta.step(), 1);
}

TEST_F(CkptTest, PartialTmpDirectoryIsIgnoredAndPruned) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(5, 200)).ok());
  // A crash after the shards but before the rename: a complete-looking step_9.tmp/.
  fs::create_directories(dir_ / "step_9.tmp");
  fs::copy(dir_ / "step_5", dir_ / "step_9.tmp", fs::copy_options::recursive);
  fs::create_directories(dir_ / "step_3.tmp");
  auto listed = ListCheckpoints(Dir());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].first, 5);
  auto latest = LoadLatestCheckpoint(Dir());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->meta.step(), 5);
  ASSERT_TRUE(PruneCheckpoints(Dir(), 3).ok());
  EXPECT_FALSE(fs::exists(dir_ / "step_3.tmp"));
  EXPECT_TRUE(fs::exists(dir_ / "step_5"));
}

TEST_F(CkptTest, NoCheckpointIsNotFoundButUnusableOnesAreAnErrorNamingEach) {
  EXPECT_EQ(LoadLatestCheckpoint(Dir()).status().code(), StatusCode::kNotFound);
  fs::create_directories(dir_ / "step_7.tmp");  // a crash before any rename: nothing yet
  EXPECT_EQ(LoadLatestCheckpoint(Dir()).status().code(), StatusCode::kNotFound);
  fs::create_directories(dir_ / "step_4");  // no manifest
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(9, 100)).ok());
  FlipByte(dir_ / "step_9" / "params.r0.bin", 7);
  auto none = LoadLatestCheckpoint(Dir());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr("none is usable"));
  EXPECT_THAT(none.status().message(),
              ::testing::HasSubstr((dir_ / "step_9" / "params.r0.bin").string() + ": CRC32C"));
  EXPECT_THAT(none.status().message(),
              ::testing::HasSubstr((dir_ / "step_4").string() + ": no readable manifest.json"));
}

// A manifest that adds a well-formed shard of an arena this build does not know is refused
// by name (it once reached a null arena pointer).
TEST_F(CkptTest, ShardOfAnUnknownArenaIsDataLossNamingIt) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(3, 64)).ok());
  const fs::path step = dir_ / "step_3";
  auto m = ReadManifest(step.string());
  ASSERT_TRUE(m.ok()) << m.status();
  v1::CheckpointShard extra = m->shards(0);
  extra.set_arena("ema");
  *m->add_shards() = extra;
  auto json = internal::SealManifest(*m);  // sealed anew: the edit is the test's
  ASSERT_TRUE(json.ok()) << json.status();
  { std::ofstream(step / kManifestFile) << *json; }
  auto snap = ReadCheckpoint(step.string());
  EXPECT_EQ(snap.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(snap.status().message(), ::testing::HasSubstr("arena 'ema'"));
}

// A shard whose size disagrees with its manifest names both sizes, each once.
TEST_F(CkptTest, ShardSizeMismatchNamesTheFileSizeAndTheManifestSize) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(3, 64)).ok());
  const fs::path step = dir_ / "step_3";
  auto m = ReadManifest(step.string());
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t real = m->shards(0).bytes();
  m->mutable_shards(0)->set_bytes(real + 8);
  auto json = internal::SealManifest(*m);  // sealed anew: the edit is the test's
  ASSERT_TRUE(json.ok()) << json.status();
  { std::ofstream(step / kManifestFile) << *json; }
  auto snap = ReadCheckpoint(step.string());
  EXPECT_EQ(snap.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(snap.status().message(),
              ::testing::HasSubstr((step / m->shards(0).file()).string() + ": the file is " +
                                   std::to_string(real) + " bytes, the manifest says " +
                                   std::to_string(real + 8)));
}

// Retention never deletes a checkpoint while someone reads it (a shared flock on its
// directory, taken by ReadCheckpoint in any process).
TEST_F(CkptTest, PruningSkipsACheckpointBeingRead) {
  for (int step : {1, 2, 3}) ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(step, 50)).ok());
  int fd = ::open((dir_ / "step_1").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  ASSERT_TRUE(PruneCheckpoints(Dir(), 1).ok());
  EXPECT_TRUE(fs::exists(dir_ / "step_1" / kManifestFile));
  EXPECT_FALSE(fs::exists(dir_ / "step_2"));
  EXPECT_TRUE(fs::exists(dir_ / "step_3"));
  ::close(fd);
  ASSERT_TRUE(PruneCheckpoints(Dir(), 1).ok());
  EXPECT_FALSE(fs::exists(dir_ / "step_1"));
}

// The real file system, each call passed on: what a test's file system changes, it overrides.
class ForwardingFileSystem : public FileSystem {
 public:
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p) override {
    return base_->NewWritableFile(p);
  }
  StatusOr<std::string> ReadFile(const std::string& p) override { return base_->ReadFile(p); }
  StatusOr<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  StatusOr<std::vector<std::string>> ListDir(const std::string& d) override {
    return base_->ListDir(d);
  }
  Status Rename(const std::string& f, const std::string& t) override { return base_->Rename(f, t); }
  Status SyncDir(const std::string& d) override { return base_->SyncDir(d); }
  Status RemoveFile(const std::string& p) override { return base_->RemoveFile(p); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Status MakeDirs(const std::string& p) override { return base_->MakeDirs(p); }

 protected:
  FileSystem* base_ = FileSystem::Default();
};

// A file system whose rm -rf dies part-way, as a trainer killed in the middle of pruning:
// it removes the directory's manifest, then stops.
class DyingRemoveFileSystem final : public ForwardingFileSystem {
 public:
  Status RemoveAll(const std::string& p) override {
    (void)base_->RemoveFile(p + "/" + kManifestFile);
    return InternalError("killed while removing " + p);
  }
};

// A file system whose files keep nothing and log each write and sync, so that a shard of
// several kWriteChunkBytes pieces costs memory, not disk.
class LoggingFileSystem final : public ForwardingFileSystem {
 public:
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p) override {
    struct File final : WritableFile {
      File(std::string path, std::vector<std::string>* log) : path_(std::move(path)), log_(log) {}
      Status Append(std::string_view data) override {
        log_->push_back("append " + std::to_string(data.size()));
        return OkStatus();
      }
      Status Sync() override {
        log_->push_back("sync");
        return OkStatus();
      }
      Status Close() override { return OkStatus(); }
      const std::string& path() const override { return path_; }
      std::string path_;
      std::vector<std::string>* log_;
    };
    log.push_back("create " + fs::path(p).filename().string());
    return std::unique_ptr<WritableFile>(new File(p, &log));
  }

  std::vector<std::string> log;
};

// A shard file is written and synced kWriteChunkBytes at a time, and the write's progress is
// told after each piece is synced: a large shard on slow storage shows it goes on.
TEST_F(CkptTest, AShardIsWrittenAndSyncedInPiecesEachToldToProgress) {
  constexpr size_t kPiece = kWriteChunkBytes / sizeof(float);
  RankShard shard;
  shard.runs = {MakeRun(0, static_cast<int64_t>(kPiece + 3), 0, 1)};  // a piece and 12 bytes
  for (HostFloats* a : {&shard.params, &shard.adam_m, &shard.adam_v}) a->assign(kPiece + 3, 1.f);
  v1::CheckpointManifest meta;
  meta.set_step(7);
  LoggingFileSystem logging;
  auto written = WriteShard(Dir(), meta, shard, &logging, [&](int64_t done, int64_t total) {
    logging.log.push_back("progress " + std::to_string(done) + " of " + std::to_string(total));
  });
  ASSERT_TRUE(written.ok()) << written.status();
  const int64_t file = static_cast<int64_t>(kWriteChunkBytes) + 12, total = 3 * file;
  std::vector<std::string> want = {"progress 0 of " + std::to_string(total)};
  int64_t done = 0;
  for (const char* arena : {"params", "adam_m", "adam_v"}) {
    want.push_back(std::string("create ") + arena + ".r0.bin");
    // Each piece synced before its progress is told; the last one by WriteFileSynced.
    for (int64_t piece : {static_cast<int64_t>(kWriteChunkBytes), int64_t{12}}) {
      done += piece;
      want.push_back("append " + std::to_string(piece));
      want.push_back("sync");
      want.push_back("progress " + std::to_string(done) + " of " + std::to_string(total));
    }
  }
  EXPECT_EQ(logging.log, want);
  ASSERT_EQ(written->size(), 3u);
  EXPECT_EQ((*written)[0].bytes(), file);
  EXPECT_EQ((*written)[0].block_crc32c_size(), 65);  // 64 blocks of 1 MiB and the 12 bytes
}

// A prune cut short never leaves a half-removed directory under a complete step_N/ name, and
// the next prune finishes the removal.
TEST_F(CkptTest, APruneCutShortLeavesNoHalfRemovedCheckpointListed) {
  for (int step : {1, 2, 3}) ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(step, 50)).ok());
  DyingRemoveFileSystem dying;
  EXPECT_FALSE(PruneCheckpoints(Dir(), 2, &dying).ok());
  for (const auto& [step, path] : ListCheckpoints(Dir())) {
    EXPECT_TRUE(fs::exists(fs::path(path) / kManifestFile)) << path << " lists as complete";
  }
  auto latest = LoadLatestCheckpoint(Dir());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.step(), 3);
  ASSERT_TRUE(PruneCheckpoints(Dir(), 2).ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename());
  EXPECT_THAT(left, ::testing::UnorderedElementsAre("step_2", "step_3"));
}

TEST_F(CkptTest, AsyncWriterKeepsLastKAndReportsEachCheckpoint) {
  std::vector<int64_t> completed;
  {
    AsyncCheckpointWriter::Options o;
    o.dir = Dir();
    o.keep_last = 2;
    o.on_complete = [&](const v1::CheckpointManifest& m, const std::string& path) {
      EXPECT_TRUE(fs::exists(fs::path(path) / kManifestFile));
      completed.push_back(m.step());
    };
    AsyncCheckpointWriter writer(o);
    for (int64_t step = 1; step <= 5; ++step) {
      ASSERT_TRUE(
          writer.Submit(PartOf(MakeSnapshot(step * 10, 256), 0, {MakeRun(0, 256, 256, 1)})).ok());
    }
    ASSERT_TRUE(writer.Flush().ok());
  }
  EXPECT_EQ(completed, (std::vector<int64_t>{10, 20, 30, 40, 50}));
  auto listed = ListCheckpoints(Dir());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first, 50);
  EXPECT_EQ(listed[1].first, 40);
}

// The shard of a finished write comes back for the next snapshot, its memory and all, once.
TEST_F(CkptTest, AsyncWriterHandsBackTheLastWrittenShardOnce) {
  AsyncCheckpointWriter::Options o;
  o.dir = Dir();
  AsyncCheckpointWriter writer(o);
  EXPECT_TRUE(writer.TakeRecycled().params.empty()) << "nothing written yet";
  ShardSnapshot first = PartOf(MakeSnapshot(10, 256), 0, {MakeRun(0, 256, 256, 1)});
  const float* params = first.shard.params.data();
  const float* m = first.shard.adam_m.data();
  ASSERT_TRUE(writer.Submit(std::move(first)).ok());
  ASSERT_TRUE(writer.Flush().ok());
  RankShard recycled = writer.TakeRecycled();
  EXPECT_EQ(recycled.params.data(), params);
  EXPECT_EQ(recycled.adam_m.data(), m);
  EXPECT_EQ(recycled.params.size(), 256u);
  EXPECT_TRUE(writer.TakeRecycled().params.empty()) << "handed back once";

  ShardSnapshot second = PartOf(MakeSnapshot(20, 256), 0, {MakeRun(0, 256, 256, 1)});
  const float* v = second.shard.adam_v.data();
  ASSERT_TRUE(writer.WriteNow(std::move(second)).ok());
  EXPECT_EQ(writer.TakeRecycled().adam_v.data(), v);
}

// Ranks as writers of one process sharing a store: each writes its part, rank 0 commits
// once all are durable, and the checkpoint reads back as the whole arenas.
class ShardedWriteTest : public CkptTest {
 protected:
  std::unique_ptr<AsyncCheckpointWriter> Writer(int rank, int world,
                                                std::chrono::milliseconds timeout) {
    exchanges_.push_back(std::make_unique<KvShardExchange>(&store_, timeout, nullptr));
    AsyncCheckpointWriter::Options o;
    o.dir = Dir();
    o.rank = rank;
    o.world_size = world;
    o.keep_last = 0;
    o.exchange = exchanges_.back().get();
    o.on_complete = [this](const v1::CheckpointManifest& m, const std::string&) {
      completed_.push_back(m.step());
    };
    o.on_failure = [this, rank](int64_t, const Status& st) {
      if (rank == 0) failure_ = st.ToString();
    };
    return std::make_unique<AsyncCheckpointWriter>(std::move(o));
  }

  parallel::InMemoryKvStore store_;
  std::vector<std::unique_ptr<KvShardExchange>> exchanges_;
  std::vector<int64_t> completed_;
  std::string failure_;
};

TEST_F(ShardedWriteTest, EveryRankWritesItsRunsAndRankZeroCommitsTheWhole) {
  const CheckpointSnapshot whole = MakeSnapshot(7, 120);
  const auto runs = ThreeRankRuns();
  {
    std::vector<std::unique_ptr<AsyncCheckpointWriter>> writers;
    for (int r = 0; r < 3; ++r) writers.push_back(Writer(r, 3, std::chrono::seconds(30)));
    // Rank 0 first: it must wait for the others rather than commit what it has.
    for (int r : {0, 2, 1}) ASSERT_TRUE(writers[r]->Submit(PartOf(whole, r, runs[r])).ok());
    for (auto& w : writers) ASSERT_TRUE(w->Flush().ok());
  }
  EXPECT_EQ(completed_, (std::vector<int64_t>{7}));
  auto back = ReadCheckpoint((dir_ / "step_7").string());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->params, whole.params);
  EXPECT_EQ(back->adam_m, whole.adam_m);
  EXPECT_EQ(back->adam_v, whole.adam_v);
  EXPECT_EQ(back->meta.shards_size(), 9);
  EXPECT_TRUE(fs::exists(dir_ / "step_7" / "adam_v.r2.bin"));
  EXPECT_TRUE(ListCheckpoints(Dir()).size() == 1 && !fs::exists(dir_ / TmpDirName(7, 0)));
}

TEST_F(ShardedWriteTest, ARankThatCannotWriteAbandonsTheCheckpointAndKeepsThePrevious) {
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(5, 120)).ok());
  const CheckpointSnapshot whole = MakeSnapshot(7, 120);
  const auto runs = ThreeRankRuns();
  {
    std::vector<std::unique_ptr<AsyncCheckpointWriter>> writers;
    for (int r = 0; r < 3; ++r) writers.push_back(Writer(r, 3, std::chrono::seconds(30)));
    ShardSnapshot broken = PartOf(whole, 2, runs[2]);
    broken.shard.adam_v.pop_back();  // its sizes disagree with its runs: WriteShard refuses
    ASSERT_TRUE(writers[0]->Submit(PartOf(whole, 0, runs[0])).ok());
    ASSERT_TRUE(writers[1]->Submit(PartOf(whole, 1, runs[1])).ok());
    ASSERT_TRUE(writers[2]->Submit(std::move(broken)).ok());
    EXPECT_FALSE(writers[0]->Flush().ok());
  }
  EXPECT_THAT(failure_, ::testing::HasSubstr("rank 2 could not write its shard"));
  EXPECT_TRUE(completed_.empty());
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(7, 0)));
  auto latest = LoadLatestCheckpoint(Dir());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.step(), 5);
}

TEST_F(ShardedWriteTest, ARankThatNeverReportsTimesTheCheckpointOut) {
  const CheckpointSnapshot whole = MakeSnapshot(7, 120);
  const auto runs = ThreeRankRuns();
  {
    auto rank0 = Writer(0, 3, std::chrono::milliseconds(300));
    auto rank1 = Writer(1, 3, std::chrono::milliseconds(300));
    ASSERT_TRUE(rank1->Submit(PartOf(whole, 1, runs[1])).ok());
    ASSERT_TRUE(rank0->Submit(PartOf(whole, 0, runs[0])).ok());
    EXPECT_EQ(rank0->Flush().code(), StatusCode::kDeadlineExceeded);
  }
  EXPECT_THAT(failure_, ::testing::HasSubstr("rank 2 did not report"));
  EXPECT_TRUE(ListCheckpoints(Dir()).empty());
}

// A superseded attempt's rank 0 never commits (nor prunes): its shards are abandoned.
TEST_F(CkptTest, WriterCommitsOnlyWhileTheFenceConfirmsTheAttempt) {
  struct Fence : PublishFence {
    bool Current() const override { return false; }
    Status Confirm() override {
      ++calls;
      return calls < 3 ? UnavailableError("coordinator away") : answer;
    }
    int calls = 0;
    Status answer;
  } fence;
  ASSERT_TRUE(WriteCheckpoint(Dir(), MakeSnapshot(5, 64)).ok());
  std::vector<int64_t> completed;
  std::string failure;
  AsyncCheckpointWriter::Options o;
  o.dir = Dir();
  o.keep_last = 1;
  o.fence = &fence;
  o.on_complete = [&](const v1::CheckpointManifest& m, const std::string&) {
    completed.push_back(m.step());
  };
  o.on_failure = [&](int64_t, const Status& st) { failure = st.ToString(); };
  AsyncCheckpointWriter writer(o);
  // Unreachable twice, then confirmed: committed (and step_5 pruned).
  ASSERT_TRUE(writer.WriteNow(PartOf(MakeSnapshot(10, 64), 0, {MakeRun(0, 64, 64, 1)})).ok());
  EXPECT_EQ(completed, (std::vector<int64_t>{10}));
  EXPECT_FALSE(fs::exists(dir_ / "step_5"));
  // Superseded: nothing published, nothing pruned.
  fence.calls = 0;
  fence.answer = FailedPreconditionError("attempt 1 of job j is superseded by attempt 2");
  EXPECT_FALSE(writer.WriteNow(PartOf(MakeSnapshot(20, 64), 0, {MakeRun(0, 64, 64, 1)})).ok());
  EXPECT_THAT(failure, ::testing::HasSubstr("superseded"));
  EXPECT_EQ(completed.size(), 1u);
  EXPECT_FALSE(fs::exists(dir_ / "step_20"));
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(20, 0)));
  EXPECT_TRUE(fs::exists(dir_ / "step_10"));
}

// Shards whose runs leave a gap (or overlap) are never published: the commit checks the
// tiling before it writes the manifest.
TEST_F(CkptTest, CommitRefusesShardsThatDoNotTileTheArenas) {
  const CheckpointSnapshot whole = MakeSnapshot(3, 120);
  const auto runs = ThreeRankRuns();
  std::vector<v1::CheckpointShard> shards;
  for (int r : {0, 1}) {  // rank 2's part is missing
    auto part = PartOf(whole, r, runs[r]);
    auto written = WriteShard(Dir(), part.meta, part.shard);
    ASSERT_TRUE(written.ok()) << written.status();
    shards.insert(shards.end(), written->begin(), written->end());
  }
  auto committed = CommitCheckpoint(Dir(), whole.meta, shards);
  EXPECT_EQ(committed.status().code(), StatusCode::kInternal);
  EXPECT_THAT(committed.status().message(), ::testing::HasSubstr("cover 80 of 120"));
  EXPECT_TRUE(ListCheckpoints(Dir()).empty());
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(3, 0)));
}

// --- resume through the Trainer -----------------------------------------------------------

class ResumeTest : public CkptTest {
 protected:
  void SetUp() override {
    CkptTest::SetUp();
    SetNumThreads(1);
    fs::create_directories(dir_);
    std::mt19937_64 rng(11);
    std::vector<uint16_t> tokens(3000);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng() % 8 == 0 ? rng() % 16 : static_cast<uint16_t>((i * 5) % 13);
    }
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), tokens).ok());
  }

  JobSpec Spec(const std::string& run, bool async) {
    const std::string yaml =
        "name: resume\noutput_dir: " + (dir_ / run).string() +
        "\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, vocab_size: 16}\n"
        "data: {train: " +
        (dir_ / "train.bin").string() +
        "}\ntrain: {steps: 8, global_batch: 4, micro_batch: 2, seq_len: 8, lr: 0.01, "
        "warmup_steps: 2, eval_every: 0, seed: 3}\n"
        "checkpoint: {every_steps: 4, keep_last: 2, async: " +
        (async ? "true" : "false") + "}\n";
    auto spec = ParseJobSpec(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  std::unique_ptr<Trainer> Make(const JobSpec& spec) {
    TrainerOptions options;
    options.spec = spec;
    options.log_steps = false;
    auto t = Trainer::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  static std::vector<std::string> Losses(const fs::path& metrics) {
    std::ifstream in(metrics);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) {
      const size_t at = l.find("\"loss\":") + 7;
      out.push_back(l.substr(at, l.find(',', at) - at));
    }
    return out;
  }
};

// A checkpoint of another model is refused with both models named, not skipped for an
// older one (which is of that model too) and not loaded.
TEST_F(ResumeTest, ACheckpointOfAnotherModelIsRefusedNamingBothModels) {
  const JobSpec spec = Spec("other_model", /*async=*/false);
  {
    auto first = Make(spec);
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->Step().ok());
    ASSERT_TRUE(first->SaveCheckpoint(/*async=*/false).ok());
  }
  JobSpec wider = spec;
  wider.model.n_embd = 32;
  TrainerOptions options;
  options.spec = wider;
  options.log_steps = false;
  auto refused = Trainer::Create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("step_1 holds a model L=1 NH=2 C=16 maxT=8 V=16, the job "
                                   "spec asks for L=1 NH=2 C=32 maxT=8 V=16"));
}

TEST_F(ResumeTest, ResumedRunContinuesTheExactLossCurve) {
  // Uninterrupted: 8 steps, async checkpoints at 4 and 8.
  auto straight = Make(Spec("straight", /*async=*/true));
  ASSERT_NE(straight, nullptr);
  ASSERT_TRUE(straight->Run().ok());
  const auto want = Losses(dir_ / "straight" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);
  EXPECT_EQ(ListCheckpoints((dir_ / "straight" / "ckpt").string()).size(), 2u);

  // Interrupted: 4 steps, a checkpoint, the process "dies"; a new trainer resumes.
  const JobSpec spec = Spec("resumed", /*async=*/false);
  {
    auto first = Make(spec);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->resumed_from(), -1);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(first->Step().ok());
    ASSERT_TRUE(first->SaveCheckpoint(/*async=*/false).ok());
    ASSERT_TRUE(first->Step().ok());  // progress after the checkpoint is lost
  }
  auto second = Make(spec);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->resumed_from(), 4);
  EXPECT_EQ(second->step(), 4);
  EXPECT_EQ(second->optimizer_steps(), 4);
  ASSERT_TRUE(second->Run().ok());
  const auto got = Losses(dir_ / "resumed" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 4u);  // steps 5..8
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[4 + i]) << "step " << 5 + i;
}

}  // namespace
}  // namespace drover::engine::ckpt
