// The NCCL emulator (tests/cuda_emu/README.md): NCCL's calls as the NCCL communicator uses
// them, between processes (or threads) on one machine, through a shared-memory file named in
// the unique id. As on a GPU, a call only enqueues its work on the stream it is given (the
// stream's own thread runs it: runtime.cc's Stream), so the caller learns of completion
// from cudaStreamQuery / cudaEventQuery and of failure from ncclCommGetAsyncError.
//
// What it holds the caller to, as NCCL would:
// - every buffer lies inside one emulated device allocation (a host pointer fails the call:
//   on a GPU it would be an illegal address);
// - no two ranks of a communicator are on one GPU (the first entry of each process's
//   CUDA_VISIBLE_DEVICES): the communicator fails with ncclInvalidUsage once all joined;
// - a send completes only once the peer has posted its receive, and the pair's messages
//   match in call order (no tags), so two ranks that both send first deadlock (until the
//   emulator's time limit: ncclSystemError) as they would on GPUs;
// - a nonblocking communicator is in progress until every rank joined, so the caller's
//   own connect deadline applies; an aborted peer fails waiting calls with ncclRemoteError
//   (kinder than NCCL, whose peers wait for their own deadline).
// Reductions add the ranks' contributions in rank order on every rank: results are
// bitwise identical everywhere, as the Communicator contract requires.
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "nccl.h"

namespace {

constexpr size_t kSlotBytes = size_t{4} << 20;  // per rank: one chunk of a collective
constexpr size_t kRingBytes = size_t{1} << 20;  // per ordered pair of ranks: point to point
constexpr int kMaxRanks = 64;
constexpr uint64_t kMagic = 0x6e63636c2d656d75;  // "nccl-emu"

struct Mailbox {                   // messages from one rank to another
  uint64_t written = 0, read = 0;  // bytes through the ring
  uint64_t receives_posted = 0, sends_started = 0;
};

struct Shared {
  uint64_t magic;
  pthread_mutex_t mu;
  uint32_t changes;  // bumped at every change a waiter may want (Notify); a futex word
  int nranks;
  int joined;
  int aborted;
  int arrived;          // at the current barrier
  uint64_t generation;  // of barriers passed
  char bus_ids[kMaxRanks][32];
  Mailbox boxes[kMaxRanks * kMaxRanks];  // [from * nranks + to]
};

size_t HeaderBytes() { return (sizeof(Shared) + 4095) / 4096 * 4096; }
size_t TotalBytes(int n) {
  return HeaderBytes() + n * kSlotBytes + static_cast<size_t>(n) * n * kRingBytes;
}

// How long a call may wait for its peers before it fails as NCCL's watchdog would.
timespec Deadline() {
  const char* env = std::getenv("DROVER_EMU_NCCL_TIMEOUT_MS");
  const long ms = env != nullptr ? std::atol(env) : 60'000;
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (ms % 1000) * 1'000'000;
  if (t.tv_nsec >= 1'000'000'000) {
    t.tv_sec += 1;
    t.tv_nsec -= 1'000'000'000;
  }
  return t;
}

std::string MyBusId() {
  char id[32] = {0};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), 0) != cudaSuccess) return "none";
  return id;
}

}  // namespace

struct ncclComm {
  std::string path;
  int fd = -1;
  Shared* shared = nullptr;
  size_t bytes = 0;
  int rank = 0;
  int n = 0;
  std::atomic<ncclResult_t> error{ncclSuccess};  // the first failure, sticky
  std::atomic<int> in_flight{0};                 // enqueued calls not yet run

  char* Slot(int r) const {
    return reinterpret_cast<char*>(shared) + HeaderBytes() + r * kSlotBytes;
  }
  char* Ring(int from, int to) const {
    return reinterpret_cast<char*>(shared) + HeaderBytes() + n * kSlotBytes +
           (static_cast<size_t>(from) * n + to) * kRingBytes;
  }
  Mailbox& Box(int from, int to) const { return shared->boxes[from * n + to]; }
};

namespace {

void Lock(ncclComm* c) { pthread_mutex_lock(&c->shared->mu); }
void Unlock(ncclComm* c) { pthread_mutex_unlock(&c->shared->mu); }

// Ranks wake each other through a futex on a counter in the shared memory, not a
// process-shared condition variable: glibc's broadcast waits for the waiters it woke to
// take their turn, so a rank stopped (SIGSTOP) inside a wait would block every other
// rank's broadcast, its abort included, where NCCL's own abort never waits for a peer.
void Notify(Shared* s) {
  __atomic_add_fetch(&s->changes, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, &s->changes, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// With the lock held: releases it until a Notify (or 10 ms), then takes it again. The count
// is read before the lock is released, so a Notify in between is not missed.
void WaitForChange(Shared* s) {
  const uint32_t seen = __atomic_load_n(&s->changes, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&s->mu);
  timespec slice{0, 10'000'000};
  syscall(SYS_futex, &s->changes, FUTEX_WAIT, seen, &slice, nullptr, 0);
  pthread_mutex_lock(&s->mu);
}

bool Aborted(const Shared* s) { return __atomic_load_n(&s->aborted, __ATOMIC_SEQ_CST) != 0; }

// With the lock held: waits until `ready` (ncclSuccess), a peer aborted (ncclRemoteError) or
// the time limit passed (ncclSystemError).
template <typename Ready>
ncclResult_t WaitFor(ncclComm* c, Ready ready) {
  const timespec deadline = Deadline();
  while (!ready()) {
    if (Aborted(c->shared)) return ncclRemoteError;
    WaitForChange(c->shared);
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    const bool late = now.tv_sec > deadline.tv_sec ||
                      (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec);
    if (late && !ready()) {
      std::fprintf(stderr, "NCCL emulator: rank %d of %d waited past the time limit\n", c->rank,
                   c->n);
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

ncclResult_t Barrier(ncclComm* c) {
  Lock(c);
  Shared* s = c->shared;
  ncclResult_t result = ncclSuccess;
  if (++s->arrived == c->n) {
    s->arrived = 0;
    ++s->generation;
    Notify(s);
  } else {
    const uint64_t generation = s->generation;
    result = WaitFor(c, [&] { return s->generation != generation; });
  }
  Unlock(c);
  return result;
}

size_t SizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

template <typename T>
void ReduceAs(char* out, const std::vector<const char*>& parts, size_t count, ncclRedOp_t op) {
  auto* o = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T acc = reinterpret_cast<const T*>(parts[0])[i];
    for (size_t r = 1; r < parts.size(); ++r) acc += reinterpret_cast<const T*>(parts[r])[i];
    o[i] = op == ncclAvg ? acc / static_cast<T>(parts.size()) : acc;
  }
}

// out[i] = the ranks' parts[r][i] summed in rank order (averaged for ncclAvg).
void Reduce(char* out, const std::vector<const char*>& parts, size_t count, ncclDataType_t type,
            ncclRedOp_t op) {
  if (type == ncclFloat32) {
    ReduceAs<float>(out, parts, count, op);
  } else {
    ReduceAs<double>(out, parts, count, op);
  }
}

ncclResult_t Fail(ncclComm* c, ncclResult_t result) {
  ncclResult_t none = ncclSuccess;
  if (c != nullptr) c->error.compare_exchange_strong(none, result);
  return result;
}

// The checks every call makes; ncclSuccess to go on.
ncclResult_t Usable(ncclComm* c) {
  if (c == nullptr) return ncclInvalidArgument;
  if (c->error != ncclSuccess) return c->error;
  Lock(c);
  const bool joined = c->shared->joined == c->n;
  Unlock(c);
  return joined ? ncclSuccess : ncclInvalidUsage;
}

ncclResult_t DeviceBuffer(ncclComm* c, const char* call, const void* p, size_t bytes) {
  if (drover_emu::InDeviceMemory(p, bytes)) return ncclSuccess;
  std::fprintf(stderr, "NCCL emulator: %s on rank %d: %p (%zu bytes) is not device memory\n", call,
               c->rank, p, bytes);
  return Fail(c, ncclInvalidArgument);
}

bool Reducible(ncclDataType_t type, ncclRedOp_t op) {
  return (type == ncclFloat32 || type == ncclFloat64) && (op == ncclSum || op == ncclAvg);
}

// Enqueues `calls` on `stream` as one piece of work, run in order until one fails; a failure
// becomes the communicator's asynchronous error.
void Launch(ncclComm* c, cudaStream_t stream, std::vector<std::function<ncclResult_t()>> calls) {
  ++c->in_flight;
  drover_emu::EnqueueOnStream(stream, [c, calls = std::move(calls)] {
    for (const auto& call : calls) {
      if (c->error != ncclSuccess) break;
      const ncclResult_t result = call();
      if (result != ncclSuccess) {
        Fail(c, result);
        break;
      }
    }
    --c->in_flight;
  });
}

// Calls inside ncclGroupStart / ncclGroupEnd are enqueued together at the end, in call order
// (per thread, as NCCL's groups are).
thread_local int t_group_depth = 0;
thread_local std::vector<std::function<ncclResult_t()>> t_grouped;
thread_local ncclComm* t_group_comm = nullptr;
thread_local cudaStream_t t_group_stream = nullptr;

ncclResult_t Submit(ncclComm* c, cudaStream_t stream, std::function<ncclResult_t()> call) {
  if (t_group_depth > 0) {
    t_grouped.push_back(std::move(call));
    t_group_comm = c;
    t_group_stream = stream;
    return ncclSuccess;
  }
  Launch(c, stream, {std::move(call)});
  return ncclSuccess;
}

// Waits until the communicator's enqueued calls have run (or given up).
void Quiesce(ncclComm* c) {
  while (c->in_flight > 0) usleep(1000);
}

// Each rank puts `chunk(rank)` (bytes) in its slot; after a barrier `use(slots)` reads them;
// a second barrier frees the slots for the next chunk.
ncclResult_t Exchange(ncclComm* c, const std::function<void(char*)>& put,
                      const std::function<void(const std::vector<const char*>&)>& use) {
  put(c->Slot(c->rank));
  ncclResult_t result = Barrier(c);
  if (result != ncclSuccess) return Fail(c, result);
  std::vector<const char*> slots(c->n);
  for (int r = 0; r < c->n; ++r) slots[r] = c->Slot(r);
  use(slots);
  result = Barrier(c);
  return result == ncclSuccess ? ncclSuccess : Fail(c, result);
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error (emulated)";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (emulated)";
    case ncclSystemError:
      return "unhandled system error: a peer did not take part in time (emulated)";
    case ncclInternalError:
      return "internal error (emulated)";
    case ncclInvalidArgument:
      return "invalid argument (emulated)";
    case ncclInvalidUsage:
      return "invalid usage (emulated)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulated: a peer aborted)";
    case ncclInProgress:
      return "NCCL operation in progress (emulated)";
  }
  return "unknown result (emulated)";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int> counter{0};
  std::random_device random;
  const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "%s/drover-nccl-emu-%d-%d-%08x", dir,
                static_cast<int>(getpid()), counter++, random());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* c = new ncclComm;
  c->path.assign(id.internal, strnlen(id.internal, sizeof(id.internal)));
  c->rank = rank;
  c->n = nranks;
  c->bytes = TotalBytes(nranks);
  c->fd = open(c->path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (c->fd < 0) {
    delete c;
    return ncclSystemError;
  }
  // The first rank to lock the empty file lays it out; the others map what it made.
  flock(c->fd, LOCK_EX);
  struct stat st {};
  fstat(c->fd, &st);
  const bool first = st.st_size == 0;
  if (first && ftruncate(c->fd, static_cast<off_t>(c->bytes)) != 0) {
    flock(c->fd, LOCK_UN);
    close(c->fd);
    delete c;
    return ncclSystemError;
  }
  void* map = mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
  if (map == MAP_FAILED) {
    flock(c->fd, LOCK_UN);
    close(c->fd);
    delete c;
    return ncclSystemError;
  }
  c->shared = static_cast<Shared*>(map);
  if (first) {
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&c->shared->mu, &ma);
    c->shared->nranks = nranks;
    c->shared->magic = kMagic;
  }
  flock(c->fd, LOCK_UN);
  if (c->shared->magic != kMagic || c->shared->nranks != nranks) {
    munmap(map, c->bytes);
    close(c->fd);
    delete c;
    return ncclInvalidUsage;
  }
  Lock(c);
  std::snprintf(c->shared->bus_ids[rank], sizeof(c->shared->bus_ids[rank]), "%s",
                MyBusId().c_str());
  // Every rank has the file mapped once all joined: its name is no longer needed.
  if (++c->shared->joined == nranks) unlink(c->path.c_str());
  Notify(c->shared);
  ncclResult_t result = ncclSuccess;
  if (config == nullptr || config->blocking) {
    result = WaitFor(c, [&] { return c->shared->joined == nranks; });
  }
  Unlock(c);
  *out = c;
  if (result != ncclSuccess) return Fail(c, result);
  return config != nullptr && !config->blocking ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  if (c == nullptr) return ncclInvalidArgument;
  if (c->error != ncclSuccess) {
    *state = c->error;
    return ncclSuccess;
  }
  Lock(c);
  Shared* s = c->shared;
  *state = s->aborted ? ncclRemoteError : s->joined < c->n ? ncclInProgress : ncclSuccess;
  for (int a = 0; a < c->n && *state == ncclSuccess; ++a) {
    for (int b = a + 1; b < c->n; ++b) {
      if (std::strcmp(s->bus_ids[a], s->bus_ids[b]) == 0) {
        std::fprintf(stderr,
                     "NCCL emulator: Duplicate GPU detected: ranks %d and %d are both on %s\n", a,
                     b, s->bus_ids[a]);
        *state = ncclInvalidUsage;
        break;
      }
    }
  }
  Unlock(c);
  if (*state != ncclSuccess && *state != ncclInProgress) Fail(c, *state);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  return c == nullptr ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == nullptr) return ncclInvalidArgument;
  Quiesce(c);
  munmap(c->shared, c->bytes);
  close(c->fd);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c == nullptr) return ncclInvalidArgument;
  // Without the lock: a peer stopped while holding it must not keep this rank from aborting.
  __atomic_store_n(&c->shared->aborted, 1, __ATOMIC_SEQ_CST);
  const bool all_joined = __atomic_load_n(&c->shared->joined, __ATOMIC_SEQ_CST) == c->n;
  Notify(c->shared);
  if (!all_joined) unlink(c->path.c_str());  // nobody else will
  return ncclCommDestroy(c);
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<std::function<ncclResult_t()>> calls = std::move(t_grouped);
  t_grouped.clear();
  if (!calls.empty()) Launch(t_group_comm, t_group_stream, std::move(calls));
  return ncclSuccess;
}

namespace {

// Every rank's `send` (count elements) reduced in rank order into `recv` (null: this rank
// only contributes), a slot's worth at a time.
ncclResult_t ReduceInChunks(ncclComm_t c, const void* send, void* recv, size_t count,
                            ncclDataType_t type, ncclRedOp_t op) {
  const size_t es = SizeOf(type), per = kSlotBytes / es;
  for (size_t off = 0; off < count; off += per) {
    const size_t k = std::min(per, count - off);
    ncclResult_t r = Exchange(
        c,
        [&](char* slot) { std::memcpy(slot, static_cast<const char*>(send) + off * es, k * es); },
        [&](const std::vector<const char*>& slots) {
          if (recv != nullptr) Reduce(static_cast<char*>(recv) + off * es, slots, k, type, op);
        });
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (!Reducible(type, op)) return Fail(c, ncclInvalidArgument);
  const size_t es = SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclAllReduce", send, count * es); r != ncclSuccess)
    return r;
  if (ncclResult_t r = DeviceBuffer(c, "ncclAllReduce", recv, count * es); r != ncclSuccess)
    return r;
  return Submit(c, stream, [=] { return ReduceInChunks(c, send, recv, count, type, op); });
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (!Reducible(type, op) || root < 0 || root >= c->n) return Fail(c, ncclInvalidArgument);
  const size_t es = SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclReduce", send, count * es); r != ncclSuccess) return r;
  if (c->rank == root) {
    if (ncclResult_t r = DeviceBuffer(c, "ncclReduce", recv, count * es); r != ncclSuccess)
      return r;
  }
  void* out = c->rank == root ? recv : nullptr;
  return Submit(c, stream, [=] { return ReduceInChunks(c, send, out, count, type, op); });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (!Reducible(type, op)) return Fail(c, ncclInvalidArgument);
  const size_t es = SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclReduceScatter", send, recv_count * c->n * es);
      r != ncclSuccess) {
    return r;
  }
  if (ncclResult_t r = DeviceBuffer(c, "ncclReduceScatter", recv, recv_count * es);
      r != ncclSuccess) {
    return r;
  }
  return Submit(c, stream, [=]() -> ncclResult_t {
    const size_t per = kSlotBytes / (es * c->n);
    for (size_t off = 0; off < recv_count; off += per) {
      const size_t k = std::min(per, recv_count - off);
      ncclResult_t r = Exchange(
          c,
          [&](char* slot) {
            for (int j = 0; j < c->n; ++j) {
              std::memcpy(slot + j * k * es,
                          static_cast<const char*>(send) + (j * recv_count + off) * es, k * es);
            }
          },
          [&](const std::vector<const char*>& slots) {
            std::vector<const char*> mine(slots.size());
            for (size_t s = 0; s < slots.size(); ++s) mine[s] = slots[s] + c->rank * k * es;
            Reduce(static_cast<char*>(recv) + off * es, mine, k, type, op);
          });
      if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t c, cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  const size_t es = SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclAllGather", send, send_count * es); r != ncclSuccess) {
    return r;
  }
  if (ncclResult_t r = DeviceBuffer(c, "ncclAllGather", recv, send_count * c->n * es);
      r != ncclSuccess) {
    return r;
  }
  return Submit(c, stream, [=]() -> ncclResult_t {
    const size_t per = kSlotBytes / es;
    for (size_t off = 0; off < send_count; off += per) {
      const size_t k = std::min(per, send_count - off);
      ncclResult_t r = Exchange(
          c,
          [&](char* slot) { std::memcpy(slot, static_cast<const char*>(send) + off * es, k * es); },
          [&](const std::vector<const char*>& slots) {
            for (int j = 0; j < c->n; ++j) {
              std::memcpy(static_cast<char*>(recv) + (j * send_count + off) * es, slots[j], k * es);
            }
          });
      if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t c, cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (root < 0 || root >= c->n) return Fail(c, ncclInvalidArgument);
  const size_t es = SizeOf(type);
  if (c->rank == root) {
    if (ncclResult_t r = DeviceBuffer(c, "ncclBroadcast", send, count * es); r != ncclSuccess) {
      return r;
    }
  }
  if (ncclResult_t r = DeviceBuffer(c, "ncclBroadcast", recv, count * es); r != ncclSuccess)
    return r;
  return Submit(c, stream, [=]() -> ncclResult_t {
    const size_t per = kSlotBytes / es;
    for (size_t off = 0; off < count; off += per) {
      const size_t k = std::min(per, count - off);
      ncclResult_t r = Exchange(
          c,
          [&](char* slot) {
            if (c->rank == root)
              std::memcpy(slot, static_cast<const char*>(send) + off * es, k * es);
          },
          [&](const std::vector<const char*>& slots) {
            std::memmove(static_cast<char*>(recv) + off * es, slots[root], k * es);
          });
      if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (peer < 0 || peer >= c->n || peer == c->rank) return Fail(c, ncclInvalidArgument);
  const size_t bytes = count * SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclSend", send, bytes); r != ncclSuccess) return r;
  return Submit(c, stream, [=]() -> ncclResult_t {
    Mailbox& box = c->Box(c->rank, peer);
    char* ring = c->Ring(c->rank, peer);
    Lock(c);
    // A send starts only once its receive is posted (NCCL has no eager buffering to count on).
    const uint64_t index = box.sends_started++;
    ncclResult_t r = WaitFor(c, [&] { return box.receives_posted > index; });
    size_t done = 0;
    while (r == ncclSuccess && done < bytes) {
      r = WaitFor(c, [&] { return box.written - box.read < kRingBytes; });
      if (r != ncclSuccess) break;
      const size_t at = box.written % kRingBytes;
      const size_t chunk =
          std::min({bytes - done, kRingBytes - (box.written - box.read), kRingBytes - at});
      Unlock(c);
      std::memcpy(ring + at, static_cast<const char*>(send) + done, chunk);
      Lock(c);
      box.written += chunk;
      done += chunk;
      Notify(c->shared);
    }
    Unlock(c);
    return r == ncclSuccess ? ncclSuccess : Fail(c, r);
  });
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t stream) {
  if (ncclResult_t r = Usable(c); r != ncclSuccess) return r;
  if (peer < 0 || peer >= c->n || peer == c->rank) return Fail(c, ncclInvalidArgument);
  const size_t bytes = count * SizeOf(type);
  if (ncclResult_t r = DeviceBuffer(c, "ncclRecv", recv, bytes); r != ncclSuccess) return r;
  return Submit(c, stream, [=]() -> ncclResult_t {
    Mailbox& box = c->Box(peer, c->rank);
    const char* ring = c->Ring(peer, c->rank);
    Lock(c);
    ++box.receives_posted;
    Notify(c->shared);
    ncclResult_t r = ncclSuccess;
    size_t done = 0;
    while (done < bytes) {
      r = WaitFor(c, [&] { return box.written > box.read; });
      if (r != ncclSuccess) break;
      const size_t at = box.read % kRingBytes;
      const size_t chunk =
          std::min({bytes - done, size_t(box.written - box.read), kRingBytes - at});
      Unlock(c);
      std::memcpy(static_cast<char*>(recv) + done, ring + at, chunk);
      Lock(c);
      box.read += chunk;
      done += chunk;
      Notify(c->shared);
    }
    Unlock(c);
    return r == ncclSuccess ? ncclSuccess : Fail(c, r);
  });
}
