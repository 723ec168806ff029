// RpcMetricsInterceptors: a gRPC server interceptor that counts every RPC the coordinator
// answers, by method and status code, and times the unary ones (CoordinatorMetrics).
//
// Installed only when the coordinator serves metrics (--http): an interceptor costs each
// call a few virtual calls and an allocation, and Heartbeat is the hot path.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

#include "coordinator/metrics.h"

namespace drover::coordinator {

// For ServerBuilder::experimental().SetInterceptorCreators. `metrics` must outlive the
// server.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RpcMetricsInterceptors(CoordinatorMetrics* metrics);

// "NOT_FOUND" for grpc::NOT_FOUND, and so on.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace drover::coordinator
