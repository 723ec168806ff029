// Helpers shared by the coordinator unit tests.
#pragma once

#include <string>

#include "common/protocol_version.h"
#include "proto/drover.pb.h"

namespace drover::coordinator::testing {

// A valid job spec asking for a world size in [min, max]. global_batch 12 with
// micro_batch 1 makes 1, 2, 3, 4, 6 and 12 feasible.
inline std::string SpecYaml(int min, int max, int max_restarts = 2, double hang_s = 120,
                            const std::string& device = "cpu") {
  return "name: t\n"
         "data: {train: data/train_*.bin}\n"
         "train: {steps: 10, global_batch: 12, micro_batch: 1}\n"
         "resources: {device: " +
         device + ", world_size: {min: " + std::to_string(min) + ", max: " + std::to_string(max) +
         "}}\n"
         "fault_tolerance: {max_restarts: " +
         std::to_string(max_restarts) + ", hang_timeout_s: " + std::to_string(hang_s) + "}\n";
}

inline v1::TrainerStatus Trainer(const std::string& job, int64_t attempt, int rank,
                                 v1::TrainerState state = v1::TRAINER_RUNNING, int64_t step = 0) {
  v1::TrainerStatus t;
  t.set_job_id(job);
  t.set_attempt(attempt);
  t.set_rank(rank);
  t.set_state(state);
  t.mutable_progress()->set_step(step);
  return t;
}

inline v1::TrainerStatus Exited(const std::string& job, int64_t attempt, int rank, int code,
                                int signal = 0) {
  v1::TrainerStatus t = Trainer(job, attempt, rank, v1::TRAINER_EXITED);
  t.set_exit_code(code);
  t.set_signal(signal);
  return t;
}

inline v1::RegisterRequest RegisterReq(const std::string& name, int slots,
                                       const std::string& agent_id = "agent-1",
                                       v1::DeviceKind device = v1::CPU) {
  v1::RegisterRequest r;
  r.set_name(name);
  r.set_address("127.0.0.1");
  r.set_agent_id(agent_id);
  r.set_protocol_version(kProtocolVersion);
  for (int i = 0; i < slots; ++i) {
    v1::Slot* s = r.add_slots();
    s->set_index(i);
    s->set_device(device);
  }
  return r;
}

}  // namespace drover::coordinator::testing
