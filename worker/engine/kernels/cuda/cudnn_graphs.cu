// cuDNN's fused attention graphs (cudnn_graphs.h). Host code only: the plugin compiles it with
// nvcc, the kernel emulator and the deviceless check (tests/cuda/cudnn_graphs_test.cc) as C++.
#if __has_include(<cudnn_graph.h>)

#include <dlfcn.h>

#include <utility>

#include "worker/engine/kernels/cuda/cudnn_graphs.h"

namespace drover::engine::cuda::cudnn_graphs {

std::string Api::Explain(cudnnStatus_t status) const {
  char last[512] = {};
  GetLastErrorString(last, sizeof(last));
  std::string text = GetErrorString(status);
  if (last[0] != '\0') text += std::string(": ") + last;
  return text;
}

namespace {

template <typename Fn>
bool Resolve(void* library, const char* name, Fn* fn, std::string* why) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *why = std::string("the library has no ") + name + " (cuDNN 9 has)";
  return *fn != nullptr;
}

}  // namespace

bool LoadApi(const char* library, Api* api, std::string* why) {
  api->library = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    *why = std::string("cannot open ") + library + " (" + dlerror() +
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

Descriptor::Descriptor(Descriptor&& other) noexcept
    : api_(other.api_), d_(std::exchange(other.d_, nullptr)) {}

Descriptor::~Descriptor() {
  if (d_ != nullptr) api_->DestroyDescriptor(d_);
}

cudnnBackendDescriptor_t GraphBuilder::Tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
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

void GraphBuilder::Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                             cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                             cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
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

void GraphBuilder::Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                          cudnnBackendDescriptor_t c) {
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

void GraphBuilder::Reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
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

void GraphBuilder::Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = New(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  SetDescriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
  SetDescriptor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
  AddOp(op, "a reshape");
}

bool GraphBuilder::Build(const Target& target, Plan* plan, std::string* why) {
  cudnnBackendDescriptor_t graph = New(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.size(),
      ops_.data());
  // A described GPU's graph has no handle: the heuristics and the plan take the description.
  if (target.handle != nullptr) {
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
  }
  Finalize(graph, "the operation graph");
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!error_.empty() || plan->plan != nullptr) break;
    TryEngines(target, graph, mode, plan);
  }
  if (error_.empty() && plan->plan == nullptr) {
    error_ = "no engine of cuDNN " + std::to_string(api_->GetVersion()) +
             " takes the graph (its heuristics offered " + std::to_string(offered_) + ")";
    for (const Refusal& r : refusals_) {
      error_ += "; mode " + std::to_string(r.mode) + " config " + std::to_string(r.index) +
                " (engine " + std::to_string(r.engine) + "): " + r.explanation;
    }
  }
  *why = error_;
  plan->parts = std::move(descriptors_);
  if (!error_.empty()) plan->plan = nullptr;
  return error_.empty();
}

// The engine configurations heuristics `mode` suggests for `graph`, each tried in turn until one
// finalizes into *plan; the others' refusals are kept.
void GraphBuilder::TryEngines(const Target& target, cudnnBackendDescriptor_t graph,
                              cudnnBackendHeurMode_t mode, Plan* plan) {
  cudnnBackendDescriptor_t heuristics = New(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  SetDescriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  Set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (target.device != nullptr) {
    SetDescriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, target.device);
  }
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
    Check(api_->GetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, configs.size(), &count, configs.data()),
          "the engines");
  }
  offered_ += count;
  for (int64_t i = 0; i < count && error_.empty() && plan->plan == nullptr; ++i) {
    cudnnBackendDescriptor_t candidate = New(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (target.handle != nullptr) {
      Set(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
    } else {
      SetDescriptor(candidate, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, target.device);
    }
    SetDescriptor(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
    if (!error_.empty()) break;
    const cudnnStatus_t st = api_->Finalize(candidate);
    if (st != CUDNN_STATUS_SUCCESS) {  // this engine declines the graph; the next may not
      std::string explanation = api_->Explain(st);  // before another call replaces it
      refusals_.push_back(Refusal{mode, i, EngineOf(configs[i]), st, std::move(explanation)});
      continue;
    }
    int64_t got = 0;
    Check(api_->GetAttribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                             1, &got, &plan->workspace_bytes),
          "the plan's workspace size");
    plan->plan = candidate;
  }
}

int64_t GraphBuilder::EngineOf(cudnnBackendDescriptor_t config) const {
  cudnnBackendDescriptor_t engine = nullptr;
  if (api_->CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) {
    return -1;
  }
  Descriptor owned(api_, engine);
  int64_t count = 0, index = -1;
  if (api_->GetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                         &count, &engine) != CUDNN_STATUS_SUCCESS ||
      api_->GetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count,
                         &index) != CUDNN_STATUS_SUCCESS) {
    return -1;
  }
  return index;
}

cudnnBackendDescriptor_t GraphBuilder::New(cudnnBackendDescriptorType_t type) {
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

void GraphBuilder::Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t type, int64_t count, const void* value) {
  if (error_.empty()) {
    Check(api_->SetAttribute(d, name, type, count, value),
          ("setting attribute " + std::to_string(name)).c_str());
  }
}

void GraphBuilder::Finalize(cudnnBackendDescriptor_t d, const char* what) {
  if (error_.empty()) Check(api_->Finalize(d), (std::string("finalizing ") + what).c_str());
}

void GraphBuilder::AddOp(cudnnBackendDescriptor_t op, const char* what) {
  Finalize(op, what);
  ops_.push_back(op);
}

void GraphBuilder::Check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS && error_.empty()) {
    error_ = std::string(what) + " (after " + std::to_string(ops_.size()) +
             " operations): " + api_->Explain(st);
  }
}

Shape ShapeOf(int B, int T, int C, int NH, Precision operands) {
  return Shape{B, NH, T, C / NH,
               operands == Precision::kFp16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16};
}

namespace {

using Kind = GraphBuilder::Kind;

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

}  // namespace

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

}  // namespace drover::engine::cuda::cudnn_graphs

#endif  // __has_include(<cudnn_graph.h>)
