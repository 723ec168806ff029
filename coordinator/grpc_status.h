// drover Status -> grpc::Status, for the handlers of the services in coordinator/ (the
// other direction, for clients, is FromGrpcStatus in worker/grpc_util.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/status.h"

namespace drover::coordinator {

grpc::Status ToGrpcStatus(const Status& status);

}  // namespace drover::coordinator
