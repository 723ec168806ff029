#include "coordinator/grpc_status.h"

namespace drover::coordinator {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // drover's codes are numbered like gRPC's (common/status.h), so the cast is exact.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

}  // namespace drover::coordinator
