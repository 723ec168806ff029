// Causal attention through cuDNN's fused attention ("SDPA") engines, where
// DROVER_CUDA_ATTENTION=cudnn asks for them (cuda_ops.cu): the other way to the kernel table's
// own fused kernels (attention_mma.cu). On Hopper cuDNN's engines run on wgmma and TMA, which
// mma.sync kernels cannot use; PyTorch measured them at half our attention's time on an H200
// (tests/device/attention_profile.sh at a73c8bb: 9.7 ms against 19.5 for GPT-2 124M's twelve
// layers at batch 32). The graphs themselves, and how they follow cudnn-frontend's pattern,
// are cudnn_graphs.h's; this file runs them on the table's stream and buffers.
//
// cuDNN is opened at run time (dlopen of DROVER_CUDNN_LIBRARY, by default libcudnn.so.9 from
// the library path), only when asked for: a GPU node without cuDNN still runs every job on
// the table's own kernels. The emulated plugin carries a cuDNN of its own
// (tests/cuda_emu/cudnn_emu.cc), so these graphs, strides and buffers are checked against the
// CPU reference on every commit; that the real cuDNN's engines take and compile them for an
// sm_90 GPU is checked without one (tests/cuda/cudnn_graphs_test.cc); running them is the
// GPU's check (tests/device/check.sh).
//
// Not deterministic: cuDNN's backward adds dQ with atomics, so two runs differ in the last bits
// (the table's own kernels repeat bit for bit).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

#if __has_include(<cudnn_graph.h>)
#include "worker/engine/kernels/cuda/cudnn_graphs.h"
#define DROVER_HAVE_CUDNN 1
#endif

namespace drover::engine::cuda {

#ifndef DROVER_HAVE_CUDNN

struct CudnnAttention::Impl {};
std::unique_ptr<CudnnAttention> CudnnAttention::Open(cudaStream_t, bool, std::string* why) {
  *why = "this build has no cuDNN headers (cudnn_graph.h): rebuild where cuDNN 9 is installed";
  return nullptr;
}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::Applies(int, int, int, int, Precision) { return false; }
void CudnnAttention::Forward(float*, float*, const float*, int, int, int, int, Precision,
                             Scratch<float>*) {}
void CudnnAttention::Backward(float*, const float*, bool, const float*, const float*, const float*,
                              int, int, int, int, Precision, Scratch<float>*) {}

#else

using namespace cudnn_graphs;  // NOLINT: the graphs this file runs

namespace {

// "B=4 T=1024 NH=12 HS=64 bf16", for the log.
std::string Describe(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " HS=" + std::to_string(s.HS) + (s.type == CUDNN_DATA_HALF ? " fp16" : " bf16");
}

size_t Align64(size_t floats) { return (floats + 63) / 64 * 64; }

// Where the backward's scratch puts its parts, in floats from its start (each 256-byte
// aligned): dout in the run's type (where the caller's is floats), dQ's fp32 sum, the rows'
// dot, and the plan's workspace.
struct BackwardScratch {
  size_t dout16, dq_sum, dot, workspace, total;
};
BackwardScratch BackwardLayout(const Shape& s, int64_t workspace_bytes) {
  const size_t btc = static_cast<size_t>(s.B) * s.T * s.C();
  BackwardScratch l{};
  l.dout16 = 0;
  l.dq_sum = l.dout16 + Align64((btc + 1) / 2);
  l.dot = l.dq_sum + Align64(btc);
  l.workspace = l.dot + Align64(static_cast<size_t>(s.B) * s.NH * s.T);
  l.total = l.workspace + Align64((static_cast<size_t>(workspace_bytes) + 3) / 4);
  return l;
}

}  // namespace

struct CudnnAttention::Impl {
  Api api;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  bool required = true;  // a shape cuDNN does not take stops the process (Ready)
  // Values the graphs take by value, from the host; cudnnBackendExecute reads them at the call.
  // 16-byte aligned, as the graphs declare every tensor (cuDNN's documents do not say whether
  // it holds a by-value pointer to that).
  alignas(16) float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(16) float one = 1.0f;
  struct Plans {
    bool ok = false;
    std::string why;
    Plan forward, backward;
  };
  std::map<Shape, Plans> plans;

  // The shape's plans, made the first time it is asked for. Where cuDNN takes no engine for
  // them and cuDNN is required, the process stops, naming cuDNN's reason: the run asked for
  // cuDNN, and timing the table's own kernels in its place would answer another question.
  // Otherwise the shape is left to the table's own kernels, said once on stderr.
  Plans& Ready(const Shape& s) {
    auto [it, fresh] = plans.try_emplace(s);
    Plans& p = it->second;
    if (fresh) {
      std::string why;
      GraphBuilder forward(&api), backward(&api);
      ForwardGraph(forward, s);
      BackwardGraph(backward, s);
      p.ok = forward.Build(Target{handle, nullptr}, &p.forward, &why);
      if (!p.ok) p.why = "the forward graph: " + why;
      if (p.ok && !(p.ok = backward.Build(Target{handle, nullptr}, &p.backward, &why))) {
        p.why = "the backward graph: " + why;
      }
      if (p.ok) {
        std::fprintf(stderr,
                     "drover cuda: attention %s through cuDNN (workspace %lld bytes forward, "
                     "%lld backward)\n",
                     Describe(s).c_str(), static_cast<long long>(p.forward.workspace_bytes),
                     static_cast<long long>(p.backward.workspace_bytes));
      }
    }
    if (!p.ok && required) {
      CudaFail("cuDNN attention (DROVER_CUDA_ATTENTION=cudnn)", p.why.c_str(), __FILE__, __LINE__);
    }
    if (!p.ok && fresh) {
      std::fprintf(stderr,
                   "drover cuda: attention %s on the table's own kernels: cuDNN does not take "
                   "it (%s)\n",
                   Describe(s).c_str(), p.why.c_str());
    }
    return p;
  }

  // Runs `plan` on the table's stream with the tensors (uid, pointer) given.
  void Execute(const Plan& plan, const std::vector<std::pair<int64_t, const void*> >& tensors,
               void* workspace) {
    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    for (const auto& [uid, pointer] : tensors) {
      uids.push_back(uid);
      pointers.push_back(const_cast<void*>(pointer));
    }
    auto check = [&](cudnnStatus_t st, const char* what) {
      if (st != CUDNN_STATUS_SUCCESS) CudaFail(what, api.Explain(st).c_str(), __FILE__, __LINE__);
    };
    cudnnBackendDescriptor_t pack = nullptr;
    check(api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "a variant pack");
    Descriptor owned(&api, pack);
    check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.size(),
                           uids.data()),
          "the variant pack's ids");
    check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                           pointers.size(), pointers.data()),
          "the variant pack's pointers");
    check(api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                           &workspace),
          "the variant pack's workspace");
    check(api.Finalize(pack), "finalizing the variant pack");
    check(api.Execute(handle, plan.plan, pack), "cudnnBackendExecute");
  }
};

std::unique_ptr<CudnnAttention> CudnnAttention::Open(cudaStream_t stream, bool required,
                                                     std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->required = required;
  const char* library = std::getenv("DROVER_CUDNN_LIBRARY");
  if (!LoadApi(library != nullptr ? library : "libcudnn.so.9", &impl->api, why)) return nullptr;
  const size_t version = impl->api.GetVersion();
  if (version < 90000) {
    *why = "cuDNN " + std::to_string(version) + " is older than 9.0, which these graphs need";
    return nullptr;
  }
  // cuDNN before 9.10 wants the lowest float for a masked score, later ones -inf
  // (cudnn-frontend's choice).
  if (version < 91000) impl->neg_inf = std::numeric_limits<float>::lowest();
  cudnnStatus_t st = impl->api.Create(&impl->handle);
  if (st == CUDNN_STATUS_SUCCESS) st = impl->api.SetStream(impl->handle, stream);
  if (st != CUDNN_STATUS_SUCCESS) {
    *why = "cudnnCreate: " + impl->api.Explain(st);
    return nullptr;
  }
  impl->stream = stream;
  std::fprintf(stderr, "drover cuda: attention through cuDNN %zu where it applies\n", version);
  std::unique_ptr<CudnnAttention> attention(new CudnnAttention());
  attention->impl_ = std::move(impl);
  return attention;
}

CudnnAttention::~CudnnAttention() = default;  // the handle and the library live until exit

bool CudnnAttention::Applies(int B, int T, int C, int NH, Precision operands) {
  if (operands == Precision::kFp32 || C % NH != 0) return false;
  const int HS = C / NH;
  // The head sizes cuDNN's flash engines take, and whole 128-row tiles of the sequence (before
  // 9.16, cuDNN needs a padding mask otherwise, which cudnn-frontend adds).
  if (HS % 8 != 0 || HS > 128 || T % 128 != 0) return false;
  return impl_->Ready(ShapeOf(B, T, C, NH, operands)).ok;
}

void CudnnAttention::Forward(float* out, float* state, const float* qkv, int B, int T, int C,
                             int NH, Precision operands, Scratch<float>* scratch) {
  const Shape s = ShapeOf(B, T, C, NH, operands);
  const Impl::Plans& plans = impl_->Ready(s);
  float* workspace =
      scratch->Get(Align64((static_cast<size_t>(plans.forward.workspace_bytes) + 3) / 4));
  alignas(16) const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  const auto* q = reinterpret_cast<const uint16_t*>(qkv);  // 16-bit elements
  impl_->Execute(plans.forward,
                 {{kQ, q},
                  {kK, q + C},
                  {kV, q + 2 * C},
                  {kO, out},
                  {kStats, state},
                  {kScale, &scale},
                  {kNegInf, &impl_->neg_inf}},
                 workspace);
}

void CudnnAttention::Backward(float* dqkv, const float* dout, bool dout_narrow, const float* out,
                              const float* state, const float* qkv, int B, int T, int C, int NH,
                              Precision operands, Scratch<float>* scratch_buffer) {
  const Shape s = ShapeOf(B, T, C, NH, operands);
  const Impl::Plans& plans = impl_->Ready(s);
  const BackwardScratch l = BackwardLayout(s, plans.backward.workspace_bytes);
  float* scratch = scratch_buffer->Get(l.total);
  const size_t btc = static_cast<size_t>(B) * T * C;
  const void* dout16 = dout;
  if (!dout_narrow) {  // cuDNN reads dout in the run's type
    NarrowCopy(scratch + l.dout16, dout, btc, operands, impl_->stream);
    dout16 = scratch + l.dout16;
  }
  // cuDNN before 9.6 adds dQ into its sum without clearing it first.
  DROVER_CUDA_CHECK(cudaMemsetAsync(scratch + l.dq_sum, 0, btc * sizeof(float), impl_->stream));
  alignas(16) const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  const auto* q = reinterpret_cast<const uint16_t*>(qkv);
  auto* dq = reinterpret_cast<uint16_t*>(dqkv);
  impl_->Execute(plans.backward,
                 {{kQ, q},
                  {kK, q + C},
                  {kV, q + 2 * C},
                  {kO, out},
                  {kDout, dout16},
                  {kStats, state},
                  {kDq, dq},
                  {kDk, dq + C},
                  {kDv, dq + 2 * C},
                  {kDqSum, scratch + l.dq_sum},
                  {kDot, scratch + l.dot},
                  {kScale, &scale},
                  {kNegInf, &impl_->neg_inf},
                  {kOne, &impl_->one}},
                 scratch + l.workspace);
}

#endif  // DROVER_HAVE_CUDNN

}  // namespace drover::engine::cuda
