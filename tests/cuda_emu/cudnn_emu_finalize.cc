// The emulator's cuDNN: finalizing descriptors, checked as cuDNN documents them, into the Tensor,
// Op and Graph that cudnn_graph_run.cc runs; and the heuristics (cudnn_emu_descriptor.h).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cudnn_emu_descriptor.h"

namespace drover_emu::cudnn {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace drover_emu::cudnn
