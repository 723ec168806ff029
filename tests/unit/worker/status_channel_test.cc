#include "worker/status_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker/trainer_reporter.h"

namespace drover {
namespace {

v1::TrainerStatus Starting() {
  v1::TrainerStatus st;
  st.set_job_id("j-1");
  st.set_attempt(2);
  st.set_state(v1::TRAINER_STARTING);
  st.set_last_progress_ms(100);
  st.mutable_progress()->set_last_checkpoint_step(-1);
  return st;
}

TEST(StatusChannelTest, StepChangeMovesLastProgressAndMarksRunning) {
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  ASSERT_TRUE(ApplyReportLine(R"({"progress":{"step":"5","loss":2.5}})", 900, &st, &ckpts).ok());
  EXPECT_EQ(st.progress().step(), 5);
  EXPECT_DOUBLE_EQ(st.progress().loss(), 2.5);
  EXPECT_EQ(st.last_progress_ms(), 900);
  EXPECT_EQ(st.state(), v1::TRAINER_RUNNING);
  EXPECT_TRUE(ckpts.empty());
}

TEST(StatusChannelTest, PhaseOnlyReportDoesNotCountAsProgress) {
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  ASSERT_TRUE(ApplyReportLine(R"({"progress":{"step":"5"}})", 900, &st, &ckpts).ok());
  ASSERT_TRUE(
      ApplyReportLine(R"({"progress":{"step":"5","message":"still here"}})", 5000, &st, &ckpts)
          .ok());
  EXPECT_EQ(st.last_progress_ms(), 900);
  EXPECT_EQ(st.progress().message(), "still here");
}

TEST(StatusChannelTest, CheckpointIsQueuedWithJobAndAttemptFilledIn) {
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  ASSERT_TRUE(
      ApplyReportLine(R"({"checkpoint":{"step":"40","path":"/c/step_40"}})", 7, &st, &ckpts).ok());
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].job_id(), "j-1");
  EXPECT_EQ(ckpts[0].attempt(), 2);
  EXPECT_EQ(ckpts[0].step(), 40);
  EXPECT_EQ(ckpts[0].created_ms(), 7);
  EXPECT_EQ(st.progress().last_checkpoint_step(), 40);
  // A later progress report without the checkpoint step must not forget it.
  ASSERT_TRUE(ApplyReportLine(R"({"progress":{"step":"41"}})", 8, &st, &ckpts).ok());
  EXPECT_EQ(st.progress().last_checkpoint_step(), 40);
}

TEST(StatusChannelTest, MalformedLineIsRejectedAndStatusUnchanged) {
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  Status s = ApplyReportLine("{not json", 900, &st, &ckpts);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("{not json"), std::string::npos);
  EXPECT_EQ(st.state(), v1::TRAINER_STARTING);
  EXPECT_EQ(st.last_progress_ms(), 100);
}

TEST(StatusChannelTest, TakeLinesKeepsPartialTail) {
  std::string buf = "a\nbb\n\nccc";
  std::vector<std::string> lines = TakeLines(&buf);
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(buf, "ccc");
  buf += "d\n";
  EXPECT_EQ(TakeLines(&buf), (std::vector<std::string>{"cccd"}));
  EXPECT_TRUE(buf.empty());
}

// Closes the writing end sv[1] and returns everything written to it.
std::string DrainSocketPair(int sv[2]) {
  close(sv[1]);
  std::string data;
  char buf[4096];
  for (ssize_t n; (n = read(sv[0], buf, sizeof(buf))) > 0;) data.append(buf, n);
  close(sv[0]);
  return data;
}

TEST(TrainerReporterTest, LinesRoundTripThroughASocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TrainerReporter reporter(sv[1]);
  ASSERT_TRUE(reporter.enabled());
  v1::CheckpointRecord rec;
  rec.set_step(10);
  rec.set_path("/x/step_10");
  reporter.Checkpoint(rec);
  reporter.Progress(11, 12.5, 3.25, 900.0);
  reporter.Done();
  std::string data = DrainSocketPair(sv);

  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  std::vector<std::string> lines = TakeLines(&data);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& line : lines) ASSERT_TRUE(ApplyReportLine(line, 50, &st, &ckpts).ok()) << line;
  EXPECT_EQ(st.progress().step(), 11);
  EXPECT_DOUBLE_EQ(st.progress().loss(), 3.25);
  EXPECT_EQ(st.progress().last_checkpoint_step(), 10);
  EXPECT_EQ(st.progress().message(), "done");
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].path(), "/x/step_10");
}

// A heartbeat carries only the latest report: an evaluation step followed by another step
// before the next heartbeat must not lose its validation loss, nor its HellaSwag accuracy.
TEST(TrainerReporterTest, ValidationLossRidesAlongUntilTheNextEvaluation) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TrainerReporter reporter(sv[1]);
  reporter.Progress(9, 1.0, 3.0, 100.0,
                    {.lr = 1e-3, .val_loss = std::nullopt, .hellaswag = std::nullopt, .mfu = 0.0});
  reporter.Progress(10, 1.0, 2.9, 100.0,
                    {.lr = 9e-4, .val_loss = 3.5, .hellaswag = 0.25, .mfu = 0.4});
  reporter.Progress(11, 1.0, 2.8, 100.0,
                    {.lr = 8e-4, .val_loss = std::nullopt, .hellaswag = std::nullopt, .mfu = 0.4});
  reporter.Phase("saving");
  std::string data = DrainSocketPair(sv);
  std::vector<std::string> lines = TakeLines(&data);
  ASSERT_EQ(lines.size(), 4u);
  std::vector<v1::TrainerProgress> seen;
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  for (const auto& line : lines) {
    ASSERT_TRUE(ApplyReportLine(line, 50, &st, &ckpts).ok()) << line;
    seen.push_back(st.progress());
  }
  EXPECT_EQ(seen[0].val_step(), 0);  // none yet
  EXPECT_EQ(seen[0].hellaswag_step(), 0);
  EXPECT_DOUBLE_EQ(seen[0].lr(), 1e-3);
  EXPECT_EQ(seen[1].val_step(), 10);
  EXPECT_DOUBLE_EQ(seen[1].val_loss(), 3.5);
  EXPECT_EQ(seen[1].hellaswag_step(), 10);
  EXPECT_DOUBLE_EQ(seen[1].hellaswag(), 0.25);
  EXPECT_EQ(seen[2].val_step(), 10);  // carried by the next step
  EXPECT_DOUBLE_EQ(seen[2].val_loss(), 3.5);
  EXPECT_EQ(seen[2].hellaswag_step(), 10);
  EXPECT_DOUBLE_EQ(seen[2].hellaswag(), 0.25);
  EXPECT_DOUBLE_EQ(seen[2].lr(), 8e-4);
  EXPECT_DOUBLE_EQ(seen[2].mfu(), 0.4);
  EXPECT_EQ(seen[3].step(), 11);  // a phase keeps the last step's numbers
  EXPECT_DOUBLE_EQ(seen[3].lr(), 8e-4);
  EXPECT_EQ(seen[3].val_step(), 10);
  // ... its loss and speed too: rank 0's latest report is the job's (a job that ended
  // writing its final checkpoint showed a loss of 0).
  EXPECT_DOUBLE_EQ(seen[3].loss(), 2.8);
  EXPECT_DOUBLE_EQ(seen[3].step_ms(), 1.0);
  EXPECT_DOUBLE_EQ(seen[3].tokens_per_s(), 100.0);
}

// What the coordinator compares ranks by (coordinator/straggler.h) must not turn on one
// step: the warm-up steps are left out, nothing is said before a few steps, then the
// median of the last kBusyWindow.
TEST(TrainerReporterTest, BusyTimeAndPaceAreTheMediansOfTheLastStepsAfterTheWarmUp) {
  static_assert(TrainerReporter::kBusyWarmupSteps == 3 && TrainerReporter::kBusyMinSteps == 8);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TrainerReporter reporter(sv[1]);
  std::vector<double> busy = {5000, 900, 700};                       // steps 1-3: the warm-up
  for (double b : {40, 44, 42, 400, 41, 43, 45}) busy.push_back(b);  // 4-10, one slow
  busy.push_back(46);  // 11: the eighth after the warm-up
  busy.push_back(90);  // 12
  for (size_t i = 0; i < TrainerReporter::kBusyWindow; ++i) busy.push_back(90);
  for (size_t i = 0; i < busy.size(); ++i) {
    reporter.Progress(static_cast<int64_t>(i + 1), busy[i] + 5, 3.0, 100.0,
                      {.lr = 1e-3,
                       .val_loss = std::nullopt,
                       .hellaswag = std::nullopt,
                       .mfu = 0,
                       .busy_ms = busy[i],
                       .pp_stage = 2});
  }
  std::string data = DrainSocketPair(sv);
  std::vector<std::string> lines = TakeLines(&data);
  ASSERT_EQ(lines.size(), busy.size());
  std::vector<v1::TrainerProgress> seen;  // seen[i]: after step i + 1
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  for (const auto& line : lines) {
    ASSERT_TRUE(ApplyReportLine(line, 50, &st, &ckpts).ok()) << line;
    seen.push_back(st.progress());
  }
  EXPECT_EQ(seen[9].busy_ms(), 0);  // step 10: seven after the warm-up, too few yet
  EXPECT_EQ(seen[9].pace_ms(), 0);
  EXPECT_EQ(seen[10].busy_ms(), 43.5);  // {40, 44, 42, 400, 41, 43, 45, 46}: no warm-up
  EXPECT_EQ(seen[10].pace_ms(), 48.5);  // the same steps' step_ms, each 5 ms more
  EXPECT_EQ(seen[10].pp_stage(), 2);
  EXPECT_EQ(seen[11].busy_ms(), 44);     // one 90 more
  EXPECT_EQ(seen.back().busy_ms(), 90);  // the window holds only the last 16, all 90
  EXPECT_EQ(seen.back().pace_ms(), 95);
}

TEST(TrainerReporterTest, ACheckpointFailureIsCarriedUntilASaveSucceeds) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TrainerReporter reporter(sv[1]);
  reporter.CheckpointFailed("UNAVAILABLE: No space left on device");
  reporter.Progress(5, 1.0, 3.0, 100.0);
  v1::CheckpointRecord rec;
  rec.set_step(10);
  reporter.Checkpoint(rec);
  reporter.Progress(11, 1.0, 2.5, 100.0);
  std::string data = DrainSocketPair(sv);
  v1::TrainerStatus st = Starting();
  std::vector<v1::CheckpointRecord> ckpts;
  std::vector<std::string> lines = TakeLines(&data);
  ASSERT_EQ(lines.size(), 4u);
  std::vector<std::string> errors;
  for (const auto& line : lines) {
    ASSERT_TRUE(ApplyReportLine(line, 50, &st, &ckpts).ok()) << line;
    errors.push_back(st.progress().checkpoint_error());
  }
  EXPECT_EQ(errors[0], "UNAVAILABLE: No space left on device");
  EXPECT_EQ(errors[1], "UNAVAILABLE: No space left on device");
  EXPECT_EQ(errors[3], "");
}

TEST(TrainerReporterTest, DisabledWithoutStatusFdAndWritingIsANoOp) {
  unsetenv("DROVER_STATUS_FD");
  TrainerReporter reporter = TrainerReporter::FromEnv();
  EXPECT_FALSE(reporter.enabled());
  reporter.Progress(1, 1, 1, 1);  // must not crash
}

TEST(TrainerReporterTest, VanishedReaderDoesNotKillTheTrainer) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  close(sv[0]);
  TrainerReporter reporter(sv[1]);
  reporter.Progress(1, 1, 1, 1);  // EPIPE, not SIGPIPE
  close(sv[1]);
  SUCCEED();
}

}  // namespace
}  // namespace drover
