// JobManager's attempts (job_manager.h): their placement, what their trainers and nodes
// report, how they end (success, failure, cancel) and the orders to agents that follow.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/exit_codes.h"
#include "common/job_state.h"
#include "coordinator/job_manager.h"

namespace drover::coordinator {
namespace {

std::string DescribeExit(const v1::TrainerStatus& t, const std::string& node) {
  std::string s = "rank " + std::to_string(t.rank()) + " on " + node;
  if (t.signal() != 0) {
    s += " was killed by signal " + std::to_string(t.signal());
  } else {
    s += " exited with code " + std::to_string(t.exit_code());
  }
  if (!t.last_error().empty()) s += ": " + t.last_error();
  return s;
}

// The records of an attempt that ended, and of a job cancelled, at wall time `now_ms`:
// shared by the cancel that is planned and the one that is made, so memory gets exactly
// what was written.
void MarkEnded(v1::AttemptRecord* a, const v1::JobRecord& job, int64_t now_ms,
               const std::string& why) {
  a->set_job_id(job.job_id());
  a->set_attempt(job.attempt());
  a->set_ended_ms(now_ms);
  a->set_end_reason(why);
}

void MarkCancelled(v1::JobRecord* r, int64_t now_ms) {
  r->clear_placement();
  r->set_state(v1::CANCELLED);
  r->set_finished_ms(now_ms);
  r->set_reason("cancelled");
}

}  // namespace

JobManager::CancelPlan JobManager::PlanCancel(const std::string& job_id) const {
  const Job* job = Get(job_id);
  DROVER_CHECK(job != nullptr && !IsTerminal(job->rec.state()));
  CancelPlan plan{job_id, job->version, clock_->WallNowMs(), {}};
  v1::JobRecord rec = job->rec;
  if (rec.state() == v1::RUNNING) {
    auto it = job->attempts.find(rec.attempt());
    v1::AttemptRecord a = it == job->attempts.end() ? v1::AttemptRecord() : it->second;
    MarkEnded(&a, rec, plan.at_ms, "cancelled");
    plan.batch.attempts.push_back(std::move(a));
  }
  MarkCancelled(&rec, plan.at_ms);
  plan.batch.jobs.push_back(std::move(rec));
  return plan;
}

bool JobManager::ApplyCancel(const CancelPlan& plan) {
  Job* job = Get(plan.job_id);
  if (!job || job->version != plan.version) return false;
  if (job->rec.state() == v1::RUNNING) EndAttempt(*job, "cancelled", plan.at_ms);
  MarkCancelled(&job->rec, plan.at_ms);
  Reindex(*job);
  ++job->version;  // what the plan wrote is the job's newest durable record
  return true;
}

void JobManager::StartAttempt(const Placement& placement, const v1::CheckpointRecord* resume) {
  Job* job = Get(placement.job_id);
  DROVER_CHECK(job != nullptr);
  DROVER_CHECK(job->rec.state() == v1::PENDING || job->rec.state() == v1::RECOVERING);
  v1::JobRecord& r = job->rec;
  const int64_t attempt = r.attempt() + 1;
  r.set_attempt(attempt);
  r.set_state(v1::RUNNING);
  if (r.started_ms() == 0) r.set_started_ms(clock_->WallNowMs());
  r.mutable_placement()->Assign(placement.ranks.begin(), placement.ranks.end());
  job->waiting = placement.note;  // why it runs smaller than it could, until a plan says more
  job->failure.clear();
  job->resize.reset();
  job->hold_size = 0;
  job->regroup_until_ms = 0;
  r.set_reason(placement.note);
  r.set_restart_not_before_ms(0);
  job->ranks.assign(placement.ranks.size(), Rank{});
  job->ranks_done = 0;
  IndexPlacement(*job, true);

  v1::AttemptRecord& a = job->attempts[attempt];
  a.set_job_id(r.job_id());
  a.set_attempt(attempt);
  a.set_world_size(placement.world_size);
  a.mutable_placement()->CopyFrom(r.placement());
  a.set_started_ms(clock_->WallNowMs());
  a.set_resume_step(resume ? resume->step() : -1);
  // Progress restarts at the checkpoint: the steps up to furthest_step are trained again,
  // and showing the old attempt's step meanwhile would hide them.
  r.set_furthest_step(std::max(r.furthest_step(), r.last_step()));
  r.set_last_step(resume ? resume->step() : 0);
  a.set_resume_checkpoint(resume ? resume->path() : "");
  spdlog::info("job {} attempt {}: world size {}, resume from {}{}", r.job_id(), attempt,
               placement.world_size, resume ? resume->path() : "scratch",
               placement.note.empty() ? "" : " (" + placement.note + ")");
  Persist(*job, &a);
  if (hooks_.attempt_started) hooks_.attempt_started(r.job_id(), attempt);
}

v1::AttemptRecord& JobManager::EndAttempt(Job& job, const std::string& why, int64_t now_ms) {
  v1::AttemptRecord& a = job.attempts[job.rec.attempt()];
  MarkEnded(&a, job.rec, now_ms, why);
  // While the job still names its placement: the hook tells those nodes.
  if (hooks_.attempt_ended) hooks_.attempt_ended(job.rec.job_id(), job.rec.attempt());
  IndexPlacement(job, false);
  job.rec.clear_placement();
  job.ranks.clear();
  job.ranks_done = 0;
  job.resize.reset();
  job.checkpoint_asked.reset();
  job.waiting.clear();
  job.straggling_since.clear();
  job.replace.reset();
  job.time_up = false;
  return a;
}

void JobManager::FailAttempt(Job& job, const std::string& why, const std::string& node, bool retry,
                             bool counted) {
  const int64_t attempt = job.rec.attempt();
  const int64_t now = clock_->WallNowMs();
  const bool time_used_up = TimeUsedUp(job, now);
  v1::AttemptRecord& a = EndAttempt(job, why, now);
  const std::string what = "attempt " + std::to_string(attempt) + " failed: " + why;
  const RestartBackoff& backoff = options_.restart_backoff;
  const bool fresh = now - a.started_ms() >= backoff.reset_after_ms;
  const int in_a_row = fresh ? 1 : job.rec.failures_in_a_row() + 1;
  job.rec.set_failures_in_a_row(in_a_row);
  if (fresh) job.avoid.clear();
  job.avoid.insert(node);
  if (!retry) {
    job.rec.set_state(v1::FAILED);
    job.rec.set_finished_ms(clock_->WallNowMs());
    job.rec.set_reason(what + "; not restarted: the trainer rejected its input (exit code 2)");
  } else if (time_used_up) {
    job.rec.set_state(v1::FAILED);
    job.rec.set_finished_ms(now);
    job.rec.set_reason(what + "; not restarted: " + TimeLimitReached(job, now));
  } else if (job.rec.suspend()) {
    // Asked to suspend before its checkpoint came: not restarted, and no restart counted.
    MakeSuspended(job);
  } else if (counted && job.rec.restarts() >= job.rec.max_restarts()) {
    job.rec.set_state(v1::FAILED);
    job.rec.set_finished_ms(clock_->WallNowMs());
    job.rec.set_reason(what + "; max_restarts (" + std::to_string(job.rec.max_restarts()) +
                       ") used up");
  } else {
    if (counted) job.rec.set_restarts(job.rec.restarts() + 1);
    job.rec.set_state(v1::RECOVERING);
    job.failure = what + (counted ? "; restart " + std::to_string(job.rec.restarts()) + " of " +
                                        std::to_string(job.rec.max_restarts())
                                  : "; restarting (not counted against max_restarts)");
    const int64_t delay_ms = backoff.DelayMs(in_a_row);
    job.rec.set_restart_not_before_ms(delay_ms > 0 ? now + delay_ms : 0);
    if (delay_ms > 0) next_restart_ms_ = std::min(next_restart_ms_, now + delay_ms);
    // The survivors are told to stop now and are killed after the stop grace; a second
    // more for their agents to say so. A trainer still running after that is stuck, and
    // the job takes what is free.
    job.regroup_until_ms = now + options_.stop_grace_ms + 1000;
    job.waiting.clear();
    UpdateReason(job);
  }
  spdlog::warn("job {}: {}", job.rec.job_id(), job.rec.reason());
  Persist(job, &a);
  // After Persist: like every waiting reason, the countdown lives in memory only (a
  // restored job's reason is its failure, and the countdown is added to it again).
  if (job.rec.state() == v1::RECOVERING) ShowRestartDelay(job, now);
}

void JobManager::Succeed(Job& job) {
  v1::AttemptRecord& a = EndAttempt(job, "succeeded", clock_->WallNowMs());
  job.rec.set_state(v1::SUCCEEDED);
  job.rec.set_finished_ms(clock_->WallNowMs());
  job.rec.set_reason("");
  spdlog::info("job {} succeeded (attempt {})", job.rec.job_id(), job.rec.attempt());
  Persist(job, &a);
}

const JobManager::Rank* JobManager::CurrentRank(const std::string& node,
                                                const TrainerKey& key) const {
  const Job* job = Get(key.job_id);
  if (!job || job->rec.state() != v1::RUNNING || job->rec.attempt() != key.attempt) return nullptr;
  if (key.rank < 0 || key.rank >= job->rec.placement_size()) return nullptr;
  if (job->rec.placement(key.rank).node() != node) return nullptr;
  return &job->ranks[key.rank];
}

void JobManager::OnTrainerStatus(const std::string& node, const v1::TrainerStatus& t) {
  const TrainerKey key = TrainerKey::Of(t);
  NoteDeviceFault(node, t);
  if (!CurrentRank(node, key)) return;  // fenced: an older attempt, or not placed there
  Job& job = *Get(key.job_id);
  Rank& rank = job.ranks[key.rank];
  rank.acked = true;
  rank.status = t;
  if (t.progress().step() > job.rec.last_step()) job.rec.set_last_step(t.progress().step());
  // A record written before furthest_step existed counts its last_step as reached.
  job.rec.set_furthest_step(std::max(job.rec.furthest_step(), job.rec.last_step()));
  if (key.rank == 0 && t.progress().step() > 0) {
    job.rec.set_last_loss(t.progress().loss());
    job.rec.set_tokens_per_s(t.progress().tokens_per_s());
  }
  if (key.rank == 0) {
    job.rec.set_checkpoint_error(t.progress().checkpoint_error());
    job.rec.set_rollbacks(t.progress().rollbacks());
  }
  if (t.state() != v1::TRAINER_EXITED || rank.done) return;
  if (t.exit_code() == 0 && t.signal() == 0) {
    rank.done = true;
    if (++job.ranks_done == static_cast<int>(job.ranks.size())) Succeed(job);
    return;
  }
  if (t.progress().cut_off_ranks_size() > 0) {
    FailCutOff(job, t, node);
    return;
  }
  if (t.signal() == 0 && t.exit_code() == kExitDeviceFault) {
    // The slot's GPU failed (NoteDeviceFault has cordoned it). The restart is not counted
    // against max_restarts, for FailCutOff's reason: the slot's growing cool-down bounds
    // how often a job meets that GPU again, and a job that grew back onto it each time
    // would otherwise spend its restarts on the cluster's fault.
    const std::string why = "the GPU of " + node + " slot " +
                            std::to_string(job.rec.placement(key.rank).slot()) + " failed (" +
                            DescribeExit(t, node) + ")";
    FailAttempt(job, why, node, /*retry=*/true, /*counted=*/false);
    return;
  }
  if (t.signal() == 0 && t.exit_code() == kExitDrained) {
    // A node's agent is stopping, or an operator drains the node, and its trainers drained: they
    // stopped once the job's checkpoint of the step the ranks agreed on was committed (and their
    // peers with them), so the next attempt resumes from it. Neither the job's fault nor the
    // node's: not counted. The exit's last line says which rank and node were drained.
    FailAttempt(job, "drained: a node is taken out of service (" + DescribeExit(t, node) + ")",
                node,
                /*retry=*/true, /*counted=*/false);
    return;
  }
  FailAttempt(job, DescribeExit(t, node), node, /*retry=*/t.exit_code() != kExitUsage);
}

void JobManager::FailCutOff(Job& job, const v1::TrainerStatus& t, const std::string& reporter) {
  // The check's verdict is the same on every rank: the nodes of the ranks it names are at
  // fault, whichever rank reported first.
  std::vector<std::string> nodes;
  for (const int r : t.progress().cut_off_ranks()) {
    if (r < 0 || r >= job.rec.placement_size()) continue;  // not this attempt's: ignored
    const std::string& n = job.rec.placement(r).node();
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
  }
  if (nodes.empty()) {
    FailAttempt(job, DescribeExit(t, reporter), reporter);
    return;
  }
  std::string names;
  for (const std::string& n : nodes) names += (names.empty() ? "" : ", ") + n;
  const std::string why = "the ranks could not all reach each other; cut off: " + names + " (" +
                          DescribeExit(t, reporter) + ")";
  FailAttempt(job, why, nodes.front(), /*retry=*/true, /*counted=*/false);
  if (hooks_.node_cut_off) {
    for (const std::string& n : nodes) {
      hooks_.node_cut_off(n, "job " + job.rec.job_id() + "'s ranks could not reach it");
    }
  }
}

void JobManager::NoteDeviceFault(const std::string& node, const v1::TrainerStatus& t) {
  if (t.state() != v1::TRAINER_EXITED || t.signal() != 0 || t.exit_code() != kExitDeviceFault) {
    return;
  }
  const TrainerKey key = TrainerKey::Of(t);
  Job* job = Get(key.job_id);
  const std::optional<int> slot = SlotOf(node, key);
  if (job == nullptr || !slot || !job->device_faults.insert(key).second) return;
  if (hooks_.slot_failed) {
    hooks_.slot_failed(node, *slot,
                       "job " + key.job_id + " attempt " + std::to_string(key.attempt) + ": " +
                           DescribeExit(t, node));
  }
}

void JobManager::OnListing(const std::string& node, const std::vector<v1::TrainerStatus>& listed) {
  auto it = ranks_on_node_.find(node);
  if (it == ranks_on_node_.end()) return;
  std::set<TrainerKey> seen;
  for (const auto& t : listed) seen.insert(TrainerKey::Of(t));
  std::vector<std::pair<std::string, int>> lost;
  for (const auto& [id, ranks] : it->second) {
    const Job& job = *Get(id);
    for (int r : ranks) {
      const Rank& rank = job.ranks[r];
      if (rank.acked && !rank.done && !seen.count({id, job.rec.attempt(), r})) {
        lost.emplace_back(id, r);
      }
    }
  }
  for (const auto& [id, r] : lost) {
    Job& job = *Get(id);
    if (job.rec.state() != v1::RUNNING) continue;  // an earlier loss already ended it
    FailAttempt(job, "rank " + std::to_string(r) + " vanished from the agent on " + node, node);
  }
}

void JobManager::OnNodeLost(const std::string& node, const std::string& why) {
  auto it = ranks_on_node_.find(node);
  if (it == ranks_on_node_.end()) return;
  std::vector<std::string> ids;
  for (const auto& [id, ranks] : it->second) ids.push_back(id);
  for (const std::string& id : ids) {
    Job& job = *Get(id);
    if (job.rec.state() == v1::RUNNING) FailAttempt(job, "node " + node + " " + why, node);
  }
}

void JobManager::OnHang(const TrainerKey& key) {
  if (!IsCurrent(key)) return;
  Job& job = *Get(key.job_id);
  const std::string node = job.rec.placement(key.rank).node();
  FailAttempt(job,
              "rank " + std::to_string(key.rank) + " hung: step " +
                  std::to_string(job.ranks[key.rank].status.progress().step()) +
                  " did not move for " + std::to_string(job.spec.fault_tolerance.hang_timeout_s) +
                  " s",
              node);
}

void JobManager::OnSlotFailed(const std::string& node, int slot, const std::string& why) {
  auto it = ranks_on_node_.find(node);
  if (it == ranks_on_node_.end()) return;
  std::vector<std::pair<std::string, int>> hit;  // FailAttempt changes ranks_on_node_
  for (const auto& [id, ranks] : it->second) {
    const Job& job = *Get(id);
    for (int r : ranks) {
      if (job.rec.placement(r).slot() == slot && !job.ranks[r].done) hit.emplace_back(id, r);
    }
  }
  for (const auto& [id, r] : hit) {
    Job& job = *Get(id);
    if (job.rec.state() != v1::RUNNING) continue;
    job.device_faults.insert({id, job.rec.attempt(), r});
    FailAttempt(
        job,
        "rank " + std::to_string(r) + " on " + node + " slot " + std::to_string(slot) + ": " + why,
        node, /*retry=*/true, /*counted=*/false);
  }
}

bool JobManager::OnCheckpoint(const v1::CheckpointRecord& record) {
  Job* job = Get(record.job_id());
  if (!job || record.attempt() != job->rec.attempt()) return false;
  if (job->checkpoint_asked && record.step() > job->checkpoint_asked->after_step) {
    job->checkpoint_asked.reset();
  }
  if (record.step() > job->rec.latest_checkpoint_step()) {
    job->rec.set_latest_checkpoint_step(record.step());
    // A resize at the final step would only delay the end (and free the slots no sooner).
    const bool before_end = record.step() < job->spec.train.steps;
    if (job->rec.state() == v1::RUNNING && job->time_up && before_end) {
      EndAtTimeLimit(*job,
                     "stopped at the checkpoint of step " + std::to_string(record.step()) + " (" +
                         record.path() +
                         "): a job submitted again with the same checkpoint.dir goes on from it",
                     clock_->WallNowMs());
    } else if (job->rec.state() == v1::RUNNING && job->rec.suspend() && before_end) {
      v1::AttemptRecord& a =
          EndAttempt(*job,
                     "suspended" + SuspendedBy(job->rec) + " at the checkpoint of step " +
                         std::to_string(record.step()),
                     clock_->WallNowMs());
      MakeSuspended(*job);
      spdlog::info("job {}: {}", job->rec.job_id(), a.end_reason());
      Persist(*job, &a);
    } else if (job->rec.state() == v1::RUNNING && job->replace && before_end) {
      // A planned resize is made again by the next pass.
      Replace(*job, "at the checkpoint of step " + std::to_string(record.step()));
    } else if (job->rec.state() == v1::RUNNING && job->resize && before_end) {
      Resize(*job, record.step());  // persists the new latest step with the resize
    } else {
      Persist(*job, nullptr);
    }
  }
  return true;
}

void JobManager::AppendOrders(const std::string& node, const std::vector<v1::TrainerStatus>& listed,
                              Orders* orders,
                              const std::function<bool(const std::string&)>& may_start) const {
  std::set<std::pair<std::string, int64_t>> stopping;
  for (const auto& t : listed) {
    if (!IsLive(t) || CurrentRank(node, TrainerKey::Of(t))) continue;
    if (!stopping.emplace(t.job_id(), t.attempt()).second) continue;
    v1::StopTrainersOrder* stop = orders->Add()->mutable_stop();
    stop->set_job_id(t.job_id());
    stop->set_attempt(t.attempt());
    stop->set_grace_ms(static_cast<int32_t>(options_.stop_grace_ms));
    const Job* job = Get(t.job_id());
    std::string reason = "not a running attempt";
    if (!job) {
      reason = "unknown job";
    } else if (auto a = job->attempts.find(t.attempt());
               a != job->attempts.end() && !a->second.end_reason().empty()) {
      reason = a->second.end_reason();
    }
    stop->set_reason(reason);
  }
  auto it = ranks_on_node_.find(node);
  if (it == ranks_on_node_.end()) return;
  for (const auto& [id, ranks] : it->second) {
    const Job& job = *Get(id);
    if (const auto& asked = job.checkpoint_asked) {
      v1::CheckpointTrainersOrder* c = orders->Add()->mutable_checkpoint();
      c->set_job_id(id);
      c->set_attempt(job.rec.attempt());
      c->set_request_id(asked->id);
      c->set_reason(asked->reason);
    }
    if (may_start && !may_start(id)) continue;
    const v1::AttemptRecord& a = job.attempts.at(job.rec.attempt());
    for (int r : ranks) {
      const v1::RankAssignment& p = job.rec.placement(r);
      if (job.ranks[r].acked) continue;
      v1::StartTrainerOrder* start = orders->Add()->mutable_start();
      start->set_job_id(id);
      start->set_attempt(job.rec.attempt());
      start->set_rank(r);
      start->set_world_size(job.rec.placement_size());
      start->set_local_rank(p.local_rank());
      start->set_slot(p.slot());
      start->set_spec_yaml(job.rec.spec_yaml());
      start->set_coordinator_address(options_.coordinator_address);
      start->set_resume_checkpoint(a.resume_checkpoint());
      start->set_device(job.rec.device());
      start->set_threads(job.spec.resources.threads_per_rank);
    }
  }
}

}  // namespace drover::coordinator
