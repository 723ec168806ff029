// ReadCheckpointPart and LoadLatestCheckpointPart: a rank reads only the shard files that
// hold what it needs, verifies each, and keeps only what it asked for.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/ckpt/agreed_load.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/ckpt/checkpoint_format.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;

class CheckpointPartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("ckpt_part_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // ThreeRankRuns' shards of MakeSnapshot(step, 120), written and committed as three ranks
  // would.
  CheckpointSnapshot SaveThreeRanks(int64_t step) {
    CheckpointSnapshot whole = MakeSnapshot(step, 120);
    std::vector<v1::CheckpointShard> shards;
    const auto runs = ThreeRankRuns();
    for (int r = 0; r < 3; ++r) {
      const ShardSnapshot part = PartOf(whole, r, runs[static_cast<size_t>(r)]);
      auto written = WriteShard(dir_.string(), part.meta, part.shard);
      EXPECT_TRUE(written.ok()) << written.status();
      if (written.ok()) shards.insert(shards.end(), written->begin(), written->end());
    }
    auto committed = CommitCheckpoint(dir_.string(), whole.meta, shards);
    EXPECT_TRUE(committed.ok()) << committed.status();
    return whole;
  }
  std::string StepDir(int64_t step) const { return (dir_ / StepDirName(step)).string(); }
  // Flips one byte of a shard file: same size, wrong CRC32C.
  void Corrupt(int64_t step, const std::string& file) {
    std::fstream f(fs::path(StepDir(step)) / file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    f.put('\x5a');
  }

  static PartRequestFn Asking(PartRequest request) {
    return [request](const std::string&, const v1::CheckpointManifest&) -> StatusOr<PartRequest> {
      return request;
    };
  }

  fs::path dir_;
};

TEST_F(CheckpointPartTest, APartHoldsExactlyTheElementsAskedForWithTheirValues) {
  const CheckpointSnapshot whole = SaveThreeRanks(4);
  // Params [5, 25) cross the files of ranks 0, 1 and 2 (their runs interleave every 10);
  // the moments [95, 105) those of ranks 0 and 1.
  auto part = ReadCheckpointPart(StepDir(4), 4, Asking({{{5, 25}}, {{95, 105}}}));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->meta.step(), 4);
  EXPECT_EQ(part->params.size(), 20u);
  EXPECT_EQ(part->adam_m.size(), 10u);
  EXPECT_EQ(part->adam_v.size(), 10u);
  for (size_t i = 5; i < 25; ++i) EXPECT_EQ(part->params.At(i, 1)[0], whole.params[i]) << i;
  for (size_t i = 95; i < 105; ++i) {
    EXPECT_EQ(part->adam_m.At(i, 1)[0], whole.adam_m[i]) << i;
    EXPECT_EQ(part->adam_v.At(i, 1)[0], whole.adam_v[i]) << i;
  }
}

// Shard files are streamed in chunks of 1 MiB: pieces of runs that cross a chunk's end, in
// files of several chunks, land where they belong.
TEST_F(CheckpointPartTest, PiecesThatCrossTheReadersChunksLandInPlace) {
  constexpr size_t n = 3 * 333'331;  // 1.3 MB per rank and arena: two chunks a file
  CheckpointSnapshot whole = MakeSnapshot(2, n);
  // Three ranks, interleaved every 333'331 / 331 elements: runs of an odd length whose
  // pieces straddle chunk boundaries.
  std::vector<v1::CheckpointShard> shards;
  for (int r = 0; r < 3; ++r) {
    const int64_t len = 331, count = n / (3 * len), tail = n - 3 * len * count;
    std::vector<v1::CheckpointRun> runs = {MakeRun(r * len, len, 3 * len, count)};
    if (tail > 0 && r == 0) runs.push_back(MakeRun(3 * len * count, tail, tail, 1));
    const ShardSnapshot part = PartOf(whole, r, runs);
    auto written = WriteShard(dir_.string(), part.meta, part.shard);
    ASSERT_TRUE(written.ok()) << written.status();
    shards.insert(shards.end(), written->begin(), written->end());
  }
  ASSERT_TRUE(CommitCheckpoint(dir_.string(), whole.meta, shards).ok());
  const std::vector<ElementRange> asked = {{1, 262'150}, {262'140, 262'147}, {700'001, n}};
  auto part = ReadCheckpointPart(StepDir(2), 2, Asking({asked, asked}));
  ASSERT_TRUE(part.ok()) << part.status();
  for (const ElementRange& r : part->params.ranges()) {
    for (size_t i = r.begin; i < r.end; ++i) {
      ASSERT_EQ(part->params.At(i, 1)[0], whole.params[i]) << i;
      ASSERT_EQ(part->adam_v.At(i, 1)[0], whole.adam_v[i]) << i;
    }
  }
  EXPECT_EQ(part->params.size(), 262'149u + (n - 700'001));
  auto all = ReadCheckpoint(StepDir(2));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->adam_m, whole.adam_m);
}

// A read tells its progress: the total it needs first, then each block's bytes as they come
// in (from up to 8 reading threads, one call at a time), ending at what it read. A shard file
// that is missing stops the read before any is read.
TEST_F(CheckpointPartTest, AReadTellsHowFarItHasComeOfItsTotal) {
  constexpr size_t n = 3 * 333'331;  // 1.3 MB per rank and arena: two blocks a file
  CheckpointSnapshot whole = MakeSnapshot(2, n);
  std::vector<v1::CheckpointShard> shards;
  for (int r = 0; r < 3; ++r) {
    const ShardSnapshot part = PartOf(whole, r, {MakeRun(r * 333'331, 333'331, 333'331, 1)});
    auto written = WriteShard(dir_.string(), part.meta, part.shard);
    ASSERT_TRUE(written.ok()) << written.status();
    shards.insert(shards.end(), written->begin(), written->end());
  }
  ASSERT_TRUE(CommitCheckpoint(dir_.string(), whole.meta, shards).ok());
  struct Call {
    std::string dir;
    int64_t read, total;
  };
  std::vector<Call> calls;
  std::atomic<int> inside{0};
  bool overlapped = false;
  auto progress = [&](const std::string& step_dir, int64_t read, int64_t total) {
    if (inside.fetch_add(1) != 0) overlapped = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a chance to overlap
    calls.push_back({step_dir, read, total});
    inside.fetch_sub(1);
  };
  // Params from every rank's file, moments from ranks 0 and 1 only.
  const PartRequest asked{{{0, n}}, {{0, 2 * 333'331}}};
  auto part = ReadCheckpointPart(StepDir(2), 2, Asking(asked), progress);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_FALSE(overlapped);
  // 3 params files + 2 files of each moment, two blocks each: 14 blocks, and the start.
  ASSERT_EQ(calls.size(), 15u);
  EXPECT_EQ(calls.front().read, 0);
  EXPECT_EQ(calls.back().read, part->bytes_read);
  EXPECT_EQ(part->bytes_read, 7 * 333'331 * 4);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].dir, StepDir(2));
    EXPECT_EQ(calls[i].total, part->bytes_read) << i;
    if (i > 0) {
      EXPECT_GT(calls[i].read, calls[i - 1].read) << i;
    }
  }
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(part->params.At(i, 1)[0], whole.params[i]) << i;

  fs::remove(fs::path(StepDir(2)) / "adam_v.r1.bin");
  calls.clear();
  auto missing = ReadCheckpointPart(StepDir(2), 2, Asking(asked), progress);
  EXPECT_EQ(missing.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(missing.status().message().find("missing shard adam_v.r1.bin"), std::string::npos)
      << missing.status();
  EXPECT_TRUE(calls.empty());
}

// What a rank does not need it does not read: a corrupt file of another rank's elements
// does not stop it, and one it needs does, naming the file.
TEST_F(CheckpointPartTest, OnlyTheFilesHoldingWhatIsAskedForAreReadAndVerified) {
  SaveThreeRanks(4);
  Corrupt(4, "params.r2.bin");  // elements 20-29, 50-59, 80-89, 110-119
  auto clean = ReadCheckpointPart(StepDir(4), 4, Asking({{{0, 20}, {30, 50}}, {{0, 120}}}));
  EXPECT_TRUE(clean.ok()) << clean.status();
  ASSERT_TRUE(clean.ok());
  // params.r0.bin and r1 (40 floats each), and every moment file.
  EXPECT_EQ(clean->bytes_read, 2 * 160 + 6 * 160);
  auto hit = ReadCheckpointPart(StepDir(4), 4, Asking({{{0, 20}, {110, 111}}, {}}));
  EXPECT_EQ(hit.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(hit.status().message().find("params.r2.bin: CRC32C mismatch"), std::string::npos)
      << hit.status();
  // The whole read finds it too.
  EXPECT_EQ(ReadCheckpoint(StepDir(4)).status().code(), StatusCode::kDataLoss);
}

// Shard files are written in checksummed blocks of 1 MiB: a rank reads and verifies only the
// blocks that hold its elements, so a new mesh whose shares cut across the old mesh's files
// reads what it needs, not every file it touches.
TEST_F(CheckpointPartTest, ARankReadsOnlyTheBlocksHoldingItsElements) {
  constexpr size_t kBlock = size_t{1} << 18;  // floats in a block
  constexpr size_t n = 3 * kBlock + 1000;     // four blocks per arena, the last short
  const CheckpointSnapshot whole = MakeSnapshot(3, n);
  ASSERT_TRUE(WriteCheckpoint(dir_.string(), whole).ok());
  auto m = ReadManifest(StepDir(3));
  ASSERT_TRUE(m.ok()) << m.status();
  for (const auto& sh : m->shards()) {
    EXPECT_EQ(sh.block_bytes(), kBlock * sizeof(float));
    EXPECT_EQ(sh.block_crc32c_size(), 4) << sh.file();
  }
  // Params [kBlock - 5, kBlock + 5) straddle blocks 0 and 1; the moments only block 3.
  auto part =
      ReadCheckpointPart(StepDir(3), 3, Asking({{{kBlock - 5, kBlock + 5}}, {{n - 10, n}}}));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->bytes_read, 2 * 4 * kBlock + 2 * 4 * 1000);
  for (size_t i = kBlock - 5; i < kBlock + 5; ++i)
    EXPECT_EQ(part->params.At(i, 1)[0], whole.params[i]);
  for (size_t i = n - 10; i < n; ++i) EXPECT_EQ(part->adam_v.At(i, 1)[0], whole.adam_v[i]);

  // A damaged block that is not needed stops nobody; one that is stops the read, named.
  {
    std::fstream f(fs::path(StepDir(3)) / "params.r0.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(2 * kBlock * sizeof(float) + 8));
    f.put('\x5a');
  }
  EXPECT_TRUE(ReadCheckpointPart(StepDir(3), 3, Asking({{{0, 2 * kBlock}}, {}})).ok());
  auto hit = ReadCheckpointPart(StepDir(3), 3, Asking({{{2 * kBlock + 1, 2 * kBlock + 3}}, {}}));
  EXPECT_EQ(hit.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(hit.status().message().find("params.r0.bin: CRC32C mismatch in block 2 (bytes 2097152 "
                                        "to 3145728"),
            std::string::npos)
      << hit.status();
  EXPECT_EQ(ReadCheckpoint(StepDir(3)).status().code(), StatusCode::kDataLoss);
}

// The manifest of an earlier writer has no block checksums: its files are read whole and
// verified by their one CRC32C. Block checksums that do not fit the file are DataLoss.
TEST_F(CheckpointPartTest, FilesWithoutBlockChecksumsAreReadWholeAndBadBlockListsRefused) {
  constexpr size_t n = 300'000;  // two blocks per file
  const CheckpointSnapshot whole = MakeSnapshot(5, n);
  ASSERT_TRUE(WriteCheckpoint(dir_.string(), whole).ok());
  auto rewrite = [&](const std::function<void(v1::CheckpointShard*)>& edit) {
    auto m = ReadManifest(StepDir(5));
    ASSERT_TRUE(m.ok()) << m.status();
    for (auto& sh : *m->mutable_shards()) edit(&sh);
    auto json = internal::SealManifest(*m);  // sealed anew: the edit is the test's
    ASSERT_TRUE(json.ok()) << json.status();
    std::ofstream(fs::path(StepDir(5)) / kManifestFile, std::ios::trunc) << *json;
  };
  rewrite([](v1::CheckpointShard* sh) {
    sh->clear_block_bytes();
    sh->clear_block_crc32c();
  });
  auto part = ReadCheckpointPart(StepDir(5), 5, Asking({{{0, 10}}, {}}));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->bytes_read, static_cast<int64_t>(n * sizeof(float)));
  EXPECT_EQ(part->params.At(7, 1)[0], whole.params[7]);

  rewrite([](v1::CheckpointShard* sh) {
    sh->set_block_bytes(1 << 20);
    sh->add_block_crc32c(1);
  });
  auto bad = ReadCheckpointPart(StepDir(5), 5, Asking({{{0, 10}}, {}}));
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("params.r0.bin: the manifest's 1 block checksums of "
                                        "1048576 bytes do not fit the file's 1200000 bytes"),
            std::string::npos)
      << bad.status();
}

TEST_F(CheckpointPartTest, ElementsPastTheArenaAreRefusedNamingBoth) {
  SaveThreeRanks(4);
  auto past = ReadCheckpointPart(StepDir(4), 4, Asking({{{100, 130}}, {}}));
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("holds 120 parameters; element 129 was asked for"),
            std::string::npos)
      << past.status();
}

TEST_F(CheckpointPartTest, TheManifestMustSayTheStepOfItsDirectory) {
  SaveThreeRanks(4);
  fs::rename(StepDir(4), StepDir(5));
  auto moved = ReadCheckpointPart(StepDir(5), 5, Asking({{{0, 1}}, {}}));
  EXPECT_EQ(moved.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(moved.status().message().find("manifest says step 4"), std::string::npos);
}

// A broken newest checkpoint gives way to the one before; a refused one (another model)
// ends the search with the refusal: an older checkpoint of the same run is no better.
TEST_F(CheckpointPartTest, LoadLatestSkipsABrokenCheckpointButStopsAtARefusal) {
  const CheckpointSnapshot older = SaveThreeRanks(4);
  SaveThreeRanks(8);
  Corrupt(8, "adam_v.r1.bin");
  std::string path;
  auto got = LoadLatestCheckpointPart(dir_.string(), Asking({{{0, 120}}, {{0, 120}}}), &path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.step(), 4);
  EXPECT_EQ(path, StepDir(4));
  EXPECT_EQ(std::vector<float>(got->adam_v.At(0, 120), got->adam_v.At(0, 120) + 120), older.adam_v);

  int asked = 0;
  auto refuse = [&](const std::string& step_dir,
                    const v1::CheckpointManifest&) -> StatusOr<PartRequest> {
    ++asked;
    return InvalidArgumentError(step_dir + " is of another model");
  };
  auto refused = LoadLatestCheckpointPart(dir_.string(), refuse);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("step_8 is of another model"), std::string::npos);
  EXPECT_EQ(asked, 1);
}

// Two ranks of a mesh, each asking for its half: each gets its half, and a refusal reaches
// both at once (no rank waits out the store's timeout for a report that never comes).
TEST_F(CheckpointPartTest, AgreedLoadGivesEachRankItsOwnPartAndSharesARefusal) {
  const CheckpointSnapshot whole = SaveThreeRanks(4);
  parallel::InMemoryKvStore store;
  auto load = [&](const std::string& key, bool refuse) {
    std::vector<StatusOr<CheckpointPart>> out(2, NotFoundError("not run"));
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        AgreedLoadOptions o;
        o.dir = dir_.string();
        o.rank = r;
        o.world_size = 2;
        o.store = &store;
        o.key = key;
        o.timeout = std::chrono::seconds(60);
        const size_t lo = r == 0 ? 0 : 60, hi = r == 0 ? 60 : 120;
        PartRequestFn want = [&, lo, hi](const std::string&,
                                         const v1::CheckpointManifest&) -> StatusOr<PartRequest> {
          if (refuse) return InvalidArgumentError("another model");
          return PartRequest{{{lo, hi}}, {{lo, hi}}};
        };
        std::string path;
        out[static_cast<size_t>(r)] = LoadAgreedCheckpoint(o, want, &path);
      });
    }
    for (auto& t : ranks) t.join();
    return out;
  };
  auto got = load("halves", false);
  for (int r = 0; r < 2; ++r) {
    const StatusOr<CheckpointPart>& p = got[static_cast<size_t>(r)];
    ASSERT_TRUE(p.ok()) << p.status();
    const size_t lo = r == 0 ? 0 : 60;
    EXPECT_EQ(p->params.ranges(), (std::vector<ElementRange>{{lo, lo + 60}}));
    EXPECT_EQ(std::vector<float>(p->adam_m.At(lo, 60), p->adam_m.At(lo, 60) + 60),
              std::vector<float>(whole.adam_m.begin() + lo, whole.adam_m.begin() + lo + 60));
  }
  const auto start = std::chrono::steady_clock::now();
  auto refused = load("refused", true);
  for (const auto& p : refused) {
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << p.status();
    EXPECT_EQ(p.status().message(), "another model");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace drover::engine::ckpt
