// Pipeline schedules: the action order of every stage, and that the stages of a schedule
// can run against each other without deadlock and within their activation budget.
#include "worker/engine/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace drover::engine::parallel {
namespace {

// "F0 B0 ..."; with chunks, "F0.1" is micro-batch 0 of chunk 1.
std::string Render(const std::vector<PipeAction>& actions, bool chunks = false) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (!s.empty()) s += " ";
    s += a.kind == PipeAction::kForward ? 'F' : 'B';
    s += std::to_string(a.micro_batch);
    if (chunks) {
      s += '.';
      s += std::to_string(a.chunk);
    }
  }
  return s;
}

TEST(PipelineScheduleTest, GPipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::kGPipe, 2, 0, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(MaxInFlight(StageSchedule(PipelineSchedule::kGPipe, 2, 0, 4)), 4);
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpByTheStagesBehind) {
  // Stage 0 of 4: 3 warm-up forwards, then alternate, then drain.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 6)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  // The last stage has no warm-up: a backward follows every forward.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 3, 6)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(MaxInFlight(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 6)), 4);
  EXPECT_EQ(MaxInFlight(StageSchedule(PipelineSchedule::k1F1B, 4, 3, 6)), 1);
  // Fewer micro-batches than stages: warm-up is capped by them.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(MaxInFlight(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 2)), 2);
}

TEST(PipelineScheduleTest, OneStageIsGradientAccumulation) {
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 1, 0, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(MaxInFlight(StageSchedule(PipelineSchedule::k1F1B, 1, 0, 3)), 1);
}

// Virtual stage c * p + s is chunk c of stage s (pipeline.h).
struct Virtual {
  int stage, chunk;
};
Virtual Previous(Virtual v, int p) {
  return v.stage > 0 ? Virtual{v.stage - 1, v.chunk} : Virtual{p - 1, v.chunk - 1};
}
Virtual Next(Virtual v, int p) {
  return v.stage < p - 1 ? Virtual{v.stage + 1, v.chunk} : Virtual{0, v.chunk + 1};
}
bool IsFirst(Virtual v) { return v.stage == 0 && v.chunk == 0; }
bool IsLast(Virtual v, int p, int chunks) { return v.stage == p - 1 && v.chunk == chunks - 1; }

// Simulates p stages with blocking receives and buffered sends matched by tag (Gloo's): a
// forward needs the previous virtual stage's forward of that micro-batch, a backward the
// next one's backward. Every stage must finish (no deadlock), and the activation sets a
// stage holds per chunk (forwards done, backwards not yet) must never exceed MaxInFlight,
// where micro-batch i's set (i % MaxInFlight) must be free when its forward starts.
void ExpectRunsToCompletion(PipelineSchedule schedule, int p, int m, int chunks = 1) {
  std::vector<std::vector<PipeAction>> plans(p);
  for (int s = 0; s < p; ++s) plans[s] = StageSchedule(schedule, p, s, m, chunks);
  std::vector<size_t> next(p, 0);
  // [stage][chunk][micro-batch]
  using Done = std::vector<std::vector<std::vector<bool>>>;
  Done fwd_done(p, std::vector<std::vector<bool>>(chunks, std::vector<bool>(m))),
      bwd_done = fwd_done;
  auto fwd = [&](Virtual v, int i) { return static_cast<bool>(fwd_done[v.stage][v.chunk][i]); };
  auto bwd = [&](Virtual v, int i) { return static_cast<bool>(bwd_done[v.stage][v.chunk][i]); };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == plans[s].size()) continue;
      const PipeAction a = plans[s][next[s]];
      const Virtual here{s, a.chunk};
      const int i = a.micro_batch;
      const bool ready = a.kind == PipeAction::kForward
                             ? (IsFirst(here) || fwd(Previous(here, p), i))
                             : (IsLast(here, p, chunks) ? fwd(here, i) : bwd(Next(here, p), i));
      if (!ready) continue;
      if (a.kind == PipeAction::kForward) {
        const int sets = MaxInFlight(plans[s], a.chunk);
        int held = 0;
        for (int j = 0; j < m; ++j) held += fwd(here, j) && !bwd(here, j);
        ASSERT_LT(held, sets) << "stage " << s << " chunk " << a.chunk << " F" << i;
        for (int j = i % sets; j < i; j += sets) {
          ASSERT_TRUE(bwd(here, j)) << "stage " << s << " reuses the set of micro-batch " << j;
        }
        fwd_done[s][a.chunk][i] = true;
      } else {
        bwd_done[s][a.chunk][i] = true;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) EXPECT_EQ(next[s], plans[s].size()) << "stage " << s << " stuck";
}

// The same stages as the executor (parallel_gpt.cc) drives them over NCCL, whose sends and
// receives run in call order on one stream per communicator and meet as pairs: the n-th
// send from A to B completes together with B's n-th receive from A, once both are first
// on their streams (no tags, no buffering). Activations travel on one communicator,
// gradients on another, and the interleaved schedule's transfers between the last and the
// first stage on two more (process_groups.h: pp, pp_grad, pp_wrap, pp_grad_wrap; without
// `wrap_groups`, on pp and pp_grad). A stage's host blocks on its receives, and on a send
// still reading a buffer it is about to overwrite. Whether every stage finishes.
bool RunsToCompletionOnStreams(PipelineSchedule schedule, int p, int m, int chunks = 1,
                               bool wrap_groups = true) {
  struct Op {
    bool send;
    int peer;
    int64_t index;  // among this direction's ops between the pair
    bool done = false;
  };
  enum { kAct, kGrad, kActWrap, kGradWrap, kComms };
  // streams[comm][stage]: its ops in call order; head[comm][stage]: the first not done.
  std::vector<std::vector<std::vector<Op>>> streams(kComms, std::vector<std::vector<Op>>(p));
  std::vector<std::vector<size_t>> head(kComms, std::vector<size_t>(p, 0));
  // The communicator of a transfer from stage `from` to `to` (ParallelGpt's ActivationTo,
  // GradientTo).
  const bool wrap = wrap_groups && p > 1 && chunks > 1;
  auto comm_of = [&](bool activation, int from, int to) {
    if (activation) return wrap && from == p - 1 && to == 0 ? kActWrap : kAct;
    return wrap && from == 0 && to == p - 1 ? kGradWrap : kGrad;
  };
  std::map<std::tuple<int, int, int, bool>, int64_t> counts;  // (comm, from, to, send)
  auto post = [&](int comm, int stage, bool send, int peer) {
    const int from = send ? stage : peer, to = send ? peer : stage;
    const int64_t index = counts[{comm, from, to, send}]++;
    streams[comm][stage].push_back({send, peer, index});
    return std::pair{comm, streams[comm][stage].size() - 1};
  };
  std::vector<std::vector<PipeAction>> plans(p);
  std::vector<std::vector<int>> sets(p);
  for (int s = 0; s < p; ++s) {
    plans[s] = StageSchedule(schedule, p, s, m, chunks);
    for (int c = 0; c < chunks; ++c) sets[s].push_back(MaxInFlight(plans[s], c));
  }
  // Per stage: the next action, how far into it (0: not started, 1: its receive posted,
  // 2: received), the receive it waits on, and per activation set the sends still reading
  // its output (activations) and its input gradient (gradients). As the executor does, a
  // backward waits for its set's gradient send before receiving into that buffer, and a
  // forward for its set's activation send before computing over its output; a forward's
  // receive writes the input, which no send reads, and goes first.
  std::vector<size_t> next(p, 0);
  std::vector<int> phase(p, 0);
  std::vector<std::pair<int, size_t>> waiting(p);
  using Pending = std::map<std::pair<int, int>, std::vector<std::pair<int, size_t>>>;
  std::vector<Pending> act_sends(p), grad_sends(p);
  auto done = [&](int stage, std::pair<int, size_t> op) {
    return streams[op.first][stage][op.second].done;
  };
  auto pending = [&](int stage, Pending& sends, std::pair<int, int> set) {
    auto& ops = sends[set];
    std::erase_if(ops, [&](std::pair<int, size_t> op) { return done(stage, op); });
    return !ops.empty();
  };
  bool progress = true;
  while (progress) {
    progress = false;
    // Hosts: run each stage's actions as far as they go without waiting.
    for (int s = 0; s < p; ++s) {
      while (next[s] < plans[s].size()) {
        const PipeAction a = plans[s][next[s]];
        const Virtual here{s, a.chunk};
        const bool forward = a.kind == PipeAction::kForward;
        const std::pair<int, int> set{a.chunk, a.micro_batch % sets[s][a.chunk]};
        if (phase[s] == 0) {
          if (!forward && pending(s, grad_sends[s], set)) break;
          const bool receives = forward ? !IsFirst(here) : !IsLast(here, p, chunks);
          if (receives) {
            const Virtual from = forward ? Previous(here, p) : Next(here, p);
            waiting[s] = post(comm_of(forward, from.stage, s), s, false, from.stage);
            phase[s] = 1;
            progress = true;
          } else {
            phase[s] = 2;
          }
        }
        if (phase[s] == 1) {
          if (!done(s, waiting[s])) break;
          phase[s] = 2;
        }
        if (forward && pending(s, act_sends[s], set)) break;
        if (forward ? !IsLast(here, p, chunks) : !IsFirst(here)) {
          const Virtual to = forward ? Next(here, p) : Previous(here, p);
          (forward ? act_sends : grad_sends)[s][set].push_back(
              post(comm_of(forward, s, to.stage), s, true, to.stage));
        }
        phase[s] = 0;
        ++next[s];
        progress = true;
      }
    }
    // Streams: a send and its receive first on both streams complete together.
    for (int comm = 0; comm < kComms; ++comm) {
      for (int s = 0; s < p; ++s) {
        if (head[comm][s] == streams[comm][s].size()) continue;
        Op& op = streams[comm][s][head[comm][s]];
        if (!op.send) continue;
        const int r = op.peer;
        if (head[comm][r] == streams[comm][r].size()) continue;
        Op& other = streams[comm][r][head[comm][r]];
        if (other.send || other.peer != s || other.index != op.index) continue;
        op.done = other.done = true;
        ++head[comm][s];
        ++head[comm][r];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (next[s] != plans[s].size()) return false;
    for (int comm = 0; comm < kComms; ++comm) {
      if (head[comm][s] != streams[comm][s].size()) return false;
    }
  }
  return true;
}

TEST(PipelineScheduleTest, EveryScheduleCompletesWithinItsActivationSets) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
        ExpectRunsToCompletion(schedule, p, m);
        EXPECT_TRUE(RunsToCompletionOnStreams(schedule, p, m));
      }
    }
  }
  for (int p = 2; p <= 5; ++p) {
    for (int chunks = 2; chunks <= 4; ++chunks) {
      for (int m = p; m <= 4 * p; m += p) {
        SCOPED_TRACE("interleaved p=" + std::to_string(p) + " v=" + std::to_string(chunks) +
                     " m=" + std::to_string(m));
        ExpectRunsToCompletion(PipelineSchedule::kInterleaved, p, m, chunks);
        EXPECT_TRUE(RunsToCompletionOnStreams(PipelineSchedule::kInterleaved, p, m, chunks));
      }
    }
  }
}

// Why the ring's back edge has groups of its own: on pp and pp_grad alone, the last stage's
// send of an activation to the first stage waits behind, or in front of, the first stage's
// sends to it on the same stream, and both stages stop.
TEST(PipelineScheduleTest, InterleavedDeadlocksOnStreamsWithoutTheWrapGroups) {
  EXPECT_FALSE(RunsToCompletionOnStreams(PipelineSchedule::kInterleaved, 2, 2, 2,
                                         /*wrap_groups=*/false));
  EXPECT_FALSE(RunsToCompletionOnStreams(PipelineSchedule::kInterleaved, 3, 6, 2,
                                         /*wrap_groups=*/false));
  EXPECT_TRUE(RunsToCompletionOnStreams(PipelineSchedule::kInterleaved, 3, 6, 2));
}

// Two stages, two chunks, four micro-batches: virtual stages 0 and 2 on stage 0, 1 and 3 on
// stage 1. Stage 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, stage 1 with 2.
TEST(PipelineScheduleTest, InterleavedRunsGroupsOfStagesMicroBatchesPerChunk) {
  const auto s0 = StageSchedule(PipelineSchedule::kInterleaved, 2, 0, 4, 2);
  EXPECT_EQ(Render(s0, true),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::kInterleaved, 2, 1, 4, 2), true),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(MaxInFlight(s0, 0), 4);
  EXPECT_EQ(MaxInFlight(s0, 1), 2);
  // m == p: every forward first.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::kInterleaved, 2, 1, 2, 2), true),
            "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST(PipelineScheduleTest, ParsesTheSpecNames) {
  EXPECT_EQ(*ParsePipelineSchedule("gpipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::k1F1B);
  EXPECT_EQ(*ParsePipelineSchedule("interleaved"), PipelineSchedule::kInterleaved);
  EXPECT_EQ(ParsePipelineSchedule("zb").status().code(), StatusCode::kInvalidArgument);
}

// GPT-2 124M at T = 64: the head is about 5.4 layers of work, so pp2 balances at 9 + 3 (the
// split that measured fastest, tests/bench/README.md); a small vocabulary keeps the even
// split; four stages give the last one the fewest layers; one stage takes them all.
TEST(BalancedStageLayersTest, TheLastStageTakesFewerLayersForTheHead) {
  EXPECT_EQ(BalancedStageLayers(12, 768, 50257, 64, 2), (std::vector<int>{9, 3}));
  EXPECT_EQ(BalancedStageLayers(12, 768, 256, 64, 2), (std::vector<int>{6, 6}));
  EXPECT_EQ(BalancedStageLayers(24, 1024, 50257, 1024, 4), (std::vector<int>{7, 7, 7, 3}));
  EXPECT_EQ(BalancedStageLayers(4, 64, 50257, 64, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(BalancedStageLayers(12, 768, 50257, 64, 1), (std::vector<int>{12}));
}

}  // namespace
}  // namespace drover::engine::parallel
