#include "coordinator/node_manager.h"

#include <gtest/gtest.h>

#include "tests/unit/coordinator/test_util.h"

namespace drover::coordinator {
namespace {

using testing::RegisterReq;

TEST(NodeManagerTest, RegisterThenAcceptsOnlyCurrentAgent) {
  FakeClock clock;
  NodeManager nodes(&clock, {});
  auto rec = nodes.Register(RegisterReq("n1", 4, "a1"));
  EXPECT_EQ(rec.state(), v1::NODE_ALIVE);
  EXPECT_TRUE(nodes.Accepts("n1", "a1"));
  EXPECT_FALSE(nodes.Accepts("n1", "a0"));
  EXPECT_FALSE(nodes.Accepts("n2", "a1"));
  EXPECT_TRUE(nodes.Schedulable("n1"));
  EXPECT_EQ(nodes.TotalSlotsEver(v1::CPU), 4);
}

TEST(NodeManagerTest, ARequestSentBeforeOneAlreadyTakenIsStale) {
  FakeClock clock;
  NodeManager nodes(&clock, {});
  v1::RegisterRequest reg = RegisterReq("n1", 1, "a1");
  reg.set_seq(1);
  nodes.Register(reg);
  EXPECT_TRUE(nodes.Stale("n1", "a1", 1));
  EXPECT_FALSE(nodes.Stale("n1", "a1", 2));
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  hb.set_seq(5);
  nodes.OnHeartbeat(hb);
  EXPECT_TRUE(nodes.Stale("n1", "a1", 3));
  EXPECT_TRUE(nodes.Stale("n1", "a1", 5));
  EXPECT_FALSE(nodes.Stale("n1", "a1", 6));
  // Unordered (no seq), another agent's, an unknown node's: never stale.
  EXPECT_FALSE(nodes.Stale("n1", "a1", 0));
  EXPECT_FALSE(nodes.Stale("n1", "a2", 1));
  EXPECT_FALSE(nodes.Stale("n2", "a1", 1));
  // A restarted agent counts from 1 again.
  v1::RegisterRequest restarted = RegisterReq("n1", 1, "a2");
  restarted.set_seq(1);
  nodes.Register(restarted);
  EXPECT_FALSE(nodes.Stale("n1", "a2", 2));
  EXPECT_TRUE(nodes.Stale("n1", "a2", 1));
}

// An agent that is stopping drains its trainers and says so in its heartbeats: nothing new
// is placed on its node, whose leaving then counts no failure (however often it is done, the
// node is never cordoned for it); its next agent's Register makes it schedulable again.
TEST(NodeManagerTest, ADrainingNodeTakesNoNewWorkUntilItsAgentRegistersAgain) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 1});
  nodes.Register(RegisterReq("n1", 2, "a1"));
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  hb.set_draining(true);
  nodes.OnHeartbeat(hb);
  EXPECT_FALSE(nodes.Schedulable("n1"));
  int listed = 0;
  nodes.ForEach([&](const std::string&, const v1::NodeRecord& r, bool schedulable) {
    EXPECT_FALSE(schedulable);
    EXPECT_EQ(r.state(), v1::NODE_ALIVE);
    EXPECT_EQ(r.failures(), 0);
    ++listed;
  });
  EXPECT_EQ(listed, 1);
  for (int i = 0; i < 3; ++i) {
    auto left = nodes.MarkDead("n1");
    ASSERT_TRUE(left.has_value());
    EXPECT_EQ(left->state(), v1::NODE_DEAD);
    EXPECT_EQ(left->failures(), 0);
    EXPECT_EQ(left->cordon_until_ms(), 0);
    nodes.Register(RegisterReq("n1", 2, std::string("a").append(std::to_string(i + 2))));
    EXPECT_TRUE(nodes.Schedulable("n1"));
    nodes.OnHeartbeat(hb);
  }
  // Dead without a drain: a failure, and with cordon_after_failures 1 a cordon.
  nodes.Register(RegisterReq("n1", 2, "a9"));
  auto died = nodes.MarkDead("n1");
  ASSERT_TRUE(died.has_value());
  EXPECT_EQ(died->failures(), 1);
  EXPECT_GT(died->cordon_until_ms(), 0);
}

// drover cordon: the node takes no new work, whatever its agent does (dies, comes back,
// registers again), whatever its failure cordons do (one ends, it stays out), and across a
// coordinator restart (the record is what is persisted), until an operator's uncordon.
TEST(NodeManagerTest, AnOperatorsCordonLastsUntilUncordonedThroughDeathsAndCoolDowns) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 1});
  nodes.Register(RegisterReq("n1", 2, "a1"));
  auto plan = nodes.PlanCordon("n1", /*drain=*/false, "cordoned by ops@h: new NIC");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->was_cordoned);
  EXPECT_TRUE(nodes.Schedulable("n1")) << "nothing changes before it is applied";
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_FALSE(nodes.Schedulable("n1"));
  EXPECT_EQ(nodes.Find("n1")->state(), v1::NODE_CORDONED);
  EXPECT_EQ(nodes.Find("n1")->operator_cordon(), "cordoned by ops@h: new NIC");
  EXPECT_EQ(nodes.Find("n1")->operator_cordon_ms(), clock.WallNowMs());
  EXPECT_FALSE(nodes.Find("n1")->drain());

  // Dies (a failure, and a cordon for it), comes back after that cordon: still out.
  ASSERT_TRUE(nodes.MarkDead("n1").has_value());
  EXPECT_EQ(nodes.Find("n1")->state(), v1::NODE_DEAD);
  clock.AdvanceMs(24 * 3'600'000LL);
  nodes.ExpireCordons();
  nodes.Register(RegisterReq("n1", 2, "a2"));
  EXPECT_EQ(nodes.Find("n1")->state(), v1::NODE_CORDONED);
  EXPECT_FALSE(nodes.Schedulable("n1"));
  auto cut = nodes.CordonCutOff("n1");
  ASSERT_TRUE(cut.has_value());
  clock.AdvanceMs(24 * 3'600'000LL);
  EXPECT_EQ(nodes.ExpireCordons().size(), 1u);  // the failure cordon ended, not the operator's
  EXPECT_EQ(nodes.Find("n1")->state(), v1::NODE_CORDONED);
  EXPECT_FALSE(nodes.Schedulable("n1"));

  // A coordinator restart restores it as written.
  NodeManager restarted(&clock, {});
  restarted.Restore(*nodes.Find("n1"));
  restarted.Register(RegisterReq("n1", 2, "a3"));
  EXPECT_FALSE(restarted.Schedulable("n1"));
  // A drain after the cordon keeps the cordon's time and adds the drain.
  clock.AdvanceMs(5000);
  auto drain = restarted.PlanCordon("n1", /*drain=*/true, "drained by ops@h");
  ASSERT_TRUE(drain.ok());
  EXPECT_TRUE(drain->was_cordoned);
  EXPECT_TRUE(drain->after.drain());
  EXPECT_EQ(drain->after.operator_cordon_ms(), nodes.Find("n1")->operator_cordon_ms());
  ASSERT_TRUE(restarted.ApplyPlan(*drain));

  auto back = restarted.PlanUncordon("n1", -1);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->was_cordoned);
  ASSERT_TRUE(restarted.ApplyPlan(*back));
  EXPECT_TRUE(restarted.Schedulable("n1"));
  EXPECT_EQ(restarted.Find("n1")->state(), v1::NODE_ALIVE);
  EXPECT_TRUE(restarted.Find("n1")->operator_cordon().empty());
  EXPECT_FALSE(restarted.Find("n1")->drain());
  EXPECT_EQ(restarted.PlanCordon("n2", true, "").status().code(), StatusCode::kNotFound);
}

// An operator's cordon is a decision, not a failure: it does not use up the share of nodes
// failure cordons may take (max_cordoned_share), or a failing node would stay in use because
// another was taken out for maintenance.
TEST(NodeManagerTest, AnOperatorsCordonLeavesTheFailureCordonCapAlone) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 1, .max_cordoned_share = 0.5});
  nodes.Register(RegisterReq("n1", 1, "a1"));
  nodes.Register(RegisterReq("n2", 1, "a2"));
  auto plan = nodes.PlanCordon("n1", /*drain=*/false, "cordoned by ops@h");
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  bool held_back = false;
  auto died = nodes.MarkDead("n2", &held_back);
  ASSERT_TRUE(died.has_value());
  EXPECT_FALSE(held_back);
  EXPECT_GT(died->cordon_until_ms(), clock.WallNowMs());
}

// Draining(): the node's trainers are leaving, for its agent's stop or an operator's drain
// while its agent lists one live; a drained node with nothing left on it is no longer
// draining, only cordoned.
TEST(NodeManagerTest, AnOperatorsDrainIsUnderWayWhileTheAgentListsALiveTrainer) {
  FakeClock clock;
  NodeManager nodes(&clock, {});
  nodes.Register(RegisterReq("n1", 1, "a1"));
  EXPECT_FALSE(nodes.Draining("n1"));
  auto plan = nodes.PlanCordon("n1", /*drain=*/true, "drained by ops@h");
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_FALSE(nodes.Draining("n1")) << "nothing runs there";
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  v1::TrainerStatus* t = hb.add_trainers();
  t->set_job_id("j");
  t->set_attempt(1);
  t->set_state(v1::TRAINER_STOPPING);
  nodes.OnHeartbeat(hb);
  EXPECT_TRUE(nodes.Draining("n1"));
  t->set_state(v1::TRAINER_EXITED);
  nodes.OnHeartbeat(hb);
  EXPECT_FALSE(nodes.Draining("n1"));
  EXPECT_FALSE(nodes.Schedulable("n1"));
  EXPECT_FALSE(nodes.Draining("n9"));
}

TEST(NodeManagerTest, ANodeCutOffFromItsPeersIsCordonedAtOnce) {
  FakeClock clock;
  NodeManager nodes(
      &clock, {.cordon_after_failures = 2, .cordon_base_ms = 30'000, .cordon_max_ms = 100'000});
  nodes.Register(RegisterReq("n1", 1));
  auto cut = nodes.CordonCutOff("n1");
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->state(), v1::NODE_CORDONED);
  EXPECT_EQ(cut->failures(), 1);
  EXPECT_EQ(cut->cordon_until_ms(), clock.WallNowMs() + 30'000);
  EXPECT_FALSE(nodes.Schedulable("n1"));
  clock.AdvanceMs(30'000);
  ASSERT_EQ(nodes.ExpireCordons().size(), 1u);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  // Again: the cool-down it has earned, never less than the base.
  nodes.CordonCutOff("n1");
  nodes.CordonCutOff("n1");
  EXPECT_EQ(nodes.Find("n1")->cordon_until_ms(), clock.WallNowMs() + 60'000);
  // Unknown and dead nodes are left alone.
  EXPECT_FALSE(nodes.CordonCutOff("n2").has_value());
  nodes.MarkDead("n1");
  EXPECT_FALSE(nodes.CordonCutOff("n1").has_value());
}

TEST(NodeManagerTest, ASlotWhoseGpuFailedIsCordonedAloneWithGrowingCoolDown) {
  FakeClock clock;
  NodeManager nodes(&clock, {.slot_cordon_base_ms = 300'000, .slot_cordon_max_ms = 1'000'000});
  nodes.Register(RegisterReq("n1", 2, "a1", v1::CUDA));
  auto rec = nodes.CordonSlot("n1", 1, "job j's rank 1: ECC");
  ASSERT_TRUE(rec.has_value());
  ASSERT_EQ(rec->slot_faults_size(), 1);
  EXPECT_EQ(rec->slot_faults(0).slot(), 1);
  EXPECT_EQ(rec->slot_faults(0).failures(), 1);
  EXPECT_EQ(rec->slot_faults(0).reason(), "job j's rank 1: ECC");
  EXPECT_EQ(rec->slot_faults(0).cordon_until_ms(), clock.WallNowMs() + 300'000);
  // The node works on; only that slot is out.
  EXPECT_EQ(rec->state(), v1::NODE_ALIVE);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  EXPECT_EQ(rec->failures(), 0);
  const int64_t now = clock.WallNowMs();
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, now));
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 0, now));
  // Its cordon ends on time, reported once; its failures stay.
  clock.AdvanceMs(299'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  clock.AdvanceMs(1);
  auto ended = nodes.ExpireCordons();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].slot_faults(0).cordon_until_ms(), 0);
  EXPECT_EQ(ended[0].slot_faults(0).failures(), 1);
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  // Each further failure doubles the cool-down, up to the cap.
  nodes.CordonSlot("n1", 1, "again");
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).cordon_until_ms(), clock.WallNowMs() + 600'000);
  nodes.CordonSlot("n1", 1, "and again");
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).cordon_until_ms(), clock.WallNowMs() + 1'000'000);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).failures(), 3);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).slow(), 0);
  // A straggler's slot: a cordon like the others, told apart.
  nodes.CordonSlot("n1", 1, "job j: straggler rank 1 on n1 slot 1", /*slow=*/true);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).failures(), 4);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).slow(), 1);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).reason(), "job j: straggler rank 1 on n1 slot 1");
  // A re-registration (a restarted agent) keeps it; a restored record's cordon ends on time.
  v1::NodeRecord again = nodes.Register(RegisterReq("n1", 2, "a2", v1::CUDA));
  ASSERT_EQ(again.slot_faults_size(), 1);
  EXPECT_TRUE(SlotOut(again, 1, clock.WallNowMs()));
  NodeManager restored(&clock, {});
  restored.Restore(again);
  clock.AdvanceMs(1'000'000);
  ASSERT_EQ(restored.ExpireCordons().size(), 1u);
  // Unknown nodes and slots are left alone.
  EXPECT_FALSE(nodes.CordonSlot("n2", 0, "x").has_value());
  EXPECT_FALSE(nodes.CordonSlot("n1", 2, "x").has_value());
}

TEST(NodeManagerTest, AnOperatorsCordonOfOneSlotLastsUntilThatSlotIsUncordoned) {
  FakeClock clock;
  NodeManager nodes(&clock, {.slot_cordon_base_ms = 300'000, .slot_failure_memory_ms = 600'000});
  nodes.Register(RegisterReq("n1", 4, "a1", v1::CUDA));
  auto plan = nodes.PlanCordon("n1", /*drain=*/false, "cordoned by ops@h: fan noise", 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  const int64_t at = clock.WallNowMs();
  ASSERT_EQ(nodes.Find("n1")->slot_faults_size(), 1);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).operator_cordon(), "cordoned by ops@h: fan noise");
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).operator_cordon_ms(), at);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).failures(), 0) << "an operator's word, no failure";
  // Only that slot is out; the node is in service.
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 2, at));
  for (int slot : {0, 1, 3}) EXPECT_FALSE(SlotOut(*nodes.Find("n1"), slot, at)) << slot;
  EXPECT_EQ(nodes.Find("n1")->state(), v1::NODE_ALIVE);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  // A failure of its GPU meanwhile, and its cool-down's end, leave the operator's cordon; so
  // do the slot failure memory, a restarted agent and a restarted coordinator.
  nodes.CordonSlot("n1", 2, "ECC");
  clock.AdvanceMs(10'000'000);
  nodes.ExpireCordons();
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 2, clock.WallNowMs()));
  nodes.Register(RegisterReq("n1", 4, "a2", v1::CUDA));
  NodeManager restored(&clock, {.slot_failure_memory_ms = 600'000});
  restored.Restore(*nodes.Find("n1"));
  clock.AdvanceMs(10'000'000);
  restored.ExpireCordons();
  EXPECT_TRUE(SlotOut(*restored.Find("n1"), 2, clock.WallNowMs()));
  // Cordoned again: the first one's time stays, the newest reason shows.
  plan = nodes.PlanCordon("n1", false, "cordoned by ops@h: still noisy", 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).operator_cordon_ms(), at);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).operator_cordon(), "cordoned by ops@h: still noisy");
  // Uncordoning another slot ends nothing; that slot's ends it.
  plan = nodes.PlanUncordon("n1", 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 2, clock.WallNowMs()));
  plan = nodes.PlanUncordon("n1", 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 2, clock.WallNowMs()));
  // A slot the node does not have, a node unknown: NotFound, naming them.
  auto bad = nodes.PlanCordon("n1", false, "x", 4);
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "node n1 has no slot 4 (it has 4)");
  EXPECT_EQ(nodes.PlanCordon("n9", false, "x", 0).status().code(), StatusCode::kNotFound);
}

TEST(NodeManagerTest, AnOperatorsUncordonEndsTheCordonsAndForgetsTheFailures) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 1, .slot_cordon_base_ms = 300'000});
  nodes.Register(RegisterReq("n1", 2, "a1", v1::CUDA));
  nodes.CordonSlot("n1", 0, "ECC");
  nodes.CordonSlot("n1", 1, "ECC");
  nodes.CordonSlot("n1", 1, "ECC again");
  // One slot: only its entry goes; nothing changes until the plan is applied.
  auto plan = nodes.PlanUncordon("n1", 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->was_cordoned);
  ASSERT_EQ(plan->after.slot_faults_size(), 1);
  EXPECT_EQ(plan->after.slot_faults(0).slot(), 0);
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 0, clock.WallNowMs()));
  // Its next failure starts from the base cool-down again.
  nodes.CordonSlot("n1", 1, "ECC once more");
  EXPECT_EQ(nodes.Find("n1")->slot_faults(1).cordon_until_ms(), clock.WallNowMs() + 300'000);
  EXPECT_EQ(nodes.Find("n1")->slot_faults(1).failures(), 1);

  // A plan made stale by a change under it (another failure) is not applied.
  plan = nodes.PlanUncordon("n1", -1);
  ASSERT_TRUE(plan.ok());
  nodes.CordonSlot("n1", 0, "while the write went on");
  EXPECT_FALSE(nodes.ApplyPlan(*plan));
  EXPECT_EQ(nodes.Find("n1")->slot_faults_size(), 2);
  // A heartbeat is no change.
  plan = nodes.PlanUncordon("n1", -1);
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  clock.AdvanceMs(1000);
  nodes.OnHeartbeat(hb);
  // The whole node: its own cordon and every slot's.
  nodes.CordonCutOff("n1");
  EXPECT_FALSE(nodes.ApplyPlan(*plan));
  plan = nodes.PlanUncordon("n1", -1);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  const v1::NodeRecord* r = nodes.Find("n1");
  EXPECT_EQ(r->state(), v1::NODE_ALIVE);
  EXPECT_EQ(r->failures(), 0);
  EXPECT_EQ(r->cordon_until_ms(), 0);
  EXPECT_EQ(r->slot_faults_size(), 0);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  // Again: nothing was cordoned. Unknown nodes and slots are named.
  plan = nodes.PlanUncordon("n1", -1);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->was_cordoned);
  EXPECT_EQ(nodes.PlanUncordon("n2", -1).status().code(), StatusCode::kNotFound);
  const Status no_slot = nodes.PlanUncordon("n1", 2).status();
  EXPECT_EQ(no_slot.code(), StatusCode::kNotFound);
  EXPECT_NE(no_slot.message().find("node n1 has no slot 2"), std::string::npos) << no_slot;
}

// What an agent's GPU health check reports: each slot's first report is handed back (for the
// coordinator to cordon it); the slot is out for as long as it is reported, however long ago
// its cordon ended, and back once it is not; an operator's uncordon of it is refused while
// it is reported, and a report of a slot the node lacks is dropped.
TEST(NodeManagerTest, ASlotItsAgentReportsUnfitIsOutUntilItIsReportedFitAgain) {
  FakeClock clock;
  NodeManager nodes(&clock, {.slot_cordon_base_ms = 300'000});
  nodes.Register(RegisterReq("n1", 2, "a1", v1::CUDA));
  google::protobuf::RepeatedPtrField<v1::SlotHealth> report;
  v1::SlotHealth* ecc = report.Add();
  ecc->set_slot(1);
  ecc->set_fault("GPU 0000:19:00.0: 1 uncorrectable ECC error");
  report.Add()->set_slot(7);  // no such slot
  bool changed = false;
  std::vector<v1::SlotHealth> first = nodes.TakeHealth("n1", report, &changed);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].slot(), 1);
  EXPECT_TRUE(changed);
  EXPECT_EQ(nodes.Find("n1")->unhealthy_slots_size(), 1);
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 0, clock.WallNowMs()));
  EXPECT_TRUE(nodes.Schedulable("n1"));  // the node works on
  // Reported again: not a first report, no change.
  EXPECT_TRUE(nodes.TakeHealth("n1", report, &changed).empty());
  EXPECT_FALSE(changed);
  // Its cordon (the coordinator's, at the first report) ends; the slot stays out.
  nodes.CordonSlot("n1", 1, "health check");
  clock.AdvanceMs(300'000);
  nodes.ExpireCordons();
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  const Status refused = nodes.PlanUncordon("n1", 1).status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("node n1 slot 1 stays out of use while its agent's health "
                                   "check reports its GPU unfit (GPU 0000:19:00.0: 1 "
                                   "uncorrectable ECC error)"),
            std::string::npos)
      << refused;
  // A re-registration keeps the report until the agent says otherwise.
  nodes.Register(RegisterReq("n1", 2, "a2", v1::CUDA));
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  // Mended: the next report leaves it out, and it is back.
  EXPECT_TRUE(nodes.TakeHealth("n1", {}, &changed).empty());
  EXPECT_TRUE(changed);
  EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
  EXPECT_TRUE(nodes.PlanUncordon("n1", 1).ok());
  // Unfit again: a first report again.
  EXPECT_EQ(nodes.TakeHealth("n1", report).size(), 1u);
}

// A latched finding (a critical Xid: the agent cannot see the GPU mended) ends by an
// operator's uncordon of the slot or node: the slot is in use at once, and the latch goes to
// the agent with every heartbeat reply (cleared_latches) until its reports leave it out. A
// report of the cleared latch meanwhile is no new failure; a new latch on the slot is.
TEST(NodeManagerTest, AnOperatorsUncordonEndsALatchedFindingAndTellsTheAgentUntilItHeard) {
  FakeClock clock;
  NodeManager nodes(&clock, {.slot_cordon_base_ms = 300'000});
  nodes.Register(RegisterReq("n1", 2, "a1", v1::CUDA));
  google::protobuf::RepeatedPtrField<v1::SlotHealth> report;
  v1::SlotHealth* xid = report.Add();
  xid->set_slot(1);
  xid->set_fault("GPU 0000:19:00.0: Xid 79 (fallen off the bus)");
  xid->set_latch(77);
  ASSERT_EQ(nodes.TakeHealth("n1", report).size(), 1u);
  nodes.CordonSlot("n1", 1, "health check");
  EXPECT_TRUE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));

  auto plan = nodes.PlanUncordon("n1", 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->was_cordoned);
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  const v1::NodeRecord* n1 = nodes.Find("n1");
  EXPECT_EQ(n1->unhealthy_slots_size(), 0);
  ASSERT_EQ(n1->cleared_latches_size(), 1);
  EXPECT_EQ(n1->cleared_latches(0), 77);
  EXPECT_FALSE(SlotOut(*n1, 1, clock.WallNowMs()));
  // The agent, not told yet, reports the latch again (and again): no change, no new failure,
  // the slot in use, the latch still to be sent.
  for (int i = 0; i < 2; ++i) {
    bool changed = true;
    EXPECT_TRUE(nodes.TakeHealth("n1", report, &changed).empty());
    EXPECT_FALSE(changed);
    EXPECT_FALSE(SlotOut(*nodes.Find("n1"), 1, clock.WallNowMs()));
    EXPECT_EQ(nodes.Find("n1")->cleared_latches_size(), 1);
  }
  // It heard: its report leaves the latch out, and the coordinator forgets it.
  EXPECT_TRUE(nodes.TakeHealth("n1", {}).empty());
  EXPECT_EQ(nodes.Find("n1")->cleared_latches_size(), 0);
  // A new Xid on the slot is a new latch: a first report.
  xid->set_latch(78);
  EXPECT_EQ(nodes.TakeHealth("n1", report).size(), 1u);
  // A node's uncordon ends every latch of the node; a finding without one stays and the
  // slot's own uncordon is still refused for it.
  v1::SlotHealth* ecc = report.Add();
  ecc->set_slot(0);
  ecc->set_fault("GPU 0000:18:00.0: 1 uncorrectable ECC error");
  EXPECT_EQ(nodes.TakeHealth("n1", report).size(), 1u);
  EXPECT_EQ(nodes.PlanUncordon("n1", 0).status().code(), StatusCode::kFailedPrecondition);
  plan = nodes.PlanUncordon("n1", -1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(nodes.ApplyPlan(*plan));
  n1 = nodes.Find("n1");
  ASSERT_EQ(n1->unhealthy_slots_size(), 1);
  EXPECT_EQ(n1->unhealthy_slots(0).slot(), 0);
  ASSERT_EQ(n1->cleared_latches_size(), 1);
  EXPECT_EQ(n1->cleared_latches(0), 78);
  EXPECT_FALSE(SlotOut(*n1, 1, clock.WallNowMs()));
  EXPECT_TRUE(SlotOut(*n1, 0, clock.WallNowMs()));
}

TEST(NodeManagerTest, CordonsAfterRepeatedFailuresWithGrowingCoolDown) {
  FakeClock clock;
  NodeManager nodes(
      &clock, {.cordon_after_failures = 2, .cordon_base_ms = 30'000, .cordon_max_ms = 100'000});
  nodes.Register(RegisterReq("n1", 1));
  // First death: not cordoned; it is schedulable as soon as it heartbeats again.
  auto dead = nodes.MarkDead("n1");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->cordon_until_ms(), 0);
  EXPECT_FALSE(nodes.Schedulable("n1"));
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("agent-1");
  auto back = nodes.OnHeartbeat(hb);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->state(), v1::NODE_ALIVE);
  // Second death: cordoned for 30 s.
  dead = nodes.MarkDead("n1");
  EXPECT_EQ(dead->cordon_until_ms(), clock.WallNowMs() + 30'000);
  EXPECT_EQ(nodes.OnHeartbeat(hb)->state(), v1::NODE_CORDONED);
  EXPECT_FALSE(nodes.Schedulable("n1"));
  clock.AdvanceMs(29'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  clock.AdvanceMs(1);
  ASSERT_EQ(nodes.ExpireCordons().size(), 1u);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  // Third: 60 s; fourth: 120 s capped at 100 s.
  EXPECT_EQ(nodes.MarkDead("n1")->cordon_until_ms(), clock.WallNowMs() + 60'000);
  nodes.OnHeartbeat(hb);
  EXPECT_EQ(nodes.MarkDead("n1")->cordon_until_ms(), clock.WallNowMs() + 100'000);
  // Re-registering keeps the cordon.
  EXPECT_EQ(nodes.Register(RegisterReq("n1", 1, "a2")).state(), v1::NODE_CORDONED);
}

// A failure storm (every node dying over and over: a switch, the network, the coordinator)
// cordons at most half the nodes; the rest stay in use, their failures still counted, and
// the first to fail again once a cordon has ended takes its place.
TEST(NodeManagerTest, AFailureStormCordonsAtMostTheCappedShareOfNodes) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 2,
                             .cordon_base_ms = 30'000,
                             .cordon_max_ms = 100'000,
                             .max_cordoned_share = 0.5});
  for (const char* name : {"n1", "n2", "n3", "n4", "n5"}) {
    nodes.Register(RegisterReq(name, 1, std::string("agent-") + name));
  }
  auto die_twice = [&](const std::string& name, bool* held_back) {
    nodes.MarkDead(name);
    nodes.Register(RegisterReq(name, 1, "agent-" + name));
    return nodes.MarkDead(name, held_back);
  };
  // Five nodes, share 0.5: two may be cordoned at once.
  bool held_back = false;
  EXPECT_GT(die_twice("n1", &held_back)->cordon_until_ms(), 0);
  EXPECT_FALSE(held_back);
  clock.AdvanceMs(10'000);
  EXPECT_GT(die_twice("n2", &held_back)->cordon_until_ms(), 0);
  EXPECT_FALSE(held_back);
  EXPECT_EQ(nodes.Register(RegisterReq("n2", 1, "agent-n2")).state(), v1::NODE_CORDONED);
  auto n3 = die_twice("n3", &held_back);
  EXPECT_TRUE(held_back);
  EXPECT_EQ(n3->failures(), 2);  // counted all the same
  EXPECT_EQ(n3->cordon_until_ms(), 0);
  EXPECT_EQ(nodes.Register(RegisterReq("n3", 1, "agent-n3")).state(), v1::NODE_ALIVE);
  EXPECT_TRUE(nodes.Schedulable("n3"));
  // A cordoned node's further failure lengthens its own cordon: it adds none.
  nodes.Register(RegisterReq("n1", 1, "agent-n1"));
  held_back = false;
  EXPECT_EQ(nodes.MarkDead("n1", &held_back)->cordon_until_ms(), clock.WallNowMs() + 60'000);
  EXPECT_FALSE(held_back);
  // A peer cut-off is capped too: the node is left in use, not cordoned.
  nodes.Register(RegisterReq("n4", 1, "agent-n4"));
  auto n4 = nodes.CordonCutOff("n4", &held_back);
  EXPECT_TRUE(held_back);
  EXPECT_EQ(n4->state(), v1::NODE_ALIVE);
  EXPECT_EQ(n4->failures(), 1);
  EXPECT_TRUE(nodes.Schedulable("n4"));
  // n2's cordon ends (n1's, renewed, lasts): n3's next failure takes its place.
  clock.AdvanceMs(30'000);
  ASSERT_EQ(nodes.ExpireCordons().size(), 1u);
  EXPECT_TRUE(nodes.Schedulable("n2"));
  held_back = false;
  EXPECT_EQ(nodes.MarkDead("n3", &held_back)->cordon_until_ms(), clock.WallNowMs() + 60'000);
  EXPECT_FALSE(held_back);
  // A slot's cordon is its GPU's own fault: never capped.
  EXPECT_TRUE(nodes.CordonSlot("n5", 0, "ECC").has_value());
  EXPECT_GT(nodes.Find("n5")->slot_faults(0).cordon_until_ms(), clock.WallNowMs());
}

// The cap is never below one node: a lone failing node is cordoned in the smallest cluster,
// and a share of 1 cordons every node that earns it.
TEST(NodeManagerTest, TheCordonCapIsAtLeastOneNodeAndOneMeansNoCap) {
  FakeClock clock;
  NodeManager small(&clock, {.cordon_after_failures = 1, .max_cordoned_share = 0.5});
  small.Register(RegisterReq("n1", 1));
  bool held_back = false;
  EXPECT_GT(small.MarkDead("n1", &held_back)->cordon_until_ms(), 0);
  EXPECT_FALSE(held_back);

  NodeManager uncapped(&clock, {.cordon_after_failures = 1, .max_cordoned_share = 1.0});
  for (const char* name : {"n1", "n2", "n3"}) {
    uncapped.Register(RegisterReq(name, 1, std::string("agent-") + name));
    EXPECT_GT(uncapped.MarkDead(name, &held_back)->cordon_until_ms(), 0) << name;
    EXPECT_FALSE(held_back) << name;
  }
}

TEST(NodeManagerTest, ANodeQuietForItsFailureMemoryHasItsFailuresForgotten) {
  FakeClock clock;
  NodeManager nodes(&clock, {.cordon_after_failures = 2,
                             .cordon_base_ms = 30'000,
                             .cordon_max_ms = 100'000,
                             .failure_memory_ms = 3'600'000});
  nodes.Register(RegisterReq("n1", 1));
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("agent-1");
  auto dead = nodes.MarkDead("n1");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->failures(), 1);
  EXPECT_EQ(dead->last_failure_ms(), clock.WallNowMs());
  nodes.OnHeartbeat(hb);
  // Remembered for the whole memory, forgotten (and reported, to persist) once at its end.
  clock.AdvanceMs(3'599'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  EXPECT_EQ(nodes.Find("n1")->failures(), 1);
  clock.AdvanceMs(1);
  auto forgotten = nodes.ExpireCordons();
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0].failures(), 0);
  EXPECT_EQ(forgotten[0].last_failure_ms(), 0);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  // So its next death is a first one: no cordon (remembered, it would be its second).
  EXPECT_EQ(nodes.MarkDead("n1")->cordon_until_ms(), 0);
  EXPECT_TRUE(nodes.OnHeartbeat(hb).has_value());
  EXPECT_TRUE(nodes.Schedulable("n1"));
  // A failure within the memory counts as a repeat, and each one starts the memory again.
  clock.AdvanceMs(3'000'000);
  EXPECT_EQ(nodes.MarkDead("n1")->cordon_until_ms(), clock.WallNowMs() + 30'000);
  clock.AdvanceMs(3'000'000);
  nodes.ExpireCordons();
  EXPECT_EQ(nodes.Find("n1")->failures(), 2);
}

TEST(NodeManagerTest, FailuresAreNeverForgottenDuringTheirCordonOrWithoutAMemory) {
  FakeClock clock;
  // A memory shorter than the cordon: forgotten only when the cordon ends.
  NodeManager nodes(&clock, {.cordon_base_ms = 30'000, .failure_memory_ms = 10'000});
  nodes.Register(RegisterReq("n1", 1));
  nodes.CordonCutOff("n1");
  clock.AdvanceMs(29'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  EXPECT_EQ(nodes.Find("n1")->failures(), 1);
  clock.AdvanceMs(1);
  auto ended = nodes.ExpireCordons();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::NODE_ALIVE);
  EXPECT_EQ(ended[0].failures(), 0);
  // No memory: remembered for good (until drover uncordon).
  NodeManager forever(&clock, {.failure_memory_ms = 0, .slot_failure_memory_ms = 0});
  forever.Register(RegisterReq("n1", 1, "a1", v1::CUDA));
  forever.MarkDead("n1");
  forever.CordonSlot("n1", 0, "ECC");
  clock.AdvanceMs(400LL * 86'400'000);
  forever.ExpireCordons();
  EXPECT_EQ(forever.Find("n1")->failures(), 1);
  ASSERT_EQ(forever.Find("n1")->slot_faults_size(), 1);
  EXPECT_EQ(forever.Find("n1")->slot_faults(0).failures(), 1);
}

TEST(NodeManagerTest, ARecordFromBeforeFailureTimesIsRememberedFromItsRestore) {
  FakeClock clock;
  v1::NodeRecord old;
  old.set_name("n1");
  old.set_state(v1::NODE_ALIVE);
  old.set_failures(3);  // no last_failure_ms: written by a coordinator of protocol 2
  v1::SlotFault* fault = old.add_slot_faults();
  fault->set_slot(0);
  fault->set_failures(1);
  NodeManager nodes(&clock, {.failure_memory_ms = 60'000, .slot_failure_memory_ms = 120'000});
  nodes.Restore(old);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  clock.AdvanceMs(60'000);
  auto forgotten = nodes.ExpireCordons();
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0].failures(), 0);
  EXPECT_EQ(forgotten[0].slot_faults_size(), 1);
  clock.AdvanceMs(60'000);
  forgotten = nodes.ExpireCordons();
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0].slot_faults_size(), 0);
}

TEST(NodeManagerTest, ASlotQuietForItsFailureMemoryStartsAfreshWithTheShortestCordon) {
  FakeClock clock;
  NodeManager nodes(&clock, {.slot_cordon_base_ms = 300'000,
                             .slot_cordon_max_ms = 1'000'000,
                             .slot_failure_memory_ms = 2'000'000});
  nodes.Register(RegisterReq("n1", 2, "a1", v1::CUDA));
  nodes.CordonSlot("n1", 1, "ECC");
  nodes.CordonSlot("n1", 1, "ECC again");  // 600 s
  clock.AdvanceMs(600'000);
  ASSERT_EQ(nodes.ExpireCordons().size(), 1u);  // its cordon ends; its failures stay
  EXPECT_EQ(nodes.Find("n1")->slot_faults(0).failures(), 2);
  clock.AdvanceMs(1'399'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  clock.AdvanceMs(1);
  auto forgotten = nodes.ExpireCordons();
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0].slot_faults_size(), 0);
  auto again = nodes.CordonSlot("n1", 1, "ECC a month later");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->slot_faults(0).failures(), 1);
  EXPECT_EQ(again->slot_faults(0).cordon_until_ms(), clock.WallNowMs() + 300'000);
}

TEST(NodeManagerTest, RestoredNodeIsNotSchedulableUntilItHeartbeats) {
  FakeClock clock;
  NodeManager nodes(&clock, {});
  v1::NodeRecord rec;
  rec.set_name("n1");
  rec.set_agent_id("a1");
  rec.set_state(v1::NODE_ALIVE);
  rec.add_slots()->set_index(0);
  nodes.Restore(rec);
  EXPECT_TRUE(nodes.Accepts("n1", "a1"));
  EXPECT_FALSE(nodes.Schedulable("n1"));
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  nodes.OnHeartbeat(hb);
  EXPECT_TRUE(nodes.Schedulable("n1"));
}

TEST(NodeManagerTest, RestoredCordonEndsOnTime) {
  FakeClock clock;
  NodeManager nodes(&clock, {});
  v1::NodeRecord rec;
  rec.set_name("n1");
  rec.set_agent_id("a1");
  rec.set_state(v1::NODE_CORDONED);
  rec.set_cordon_until_ms(clock.WallNowMs() + 10'000);
  rec.add_slots()->set_index(0);
  nodes.Restore(rec);
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("a1");
  nodes.OnHeartbeat(hb);
  clock.AdvanceMs(9'999);
  EXPECT_TRUE(nodes.ExpireCordons().empty());
  EXPECT_FALSE(nodes.Schedulable("n1"));
  clock.AdvanceMs(1);
  ASSERT_EQ(nodes.ExpireCordons().size(), 1u);
  EXPECT_TRUE(nodes.Schedulable("n1"));
  EXPECT_TRUE(nodes.ExpireCordons().empty());  // reported once
}

}  // namespace
}  // namespace drover::coordinator
