#include "worker/engine/parallel/cuda_groups.h"

#include <unistd.h>

#include <map>

#include "worker/engine/kernels/cuda_backend.h"

namespace drover::engine::parallel {
namespace {

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
              connect_timeout.count(), &comm, error, sizeof(error));
  if (code != 0) return Status(static_cast<StatusCode>(code), error);
  return std::unique_ptr<Communicator>(comm);
}

}  // namespace drover::engine::parallel
