// The kernel emulator's CUDA runtime (tests/cuda_emu/README.md): device and pinned memory
// (NaN-filled, guarded), streams whose work runs behind the host on a thread each, events,
// copies with the runtime's documented guarantees, and the device queries the table makes.
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

#include "cuda_runtime_api.h"
#include "emu_internal.h"

namespace {

std::mutex g_memory_mu;
// Never destroyed: a stream's thread may still run deferred work while the process exits.
std::map<const char*, size_t>& Allocations(bool device) {  // start -> bytes
  static auto* device_memory = new std::map<const char*, size_t>;
  static auto* pinned_memory = new std::map<const char*, size_t>;
  return device ? *device_memory : *pinned_memory;
}
// How far p lies into the allocation of `m` that starts at or before it: its offset there
// and the allocation's size, or false when every allocation starts after p. (p may be past
// that allocation's end: the callers decide what counts as inside.)
bool Locate(const std::map<const char*, size_t>& m, const void* p, size_t* offset, size_t* size) {
  const char* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);  // the first allocation starting after c
  if (it == m.begin()) return false;
  --it;
  *offset = static_cast<size_t>(c - it->first);
  *size = it->second;
  return true;
}
bool Inside(const std::map<const char*, size_t>& m, const void* p) {
  size_t offset, size;
  return Locate(m, p, &offset, &size) && offset < size;
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

[[noreturn]] void DieOfBrokenGuard(const char* p, size_t bytes, bool device,
                                   const unsigned char* g) {
  const auto at = reinterpret_cast<const char*>(g) - p;
  char what[200];
  std::snprintf(what, sizeof(what),
                "a write outside the %s allocation of %zu bytes at %p: byte %td (%s)",
                device ? "device" : "pinned", bytes, static_cast<const void*>(p), at,
                at < 0 ? "before its start" : "past its end");
  drover_emu::Die(what);
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

// The emulated GPU's memory: DROVER_EMU_DEVICE_MEMORY bytes (a suffix K, M or G multiplies
// by 2^10, 2^20, 2^30), or 80 GiB. cudaMalloc beyond it fails as a full GPU's does, and
// cudaMemGetInfo reports what is left. With DROVER_EMU_REPORT_PEAK set, the most device
// memory ever held at once is written to stderr at exit ("emulated device memory peak: N
// bytes"), which is how a test finds the size a job needs.
size_t DeviceMemoryTotal() {
  static const size_t total = [] {
    const char* env = std::getenv("DROVER_EMU_DEVICE_MEMORY");
    if (env == nullptr || *env == '\0') return size_t{80} << 30;
    char* end = nullptr;
    size_t v = std::strtoull(env, &end, 10);
    if (*end == 'K') v <<= 10;
    if (*end == 'M') v <<= 20;
    if (*end == 'G') v <<= 30;
    return v;
  }();
  return total;
}
size_t g_device_used = 0;  // GUARDED_BY(g_memory_mu): bytes of live device allocations
size_t g_device_peak = 0;  // GUARDED_BY(g_memory_mu)

void ReportPeak() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  std::fprintf(stderr, "emulated device memory peak: %zu bytes\n", g_device_peak);
}

// 256-byte aligned, as cudaMalloc's, and filled with NaN bytes: neither call promises
// initialised memory (a device's is often zero when fresh and holds old data when reused),
// so code that reads what it never wrote shows it, as compute-sanitizer's initcheck would.
cudaError_t Allocate(void** p, size_t bytes, bool device) {
  const size_t rounded = Rounded(bytes);
  if (device) {
    static const bool report = [] {
      if (std::getenv("DROVER_EMU_REPORT_PEAK") != nullptr) std::atexit(ReportPeak);
      return true;
    }();
    (void)report;
    std::lock_guard<std::mutex> lock(g_memory_mu);
    if (g_device_used + rounded > DeviceMemoryTotal()) return cudaErrorMemoryAllocation;
    g_device_used += rounded;
    g_device_peak = std::max(g_device_peak, g_device_used);
  }
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(256, rounded + 2 * kGuardBytes));
  if (base == nullptr) {
    std::lock_guard<std::mutex> lock(g_memory_mu);
    if (device) g_device_used -= rounded;
    return cudaErrorMemoryAllocation;
  }
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
  if (device) g_device_used -= Rounded(it->second);
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
  bool timing = true;  // not made with cudaEventDisableTiming
  // A timing event's passing: the stream's thread writes the steady clock's nanoseconds
  // there when it reaches the event (-1 before). Shared with that work, which may run after
  // the event is destroyed.
  std::shared_ptr<std::atomic<int64_t>> passed;
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
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  *total = DeviceMemoryTotal();
  *free = *total - std::min(*total, g_device_used);
  return cudaSuccess;
}
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
namespace drover_emu {

cudaError_t InjectedFault() {
  struct Fault {
    bool armed = false;  // this process's GPU is the one named
    std::string file;
  };
  static const Fault fault = [] {
    Fault f;
    const char* spec = std::getenv("DROVER_EMU_GPU_FAULT");
    if (spec == nullptr) return f;
    const std::string text = spec;
    const size_t at = text.find('@');
    if (at == std::string::npos || at == 0 || at + 1 == text.size()) {
      Die("DROVER_EMU_GPU_FAULT must be DEVICE@FILE");
    }
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string device = visible != nullptr && *visible != '\0' ? visible : "0";
    device = device.substr(0, device.find(','));
    f.armed = device == text.substr(0, at);
    f.file = text.substr(at + 1);
    return f;
  }();
  static std::atomic<bool> failed{false};
  if (!fault.armed) return cudaSuccess;
  if (!failed.load() && access(fault.file.c_str(), F_OK) == 0) failed = true;
  return failed.load() ? cudaErrorECCUncorrectable : cudaSuccess;
}

}  // namespace drover_emu

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Drain(stream);
  CheckGuards();
  return drover_emu::InjectedFault();
}
// A query that finds work pending has it run (the host is waiting for it); it does not wait.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t fault = drover_emu::InjectedFault(); fault != cudaSuccess) return fault;
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
  if (cudaError_t fault = drover_emu::InjectedFault(); fault != cudaSuccess) return fault;
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
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  auto* e = new Event;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* e = AsEvent(event);
  e->stream = stream == nullptr ? nullptr : AsStream(stream);
  e->passed = nullptr;
  if (e->timing && e->stream != nullptr) {
    // The time is taken where the stream gets to the event: work of its own, the last.
    auto passed = std::make_shared<std::atomic<int64_t>>(-1);
    e->passed = passed;
    e->stream->Enqueue([passed] {
      passed->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
    });
  }
  e->ticket = e->stream == nullptr ? 0 : e->stream->last();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const Event* a = AsEvent(start);
  const Event* b = AsEvent(end);
  if (ms == nullptr) return cudaErrorInvalidValue;
  if (a->passed == nullptr || b->passed == nullptr) return cudaErrorInvalidResourceHandle;
  if (!Done(a) || !Done(b)) return cudaErrorNotReady;
  *ms = static_cast<float>(static_cast<double>(b->passed->load() - a->passed->load()) * 1e-6);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete AsEvent(event);
  return cudaSuccess;
}
// The emulated runtime is CUDA 12.8's. DROVER_EMU_DRIVER_VERSION stands in for the driver's
// (1000 * major + 10 * minor; default the runtime's): 0 is a machine without a driver, a
// major version below the runtime's a driver too old for it (an older minor version of the
// same major serves it: CUDA's minor version compatibility); either makes cudaGetDeviceCount
// fail as the runtime does, with cudaErrorInsufficientDriver.
constexpr int kEmuRuntimeVersion = 12080;
int EmuDriverVersion() {
  const char* env = std::getenv("DROVER_EMU_DRIVER_VERSION");
  return env != nullptr ? std::atoi(env) : kEmuRuntimeVersion;
}
cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = EmuDriverVersion();
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = kEmuRuntimeVersion;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  if (EmuDriverVersion() / 1000 < kEmuRuntimeVersion / 1000) {
    *count = 0;
    return cudaErrorInsufficientDriver;
  }
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  const char* env = std::getenv("DROVER_EMU_COMPUTE_CAPABILITY");
  const int capability = env != nullptr ? std::atoi(env) : 90;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = drover_emu::OptInDynamicShared();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = capability / 10;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = capability % 10;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return static_cast<cudaError_t>(drover_emu::SetMaxDynamicShared(func, value));
}
cudaError_t cudaGetLastError() {
  const cudaError_t last = std::exchange(drover_emu::LastError(), cudaSuccess);
  return last != cudaSuccess ? last : drover_emu::InjectedFault();
}
namespace {

// Each error the emulator returns: its name and its words, as the runtime's.
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument (emulated)"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory (emulated)"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device (emulated)"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device (emulated)"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready (emulated)"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle (emulated)"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable",
     "uncorrectable ECC error encountered (emulated)"},
    {cudaErrorNvlinkUncorrectable, "cudaErrorNvlinkUncorrectable",
     "uncorrectable NVLink error detected during the execution (emulated)"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable (emulated)"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal (emulated)"},
    {cudaErrorSystemNotReady, "cudaErrorSystemNotReady", "system not yet initialized (emulated)"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version (emulated)"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch",
     "system has unsupported display driver / cuda driver combination (emulated)"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library (emulated)"},
};
const ErrorText* TextOf(cudaError_t error) {
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == error) return &e;
  }
  return nullptr;
}

}  // namespace

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = TextOf(error);
  return e != nullptr ? e->text : "unknown error (emulated)";
}
const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = TextOf(error);
  return e != nullptr ? e->name : "cudaErrorUnknown";
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
  size_t offset, size;
  return Locate(Allocations(true), p, &offset, &size) && offset + bytes <= size;
}
void drover_emu::CheckKernelPointer(const void* p, int index) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_memory_mu);
    for (const bool device : {true, false}) {
      size_t offset, size;
      if (Locate(Allocations(device), p, &offset, &size) && offset <= size) return;
    }
  }
  char what[160];
  std::snprintf(what, sizeof(what),
                "kernel argument %d (%p) is not device or page-locked memory: an illegal "
                "address on a GPU",
                index, p);
  Die(what);
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  *attributes = {};
  switch (KindOf(p)) {
    case Memory::kDevice:
      attributes->type = cudaMemoryTypeDevice;
      break;
    case Memory::kPinned:
      attributes->type = cudaMemoryTypeHost;
      break;
    case Memory::kPageable:
      attributes->type = cudaMemoryTypeUnregistered;
      break;
  }
  return cudaSuccess;
}
