#include "worker/engine/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace drover::engine {
namespace {

// SplitMix64: a tiny counter-style generator; every (seed, tensor, chunk) gets its own
// stream so that init is the same for any thread count.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: 53 random bits, never 0 (log(0) in Box-Muller).
  double Uniform() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }
};

// Fills x[0..n) with N(0, std^2); normals in pairs through Box-Muller in double.
void FillNormal(float* x, size_t n, double std, uint64_t stream) {
  SplitMix64 rng{stream};
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(rng.Uniform()));
    const double theta = 2.0 * std::numbers::pi * rng.Uniform();
    x[i] = static_cast<float>(std * r * std::cos(theta));
    if (i + 1 < n) x[i + 1] = static_cast<float>(std * r * std::sin(theta));
  }
}

}  // namespace

void InitGptParams(const GptConfig& config, uint64_t seed, float* params) {
  const std::vector<TensorInfo> tensors = GptTensorTable(config);
  const double kStd = 0.02;
  const double proj_std = kStd / std::sqrt(2.0 * config.num_layers);
  constexpr size_t kChunk = 1 << 16;
  for (size_t ti = 0; ti < tensors.size(); ti++) {
    const TensorInfo& t = tensors[ti];
    float* x = params + t.offset;
    const bool is_proj = t.name.ends_with(".attprojw") || t.name.ends_with(".fcprojw");
    if (t.shape.size() == 2) {
      const double std = is_proj ? proj_std : kStd;
      // The live rows only: wte's padded rows stay zero.
      size_t numel = t.numel;
      if (t.name == "wte") numel = static_cast<size_t>(config.vocab_size) * config.channels;
      const size_t chunks = (numel + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
      for (size_t c = 0; c < chunks; c++) {
        const uint64_t stream = seed * 0x9E3779B97F4A7C15ull + (ti << 32) + c;
        FillNormal(x + c * kChunk, std::min(kChunk, numel - c * kChunk), std, stream);
      }
      std::fill(x + numel, x + t.numel, 0.0f);
    } else {
      // Vectors: LayerNorm weights are one, biases and LayerNorm biases zero.
      const bool is_ln_weight =
          t.name.ends_with("ln1w") || t.name.ends_with("ln2w") || t.name == "lnfw";
      std::fill(x, x + t.numel, is_ln_weight ? 1.0f : 0.0f);
    }
  }
}

Gpt::Gpt(const GptConfig& config)
    : layout_(GptLayout::Whole(config)),
      ops_(CpuOps()),
      params_(ops_->Allocate(layout_.num_params())),
      grads_(ops_->Allocate(layout_.num_params())),
      memory_(&layout_, ops_, params_.data(), grads_.data()),
      stage_(&layout_, ops_, /*tp=*/nullptr),
      acts_(&layout_, ops_) {}

Gpt::~Gpt() = default;

const TensorInfo* Gpt::FindTensor(std::string_view name) const {
  for (const TensorInfo& t : tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void Gpt::InitRandom(uint64_t seed) { InitGptParams(config(), seed, params_.data()); }

float Gpt::Forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  DROVER_CHECK(B >= 1 && T >= 1 && T <= config().max_seq_len);
  acts_.Ensure(B, T);
  const size_t BT = static_cast<size_t>(B) * T;
  std::copy(inputs, inputs + BT, acts_.inputs());
  if (targets != nullptr) std::copy(targets, targets + BT, acts_.targets());
  const auto pass = targets != nullptr ? GptStage::Pass::kTrain : GptStage::Pass::kLogits;
  // A single stage without tensor parallelism has no communication: it cannot fail.
  auto loss = stage_.Forward(acts_, memory_, pass);
  DROVER_CHECK_OK(loss.status());
  return *loss;
}

float* Gpt::grads() { return const_cast<float*>(static_cast<const Gpt*>(this)->grads()); }

const float* Gpt::grads() const {
  memory_.MaterializeZeros();
  return grads_.data();
}

void Gpt::Backward(float grad_scale) {
  DROVER_CHECK_OK(stage_.Backward(acts_, memory_, grad_scale));
}

std::vector<float> Gpt::NextTokenLogits(const int32_t* tokens, int n) {
  DROVER_CHECK(n >= 1);
  const int len = std::min(n, config().max_seq_len);
  Forward(tokens + (n - len), nullptr, 1, len);
  const float* row = logits() + static_cast<size_t>(len - 1) * config().padded_vocab_size;
  return std::vector<float>(row, row + config().vocab_size);
}

}  // namespace drover::engine
