// GptLayout: which parameters one rank holds and where, as a value (no memory).
//
// The GLOBAL tensor table (GptTensorTable) is the model as one process holds it:
//   wte (Vp, C), wpe (maxT, C),
//   for l in 0..L-1: ln1w (C), ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C),
//                    attprojb (C), ln2w (C), ln2b (C), fcw (4C, C), fcb (4C),
//                    fcprojw (C, 4C), fcprojb (C),
//   lnfw (C), lnfb (C),
// layer-major, so that one layer is one contiguous range. Tensor names are "wte", "wpe",
// "h.<l>.<name>" and "lnfw"/"lnfb"; checkpoints and llm.c model files are in this order.
// The LM head is tied to wte; padded rows V..Vp-1 of wte stay zero.
//
// A LOCAL layout is what one rank of a parallel job holds: the layers of its pipeline
// stage (contiguous ranges of layers: L / pp each, or parallel.pp_layers; under the
// interleaved schedule, v chunks of them, chunk c being virtual stage c * pp + stage of
// pp * v), each tensor cut to its tensor-parallel part:
//   - column-parallel (qkvw, qkvb, fcw, fcb): output rows; for qkv, heads [h0, h1) of each
//     of q, k and v, so the local qkv is again "q | k | v" for NH / tp heads;
//   - row-parallel (attprojw, fcprojw): input columns of the same heads / MLP units;
//   - vocabulary-parallel (wte): rows [r * Vp / tp, (r + 1) * Vp / tp) on tp rank r, as
//     Megatron splits the embedding and the LM head: each rank computes the logits of its
//     vocabulary slice only (the head's GEMMs and the logits' memory shrink by tp), the
//     embedding sums the ranks' rows, and the loss combines the slices' log-sum-exps
//     (GptStage). When tp does not divide Vp, the slices are whole 128-row units of it, the
//     first Vp / 128 % tp ranks one unit more (vocab_begin, local_vocab); only when Vp has
//     fewer such units than tp ranks is wte replicated;
//   - replicated: wpe, LayerNorms and the row-parallel GEMMs' biases (added once).
// The local arena is ordered in UNITS, the tensors used together:
//   first stage: [wte, wpe] embedding unit, then its layers, then [lnfw, lnfb] if also last;
//   later stages: their layers; the last of several stages starts with its own copy of wte
//   (the head unit: Megatron keeps the tied embedding on both ends and sums its gradient
//   between them) and ends with [lnfw, lnfb]. The layers of several chunks follow each
//   other in chunk order: the embedding is chunk 0's of the first stage, the head and the
//   final norm the last chunk's of the last stage.
// With one stage and tp = 1 the local arena IS the global arena (Whole()).
//
// Units are the granularity of ZeRO-3 gathering and of gradient readiness (data-parallel
// buckets); contiguous in the arena, so both are ranges of it.
//
// Thread-safety: an immutable value.
#pragma once

#include <cstddef>
#include <cstdint>
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

// "L=12 NH=12 C=768 maxT=1024 V=50257", for messages that compare two models.
std::string DescribeConfig(const GptConfig& c);

// An entry of the global tensor table.
struct TensorInfo {
  std::string name;
  size_t offset = 0;  // in floats, into the global parameter (and gradient) arena
  size_t numel = 0;
  std::vector<int64_t> shape;
  bool decay = false;  // weight decay applies: matrices and embeddings, not biases/LayerNorm
};

// The global tensor table for `config`, in arena order (see above).
std::vector<TensorInfo> GptTensorTable(const GptConfig& config);

// Total number of floats in the global parameter arena.
size_t GptNumParams(const GptConfig& config);
// The same in closed form and 128-bit arithmetic: O(1), and exact for any config whose sizes
// are below 2^31 (as a file's int32 fields are), where GptNumParams walks a table of every
// layer and its size_t may overflow. For sizes read from a file, before anything is built.
unsigned __int128 GptNumParamsWide(const GptConfig& config);

// How tensor parallelism divides a tensor among the tp ranks.
// kVocab: rows [vocab_begin, vocab_begin + local_vocab) of wte, which need not be Vp / tp.
enum class TpSplit { kReplicated, kColumn, kRow, kVocab };

// A tensor as one rank holds it.
struct LocalTensor {
  int global = 0;     // index into the global table
  size_t offset = 0;  // floats, into the local arena
  size_t numel = 0;
  std::vector<int64_t> shape;  // local shape
  bool decay = false;
  TpSplit split = TpSplit::kReplicated;
  int parts = 1;  // column split: independent row blocks (3 for qkv: q, k, v)
  // Whether this copy counts in global sums (gradient norm, assembling the global model):
  // false for replicated tensors on tp ranks > 0 and for the head's copy of wte.
  bool primary = true;
};

enum class UnitKind { kEmbedding, kLayer, kFinalNorm, kHead };

struct Unit {
  UnitKind kind = UnitKind::kLayer;
  int layer = -1;     // kLayer: the global layer index
  size_t offset = 0;  // floats, into the local arena
  size_t numel = 0;
};

// Elements begin + i * stride + [0, length) for i in [0, count).
struct StridedRun {
  size_t begin = 0, length = 0, stride = 0, count = 0;
  size_t size() const { return length * count; }
};

// Offsets of one layer's tensors from the start of its unit (equal for every layer).
struct LayerOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};

class GptLayout {
 public:
  // Pipeline stage `stage` of `stages`, holding `chunks` model chunks (the interleaved
  // schedule's; 1 otherwise), on tensor-parallel rank `tp_rank` of `tp_size`; the virtual
  // stages' layer counts are pp_layers (parallel.pp_layers, stages * chunks entries), or
  // L / (stages * chunks) each when it is empty. InvalidArgument (naming the factor) when
  // the config is invalid, the layers do not split so (StageLayers), NH is not divisible
  // by tp_size, or a rank index is out of range.
  static StatusOr<GptLayout> Create(const GptConfig& config, int stage, int stages, int tp_rank,
                                    int tp_size, const std::vector<int>& pp_layers = {},
                                    int chunks = 1);
  // The whole model on one rank; the local arena is the global one. CHECKs config.Validate().
  static GptLayout Whole(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  // The stage's model chunks, and the global layers [first, end) of each.
  int chunks() const { return static_cast<int>(chunk_layers_.size()); }
  int chunk_first_layer(int chunk) const { return chunk_layers_.at(chunk).first; }
  int chunk_end_layer(int chunk) const { return chunk_layers_.at(chunk).second; }
  // Whether chunk `chunk` embeds the tokens (the first stage's chunk 0) or computes the head
  // and the loss (the last stage's last chunk).
  bool embeds(int chunk) const { return first_stage() && chunk == 0; }
  bool heads(int chunk) const { return last_stage() && chunk == chunks() - 1; }

  // Per-rank widths under tensor parallelism: attention channels C / tp in NH / tp heads,
  // MLP hidden 4C / tp.
  int attn_channels() const { return config_.channels / tp_size_; }
  int local_heads() const { return config_.num_heads / tp_size_; }
  int mlp_channels() const { return 4 * config_.channels / tp_size_; }
  // Whether wte (and so the LM head's logits) is split by vocabulary over the tp ranks, the
  // rows of it this rank holds, [vocab_begin, vocab_begin + local_vocab) of the global Vp,
  // and how many of those are live (below V; 0 for a rank holding only padding).
  bool vocab_split() const { return vocab_split_; }
  int vocab_begin() const { return vocab_begin_; }
  int local_vocab() const { return local_vocab_; }
  int live_vocab() const;

  size_t num_params() const { return num_params_; }  // floats in the local arena
  const std::vector<LocalTensor>& tensors() const { return tensors_; }
  const std::vector<TensorInfo>& global_tensors() const { return global_; }
  size_t global_num_params() const;
  const std::vector<Unit>& units() const { return units_; }

  // Unit indices, -1 where the stage has none. head_unit() is where the LM head reads wte:
  // the embedding unit on a single stage, the head copy on the last of several.
  int embedding_unit() const { return embedding_unit_; }
  int head_unit() const { return head_unit_; }
  int final_norm_unit() const { return final_norm_unit_; }
  int layer_unit(int layer) const;  // CHECKs that the stage holds global layer `layer`
  const LayerOffsets& layer_offsets() const { return layer_offsets_; }
  // Inside the embedding unit wte is at 0 and wpe at local_vocab * C; inside the head unit wte is
  // at 0; inside the final-norm unit lnfw is at 0 and lnfb at C.
  size_t wpe_offset() const;

  // The local tensor of global name `name`, or nullptr when this rank holds none.
  const LocalTensor* Find(std::string_view name) const;
  // Its global name.
  const std::string& NameOf(const LocalTensor& t) const { return global_[t.global].name; }
  // [begin, end) of global layer l's parameters in the local arena.
  std::pair<size_t, size_t> LayerRange(int l) const;

  // Copies this rank's part of a global arena into a local arena (num_params() floats).
  void GlobalToLocal(const float* global, float* local) const;
  // Writes the local arena's tensors into their places in a global arena. With
  // primary_only, tensors whose `primary` is false are skipped.
  void LocalToGlobal(const float* local, float* global, bool primary_only) const;

  // Where local elements [lo, hi) of the primary tensors lie in the global arena, as strided
  // runs in local order (each run's elements follow the previous run's in the local arena,
  // skipping only non-primary tensors), and the local [begin, end) pieces they come from.
  // Every global element is covered by exactly one (pp, tp) rank's primary tensors, so the
  // runs of a partition of every rank's arena tile the global arena.
  std::vector<StridedRun> GlobalRunsOf(size_t lo, size_t hi,
                                       std::vector<std::pair<size_t, size_t>>* pieces) const;

  // Calls fn(global_offset, local_offset, count) for each contiguous run of `t`, in local
  // order: the strided mapping that GlobalToLocal and LocalToGlobal use.
  template <typename Fn>
  void ForEachRun(const LocalTensor& t, Fn&& fn) const;
  // The same for local elements [lo, hi) of every tensor, primary or not, tensor by tensor:
  // where GlobalToLocal fills them from.
  template <typename Fn>
  void ForEachRunIn(size_t lo, size_t hi, Fn&& fn) const;

 private:
  GptLayout() = default;
  void Build();

  GptConfig config_;
  int stage_ = 0, stages_ = 1, tp_rank_ = 0, tp_size_ = 1;
  bool vocab_split_ = false;
  int vocab_begin_ = 0, local_vocab_ = 0;
  std::vector<std::pair<int, int>> chunk_layers_;  // [first, end) of each chunk
  std::vector<int> layer_units_;                   // per global layer; -1 where not held
  std::vector<TensorInfo> global_;
  std::vector<LocalTensor> tensors_;
  std::vector<Unit> units_;
  size_t num_params_ = 0;
  int embedding_unit_ = -1, head_unit_ = -1, final_norm_unit_ = -1;
  LayerOffsets layer_offsets_{};
};

template <typename Fn>
void GptLayout::ForEachRun(const LocalTensor& t, Fn&& fn) const {
  const TensorInfo& g = global_[t.global];
  const size_t rank = static_cast<size_t>(tp_rank_), tp = static_cast<size_t>(tp_size_);
  switch (t.split) {
    case TpSplit::kReplicated:
      fn(g.offset, t.offset, t.numel);
      return;
    case TpSplit::kColumn: {
      // Rows of each of `parts` blocks: block q holds global rows [q * R, (q + 1) * R).
      const size_t cols = g.shape.size() > 1 ? static_cast<size_t>(g.shape[1]) : 1;
      const size_t rows = static_cast<size_t>(g.shape[0]) / t.parts;
      const size_t local_rows = rows / tp;
      for (int q = 0; q < t.parts; ++q) {
        fn(g.offset + (q * rows + rank * local_rows) * cols, t.offset + q * local_rows * cols,
           local_rows * cols);
      }
      return;
    }
    case TpSplit::kVocab: {
      const size_t cols = static_cast<size_t>(g.shape[1]);
      fn(g.offset + static_cast<size_t>(vocab_begin_) * cols, t.offset, t.numel);
      return;
    }
    case TpSplit::kRow: {
      const size_t rows = static_cast<size_t>(g.shape[0]);
      const size_t cols = static_cast<size_t>(g.shape[1]);
      const size_t local_cols = cols / tp;
      for (size_t r = 0; r < rows; ++r) {
        fn(g.offset + r * cols + rank * local_cols, t.offset + r * local_cols, local_cols);
      }
      return;
    }
  }
}

template <typename Fn>
void GptLayout::ForEachRunIn(size_t lo, size_t hi, Fn&& fn) const {
  for (const LocalTensor& t : tensors_) {
    if (t.offset >= hi || t.offset + t.numel <= lo) continue;
    ForEachRun(t, [&](size_t g, size_t l, size_t n) {
      const size_t b = l > lo ? l : lo, e = l + n < hi ? l + n : hi;
      if (b < e) fn(g + (b - l), b, e - b);
    });
  }
}

}  // namespace drover::engine
