// The kernel emulator's cuDNN (tests/cuda_emu/README.md): the backend ("graph") API that
// include/cudnn_graph.h declares, for the kernel table's fused attention
// (kernels/cuda/cudnn_attention.cu). Descriptors are checked as cuDNN documents them; a
// refusal returns its status and leaves a message for cudnnGetLastErrorString. An execution
// plan's operation graph is interpreted plainly on the handle's stream, in float (matmul and
// reduction sums in double), every value rounded to its tensor's type as it is stored: that is
// cudnn_graph_run.cc's, and cudnn_emu_internal.h is what the two files share.
//
// The plugin reaches these functions as it reaches the real library, through dlopen and dlsym
// (DROVER_CUDNN_LIBRARY names the emulated plugin itself), so each is exported from a library
// built with hidden visibility.
//
// Threads: as cuDNN's, a descriptor or a handle is used by one thread at a time; any thread
// may call, and cudnnGetLastErrorString answers for the calling thread.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "cuda_runtime_api.h"
#include "cudnn_emu_internal.h"
#include "cudnn_graph.h"
#include "emu_internal.h"

#define DROVER_CUDNN_EXPORT extern "C" __attribute__((visibility("default")))

struct cudnnContext {
  cudaStream_t stream = nullptr;  // cudnnSetStream's: where executions are enqueued
};

using drover_emu::cudnn::Bind;
using drover_emu::cudnn::Bound;
using drover_emu::cudnn::DataBytes;
using drover_emu::cudnn::Graph;
using drover_emu::cudnn::Op;
using drover_emu::cudnn::OpRef;
using drover_emu::cudnn::PointerText;
using drover_emu::cudnn::Refuse;
using drover_emu::cudnn::RunGraph;
using drover_emu::cudnn::Tensor;
using drover_emu::cudnn::TensorRef;

namespace {

// Every plan's workspace: nonzero, so that a caller must pass one. The run overwrites it with
// garbage, so that a workspace overlapping the caller's data shows (cudnn_graph_run.cc).
constexpr int64_t kWorkspaceBytes = 4096;

std::atomic<uint64_t> g_executions{0};  // cudnnBackendExecute calls taken

// ---- Refusals ------------------------------------------------------------------------------

thread_local std::string t_last_error;  // cudnnGetLastErrorString's

}  // namespace

cudnnStatus_t drover_emu::cudnn::Refuse(cudnnStatus_t status, const std::string& message) {
  t_last_error = "cuDNN (emulated): " + message;
  return status;
}

namespace {

#define RETURN_IF_REFUSED(expr)                          \
  do {                                                   \
    const cudnnStatus_t status_ = (expr);                \
    if (status_ != CUDNN_STATUS_SUCCESS) return status_; \
  } while (0)

std::string DimsText(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// ---- Descriptors ----------------------------------------------------------------------------

struct Descriptor;
using Snapshot = std::shared_ptr<const Descriptor>;

// An attribute as set: `count` elements of `type` in `bytes`, or for
// CUDNN_TYPE_BACKEND_DESCRIPTOR copies of the descriptors given (finalized, so they no longer
// change, and they outlive the caller's).
struct Attribute {
  cudnnBackendAttributeType_t type;
  int64_t count = 0;
  std::vector<unsigned char> bytes;
  std::vector<Snapshot> descriptors;
};

struct Descriptor {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<cudnnBackendAttributeName_t, Attribute> attributes;
  // What finalizing made of the attributes, by type.
  TensorRef tensor;                    // TENSOR
  OpRef op;                            // OPERATION_*
  std::shared_ptr<const Graph> graph;  // OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, PLAN
  int64_t workspace_bytes = 0;         // EXECUTION_PLAN
};

// The descriptors created and not destroyed: another pointer (a destroyed descriptor's) is
// refused, where the real library would read freed memory.
class LiveDescriptors {
 public:
  void Add(const void* d) {
    drover::MutexLock lock(&mu_);
    live_.insert(d);
  }
  bool Remove(const void* d) {
    drover::MutexLock lock(&mu_);
    return live_.erase(d) > 0;
  }
  bool Contains(const void* d) {
    drover::MutexLock lock(&mu_);
    return live_.count(d) > 0;
  }

 private:
  drover::Mutex mu_;
  std::set<const void*> live_ GUARDED_BY(mu_);
};
LiveDescriptors& Live() {
  static auto* live = new LiveDescriptors;  // never destroyed: descriptors may outlive main
  return *live;
}

Descriptor* AsDescriptor(cudnnBackendDescriptor_t d) {
  return d != nullptr && Live().Contains(d) ? static_cast<Descriptor*>(d) : nullptr;
}

// ---- The attributes each descriptor type takes ----------------------------------------------

struct AttributeSpec {
  cudnnBackendAttributeName_t name;
  const char* text;
  cudnnBackendAttributeType_t type;
  bool array = false;                                    // any count; otherwise exactly one element
  bool read_only = false;                                // only GetAttribute
  std::vector<cudnnBackendDescriptorType_t> holds = {};  // BACKEND_DESCRIPTOR: types taken
};

AttributeSpec One(cudnnBackendAttributeName_t name, const char* text,
                  cudnnBackendAttributeType_t type) {
  return {name, text, type};
}
AttributeSpec Array(cudnnBackendAttributeName_t name, const char* text,
                    cudnnBackendAttributeType_t type) {
  return {name, text, type, true};
}
// A descriptor-valued attribute: one descriptor of type `holds`, or any number of `holds_any`.
AttributeSpec Desc(cudnnBackendAttributeName_t name, const char* text,
                   cudnnBackendDescriptorType_t holds) {
  return {name, text, CUDNN_TYPE_BACKEND_DESCRIPTOR, false, false, {holds}};
}
AttributeSpec Descs(cudnnBackendAttributeName_t name, const char* text,
                    std::vector<cudnnBackendDescriptorType_t> holds_any) {
  return {name, text, CUDNN_TYPE_BACKEND_DESCRIPTOR, true, false, std::move(holds_any)};
}
AttributeSpec ReadOnly(AttributeSpec spec) {
  spec.read_only = true;
  return spec;
}

struct DescriptorSpec {
  cudnnBackendDescriptorType_t type;
  const char* text;
  std::vector<AttributeSpec> attributes;
};

// The descriptor types emulated, and the attributes each takes.
const std::vector<DescriptorSpec>& Specs() {
#define NAMED(enumerator) enumerator, #enumerator
  constexpr auto kTensor = CUDNN_BACKEND_TENSOR_DESCRIPTOR;
  static const auto* specs = new std::vector<DescriptorSpec>{
      {NAMED(CUDNN_BACKEND_TENSOR_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE),
        Array(NAMED(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64),
        Array(NAMED(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64),
        One(NAMED(CUDNN_ATTR_TENSOR_UNIQUE_ID), CUDNN_TYPE_INT64),
        One(NAMED(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), CUDNN_TYPE_INT64),
        One(NAMED(CUDNN_ATTR_TENSOR_IS_VIRTUAL), CUDNN_TYPE_BOOLEAN),
        One(NAMED(CUDNN_ATTR_TENSOR_IS_BY_VALUE), CUDNN_TYPE_BOOLEAN)}},
      {NAMED(CUDNN_BACKEND_POINTWISE_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE),
        One(NAMED(CUDNN_ATTR_POINTWISE_MATH_PREC), CUDNN_TYPE_DATA_TYPE),
        One(NAMED(CUDNN_ATTR_POINTWISE_AXIS), CUDNN_TYPE_INT64)}},
      {NAMED(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR),
             CUDNN_BACKEND_POINTWISE_DESCRIPTOR),
        Desc(NAMED(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_POINTWISE_TDESC), kTensor)}},
      {NAMED(CUDNN_BACKEND_MATMUL_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_MATMUL_COMP_TYPE), CUDNN_TYPE_DATA_TYPE)}},
      {NAMED(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_OPERATION_MATMUL_ADESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_MATMUL_BDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_MATMUL_CDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_MATMUL_DESC), CUDNN_BACKEND_MATMUL_DESCRIPTOR)}},
      {NAMED(CUDNN_BACKEND_REDUCTION_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_REDUCTION_OPERATOR), CUDNN_TYPE_REDUCTION_OPERATOR_TYPE),
        One(NAMED(CUDNN_ATTR_REDUCTION_COMP_TYPE), CUDNN_TYPE_DATA_TYPE)}},
      {NAMED(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_REDUCTION_DESC), CUDNN_BACKEND_REDUCTION_DESCRIPTOR)}},
      {NAMED(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), kTensor),
        Desc(NAMED(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), kTensor)}},
      {NAMED(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), CUDNN_TYPE_HANDLE),
        Descs(NAMED(CUDNN_ATTR_OPERATIONGRAPH_OPS), {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                                                     CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                                                     CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                                                     CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR})}},
      {NAMED(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR),
        One(NAMED(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE),
        ReadOnly(
            Descs(NAMED(CUDNN_ATTR_ENGINEHEUR_RESULTS), {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR}))}},
      // The emulator's engines come only from the heuristics: CUDNN_ATTR_ENGINE_* are not
      // declared, so a caller cannot build one.
      {NAMED(CUDNN_BACKEND_ENGINE_DESCRIPTOR), {}},
      {NAMED(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR),
       {Desc(NAMED(CUDNN_ATTR_ENGINECFG_ENGINE), CUDNN_BACKEND_ENGINE_DESCRIPTOR)}},
      {NAMED(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR),
       {One(NAMED(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), CUDNN_TYPE_HANDLE),
        Desc(NAMED(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), CUDNN_BACKEND_ENGINECFG_DESCRIPTOR),
        ReadOnly(One(NAMED(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE), CUDNN_TYPE_INT64))}},
      {NAMED(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR),
       {Array(NAMED(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64),
        Array(NAMED(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR),
        One(NAMED(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR)}},
  };
#undef NAMED
  return *specs;
}

const DescriptorSpec* SpecOf(cudnnBackendDescriptorType_t type) {
  for (const DescriptorSpec& spec : Specs()) {
    if (spec.type == type) return &spec;
  }
  return nullptr;
}

const char* TypeName(cudnnBackendDescriptorType_t type) {
  const DescriptorSpec* spec = SpecOf(type);
  return spec != nullptr ? spec->text : "descriptor type (not emulated)";
}

const AttributeSpec* SpecOf(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t name) {
  const DescriptorSpec* spec = SpecOf(type);
  for (size_t i = 0; spec != nullptr && i < spec->attributes.size(); ++i) {
    if (spec->attributes[i].name == name) return &spec->attributes[i];
  }
  return nullptr;
}

size_t ElementBytes(cudnnBackendAttributeType_t type) {
  switch (type) {
    case CUDNN_TYPE_HANDLE:
      return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_INT64:
      return sizeof(int64_t);
    case CUDNN_TYPE_DOUBLE:
      return sizeof(double);
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(void*);
    default:  // the enumerations, FLOAT and INT32
      return 4;
  }
}

// ---- Reading attributes ---------------------------------------------------------------------

const Attribute* Find(const Descriptor& d, cudnnBackendAttributeName_t name) {
  const auto it = d.attributes.find(name);
  return it == d.attributes.end() ? nullptr : &it->second;
}
template <typename T>
std::vector<T> Values(const Descriptor& d, cudnnBackendAttributeName_t name) {
  const Attribute* a = Find(d, name);
  if (a == nullptr) return {};
  std::vector<T> values(static_cast<size_t>(a->count));
  if (!values.empty()) std::memcpy(values.data(), a->bytes.data(), a->bytes.size());
  return values;
}
template <typename T>
T Value(const Descriptor& d, cudnnBackendAttributeName_t name, T otherwise = T{}) {
  const Attribute* a = Find(d, name);
  if (a == nullptr) return otherwise;
  std::memcpy(&otherwise, a->bytes.data(), sizeof(T));
  return otherwise;
}
const Descriptor& Child(const Descriptor& d, cudnnBackendAttributeName_t name, size_t i = 0) {
  return *Find(d, name)->descriptors[i];
}

std::string AttributeText(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t name) {
  const AttributeSpec* spec = SpecOf(type, name);
  return spec != nullptr ? spec->text : "attribute " + std::to_string(name);
}

// BAD_PARAM naming the first of `names` that `d` lacks.
cudnnStatus_t Require(const Descriptor& d,
                      std::initializer_list<cudnnBackendAttributeName_t> names) {
  for (const cudnnBackendAttributeName_t name : names) {
    if (Find(d, name) == nullptr) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, std::string(TypeName(d.type)) + ": " +
                                                AttributeText(d.type, name) + " is not set");
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

// ---- Finalizing: tensors and the op descriptors ----------------------------------------------

cudnnStatus_t FinalizeTensor(Descriptor& d) {
  RETURN_IF_REFUSED(Require(
      d, {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES,
          CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT}));
  auto t = std::make_shared<Tensor>();
  t->uid = Value<int64_t>(d, CUDNN_ATTR_TENSOR_UNIQUE_ID);
  t->type = Value<cudnnDataType_t>(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
  t->dims = Values<int64_t>(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
  t->strides = Values<int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES);
  t->alignment = Value<int64_t>(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
  t->is_virtual = Value<bool>(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
  t->by_value = Value<bool>(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
  const std::string name = t->Name() + ": ";
  if (DataBytes(t->type) == 0) {
    return Refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  name + "data type " + std::to_string(t->type) + " is not emulated");
  }
  if (t->dims.empty() || t->dims.size() > 8 || t->strides.size() != t->dims.size()) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, name + std::to_string(t->dims.size()) +
                                              " dimensions and " +
                                              std::to_string(t->strides.size()) +
                                              " strides (1 to 8 of each, as many of each)");
  }
  for (size_t k = 0; k < t->dims.size(); ++k) {
    if (t->dims[k] <= 0 || t->strides[k] < 0) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, name + "dimensions " + DimsText(t->dims) +
                                                " and strides " + DimsText(t->strides) +
                                                " (dimensions > 0, strides >= 0)");
    }
  }
  if (t->alignment <= 0) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  name + "byte alignment " + std::to_string(t->alignment) + " (must be > 0)");
  }
  if (t->is_virtual && t->by_value) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, name + "both virtual and by value");
  }
  if (t->by_value && t->Elements() != 1) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  name + "by value with dimensions " + DimsText(t->dims) + " (one element)");
  }
  d.tensor = std::move(t);
  return CUDNN_STATUS_SUCCESS;
}

// The modes emulated and how many inputs each takes (x; x and b; x, b and t), 0 for others.
int Arity(cudnnPointwiseMode_t mode) {
  switch (mode) {
    case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_LOG:
    case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_GEN_INDEX:
      return 1;
    case CUDNN_POINTWISE_ADD:
    case CUDNN_POINTWISE_MUL:
    case CUDNN_POINTWISE_SUB:
    case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_CMP_GE:
      return 2;
    case CUDNN_POINTWISE_BINARY_SELECT:
      return 3;
  }
  return 0;
}

cudnnStatus_t FinalizePointwise(Descriptor& d) {
  RETURN_IF_REFUSED(Require(d, {CUDNN_ATTR_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MATH_PREC}));
  const auto mode = Value<cudnnPointwiseMode_t>(d, CUDNN_ATTR_POINTWISE_MODE);
  if (Arity(mode) == 0) {
    return Refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  "pointwise mode " + std::to_string(mode) + " is not emulated");
  }
  if (DataBytes(Value<cudnnDataType_t>(d, CUDNN_ATTR_POINTWISE_MATH_PREC)) == 0) {
    return Refuse(CUDNN_STATUS_NOT_SUPPORTED, "pointwise: the math precision is not emulated");
  }
  if (mode == CUDNN_POINTWISE_GEN_INDEX) RETURN_IF_REFUSED(Require(d, {CUDNN_ATTR_POINTWISE_AXIS}));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeReduction(Descriptor& d) {
  RETURN_IF_REFUSED(Require(d, {CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_ATTR_REDUCTION_COMP_TYPE}));
  const auto op = Value<cudnnReduceTensorOp_t>(d, CUDNN_ATTR_REDUCTION_OPERATOR);
  if (op != CUDNN_REDUCE_TENSOR_ADD && op != CUDNN_REDUCE_TENSOR_MAX) {
    return Refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  "reduction operator " + std::to_string(op) + " is not emulated");
  }
  return CUDNN_STATUS_SUCCESS;
}

// ---- Finalizing: operations -------------------------------------------------------------------

TensorRef TensorOf(const Descriptor& d, cudnnBackendAttributeName_t name) {
  return Find(d, name) != nullptr ? Child(d, name).tensor : nullptr;
}

// Every input has y's rank, and each of its dimensions is y's or 1 (broadcast).
cudnnStatus_t CheckBroadcast(const char* op, const std::vector<TensorRef>& inputs,
                             const Tensor& y) {
  for (const TensorRef& in : inputs) {
    bool fits = in->dims.size() == y.dims.size();
    for (size_t k = 0; fits && k < y.dims.size(); ++k) {
      fits = in->dims[k] == y.dims[k] || in->dims[k] == 1;
    }
    if (!fits) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, std::string(op) + ": " + in->Name() + "'s " +
                                                DimsText(in->dims) + " does not broadcast to " +
                                                y.Name() + "'s " + DimsText(y.dims));
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizePointwiseOp(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                  CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC}));
  const Descriptor& pw = Child(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
  auto op = std::make_shared<Op>();
  op->kind = Op::kPointwise;
  op->mode = Value<cudnnPointwiseMode_t>(pw, CUDNN_ATTR_POINTWISE_MODE);
  op->axis = Value<int64_t>(pw, CUDNN_ATTR_POINTWISE_AXIS);
  const int arity = Arity(op->mode);
  // b and t: required where the mode reads them, refused where it does not.
  const cudnnBackendAttributeName_t operands[] = {CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                                  CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                  CUDNN_ATTR_OPERATION_POINTWISE_TDESC};
  for (int i = 0; i < 3; ++i) {
    if (i < arity) RETURN_IF_REFUSED(Require(d, {operands[i]}));
    if (i >= arity && Find(d, operands[i]) != nullptr) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, "pointwise mode " + std::to_string(op->mode) +
                                                " takes " + std::to_string(arity) +
                                                " input(s), but " +
                                                AttributeText(d.type, operands[i]) + " is set");
    }
    if (i < arity) op->inputs.push_back(TensorOf(d, operands[i]));
  }
  op->output = TensorOf(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
  RETURN_IF_REFUSED(CheckBroadcast("pointwise", op->inputs, *op->output));
  const auto rank = static_cast<int64_t>(op->output->dims.size());
  if (op->mode == CUDNN_POINTWISE_GEN_INDEX && (op->axis < 0 || op->axis >= rank)) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "pointwise GEN_INDEX: axis " + std::to_string(op->axis) +
                                              " of a rank " + std::to_string(rank) + " tensor");
  }
  d.op = std::move(op);
  return CUDNN_STATUS_SUCCESS;
}

// A [..., M, K] B [..., K, N] = C [..., M, N], A's and B's batch dimensions each C's or 1.
cudnnStatus_t FinalizeMatmulOp(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                  CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC}));
  auto op = std::make_shared<Op>();
  op->kind = Op::kMatmul;
  op->inputs = {TensorOf(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC),
                TensorOf(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC)};
  op->output = TensorOf(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
  const Tensor &a = *op->inputs[0], &b = *op->inputs[1], &c = *op->output;
  const size_t r = c.dims.size();
  bool fits = r >= 2 && a.dims.size() == r && b.dims.size() == r &&
              a.dims[r - 2] == c.dims[r - 2] && a.dims[r - 1] == b.dims[r - 2] &&
              b.dims[r - 1] == c.dims[r - 1];
  for (size_t k = 0; fits && k + 2 < r; ++k) {
    fits = (a.dims[k] == c.dims[k] || a.dims[k] == 1) && (b.dims[k] == c.dims[k] || b.dims[k] == 1);
  }
  if (!fits) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "matmul: A " + DimsText(a.dims) + ", B " +
                                              DimsText(b.dims) + " and C " + DimsText(c.dims) +
                                              " are not [..., M, K], [..., K, N], [..., M, N]");
  }
  d.op = std::move(op);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeReductionOp(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                  CUDNN_ATTR_OPERATION_REDUCTION_DESC}));
  auto op = std::make_shared<Op>();
  op->kind = Op::kReduction;
  op->reduction = Value<cudnnReduceTensorOp_t>(Child(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC),
                                               CUDNN_ATTR_REDUCTION_OPERATOR);
  op->inputs = {TensorOf(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC)};
  op->output = TensorOf(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
  // y's dimensions are x's or 1: the reduction runs over the latter. The check is
  // CheckBroadcast's, y in the input's place.
  RETURN_IF_REFUSED(CheckBroadcast("reduction", {op->output}, *op->inputs[0]));
  d.op = std::move(op);
  return CUDNN_STATUS_SUCCESS;
}

// y is a view of x's memory (its elements at its own strides' offsets there), so it may not
// reach past x's span.
cudnnStatus_t FinalizeReshapeOp(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC}));
  auto op = std::make_shared<Op>();
  op->kind = Op::kReshape;
  op->inputs = {TensorOf(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC)};
  op->output = TensorOf(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
  const Tensor &x = *op->inputs[0], &y = *op->output;
  if (x.Elements() != y.Elements() || y.Span() > x.Span()) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "reshape: " + y.Name() + " " + DimsText(y.dims) +
                                              " strides " + DimsText(y.strides) +
                                              " is not a view of " + x.Name() + " " +
                                              DimsText(x.dims) + " strides " + DimsText(x.strides));
  }
  d.op = std::move(op);
  return CUDNN_STATUS_SUCCESS;
}

// ---- Finalizing: the graph and what runs it ---------------------------------------------------

// Indices into `ops` in an order where each op follows the ops that write what it reads
// (Kahn's algorithm, ties in the order given); empty when they form a cycle.
std::vector<size_t> DependencyOrder(const std::vector<OpRef>& ops,
                                    const std::map<int64_t, size_t>& writer) {
  std::vector<std::vector<size_t>> readers(ops.size());
  std::vector<int> waiting(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const TensorRef& in : ops[i]->inputs) {
      const auto w = writer.find(in->uid);
      if (w == writer.end()) continue;
      readers[w->second].push_back(i);
      ++waiting[i];
    }
  }
  std::set<size_t> ready;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (waiting[i] == 0) ready.insert(i);
  }
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(i);
    for (const size_t r : readers[i]) {
      if (--waiting[r] == 0) ready.insert(r);
    }
  }
  return order.size() == ops.size() ? order : std::vector<size_t>{};
}

// Tensors of one unique id describe one tensor; each tensor has at most one writer, never a
// by-value one; a virtual tensor read has one; the ops have a dependency order.
cudnnStatus_t FinalizeGraph(Descriptor& d) {
  RETURN_IF_REFUSED(Require(d, {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_OPS}));
  std::vector<OpRef> ops;
  for (const Snapshot& op : Find(d, CUDNN_ATTR_OPERATIONGRAPH_OPS)->descriptors) {
    ops.push_back(op->op);
  }
  if (ops.empty()) return Refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: no ops");
  auto graph = std::make_shared<Graph>();
  std::map<int64_t, size_t> writer;
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<TensorRef> tensors = ops[i]->inputs;
    tensors.push_back(ops[i]->output);
    for (const TensorRef& t : tensors) {
      const auto [known, fresh] = graph->tensors.emplace(t->uid, t);
      if (!fresh && !known->second->SameAs(*t)) {
        return Refuse(CUDNN_STATUS_BAD_PARAM,
                      "operation graph: two descriptors of " + t->Name() +
                          " differ (type, dimensions, strides, virtual or by value)");
      }
    }
    const Tensor& y = *ops[i]->output;
    if (y.by_value) {
      return Refuse(CUDNN_STATUS_BAD_PARAM,
                    "operation graph: op " + std::to_string(i) + " writes by-value " + y.Name());
    }
    const auto [first, fresh] = writer.emplace(y.uid, i);
    if (!fresh) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: " + y.Name() + " is written by op " +
                                                std::to_string(first->second) + " and op " +
                                                std::to_string(i));
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const TensorRef& in : ops[i]->inputs) {
      if (in->is_virtual && writer.count(in->uid) == 0) {
        return Refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual " + in->Name() +
                                                  " is read by op " + std::to_string(i) +
                                                  " but no op of the graph writes it");
      }
    }
  }
  const std::vector<size_t> order = DependencyOrder(ops, writer);
  if (order.empty()) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: its ops form a cycle");
  }
  for (const size_t i : order) graph->ops.push_back(ops[i]);
  d.graph = std::move(graph);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeEngineHeur(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_MODE}));
  const auto mode = Value<cudnnBackendHeurMode_t>(d, CUDNN_ATTR_ENGINEHEUR_MODE);
  if (mode < 0 || mode > CUDNN_HEUR_MODE_A) {  // INSTANT, B, FALLBACK, A
    return Refuse(CUDNN_STATUS_BAD_PARAM, "heuristics mode " + std::to_string(mode));
  }
  d.graph = Child(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH).graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeEngineCfg(Descriptor& d) {
  RETURN_IF_REFUSED(Require(d, {CUDNN_ATTR_ENGINECFG_ENGINE}));
  d.graph = Child(d, CUDNN_ATTR_ENGINECFG_ENGINE).graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizePlan(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG}));
  d.graph = Child(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG).graph;
  d.workspace_bytes = kWorkspaceBytes;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeVariantPack(Descriptor& d) {
  RETURN_IF_REFUSED(
      Require(d, {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS}));
  std::vector<int64_t> uids = Values<int64_t>(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  if (uids.size() != Values<void*>(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS).size()) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  "variant pack: unique ids and data pointers differ in count");
  }
  std::sort(uids.begin(), uids.end());
  const auto twice = std::adjacent_find(uids.begin(), uids.end());
  if (twice != uids.end()) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  "variant pack: unique id " + std::to_string(*twice) + " given twice");
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t FinalizeByType(Descriptor& d) {
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return FinalizeTensor(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      return FinalizePointwise(d);
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      return Require(d, {CUDNN_ATTR_MATMUL_COMP_TYPE});
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      return FinalizeReduction(d);
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      return FinalizePointwiseOp(d);
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      return FinalizeMatmulOp(d);
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      return FinalizeReductionOp(d);
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      return FinalizeReshapeOp(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return FinalizeGraph(d);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return FinalizeEngineHeur(d);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return FinalizeEngineCfg(d);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return FinalizePlan(d);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return FinalizeVariantPack(d);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return Refuse(CUDNN_STATUS_BAD_PARAM,
                    "an engine comes from CUDNN_ATTR_ENGINEHEUR_RESULTS in the emulator (its "
                    "CUDNN_ATTR_ENGINE_* attributes are not emulated)");
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR:
      break;
  }
  return Refuse(CUDNN_STATUS_NOT_SUPPORTED,
                "device properties (plans for a GPU that is not there) are not emulated: the "
                "emulator's plans run on its own device");
}

// ---- The heuristics ---------------------------------------------------------------------------

// One engine configuration for `graph`: what ENGINEHEUR_RESULTS fills a caller's with.
Descriptor EngineConfigFor(const std::shared_ptr<const Graph>& graph) {
  auto engine = std::make_shared<Descriptor>();
  engine->type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
  engine->finalized = true;
  engine->graph = graph;
  Descriptor config;
  config.type = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
  config.finalized = true;
  config.graph = graph;
  Attribute& value = config.attributes[CUDNN_ATTR_ENGINECFG_ENGINE];
  value.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  value.count = 1;
  value.descriptors = {engine};
  return config;
}

// A descriptor-valued GetAttribute: the caller passes descriptors it created, of the value's
// type, and each becomes a copy of the value (finalized).
cudnnStatus_t FillDescriptor(cudnnBackendDescriptor_t target, const Descriptor& value) {
  Descriptor* d = AsDescriptor(target);
  if (d == nullptr || d->type != value.type) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, std::string("a ") + TypeName(value.type) +
                                              " to fill is not one created of that type");
  }
  *d = value;
  return CUDNN_STATUS_SUCCESS;
}

// ENGINEHEUR_RESULTS: one engine configuration for any graph, none where
// DROVER_EMU_CUDNN_NO_ENGINE is set (as cuDNN gives none for a graph pattern it has no
// engine for).
cudnnStatus_t HeuristicResults(const Descriptor& heur, int64_t requested, int64_t* count,
                               void* elements) {
  *count = std::getenv("DROVER_EMU_CUDNN_NO_ENGINE") != nullptr ? 0 : 1;
  if (*count == 0 || requested == 0) return CUDNN_STATUS_SUCCESS;
  if (elements == nullptr) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "heuristics results: no array");
  }
  return FillDescriptor(static_cast<cudnnBackendDescriptor_t*>(elements)[0],
                        EngineConfigFor(heur.graph));
}

}  // namespace

// ---- The API ------------------------------------------------------------------------------------

// 9.10.0, or DROVER_EMU_CUDNN_VERSION's (e.g. 8907), so that callers' version checks are
// tested.
DROVER_CUDNN_EXPORT size_t cudnnGetVersion(void) {
  const char* text = std::getenv("DROVER_EMU_CUDNN_VERSION");
  if (text == nullptr) return 91000;
  char* end = nullptr;
  const unsigned long long version = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') {
    drover_emu::Die("DROVER_EMU_CUDNN_VERSION must be an integer such as 8907 or 91000");
  }
  return static_cast<size_t>(version);
}

DROVER_CUDNN_EXPORT const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
      return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED:
      return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND:
      return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
      return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_INTERNAL_ERROR:
      return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

// The message of this thread's last refused call, truncated to max_size - 1 characters.
DROVER_CUDNN_EXPORT void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const size_t n = std::min(t_last_error.size(), max_size - 1);
  std::memcpy(message, t_last_error.data(), n);
  message[n] = '\0';
}

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: no handle pointer");
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: no handle");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(
    cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor) {
  if (descriptor == nullptr) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "create descriptor: no pointer");
  }
  if (SpecOf(type) == nullptr) {
    return Refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  "descriptor type " + std::to_string(type) + " is not emulated");
  }
  auto* d = new Descriptor;
  d->type = type;
  Live().Add(d);
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t
cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  if (!Live().Remove(descriptor)) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "destroy: not a live descriptor");
  }
  delete static_cast<Descriptor*>(descriptor);
  return CUDNN_STATUS_SUCCESS;
}

// Finalizing twice is taken (an engine configuration the heuristics filled is finalized).
DROVER_CUDNN_EXPORT cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  Descriptor* d = AsDescriptor(descriptor);
  if (d == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "finalize: not a live descriptor");
  if (d->finalized) return CUDNN_STATUS_SUCCESS;
  RETURN_IF_REFUSED(FinalizeByType(*d));
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

namespace {

// A CUDNN_TYPE_BACKEND_DESCRIPTOR value: the descriptors given, each live, finalized and of a
// type the attribute takes, kept as copies.
cudnnStatus_t TakeDescriptors(const AttributeSpec& spec, int64_t count, const void* elements,
                              Attribute* value) {
  const auto* given = static_cast<const cudnnBackendDescriptor_t*>(elements);
  for (int64_t i = 0; i < count; ++i) {
    const Descriptor* d = AsDescriptor(given[i]);
    if (d == nullptr) {
      return Refuse(CUDNN_STATUS_BAD_PARAM, std::string(spec.text) + ": element " +
                                                std::to_string(i) + " is not a live descriptor");
    }
    if (std::find(spec.holds.begin(), spec.holds.end(), d->type) == spec.holds.end()) {
      return Refuse(CUDNN_STATUS_BAD_PARAM,
                    std::string(spec.text) + " does not take a " + TypeName(d->type));
    }
    if (!d->finalized) {
      return Refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                    std::string(spec.text) + ": the " + TypeName(d->type) + " is not finalized");
    }
    value->descriptors.push_back(std::make_shared<const Descriptor>(*d));
  }
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                           cudnnBackendAttributeName_t name,
                                                           cudnnBackendAttributeType_t type,
                                                           int64_t count, const void* elements) {
  Descriptor* d = AsDescriptor(descriptor);
  if (d == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "set attribute: not a live descriptor");
  const std::string where = std::string(TypeName(d->type)) + ": ";
  const AttributeSpec* spec = SpecOf(d->type, name);
  if (spec == nullptr || spec->read_only) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  where + AttributeText(d->type, name) + " is not an attribute it sets");
  }
  if (d->finalized) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, where + "finalized, so " + spec->text + " is fixed");
  }
  if (type != spec->type) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, where + spec->text + " takes attribute type " +
                                              std::to_string(spec->type) + ", not " +
                                              std::to_string(type));
  }
  if (count < 0 || (!spec->array && count != 1)) {
    return Refuse(CUDNN_STATUS_BAD_PARAM,
                  where + spec->text + " given " + std::to_string(count) + " elements");
  }
  if (count > 0 && elements == nullptr) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, where + spec->text + ": no elements");
  }
  Attribute value;
  value.type = type;
  value.count = count;
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    RETURN_IF_REFUSED(TakeDescriptors(*spec, count, elements, &value));
  } else {
    const auto* bytes = static_cast<const unsigned char*>(elements);
    value.bytes.assign(bytes, bytes + static_cast<size_t>(count) * ElementBytes(type));
  }
  if (type == CUDNN_TYPE_HANDLE && *static_cast<const cudnnHandle_t*>(elements) == nullptr) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, where + spec->text + ": a null handle");
  }
  d->attributes[name] = std::move(value);
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t cudnnBackendGetAttribute(
    cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
    cudnnBackendAttributeType_t type, int64_t requested, int64_t* count, void* elements) {
  const Descriptor* d = AsDescriptor(descriptor);
  if (d == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "get attribute: not a live descriptor");
  const std::string where = std::string(TypeName(d->type)) + ": ";
  const AttributeSpec* spec = SpecOf(d->type, name);
  if (spec == nullptr || type != spec->type) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, where + "no attribute " + AttributeText(d->type, name) +
                                              " of attribute type " + std::to_string(type));
  }
  if (count == nullptr || requested < 0) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, where + spec->text + ": no count, or a negative one");
  }
  if (!d->finalized) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, where + "not finalized");
  }
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    return HeuristicResults(*d, requested, count, elements);
  }
  if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    *count = 1;
    if (requested > 0 && elements != nullptr) std::memcpy(elements, &d->workspace_bytes, 8);
    return CUDNN_STATUS_SUCCESS;
  }
  const Attribute* a = Find(*d, name);
  *count = a == nullptr ? 0 : a->count;
  const int64_t n = std::min(requested, *count);
  if (n > 0 && elements == nullptr) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, where + spec->text + ": no array");
  }
  if (n > 0 && type != CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    std::memcpy(elements, a->bytes.data(), static_cast<size_t>(n) * ElementBytes(type));
    return CUDNN_STATUS_SUCCESS;
  }
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_REFUSED(FillDescriptor(static_cast<cudnnBackendDescriptor_t*>(elements)[i],
                                     *a->descriptors[static_cast<size_t>(i)]));
  }
  return CUDNN_STATUS_SUCCESS;
}

// Not cuDNN's: how many executions cudnnBackendExecute has taken (at the call), so that a test
// of the plugin can tell that cuDNN ran rather than the table's own kernels.
DROVER_CUDNN_EXPORT uint64_t drover_emu_cudnn_executions(void) { return g_executions.load(); }

// Checks the pointers now and runs the graph on the handle's stream. Everything the run needs
// is taken at the call: the caller may change or destroy the descriptors once it returns.
DROVER_CUDNN_EXPORT cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle,
                                                      cudnnBackendDescriptor_t plan_descriptor,
                                                      cudnnBackendDescriptor_t variant_pack) {
  if (handle == nullptr) return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: no handle");
  const Descriptor* plan = AsDescriptor(plan_descriptor);
  const Descriptor* pack = AsDescriptor(variant_pack);
  if (plan == nullptr || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || pack == nullptr ||
      pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: takes an execution plan and a variant pack");
  }
  if (!plan->finalized || !pack->finalized) {
    return Refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                  "execute: the plan or the variant pack is not finalized");
  }
  std::map<int64_t, Bound> bound;
  RETURN_IF_REFUSED(Bind(*plan->graph, Values<int64_t>(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
                         Values<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), &bound));
  void* workspace = Value<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
  const int64_t workspace_bytes = plan->workspace_bytes;
  if (!drover_emu::InDeviceMemory(workspace, static_cast<size_t>(workspace_bytes)) ||
      (workspace_bytes > 0 && workspace == nullptr)) {
    return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: the workspace " + PointerText(workspace) +
                                              " is not " + std::to_string(workspace_bytes) +
                                              " bytes of device memory");
  }
  g_executions.fetch_add(1);
  drover_emu::EnqueueWork(handle->stream, [graph = plan->graph, bound, workspace, workspace_bytes] {
    RunGraph(*graph, bound, workspace, workspace_bytes);
  });
  return CUDNN_STATUS_SUCCESS;
}
