// The kernel emulator's cuDNN (tests/cuda_emu/README.md): the backend ("graph") API that
// include/cudnn_graph.h declares, for the kernel table's fused attention
// (kernels/cuda/cudnn_attention.cu). Descriptors are checked as cuDNN documents them
// (cudnn_emu_descriptor.h: what each type takes, and finalizing); a refusal returns its status
// and leaves a message for cudnnGetLastErrorString. An execution
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
#include "cudnn_emu_descriptor.h"
#include "cudnn_emu_internal.h"
#include "cudnn_graph.h"
#include "emu_internal.h"

#define DROVER_CUDNN_EXPORT extern "C" __attribute__((visibility("default")))

struct cudnnContext {
  cudaStream_t stream = nullptr;  // cudnnSetStream's: where executions are enqueued
};

using drover_emu::cudnn::AddLive;
using drover_emu::cudnn::AsDescriptor;
using drover_emu::cudnn::Attribute;
using drover_emu::cudnn::AttributeSpec;
using drover_emu::cudnn::AttributeText;
using drover_emu::cudnn::Bind;
using drover_emu::cudnn::Bound;
using drover_emu::cudnn::Descriptor;
using drover_emu::cudnn::ElementBytes;
using drover_emu::cudnn::FillDescriptor;
using drover_emu::cudnn::FinalizeByType;
using drover_emu::cudnn::Find;
using drover_emu::cudnn::HeuristicResults;
using drover_emu::cudnn::PointerText;
using drover_emu::cudnn::Refuse;
using drover_emu::cudnn::RemoveLive;
using drover_emu::cudnn::RunGraph;
using drover_emu::cudnn::SpecOf;
using drover_emu::cudnn::TypeName;
using drover_emu::cudnn::Value;
using drover_emu::cudnn::Values;

namespace {

std::atomic<uint64_t> g_executions{0};  // cudnnBackendExecute calls taken

// ---- Refusals ------------------------------------------------------------------------------

thread_local std::string t_last_error;  // cudnnGetLastErrorString's

}  // namespace

cudnnStatus_t drover_emu::cudnn::Refuse(cudnnStatus_t status, const std::string& message) {
  t_last_error = "cuDNN (emulated): " + message;
  return status;
}

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
  AddLive(d);
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

DROVER_CUDNN_EXPORT cudnnStatus_t
cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  if (!RemoveLive(static_cast<const Descriptor*>(descriptor))) {
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
