#include "coordinator/rpc_metrics.h"

#include <chrono>
#include <string>

namespace drover::coordinator {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;
using grpc::experimental::ServerRpcInfo;

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(CoordinatorMetrics* metrics, ServerRpcInfo* info)
      : metrics_(metrics),
        // "/drover.v1.WorkerService/Heartbeat" -> "WorkerService/Heartbeat".
        method_(ShortName(info->method())),
        unary_(info->type() == ServerRpcInfo::Type::UNARY) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      start_ = std::chrono::steady_clock::now();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      // A stream's "duration" is its lifetime (an agent's Watch lasts for hours): only
      // unary calls are timed; every call is counted.
      metrics_->ObserveRpc(method_, GrpcCodeName(methods->GetSendStatus().error_code()),
                           unary_ ? seconds : -1);
    }
    methods->Proceed();
  }

 private:
  static std::string ShortName(const char* full) {
    std::string s = full == nullptr ? "unknown" : full;
    const size_t slash = s.rfind('/');
    const size_t dot = s.rfind('.', slash == std::string::npos ? std::string::npos : slash);
    if (dot != std::string::npos) s = s.substr(dot + 1);
    if (!s.empty() && s[0] == '/') s = s.substr(1);
    return s;
  }

  CoordinatorMetrics* const metrics_;
  const std::string method_;
  const bool unary_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(metrics_, info);
  }

 private:
  CoordinatorMetrics* const metrics_;
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RpcMetricsInterceptors(CoordinatorMetrics* metrics) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<Factory>(metrics));
  return v;
}

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::UNKNOWN:
      return "UNKNOWN";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN";
  }
}

}  // namespace drover::coordinator
