// Causal attention through cuDNN's fused attention ("SDPA") engines, where
// DROVER_CUDA_ATTENTION=cudnn asks for them (cuda_ops.cu): the other way to the kernel table's
// own fused kernels (attention_mma.cu). On Hopper cuDNN's engines run on wgmma and TMA, which
// mma.sync kernels cannot use; PyTorch measured them at half our attention's time on an H200
// (tests/device/attention_profile.sh at a73c8bb: 9.7 ms against 19.5 for GPT-2 124M's twelve
// layers at batch 32).
//
// The graphs are the pattern cuDNN's engines recognise, built op by op through the backend
// API (cudnn_graph.h) as cudnn-frontend's composite lowering of its SDPA nodes builds them
// (the frontend is header-only C++ outside Debian, so it is not a dependency):
//   forward:  S = Q K^T; S *= scale; S = row >= col ? S : -inf; M = max S; E = exp(S - M);
//             Z = sum E; stats = M + log Z; P = E / Z (in the run's type); O = P V
//   backward: dot = rowsum(dO * O) * 1; P = exp(mask(scale Q K^T - stats)); dV = P^T dO;
//             dS = P (dO V^T - dot) scale; dK = dS^T Q; dQ = dS K (in fp32, then the run's type)
// Q, K and V are read where they lie in the packed qkv (B, T, 3C) through strides, out and
// dqkv written likewise, so nothing is copied; stats is the (B, NH, T) state the table keeps
// for backward, each row's log-sum-exp, as the mma kernels' state is.
//
// cuDNN is opened at run time (dlopen of DROVER_CUDNN_LIBRARY, by default libcudnn.so.9 from
// the library path), only when asked for: a GPU node without cuDNN still runs every job on
// the table's own kernels. The emulated plugin carries a cuDNN of its own
// (tests/cuda_emu/cudnn_emu.cc), so these graphs, strides and buffers are checked against the
// CPU reference on every commit; whether cuDNN's engines accept the graphs only a GPU says
// (tests/device/check.sh).
//
// Not deterministic: cuDNN's backward adds dQ with atomics, so two runs differ in the last bits
// (the table's own kernels repeat bit for bit).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define DROVER_HAVE_CUDNN 1
#endif

namespace drover::engine::cuda {

#ifndef DROVER_HAVE_CUDNN

struct CudnnAttention::Impl {};
std::unique_ptr<CudnnAttention> CudnnAttention::Open(cudaStream_t, std::string* why) {
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

// Named, not anonymous: CudnnAttention::Impl holds these types (GCC warns of a class with
// external linkage that holds internal ones).
namespace cudnn_graphs {

// The library's entry points, resolved by name (cudnn_graph.h's declarations give their types).
struct Api {
  void* library = nullptr;
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;

  // cuDNN's name for `status` and its own account of the last failure on this thread.
  std::string Explain(cudnnStatus_t status) const {
    char last[512] = {};
    GetLastErrorString(last, sizeof(last));
    std::string text = GetErrorString(status);
    if (last[0] != '\0') text += std::string(": ") + last;
    return text;
  }
};

template <typename Fn>
bool Resolve(void* library, const char* name, Fn* fn, std::string* why) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *why = std::string("the library has no ") + name + " (cuDNN 9 has)";
  return *fn != nullptr;
}

bool LoadApi(Api* api, std::string* why) {
  const char* env = std::getenv("DROVER_CUDNN_LIBRARY");
  const char* name = env != nullptr ? env : "libcudnn.so.9";
  api->library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    *why = std::string("cannot open ") + name + " (" + dlerror() +
           "): install cuDNN 9, or name its libcudnn.so.9 in DROVER_CUDNN_LIBRARY";
    return false;
  }
  void* l = api->library;
  return Resolve(l, "cudnnGetVersion", &api->GetVersion, why) &&
         Resolve(l, "cudnnGetErrorString", &api->GetErrorString, why) &&
         Resolve(l, "cudnnGetLastErrorString", &api->GetLastErrorString, why) &&
         Resolve(l, "cudnnCreate", &api->Create, why) &&
         Resolve(l, "cudnnSetStream", &api->SetStream, why) &&
         Resolve(l, "cudnnBackendCreateDescriptor", &api->CreateDescriptor, why) &&
         Resolve(l, "cudnnBackendDestroyDescriptor", &api->DestroyDescriptor, why) &&
         Resolve(l, "cudnnBackendFinalize", &api->Finalize, why) &&
         Resolve(l, "cudnnBackendSetAttribute", &api->SetAttribute, why) &&
         Resolve(l, "cudnnBackendGetAttribute", &api->GetAttribute, why) &&
         Resolve(l, "cudnnBackendExecute", &api->Execute, why);
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor(const Api* api, cudnnBackendDescriptor_t d) : api_(api), d_(d) {}
  Descriptor(Descriptor&& other) noexcept
      : api_(other.api_), d_(std::exchange(other.d_, nullptr)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;
  ~Descriptor() {
    if (d_ != nullptr) api_->DestroyDescriptor(d_);
  }

 private:
  const Api* api_;
  cudnnBackendDescriptor_t d_;
};

// An execution plan and everything it was made from (cuDNN's descriptors refer to each other).
struct Plan {
  std::vector<Descriptor> parts;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
};

using Dims = std::vector<int64_t>;

// The unique ids of the tensors the caller passes (the variant pack's); virtual tensors, which
// live inside the fused kernels, are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kDout,
  kDq,
  kDk,
  kDv,
  kDqSum,
  kDot,
  kOne,
  kFirstVirtual = 100,
};

// Builds one operation graph and its plan. The first failing call is kept and the later ones
// skipped, so that a graph reads as a list of ops with one check at the end (Build).
class GraphBuilder {
 public:
  explicit GraphBuilder(const Api* api) : api_(api) {}

  enum class Kind { kPassed, kVirtual, kByValue };
  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                                  const Dims& strides, Kind kind) {
    cudnnBackendDescriptor_t t = New(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool is_virtual = kind == Kind::kVirtual, by_value = kind == Kind::kByValue;
    Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.size(), dims.data());
    Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.size(), strides.data());
    Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    Finalize(t, "a tensor");
    return t;
  }
  // A tensor that exists only inside the fused kernels.
  cudnnBackendDescriptor_t Virtual(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return Tensor(next_virtual_++, type, dims, strides, Kind::kVirtual);
  }
  // A scalar the caller passes by value (a host float, read at each execution).
  cudnnBackendDescriptor_t Scalar(int64_t uid) {
    return Tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, Kind::kByValue);
  }

  // y = mode(x[, b[, t]]), computed in `compute`; axis: GEN_INDEX's.
  void Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = New(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    if (axis >= 0) Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    Finalize(pw, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = New(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) SetDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) SetDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    AddOp(op, "a pointwise operation");
  }
  // The float math the graphs are made of.
  void Binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y) {
    Pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }
  void Unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }

  // c = a b over the last two dims, batched over the others, accumulated in fp32.
  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = New(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    Finalize(mm, "a matmul descriptor");
    cudnnBackendDescriptor_t op = New(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    AddOp(op, "a matmul");
  }

  // y = x reduced (sum or max) over the dims where y has 1.
  void Reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = New(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    Finalize(r, "a reduction descriptor");
    cudnnBackendDescriptor_t op = New(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    AddOp(op, "a reduction");
  }

  // y = x seen through y's dims and strides: a transpose, where the two swap.
  void Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = New(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    SetDescriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    AddOp(op, "a reshape");
  }

  // The graph of the ops added so far, and the first plan that one of the engines cuDNN's
  // heuristics suggest can be made from (mode A's, then the fallback list's, as
  // cudnn-frontend's users ask for them). False with *why when a call failed or no engine
  // takes the graph, with each engine's refusal.
  bool Build(cudnnHandle_t handle, Plan* plan, std::string* why) {
    cudnnBackendDescriptor_t graph = New(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.size(),
        ops_.data());
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    Finalize(graph, "the operation graph");
    std::string refusals;
    int64_t offered = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      if (!error_.empty() || plan->plan != nullptr) break;
      TryEngines(handle, graph, mode, plan, &refusals, &offered);
    }
    if (error_.empty() && plan->plan == nullptr) {
      error_ = "no engine of cuDNN " + std::to_string(api_->GetVersion()) +
               " takes the graph (its heuristics offered " + std::to_string(offered) + ")" +
               refusals;
    }
    *why = error_;
    plan->parts = std::move(descriptors_);
    if (!error_.empty()) plan->plan = nullptr;
    return error_.empty();
  }

 private:
  // The engine configurations heuristics `mode` suggests for `graph`, each tried in turn until
  // one finalizes into *plan; the others' refusals are added to *refusals.
  void TryEngines(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                  Plan* plan, std::string* refusals, int64_t* offered) {
    cudnnBackendDescriptor_t heuristics = New(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    SetDescriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    Set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    Finalize(heuristics, "the engine heuristics");
    int64_t count = 0;
    if (error_.empty()) {
      Check(api_->GetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
            "the number of engines");
    }
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count && error_.empty(); ++i) {
      configs.push_back(New(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    }
    if (!configs.empty() && error_.empty()) {
      Check(
          api_->GetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, configs.size(), &count, configs.data()),
          "the engines");
    }
    *offered += count;
    for (int64_t i = 0; i < count && error_.empty() && plan->plan == nullptr; ++i) {
      cudnnBackendDescriptor_t candidate = New(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      Set(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      SetDescriptor(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
      if (!error_.empty()) break;
      const cudnnStatus_t st = api_->Finalize(candidate);
      if (st != CUDNN_STATUS_SUCCESS) {  // this engine declines the graph; the next may not
        *refusals += "; mode " + std::to_string(mode) + " engine " + std::to_string(i) + ": " +
                     api_->Explain(st);
        continue;
      }
      int64_t got = 0;
      Check(api_->GetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &got, &plan->workspace_bytes),
            "the plan's workspace size");
      plan->plan = candidate;
    }
  }

  cudnnBackendDescriptor_t New(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    if (!error_.empty()) return nullptr;
    const cudnnStatus_t st = api_->CreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
      error_ = "cudnnBackendCreateDescriptor(" + std::to_string(type) + "): " + api_->Explain(st);
      return nullptr;
    }
    descriptors_.emplace_back(api_, d);
    return d;
  }
  void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    if (error_.empty()) {
      Check(api_->SetAttribute(d, name, type, count, value),
            ("setting attribute " + std::to_string(name)).c_str());
    }
  }
  void SetDescriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value) {
    Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void Finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (error_.empty()) Check(api_->Finalize(d), (std::string("finalizing ") + what).c_str());
  }
  void AddOp(cudnnBackendDescriptor_t op, const char* what) {
    Finalize(op, what);
    ops_.push_back(op);
  }
  void Check(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS && error_.empty()) {
      error_ = std::string(what) + " (after " + std::to_string(ops_.size()) +
               " operations): " + api_->Explain(st);
    }
  }

  const Api* api_;
  std::vector<Descriptor> descriptors_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::string error_;
  int64_t next_virtual_ = kFirstVirtual;
};

using Kind = GraphBuilder::Kind;

// One attention shape: batch, heads, sequence, head size, and the run's 16-bit type.
struct Shape {
  int64_t B, NH, T, HS;
  cudnnDataType_t type;
  int64_t C() const { return NH * HS; }
  // Dims of the (B, NH, ...) views, and their strides, in elements.
  Dims Bhtd() const { return {B, NH, T, HS}; }
  Dims Bhdt() const { return {B, NH, HS, T}; }
  Dims Bhtt() const { return {B, NH, T, T}; }
  Dims Bht1() const { return {B, NH, T, 1}; }
  Dims InQkv() const { return {T * 3 * C(), HS, 3 * C(), 1}; }            // q, k or v: (t, d)
  Dims InQkvTransposed() const { return {T * 3 * C(), HS, 1, 3 * C()}; }  // k or v: (d, t)
  Dims InOut() const { return {T * C(), HS, C(), 1}; }                    // out or dout
  Dims Packed() const { return {NH * T * HS, T * HS, HS, 1}; }
  Dims PackedScores() const { return {NH * T * T, T * T, T, 1}; }
  Dims TransposedScores() const { return {NH * T * T, T * T, 1, T}; }
  Dims PackedRows() const { return {NH * T, T, 1, 1}; }
  bool operator<(const Shape& o) const {
    return std::tie(B, NH, T, HS, type) < std::tie(o.B, o.NH, o.T, o.HS, o.type);
  }
};

Shape ShapeOf(int B, int T, int C, int NH, Precision operands) {
  return Shape{B, NH, T, C / NH,
               operands == Precision::kFp16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16};
}

// scores = row >= col ? scores : -inf, as cudnn-frontend's causal mask lowers.
cudnnBackendDescriptor_t CausalMask(GraphBuilder& g, const Shape& s,
                                    cudnnBackendDescriptor_t scores,
                                    cudnnBackendDescriptor_t neg_inf) {
  cudnnBackendDescriptor_t row = g.Virtual(CUDNN_DATA_INT32, s.Bhtt(), s.PackedScores());
  cudnnBackendDescriptor_t col = g.Virtual(CUDNN_DATA_INT32, s.Bhtt(), s.PackedScores());
  cudnnBackendDescriptor_t keep = g.Virtual(CUDNN_DATA_BOOLEAN, s.Bhtt(), s.PackedScores());
  cudnnBackendDescriptor_t masked = g.Virtual(CUDNN_DATA_FLOAT, s.Bhtt(), s.PackedScores());
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, row, 2);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, col, 3);
  g.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, neg_inf, keep, masked);
  return masked;
}

// scale q k^T, in fp32: both graphs' first product.
cudnnBackendDescriptor_t ScaledScores(GraphBuilder& g, const Shape& s, cudnnBackendDescriptor_t q,
                                      cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale) {
  cudnnBackendDescriptor_t scores = g.Virtual(CUDNN_DATA_FLOAT, s.Bhtt(), s.PackedScores());
  cudnnBackendDescriptor_t scaled = g.Virtual(CUDNN_DATA_FLOAT, s.Bhtt(), s.PackedScores());
  g.Matmul(q, kt, scores);
  g.Binary(CUDNN_POINTWISE_MUL, scores, scale, scaled);
  return scaled;
}

void ForwardGraph(GraphBuilder& g, const Shape& s) {
  const Kind io = Kind::kPassed;
  auto q = g.Tensor(kQ, s.type, s.Bhtd(), s.InQkv(), io);
  auto kt = g.Tensor(kK, s.type, s.Bhdt(), s.InQkvTransposed(), io);
  auto v = g.Tensor(kV, s.type, s.Bhtd(), s.InQkv(), io);
  auto o = g.Tensor(kO, s.type, s.Bhtd(), s.InOut(), io);
  auto stats = g.Tensor(kStats, CUDNN_DATA_FLOAT, s.Bht1(), s.PackedRows(), io);
  auto scale = g.Scalar(kScale);
  auto neg_inf = g.Scalar(kNegInf);
  auto row = [&] { return g.Virtual(CUDNN_DATA_FLOAT, s.Bht1(), s.PackedRows()); };
  auto scores = [&](cudnnDataType_t type) { return g.Virtual(type, s.Bhtt(), s.PackedScores()); };

  auto masked = CausalMask(g, s, ScaledScores(g, s, q, kt, scale), neg_inf);
  // The softmax, keeping each row's log-sum-exp for backward.
  auto max = row(), sum = row(), log_sum = row();
  auto shifted = scores(CUDNN_DATA_FLOAT), e = scores(CUDNN_DATA_FLOAT);
  auto p = scores(s.type);  // the second product's input, in the run's type
  g.Reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  g.Binary(CUDNN_POINTWISE_SUB, masked, max, shifted);
  g.Unary(CUDNN_POINTWISE_EXP, shifted, e);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.Unary(CUDNN_POINTWISE_LOG, sum, log_sum);
  g.Binary(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  g.Binary(CUDNN_POINTWISE_DIV, e, sum, p);
  g.Matmul(p, v, o);
}

void BackwardGraph(GraphBuilder& g, const Shape& s) {
  const Kind io = Kind::kPassed;
  auto q = g.Tensor(kQ, s.type, s.Bhtd(), s.InQkv(), io);
  auto kt = g.Tensor(kK, s.type, s.Bhdt(), s.InQkvTransposed(), io);
  auto vt = g.Tensor(kV, s.type, s.Bhdt(), s.InQkvTransposed(), io);
  auto o = g.Tensor(kO, s.type, s.Bhtd(), s.InOut(), io);
  auto dout = g.Tensor(kDout, s.type, s.Bhtd(), s.InOut(), io);
  auto stats = g.Tensor(kStats, CUDNN_DATA_FLOAT, s.Bht1(), s.PackedRows(), io);
  auto dq = g.Tensor(kDq, s.type, s.Bhtd(), s.InQkv(), io);
  auto dk = g.Tensor(kDk, s.type, s.Bhtd(), s.InQkv(), io);
  auto dv = g.Tensor(kDv, s.type, s.Bhtd(), s.InQkv(), io);
  // Scratch the caller passes: dQ summed in fp32, and each row's sum of dout * out.
  auto dq_sum = g.Tensor(kDqSum, CUDNN_DATA_FLOAT, s.Bhtd(), s.Packed(), io);
  auto dot = g.Tensor(kDot, CUDNN_DATA_FLOAT, s.Bht1(), s.PackedRows(), io);
  auto scale = g.Scalar(kScale);
  auto neg_inf = g.Scalar(kNegInf);
  auto one = g.Scalar(kOne);  // where dropout's scale would be
  auto scores = [&](cudnnDataType_t type) { return g.Virtual(type, s.Bhtt(), s.PackedScores()); };
  auto transposed = [&] { return g.Virtual(s.type, s.Bhtt(), s.TransposedScores()); };

  // dot = rowsum(dout * out), which equals sum_j P_ij dP_ij, the softmax gradient's term.
  auto products = g.Virtual(CUDNN_DATA_FLOAT, s.Bhtd(), s.Packed());
  auto row_sums = g.Virtual(CUDNN_DATA_FLOAT, s.Bht1(), s.PackedRows());
  g.Binary(CUDNN_POINTWISE_MUL, dout, o, products);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, products, row_sums);
  g.Binary(CUDNN_POINTWISE_MUL, row_sums, one, dot);

  // P again, from the forward's log-sum-exp.
  auto shifted = scores(CUDNN_DATA_FLOAT), p = scores(CUDNN_DATA_FLOAT);
  g.Binary(CUDNN_POINTWISE_SUB, ScaledScores(g, s, q, kt, scale), stats, shifted);
  g.Unary(CUDNN_POINTWISE_EXP, CausalMask(g, s, shifted, neg_inf), p);

  // dV = P^T dout.
  auto pt = transposed();
  g.Reshape(p, pt);
  g.Matmul(pt, dout, dv);

  // dS = P (dout V^T - dot) scale; dK = dS^T Q; dQ = dS K.
  auto dp = scores(CUDNN_DATA_FLOAT), centred = scores(CUDNN_DATA_FLOAT);
  auto ds_unscaled = scores(CUDNN_DATA_FLOAT), ds = scores(CUDNN_DATA_FLOAT);
  g.Matmul(dout, vt, dp);
  g.Binary(CUDNN_POINTWISE_SUB, dp, dot, centred);
  g.Binary(CUDNN_POINTWISE_MUL, centred, p, ds_unscaled);
  g.Binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  auto dst = transposed();
  g.Reshape(ds, dst);
  g.Matmul(dst, q, dk);
  auto k = g.Virtual(CUDNN_DATA_FLOAT, s.Bhtd(), s.InQkv());
  g.Reshape(kt, k);
  g.Matmul(ds, k, dq_sum);
  g.Unary(CUDNN_POINTWISE_IDENTITY, dq_sum, dq);
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

}  // namespace cudnn_graphs

using namespace cudnn_graphs;  // NOLINT: this file's own helpers

struct CudnnAttention::Impl {
  Api api;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  // Values the graphs take by value, from the host; cudnnBackendExecute reads them at the call.
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;
  struct Plans {
    bool ok = false;
    std::string why;
    Plan forward, backward;
  };
  std::map<Shape, Plans> plans;

  // The shape's plans, made the first time it is asked for. A shape cuDNN takes no engine
  // for stops the process, naming cuDNN's reason: the run asked for cuDNN, and timing the
  // table's own kernels in its place would answer another question.
  Plans& Ready(const Shape& s) {
    auto [it, fresh] = plans.try_emplace(s);
    Plans& p = it->second;
    if (fresh) {
      std::string why;
      GraphBuilder forward(&api), backward(&api);
      ForwardGraph(forward, s);
      BackwardGraph(backward, s);
      p.ok = forward.Build(handle, &p.forward, &why);
      if (!p.ok) p.why = "the forward graph: " + why;
      if (p.ok && !(p.ok = backward.Build(handle, &p.backward, &why))) {
        p.why = "the backward graph: " + why;
      }
      if (p.ok) {
        std::fprintf(stderr,
                     "drover cuda: attention B=%lld T=%lld NH=%lld HS=%lld through cuDNN "
                     "(workspace %lld bytes forward, %lld backward)\n",
                     static_cast<long long>(s.B), static_cast<long long>(s.T),
                     static_cast<long long>(s.NH), static_cast<long long>(s.HS),
                     static_cast<long long>(p.forward.workspace_bytes),
                     static_cast<long long>(p.backward.workspace_bytes));
      }
    }
    if (!p.ok)
      CudaFail("cuDNN attention (DROVER_CUDA_ATTENTION=cudnn)", p.why.c_str(), __FILE__, __LINE__);
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

std::unique_ptr<CudnnAttention> CudnnAttention::Open(cudaStream_t stream, std::string* why) {
  auto impl = std::make_unique<Impl>();
  if (!LoadApi(&impl->api, why)) return nullptr;
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
  impl_->Ready(ShapeOf(B, T, C, NH, operands));
  return true;
}

void CudnnAttention::Forward(float* out, float* state, const float* qkv, int B, int T, int C,
                             int NH, Precision operands, Scratch<float>* scratch) {
  const Shape s = ShapeOf(B, T, C, NH, operands);
  const Impl::Plans& plans = impl_->Ready(s);
  float* workspace =
      scratch->Get(Align64((static_cast<size_t>(plans.forward.workspace_bytes) + 3) / 4));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
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
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
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
