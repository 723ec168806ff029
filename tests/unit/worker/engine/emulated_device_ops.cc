#include "tests/unit/worker/engine/emulated_device_ops.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace drover::engine::testing {
namespace {

constexpr size_t kPage = 4096;
constexpr int kMaxRanges = 64;

// The reserved ranges of every live EmulatedDeviceOps, read by the signal handler (so plain
// atomics, no locks). A slot is claimed with a compare-exchange on `base`.
struct ReservedRange {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
};
ReservedRange g_ranges[kMaxRanges];

void WriteHex(char* out, uintptr_t v) {
  static const char kDigits[] = "0123456789abcdef";
  out[0] = '0';
  out[1] = 'x';
  for (int i = 0; i < 16; ++i) out[2 + i] = kDigits[(v >> (60 - 4 * i)) & 0xf];
}

// Async-signal-safe: only write(2), sigaction and plain loads.
void OnSegv(int sig, siginfo_t* info, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const ReservedRange& r : g_ranges) {
    const uintptr_t base = r.base.load();
    if (base != 0 && addr >= base && addr < base + r.size.load()) {
      char msg[] =
          "emulated device memory: host code touched device memory at 0x0000000000000000 "
          "(outside every op: read it with Ops::ToHost, or hand it to a kernel)\n";
      WriteHex(std::strstr(msg, "0x"), addr);
      (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
      break;
    }
  }
  // Fault again with the default action: the process dies with SIGSEGV, as it would have.
  signal(sig, SIG_DFL);
}

void InstallHandlerOnce() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, nullptr) == 0;
  }();
  DROVER_CHECK(installed);
}

}  // namespace

class EmulatedDeviceOps::Open {
 public:
  explicit Open(EmulatedDeviceOps* ops) : ops_(ops) { ops_->Enter(); }
  ~Open() { ops_->Leave(); }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;

 private:
  EmulatedDeviceOps* ops_;
};

EmulatedDeviceOps::EmulatedDeviceOps(size_t capacity) : capacity_(capacity) {
  void* p = mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DROVER_CHECK_MSG(p != MAP_FAILED, "cannot reserve the emulated device's address range");
  base_ = static_cast<char*>(p);
  bool registered = false;
  for (ReservedRange& r : g_ranges) {
    uintptr_t expected = 0;
    if (r.base.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(base_))) {
      r.size.store(capacity_);
      registered = true;
      break;
    }
  }
  DROVER_CHECK_MSG(registered, "too many EmulatedDeviceOps alive at once");
  InstallHandlerOnce();
}

EmulatedDeviceOps::~EmulatedDeviceOps() {
  for (ReservedRange& r : g_ranges) {
    if (r.base.load() == reinterpret_cast<uintptr_t>(base_)) {
      r.size.store(0);
      r.base.store(0);
    }
  }
  munmap(base_, capacity_);
}

bool EmulatedDeviceOps::IsDeviceMemory(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + capacity_;
}

void EmulatedDeviceOps::Enter() {
  MutexLock lock(&mu_);
  if (open_++ == 0 && used_ > 0) DROVER_CHECK(mprotect(base_, used_, PROT_READ | PROT_WRITE) == 0);
}

void EmulatedDeviceOps::Leave() {
  MutexLock lock(&mu_);
  if (--open_ == 0 && used_ > 0) DROVER_CHECK(mprotect(base_, used_, PROT_NONE) == 0);
}

float* EmulatedDeviceOps::RangeAllocator::Allocate(size_t n) {
  if (n == 0) return nullptr;
  EmulatedDeviceOps* o = owner_;
  const size_t bytes = (n * sizeof(float) + kPage - 1) / kPage * kPage;
  Open open(o);
  char* p = nullptr;
  {
    MutexLock lock(&o->mu_);
    auto it = o->free_.find(bytes);
    if (it != o->free_.end()) {
      p = it->second;
      o->free_.erase(it);
    } else {
      DROVER_CHECK_MSG(o->used_ + bytes <= o->capacity_, "the emulated device is out of memory");
      p = o->base_ + o->used_;
      o->used_ += bytes;
      // Open already: the new pages must be accessible like the rest until Leave.
      DROVER_CHECK(mprotect(p, bytes, PROT_READ | PROT_WRITE) == 0);
    }
    o->sizes_[p] = bytes;
  }
  std::memset(p, 0, bytes);
  return reinterpret_cast<float*>(p);
}

void EmulatedDeviceOps::RangeAllocator::Free(float* p) {
  if (p == nullptr) return;
  EmulatedDeviceOps* o = owner_;
  MutexLock lock(&o->mu_);
  auto it = o->sizes_.find(reinterpret_cast<char*>(p));
  DROVER_CHECK_MSG(it != o->sizes_.end(), "freeing memory the emulated device did not allocate");
  o->free_.emplace(it->second, it->first);
  o->sizes_.erase(it);
}

void EmulatedDeviceOps::RequireDevice(const void* p, const char* op, const char* arg) const {
  if (p == nullptr || IsDeviceMemory(p)) return;
  CheckFailed(__FILE__, __LINE__, "IsDeviceMemory",
              std::string(op) + ": argument " + arg + " is host memory, not device memory");
}

void EmulatedDeviceOps::RequireHost(const void* p, const char* op, const char* arg) const {
  if (p == nullptr || !IsDeviceMemory(p)) return;
  CheckFailed(__FILE__, __LINE__, "!IsDeviceMemory",
              std::string(op) + ": argument " + arg + " is device memory, not host memory");
}

// Each op: check where its pointers live, open the range, run CpuOps' kernel.
#define DEV(p) RequireDevice(p, __func__, #p)
#define HOST(p) RequireHost(p, __func__, #p)

void EmulatedDeviceOps::Fill(float* x, float value, size_t n) {
  DEV(x);
  Open open(this);
  CpuOps()->Fill(x, value, n);
}
void EmulatedDeviceOps::Copy(float* dst, const float* src, size_t n) {
  DEV(dst);
  DEV(src);
  Open open(this);
  CpuOps()->Copy(dst, src, n);
}
void EmulatedDeviceOps::Add(float* y, const float* x, size_t n) {
  DEV(y);
  DEV(x);
  Open open(this);
  CpuOps()->Add(y, x, n);
}
void EmulatedDeviceOps::Scale(float* x, size_t n, float s) {
  DEV(x);
  Open open(this);
  CpuOps()->Scale(x, n, s);
}
double EmulatedDeviceOps::SumSquares(const float* x, size_t n) {
  DEV(x);
  Open open(this);
  return CpuOps()->SumSquares(x, n);
}
void EmulatedDeviceOps::ToHost(float* host, const float* x, size_t n) {
  HOST(host);
  DEV(x);
  Open open(this);
  CpuOps()->ToHost(host, x, n);
}
void EmulatedDeviceOps::FromHost(float* x, const float* host, size_t n) {
  DEV(x);
  HOST(host);
  Open open(this);
  CpuOps()->FromHost(x, host, n);
}
void EmulatedDeviceOps::Round(float* x, size_t n, Precision p) {
  DEV(x);
  Open open(this);
  CpuOps()->Round(x, n, p);
}
void EmulatedDeviceOps::EncoderForward(float* out, const int32_t* inp, const float* wte,
                                       const float* wpe, int B, int T, int C, Precision store) {
  DEV(out);
  HOST(inp);
  DEV(wte);
  DEV(wpe);
  Open open(this);
  CpuOps()->EncoderForward(out, inp, wte, wpe, B, T, C, store);
}
void EmulatedDeviceOps::EncoderBackward(float* dwte, float* dwpe, const float* dout,
                                        const int32_t* inp, int B, int T, int C) {
  DEV(dwte);
  DEV(dwpe);
  DEV(dout);
  HOST(inp);
  Open open(this);
  CpuOps()->EncoderBackward(dwte, dwpe, dout, inp, B, T, C);
}
void EmulatedDeviceOps::EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi,
                                              size_t wpe_offset, const float* dout,
                                              const int32_t* inp, int B, int T, int C) {
  DEV(dwindow);
  DEV(dout);
  HOST(inp);
  Open open(this);
  CpuOps()->EncoderBackwardWindow(dwindow, lo, hi, wpe_offset, dout, inp, B, T, C);
}
void EmulatedDeviceOps::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C,
                                         Precision store) {
  DEV(out);
  DEV(mean);
  DEV(rstd);
  DEV(inp);
  DEV(weight);
  DEV(bias);
  Open open(this);
  CpuOps()->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, store);
}
void EmulatedDeviceOps::LayerNormBackward(float* dinp, float* dinp_copy, float* dweight,
                                          float* dbias, const float* dout, bool dout_operand,
                                          const float* inp, const float* weight, const float* mean,
                                          const float* rstd, int N, int C, bool accumulate,
                                          Precision store) {
  DEV(dinp);
  if (dinp_copy != nullptr) DEV(dinp_copy);
  DEV(dweight);
  DEV(dbias);
  DEV(dout);
  DEV(inp);
  DEV(weight);
  DEV(mean);
  DEV(rstd);
  Open open(this);
  CpuOps()->LayerNormBackward(dinp, dinp_copy, dweight, dbias, dout, dout_operand, inp, weight,
                              mean, rstd, N, C, accumulate, store);
}
void EmulatedDeviceOps::MatmulForward(float* out, bool out_operand, const float* inp,
                                      const float* weight, const float* bias, const float* residual,
                                      int N, int C, int OC, int ldo, Precision operands) {
  DEV(out);
  DEV(inp);
  DEV(weight);
  DEV(bias);
  DEV(residual);
  Open open(this);
  CpuOps()->MatmulForward(out, out_operand, inp, weight, bias, residual, N, C, OC, ldo, operands);
}
void EmulatedDeviceOps::MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                                       const float* dout, bool dout_operand, const float* inp,
                                       const float* weight, int N, int C, int OC, int ldo,
                                       bool accumulate, Precision operands) {
  DEV(dinp);
  DEV(dweight);
  DEV(dbias);
  DEV(dout);
  DEV(inp);
  DEV(weight);
  Open open(this);
  CpuOps()->MatmulBackward(dinp, dinp_operand, dweight, dbias, dout, dout_operand, inp, weight, N,
                           C, OC, ldo, accumulate, operands);
}
void EmulatedDeviceOps::AttentionForward(float* out, float* att, const float* qkv, int B, int T,
                                         int C, int NH, Precision operands) {
  DEV(out);
  DEV(att);
  DEV(qkv);
  Open open(this);
  CpuOps()->AttentionForward(out, att, qkv, B, T, C, NH, operands);
}
void EmulatedDeviceOps::AttentionBackward(float* dqkv, const float* dout, bool dout_operand,
                                          const float* out, const float* att, const float* qkv,
                                          int B, int T, int C, int NH, Precision operands) {
  DEV(dqkv);
  DEV(dout);
  DEV(att);
  DEV(qkv);
  Open open(this);
  CpuOps()->AttentionBackward(dqkv, dout, dout_operand, out, att, qkv, B, T, C, NH, operands);
}
void EmulatedDeviceOps::AttentionDecode(float* out, const float* qkv, int from, int rows, int C,
                                        int NH) {
  DEV(out);
  DEV(qkv);
  Open open(this);
  CpuOps()->AttentionDecode(out, qkv, from, rows, C, NH);
}
void EmulatedDeviceOps::GeluForward(float* out, const float* inp, size_t N, Precision store) {
  DEV(out);
  DEV(inp);
  Open open(this);
  CpuOps()->GeluForward(out, inp, N, store);
}
void EmulatedDeviceOps::GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                                     Precision store) {
  DEV(dinp);
  DEV(inp);
  DEV(dout);
  Open open(this);
  CpuOps()->GeluBackward(dinp, inp, dout, N, store);
}
float EmulatedDeviceOps::CrossEntropyForward(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int N, int V, int Vp,
                                             Precision operands) {
  DEV(losses);
  DEV(lse);
  DEV(logits);
  HOST(targets);
  Open open(this);
  return CpuOps()->CrossEntropyForward(losses, lse, logits, targets, N, V, Vp, operands);
}
void EmulatedDeviceOps::CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                                             const int32_t* targets, float dloss, int N, int V,
                                             int Vp, Precision store) {
  DEV(dlogits);
  DEV(logits);
  DEV(lse);
  HOST(targets);
  Open open(this);
  CpuOps()->CrossEntropyBackward(dlogits, logits, lse, targets, dloss, N, V, Vp, store);
}
void EmulatedDeviceOps::CrossEntropyPartForward(float* lse, float* target_logits,
                                                const float* logits, const int32_t* targets, int N,
                                                int V, int Vp, Precision operands) {
  DEV(lse);
  DEV(target_logits);
  DEV(logits);
  HOST(targets);
  Open open(this);
  CpuOps()->CrossEntropyPartForward(lse, target_logits, logits, targets, N, V, Vp, operands);
}
float EmulatedDeviceOps::CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                                             const float* target_logits, int parts, int N) {
  DEV(losses);
  DEV(lse);
  DEV(lse_parts);
  DEV(target_logits);
  Open open(this);
  return CpuOps()->CrossEntropyCombine(losses, lse, lse_parts, target_logits, parts, N);
}
void EmulatedDeviceOps::AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n,
                                    float lr, float weight_decay, const AdamWConfig& config,
                                    int64_t t) {
  DEV(params);
  DEV(grads);
  DEV(m);
  DEV(v);
  Open open(this);
  CpuOps()->AdamWUpdate(params, grads, m, v, n, lr, weight_decay, config, t);
}

#undef DEV
#undef HOST

}  // namespace drover::engine::testing
