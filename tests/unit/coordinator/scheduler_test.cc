#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

#include <set>

namespace drover::coordinator {
namespace {

NodeCapacity Node(const std::string& name, int free, v1::DeviceKind d = v1::CPU) {
  NodeCapacity n{name, d, {}};
  for (int i = 0; i < free; ++i) n.free_slots.push_back(i);
  return n;
}

PendingJob Job(const std::string& id, std::vector<int> sizes, int priority = 0, int64_t seq = 0) {
  return PendingJob{id, priority, seq, v1::CPU, std::move(sizes), {}};
}

std::map<v1::DeviceKind, int64_t> Ever(int64_t cpu) { return {{v1::CPU, cpu}, {v1::CUDA, 0}}; }

TEST(SchedulerTest, GangPlacesAllRanksOrNone) {
  auto r = Schedule({Job("a", {4})}, {Node("n1", 2), Node("n2", 1)}, Ever(8));
  EXPECT_TRUE(r.placements.empty());
  EXPECT_NE(r.waiting["a"].find("waiting for 4 free cpu slots (3 free)"), std::string::npos);
  r = Schedule({Job("a", {3})}, {Node("n1", 2), Node("n2", 1)}, Ever(8));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].ranks.size(), 3u);
}

TEST(SchedulerTest, FifoWithinPriorityAndHigherPriorityFirst) {
  // Two slots: the older of the two priority-0 jobs goes before the newer one, and the
  // priority-5 job goes before both although it was submitted last.
  auto r = Schedule({Job("old", {1}, 0, 1), Job("new", {1}, 0, 2), Job("urgent", {1}, 5, 3)},
                    {Node("n1", 2)}, Ever(2));
  ASSERT_EQ(r.placements.size(), 2u);
  EXPECT_EQ(r.placements[0].job_id, "urgent");
  EXPECT_EQ(r.placements[1].job_id, "old");
  EXPECT_TRUE(r.waiting.count("new"));
}

TEST(SchedulerTest, BlockedHeadJobIsNotOvertakenBySmallerOnes) {
  auto r = Schedule({Job("big", {4}, 0, 1), Job("small", {1}, 0, 2)}, {Node("n1", 2)}, Ever(4));
  EXPECT_TRUE(r.placements.empty());
  EXPECT_NE(r.waiting["small"].find("queued behind"), std::string::npos);
}

TEST(SchedulerTest, PacksRanksOntoFewestNodes) {
  // One node can hold the job: the tightest fit is used, not a spread.
  auto r = Schedule({Job("a", {2})}, {Node("n1", 1), Node("n2", 4), Node("n3", 2)}, Ever(7));
  ASSERT_EQ(r.placements.size(), 1u);
  for (const auto& rank : r.placements[0].ranks) EXPECT_EQ(rank.node(), "n3");
  // No single node fits: the biggest nodes first (2 nodes, not 3).
  r = Schedule({Job("b", {5})}, {Node("n1", 1), Node("n2", 4), Node("n3", 2)}, Ever(7));
  ASSERT_EQ(r.placements.size(), 1u);
  std::set<std::string> used;
  for (const auto& rank : r.placements[0].ranks) used.insert(rank.node());
  EXPECT_EQ(used, (std::set<std::string>{"n2", "n3"}));
  // Ranks are numbered in order and local ranks count per node.
  const auto& ranks = r.placements[0].ranks;
  for (size_t i = 0; i < ranks.size(); ++i) EXPECT_EQ(ranks[i].rank(), static_cast<int>(i));
  EXPECT_EQ(ranks[3].local_rank(), 3);
  EXPECT_EQ(ranks[4].local_rank(), 0);
}

// Spanning nodes, a block of ranks that talk every layer (a tp group, a hybrid shard
// group) stays on one node where the free slots allow: nodes of 3 free slots each take one
// block of 2 each, rather than ranks 0-2 and 3 (which would split the block {2, 3}); the
// ranks of a block that fits no node whole fill what is left.
TEST(SchedulerTest, BlocksOfRanksThatTalkTheMostStayOnOneNode) {
  PendingJob job = Job("tp2", {4});
  job.rank_block = 2;
  auto r = Schedule({job}, {Node("n1", 3), Node("n2", 3)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  const auto& ranks = r.placements[0].ranks;
  ASSERT_EQ(ranks.size(), 4u);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(ranks[2 * b].node(), ranks[2 * b + 1].node()) << "block " << b << " split";
  }
  EXPECT_NE(ranks[0].node(), ranks[2].node());
  for (size_t i = 0; i < ranks.size(); ++i) EXPECT_EQ(ranks[i].rank(), static_cast<int>(i));
  // Without blocks, the biggest node first, rank by rank.
  r = Schedule({Job("plain", {4})}, {Node("n1", 3), Node("n2", 3)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].ranks[2].node(), r.placements[0].ranks[0].node());
  // Blocks of 4 on nodes of 3, 3 and 2 free slots: no node holds one whole, so the ranks
  // fill the slots as they come, every slot used once.
  job.rank_block = 4;
  job.feasible_world_sizes = {8};
  r = Schedule({job}, {Node("n1", 3), Node("n2", 3), Node("n3", 2)}, Ever(8));
  ASSERT_EQ(r.placements.size(), 1u);
  std::set<std::pair<std::string, int>> slots;
  for (const auto& rank : r.placements[0].ranks) slots.insert({rank.node(), rank.slot()});
  EXPECT_EQ(slots.size(), 8u);
  // Blocks of 2 on nodes of 5 and 3: two blocks on the first, one on the second, and the
  // last block fits nowhere whole: its two ranks take n1's last slot and n2's.
  job.rank_block = 2;
  r = Schedule({job}, {Node("n1", 5), Node("n2", 3)}, Ever(8));
  ASSERT_EQ(r.placements.size(), 1u);
  const auto& packed = r.placements[0].ranks;
  for (int rank : {0, 1, 2, 3}) EXPECT_EQ(packed[rank].node(), "n1") << rank;
  for (int rank : {4, 5}) EXPECT_EQ(packed[rank].node(), "n2") << rank;
  EXPECT_NE(packed[6].node(), packed[7].node());
}

// Whether every block of `block` consecutive ranks sits on one node.
bool BlocksWhole(const std::vector<v1::RankAssignment>& ranks, int block) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].node() != ranks[r - r % block].node()) return false;
  }
  return true;
}

TEST(SchedulerTest, AJobInBlocksRunsSmallerRatherThanSplitABlockAcrossNodes) {
  // tp2 on two nodes of 3 free slots: at 6 ranks the third block would span both nodes; at
  // 4 both blocks are whole, and the job says why it got fewer ranks than fit.
  PendingJob job = Job("tp2", {2, 4, 6});
  job.rank_block = 2;
  auto r = Schedule({job}, {Node("n1", 3), Node("n2", 3)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 4);
  EXPECT_TRUE(BlocksWhole(r.placements[0].ranks, 2));
  EXPECT_EQ(r.placements[0].note,
            "placed at 4 ranks, not the 6 that fit: at 6, a block of 2 ranks (parallel.tp x "
            "dp_shard) would span nodes");
  EXPECT_EQ(r.free_left[v1::CPU], 2);
  // Where the free slots hold every block whole at the largest size, nothing is given up.
  r = Schedule({job}, {Node("n1", 4), Node("n2", 2)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 6);
  EXPECT_TRUE(BlocksWhole(r.placements[0].ranks, 2));
  EXPECT_EQ(r.placements[0].note, "");
  // Whole blocks cost at most half the ranks: one whole block (2 ranks) of the 10 that fit
  // is not worth it, and the job runs at 10 with its blocks across nodes.
  job.feasible_world_sizes = {2, 4, 6, 8, 10};
  std::vector<NodeCapacity> scattered = {Node("n0", 2)};
  for (int i = 1; i <= 8; ++i) scattered.push_back(Node("n" + std::to_string(i), 1));
  r = Schedule({job}, scattered, Ever(10));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 10);
  EXPECT_EQ(r.placements[0].note, "");
  // A job without blocks takes every slot that fits.
  r = Schedule({Job("plain", {2, 4, 6})}, {Node("n1", 3), Node("n2", 3)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 6);
}

TEST(SchedulerTest, AvoidedNodesAreUsedWhenTheOthersWouldSplitABlock) {
  // The job failed on n2. Without n2 its 4 ranks fit in count (n1's 2 and two single
  // slots) but one block would span nodes; with n2 both blocks are whole.
  PendingJob job = Job("tp2", {4});
  job.rank_block = 2;
  job.avoid_nodes = {"n2"};
  auto r = Schedule({job}, {Node("n1", 2), Node("n2", 2), Node("n3", 1), Node("n4", 1)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_TRUE(BlocksWhole(r.placements[0].ranks, 2));
  std::set<std::string> used;
  for (const auto& rank : r.placements[0].ranks) used.insert(rank.node());
  EXPECT_EQ(used, (std::set<std::string>{"n1", "n2"}));
  // With a third node of 2, it keeps away from n2 and its blocks whole.
  r = Schedule({job}, {Node("n1", 2), Node("n2", 2), Node("n3", 2)}, Ever(6));
  ASSERT_EQ(r.placements.size(), 1u);
  for (const auto& rank : r.placements[0].ranks) EXPECT_NE(rank.node(), "n2");
}

TEST(SchedulerTest, ElasticTakesLargestFeasibleSizeThatFits) {
  // Feasible {1,2,3,4,6}; 5 free slots -> 4 (5 is not a feasible size).
  auto r = Schedule({Job("a", {1, 2, 3, 4, 6})}, {Node("n1", 3), Node("n2", 2)}, Ever(8));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 4);
  // Shrink: only 2 free now.
  r = Schedule({Job("a", {1, 2, 3, 4, 6})}, {Node("n1", 2)}, Ever(8));
  EXPECT_EQ(r.placements[0].world_size, 2);
  // Grow: 6 free.
  r = Schedule({Job("a", {1, 2, 3, 4, 6})}, {Node("n1", 6)}, Ever(8));
  EXPECT_EQ(r.placements[0].world_size, 6);
}

TEST(SchedulerTest, NeverFittingJobGetsReasonAndDoesNotBlockOthers) {
  auto r = Schedule({Job("huge", {16}, 0, 1), Job("small", {1}, 0, 2)}, {Node("n1", 4)}, Ever(4));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].job_id, "small");
  EXPECT_NE(r.waiting["huge"].find("needs at least 16 cpu slots, the cluster has registered 4"),
            std::string::npos);
}

TEST(SchedulerTest, DeviceKindsAreSeparatePools) {
  PendingJob gpu{"g", 0, 1, v1::CUDA, {2}, {}};
  auto r = Schedule({gpu, Job("c", {1}, 0, 2)}, {Node("cpu1", 4), Node("gpu1", 1, v1::CUDA)},
                    {{v1::CPU, 4}, {v1::CUDA, 4}});
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].job_id, "c");  // the waiting cuda job blocks only cuda jobs
  EXPECT_TRUE(r.waiting.count("g"));
}

TEST(SchedulerTest, AvoidedNodesAreUsedOnlyWhenTheGangFitsNowhereElse) {
  auto placed_on = [](const ScheduleResult& r) {
    std::set<std::string> nodes;
    for (const auto& rank : r.placements.at(0).ranks) nodes.insert(rank.node());
    return nodes;
  };
  PendingJob job = Job("a", {2});
  // Without a preference the first best fit (n1) takes it.
  auto r = Schedule({job}, {Node("n1", 2), Node("n2", 2)}, Ever(4));
  EXPECT_EQ(placed_on(r), std::set<std::string>{"n1"});
  job.avoid_nodes = {"n1"};
  r = Schedule({job}, {Node("n1", 2), Node("n2", 2)}, Ever(4));
  EXPECT_EQ(placed_on(r), std::set<std::string>{"n2"});
  // Spread over two other nodes rather than packed onto the avoided one.
  r = Schedule({job}, {Node("n1", 2), Node("n2", 1), Node("n3", 1)}, Ever(4));
  EXPECT_EQ(placed_on(r), (std::set<std::string>{"n2", "n3"}));
  // Nowhere else: the avoided node rather than no placement.
  job.avoid_nodes = {"n1", "n2"};
  r = Schedule({job}, {Node("n1", 2), Node("n2", 2)}, Ever(4));
  EXPECT_EQ(placed_on(r), std::set<std::string>{"n1"});
  // Never shrunk to avoid a node: the size that fits all free slots, on all of them.
  PendingJob elastic = Job("e", {1, 2, 4});
  elastic.avoid_nodes = {"n1"};
  r = Schedule({elastic}, {Node("n1", 2), Node("n2", 2)}, Ever(4));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 4);
}

// A job whose attempt just failed waits for the slots its stopped trainers still hold when
// they would make it larger, in its place in the queue; not when they would not.
TEST(SchedulerTest, ARegroupingJobWaitsForItsStoppedTrainersSlotsWhenTheyMakeItLarger) {
  PendingJob failed = Job("failed", {2, 3}, 0, 1);
  failed.regrouping = true;
  failed.held_slots = 1;  // one survivor still exiting; two slots free
  auto r = Schedule({failed, Job("behind", {1}, 0, 2)}, {Node("n2", 1), Node("n3", 1)}, Ever(3));
  EXPECT_TRUE(r.placements.empty()) << "placed at 2 ranks, to grow back to 3 at once";
  EXPECT_EQ(r.waiting["failed"],
            "waiting for the 1 cpu slot its stopped trainers still hold (2 free now), to restart "
            "at 3 ranks");
  EXPECT_NE(r.waiting["behind"].find("queued behind"), std::string::npos) << r.waiting["behind"];
  EXPECT_EQ(r.blocked.at(v1::CPU).job_id, "failed");
  // Its survivor exited: all three.
  failed.held_slots = 0;
  r = Schedule({failed}, {Node("n1", 1), Node("n2", 1), Node("n3", 1)}, Ever(3));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 3);
  // The held slots would not make it larger (it already gets its largest size, or no
  // feasible size lies between): placed at once.
  failed.held_slots = 2;
  r = Schedule({failed}, {Node("n1", 3)}, Ever(5));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 3);
  PendingJob even = Job("even", {2, 4}, 0, 1);
  even.regrouping = true;
  even.held_slots = 1;
  r = Schedule({even}, {Node("n1", 2)}, Ever(4));
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.placements[0].world_size, 2);
}

TEST(PlanGrowthTest, GrowsIntoWhatThePendingJobsLeftInPriorityOrder) {
  ScheduleResult left;
  left.free_left = {{v1::CPU, 3}, {v1::CUDA, 4}};
  std::vector<RunningJob> running = {
      {"late", 0, 5, v1::CPU, 2, {1, 2, 3, 4}},
      {"early", 0, 1, v1::CPU, 1, {1, 2, 4}},
      {"urgent", 5, 9, v1::CPU, 4, {4, 8}},
      {"gpu", 0, 2, v1::CUDA, 2, {2, 4, 6, 8}},
  };
  auto plan = PlanGrowth(running, left);
  EXPECT_EQ(plan["urgent"], 0);  // 4 more do not fit
  EXPECT_EQ(plan["early"], 4);   // takes 3, the largest feasible size that fits
  EXPECT_EQ(plan["late"], 0);    // nothing left
  EXPECT_EQ(plan["gpu"], 6);
}

v1::RankAssignment Rank(int rank, const std::string& node, int slot) {
  v1::RankAssignment r;
  r.set_rank(rank);
  r.set_node(node);
  r.set_slot(slot);
  return r;
}

TEST(PlanGrowthTest, AJobInBlocksGrowsOnlyToASizeThatKeepsThemWhole) {
  // tp2 at 4 ranks, one block on each of n1 and n2; one slot free on each of n3 and n4.
  RunningJob job{"tp2", 0,
                 1,     v1::CPU,
                 4,     {2, 4, 6, 8},
                 2,     {Rank(0, "n1", 0), Rank(1, "n1", 1), Rank(2, "n2", 0), Rank(3, "n2", 1)}};
  ScheduleResult left;
  left.free_left = {{v1::CPU, 2}};
  left.nodes_left = {Node("n3", 1), Node("n4", 1)};
  EXPECT_EQ(PlanGrowth({job}, left)["tp2"], 0) << "growing to 6 would split its third block";
  // Without blocks the same job grows into them.
  RunningJob plain = job;
  plain.rank_block = 1;
  EXPECT_EQ(PlanGrowth({plain}, left)["tp2"], 6);
  // Two free slots on one node: a whole block.
  left.nodes_left = {Node("n3", 2)};
  EXPECT_EQ(PlanGrowth({job}, left)["tp2"], 6);
  // Four free slots in count, three whole blocks with its own: 6, not 8.
  left.free_left = {{v1::CPU, 4}};
  left.nodes_left = {Node("n3", 2), Node("n4", 1), Node("n5", 1)};
  EXPECT_EQ(PlanGrowth({job}, left)["tp2"], 6);
  // The slots one job grows into are not offered to the next: n3's block goes to the first.
  RunningJob second = job;
  second.job_id = "second";
  second.submit_seq = 2;
  second.ranks = {Rank(0, "n6", 0), Rank(1, "n6", 1), Rank(2, "n7", 0), Rank(3, "n7", 1)};
  left.free_left = {{v1::CPU, 4}};
  left.nodes_left = {Node("n3", 2), Node("n4", 1), Node("n5", 1)};
  auto plan = PlanGrowth({job, second}, left);
  EXPECT_EQ(plan["tp2"], 6);
  EXPECT_EQ(plan["second"], 0);
}

TEST(PlanGrowthTest, NoGrowthWhereAPendingJobWaitsForSlots) {
  ScheduleResult result =
      Schedule({{"big", 0, 1, v1::CPU, {8}, {}}}, {{"n1", v1::CPU, {0, 1, 2}}}, {{v1::CPU, 16}});
  ASSERT_TRUE(result.placements.empty());
  EXPECT_EQ(result.free_left[v1::CPU], 3);
  EXPECT_TRUE(result.blocked.count(v1::CPU));
  auto plan = PlanGrowth({{"small", 0, 0, v1::CPU, 1, {1, 2}}}, result);
  EXPECT_EQ(plan["small"], 0);
  // A job that can never fit does not hold the others back.
  result =
      Schedule({{"huge", 0, 1, v1::CPU, {64}, {}}}, {{"n1", v1::CPU, {0, 1, 2}}}, {{v1::CPU, 16}});
  EXPECT_FALSE(result.blocked.count(v1::CPU));
  EXPECT_EQ(PlanGrowth({{"small", 0, 0, v1::CPU, 1, {1, 2}}}, result)["small"], 2);
}

TEST(ScheduleTest, TheJobBlockingEachDeviceIsNamed) {
  ScheduleResult r = Schedule({{"small", 0, 1, v1::CPU, {1}, {}},
                               {"big", 3, 2, v1::CPU, {4, 8}, {}},
                               {"later", 0, 3, v1::CPU, {1}, {}}},
                              {{"n1", v1::CPU, {0, 1}}}, {{v1::CPU, 16}});
  ASSERT_EQ(r.blocked.size(), 1u);
  EXPECT_EQ(r.blocked[v1::CPU].job_id, "big");
  EXPECT_EQ(r.blocked[v1::CPU].priority, 3);
  EXPECT_EQ(r.blocked[v1::CPU].min_size, 4);
  EXPECT_TRUE(r.placements.empty());  // both others queue behind it
}

// A pending job with `left_ms` of its time limit left (0: no limit).
PendingJob Timed(const std::string& id, std::vector<int> sizes, int64_t left_ms, int64_t seq) {
  PendingJob j = Job(id, std::move(sizes), 0, seq);
  j.time_left_ms = left_ms;
  return j;
}

constexpr int64_t kMinute = 60'000;

// "big" needs 4 slots; 2 are free and a running job gives its 2 back within 30 minutes (its
// time limit): big's reservation is in 30 minutes, with no slot to spare then. Behind it, a
// job whose limit ends in 20 minutes starts now; one of 40 minutes, or without a limit,
// would hold slots big needs at 30 minutes, and waits.
TEST(BackfillTest, AJobThatEndsBeforeTheBlockedOneCanStartRunsOnTheFreeSlots) {
  const std::vector<PendingJob> jobs = {Job("big", {4}, 0, 1),
                                        Timed("long", {2}, 40 * kMinute, 2),
                                        Timed("open", {1}, 0, 3),
                                        Timed("short", {1, 2}, 20 * kMinute, 4),
                                        Timed("after", {1}, 10 * kMinute, 5),
                                        Timed("huge", {8}, kMinute, 6)};  // never fits
  ScheduleResult r = Schedule(jobs, {Node("n1", 2)}, Ever(4));
  ASSERT_TRUE(r.placements.empty());
  ASSERT_EQ(r.blocked[v1::CPU].job_id, "big");
  const std::vector<SlotRelease> running = {{v1::CPU, 2, 30 * kMinute}};
  std::vector<Placement> placed = Backfill(jobs, running, {}, &r);
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, "short");
  EXPECT_EQ(placed[0].world_size, 2);  // its largest size that fits: the free slots are its
  EXPECT_NE(placed[0].note.find("started before big, which waits for slots, by backfill: its "
                                "time limit ends before that job can start"),
            std::string::npos)
      << placed[0].note;
  ASSERT_EQ(r.placements.size(), 1u);
  EXPECT_EQ(r.free_left[v1::CPU], 0);
  EXPECT_FALSE(r.waiting.count("short"));
  EXPECT_NE(r.waiting["long"].find("queued behind an earlier cpu job (big can start within "
                                   "30m00s for certain; a job whose time limit ends by then "
                                   "starts before it)"),
            std::string::npos)
      << r.waiting["long"];
  EXPECT_TRUE(r.waiting.count("open"));
  EXPECT_TRUE(r.waiting.count("after"));  // it would fit its limit: no slot is left
  EXPECT_EQ(r.waiting["huge"].find("can start within"), std::string::npos) << r.waiting["huge"];
  EXPECT_NE(r.waiting["huge"].find("can never fit"), std::string::npos) << r.waiting["huge"];
  EXPECT_TRUE(r.waiting.count("big"));
}

// 3 free, and 2 back within 30 minutes: big (4) can start then with 1 slot to spare. A job
// of any length (even without a limit) takes that one; the next finds none to spare. Slots
// back at the same moment count together, and a job that ends first takes no spare slot.
TEST(BackfillTest, SlotsTheBlockedJobWillNotNeedGoToJobsOfAnyLength) {
  std::vector<PendingJob> jobs = {Job("big", {4}, 0, 1), Timed("open1", {1}, 0, 2),
                                  Timed("open2", {1}, 0, 3)};
  ScheduleResult r = Schedule(jobs, {Node("n1", 3)}, Ever(5));
  std::vector<Placement> placed =
      Backfill(jobs, {{v1::CPU, 1, 30 * kMinute}, {v1::CPU, 1, 30 * kMinute}}, {}, &r);
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, "open1");
  EXPECT_NE(placed[0].note.find("on slots that job will not need when it starts"),
            std::string::npos);
  EXPECT_TRUE(r.waiting.count("open2"));

  jobs = {Job("big", {4}, 0, 1), Timed("short", {1}, 5 * kMinute, 2), Timed("open", {1}, 0, 3)};
  r = Schedule(jobs, {Node("n1", 3)}, Ever(5));
  placed = Backfill(jobs, {{v1::CPU, 2, 30 * kMinute}}, {}, &r);
  ASSERT_EQ(placed.size(), 2u);  // short ends first, so open still has the spare slot
  EXPECT_EQ(placed[0].job_id, "short");
  EXPECT_EQ(placed[1].job_id, "open");
}

// No backfill where the blocked job's start cannot be bounded (the slots it needs are held by
// jobs without time limits), where it regroups (its slots are back within seconds), or where
// lower-priority jobs are making room for it (PlanPreemption).
TEST(BackfillTest, NothingStartsAheadWithoutAReservationWhileRegroupingOrWhilePreempting) {
  const std::vector<PendingJob> jobs = {Job("big", {4}, 0, 1), Timed("short", {1}, 1 * kMinute, 2)};
  ScheduleResult r = Schedule(jobs, {Node("n1", 2)}, Ever(4));
  EXPECT_TRUE(Backfill(jobs, {}, {}, &r).empty());                              // no limits
  EXPECT_TRUE(Backfill(jobs, {{v1::CPU, 1, kMinute}}, {}, &r).empty());         // not enough
  EXPECT_TRUE(Backfill(jobs, {{v1::CPU, 2, kMinute}}, {v1::CPU}, &r).empty());  // preempting
  EXPECT_TRUE(Backfill(jobs, {{v1::CUDA, 2, kMinute}}, {}, &r).empty());        // another device
  std::vector<PendingJob> regrouping = jobs;
  regrouping[0].regrouping = true;
  regrouping[0].held_slots = 2;
  ScheduleResult rr = Schedule(regrouping, {Node("n1", 2)}, Ever(4));
  ASSERT_TRUE(rr.blocked[v1::CPU].regrouping);
  EXPECT_TRUE(Backfill(regrouping, {{v1::CPU, 2, kMinute}}, {}, &rr).empty());
  // With a reservation it does start: the cases above are what held it back.
  EXPECT_EQ(Backfill(jobs, {{v1::CPU, 2, 2 * kMinute}}, {}, &r).size(), 1u);
}

// Jobs placed in the same pass before the blocked one give their slots back by their own
// limits: here the only slots the blocked job can get.
TEST(BackfillTest, ThisPassesPlacementsCountByTheirLimits) {
  const std::vector<PendingJob> jobs = {Timed("first", {2}, 30 * kMinute, 1), Job("big", {4}, 0, 2),
                                        Timed("short", {2}, kMinute, 3)};
  ScheduleResult r = Schedule(jobs, {Node("n1", 4)}, Ever(4));
  ASSERT_EQ(r.placements.size(), 1u);
  ASSERT_EQ(r.blocked[v1::CPU].job_id, "big");
  std::vector<Placement> placed = Backfill(jobs, {}, {}, &r);
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, "short");
}

ScheduleResult BlockedBy(const std::string& job, int priority, int min_size, int64_t free) {
  ScheduleResult r;
  r.free_left = {{v1::CPU, free}, {v1::CUDA, 0}};
  r.blocked[v1::CPU] = {job, priority, min_size};
  return r;
}

TEST(PlanPreemptionTest, ShrinksTheLowestPriorityLatestJobsFirstAndAsLittleAsNeeded) {
  std::vector<RunningJob> running = {
      {"old-low", 0, 1, v1::CPU, 4, {2, 3, 4}},
      {"new-low", 0, 2, v1::CPU, 2, {1, 2}},
      {"mid", 3, 0, v1::CPU, 4, {1, 2, 3, 4}},
      {"peer", 5, 0, v1::CPU, 4, {1, 2, 3, 4}},  // the same priority: never preempted
      {"gpu", 0, 3, v1::CUDA, 4, {1, 2, 3, 4}},  // another device
  };
  auto plan = PlanPreemption(running, BlockedBy("high", 5, 3, 1), {});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan["new-low"].world_size, 1);  // the latest of the lowest: to its smallest
  EXPECT_EQ(plan["old-low"].world_size, 3);  // then one more rank is all that is missing
  EXPECT_EQ(plan["old-low"].for_job.job_id, "high");
  EXPECT_EQ(plan["old-low"].for_job.priority, 5);
}

TEST(PlanPreemptionTest, WholeJobsYieldOnlyWhenShrinkingIsNotEnough) {
  // Neither can shrink: the latest submitted yields, the other runs on.
  auto plan = PlanPreemption({{"a", 0, 1, v1::CPU, 2, {2}}, {"b", 0, 2, v1::CPU, 2, {2}}},
                             BlockedBy("high", 1, 2, 0), {});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan["b"].world_size, 0);
  // Shrinking b to 2 gives 1 of the 4 needed: b and then a yield everything.
  plan = PlanPreemption({{"a", 0, 1, v1::CPU, 2, {2}}, {"b", 0, 2, v1::CPU, 3, {2, 3}}},
                        BlockedBy("high", 1, 4, 0), {});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan["a"].world_size, 0);
  EXPECT_EQ(plan["b"].world_size, 0);
}

TEST(PlanPreemptionTest, NothingIsPreemptedThatWouldNotMakeRoomOrForSlotsComingBack) {
  const std::vector<RunningJob> low = {{"low", 0, 1, v1::CPU, 4, {1, 2, 3, 4}}};
  // 1 free + all 4 of low's is still short of 8.
  EXPECT_TRUE(PlanPreemption(low, BlockedBy("high", 5, 8, 1), {}).empty());
  // 1 free and 2 held by the trainers of an ended attempt make the 3 it needs.
  EXPECT_TRUE(PlanPreemption(low, BlockedBy("high", 5, 3, 1), {{v1::CPU, 2}}).empty());
  EXPECT_EQ(PlanPreemption(low, BlockedBy("high", 5, 3, 1), {{v1::CPU, 1}})["low"].world_size, 3);
  // No job waits: nothing to do.
  ScheduleResult idle;
  idle.free_left = {{v1::CPU, 0}};
  EXPECT_TRUE(PlanPreemption(low, idle, {}).empty());
}

}  // namespace
}  // namespace drover::coordinator
