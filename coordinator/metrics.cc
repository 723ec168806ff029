#include "coordinator/metrics.h"

#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cctype>

#include "common/duration.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/mutex.h"
#include "coordinator/node_manager.h"

namespace drover::coordinator {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// From 100 us (a heartbeat answered from memory) to 10 s (a submit waiting on a slow disk).
Histogram::BucketBoundaries RpcBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}
// From a restart on the same slots (about a second) to a job that waited for nodes.
Histogram::BucketBoundaries RecoveryBuckets() {
  return {0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800};
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double Seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

// The gauges of one scrape, built afresh in their own registry.
class StateSeries {
 public:
  explicit StateSeries(prometheus::Registry* r)
      : jobs_(Family(r, "drover_jobs", "Jobs in each state")),
        nodes_(Family(r, "drover_nodes",
                      "Worker nodes: alive, dead, cordoned, or draining (its trainers leaving)")),
        slots_(Family(r, "drover_slots",
                      "Slots: free, in_use, or unavailable (on dead or cordoned nodes)")),
        node_slots_(Family(r, "drover_node_slots", "Slots of the node")),
        node_free_(Family(r, "drover_node_free_slots", "Slots of the node no trainer holds")),
        node_failures_(Family(r, "drover_node_failures",
                              "Failures counted against the node (they lead to cordons)")),
        node_age_(
            Family(r, "drover_node_heartbeat_age_seconds", "Time since the node's last heartbeat")),
        gpu_busy_(Family(r, "drover_gpu_utilization_ratio",
                         "Share of NVML's last sample period the slot's GPU was busy")),
        gpu_memory_used_(Family(r, "drover_gpu_memory_used_bytes", "GPU memory in use (NVML)")),
        gpu_memory_total_(Family(r, "drover_gpu_memory_total_bytes", "GPU memory (NVML)")),
        gpu_temperature_(Family(r, "drover_gpu_temperature_celsius", "GPU temperature (NVML)")),
        gpu_power_(Family(r, "drover_gpu_power_watts", "GPU power draw (NVML)")),
        gpu_slowed_(Family(r, "drover_gpu_slowed_down",
                           "1 while the hardware or driver holds the GPU's clocks down (thermal, "
                           "power brake), its power cap aside")),
        attempt_(Family(r, "drover_job_attempt", "Number of the job's current attempt")),
        restarts_(Family(r, "drover_job_restarts", "Restarts used, against max_restarts")),
        step_(Family(r, "drover_job_step",
                     "Newest optimizer step of the current attempt (back to the checkpoint's step "
                     "after a recovery)")),
        loss_(Family(r, "drover_job_loss", "Training loss of that step")),
        tokens_(Family(r, "drover_job_tokens_per_second", "Training throughput")),
        last_recovery_(Family(r, "drover_job_last_recovery_seconds",
                              "From the previous attempt's end to the current one's start")),
        lr_(Family(r, "drover_job_learning_rate", "Learning rate rank 0 reported last")),
        val_loss_(Family(r, "drover_job_val_loss", "Newest validation loss")),
        hellaswag_(Family(r, "drover_job_hellaswag_ratio",
                          "Newest accuracy on the job's data.hellaswag (acc_norm)")),
        mfu_(Family(r, "drover_job_mfu_ratio", "Model FLOPs utilisation, where known")),
        rank_busy_(Family(r, "drover_job_rank_busy_seconds",
                          "A rank's own time a step, without waiting for its peers (median of "
                          "its last steps): the stage's slowest sets the pace")),
        stragglers_(Family(r, "drover_job_stragglers",
                           "Ranks the others of their pipeline stage wait for (drover status "
                           "names them)")),
        ckpt_age_(Family(r, "drover_job_checkpoint_age_seconds",
                         "Time since the job's newest complete checkpoint was created")),
        time_limit_(
            Family(r, "drover_job_time_limit_seconds",
                   "The job's time limit (resources.time_limit_minutes), where it has one")),
        time_used_(Family(r, "drover_job_time_used_seconds",
                          "What the job's attempts have run of its time limit, where it has one "
                          "(waiting, recovering and suspended time not counted)")) {}

  void Add(const ClusterSnapshot& s) {
    for (int st = v1::PENDING; st <= v1::JobState_MAX; ++st) {
      auto it = s.jobs_by_state.find(static_cast<v1::JobState>(st));
      jobs_.Add({{"state", Lower(v1::JobState_Name(static_cast<v1::JobState>(st)))}})
          .Set(static_cast<double>(it == s.jobs_by_state.end() ? 0 : it->second));
    }
    AddNodes(s);
    for (const v1::JobInfo& info : s.live_jobs) AddJob(info, s.now_ms);
  }

 private:
  static prometheus::Family<Gauge>& Family(prometheus::Registry* r, const char* name,
                                           const char* help) {
    return BuildGauge().Name(name).Help(help).Register(*r);
  }

  void AddNodes(const ClusterSnapshot& s) {
    int64_t alive = 0, dead = 0, draining = 0, cordoned = 0, free = 0, in_use = 0, unavailable = 0;
    for (const v1::WorkerInfo& w : s.workers) {
      const v1::NodeRecord& n = w.node();
      const int64_t slots = n.slots_size();
      const Labels node{{"node", n.name()}};
      if (n.state() == v1::NODE_DEAD) {
        ++dead;
        unavailable += slots;
      } else if (w.draining()) {
        // Its trainers are leaving with their jobs' checkpoints (its agent is stopping, or an
        // operator drains it): no slot of it takes work.
        ++draining;
        unavailable += slots;
      } else if (n.state() == v1::NODE_CORDONED || n.cordon_until_ms() > s.now_ms) {
        ++cordoned;
        unavailable += slots;
      } else {
        ++alive;
        // A cordoned slot (its GPU failed) is unavailable while the rest of its node works.
        int64_t off = 0;
        for (const v1::Slot& slot : n.slots()) {
          off += SlotOut(n, slot.index(), s.now_ms) ? 1 : 0;
        }
        free += w.free_slots();
        in_use += slots - w.free_slots() - off;
        unavailable += off;
      }
      node_slots_.Add(node).Set(static_cast<double>(slots));
      node_free_.Add(node).Set(w.free_slots());
      node_failures_.Add(node).Set(n.failures());
      node_age_.Add(node).Set(Seconds(std::max<int64_t>(0, s.now_ms - n.last_heartbeat_ms())));
      for (const v1::GpuTelemetry& g : w.gpus()) AddGpu(n.name(), g);
    }
    nodes_.Add({{"state", "alive"}}).Set(static_cast<double>(alive));
    nodes_.Add({{"state", "dead"}}).Set(static_cast<double>(dead));
    nodes_.Add({{"state", "cordoned"}}).Set(static_cast<double>(cordoned));
    nodes_.Add({{"state", "draining"}}).Set(static_cast<double>(draining));
    slots_.Add({{"state", "free"}}).Set(static_cast<double>(free));
    slots_.Add({{"state", "in_use"}}).Set(static_cast<double>(in_use));
    slots_.Add({{"state", "unavailable"}}).Set(static_cast<double>(unavailable));
  }

  void AddGpu(const std::string& node, const v1::GpuTelemetry& g) {
    const Labels l{{"node", node}, {"slot", std::to_string(g.slot())}};
    if (g.has_utilization_pct()) gpu_busy_.Add(l).Set(g.utilization_pct() / 100.0);
    if (g.memory_total_bytes() > 0) {
      gpu_memory_used_.Add(l).Set(static_cast<double>(g.memory_used_bytes()));
      gpu_memory_total_.Add(l).Set(static_cast<double>(g.memory_total_bytes()));
    }
    if (g.has_temperature_c()) gpu_temperature_.Add(l).Set(g.temperature_c());
    if (g.has_power_mw()) gpu_power_.Add(l).Set(g.power_mw() / 1000.0);
    gpu_slowed_.Add(l).Set(g.slowdown().empty() ? 0 : 1);
  }

  void AddJob(const v1::JobInfo& info, int64_t now_ms) {
    const v1::JobRecord& j = info.job();
    const Labels l{{"job_id", j.job_id()}, {"name", j.name()}};
    attempt_.Add(l).Set(static_cast<double>(j.attempt()));
    restarts_.Add(l).Set(j.restarts());
    step_.Add(l).Set(static_cast<double>(j.last_step()));
    loss_.Add(l).Set(j.last_loss());
    tokens_.Add(l).Set(j.tokens_per_s());
    const int n = info.attempts_size();
    if (n >= 2) {
      const v1::AttemptRecord& prev = info.attempts(n - 2);
      const v1::AttemptRecord& cur = info.attempts(n - 1);
      if (prev.ended_ms() > 0 && cur.started_ms() >= prev.ended_ms()) {
        last_recovery_.Add(l).Set(Seconds(cur.started_ms() - prev.ended_ms()));
      }
    }
    stragglers_.Add(l).Set(info.straggler_ranks_size());
    for (const v1::TrainerStatus& t : info.trainers()) {
      if (t.attempt() != j.attempt()) continue;
      const v1::TrainerProgress& p = t.progress();
      if (p.busy_ms() > 0) {
        rank_busy_
            .Add({{"job_id", j.job_id()}, {"name", j.name()}, {"rank", std::to_string(t.rank())}})
            .Set(p.busy_ms() / 1000.0);
      }
      if (t.rank() != 0) continue;
      if (p.step() > 0) lr_.Add(l).Set(p.lr());
      if (p.val_step() > 0) val_loss_.Add(l).Set(p.val_loss());
      if (p.hellaswag_step() > 0) hellaswag_.Add(l).Set(p.hellaswag());
      if (p.mfu() > 0) mfu_.Add(l).Set(p.mfu());
    }
    int64_t newest = 0;
    for (const v1::CheckpointRecord& c : info.checkpoints()) {
      newest = std::max(newest, c.created_ms());
    }
    if (newest > 0) ckpt_age_.Add(l).Set(Seconds(std::max<int64_t>(0, now_ms - newest)));
    auto spec = ParseJobSpec(j.spec_yaml(), {}, "job " + j.job_id());
    if (spec.ok() && spec->resources.time_limit_minutes > 0) {
      time_limit_.Add(l).Set(Seconds(MinutesToMs(spec->resources.time_limit_minutes)));
      time_used_.Add(l).Set(Seconds(JobRanMs(info, now_ms)));
    }
  }

  prometheus::Family<Gauge>& jobs_;
  prometheus::Family<Gauge>& nodes_;
  prometheus::Family<Gauge>& slots_;
  prometheus::Family<Gauge>& node_slots_;
  prometheus::Family<Gauge>& node_free_;
  prometheus::Family<Gauge>& node_failures_;
  prometheus::Family<Gauge>& node_age_;
  prometheus::Family<Gauge>& gpu_busy_;
  prometheus::Family<Gauge>& gpu_memory_used_;
  prometheus::Family<Gauge>& gpu_memory_total_;
  prometheus::Family<Gauge>& gpu_temperature_;
  prometheus::Family<Gauge>& gpu_power_;
  prometheus::Family<Gauge>& gpu_slowed_;
  prometheus::Family<Gauge>& attempt_;
  prometheus::Family<Gauge>& restarts_;
  prometheus::Family<Gauge>& step_;
  prometheus::Family<Gauge>& loss_;
  prometheus::Family<Gauge>& tokens_;
  prometheus::Family<Gauge>& last_recovery_;
  prometheus::Family<Gauge>& lr_;
  prometheus::Family<Gauge>& val_loss_;
  prometheus::Family<Gauge>& hellaswag_;
  prometheus::Family<Gauge>& mfu_;
  prometheus::Family<Gauge>& rank_busy_;
  prometheus::Family<Gauge>& stragglers_;
  prometheus::Family<Gauge>& ckpt_age_;
  prometheus::Family<Gauge>& time_limit_;
  prometheus::Family<Gauge>& time_used_;
};

}  // namespace

CoordinatorMetrics::CoordinatorMetrics()
    : rpc_requests_(BuildCounter()
                        .Name("drover_rpc_requests_total")
                        .Help("RPCs the coordinator answered, by method and gRPC status code")
                        .Register(events_)),
      rpc_duration_(BuildHistogram()
                        .Name("drover_rpc_duration_seconds")
                        .Help("Time from an RPC's receipt to its answer")
                        .Register(events_)),
      recovery_(BuildHistogram()
                    .Name("drover_job_recovery_seconds")
                    .Help("From a job's ended attempt to the start of its next one")
                    .Register(events_)
                    .Add({}, RecoveryBuckets())) {}

void CoordinatorMetrics::ObserveRpc(const std::string& method, const std::string& code,
                                    double seconds) {
  prometheus::Counter* counter;
  prometheus::Histogram* histogram = nullptr;
  {
    MutexLock lock(&mu_);
    auto& c = rpc_counters_[{method, code}];
    if (c == nullptr) c = &rpc_requests_.Add({{"method", method}, {"code", code}});
    counter = c;
    if (seconds >= 0) {  // a stream has no histogram at all, rather than an empty one
      auto& h = rpc_histograms_[method];
      if (h == nullptr) h = &rpc_duration_.Add({{"method", method}}, RpcBuckets());
      histogram = h;
    }
  }
  counter->Increment();
  if (histogram != nullptr) histogram->Observe(seconds);
}

void CoordinatorMetrics::ObserveRecoveries(const ClusterSnapshot& snapshot) {
  // Only live jobs are in a snapshot, so only theirs need remembering: a finished job
  // never shows up again.
  std::set<std::pair<std::string, int64_t>> seen;
  for (const v1::JobInfo& info : snapshot.live_jobs) {
    for (int i = 1; i < info.attempts_size(); ++i) {
      const v1::AttemptRecord& prev = info.attempts(i - 1);
      const v1::AttemptRecord& cur = info.attempts(i);
      if (prev.ended_ms() <= 0 || cur.started_ms() < prev.ended_ms()) continue;
      const auto key = std::make_pair(info.job().job_id(), cur.attempt());
      if (!recoveries_seen_.count(key))
        recovery_.Observe(Seconds(cur.started_ms() - prev.ended_ms()));
      seen.insert(key);
    }
  }
  recoveries_seen_ = std::move(seen);
}

std::string CoordinatorMetrics::Render(const ClusterSnapshot& snapshot) {
  prometheus::Registry state;
  StateSeries series(&state);
  series.Add(snapshot);
  std::vector<prometheus::MetricFamily> families = state.Collect();
  {
    MutexLock lock(&mu_);
    ObserveRecoveries(snapshot);
  }
  for (auto& f : events_.Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace drover::coordinator
