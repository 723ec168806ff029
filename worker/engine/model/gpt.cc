#include "worker/engine/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "worker/engine/kernels/cpu/attention.h"
#include "worker/engine/kernels/cpu/crossentropy.h"
#include "worker/engine/kernels/cpu/encoder.h"
#include "worker/engine/kernels/cpu/gelu.h"
#include "worker/engine/kernels/cpu/layernorm.h"
#include "worker/engine/kernels/cpu/matmul.h"

namespace drover::engine {
namespace {

// Per-layer tensors in arena order; kLayerTensors entries per layer.
enum LayerTensor {
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kLayerTensors
};
constexpr const char* kLayerTensorNames[kLayerTensors] = {
    "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
// Table index of the first layer tensor (after wte, wpe).
constexpr int kFirstLayerTensor = 2;

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

int PaddedVocabSize(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

GptConfig GptConfig::FromSpec(const ModelSpec& spec) {
  GptConfig c;
  c.max_seq_len = spec.block_size;
  c.vocab_size = spec.vocab_size;
  c.padded_vocab_size = PaddedVocabSize(spec.vocab_size);
  c.num_layers = spec.n_layer;
  c.num_heads = spec.n_head;
  c.channels = spec.n_embd;
  return c;
}

Status GptConfig::Validate() const {
  auto positive = [](const char* name, int v) -> Status {
    if (v > 0) return OkStatus();
    return InvalidArgumentError(std::string("model config: ") + name + " must be positive, got " +
                                std::to_string(v));
  };
  RETURN_IF_ERROR(positive("max_seq_len", max_seq_len));
  RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(positive("num_layers", num_layers));
  RETURN_IF_ERROR(positive("num_heads", num_heads));
  RETURN_IF_ERROR(positive("channels", channels));
  if (channels % num_heads != 0) {
    return InvalidArgumentError("model config: channels (" + std::to_string(channels) +
                                ") must be divisible by num_heads (" + std::to_string(num_heads) +
                                ")");
  }
  if (padded_vocab_size < vocab_size) {
    return InvalidArgumentError("model config: padded_vocab_size (" +
                                std::to_string(padded_vocab_size) + ") must be >= vocab_size (" +
                                std::to_string(vocab_size) + ")");
  }
  return OkStatus();
}

std::vector<TensorInfo> GptTensorTable(const GptConfig& cfg) {
  const int64_t C = cfg.channels;
  std::vector<TensorInfo> t;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    t.push_back(TensorInfo{std::move(name), offset, numel, std::move(shape), decay});
    offset += numel;
  };
  add("wte", {cfg.padded_vocab_size, C}, true);
  add("wpe", {cfg.max_seq_len, C}, true);
  for (int l = 0; l < cfg.num_layers; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln1w", {C}, false);
    add(p + "ln1b", {C}, false);
    add(p + "qkvw", {3 * C, C}, true);
    add(p + "qkvb", {3 * C}, false);
    add(p + "attprojw", {C, C}, true);
    add(p + "attprojb", {C}, false);
    add(p + "ln2w", {C}, false);
    add(p + "ln2b", {C}, false);
    add(p + "fcw", {4 * C, C}, true);
    add(p + "fcb", {4 * C}, false);
    add(p + "fcprojw", {C, 4 * C}, true);
    add(p + "fcprojb", {C}, false);
  }
  add("lnfw", {C}, false);
  add("lnfb", {C}, false);
  return t;
}

size_t GptNumParams(const GptConfig& config) {
  const auto table = GptTensorTable(config);
  return table.back().offset + table.back().numel;
}

// Activation (and activation-gradient) pointers into one arena, laid out for (B, T).
struct Gpt::Activations {
  std::unique_ptr<float[]> arena;
  size_t capacity = 0;  // floats
  std::vector<int32_t> inputs, targets;
  // Forward. Per-layer buffers hold L slices; layer l starts at l * (one slice).
  float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean,
      *ln2_rstd, *fch, *fch_gelu, *residual3;
  float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *lse;
  // Backward scratch: the residual stream's gradient and three working buffers.
  float *dres, *dbtc, *dqkv, *dfch;
};

namespace {
// Points ptrs[i] at consecutive buffers of sizes[i] floats from `base` (null: only
// measure) and returns the number of floats used.
size_t LayoutActivations(float* base, float** ptrs[], int nptrs, const size_t sizes[]) {
  size_t off = 0;
  for (int i = 0; i < nptrs; i++) {
    if (base != nullptr) *ptrs[i] = base + off;
    // Round every buffer to 16 floats (64 bytes) so rows start cache-line aligned.
    off += (sizes[i] + 15) / 16 * 16;
  }
  return off;
}
}  // namespace

void Gpt::EnsureActivations(int B, int T) {
  Activations& a = *acts_;
  const size_t L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t Vp = config_.padded_vocab_size;
  float** ptrs[] = {&a.encoded,  &a.ln1,       &a.ln1_mean, &a.ln1_rstd, &a.qkv,      &a.atty,
                    &a.att,      &a.residual2, &a.ln2,      &a.ln2_mean, &a.ln2_rstd, &a.fch,
                    &a.fch_gelu, &a.residual3, &a.lnf,      &a.lnf_mean, &a.lnf_rstd, &a.logits,
                    &a.losses,   &a.lse,       &a.dres,     &a.dbtc,     &a.dqkv,     &a.dfch};
  const size_t sizes[] = {BT * C,
                          L * BT * C,
                          L * BT,
                          L * BT,
                          L * BT * 3 * C,
                          L * BT * C,
                          L * B * NH * T * T,
                          L * BT * C,
                          L * BT * C,
                          L * BT,
                          L * BT,
                          L * BT * 4 * C,
                          L * BT * 4 * C,
                          L * BT * C,
                          BT * C,
                          BT,
                          BT,
                          BT * Vp,
                          BT,
                          BT,
                          BT * C,
                          BT * C,
                          BT * 3 * C,
                          BT * 4 * C};
  constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
  static_assert(n == sizeof(ptrs) / sizeof(ptrs[0]));
  const size_t need = LayoutActivations(nullptr, ptrs, n, sizes);
  if (need > a.capacity) {
    // Zero-filled once, so padded logit columns are defined (they are never written).
    a.arena.reset(new float[need]());
    a.capacity = need;
  }
  LayoutActivations(a.arena.get(), ptrs, n, sizes);
}

Gpt::Gpt(const GptConfig& config)
    : config_(config), tensors_(GptTensorTable(config)), acts_(new Activations) {
  DROVER_CHECK_OK(config.Validate());
  num_params_ = tensors_.back().offset + tensors_.back().numel;
  params_.reset(new float[num_params_]());
  grads_.reset(new float[num_params_]());
}

Gpt::~Gpt() = default;

const TensorInfo* Gpt::FindTensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::pair<size_t, size_t> Gpt::LayerRange(int l) const {
  DROVER_CHECK(l >= 0 && l < config_.num_layers);
  const TensorInfo& first = tensors_[kFirstLayerTensor + l * kLayerTensors];
  const TensorInfo& last = tensors_[kFirstLayerTensor + (l + 1) * kLayerTensors - 1];
  return {first.offset, last.offset + last.numel};
}

void Gpt::InitRandom(uint64_t seed) {
  const double kStd = 0.02;
  const double proj_std = kStd / std::sqrt(2.0 * config_.num_layers);
  constexpr size_t kChunk = 1 << 16;
  for (size_t ti = 0; ti < tensors_.size(); ti++) {
    const TensorInfo& t = tensors_[ti];
    float* x = params_.get() + t.offset;
    const bool is_proj = t.name.ends_with(".attprojw") || t.name.ends_with(".fcprojw");
    if (t.shape.size() == 2) {
      const double std = is_proj ? proj_std : kStd;
      // The live rows only: wte's padded rows stay zero.
      size_t numel = t.numel;
      if (t.name == "wte") numel = static_cast<size_t>(config_.vocab_size) * config_.channels;
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

float Gpt::Forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  DROVER_CHECK(B >= 1 && T >= 1 && T <= config_.max_seq_len);
  const int C = config_.channels, NH = config_.num_heads, L = config_.num_layers;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const int BT = B * T;
  EnsureActivations(B, T);
  Activations& a = *acts_;
  a.inputs.assign(inputs, inputs + BT);
  for (int i = 0; i < BT; i++) DROVER_CHECK_MSG(inputs[i] >= 0 && inputs[i] < V, "token id");
  if (targets != nullptr) {
    a.targets.assign(targets, targets + BT);
    for (int i = 0; i < BT; i++) DROVER_CHECK_MSG(targets[i] >= 0 && targets[i] < V, "target id");
  }
  last_B_ = B;
  last_T_ = T;
  const float* p = params_.get();
  auto lp = [&](int l, int k) {
    return p + tensors_[kFirstLayerTensor + l * kLayerTensors + k].offset;
  };
  const size_t btc = static_cast<size_t>(BT) * C;

  cpu::EncoderForward(a.encoded, a.inputs.data(), p + tensors_[0].offset, p + tensors_[1].offset, B,
                      T, C);
  for (int l = 0; l < L; l++) {
    const float* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
    float* ln1 = a.ln1 + l * btc;
    float* qkv = a.qkv + l * 3 * btc;
    float* atty = a.atty + l * btc;
    float* att = a.att + static_cast<size_t>(l) * B * NH * T * T;
    float* res2 = a.residual2 + l * btc;
    float* ln2 = a.ln2 + l * btc;
    float* fch = a.fch + l * 4 * btc;
    float* fchg = a.fch_gelu + l * 4 * btc;
    float* res3 = a.residual3 + l * btc;
    cpu::LayerNormForward(ln1, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, x, lp(l, kLn1w),
                          lp(l, kLn1b), BT, C);
    cpu::MatmulForward(qkv, ln1, lp(l, kQkvw), lp(l, kQkvb), nullptr, BT, C, 3 * C, 3 * C);
    cpu::AttentionForward(atty, att, qkv, B, T, C, NH);
    cpu::MatmulForward(res2, atty, lp(l, kAttprojw), lp(l, kAttprojb), x, BT, C, C, C);
    cpu::LayerNormForward(ln2, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, res2, lp(l, kLn2w),
                          lp(l, kLn2b), BT, C);
    cpu::MatmulForward(fch, ln2, lp(l, kFcw), lp(l, kFcb), nullptr, BT, C, 4 * C, 4 * C);
    cpu::GeluForward(fchg, fch, 4 * btc);
    cpu::MatmulForward(res3, fchg, lp(l, kFcprojw), lp(l, kFcprojb), res2, BT, 4 * C, C, C);
  }
  const size_t lnf_off = tensors_[tensors_.size() - 2].offset;
  cpu::LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (L - 1) * btc, p + lnf_off,
                        p + lnf_off + C, BT, C);
  // Tied LM head; only the V live columns are computed.
  cpu::MatmulForward(a.logits, a.lnf, p + tensors_[0].offset, nullptr, nullptr, BT, C, V, Vp);
  backward_ready_ = targets != nullptr;
  if (targets == nullptr) return 0.0f;
  return cpu::CrossEntropyForward(a.losses, a.lse, a.logits, a.targets.data(), BT, V, Vp);
}

const float* Gpt::logits() const { return acts_->logits; }

void Gpt::ZeroGrad() { zero_grad_pending_ = true; }

float* Gpt::grads() { return const_cast<float*>(static_cast<const Gpt*>(this)->grads()); }

const float* Gpt::grads() const {
  if (zero_grad_pending_) {
    std::memset(grads_.get(), 0, sizeof(float) * num_params_);
    zero_grad_pending_ = false;
  }
  return grads_.get();
}

void Gpt::Backward(float grad_scale) {
  DROVER_CHECK_MSG(backward_ready_, "Backward needs a Forward with targets right before");
  backward_ready_ = false;  // the logits buffer becomes dlogits below
  const int B = last_B_, T = last_T_;
  const int C = config_.channels, NH = config_.num_heads, L = config_.num_layers;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const int BT = B * T;
  const size_t btc = static_cast<size_t>(BT) * C;
  Activations& a = *acts_;
  const float* p = params_.get();
  float* g = grads_.get();
  // After ZeroGrad every gradient is written (=) by the first op that produces it, and
  // only the scatter-adds of the encoder need zeros underneath.
  const bool acc = !zero_grad_pending_;
  zero_grad_pending_ = false;
  auto off = [&](int l, int k) {
    return tensors_[kFirstLayerTensor + l * kLayerTensors + k].offset;
  };
  const size_t wte = tensors_[0].offset, wpe = tensors_[1].offset;
  const size_t lnf = tensors_[tensors_.size() - 2].offset;

  cpu::CrossEntropyBackward(a.logits, a.lse, a.targets.data(), grad_scale / BT, BT, V, Vp);
  cpu::MatmulBackward(a.dbtc, g + wte, nullptr, a.logits, a.lnf, p + wte, BT, C, V, Vp, acc);
  if (!acc) {
    std::fill(g + wte + static_cast<size_t>(V) * C, g + wte + static_cast<size_t>(Vp) * C, 0.0f);
    std::fill(g + wpe, g + wpe + tensors_[1].numel, 0.0f);
  }
  std::memset(a.dres, 0, sizeof(float) * btc);
  cpu::LayerNormBackward(a.dres, g + lnf, g + lnf + C, a.dbtc, a.residual3 + (L - 1) * btc, p + lnf,
                         a.lnf_mean, a.lnf_rstd, BT, C, acc);
  for (int l = L - 1; l >= 0; l--) {
    const float* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
    const float* fch = a.fch + l * 4 * btc;
    cpu::MatmulBackward(a.dfch, g + off(l, kFcprojw), g + off(l, kFcprojb), a.dres,
                        a.fch_gelu + l * 4 * btc, p + off(l, kFcprojw), BT, 4 * C, C, C, acc);
    cpu::GeluBackward(a.dfch, fch, a.dfch, 4 * btc);
    cpu::MatmulBackward(a.dbtc, g + off(l, kFcw), g + off(l, kFcb), a.dfch, a.ln2 + l * btc,
                        p + off(l, kFcw), BT, C, 4 * C, 4 * C, acc);
    cpu::LayerNormBackward(a.dres, g + off(l, kLn2w), g + off(l, kLn2b), a.dbtc,
                           a.residual2 + l * btc, p + off(l, kLn2w), a.ln2_mean + l * BT,
                           a.ln2_rstd + l * BT, BT, C, acc);
    cpu::MatmulBackward(a.dbtc, g + off(l, kAttprojw), g + off(l, kAttprojb), a.dres,
                        a.atty + l * btc, p + off(l, kAttprojw), BT, C, C, C, acc);
    cpu::AttentionBackward(a.dqkv, a.dbtc, a.att + static_cast<size_t>(l) * B * NH * T * T,
                           a.qkv + l * 3 * btc, B, T, C, NH);
    cpu::MatmulBackward(a.dbtc, g + off(l, kQkvw), g + off(l, kQkvb), a.dqkv, a.ln1 + l * btc,
                        p + off(l, kQkvw), BT, C, 3 * C, 3 * C, acc);
    cpu::LayerNormBackward(a.dres, g + off(l, kLn1w), g + off(l, kLn1b), a.dbtc, x,
                           p + off(l, kLn1w), a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C, acc);
  }
  cpu::EncoderBackward(g + wte, g + wpe, a.dres, a.inputs.data(), B, T, C);
}

std::vector<float> Gpt::NextTokenLogits(const int32_t* tokens, int n) {
  DROVER_CHECK(n >= 1);
  const int len = std::min(n, config_.max_seq_len);
  Forward(tokens + (n - len), nullptr, 1, len);
  const float* row = logits() + static_cast<size_t>(len - 1) * config_.padded_vocab_size;
  return std::vector<float>(row, row + config_.vocab_size);
}

}  // namespace drover::engine
