// What the emulator's cuDNN files share (tests/cuda_emu/README.md): cudnn_emu_finalize.cc
// finalizes the API's descriptors (cudnn_emu.cc, cudnn_emu_descriptor.h) into the structs here,
// and cudnn_graph_run.cc binds an execution's variant pack and runs the graph. Nothing outside
// tests/cuda_emu includes it.
//
// A finalized Tensor, Op or Graph never changes: descriptors' copies and the runs enqueued on a
// stream share them, from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"
#include "cudnn_graph.h"

namespace drover_emu::cudnn {

// ---- What finalized descriptors hold ---------------------------------------------------------

struct Tensor {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t alignment = 0;
  bool is_virtual = false, by_value = false;

  // Element (i0..in) lies at sum(i_k strides_k), so the tensor reaches this many elements of
  // its memory: its last element's offset + 1.
  int64_t Span() const {
    int64_t last = 0;
    for (size_t k = 0; k < dims.size(); ++k) last += (dims[k] - 1) * strides[k];
    return last + 1;
  }
  int64_t Elements() const {
    int64_t n = 1;
    for (const int64_t d : dims) n *= d;
    return n;
  }
  bool SameAs(const Tensor& o) const {
    return type == o.type && dims == o.dims && strides == o.strides && is_virtual == o.is_virtual &&
           by_value == o.by_value;
  }
  std::string Name() const { return "tensor uid " + std::to_string(uid); }
};
using TensorRef = std::shared_ptr<const Tensor>;

struct Op {
  enum Kind { kPointwise, kMatmul, kReduction, kReshape } kind;
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY;       // kPointwise
  int64_t axis = 0;                                           // kPointwise, GEN_INDEX
  cudnnReduceTensorOp_t reduction = CUDNN_REDUCE_TENSOR_ADD;  // kReduction
  // kPointwise: x, then b and t where the mode takes them; kMatmul: a, b; else x.
  std::vector<TensorRef> inputs;
  TensorRef output;
};
using OpRef = std::shared_ptr<const Op>;

struct Graph {
  std::vector<OpRef> ops;                // each after the ops that write what it reads
  std::map<int64_t, TensorRef> tensors;  // by unique id
};

// An element's bytes in device memory; 0 for a type the emulator does not take.
size_t DataBytes(cudnnDataType_t type);

// Returns `status`, leaving `message` for this thread's cudnnGetLastErrorString (cudnn_emu.cc).
cudnnStatus_t Refuse(cudnnStatus_t status, const std::string& message);
// `p` as refusals name it ("%p"; cudnn_graph_run.cc).
std::string PointerText(const void* p);

// ---- Running a graph (cudnn_graph_run.cc) -------------------------------------------------------

// A non-virtual tensor's data for one execution: device memory, or a by-value tensor's value
// (read from the caller's host pointer at the call).
struct Bound {
  void* device = nullptr;
  float value = 0.0f;
};

// The data of the graph's non-virtual tensors from the variant pack (its unique ids and, at the
// same positions, its data pointers), checked as the engine would use it: device memory
// covering each tensor's span at its alignment, a by-value tensor's value read now (the caller
// may reuse its host variable once the call returns). A refusal returns its status through
// Refuse.
cudnnStatus_t Bind(const Graph& graph, const std::vector<int64_t>& uids,
                   const std::vector<void*>& pointers, std::map<int64_t, Bound>* bound);

// Runs `graph`'s ops in order on the data `bound` gives its tensors, at once, on the calling
// thread: cudnnBackendExecute enqueues it on the handle's stream. The workspace
// (workspace_bytes of device memory) is the engine's scratch: garbage before the ops (an input
// placed in it is corrupted) and after (so is an output).
void RunGraph(const Graph& graph, const std::map<int64_t, Bound>& bound, void* workspace,
              int64_t workspace_bytes);

}  // namespace drover_emu::cudnn
