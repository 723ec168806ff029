// A kernel table whose memory behaves like a discrete GPU's, on the CPU: the engine's
// multi-rank paths for device memory (staged communicators, ops.h's host/device split)
// tested on every commit, without a GPU.
//
// Its arenas live in one reserved address range that is mapped PROT_NONE except while one
// of its ops runs, so host code that reads or writes "device" memory directly (a loop over
// a gradient, a memcpy of an activation, a communicator moving it as host memory) faults
// at once; a SIGSEGV handler names the address as emulated device memory before aborting.
// Every op also checks that the pointers it is given are device memory (and token ids host
// memory, as CudaOps expects), so device kernels handed a host buffer fail too, with the op
// and argument named. The arithmetic is CpuOps', so results equal the CPU's bit for bit.
//
// What it cannot catch: a host access while another thread is inside one of its ops (the
// range is open then), and ordering bugs between streams (there is one, synchronous).
// Thread-safety: that of ops.h; the open/closed state is counted under a mutex.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <vector>

#include "common/mutex.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine::testing {

class EmulatedDeviceOps final : public Ops {
 public:
  // Reserves `capacity` bytes of address space (nothing is committed until used).
  explicit EmulatedDeviceOps(size_t capacity = size_t{4} << 30);
  ~EmulatedDeviceOps() override;
  EmulatedDeviceOps(const EmulatedDeviceOps&) = delete;
  EmulatedDeviceOps& operator=(const EmulatedDeviceOps&) = delete;

  const char* name() const override { return "emulated-device"; }
  Allocator* allocator() override { return &allocator_; }
  // Staging buffers and checkpoint snapshots are plain host memory, outside the emulated
  // device's range, counted: host_allocations() is how many arrays were taken from it.
  Allocator* host_allocator() override { return &host_; }
  int host_allocations() const { return host_.allocations.load(); }
  bool IsDeviceMemory(const void* p) const override;

  void Fill(float* x, float value, size_t n) override;
  void Copy(float* dst, const float* src, size_t n) override;
  void Add(float* y, const float* x, size_t n) override;
  void Scale(float* x, size_t n, float s) override;
  double SumSquares(const float* x, size_t n) override;
  void ToHost(float* host, const float* x, size_t n) override;
  void FromHost(float* x, const float* host, size_t n) override;
  void Round(float* x, size_t n, Precision p) override;
  void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                      int T, int C, Precision store) override;
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                       int T, int C) override;
  void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                             const float* dout, const int32_t* inp, int B, int T, int C) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, Precision store) override;
  void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                         const float* dout, bool dout_operand, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         bool accumulate, Precision store) override;
  void MatmulForward(float* out, bool out_operand, const float* inp, const float* weight,
                     const float* bias, const float* residual, int N, int C, int OC, int ldo,
                     Precision operands) override;
  void MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                      const float* dout, bool dout_operand, const float* inp, const float* weight,
                      int N, int C, int OC, int ldo, bool accumulate, Precision operands) override;
  void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                        Precision operands) override;
  void AttentionBackward(float* dqkv, const float* dout, bool dout_operand, const float* out,
                         const float* att, const float* qkv, int B, int T, int C, int NH,
                         Precision operands) override;
  void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) override;
  void GeluForward(float* out, const float* inp, size_t N, Precision store) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                    Precision store) override;
  float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V, int Vp, Precision operands) override;
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            Precision store) override;
  void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                               const int32_t* targets, int N, int V, int Vp,
                               Precision operands) override;
  float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                            const float* target_logits, int parts, int N) override;
  void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                   float weight_decay, const AdamWConfig& config, int64_t t) override;

 private:
  class RangeAllocator final : public Allocator {
   public:
    explicit RangeAllocator(EmulatedDeviceOps* owner) : owner_(owner) {}
    float* Allocate(size_t n) override;
    void Free(float* p) override;

   private:
    EmulatedDeviceOps* owner_;
  };
  class CountingHostAllocator final : public Allocator {
   public:
    float* Allocate(size_t n) override {
      if (n > 0) ++allocations;
      return HostAllocator()->Allocate(n);
    }
    void Free(float* p) override { HostAllocator()->Free(p); }
    std::atomic<int> allocations{0};
  };
  class Open;  // an op in progress: the range is accessible while one exists

  void Enter();
  void Leave();
  // CHECKs that p (of op `op`, argument `arg`) is device memory (null allowed).
  void RequireDevice(const void* p, const char* op, const char* arg) const;
  void RequireHost(const void* p, const char* op, const char* arg) const;

  char* base_ = nullptr;
  size_t capacity_ = 0;
  Mutex mu_;
  size_t used_ GUARDED_BY(mu_) = 0;  // bytes of the range handed out so far (page multiple)
  int open_ GUARDED_BY(mu_) = 0;     // ops in progress
  std::map<char*, size_t> sizes_ GUARDED_BY(mu_);      // live allocations: start -> bytes
  std::multimap<size_t, char*> free_ GUARDED_BY(mu_);  // freed blocks by size
  RangeAllocator allocator_{this};
  CountingHostAllocator host_;
};

}  // namespace drover::engine::testing
