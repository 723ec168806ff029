// The GPT-2 model on CPU: one flat parameter arena, one gradient arena, one activation
// arena, and Forward/Backward built from the XForward/XBackward ops in kernels/cpu/.
//
// Dimension names, fixed everywhere: B batch, T sequence length, C channels, NH heads,
// HS = C / NH head size, L layers, V vocabulary, Vp vocabulary padded to a multiple of 128.
//
// Parameter arena layout (layer-major, so one layer is one contiguous range, which ZeRO-3
// and pipeline stages rely on):
//   wte (Vp, C), wpe (maxT, C),
//   for l in 0..L-1: ln1w (C), ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C),
//                    attprojb (C), ln2w (C), ln2b (C), fcw (4C, C), fcb (4C),
//                    fcprojw (C, 4C), fcprojb (C),
//   lnfw (C), lnfb (C).
// Tensor names are "wte", "wpe", "h.<l>.<name>" (e.g. "h.3.qkvw"), "lnfw", "lnfb".
// The LM head is tied to wte. Padded rows V..Vp-1 of wte are zero after InitRandom and
// their logits are never selected by the loss (their gradient is always zero).
//
// Thread-safety: a Gpt is used by one thread at a time; the kernels inside parallelise
// with OpenMP / OpenBLAS using the count set by engine::SetNumThreads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"

namespace drover::engine {

struct GptConfig {
  int max_seq_len = 0;        // maxT: rows of wpe
  int vocab_size = 0;         // V
  int padded_vocab_size = 0;  // Vp: V rounded up to a multiple of 128
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C

  // n_layer, n_head, n_embd, block_size, vocab_size; Vp = RoundUp(vocab_size, 128).
  static GptConfig FromSpec(const ModelSpec& spec);
  // All sizes positive, C divisible by NH, Vp >= V. Errors name the field.
  Status Validate() const;

  friend bool operator==(const GptConfig&, const GptConfig&) = default;
};

// V rounded up to a multiple of 128.
int PaddedVocabSize(int vocab_size);

struct TensorInfo {
  std::string name;
  size_t offset = 0;  // in floats, into the parameter (and gradient) arena
  size_t numel = 0;
  std::vector<int64_t> shape;
  bool decay = false;  // weight decay applies: matrices and embeddings, not biases/LayerNorm
};

// The tensor table for `config`, in arena order (see the layout above). Usable without
// building a model (checkpoint manifests, ZeRO shard planning).
std::vector<TensorInfo> GptTensorTable(const GptConfig& config);

// Total number of floats in the parameter arena.
size_t GptNumParams(const GptConfig& config);

class Gpt {
 public:
  // Allocates the parameter and gradient arenas (zero-filled). CHECKs config.Validate().
  explicit Gpt(const GptConfig& config);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return config_; }
  size_t num_params() const { return num_params_; }
  float* params() { return params_.get(); }
  const float* params() const { return params_.get(); }
  // The gradient arena. After ZeroGrad, the first call materialises the zeros (see there).
  float* grads();
  const float* grads() const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The entry named `name`, or nullptr.
  const TensorInfo* FindTensor(std::string_view name) const;
  // [begin, end) float offsets of layer l's parameters (ln1w .. fcprojb) in the arenas.
  std::pair<size_t, size_t> LayerRange(int l) const;

  // GPT-2 init, deterministic from `seed`: weights ~ N(0, 0.02), attprojw and fcprojw
  // ~ N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm weights 1, padded wte rows 0. Normals
  // come from SplitMix64 streams, one per (tensor, block of 65536 entries) keyed by the
  // seed, through Box-Muller in double, so the result does not depend on the thread count.
  void InitRandom(uint64_t seed);

  // Runs the model on inputs (B, T) of token ids in [0, V). With targets (B, T), returns
  // the mean cross-entropy over B*T positions and prepares Backward (inputs and targets
  // are copied; the caller may reuse its buffers); with targets == nullptr returns 0 and
  // Backward may not follow. Requires 1 <= T <= maxT. Activation
  // memory is allocated at the first call and grown when a later (B, T) needs more.
  // Token ids out of range are a broken invariant (CHECK): validate data at its source.
  float Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // Logits (B, T, Vp) of the last Forward; columns >= V are meaningless (padding). Valid
  // until Backward, which reuses the buffer for the logits' gradient.
  const float* logits() const;

  // Zeroes the gradients lazily: the next Backward overwrites them instead of adding, which
  // saves a pass over the whole arena and the re-read of it inside every weight GEMM.
  // grads() called before that Backward writes the zeros for real, so readers through
  // grads() always see zeros; a pointer kept from before ZeroGrad and read before the next
  // Backward does not (read the gradients after Backward, as every optimizer does).
  void ZeroGrad();

  // Accumulates d(grad_scale * loss)/d(params) of the last Forward into grads(), so
  // gradient accumulation over k micro-batches is k x (Forward, Backward(1/k)).
  // CHECKs that a Forward with targets came right before.
  void Backward(float grad_scale = 1.0f);

  // Logits (V values, padding dropped) for the token that follows `tokens[0..n)`. Uses
  // the last min(n, maxT) tokens. For sampling; n >= 1.
  std::vector<float> NextTokenLogits(const int32_t* tokens, int n);

 private:
  struct Activations;
  void EnsureActivations(int B, int T);

  GptConfig config_;
  std::vector<TensorInfo> tensors_;
  size_t num_params_ = 0;
  std::unique_ptr<float[]> params_;
  std::unique_ptr<float[]> grads_;
  std::unique_ptr<Activations> acts_;
  int last_B_ = 0;  // (B, T) of the last Forward
  int last_T_ = 0;
  bool backward_ready_ = false;
  mutable bool zero_grad_pending_ = false;  // set by ZeroGrad, cleared by Backward/grads()
};

}  // namespace drover::engine
