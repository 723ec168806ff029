#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {

size_t SizeOf(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kFloat64:
      return sizeof(double);
  }
  DROVER_CHECK_MSG(false, "unknown DataType");
}

Status Communicator::Send(const void* data, size_t bytes, int peer, uint64_t tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request, Isend(data, bytes, peer, tag));
  return request->Wait();
}

Status Communicator::Recv(void* data, size_t bytes, int peer, uint64_t tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request, Irecv(data, bytes, peer, tag));
  return request->Wait();
}

}  // namespace drover::engine::parallel
