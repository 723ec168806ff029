// cuDNN's fused attention graphs, built op by op through the backend API (cudnn_graph.h): what
// cudnn_attention.cu runs on the table's stream, and what tests/cuda/cudnn_graphs_test.cc
// hands the real cuDNN for a described GPU, with no GPU present (cuDNN 9.8's device
// properties), so that whether cuDNN's engines take these graphs is checked on every commit.
//
// The graphs are the pattern cuDNN's flash engines recognise, as cudnn-frontend's composite
// lowering of its SDPA nodes builds them (the frontend is header-only C++ outside Debian, so it
// is not a dependency):
//   forward:  S = Q K^T; S *= scale; S = row >= col ? S : -inf; M = max S; E = exp(S - M);
//             Z = sum E; stats = M + log Z; P = E / Z (in the run's type); O = P V
//   backward: dot = rowsum(dO * O) * 1; P = exp(mask(scale Q K^T - stats)); dV = P^T dO;
//             dS = P (dO V^T - dot) scale; dK = dS^T Q; dQ = dS K (in fp32, then the run's type)
// Q, K and V are read where they lie in the packed qkv (B, T, 3C) through strides, out and
// dqkv written likewise; stats is (B, NH, T), each row's log-sum-exp.
//
// Not thread-safe: a GraphBuilder, and the plans it makes, belong to one thread at a time.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "worker/engine/kernels/precision.h"

namespace drover::engine::cuda::cudnn_graphs {

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
  std::string Explain(cudnnStatus_t status) const;
};

// Opens `library` (a path, or a name the library path resolves) and resolves every entry point;
// false with *why naming what is missing. The library stays open until exit.
bool LoadApi(const char* library, Api* api, std::string* why);

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor(const Api* api, cudnnBackendDescriptor_t d) : api_(api), d_(d) {}
  Descriptor(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;
  ~Descriptor();

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

// What plans are made for: the GPU behind a handle, to run them; or a GPU described by a
// finalized CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR (cuDNN 9.8 on), which makes and compiles
// plans with no GPU present. Exactly one is set.
struct Target {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t device = nullptr;
};

// An engine configuration cuDNN's heuristics offered that did not become a plan, and why.
struct Refusal {
  cudnnBackendHeurMode_t mode;
  int64_t index;   // in that mode's list
  int64_t engine;  // cuDNN's own number for the engine (its global index), -1 if unknown
  cudnnStatus_t status;
  std::string explanation;  // Api::Explain's
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
                                  const Dims& strides, Kind kind);
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
                 int64_t axis = -1);
  // The float math the graphs are made of.
  void Binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y) {
    Pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }
  void Unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  // c = a b over the last two dims, batched over the others, accumulated in fp32.
  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
  // y = x reduced (sum or max) over the dims where y has 1.
  void Reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y);
  // y = x seen through y's dims and strides: a transpose, where the two swap.
  void Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

  // The graph of the ops added so far, and the first plan for `target` that one of the engines
  // cuDNN's heuristics suggest can be made from (mode A's, then the fallback list's, as
  // cudnn-frontend's users ask for them). False with *why when a call failed or no engine
  // takes the graph, with each engine's refusal (also in refusals()). Call once.
  bool Build(const Target& target, Plan* plan, std::string* why);

  // After Build: how many engine configurations the heuristics offered, and the refusals of
  // those that were tried and did not become the plan.
  int64_t offered() const { return offered_; }
  const std::vector<Refusal>& refusals() const { return refusals_; }

 private:
  void TryEngines(const Target& target, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                  Plan* plan);
  int64_t EngineOf(cudnnBackendDescriptor_t config) const;
  cudnnBackendDescriptor_t New(cudnnBackendDescriptorType_t type);
  void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* value);
  void SetDescriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value) {
    Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void Finalize(cudnnBackendDescriptor_t d, const char* what);
  void AddOp(cudnnBackendDescriptor_t op, const char* what);
  void Check(cudnnStatus_t st, const char* what);

  const Api* api_;
  std::vector<Descriptor> descriptors_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::string error_;
  int64_t next_virtual_ = kFirstVirtual;
  int64_t offered_ = 0;
  std::vector<Refusal> refusals_;
};

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

// For a 16-bit run (bf16, or fp16).
Shape ShapeOf(int B, int T, int C, int NH, Precision operands);

// The ops of each graph, added to `g` (then g.Build makes the plan). The tensors' uids are Uid's.
// Forward: kQ, kK, kV in, kO and kStats out, kScale and kNegInf by value.
void ForwardGraph(GraphBuilder& g, const Shape& s);
// Backward: kQ, kK, kV, kO, kDout, kStats in; kDq, kDk, kDv out; kDqSum (fp32, B*T*C, zeroed
// by the caller before cuDNN 9.6) and kDot (fp32, B*NH*T) scratch; kScale, kNegInf and kOne by
// value.
void BackwardGraph(GraphBuilder& g, const Shape& s);

}  // namespace drover::engine::cuda::cudnn_graphs
