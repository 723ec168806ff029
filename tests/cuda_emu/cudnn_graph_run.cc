// The kernel emulator's cuDNN, its second half (cudnn_emu.cc is the API): running a finalized
// operation graph for cudnnBackendExecute. The variant pack is bound at the call, and the ops
// are interpreted plainly on the handle's stream, in float (matmul and reduction sums in
// double), every value rounded to its tensor's type as it is stored.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"
#include "cudnn_emu_internal.h"
#include "cudnn_graph.h"
#include "emu_internal.h"

namespace drover_emu::cudnn {

// ---- Tensor data ---------------------------------------------------------------------------

size_t DataBytes(cudnnDataType_t type) {
  switch (type) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32:
      return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    case CUDNN_DATA_BOOLEAN:
      return 1;
  }
  return 0;
}

namespace {

// What a run leaves in its plan's workspace, before and after its ops, so that a workspace
// overlapping the caller's data shows.
constexpr unsigned char kGarbage = 0xFF;  // NaN in fp32, bf16 and fp16

// The device's cvt.rni.s32.f32: to nearest (ties to even), NaN to 0, saturating.
int32_t ToInt32(float v) {
  if (std::isnan(v)) return 0;
  const double r = std::nearbyint(static_cast<double>(v));
  return static_cast<int32_t>(std::clamp(r, double{std::numeric_limits<int32_t>::min()},
                                         double{std::numeric_limits<int32_t>::max()}));
}

// `v` as a tensor of `type` holds it (bf16 and fp16 round to nearest even).
float RoundTo(cudnnDataType_t type, float v) {
  switch (type) {
    case CUDNN_DATA_HALF:
      return __half2float(__float2half_rn(v));
    case CUDNN_DATA_BFLOAT16:
      return __bfloat162float(__float2bfloat16_rn(v));
    case CUDNN_DATA_INT32:
      return static_cast<float>(ToInt32(v));
    case CUDNN_DATA_BOOLEAN:
      return v != 0.0f ? 1.0f : 0.0f;
    case CUDNN_DATA_FLOAT:
      break;
  }
  return v;
}

// Element i of an array of `type` (device memory, or a by-value tensor's host value).
float Load(const void* base, int64_t i, cudnnDataType_t type) {
  switch (type) {
    case CUDNN_DATA_HALF:
      return __half2float(static_cast<const __half*>(base)[i]);
    case CUDNN_DATA_BFLOAT16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDNN_DATA_INT32:
      return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case CUDNN_DATA_BOOLEAN:
      return static_cast<const uint8_t*>(base)[i] != 0 ? 1.0f : 0.0f;
    case CUDNN_DATA_FLOAT:
      break;
  }
  return static_cast<const float*>(base)[i];
}

void Store(void* base, int64_t i, cudnnDataType_t type, float v) {
  switch (type) {
    case CUDNN_DATA_HALF:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      return;
    case CUDNN_DATA_BFLOAT16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      return;
    case CUDNN_DATA_INT32:
      static_cast<int32_t*>(base)[i] = ToInt32(v);
      return;
    case CUDNN_DATA_BOOLEAN:
      static_cast<uint8_t*>(base)[i] = v != 0.0f ? 1 : 0;
      return;
    case CUDNN_DATA_FLOAT:
      break;
  }
  static_cast<float*>(base)[i] = v;
}

// ---- Running a graph --------------------------------------------------------------------------

// Calls f(index) for every index of `dims`, the last dimension fastest.
template <typename F>
void ForEachIndex(const std::vector<int64_t>& dims, F f) {
  std::vector<int64_t> index(dims.size(), 0);
  while (true) {
    f(static_cast<const std::vector<int64_t>&>(index));
    auto k = static_cast<int64_t>(dims.size()) - 1;
    for (; k >= 0 && ++index[k] == dims[k]; --k) index[k] = 0;
    if (k < 0) return;
  }
}

// Where element `index` of a shape of t's rank lies in t: size-1 dimensions broadcast.
int64_t OffsetOf(const Tensor& t, const std::vector<int64_t>& index) {
  int64_t offset = 0;
  for (size_t k = 0; k < t.dims.size(); ++k)
    offset += (t.dims[k] == 1 ? 0 : index[k]) * t.strides[k];
  return offset;
}

// One tensor's elements while a graph runs. A virtual tensor's are floats on the host, at its
// strides' offsets, each marked when written: reading one that no op wrote dies (on a GPU it
// would read whatever the engine's buffers held).
class Storage {
 public:
  Storage(const Tensor& t, const Bound* bound) : t_(&t) {
    if (bound != nullptr) {
      device_ = bound->device;
      value_ = bound->value;
    } else {
      host_.resize(static_cast<size_t>(t.Span()));
      written_.resize(host_.size(), false);
    }
  }
  float Read(int64_t offset) const {
    if (t_->by_value) return value_;
    if (!t_->is_virtual) return Load(device_, offset, t_->type);
    if (!written_[static_cast<size_t>(offset)]) {
      const std::string what = "cuDNN: virtual " + t_->Name() + " is read at offset " +
                               std::to_string(offset) + ", which no op of the graph wrote";
      drover_emu::Die(what.c_str());
    }
    return host_[static_cast<size_t>(offset)];
  }
  void Write(int64_t offset, float v) {
    if (!t_->is_virtual) {
      Store(device_, offset, t_->type, v);
      return;
    }
    host_[static_cast<size_t>(offset)] = RoundTo(t_->type, v);
    written_[static_cast<size_t>(offset)] = true;
  }

 private:
  const Tensor* t_;
  void* device_ = nullptr;
  float value_ = 0.0f;
  std::vector<float> host_;
  std::vector<bool> written_;
};

// A pointwise mode's value at one element: v holds x, b and t as the mode takes them;
// `position` is the element's index along the op's axis.
float Apply(cudnnPointwiseMode_t mode, const float (&v)[3], int64_t position) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD:
      return v[0] + v[1];
    case CUDNN_POINTWISE_MUL:
      return v[0] * v[1];
    case CUDNN_POINTWISE_SUB:
      return v[0] - v[1];
    case CUDNN_POINTWISE_DIV:
      return v[0] / v[1];
    case CUDNN_POINTWISE_EXP:
      return std::exp(v[0]);
    case CUDNN_POINTWISE_LOG:
      return std::log(v[0]);
    case CUDNN_POINTWISE_CMP_GE:
      return v[0] >= v[1] ? 1.0f : 0.0f;
    case CUDNN_POINTWISE_GEN_INDEX:
      return static_cast<float>(position);
    case CUDNN_POINTWISE_BINARY_SELECT:
      return v[2] != 0.0f ? v[0] : v[1];
    case CUDNN_POINTWISE_IDENTITY:
      break;
  }
  return v[0];
}

class Execution {
 public:
  Execution(const Graph& graph, const std::map<int64_t, Bound>& bound) {
    for (const auto& [uid, t] : graph.tensors) {
      const auto b = bound.find(uid);
      storage_.emplace(uid, Storage(*t, b == bound.end() ? nullptr : &b->second));
    }
  }
  void Run(const Op& op) {
    switch (op.kind) {
      case Op::kPointwise:
        return Pointwise(op);
      case Op::kMatmul:
        return Matmul(op);
      case Op::kReduction:
        return Reduction(op);
      case Op::kReshape:
        return Reshape(op);
    }
  }

 private:
  Storage& Of(const TensorRef& t) { return storage_.at(t->uid); }

  void Pointwise(const Op& op) {
    // GEN_INDEX takes only x's shape: its values are not read.
    const size_t reads = op.mode == CUDNN_POINTWISE_GEN_INDEX ? 0 : op.inputs.size();
    Storage* in[3] = {};
    for (size_t i = 0; i < reads; ++i) in[i] = &Of(op.inputs[i]);
    Storage& y = Of(op.output);
    ForEachIndex(op.output->dims, [&](const std::vector<int64_t>& index) {
      float v[3] = {0.0f, 0.0f, 0.0f};
      for (size_t i = 0; i < reads; ++i) v[i] = in[i]->Read(OffsetOf(*op.inputs[i], index));
      y.Write(OffsetOf(*op.output, index), Apply(op.mode, v, index[op.axis]));
    });
  }

  // C[batch, m, n] = sum_k A[batch, m, k] B[batch, k, n], summed in double.
  void Matmul(const Op& op) {
    const Tensor &a = *op.inputs[0], &b = *op.inputs[1], &c = *op.output;
    Storage &in_a = Of(op.inputs[0]), &in_b = Of(op.inputs[1]), &out = Of(op.output);
    const size_t r = c.dims.size();
    const int64_t depth = a.dims[r - 1], a_step = a.strides[r - 1], b_step = b.strides[r - 2];
    std::vector<int64_t> first_a, first_b;  // (batch, m, 0) and (batch, 0, n)
    ForEachIndex(c.dims, [&](const std::vector<int64_t>& index) {
      first_a = first_b = index;
      first_a[r - 1] = first_b[r - 2] = 0;
      const int64_t at_a = OffsetOf(a, first_a), at_b = OffsetOf(b, first_b);
      double sum = 0.0;
      for (int64_t k = 0; k < depth; ++k) {
        sum += double{in_a.Read(at_a + k * a_step)} * in_b.Read(at_b + k * b_step);
      }
      out.Write(OffsetOf(c, index), static_cast<float>(sum));
    });
  }

  // y's element sums (or takes the largest of) x's over the dimensions where y is 1 and x is
  // not. MAX propagates NaN.
  void Reduction(const Op& op) {
    const Tensor &x = *op.inputs[0], &y = *op.output;
    Storage &in = Of(op.inputs[0]), &out = Of(op.output);
    std::vector<int64_t> reduced(x.dims.size()), at_x(x.dims.size());
    for (size_t k = 0; k < x.dims.size(); ++k) reduced[k] = y.dims[k] == 1 ? x.dims[k] : 1;
    const bool add = op.reduction == CUDNN_REDUCE_TENSOR_ADD;
    ForEachIndex(y.dims, [&](const std::vector<int64_t>& index) {
      double acc = add ? 0.0 : -INFINITY;
      ForEachIndex(reduced, [&](const std::vector<int64_t>& within) {
        for (size_t k = 0; k < at_x.size(); ++k) at_x[k] = index[k] + within[k];
        const double v = in.Read(OffsetOf(x, at_x));
        if (add) {
          acc += v;
        } else if (!std::isnan(acc) && (std::isnan(v) || v > acc)) {
          acc = v;
        }
      });
      out.Write(OffsetOf(y, index), static_cast<float>(acc));
    });
  }

  // y's element j is what x's memory holds at y's offset of j.
  void Reshape(const Op& op) {
    Storage &in = Of(op.inputs[0]), &out = Of(op.output);
    ForEachIndex(op.output->dims, [&](const std::vector<int64_t>& index) {
      const int64_t offset = OffsetOf(*op.output, index);
      out.Write(offset, in.Read(offset));
    });
  }

  std::map<int64_t, Storage> storage_;
};

}  // namespace

std::string PointerText(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

cudnnStatus_t Bind(const Graph& graph, const std::vector<int64_t>& uids,
                   const std::vector<void*>& pointers, std::map<int64_t, Bound>* bound) {
  for (const auto& [uid, t] : graph.tensors) {
    if (t->is_virtual) continue;
    const auto at = std::find(uids.begin(), uids.end(), uid);
    if (at == uids.end()) {
      return Refuse(CUDNN_STATUS_BAD_PARAM,
                    "execute: " + t->Name() + " is not in the variant pack");
    }
    void* p = pointers[static_cast<size_t>(at - uids.begin())];
    Bound b;
    if (t->by_value) {
      // Read on the host: a device pointer here would be a host address it does not own.
      if (p == nullptr || drover_emu::InDeviceMemory(p, DataBytes(t->type))) {
        return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: by-value " + t->Name() + "'s pointer " +
                                                  PointerText(p) + " is not host memory");
      }
      b.value = Load(p, 0, t->type);
    } else {
      const auto bytes = static_cast<size_t>(t->Span()) * DataBytes(t->type);
      if (!drover_emu::InDeviceMemory(p, bytes)) {
        return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: " + t->Name() + "'s pointer " +
                                                  PointerText(p) + " does not hold its " +
                                                  std::to_string(bytes) +
                                                  " bytes in one device allocation");
      }
      if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(t->alignment) != 0) {
        return Refuse(CUDNN_STATUS_BAD_PARAM, "execute: " + t->Name() + "'s pointer " +
                                                  PointerText(p) + " is not aligned to " +
                                                  std::to_string(t->alignment) + " bytes");
      }
      b.device = p;
    }
    bound->emplace(uid, b);
  }
  return CUDNN_STATUS_SUCCESS;
}

void RunGraph(const Graph& graph, const std::map<int64_t, Bound>& bound, void* workspace,
              int64_t workspace_bytes) {
  if (workspace_bytes > 0) std::memset(workspace, kGarbage, static_cast<size_t>(workspace_bytes));
  Execution run(graph, bound);
  for (const OpRef& op : graph.ops) run.Run(*op);
  if (workspace_bytes > 0) std::memset(workspace, kGarbage, static_cast<size_t>(workspace_bytes));
}

}  // namespace drover_emu::cudnn
