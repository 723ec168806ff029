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

namespace {
thread_local std::atomic<bool>* t_overlapped = nullptr;
}  // namespace

void OverlappedCalls::Enter(std::atomic<bool>* left_uncounted) { t_overlapped = left_uncounted; }

std::atomic<bool>* OverlappedCalls::Current() { return t_overlapped; }

Status Communicator::Send(const void* data, size_t bytes, int peer, uint64_t tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request, Isend(data, bytes, peer, tag));
  return request->Wait();
}

Status Communicator::Recv(void* data, size_t bytes, int peer, uint64_t tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request, Irecv(data, bytes, peer, tag));
  return request->Wait();
}

}  // namespace drover::engine::parallel
