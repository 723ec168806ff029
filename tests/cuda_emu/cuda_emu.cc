// The kernel emulator's kernels (tests/cuda_emu/README.md): fibers for the threads of a
// block, barriers and warp shuffles, launches and their limits, and the device's bf16 and
// fp16 conversions. The runtime (memory, streams, copies) is runtime.cc; cuBLAS, cublas.cc.
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"
#include "emu_internal.h"
#include "worker/engine/kernels/cpu/round.h"

namespace drover_emu {

void Die(const char* what) {
  std::fprintf(stderr, "cuda emulator: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

cudaError_t& LastError() {
  thread_local cudaError_t error = cudaSuccess;
  return error;
}

namespace {

constexpr size_t kStackBytes = 64 * 1024;

// Switching fibers: ucontext's swapcontext makes a system call per switch (it saves the
// signal mask), and a block's barrier switches every one of its threads, which made a
// 20-step training test take minutes. On x86-64 a switch is saved callee-saved registers and
// a stack pointer swap instead; elsewhere, ucontext. The SSE and x87 control words, callee-saved
// too, are left alone: every fiber of a block runs on the one host thread, and no kernel
// changes them (RunBlockAsFibers checks; loading them back at each switch was half of its time).
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
  movq %rsp, (%rdi)
  movq %rsi, %rsp
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
// The SSE and x87 control words (rounding, exception masks, precision) as one value, without
// MXCSR's exception flags (its low 6 bits), which computing sets.
uint64_t ControlWords() {
  uint32_t mxcsr = 0;
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87));
  return uint64_t{mxcsr & ~0x3Fu} << 16 | x87;
}
// A fresh stack whose first switch-in "returns" into entry(), as if called.
void Prepare(Context* c, char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                  // entry's own return address (never used)
  *--slot = reinterpret_cast<uint64_t>(entry);  // popped by the switch's ret
  for (int i = 0; i < 6; ++i) *--slot = 0;      // rbp rbx r12 r13 r14 r15
  c->sp = slot;
}
#else
struct Context {
  ucontext_t uc;
};
void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
uint64_t ControlWords() { return 0; }  // swapcontext keeps them
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
  // round-robin (Next) resumes a fiber only once it can go on.
  const uint64_t* generation = nullptr;
  uint64_t waits_for = 0;
  // Warp exchanges (shuffles, ldmatrix, mma) this thread has made: exchange n goes through
  // its warp's buffers n % 2 (Exchange).
  uint64_t exchanges = 0;
  // cp.async copies issued and not yet landed: `open` since the last commit, `groups`
  // committed, oldest first (CpAsync).
  struct AsyncCopy {
    unsigned char* dst;
    unsigned char bytes[16];
    int size;
  };
  std::vector<AsyncCopy> open;
  std::deque<std::vector<AsyncCopy>> groups;
};
struct Warp {
  int live = 0, arrived = 0;
  uint64_t generation = 0;
  // Each exchange's buffers, two of each (Exchange): ShuffleXor's values, MmaM16N8K16's a
  // and b registers, LdMatrixX4's row addresses, by lane.
  double slots[2][32] = {};
  uint32_t mma[2][32][6] = {};
  // MmaM16N8K16's operands decoded to floats, once a warp: A (16 x 16) and B (16 x 8) of the
  // exchange numbered mma_decoded[i] (none: ~0).
  float mma_a[2][16][16] = {}, mma_b[2][16][8] = {};
  uint64_t mma_decoded[2] = {~uint64_t{0}, ~uint64_t{0}};
  const unsigned char* rows[2][32] = {};
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
  // The round-robin (Next): fibers run in rounds, first to last (or last to first when
  // `reverse`), each runnable one until it waits or ends; `position` is the running one's
  // place in the round, `round_progress` the progress when the round began.
  bool reverse = false;
  unsigned position = 0;
  uint64_t round_progress = 0;
  const ThreadIndex** index = nullptr;  // g_current_index of the host thread, looked up once
  Context scheduler;                    // RunBlockAsFibers, until every fiber has ended
};

thread_local Block* g_block = nullptr;
thread_local ThreadIndex g_direct;  // the index of a thread run as a plain call
thread_local std::vector<std::unique_ptr<char[]>> g_stacks;
thread_local uint64_t g_launches = 0;  // kernels run on this thread (Run's thread orders)

bool Runnable(const Fiber& f) {
  return !f.done && (f.generation == nullptr || *f.generation != f.waits_for);
}

// The fiber to run after the current one: the next runnable one in this round, else the first
// of the next round; null once every fiber has ended. A round in which none could run is a
// deadlock.
Fiber* Next(Block& b) {
  const auto n = static_cast<unsigned>(b.fibers.size());
  for (;;) {
    while (++b.position < n) {
      Fiber& f = b.fibers[b.reverse ? n - 1 - b.position : b.position];
      if (Runnable(f)) return &f;
    }
    if (b.live == 0) return nullptr;
    if (b.progress == b.round_progress) {
      Die("deadlock: the threads of a block wait at barriers that not all of them reach");
    }
    b.round_progress = b.progress;
    b.position = ~0u;  // the next round starts at 0
  }
}

// Leaves the current fiber (waiting, or ended) for the next one, straight from its stack to
// the next one's. Through the scheduler's stack instead, every switch would return to where a
// different call was made, and mispredict: one switch in two (the fibers mostly wait at the
// same call) and that scheduler loop were two fifths of an emulated trainer's time.
void Yield(Block& b) {
  Fiber* from = b.current;
  Fiber* to = Next(b);
  if (to == nullptr) {
    Switch(&from->context, &b.scheduler);
    return;
  }
  b.current = to;
  *b.index = &to->index;
  Switch(&from->context, &to->context);
}

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

// The block in flight, which `what` may synchronise. (Each read of g_block is a
// __tls_get_addr call in this dlopen'ed library: the barriers pass the block on instead.)
Block& CheckSynchronisable(const char* what) {
  Block* b = g_block;
  if (b == nullptr) Die("a barrier outside a kernel");
  if (b->direct) {
    std::fprintf(stderr,
                 "cuda emulator: %s in a kernel whose first block never synchronised (its "
                 "blocks after the first run as plain calls)\n",
                 what);
    std::abort();
  }
  b->synchronised = true;
  return *b;
}

// Arrives at the barrier whose generation is *generation (already counted by the caller)
// and waits until it is released.
void Wait(Block& b, const uint64_t* generation, uint64_t mine) {
  Fiber& f = *b.current;
  if (*generation != mine) return;  // this arrival released it
  f.generation = generation;
  f.waits_for = mine;
  Yield(b);
  f.generation = nullptr;
}

void WarpBarrier(Block& b) {
  Warp& w = b.warps[b.current->warp];
  const uint64_t mine = w.generation;
  ++w.arrived;
  ++b.progress;
  Release(w);
  Wait(b, &w.generation, mine);
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
  Yield(b);  // for good: the scheduler never resumes a finished fiber
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
  // Fibers are reset, not made anew: each holds containers, and a block runs per launch.
  b.fibers.resize(n);
  for (Fiber& f : b.fibers) {
    f.done = false;
    f.generation = nullptr;
    f.waits_for = 0;
    f.exchanges = 0;
    f.open.clear();
    f.groups.clear();
  }
  b.warps.resize((n + 31) / 32);  // their buffers are written before they are read
  for (Warp& w : b.warps) {
    w.live = 0;
    w.arrived = 0;
    w.generation = 0;
    w.mma_decoded[0] = w.mma_decoded[1] = ~uint64_t{0};  // exchanges count from 0 again
  }
  b.live = static_cast<int>(n);
  b.arrived = 0;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.index = IndexOf(t, block, block_index, grid);
    f.warp = static_cast<int>(t / 32);
    ++b.warps[f.warp].live;
    Prepare(&f.context, g_stacks[t].get(), kStackBytes, Entry);
  }
  // The first fiber; the fibers then switch among themselves (Yield), and the last to end
  // switches back here.
  b.index = &g_current_index;
  b.reverse = reverse;
  b.position = 0;
  b.round_progress = b.progress;
  b.current = &b.fibers[reverse ? n - 1 : 0];
  *b.index = &b.current->index;
  const uint64_t control = ControlWords();
  Switch(&b.scheduler, &b.current->context);
  b.current = nullptr;
  *b.index = nullptr;
  // The switches keep no floating-point control words: a kernel that set some would leak
  // them into the block's other threads.
  if (ControlWords() != control) Die("a kernel changed the floating-point control words");
}

}  // namespace

thread_local constinit const ThreadIndex* g_current_index = nullptr;

void DieOutsideKernel() { Die("a thread index read outside a kernel"); }

void SyncThreads() {
  Block& b = CheckSynchronisable("__syncthreads");
  const uint64_t mine = b.generation;
  ++b.arrived;
  ++b.progress;
  ReleaseBlock(b);
  Wait(b, &b.generation, mine);
}

void SyncWarp() { WarpBarrier(CheckSynchronisable("__syncwarp")); }

unsigned Lane() {
  if (g_block == nullptr || g_block->direct)
    Die("a warp-wide operation outside a synchronised kernel");
  return static_cast<unsigned>(g_block->current - g_block->fibers.data()) % 32;
}

float* WarpTile() {
  Block& b = CheckSynchronisable("a warp-wide matrix operation");
  return b.warps[b.current->warp].tile;
}

unsigned char* DynamicShared() {
  if (g_block == nullptr) Die("dynamic shared memory outside a kernel");
  return g_block->shared;
}

namespace {

// Which of its warp's two buffers this thread's next exchange goes through. Every lane
// stores its part, meets the others at one barrier, and reads theirs. No second barrier is
// needed before the buffers are written again: the exchange after next, the next to write
// these, stores only once its lane has passed the next exchange's barrier, which every lane
// reaches only after reading this one. (Two barriers per exchange made the shuffles and
// mma's a fifth of the emulated tests' time.)
int Exchange(Block& b) { return static_cast<int>(b.current->exchanges++ % 2); }

}  // namespace

double ShuffleXor(double value, int offset) {
  Block& b = CheckSynchronisable("a warp shuffle");
  const unsigned lane = static_cast<unsigned>(b.current - b.fibers.data()) % 32;
  Warp& w = b.warps[b.current->warp];
  double* slots = w.slots[Exchange(b)];
  slots[lane] = value;
  WarpBarrier(b);  // every lane has stored
  return slots[lane ^ static_cast<unsigned>(offset)];
}

namespace {

// One 16-bit element of an mma operand register: the low half holds the first.
float MmaElement(uint32_t reg, int half, bool fp16) {
  const uint16_t bits = static_cast<uint16_t>(half == 0 ? reg & 0xFFFFu : reg >> 16);
  return fp16 ? __half2float(__half{bits}) : __bfloat162float(__nv_bfloat16{bits});
}

}  // namespace

void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool fp16) {
  Block& blk = CheckSynchronisable("mma.sync");
  const unsigned lane = static_cast<unsigned>(blk.current - blk.fibers.data()) % 32;
  Warp& w = blk.warps[blk.current->warp];
  const uint64_t exchange = blk.current->exchanges;
  const int buffer = Exchange(blk);
  uint32_t(&regs)[32][6] = w.mma[buffer];
  for (int i = 0; i < 4; ++i) regs[lane][i] = a[i];
  regs[lane][4] = b[0];
  regs[lane][5] = b[1];
  WarpBarrier(blk);  // every lane's fragments are in
  // The first lane past the barrier decodes the warp's operands for all (every lane would
  // otherwise decode its two rows and columns: five times the conversions).
  // A(r, k): lane (r % 8) * 4 + (k % 8) / 2, register (k / 8) * 2 + r / 8, half k % 2.
  // B(k, n): lane n * 4 + (k % 8) / 2, register 4 + k / 8, half k % 2.
  float(&A)[16][16] = w.mma_a[buffer];
  float(&B)[16][8] = w.mma_b[buffer];
  if (w.mma_decoded[buffer] != exchange) {
    for (int k = 0; k < 16; ++k) {
      const int half = k % 2, lane_k = (k % 8) / 2;
      for (int r = 0; r < 16; ++r) {
        A[r][k] = MmaElement(regs[(r % 8) * 4 + lane_k][(k / 8) * 2 + r / 8], half, fp16);
      }
      for (int n = 0; n < 8; ++n) B[k][n] = MmaElement(regs[n * 4 + lane_k][4 + k / 8], half, fp16);
    }
    w.mma_decoded[buffer] = exchange;
  }
  // This lane's outputs: rows g, g, g + 8, g + 8 by columns 2t, 2t + 1, 2t, 2t + 1.
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  for (int e = 0; e < 4; ++e) {
    const float* row = A[g + 8 * (e / 2)];
    const int col = 2 * t + e % 2;
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += row[k] * B[k][col];
    d[e] = sum;
  }
}

namespace {

// Aborts unless [p, p + bytes) lies inside the running block's dynamic shared memory.
void CheckShared(const void* p, size_t bytes, const char* what) {
  const Block& b = *g_block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < b.shared || c + bytes > b.shared + b.shared_bytes) {
    std::fprintf(stderr, "cuda emulator: %s outside the block's dynamic shared memory\n", what);
    std::abort();
  }
}

}  // namespace

void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  Block& blk = CheckSynchronisable("ldmatrix");
  const unsigned lane = static_cast<unsigned>(blk.current - blk.fibers.data()) % 32;
  Warp& w = blk.warps[blk.current->warp];
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
    Die("ldmatrix: a row address not 16-byte aligned");
  CheckShared(row, 16, "ldmatrix: a row");
  const unsigned char** rows = w.rows[Exchange(blk)];
  rows[lane] = static_cast<const unsigned char*>(row);
  WarpBarrier(blk);  // every lane's address is in
  // Element (i, j) of matrix m: the j-th 16-bit value of the row lane 8m + i gave.
  auto element = [&](int m, int i, int j) {
    uint16_t v;
    std::memcpy(&v, rows[8 * m + i] + 2 * j, sizeof(v));
    return static_cast<uint32_t>(v);
  };
  const int a = static_cast<int>(lane / 4), c = static_cast<int>(2 * (lane % 4));
  for (int m = 0; m < 4; ++m) {
    r[m] = trans ? element(m, c, a) | element(m, c + 1, a) << 16
                 : element(m, a, c) | element(m, a, c + 1) << 16;
  }
}

void CpAsync(void* dst, const void* src, int bytes, int src_bytes) {
  Block& b = CheckSynchronisable("cp.async");
  if (bytes != 4 && bytes != 8 && bytes != 16)
    Die("cp.async: a copy of other than 4, 8 or 16 bytes");
  if (src_bytes < 0 || src_bytes > bytes) Die("cp.async: a source size past the copy");
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0)) {
    Die("cp.async: an address not aligned to the copy's size");
  }
  CheckShared(dst, bytes, "cp.async: a destination");
  if (src_bytes > 0 && !InDeviceMemory(src, src_bytes))
    Die("cp.async: a source outside device memory");
  Fiber::AsyncCopy copy{static_cast<unsigned char*>(dst), {}, bytes};
  if (src_bytes > 0) std::memcpy(copy.bytes, src, src_bytes);
  b.current->open.push_back(copy);
}

void CpAsyncCommit() {
  Fiber& f = *CheckSynchronisable("cp.async.commit_group").current;
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void CpAsyncWait(int n) {
  Fiber& f = *CheckSynchronisable("cp.async.wait_group").current;
  while (f.groups.size() > static_cast<size_t>(std::max(n, 0))) {
    for (const Fiber::AsyncCopy& c : f.groups.front()) std::memcpy(c.dst, c.bytes, c.size);
    f.groups.pop_front();
  }
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
  // DROVER_EMU_NO_KERNEL_IMAGE stands in for a GPU the plugin's kernels were not compiled
  // for: every launch fails as it would there.
  static const bool no_image = std::getenv("DROVER_EMU_NO_KERNEL_IMAGE") != nullptr;
  if (no_image) {
    LastError() = cudaErrorNoKernelImageForDevice;
    return false;
  }
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
    LastError() = cudaErrorInvalidValue;  // "invalid configuration argument" on a device
    return false;
  }
  int allowed = kDefaultDynamicShared;
  {
    std::lock_guard<std::mutex> lock(g_attributes_mu);
    auto it = MaxDynamicShared().find(kernel);
    if (it != MaxDynamicShared().end()) allowed = std::max(allowed, it->second);
  }
  if (shared_bytes > static_cast<size_t>(allowed)) {
    LastError() = cudaErrorInvalidValue;  // "too many resources requested for launch"
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
  // and since Volta a warp's lanes may too), nor among a launch's blocks: the threads run
  // first to last in every other block and last to first in the rest, and every other
  // launch runs its blocks last to first. So a thread that reads what another writes
  // without a barrier between them, or a block that reads what another block of the same
  // launch writes, reads it too early in one order or the other.
  const uint64_t launch = g_launches++;
  const bool blocks_reversed = launch % 2 == 1;
  const uint64_t count = uint64_t{grid.x} * grid.y * grid.z;
  bool first = true;
  for (uint64_t n = 0; n < count; ++n) {
    const uint64_t linear = blocks_reversed ? count - 1 - n : n;
    const uint3 block_index{static_cast<unsigned>(linear % grid.x),
                            static_cast<unsigned>(linear / grid.x % grid.y),
                            static_cast<unsigned>(linear / (uint64_t{grid.x} * grid.y))};
    const bool reverse = (launch + block_index.x + block_index.y + block_index.z) % 2 == 1;
    if (first || b.synchronised) {
      RunBlockAsFibers(b, grid, block, block_index, reverse);
    } else {
      // The first block never synchronised: the rest run as plain calls, far faster; a
      // barrier met there aborts (CheckSynchronisable) rather than misbehave.
      b.direct = true;
      g_current_index = &g_direct;
      PoisonShared(b);
      for (unsigned i = 0; i < threads; ++i) {
        g_direct = IndexOf(reverse ? threads - 1 - i : i, block, block_index, grid);
        body();
      }
    }
    first = false;
  }
  g_current_index = nullptr;
  g_block = nullptr;
}

int SetMaxDynamicShared(const void* func, int value) {
  if (func == nullptr || value < 0 || value > OptInDynamicShared()) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(g_attributes_mu);
  MaxDynamicShared()[func] = value;
  return cudaSuccess;
}

}  // namespace drover_emu

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
  // Widened bit for bit: a normal value's exponent rebiased (15 -> 127), its significand
  // shifted into place; a subnormal one, k 2^-24, is exact as a float product. (ldexp here
  // made the conversions a tenth of the mma-heavy tests' time.)
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t biased = (x.bits >> 10) & 0x1Fu;
  const uint32_t significand = x.bits & 0x3FFu;
  uint32_t u;
  if (biased == 0x1F) {
    u = sign | 0x7F800000u | (significand != 0 ? 0x400000u : 0u);  // inf, or a quiet NaN
  } else if (biased == 0) {
    const float a = static_cast<float>(significand) * 0x1p-24f;
    std::memcpy(&u, &a, 4);
    u |= sign;
  } else {
    u = sign | (biased - 15 + 127) << 23 | significand << 13;
  }
  float a;
  std::memcpy(&a, &u, 4);
  return a;
}
