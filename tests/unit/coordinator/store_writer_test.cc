#include "coordinator/store/store_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/store/sqlite_store.h"
#include "tests/unit/coordinator/fault_injection_store.h"

namespace drover::coordinator {
namespace {

using testing::DiskFull;
using testing::FaultInjectionStore;
using ::testing::HasSubstr;

StoreBatch JobBatch(const std::string& id, int64_t seq) {
  StoreBatch b;
  v1::JobRecord j;
  j.set_job_id(id);
  j.set_submit_seq(seq);
  b.jobs.push_back(j);
  return b;
}

bool Holds(const StoreBatch& b, const std::string& id) {
  for (const auto& j : b.jobs) {
    if (j.job_id() == id) return true;
  }
  return false;
}

class StoreWriterTest : public ::testing::Test {
 protected:
  StoreWriterTest() {
    auto sqlite = SqliteStore::Open(":memory:");
    DROVER_CHECK_OK(sqlite.status());
    store_ = std::make_unique<FaultInjectionStore>(std::move(*sqlite));
    writer_ = std::make_unique<StoreWriter>(store_.get(), [this](const Status& st) {
      std::lock_guard<std::mutex> lock(mu_);
      fatal_.push_back(st);
    });
  }
  std::vector<std::string> StoredJobs() {
    writer_.reset();  // drains, and nothing else touches the store now
    std::vector<std::string> ids;
    StatusOr<StoreContents> contents = store_->LoadAll();
    DROVER_CHECK_OK(contents.status());
    for (const auto& j : contents->jobs) ids.push_back(j.job_id());
    return ids;
  }
  std::vector<Status> Fatal() {
    std::lock_guard<std::mutex> lock(mu_);
    return fatal_;
  }

  std::unique_ptr<FaultInjectionStore> store_;
  std::mutex mu_;
  std::vector<Status> fatal_;  // GUARDED_BY(mu_)
  std::unique_ptr<StoreWriter> writer_;
};

TEST_F(StoreWriterTest, RefusedProposalChangesNothingElseAndTheWriterGoesOn) {
  // Only the big submit does not fit. It is queued between two commits, all three taken
  // in one transaction: the error must land on the submit alone.
  store_->FailWrites([](const StoreBatch& b) { return Holds(b, "big") ? DiskFull() : OkStatus(); });
  store_->Pause();
  writer_->Commit(JobBatch("c0", 1));  // the writer takes this one and waits in Apply
  writer_->Commit(JobBatch("c1", 2));
  const int64_t big = writer_->Propose(JobBatch("big", 3));
  const int64_t c2 = writer_->Commit(JobBatch("c2", 4));
  store_->Resume();
  Status refused = writer_->WaitProposal(big);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("database or disk is full"));
  EXPECT_TRUE(writer_->WaitDurable(c2).ok());
  // Once there is room again a proposal is written.
  store_->HealWrites();
  const int64_t next = writer_->Propose(JobBatch("next", 5));
  EXPECT_TRUE(writer_->WaitProposal(next).ok());
  EXPECT_TRUE(Fatal().empty());
  EXPECT_EQ(StoredJobs(), (std::vector<std::string>{"c0", "c1", "c2", "next"}));
}

TEST_F(StoreWriterTest, FailedCommitIsFatalOnceAndNothingIsWrittenAfterIt) {
  const int64_t before = writer_->Commit(JobBatch("before", 1));
  ASSERT_TRUE(writer_->WaitDurable(before).ok());
  store_->FailAllWrites(DiskFull());
  const int64_t lost = writer_->Commit(JobBatch("lost", 2));
  Status st = writer_->WaitDurable(lost);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  ASSERT_EQ(Fatal().size(), 1u);
  EXPECT_THAT(Fatal()[0].message(), HasSubstr("database or disk is full"));
  // The disk has room again, but memory is ahead of it for good: a later change could
  // build on the lost one, so nothing more is written, and proposals are refused.
  store_->HealWrites();
  const int64_t after = writer_->Commit(JobBatch("after", 3));
  const int64_t proposal = writer_->Propose(JobBatch("proposal", 4));
  Status refused = writer_->WaitProposal(proposal);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("takes no more writes"));
  EXPECT_FALSE(writer_->WaitDurable(after).ok());
  EXPECT_EQ(Fatal().size(), 1u);
  EXPECT_EQ(StoredJobs(), std::vector<std::string>{"before"});
}

}  // namespace
}  // namespace drover::coordinator
