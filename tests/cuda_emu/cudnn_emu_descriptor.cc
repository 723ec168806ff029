// The emulator's cuDNN descriptors: the live set, and which attributes each type takes
// (cudnn_emu_descriptor.h).
#include "cudnn_emu_descriptor.h"

#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace drover_emu::cudnn {

namespace {

// The descriptors created and not destroyed.
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

}  // namespace

void AddLive(const Descriptor* d) { Live().Add(d); }
bool RemoveLive(const Descriptor* d) { return Live().Remove(d); }
Descriptor* AsDescriptor(cudnnBackendDescriptor_t d) {
  return d != nullptr && Live().Contains(d) ? static_cast<Descriptor*>(d) : nullptr;
}

std::string DimsText(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
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
const Descriptor& Child(const Descriptor& d, cudnnBackendAttributeName_t name, size_t i) {
  return *Find(d, name)->descriptors[i];
}

std::string AttributeText(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t name) {
  const AttributeSpec* spec = SpecOf(type, name);
  return spec != nullptr ? spec->text : "attribute " + std::to_string(name);
}

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

}  // namespace drover_emu::cudnn
