// The kernel emulator's runtime (tests/cuda_emu/README.md): fibers for the threads of a
// block, the CUDA runtime calls the kernel table makes (memory, copies, streams and events,
// the work running behind the host as on a GPU), and cuBLAS's GEMMs computed plainly.
#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"
#include "worker/engine/kernels/cpu/round.h"

namespace drover_emu {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "cuda emulator: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

constexpr size_t kStackBytes = 64 * 1024;

// Switching fibers: ucontext's swapcontext makes a system call per switch (it saves the
// signal mask), and a block's barrier switches every one of its threads, which made a
// 20-step training test take minutes. On x86-64 a switch is saved callee-saved registers and
// a stack pointer swap instead; elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void drover_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .type drover_emu_switch, @function
drover_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size drover_emu_switch, .-drover_emu_switch
)");
struct Context {
  void* sp = nullptr;
};
void Switch(Context* from, Context* to) { drover_emu_switch(&from->sp, to->sp); }
// A fresh stack whose first switch-in "returns" into entry(), as if called.
void Prepare(Context* c, char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                  // entry's own return address (never used)
  *--slot = reinterpret_cast<uint64_t>(entry);  // popped by the switch's ret
  for (int i = 0; i < 6; ++i) *--slot = 0;      // rbp rbx r12 r13 r14 r15
  uint32_t control[2];
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  --slot;
  std::memcpy(slot, control, 8);
  c->sp = slot;
}
#else
struct Context {
  ucontext_t uc;
};
void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
void Prepare(Context* c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

struct Fiber {
  Context context;
  ThreadIndex index;
  int warp = 0;
  bool done = false;
  // Waiting at a barrier until *generation moves past `waits_for` (nullptr: runnable). The
  // scheduler resumes a fiber only once it can go on: a switch costs a system call.
  const uint64_t* generation = nullptr;
  uint64_t waits_for = 0;
};
struct Warp {
  int live = 0, arrived = 0;
  uint64_t generation = 0;
  double slots[32] = {};
  float tile[256] = {};  // WarpTile()
};

// One block in flight on this host thread.
struct Block {
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0, arrived = 0;
  uint64_t generation = 0;
  uint64_t progress =
      0;  // bumped by every arrival, release and exit: no bump in a round = deadlock
  // Dynamic shared memory: `shared_bytes` from `shared`, 128-byte aligned inside the storage.
  std::vector<unsigned char> shared_storage;
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  bool synchronised = false;  // a barrier or shuffle ran
  bool direct = false;        // threads run as plain calls: they must not synchronise
  Fiber* current = nullptr;
  Context scheduler;
};

thread_local Block* g_block = nullptr;
thread_local ThreadIndex g_direct;  // the index of a thread run as a plain call
thread_local std::vector<std::unique_ptr<char[]>> g_stacks;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local uint64_t g_launches = 0;  // kernels run on this thread (Run's thread orders)

void Yield() { Switch(&g_block->current->context, &g_block->scheduler); }

void Release(Warp& w) {
  if (w.live > 0 && w.arrived == w.live) {
    w.arrived = 0;
    ++w.generation;
  }
}
void ReleaseBlock(Block& b) {
  if (b.live > 0 && b.arrived == b.live) {
    b.arrived = 0;
    ++b.generation;
  }
}

void CheckSynchronisable(const char* what) {
  if (g_block == nullptr) Die("a barrier outside a kernel");
  if (g_block->direct) {
    std::fprintf(stderr,
                 "cuda emulator: %s in a kernel whose first block never synchronised (its "
                 "blocks after the first run as plain calls)\n",
                 what);
    std::abort();
  }
  g_block->synchronised = true;
}

// Arrives at the barrier whose generation is *generation (already counted by the caller)
// and waits until it is released.
void Wait(const uint64_t* generation, uint64_t mine) {
  Fiber& f = *g_block->current;
  if (*generation != mine) return;  // this arrival released it
  f.generation = generation;
  f.waits_for = mine;
  Yield();
  f.generation = nullptr;
}

void WarpBarrier() {
  Block& b = *g_block;
  Warp& w = b.warps[b.current->warp];
  const uint64_t mine = w.generation;
  ++w.arrived;
  ++b.progress;
  Release(w);
  Wait(&w.generation, mine);
}

void Entry() {
  Block& b = *g_block;
  (*b.body)();
  Fiber& f = *b.current;
  f.done = true;
  ++b.progress;
  Warp& w = b.warps[f.warp];
  --w.live;
  Release(w);
  --b.live;
  ReleaseBlock(b);
  Yield();  // for good: the scheduler never resumes a finished fiber
  Die("a finished thread was resumed");
}

ThreadIndex IndexOf(unsigned t, dim3 block, uint3 block_index, dim3 grid) {
  ThreadIndex i;
  i.thread = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
  i.block = block_index;
  i.block_dim = block;
  i.grid_dim = grid;
  return i;
}

// A device leaves shared memory as the last block left it: NaN bytes make a kernel that
// reads what it never wrote show it.
void PoisonShared(Block& b) { std::fill(b.shared, b.shared + b.shared_bytes, 0xFF); }

// Runs the block's threads as fibers; `reverse`: the scheduler resumes them last to first.
void RunBlockAsFibers(Block& b, dim3 grid, dim3 block, uint3 block_index, bool reverse) {
  const unsigned n = block.x * block.y * block.z;
  PoisonShared(b);
  while (g_stacks.size() < n) g_stacks.push_back(std::make_unique<char[]>(kStackBytes));
  b.fibers.assign(n, Fiber{});
  b.warps.assign((n + 31) / 32, Warp{});
  b.live = static_cast<int>(n);
  b.arrived = 0;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.index = IndexOf(t, block, block_index, grid);
    f.warp = static_cast<int>(t / 32);
    ++b.warps[f.warp].live;
    Prepare(&f.context, g_stacks[t].get(), kStackBytes, Entry);
  }
  unsigned remaining = n;
  while (remaining > 0) {
    const uint64_t before = b.progress;
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = b.fibers[reverse ? n - 1 - i : i];
      if (f.done || (f.generation != nullptr && *f.generation == f.waits_for)) continue;
      b.current = &f;
      Switch(&b.scheduler, &f.context);
      if (f.done) --remaining;
    }
    if (remaining > 0 && b.progress == before) {
      Die("deadlock: the threads of a block wait at barriers that not all of them reach");
    }
  }
  b.current = nullptr;
}

}  // namespace

const ThreadIndex& Current() {
  if (g_block == nullptr) Die("a thread index read outside a kernel");
  return g_block->direct ? g_direct : g_block->current->index;
}

void SyncThreads() {
  CheckSynchronisable("__syncthreads");
  Block& b = *g_block;
  const uint64_t mine = b.generation;
  ++b.arrived;
  ++b.progress;
  ReleaseBlock(b);
  Wait(&b.generation, mine);
}

void SyncWarp() {
  CheckSynchronisable("__syncwarp");
  WarpBarrier();
}

unsigned Lane() {
  if (g_block == nullptr || g_block->direct)
    Die("a warp-wide operation outside a synchronised kernel");
  return static_cast<unsigned>(g_block->current - g_block->fibers.data()) % 32;
}

float* WarpTile() {
  CheckSynchronisable("a warp-wide matrix operation");
  return g_block->warps[g_block->current->warp].tile;
}

unsigned char* DynamicShared() {
  if (g_block == nullptr) Die("dynamic shared memory outside a kernel");
  return g_block->shared;
}

double ShuffleXor(double value, int offset) {
  CheckSynchronisable("a warp shuffle");
  Block& b = *g_block;
  const unsigned lane = static_cast<unsigned>(b.current - b.fibers.data()) % 32;
  Warp& w = b.warps[b.current->warp];
  w.slots[lane] = value;
  WarpBarrier();  // every lane has stored
  const double got = w.slots[lane ^ static_cast<unsigned>(offset)];
  WarpBarrier();  // every lane has read, before any stores again
  return got;
}

std::mutex g_attributes_mu;
std::map<const void*, int>& MaxDynamicShared() {  // GUARDED_BY(g_attributes_mu)
  static auto* limits = new std::map<const void*, int>;
  return *limits;
}
constexpr int kDefaultDynamicShared = 48 * 1024;
// The device's opt-in limit: sm_90's 227 KiB, or DROVER_EMU_SHARED_OPTIN bytes to stand in
// for a GPU with less (sm_86/sm_89: 101376, sm_80: 166912).
int OptInDynamicShared() {
  static const int bytes = [] {
    const char* env = std::getenv("DROVER_EMU_SHARED_OPTIN");
    return env != nullptr ? std::atoi(env) : 227 * 1024;
  }();
  return bytes;
}

bool LaunchAccepted(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
    g_last_error = cudaErrorInvalidValue;  // "invalid configuration argument" on a device
    return false;
  }
  int allowed = kDefaultDynamicShared;
  {
    std::lock_guard<std::mutex> lock(g_attributes_mu);
    auto it = MaxDynamicShared().find(kernel);
    if (it != MaxDynamicShared().end()) allowed = std::max(allowed, it->second);
  }
  if (shared_bytes > static_cast<size_t>(allowed)) {
    g_last_error = cudaErrorInvalidValue;  // "too many resources requested for launch"
    return false;
  }
  return true;
}

void Run(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  if (g_block != nullptr) Die("a kernel launched from inside a kernel");
  Block b;
  b.body = &body;
  b.shared_storage.resize(shared_bytes + 128);
  const auto at = reinterpret_cast<uintptr_t>(b.shared_storage.data());
  b.shared = b.shared_storage.data() + (128 - at % 128) % 128;
  b.shared_bytes = shared_bytes;
  g_block = &b;
  // A GPU promises no order among a block's threads between barriers (warps interleave,
  // and since Volta a warp's lanes may too): the threads run first to last in every other
  // block and last to first in the rest, so a thread that reads what another writes without
  // a barrier between them reads it too early in one order or the other.
  const uint64_t launch = g_launches++;
  bool first = true;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        const uint3 block_index{x, y, z};
        const bool reverse = (launch + x + y + z) % 2 == 1;
        if (first || b.synchronised) {
          RunBlockAsFibers(b, grid, block, block_index, reverse);
        } else {
          // The first block never synchronised: the rest run as plain calls, far faster;
          // a barrier met there aborts (CheckSynchronisable) rather than misbehave.
          b.direct = true;
          PoisonShared(b);
          for (unsigned i = 0; i < threads; ++i) {
            g_direct = IndexOf(reverse ? threads - 1 - i : i, block, block_index, grid);
            body();
          }
        }
        first = false;
      }
    }
  }
  g_block = nullptr;
}

int SetMaxDynamicShared(const void* func, int value) {
  if (func == nullptr || value < 0 || value > OptInDynamicShared()) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(g_attributes_mu);
  MaxDynamicShared()[func] = value;
  return cudaSuccess;
}

}  // namespace drover_emu

// ---- the CUDA runtime --------------------------------------------------------------------
namespace {

std::mutex g_memory_mu;
std::map<const char*, size_t>& Allocations(bool device) {  // start -> bytes
  static std::map<const char*, size_t> device_memory, pinned_memory;
  return device ? device_memory : pinned_memory;
}
bool Inside(const std::map<const char*, size_t>& m, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c < it->first + it->second;
}
// Whether the column-major matrix (rows, cols, ld) at p lies inside one device allocation:
// a GEMM that reaches past it would read or write memory it does not own on a GPU.
bool InOneDeviceAllocation(const void* p, int rows, int cols, int ld,
                           size_t element_bytes = sizeof(float)) {
  if (rows == 0 || cols == 0) return true;
  const size_t bytes = (static_cast<size_t>(cols - 1) * ld + rows) * element_bytes;
  std::lock_guard<std::mutex> lock(g_memory_mu);
  const auto& m = Allocations(true);
  const char* c = reinterpret_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c + bytes <= it->first + it->second;
}
// Guard bytes around every allocation, from its last byte asked for to 256 bytes past its
// rounded end and 256 bytes before it: a kernel or copy that writes past its buffer changes
// them, which a GPU would let pass silently (or fault on, far from the cause). Checked when
// the memory is freed and at every stream synchronisation (CheckGuards).
// The guard bytes read as NaN in every type a kernel loads (0x7FFF: bf16 and fp16 NaN;
// 0x7FFF7FFF: fp32's), so a read past a buffer poisons what it computes.
constexpr size_t kGuardBytes = 256;
unsigned char GuardByte(const unsigned char* at) {
  return reinterpret_cast<uintptr_t>(at) % 2 == 0 ? 0xFF : 0x7F;
}
void FillGuard(unsigned char* from, unsigned char* to) {
  for (unsigned char* g = from; g < to; ++g) *g = GuardByte(g);
}

size_t Rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + 255) / 256 * 256; }

// The first guard byte of the allocation (p, bytes) that was overwritten, or null.
const unsigned char* BrokenGuard(const char* p, size_t bytes) {
  const auto* base = reinterpret_cast<const unsigned char*>(p) - kGuardBytes;
  const auto* after = reinterpret_cast<const unsigned char*>(p) + bytes;
  const auto* end = reinterpret_cast<const unsigned char*>(p) + Rounded(bytes) + kGuardBytes;
  for (const auto* g = base; g < base + kGuardBytes; ++g) {
    if (*g != GuardByte(g)) return g;
  }
  for (const auto* g = after; g < end; ++g) {
    if (*g != GuardByte(g)) return g;
  }
  return nullptr;
}

void DieOfBrokenGuard(const char* p, size_t bytes, bool device, const unsigned char* g) {
  const auto at = reinterpret_cast<const char*>(g) - p;
  std::fprintf(stderr,
               "cuda emulator: a write outside the %s allocation of %zu bytes at %p: byte %td "
               "(%s)\n",
               device ? "device" : "pinned", bytes, static_cast<const void*>(p), at,
               at < 0 ? "before its start" : "past its end");
  std::fflush(stderr);
  std::abort();
}

// Every live allocation's guards are whole (the caller holds no lock).
void CheckGuards() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  for (const bool device : {true, false}) {
    for (const auto& [p, bytes] : Allocations(device)) {
      if (const unsigned char* g = BrokenGuard(p, bytes)) DieOfBrokenGuard(p, bytes, device, g);
    }
  }
}

// 256-byte aligned, as cudaMalloc's, and filled with NaN bytes: neither call promises
// initialised memory (a device's is often zero when fresh and holds old data when reused),
// so code that reads what it never wrote shows it, as compute-sanitizer's initcheck would.
cudaError_t Allocate(void** p, size_t bytes, bool device) {
  const size_t rounded = Rounded(bytes);
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(256, rounded + 2 * kGuardBytes));
  if (base == nullptr) return cudaErrorMemoryAllocation;
  unsigned char* start = base + kGuardBytes;
  FillGuard(base, start);
  std::memset(start, 0xFF, bytes);
  FillGuard(start + bytes, start + rounded + kGuardBytes);
  *p = start;
  std::lock_guard<std::mutex> lock(g_memory_mu);
  Allocations(device)[reinterpret_cast<const char*>(start)] = bytes;
  return cudaSuccess;
}
cudaError_t Release(void* p, bool device) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_memory_mu);
  const char* c = static_cast<const char*>(p);
  auto it = Allocations(device).find(c);
  if (it == Allocations(device).end()) return cudaErrorInvalidValue;
  if (const unsigned char* g = BrokenGuard(c, it->second))
    DieOfBrokenGuard(c, it->second, device, g);
  Allocations(device).erase(it);
  std::free(static_cast<char*>(p) - kGuardBytes);
  return cudaSuccess;
}

// How streams run their work (DROVER_EMU_STREAMS):
//  - "deferred" (the default): as a GPU runs it, behind the host. Work waits in its stream
//    until something needs it done: a synchronisation, a query, a wait on an event behind it,
//    another stream's wait that reaches it, or DeferralLimit() passing (a GPU gets to its work
//    by itself; without that limit two processes could each wait for the other's stream).
//    So a host read without a synchronisation, a stream that should have waited for an event
//    and memory reused while a kernel still reads it all see stale or changed data, and the
//    tests' comparisons fail, as they would on a GPU.
//  - "sync": device work runs at the call, after what its stream holds (the NCCL emulator's
//    collectives still run on the stream's thread). A test that passes so and fails deferred
//    is missing a stream ordering.
enum class StreamMode { kDeferred, kSync };
StreamMode Mode() {
  static const StreamMode mode = [] {
    const char* env = std::getenv("DROVER_EMU_STREAMS");
    if (env == nullptr || std::strcmp(env, "deferred") == 0) return StreamMode::kDeferred;
    if (std::strcmp(env, "sync") == 0) return StreamMode::kSync;
    drover_emu::Die("DROVER_EMU_STREAMS must be deferred or sync");
  }();
  return mode;
}
// How long work waits to be needed before its stream runs it anyway: 50 ms, or
// DROVER_EMU_DEFER_MS (the emulator's own tests wait for ever, to be deterministic).
std::chrono::milliseconds DeferralLimit() {
  static const std::chrono::milliseconds limit = [] {
    const char* env = std::getenv("DROVER_EMU_DEFER_MS");
    return std::chrono::milliseconds(env != nullptr ? std::atoll(env) : 50);
  }();
  return limit;
}

class Stream;
std::mutex g_streams_mu;
std::set<Stream*>& Streams() {  // GUARDED_BY(g_streams_mu): every live stream
  static auto* streams = new std::set<Stream*>;
  return *streams;
}

// A stream: its work runs in order on a thread of its own, once it is due (StreamMode).
// Tickets count the work enqueued: ticket t is done once the t-th piece has run.
class Stream {
 public:
  using Clock = std::chrono::steady_clock;

  Stream() {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    Streams().insert(this);
  }
  // cudaStreamDestroy: the work enqueued runs first, and the stream is kept (a few bytes), so
  // that a wait enqueued elsewhere on an event recorded here may still ask it.
  void Retire() {
    {
      std::lock_guard<std::mutex> lock(g_streams_mu);
      Streams().erase(this);
    }
    WaitIdle();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // Returns the work's ticket.
  uint64_t Enqueue(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
    queue_.push_back({std::move(work), Clock::now()});
    changed_.notify_all();
    return ++enqueued_;
  }
  uint64_t last() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }
  bool Done(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= ticket;
  }
  // Has the work up to `ticket` run as soon as it can, without waiting for it.
  void Force(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ticket <= forced_) return;
    forced_ = ticket;
    changed_.notify_all();
  }
  void Wait(uint64_t ticket) {
    Force(ticket);
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return completed_ >= ticket; });
  }
  void WaitIdle() { Wait(last()); }

 private:
  struct Work {
    std::function<void()> run;
    Clock::time_point enqueued;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (queue_.empty()) {
        if (stop_) return;
        changed_.wait(lock);
        continue;
      }
      const bool forced = completed_ + 1 <= forced_ || stop_ || Mode() == StreamMode::kSync;
      const Clock::time_point due = queue_.front().enqueued + DeferralLimit();
      if (!forced && Clock::now() < due) {
        changed_.wait_until(lock, due);
        continue;
      }
      std::function<void()> work = std::move(queue_.front().run);
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++completed_;
      changed_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Work> queue_;
  uint64_t enqueued_ = 0, completed_ = 0;
  uint64_t forced_ = 0;  // the work up to this ticket runs without waiting to be due
  bool stop_ = false;
  std::thread worker_;
};

struct Event {
  Stream* stream = nullptr;  // where it was last recorded; null: done
  uint64_t ticket = 0;
};

Stream* AsStream(cudaStream_t stream) { return reinterpret_cast<Stream*>(stream); }
Event* AsEvent(cudaEvent_t event) { return reinterpret_cast<Event*>(event); }
bool Done(const Event* e) { return e->stream == nullptr || e->stream->Done(e->ticket); }
void Drain(cudaStream_t stream) {
  if (stream != nullptr) AsStream(stream)->WaitIdle();
}
// What cudaDeviceSynchronize does: every stream's work so far has run.
void DrainAll() {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  for (Stream* s : Streams()) s->WaitIdle();
}

// Where a pointer points: a copy to or from pageable host memory is staged by the driver,
// with host-side synchronisation that a copy between device and pinned memory has not.
enum class Memory { kDevice, kPinned, kPageable };
Memory KindOf(const void* p) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  if (Inside(Allocations(true), p)) return Memory::kDevice;
  if (Inside(Allocations(false), p)) return Memory::kPinned;
  return Memory::kPageable;
}

}  // namespace

void drover_emu::EnqueueOnStream(cudaStream_t stream, std::function<void()> work) {
  if (stream == nullptr) {
    work();
    return;
  }
  AsStream(stream)->Enqueue(std::move(work));
}

void drover_emu::EnqueueWork(cudaStream_t stream, std::function<void()> work) {
  if (stream == nullptr || Mode() == StreamMode::kSync) {
    Drain(stream);
    work();
    return;
  }
  AsStream(stream)->Enqueue(std::move(work));
}

cudaError_t cudaMalloc(void** p, size_t bytes) { return Allocate(p, bytes, true); }
// cudaFree and cudaFreeHost synchronise the device first, so no kernel still uses the memory.
cudaError_t cudaFree(void* p) {
  DrainAll();
  return Release(p, true);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return Allocate(p, bytes, false); }
cudaError_t cudaFreeHost(void* p) {
  DrainAll();
  return Release(p, false);
}
// The runtime's documented behaviour, no more: a copy into pageable memory returns once it is
// done (after the stream's earlier work); one from pageable memory has read the source when
// it returns (the driver stages it) and writes the device memory in the stream's order; one
// between device and pinned memory is fully asynchronous.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const Memory to = KindOf(dst), from = KindOf(src);
  if (stream == nullptr || (to == Memory::kPageable && from == Memory::kPageable)) {
    Drain(stream);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (to == Memory::kPageable) {
    if (Mode() == StreamMode::kSync) {
      Drain(stream);
      std::memmove(dst, src, bytes);
      return cudaSuccess;
    }
    Stream* s = AsStream(stream);
    s->Wait(s->Enqueue([=] { std::memmove(dst, src, bytes); }));
    return cudaSuccess;
  }
  if (from == Memory::kPageable) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    drover_emu::EnqueueWork(stream, [=] { std::memcpy(dst, staged->data(), bytes); });
    return cudaSuccess;
  }
  drover_emu::EnqueueWork(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  drover_emu::EnqueueWork(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(new Stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Drain(stream);
  CheckGuards();
  return cudaSuccess;
}
// A query that finds work pending has it run (the host is waiting for it); it does not wait.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (stream == nullptr) return cudaSuccess;
  Stream* s = AsStream(stream);
  const uint64_t last = s->last();
  if (s->Done(last)) return cudaSuccess;
  s->Force(last);
  return cudaErrorNotReady;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  AsStream(stream)->Retire();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  const Event* e = AsEvent(event);
  if (Done(e)) return cudaSuccess;
  e->stream->Force(e->ticket);
  return cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  Event* e = AsEvent(event);
  if (Done(e)) return cudaSuccess;
  if (stream == nullptr) {
    e->stream->Wait(e->ticket);
    return cudaSuccess;
  }
  const Event copy = *e;  // the wait takes the event's state now, as on a GPU
  AsStream(stream)->Enqueue([copy] { copy.stream->Wait(copy.ticket); });
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* e = AsEvent(event);
  e->stream = stream == nullptr ? nullptr : AsStream(stream);
  e->ticket = e->stream == nullptr ? 0 : e->stream->last();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete AsEvent(event);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0 || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = drover_emu::OptInDynamicShared();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return static_cast<cudaError_t>(drover_emu::SetMaxDynamicShared(func, value));
}
cudaError_t cudaGetLastError() { return std::exchange(drover_emu::g_last_error, cudaSuccess); }
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated)";
    case cudaErrorNoDevice:
      return "no CUDA-capable device (emulated)";
    case cudaErrorNotReady:
      return "device not ready (emulated)";
  }
  return "unknown error (emulated)";
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device != 0 || len <= 0) return cudaErrorInvalidValue;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string first = visible != nullptr ? visible : "0";
  first = first.substr(0, first.find(','));
  if (first.empty()) return cudaErrorNoDevice;
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02zx:00.0",
                std::hash<std::string>{}(first) % 251 + 1);
  return cudaSuccess;
}
bool drover_emu::InDeviceMemory(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  std::lock_guard<std::mutex> lock(g_memory_mu);
  const auto& m = Allocations(true);
  const char* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  *attributes = {};
  if (Inside(Allocations(true), p)) {
    attributes->type = cudaMemoryTypeDevice;
  } else if (Inside(Allocations(false), p)) {
    attributes->type = cudaMemoryTypeHost;
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}

__nv_bfloat16 __float2bfloat16_rn(float x) {
  drover::engine::cpu::RoundToBf16(&x, 1);  // exact in the top 16 bits now
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return {static_cast<uint16_t>(u >> 16)};
}

// binary16: 1 sign, 5 exponent (bias 15), 10 significand bits. The value is rounded to fp16
// first, so its encoding below is exact.
__half __float2half_rn(float x) {
  drover::engine::cpu::RoundToFp16(&x, 1);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(x);
  if (std::isnan(x)) return {static_cast<uint16_t>(sign | 0x7E00u)};
  if (std::isinf(x)) return {static_cast<uint16_t>(sign | 0x7C00u)};
  if (a == 0.0f) return {sign};
  int exponent = 0;
  const float m = std::frexp(a, &exponent);  // a = m 2^exponent, m in [0.5, 1)
  if (exponent - 1 < -14) {                  // subnormal: a = k 2^-24
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(a, 24)))};
  }
  const auto biased = static_cast<uint16_t>(exponent - 1 + 15);
  const auto significand = static_cast<uint16_t>(std::ldexp(m, 11)) & 0x3FFu;
  return {static_cast<uint16_t>(sign | biased << 10 | significand)};
}

float __half2float(__half x) {
  const bool negative = (x.bits & 0x8000u) != 0;
  const int biased = (x.bits >> 10) & 0x1F;
  const int significand = x.bits & 0x3FF;
  float a;
  if (biased == 0x1F) {
    a = significand != 0 ? NAN : INFINITY;
  } else if (biased == 0) {
    a = std::ldexp(static_cast<float>(significand), -24);
  } else {
    a = std::ldexp(static_cast<float>(significand + 1024), biased - 15 - 10);
  }
  return negative ? -a : a;
}

// ---- cuBLAS --------------------------------------------------------------------------------
namespace {

// An operand element as the compute type's tensor cores read it.
float AsRead(float x, cublasComputeType_t compute) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F_FAST_16BF:
      drover::engine::cpu::RoundToBf16(&x, 1);
      return x;
    case CUBLAS_COMPUTE_32F_FAST_16F:
      drover::engine::cpu::RoundToFp16(&x, 1);
      return x;
    case CUBLAS_COMPUTE_32F_FAST_TF32: {  // 10 explicit significand bits, nearest even
      if (!std::isfinite(x)) return x;
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u += 0xFFFu + ((u >> 13) & 1u);
      u &= ~0x1FFFu;
      std::memcpy(&x, &u, 4);
      return x;
    }
    default:
      return x;
  }
}

// A GEMM input matrix of one of the types the table passes: fp32, or 16-bit bf16 / fp16
// (the GEMMs' staged copies), read as floats.
struct Input {
  const void* data;
  cudaDataType_t type;

  size_t ElementBytes() const { return type == CUDA_R_32F ? 4 : 2; }
  float operator[](size_t i) const {
    switch (type) {
      case CUDA_R_16BF:
        return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
      case CUDA_R_16F:
        return __half2float(static_cast<const __half*>(data)[i]);
      default:
        return static_cast<const float*>(data)[i];
    }
  }
};

// A GEMM output matrix: fp32, or 16-bit of the inputs' type (an operand buffer), each element
// rounded to nearest even as it is stored.
struct Output {
  void* data;
  cudaDataType_t type;

  size_t ElementBytes() const { return type == CUDA_R_32F ? 4 : 2; }
  float Get(size_t i) const { return Input{data, type}[i]; }
  void Set(size_t i, float v) const {
    switch (type) {
      case CUDA_R_16BF:
        static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
        return;
      case CUDA_R_16F:
        static_cast<__half*>(data)[i] = __float2half_rn(v);
        return;
      default:
        static_cast<float*>(data)[i] = v;
    }
  }
};

bool Supported(cudaDataType_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

void Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, Input A,
          int lda, Input B, int ldb, float beta, float* C, int ldc, cublasComputeType_t compute) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const float a = ta == CUBLAS_OP_T ? A[p + static_cast<size_t>(i) * lda]
                                          : A[i + static_cast<size_t>(p) * lda];
        const float b = tb == CUBLAS_OP_T ? B[j + static_cast<size_t>(p) * ldb]
                                          : B[p + static_cast<size_t>(j) * ldb];
        sum += double{AsRead(a, compute)} * AsRead(b, compute);
      }
      float& c = C[i + static_cast<size_t>(j) * ldc];
      // beta 0 ignores C, as cuBLAS does (it may hold NaN).
      c = static_cast<float>(alpha * sum + (beta == 0.0f ? 0.0 : double{beta} * c));
    }
  }
}

bool Valid(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb,
           int ldc) {
  const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  return m >= 0 && n >= 0 && k >= 0 && lda >= std::max(1, rows_a) && ldb >= std::max(1, rows_b) &&
         ldc >= std::max(1, m);
}

}  // namespace

struct cublasContext {
  cudaStream_t stream = nullptr;  // cublasSetStream's: where its GEMMs are enqueued
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                         : "CUBLAS_STATUS_INVALID_VALUE (emulated)";
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType_t a_type, int lda, const void* B, cudaDataType_t b_type,
                            int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  // The table's combinations: fp32 inputs, or 16-bit ones of one type (with fp32 compute,
  // as cuBLAS requires of them); an fp32 output, or one of the 16-bit inputs' type.
  const bool narrow = a_type != CUDA_R_32F;
  if (!Supported(a_type) || b_type != a_type || (c_type != CUDA_R_32F && c_type != a_type) ||
      (narrow && compute != CUBLAS_COMPUTE_32F)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!Valid(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  const Input a{A, a_type}, b{B, b_type};
  const Output c{C, c_type};
  if (!InOneDeviceAllocation(A, na ? m : k, na ? k : m, lda, a.ElementBytes()) ||
      !InOneDeviceAllocation(B, nb ? k : n, nb ? n : k, ldb, b.ElementBytes()) ||
      !InOneDeviceAllocation(C, m, n, ldc, c.ElementBytes())) {
    drover_emu::Die("a GEMM operand reaches past its device allocation (an illegal address)");
  }
  // alpha and beta are read at the call (host pointer mode); the product on the stream.
  const float alpha_f = *static_cast<const float*>(alpha),
              beta_f = *static_cast<const float*>(beta);
  drover_emu::EnqueueWork(handle->stream, [=] {
    if (c_type == CUDA_R_32F) {
      Gemm(ta, tb, m, n, k, alpha_f, a, lda, b, ldb, beta_f, static_cast<float*>(C), ldc, compute);
      return;
    }
    // A 16-bit C: the sums in floats, each rounded once as it is stored.
    std::vector<float> sums(static_cast<size_t>(m) * n);
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        sums[i + static_cast<size_t>(j) * m] =
            beta_f == 0.0f ? 0.0f : c.Get(i + static_cast<size_t>(j) * ldc);
      }
    }
    Gemm(ta, tb, m, n, k, alpha_f, a, lda, b, ldb, beta_f, sums.data(), m, compute);
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        c.Set(i + static_cast<size_t>(j) * ldc, sums[i + static_cast<size_t>(j) * m]);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType_t b_type, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType_t c_type, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (a_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;  // the strides below are fp32's
  for (int i = 0; i < batch; ++i) {
    const cublasStatus_t st =
        cublasGemmEx(handle, ta, tb, m, n, k, alpha, static_cast<const float*>(A) + i * stride_a,
                     a_type, lda, static_cast<const float*>(B) + i * stride_b, b_type, ldb, beta,
                     static_cast<float*>(C) + i * stride_c, c_type, ldc, compute, algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt ------------------------------------------------------------------------------
struct cublasLtContext {};
struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;  // -1 (D's) is not taken: the table always sets it
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t workspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace {

// The largest power of two up to 256 that divides p's address.
uint32_t AlignmentOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && at % a != 0) a /= 2;
  return a;
}

template <typename T>
cublasStatus_t SetValue(T* field, const void* buf, size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

// m, n, k of D = op(A) op(B) from the layouts, or false when they do not fit together.
bool LtShape(const cublasLtMatmulDescOpaque& desc, const cublasLtMatrixLayoutOpaque& a,
             const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
             const cublasLtMatrixLayoutOpaque& d, int* m, int* n, int* k) {
  // A and B of one type (fp32, or 16-bit with fp32 compute); C and D of one type, fp32 or
  // (16-bit inputs) theirs, with a bias of D's type: the table's combinations.
  if (!Supported(a.type) || b.type != a.type || c.type != d.type ||
      (d.type != CUDA_R_32F && d.type != a.type) ||
      (desc.epilogue == CUBLASLT_EPILOGUE_BIAS && desc.bias_type != d.type) ||
      (a.type != CUDA_R_32F && desc.compute != CUBLAS_COMPUTE_32F)) {
    return false;
  }
  for (const auto* l : {&a, &b, &c, &d}) {
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(1, l->rows))) return false;
  }
  *m = static_cast<int>(d.rows);
  *n = static_cast<int>(d.cols);
  const uint64_t a_rows = desc.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t a_cols = desc.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t b_rows = desc.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t b_cols = desc.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  *k = static_cast<int>(a_cols);
  return a_rows == d.rows && b_cols == d.cols && b_rows == a_cols && c.rows == d.rows &&
         c.cols == d.cols;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque{compute};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return SetValue(&desc->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return SetValue(&desc->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return SetValue(&desc->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return SetValue(&desc->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t type = -1;
      const cublasStatus_t st = SetValue(&type, buf, bytes);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
      if (!Supported(static_cast<cudaDataType_t>(type))) return CUBLAS_STATUS_NOT_SUPPORTED;
      desc->bias_type = static_cast<cudaDataType_t>(type);
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return SetValue(&pref->workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return SetValue(&pref->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf,
                      bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
// One "algorithm" for any valid problem: it records the alignments it was chosen for (A, B,
// C, D from the preference; the bias pointer's as set on the descriptor then, up to 16).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (requested <= 0) return CUBLAS_STATUS_INVALID_VALUE;
  int m, n, k;
  if (!LtShape(*desc, *a, *b, *c, *d, &m, &n, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulHeuristicResult_t r{};
  for (int i = 0; i < 4; ++i) r.algo.data[i] = pref->alignment[i];
  r.algo.data[4] =
      desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? std::min(16u, AlignmentOf(desc->bias)) : 1;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  int m, n, k;
  if (algo == nullptr || !LtShape(*desc, *a, *b, *c, *d, &m, &n, &k)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const void* pointers[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i) {
    if (AlignmentOf(pointers[i]) < algo->data[i]) {
      drover_emu::Die("cuBLASLt: an operand less aligned than the heuristic's preference");
    }
  }
  const bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias && (desc->bias == nullptr || AlignmentOf(desc->bias) < algo->data[4])) {
    drover_emu::Die("cuBLASLt: a bias pointer less aligned than at the heuristic");
  }
  const float alpha_f = *static_cast<const float*>(alpha),
              beta_f = *static_cast<const float*>(beta);
  const bool na = desc->trans_a == CUBLAS_OP_N, nb = desc->trans_b == CUBLAS_OP_N;
  const int lda = static_cast<int>(a->ld), ldb = static_cast<int>(b->ld);
  const int ldc = static_cast<int>(c->ld), ldd = static_cast<int>(d->ld);
  const Input in_a{A, a->type}, in_b{B, b->type}, in_c{C, c->type}, in_bias{desc->bias, d->type};
  const Output out{D, d->type};
  if (!InOneDeviceAllocation(A, na ? m : k, na ? k : m, lda, in_a.ElementBytes()) ||
      !InOneDeviceAllocation(B, nb ? k : n, nb ? n : k, ldb, in_b.ElementBytes()) ||
      (beta_f != 0.0f && !InOneDeviceAllocation(C, m, n, ldc, in_c.ElementBytes())) ||
      !InOneDeviceAllocation(D, m, n, ldd, out.ElementBytes()) ||
      (bias && !InOneDeviceAllocation(desc->bias, m, 1, m, in_bias.ElementBytes()))) {
    drover_emu::Die("a GEMM operand reaches past its device allocation (an illegal address)");
  }
  if (C == D && ldc != ldd) return CUBLAS_STATUS_INVALID_VALUE;  // in place: one layout
  // The descriptor's state is taken now (the caller may change or destroy it); the product
  // runs on the stream: the sums in floats (C's values under them where beta counts), the
  // bias added, and each element stored once in D's type.
  const cublasComputeType_t compute = desc->compute;
  const cublasOperation_t ta = desc->trans_a == CUBLAS_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = desc->trans_b == CUBLAS_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
  drover_emu::EnqueueWork(stream, [=] {
    std::vector<float> sums(static_cast<size_t>(m) * n);
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        sums[i + static_cast<size_t>(j) * m] =
            beta_f == 0.0f ? 0.0f : in_c[i + static_cast<size_t>(j) * ldc];
      }
    }
    Gemm(ta, tb, m, n, k, alpha_f, in_a, lda, in_b, ldb, beta_f, sums.data(), m, compute);
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float v = sums[i + static_cast<size_t>(j) * m];
        if (bias) v += in_bias[i];
        out.Set(i + static_cast<size_t>(j) * ldd, v);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
