#include "worker/engine/model/gpt_layout.h"

#include <algorithm>

#include "common/parallel_mesh.h"

namespace drover::engine {
namespace {

// Per-layer tensors in arena order: ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb
// fcprojw fcprojb (GptTensorTable names them).
constexpr int kLayerTensors = 12;
// Global table index of layer 0's first tensor (after wte, wpe).
constexpr int kFirstLayerTensor = 2;
// The rows of wte a vocabulary split that tp does not divide evenly hands out at a time: the
// padding's multiple, so that every slice keeps the LM head's GEMMs aligned.
constexpr int kVocabUnit = 128;

// Megatron's split of each layer tensor (see the header), and the column split's blocks.
struct SplitRule {
  TpSplit split;
  int parts;
};
constexpr SplitRule kLayerSplit[kLayerTensors] = {
    {TpSplit::kReplicated, 1}, {TpSplit::kReplicated, 1},  // ln1w, ln1b
    {TpSplit::kColumn, 3},     {TpSplit::kColumn, 3},      // qkvw, qkvb: q | k | v
    {TpSplit::kRow, 1},        {TpSplit::kReplicated, 1},  // attprojw, attprojb
    {TpSplit::kReplicated, 1}, {TpSplit::kReplicated, 1},  // ln2w, ln2b
    {TpSplit::kColumn, 1},     {TpSplit::kColumn, 1},      // fcw, fcb
    {TpSplit::kRow, 1},        {TpSplit::kReplicated, 1},  // fcprojw, fcprojb
};

std::string Num(int v) { return std::to_string(v); }

}  // namespace

std::string DescribeConfig(const GptConfig& c) {
  return "L=" + std::to_string(c.num_layers) + " NH=" + std::to_string(c.num_heads) +
         " C=" + std::to_string(c.channels) + " maxT=" + std::to_string(c.max_seq_len) +
         " V=" + std::to_string(c.vocab_size);
}

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

unsigned __int128 GptNumParamsWide(const GptConfig& c) {
  using U = unsigned __int128;
  const U C = static_cast<U>(c.channels);
  const U per_layer = 12 * C * C + 13 * C;  // ln1, qkv, attproj, ln2, fc, fcproj
  return static_cast<U>(c.padded_vocab_size) * C + static_cast<U>(c.max_seq_len) * C +
         static_cast<U>(c.num_layers) * per_layer + 2 * C;
}

StatusOr<GptLayout> GptLayout::Create(const GptConfig& config, int stage, int stages, int tp_rank,
                                      int tp_size, const std::vector<int>& pp_layers, int chunks) {
  RETURN_IF_ERROR(config.Validate());
  if (stages < 1 || stage < 0 || stage >= stages) {
    return InvalidArgumentError("pipeline stage " + Num(stage) + " of " + Num(stages) +
                                " is out of range");
  }
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return InvalidArgumentError("tensor-parallel rank " + Num(tp_rank) + " of " + Num(tp_size) +
                                " is out of range");
  }
  if (chunks < 1) {
    return InvalidArgumentError("pipeline chunks per stage " + Num(chunks) + " must be at least 1");
  }
  // Virtual stage c * stages + stage is this stage's chunk c (parallel/pipeline.h).
  ASSIGN_OR_RETURN(const std::vector<int> layers,
                   StageLayers(config.num_layers, stages, pp_layers, chunks));
  if (config.num_heads % tp_size != 0) {
    return InvalidArgumentError("model.n_head (" + Num(config.num_heads) +
                                ") is not divisible by tp (" + Num(tp_size) + ")");
  }
  GptLayout layout;
  layout.config_ = config;
  layout.stage_ = stage;
  layout.stages_ = stages;
  layout.tp_rank_ = tp_rank;
  layout.tp_size_ = tp_size;
  for (int c = 0; c < chunks; ++c) {
    const int v = c * stages + stage;
    int first = 0;
    for (int u = 0; u < v; ++u) first += layers[u];
    layout.chunk_layers_.emplace_back(first, first + layers[v]);
  }
  layout.Build();
  return layout;
}

GptLayout GptLayout::Whole(const GptConfig& config) {
  auto layout = Create(config, 0, 1, 0, 1);
  DROVER_CHECK_OK(layout.status());
  return std::move(layout).value();
}

void GptLayout::Build() {
  global_ = GptTensorTable(config_);
  const size_t tp = static_cast<size_t>(tp_size_);
  const int Vp = config_.padded_vocab_size;
  if (tp_size_ > 1 && Vp % tp_size_ == 0) {
    vocab_split_ = true;
    local_vocab_ = Vp / tp_size_;
    vocab_begin_ = tp_rank_ * local_vocab_;
  } else if (tp_size_ > 1 && Vp % kVocabUnit == 0 && Vp / kVocabUnit >= tp_size_) {
    // Whole units of rows, the first ranks one more: GPT-2's 50304 over tp 5 is 10112 rows
    // on ranks 0-2 and 9984 on ranks 3-4, each slice's rows still a multiple of 128.
    const int units = Vp / kVocabUnit, base = units / tp_size_, extra = units % tp_size_;
    vocab_split_ = true;
    local_vocab_ = (base + (tp_rank_ < extra ? 1 : 0)) * kVocabUnit;
    vocab_begin_ = (tp_rank_ * base + std::min(tp_rank_, extra)) * kVocabUnit;
  } else {
    vocab_split_ = false;
    local_vocab_ = Vp;
    vocab_begin_ = 0;
  }
  const TpSplit wte_split = vocab_split_ ? TpSplit::kVocab : TpSplit::kReplicated;

  size_t offset = 0;
  auto add_tensor = [&](int global, TpSplit split, int parts, bool primary) {
    const TensorInfo& g = global_[global];
    LocalTensor t;
    t.global = global;
    t.offset = offset;
    t.shape = g.shape;
    t.decay = g.decay;
    t.split = split;
    t.parts = parts;
    if (split == TpSplit::kColumn) t.shape[0] /= static_cast<int64_t>(tp);
    if (split == TpSplit::kRow) t.shape[1] /= static_cast<int64_t>(tp);
    if (split == TpSplit::kVocab) t.shape[0] = local_vocab_;
    t.numel = split == TpSplit::kReplicated ? g.numel
              : split == TpSplit::kVocab    ? static_cast<size_t>(local_vocab_) * g.shape[1]
                                            : g.numel / tp;
    // A replicated tensor is counted once, on tp rank 0.
    t.primary = primary && (split != TpSplit::kReplicated || tp_rank_ == 0);
    tensors_.push_back(t);
    offset += t.numel;
  };
  auto begin_unit = [&](UnitKind kind, int layer) {
    units_.push_back(Unit{kind, layer, offset, 0});
    return static_cast<int>(units_.size()) - 1;
  };
  auto end_unit = [&](int unit) { units_[unit].numel = offset - units_[unit].offset; };

  const int wte = 0, wpe = 1;
  const int lnf = kFirstLayerTensor + config_.num_layers * kLayerTensors;
  if (first_stage()) {
    embedding_unit_ = begin_unit(UnitKind::kEmbedding, -1);
    add_tensor(wte, wte_split, 1, true);
    add_tensor(wpe, TpSplit::kReplicated, 1, true);
    end_unit(embedding_unit_);
    head_unit_ = last_stage() ? embedding_unit_ : -1;
  } else if (last_stage()) {
    head_unit_ = begin_unit(UnitKind::kHead, -1);
    add_tensor(wte, wte_split, 1, /*primary=*/false);  // the first stage's counts
    end_unit(head_unit_);
  }
  layer_units_.assign(config_.num_layers, -1);
  for (const auto& [first, end] : chunk_layers_) {
    for (int l = first; l < end; ++l) {
      const int u = begin_unit(UnitKind::kLayer, l);
      layer_units_[l] = u;
      for (int k = 0; k < kLayerTensors; ++k) {
        add_tensor(kFirstLayerTensor + l * kLayerTensors + k, kLayerSplit[k].split,
                   kLayerSplit[k].parts, true);
      }
      end_unit(u);
    }
  }
  if (last_stage()) {
    final_norm_unit_ = begin_unit(UnitKind::kFinalNorm, -1);
    add_tensor(lnf, TpSplit::kReplicated, 1, true);
    add_tensor(lnf + 1, TpSplit::kReplicated, 1, true);
    end_unit(final_norm_unit_);
  }
  num_params_ = offset;

  // Every layer has the same local shapes; read the offsets off the first one.
  if (const int first_unit = layer_units_[chunk_layers_[0].first]; first_unit >= 0) {
    const size_t base = units_[first_unit].offset;
    size_t rel[kLayerTensors];
    size_t i = 0;
    while (tensors_[i].offset < base) ++i;
    for (int k = 0; k < kLayerTensors; ++k) rel[k] = tensors_[i + k].offset - base;
    layer_offsets_ = LayerOffsets{rel[0], rel[1], rel[2], rel[3], rel[4],  rel[5],
                                  rel[6], rel[7], rel[8], rel[9], rel[10], rel[11]};
  }
}

size_t GptLayout::global_num_params() const { return global_.back().offset + global_.back().numel; }

int GptLayout::layer_unit(int layer) const {
  DROVER_CHECK(layer >= 0 && layer < config_.num_layers && layer_units_[layer] >= 0);
  return layer_units_[layer];
}

size_t GptLayout::wpe_offset() const {
  return static_cast<size_t>(local_vocab_) * config_.channels;
}

int GptLayout::live_vocab() const {
  return std::clamp(config_.vocab_size - vocab_begin_, 0, local_vocab_);
}

const LocalTensor* GptLayout::Find(std::string_view name) const {
  for (const LocalTensor& t : tensors_) {
    if (global_[t.global].name == name) return &t;
  }
  return nullptr;
}

std::pair<size_t, size_t> GptLayout::LayerRange(int l) const {
  const Unit& u = units_[layer_unit(l)];
  return {u.offset, u.offset + u.numel};
}

void GptLayout::GlobalToLocal(const float* global, float* local) const {
  for (const LocalTensor& t : tensors_) {
    ForEachRun(
        t, [&](size_t g, size_t l, size_t n) { std::copy(global + g, global + g + n, local + l); });
  }
}

void GptLayout::LocalToGlobal(const float* local, float* global, bool primary_only) const {
  for (const LocalTensor& t : tensors_) {
    if (primary_only && !t.primary) continue;
    ForEachRun(
        t, [&](size_t g, size_t l, size_t n) { std::copy(local + l, local + l + n, global + g); });
  }
}

std::vector<StridedRun> GptLayout::GlobalRunsOf(
    size_t lo, size_t hi, std::vector<std::pair<size_t, size_t>>* pieces) const {
  std::vector<StridedRun> runs;
  pieces->clear();
  for (const LocalTensor& t : tensors_) {
    if (!t.primary || t.offset >= hi || t.offset + t.numel <= lo) continue;
    ForEachRun(t, [&](size_t g, size_t l, size_t n) {
      const size_t b = std::max(l, lo), e = std::min(l + n, hi);
      if (b >= e) return;
      g += b - l;
      const size_t len = e - b;
      // Extend the last run when this one continues its pattern in both arenas.
      if (!runs.empty() && pieces->back().second == b) {
        StridedRun& r = runs.back();
        const size_t next = r.begin + r.count * r.stride;
        if (r.length == len && (r.count == 1 ? g >= r.begin + r.length : g == next)) {
          if (r.count == 1) r.stride = g - r.begin;
          ++r.count;
          pieces->back().second = e;
          return;
        }
      }
      if (!pieces->empty() && pieces->back().second == b) {
        pieces->back().second = e;
      } else {
        pieces->emplace_back(b, e);
      }
      runs.push_back({g, len, len, 1});
    });
  }
  return runs;
}

}  // namespace drover::engine
