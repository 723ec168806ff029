// The kernel emulator's stand-in for NCCL's header (tests/cuda_emu/README.md): the types and
// calls the NCCL communicator uses, run across processes (or threads) by nccl_emu.cc through
// shared memory. Enum values are NCCL's.
#pragma once

#include <cstddef>

#include "cuda_runtime_api.h"

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
};
enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
struct ncclComm;
using ncclComm_t = ncclComm*;

struct ncclConfig_t {
  int blocking;
  const char* commName;
};
#define NCCL_CONFIG_INITIALIZER \
  { 1, nullptr }

const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
