#include "coordinator/store/sqlite_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "coordinator/store/store_writer.h"

namespace drover::coordinator {
namespace {

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/drover_store_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Built with += : GCC 12 warns falsely (-Wrestrict) on "literal" + std::to_string(i).
std::string Name(const char* prefix, int64_t i) {
  std::string out = prefix;
  out += std::to_string(i);
  return out;
}

StoreBatch SampleBatch(int i) {
  StoreBatch b;
  v1::JobRecord j;
  j.set_job_id(Name("j", i));
  j.set_submit_seq(i);
  j.set_state(v1::RUNNING);
  j.set_attempt(i);
  b.jobs.push_back(j);
  v1::AttemptRecord a;
  a.set_job_id(j.job_id());
  a.set_attempt(i);
  a.set_end_reason("node n dead");
  b.attempts.push_back(a);
  v1::NodeRecord n;
  n.set_name(Name("n", i));
  n.set_failures(i);
  b.nodes.push_back(n);
  v1::CheckpointRecord c;
  c.set_job_id(j.job_id());
  c.set_step(100 * i);
  c.set_path(Name("/ck/step_", 100 * i));
  b.checkpoints.push_back(c);
  b.counters["salt"] = 77;
  return b;
}

TEST(SqliteStoreTest, UpsertsReplaceAndLoadInOrder) {
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Apply(SampleBatch(2)).ok());
  ASSERT_TRUE((*store)->Apply(SampleBatch(1)).ok());
  StoreBatch update;
  v1::JobRecord j;
  j.set_job_id("j1");
  j.set_submit_seq(1);
  j.set_state(v1::SUCCEEDED);
  update.jobs.push_back(j);
  ASSERT_TRUE((*store)->Apply(update).ok());
  auto c = (*store)->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->jobs.size(), 2u);
  EXPECT_EQ(c->jobs[0].job_id(), "j1");  // by submit_seq
  EXPECT_EQ(c->jobs[0].state(), v1::SUCCEEDED);
  EXPECT_EQ(c->attempts.size(), 2u);
  EXPECT_EQ(c->nodes.size(), 2u);
  EXPECT_EQ(c->checkpoints[1].path(), "/ck/step_200");
  EXPECT_EQ(c->counters.at("salt"), 77);
}

TEST(SqliteStoreTest, DeletedJobLeavesNoRowsAndItsUpsertInTheSameBatchLosesToTheDelete) {
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Apply(SampleBatch(1)).ok());
  ASSERT_TRUE((*store)->Apply(SampleBatch(2)).ok());
  // An older change of j1 merged with its deletion (the writer merges queued batches).
  StoreBatch merged = SampleBatch(1);
  StoreBatch deletion;
  deletion.deleted_jobs.push_back("j1");
  merged.Append(std::move(deletion));
  ASSERT_TRUE((*store)->Apply(merged).ok());
  auto c = (*store)->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->jobs.size(), 1u);
  EXPECT_EQ(c->jobs[0].job_id(), "j2");
  ASSERT_EQ(c->attempts.size(), 1u);
  EXPECT_EQ(c->attempts[0].job_id(), "j2");
  ASSERT_EQ(c->checkpoints.size(), 1u);
  EXPECT_EQ(c->checkpoints[0].job_id(), "j2");
  EXPECT_EQ(c->nodes.size(), 2u);  // nodes are not the job's
}

TEST(SqliteStoreTest, ReopenAfterCrashKeepsEveryCommittedTransition) {
  const std::string path = TempDir("crash") + "/state.db";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child writes through the writer, waits until durable, and dies without closing
    // anything (no destructor, no checkpoint of the WAL): like kill -9.
    auto store = SqliteStore::Open(path);
    if (!store.ok()) _exit(3);
    auto* writer = new StoreWriter(store->get(), nullptr);
    int64_t seq = 0;
    for (int i = 1; i <= 20; ++i) seq = writer->Commit(SampleBatch(i));
    if (!writer->WaitDurable(seq).ok()) _exit(4);
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto c = (*store)->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->jobs.size(), 20u);
  EXPECT_EQ(c->attempts.size(), 20u);
  EXPECT_EQ(c->nodes.size(), 20u);
  EXPECT_EQ(c->checkpoints.size(), 20u);
  EXPECT_EQ(c->jobs.back().attempt(), 20);
}

TEST(SqliteStoreTest, FullDiskFailsOneBatchAndTheNextIsWrittenOnceThereIsRoom) {
  const std::string path = TempDir("full") + "/state.db";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // In a child: a file-size limit stands in for a full disk (writes past it fail with
    // EFBIG once SIGXFSZ is ignored), and it must not limit the test process.
    signal(SIGXFSZ, SIG_IGN);
    auto store = SqliteStore::Open(path);
    if (!store.ok()) _exit(3);
    rlimit room{};
    getrlimit(RLIMIT_FSIZE, &room);
    rlimit full = room;
    full.rlim_cur = 256 << 10;  // the WAL grows by a few pages per commit
    setrlimit(RLIMIT_FSIZE, &full);
    int i = 1;
    Status st;
    for (; i < 100000 && (st = (*store)->Apply(SampleBatch(i))).ok(); ++i) {
    }
    if (st.ok()) _exit(4);
    fprintf(stderr, "batch %d failed: %s\n", i, st.ToString().c_str());
    setrlimit(RLIMIT_FSIZE, &room);
    st = (*store)->Apply(SampleBatch(i + 1));
    if (!st.ok()) {
      fprintf(stderr, "the write after it failed too: %s\n", st.ToString().c_str());
      _exit(5);
    }
    auto c = (*store)->LoadAll();
    // Every batch before the failed one, the one after it, and nothing of the failed one.
    if (!c.ok() || static_cast<int>(c->jobs.size()) != i) _exit(6);
    for (const auto& j : c->jobs) {
      if (j.job_id() == Name("j", i)) _exit(7);
    }
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

TEST(SqliteStoreTest, EmptyDatabaseFileIsRefusedNotAFreshStart) {
  const std::string dir = ::testing::TempDir() + "/sqlite_empty_db";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/state.db");  // zero bytes
  auto store = SqliteStore::Open(dir + "/state.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), ::testing::HasSubstr("state.db is empty (0 bytes)"));
  EXPECT_EQ(std::filesystem::file_size(dir + "/state.db"), 0u);  // left as it was
  std::filesystem::remove_all(dir);
}

TEST(SqliteStoreTest, UnopenablePathIsAStatusNotACrash) {
  auto store = SqliteStore::Open("/nonexistent-dir/for/sure/state.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("state.db"), std::string::npos);
}

}  // namespace
}  // namespace drover::coordinator
