// The emulator's cuDNN descriptors (tests/cuda_emu/README.md): what a backend descriptor holds
// as the caller sets its attributes, which attributes each descriptor type takes
// (cudnn_emu_descriptor.cc), and the finalizing that checks them as cuDNN documents and makes
// them into the Tensor, Op and Graph of cudnn_emu_internal.h (cudnn_emu_finalize.cc).
// cudnn_emu.cc, the API, is built on these. Nothing outside tests/cuda_emu includes it.
//
// Threads: as cuDNN's, a descriptor is used by one thread at a time; the set of live
// descriptors (Live) takes any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cudnn_emu_internal.h"
#include "cudnn_graph.h"

// Returns a refusal (a status other than SUCCESS) from the calling function.
#define RETURN_IF_REFUSED(expr)                          \
  do {                                                   \
    const cudnnStatus_t status_ = (expr);                \
    if (status_ != CUDNN_STATUS_SUCCESS) return status_; \
  } while (0)

namespace drover_emu::cudnn {

// Every plan's workspace: nonzero, so that a caller must pass one. The run overwrites it with
// garbage, so that a workspace overlapping the caller's data shows (cudnn_graph_run.cc).
constexpr int64_t kWorkspaceBytes = 4096;

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

// ---- The descriptors alive (cudnn_emu_descriptor.cc) ------------------------------------------

// Created and not yet destroyed: another pointer (a destroyed descriptor's) is refused, where
// the real library would read freed memory.
void AddLive(const Descriptor* d);
bool RemoveLive(const Descriptor* d);  // false: not live
// `d` as a live descriptor, or null.
Descriptor* AsDescriptor(cudnnBackendDescriptor_t d);

// ---- The attributes each descriptor type takes (cudnn_emu_descriptor.cc) ----------------------

struct AttributeSpec {
  cudnnBackendAttributeName_t name;
  const char* text;
  cudnnBackendAttributeType_t type;
  bool array = false;                                    // any count; otherwise exactly one element
  bool read_only = false;                                // only GetAttribute
  std::vector<cudnnBackendDescriptorType_t> holds = {};  // BACKEND_DESCRIPTOR: types taken
};

struct DescriptorSpec {
  cudnnBackendDescriptorType_t type;
  const char* text;
  std::vector<AttributeSpec> attributes;
};

// Null for a type, or an attribute, that is not emulated.
const DescriptorSpec* SpecOf(cudnnBackendDescriptorType_t type);
const AttributeSpec* SpecOf(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t name);
const char* TypeName(cudnnBackendDescriptorType_t type);
std::string AttributeText(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t name);
size_t ElementBytes(cudnnBackendAttributeType_t type);

// ---- Reading attributes ---------------------------------------------------------------------

const Attribute* Find(const Descriptor& d, cudnnBackendAttributeName_t name);
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
// The i-th descriptor of a descriptor-valued attribute that is set.
const Descriptor& Child(const Descriptor& d, cudnnBackendAttributeName_t name, size_t i = 0);
// BAD_PARAM naming the first of `names` that `d` lacks.
cudnnStatus_t Require(const Descriptor& d,
                      std::initializer_list<cudnnBackendAttributeName_t> names);
// "[2, 3]".
std::string DimsText(const std::vector<int64_t>& dims);

// ---- Finalizing, and the heuristics (cudnn_emu_finalize.cc) -----------------------------------

// Checks `d`'s attributes as cuDNN would for its type and makes what it describes.
cudnnStatus_t FinalizeByType(Descriptor& d);
// A descriptor-valued GetAttribute: the caller passes descriptors it created, of the value's
// type, and each becomes a copy of the value (finalized).
cudnnStatus_t FillDescriptor(cudnnBackendDescriptor_t target, const Descriptor& value);
// ENGINEHEUR_RESULTS: one engine configuration for any graph, none where
// DROVER_EMU_CUDNN_NO_ENGINE is set (as cuDNN gives none for a graph pattern it has no engine
// for).
cudnnStatus_t HeuristicResults(const Descriptor& heur, int64_t requested, int64_t* count,
                               void* elements);

}  // namespace drover_emu::cudnn
