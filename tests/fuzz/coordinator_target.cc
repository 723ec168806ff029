// The coordinator's RPC handlers, called in process as the gRPC server calls them
// (coordinator/server.cc adds only transport), on a fresh Coordinator per input with an
// in-memory store and a fake clock.
//
// Input: records of [opcode: 1 byte][length: 2 bytes, little-endian][a serialized request].
// An opcode selects the handler (kOps below, modulo their number); a request that does not
// parse is skipped, as gRPC would refuse it before the handler. Job ids carry a random
// salt, so a job id "#k" in a request stands for the k-th job this input submitted
// (modulo their number): without that the fuzzer could never name a job.
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/protocol_version.h"
#include "coordinator/coordinator.h"
#include "coordinator/store/store.h"
#include "proto/drover.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/targets.h"

namespace drover::fuzz {
namespace {

using coordinator::Coordinator;

// Keeps nothing: a restore is not what this target explores, and SQLite would make each
// input cost milliseconds.
class NullStore final : public coordinator::Store {
 public:
  Status Apply(const coordinator::StoreBatch&) override { return OkStatus(); }
  StatusOr<coordinator::StoreContents> LoadAll() override { return coordinator::StoreContents{}; }
};

class JobIds {
 public:
  void Add(std::string id) { ids_.push_back(std::move(id)); }
  void Resolve(std::string* id) const {
    if (ids_.empty() || id->size() < 2 || (*id)[0] != '#') return;
    *id = ids_[static_cast<uint8_t>((*id)[1]) % ids_.size()];
  }

 private:
  std::vector<std::string> ids_;
};

template <typename Request>
bool Decode(std::string_view bytes, Request* request) {
  return request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void Call(Coordinator& c, FakeClock& clock, JobIds& jobs, uint8_t op, std::string_view bytes) {
  switch (op % 12) {
    case 0: {
      v1::RegisterRequest r;
      if (!Decode(bytes, &r)) break;
      // Most inputs register; another version is one refusal, checked first.
      if (r.protocol_version() != 0) r.set_protocol_version(kProtocolVersion);
      (void)c.Register(r);
      break;
    }
    case 1: {
      v1::HeartbeatRequest r;
      if (!Decode(bytes, &r)) break;
      for (auto& t : *r.mutable_trainers()) jobs.Resolve(t.mutable_job_id());
      for (auto& ck : *r.mutable_checkpoints()) jobs.Resolve(ck.mutable_job_id());
      (void)c.Heartbeat(r);
      break;
    }
    case 2: {
      v1::TrainerExitRequest r;
      if (!Decode(bytes, &r)) break;
      jobs.Resolve(r.mutable_trainer()->mutable_job_id());
      (void)c.ReportTrainerExit(r);
      break;
    }
    case 3: {
      v1::AppendLogsRequest r;
      if (!Decode(bytes, &r)) break;
      jobs.Resolve(r.mutable_job_id());
      (void)c.AppendLogs(r);
      break;
    }
    case 4: {
      v1::WatchRequest r;
      if (Decode(bytes, &r)) {
        (void)c.WatchOpened(r);
        c.WatchClosed(r);
      }
      break;
    }
    case 5: {
      v1::SubmitJobRequest r;
      if (!Decode(bytes, &r)) break;
      if (auto id = c.SubmitJob(r); id.ok()) jobs.Add(*id);
      break;
    }
    case 6: {
      v1::GetJobRequest r;
      if (!Decode(bytes, &r)) break;
      jobs.Resolve(r.mutable_job_id());
      (void)c.GetJob(r.job_id());
      break;
    }
    case 7: {
      v1::ListJobsRequest r;
      if (Decode(bytes, &r)) (void)c.ListJobs(r);
      break;
    }
    case 8: {
      v1::CancelJobRequest r;
      if (!Decode(bytes, &r)) break;
      jobs.Resolve(r.mutable_job_id());
      (void)c.CancelJob(r.job_id());
      break;
    }
    case 9:
      (void)c.ListWorkers();
      break;
    case 10: {
      v1::ReadLogsRequest r;
      if (!Decode(bytes, &r)) break;
      jobs.Resolve(r.mutable_job_id());
      (void)c.ReadLogs(r);
      break;
    }
    case 11:
      // Time passes: leases expire, hangs are noticed, pending jobs are placed.
      clock.AdvanceMs(bytes.empty() ? 1000 : 100 * static_cast<uint8_t>(bytes[0]));
      c.Tick();
      break;
  }
}

}  // namespace

int FuzzCoordinator(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    // A log line per request (and protobuf's per invalid UTF-8 string) would drown libFuzzer's.
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  FakeClock clock;
  coordinator::CoordinatorOptions options;
  options.state_dir = FreshScratchDir();
  coordinator::CoordinatorDeps deps;
  deps.store = std::make_unique<NullStore>();
  deps.fatal = [](const Status&) {};  // NullStore never fails
  auto c = Coordinator::Open(options, &clock, std::move(deps));
  if (!c.ok()) {
    std::fprintf(stderr, "fuzz harness: %s\n", c.status().ToString().c_str());
    std::abort();
  }
  JobIds jobs;
  size_t pos = 0;
  while (pos + 3 <= size) {
    const uint8_t op = data[pos];
    const size_t len = std::min<size_t>(data[pos + 1] | (data[pos + 2] << 8), size - pos - 3);
    Call(**c, clock, jobs, op, {reinterpret_cast<const char*>(data + pos + 3), len});
    pos += 3 + len;
  }
  (void)(*c)->Flush();
  return 0;
}

}  // namespace drover::fuzz
