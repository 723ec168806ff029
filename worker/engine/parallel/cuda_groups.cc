#include "worker/engine/parallel/cuda_groups.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <span>

#include "worker/engine/kernels/cuda_backend.h"

namespace drover::engine::parallel {
namespace {

// The plugin's NCCL group as the engine uses it. The group lives in the plugin, with the
// plugin's own copy of OverlappedCalls' thread-local, which the engine's CommStream never
// sets; so this does from outside what GlooGroup::Count does inside: a call made beside the
// rank's compute (on a CommStream's thread) marks that thread's flag, and the wait the group
// counted for it is taken back out of wait_seconds(), for the stream to count what the rank
// stalled instead. A group is used by one thread at a time, so the group's wait that grew
// during a call is that call's. The group and the tally are shared with the requests, which
// the plugin lets outlive their group.
class OverlappedCallsLeftOut final : public Communicator {
 public:
  explicit OverlappedCallsLeftOut(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)), left_out_(std::make_shared<WaitTally>()) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    return LeftOutIfOverlapped([&] { return inner_->AllReduce(data, count, type, op); });
  }
  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    return LeftOutIfOverlapped([&] { return inner_->ReduceScatter(data, counts, type, op); });
  }
  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    return LeftOutIfOverlapped([&] { return inner_->AllGather(data, counts, type); });
  }
  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    return LeftOutIfOverlapped([&] { return inner_->Broadcast(data, count, type, root); });
  }
  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    return Wrapped(inner_->Isend(data, bytes, peer, tag));
  }
  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    return Wrapped(inner_->Irecv(data, bytes, peer, tag));
  }
  Status Barrier() override {
    return LeftOutIfOverlapped([&] { return inner_->Barrier(); });
  }
  Status Sync() override {
    return LeftOutIfOverlapped([&] { return inner_->Sync(); });
  }
  std::shared_ptr<const ComputeMark> MarkCompute() override { return inner_->MarkCompute(); }
  void FollowMark(std::shared_ptr<const ComputeMark> mark) override {
    inner_->FollowMark(std::move(mark));
  }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  double wait_seconds() const override { return inner_->wait_seconds() - left_out_->seconds(); }

 private:
  // A request's wait counts where it is waited for.
  class WrappedRequest final : public Request {
   public:
    WrappedRequest(std::shared_ptr<Communicator> group, std::shared_ptr<WaitTally> left_out,
                   std::unique_ptr<Request> inner)
        : group_(std::move(group)), left_out_(std::move(left_out)), inner_(std::move(inner)) {}
    Status Wait() override {
      return LeftOutIfOverlapped(*group_, *left_out_, [&] { return inner_->Wait(); });
    }

   private:
    const std::shared_ptr<Communicator> group_;
    const std::shared_ptr<WaitTally> left_out_;
    const std::unique_ptr<Request> inner_;
  };

  StatusOr<std::unique_ptr<Request>> Wrapped(StatusOr<std::unique_ptr<Request>> request) {
    if (!request.ok()) return request.status();
    return std::unique_ptr<Request>(new WrappedRequest(inner_, left_out_, std::move(*request)));
  }

  template <typename Call>
  Status LeftOutIfOverlapped(const Call& call) {
    return LeftOutIfOverlapped(*inner_, *left_out_, call);
  }
  // Runs `call` on `group`; on a CommStream's thread, what the group counted for it goes to
  // `left_out` and the thread's flag is set.
  template <typename Call>
  static Status LeftOutIfOverlapped(const Communicator& group, WaitTally& left_out,
                                    const Call& call) {
    std::atomic<bool>* overlapped = OverlappedCalls::Current();
    if (overlapped == nullptr) return call();
    const double before = group.wait_seconds();
    Status status = call();
    left_out.Add(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(group.wait_seconds() - before)));
    overlapped->store(true, std::memory_order_relaxed);
    return status;
  }

  const std::shared_ptr<Communicator> inner_;
  const std::shared_ptr<WaitTally> left_out_;  // the group's waits in calls beside the compute
};

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

StatusOr<CudaDevice> LocalCudaDevice() {
  ASSIGN_OR_RETURN(void* symbol, CudaPluginSymbol(kCudaDeviceSymbol));
  auto device_fn = reinterpret_cast<CudaDeviceFn>(symbol);
  char bus_id[64] = {0};
  int has_nccl = 0;
  char error[512] = {0};
  if (device_fn(kCudaOpsAbi, bus_id, sizeof(bus_id), &has_nccl, error, sizeof(error)) != 0) {
    return FailedPreconditionError(std::string("resources.device cuda: ") + error);
  }
  return CudaDevice{HostName() + "/" + bus_id, has_nccl != 0};
}

StatusOr<std::vector<CudaDevice>> ExchangeCudaDevices(KvStore* store, int rank, int world,
                                                      const CudaDevice& mine,
                                                      std::chrono::milliseconds timeout) {
  PrefixKvStore devices(store, "cuda_device");
  RETURN_IF_ERROR(devices.Set(std::to_string(rank), (mine.nccl ? "1" : "0") + mine.id));
  std::vector<CudaDevice> all(world);
  for (int r = 0; r < world; ++r) {
    StatusOr<std::string> value = devices.Get(std::to_string(r), timeout);
    if (!value.ok()) {
      return value.status().WithContext("learning rank " + std::to_string(r) + "'s GPU");
    }
    if (value->empty()) return InternalError("rank " + std::to_string(r) + " published no GPU");
    all[r] = CudaDevice{value->substr(1), (*value)[0] == '1'};
  }
  return all;
}

StatusOr<BackendChoice> ChooseNccl(const std::string& backend,
                                   const std::vector<CudaDevice>& devices) {
  if (backend == "gloo") return BackendChoice{false, "parallel.backend gloo"};
  std::string why_not;
  std::map<std::string, int> first_on;  // GPU -> the first rank on it
  for (int r = 0; r < static_cast<int>(devices.size()) && why_not.empty(); ++r) {
    if (!devices[r].nccl) {
      why_not = "rank " + std::to_string(r) + "'s CUDA backend was built without NCCL";
      break;
    }
    auto [it, fresh] = first_on.emplace(devices[r].id, r);
    if (!fresh) {
      why_not = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
                " share the GPU " + devices[r].id + ", and NCCL needs a GPU per rank";
    }
  }
  if (why_not.empty()) {
    return BackendChoice{true,
                         "every rank has a GPU of its own (parallel.backend " + backend + ")"};
  }
  if (backend == "nccl") {
    return FailedPreconditionError("parallel.backend nccl: " + why_not +
                                   " (auto or gloo stage the transfers through the host)");
  }
  return BackendChoice{false, why_not};
}

StatusOr<std::unique_ptr<Communicator>> ConnectNcclThroughPlugin(
    Ops* ops, KvStore* store, const std::string& group, int rank, int size,
    const CommOptions& options, std::chrono::milliseconds connect_timeout) {
  ASSIGN_OR_RETURN(void* symbol, CudaPluginSymbol(kConnectNcclSymbol));
  auto connect = reinterpret_cast<ConnectNcclFn>(symbol);
  Communicator* comm = nullptr;
  char error[1024] = {0};
  const int code =
      connect(kCudaOpsAbi, ops, store, group.c_str(), rank, size, options.timeout.count(),
              connect_timeout.count(), options.stream_ordered ? 1 : 0, &comm, error, sizeof(error));
  if (code != 0) return Status(static_cast<StatusCode>(code), error);
  return std::unique_ptr<Communicator>(
      new OverlappedCallsLeftOut(std::unique_ptr<Communicator>(comm)));
}

}  // namespace drover::engine::parallel
