#include "worker/engine/model/hf_gpt2.h"

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>

namespace drover::engine {
namespace {

// A tensor copied out of the arena as it is; `rows` limits the leading dimension (wte's
// padded rows are not part of the HF model).
SafetensorsTensor Copy(const Gpt& m, const std::string& from, std::string to, int64_t rows = -1) {
  const TensorInfo* t = m.FindTensor(from);
  DROVER_CHECK(t != nullptr);
  std::vector<int64_t> shape = t->shape;
  if (rows >= 0) shape[0] = rows;
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  const float* src = m.params() + t->offset;
  return SafetensorsTensor{std::move(to), std::move(shape), std::vector<float>(src, src + numel)};
}

// A (out, in) weight written as (in, out).
SafetensorsTensor Transposed(const Gpt& m, const std::string& from, std::string to) {
  const TensorInfo* t = m.FindTensor(from);
  DROVER_CHECK(t != nullptr && t->shape.size() == 2);
  const size_t out = static_cast<size_t>(t->shape[0]), in = static_cast<size_t>(t->shape[1]);
  const float* src = m.params() + t->offset;
  std::vector<float> dst(out * in);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) dst[i * out + o] = src[o * in + i];
  }
  return SafetensorsTensor{std::move(to), {t->shape[1], t->shape[0]}, std::move(dst)};
}

}  // namespace

std::vector<HfGpt2Name> HfGpt2Names(int num_layers) {
  std::vector<HfGpt2Name> out = {{"wte", "wte.weight"}, {"wpe", "wpe.weight"}};
  for (int l = 0; l < num_layers; ++l) {
    const std::string d = "h." + std::to_string(l) + ".";  // drover's prefix and HF's agree
    out.push_back({d + "ln1w", d + "ln_1.weight"});
    out.push_back({d + "ln1b", d + "ln_1.bias"});
    out.push_back({d + "qkvw", d + "attn.c_attn.weight", true});
    out.push_back({d + "qkvb", d + "attn.c_attn.bias"});
    out.push_back({d + "attprojw", d + "attn.c_proj.weight", true});
    out.push_back({d + "attprojb", d + "attn.c_proj.bias"});
    out.push_back({d + "ln2w", d + "ln_2.weight"});
    out.push_back({d + "ln2b", d + "ln_2.bias"});
    out.push_back({d + "fcw", d + "mlp.c_fc.weight", true});
    out.push_back({d + "fcb", d + "mlp.c_fc.bias"});
    out.push_back({d + "fcprojw", d + "mlp.c_proj.weight", true});
    out.push_back({d + "fcprojb", d + "mlp.c_proj.bias"});
  }
  out.push_back({"lnfw", "ln_f.weight"});
  out.push_back({"lnfb", "ln_f.bias"});
  return out;
}

std::vector<SafetensorsTensor> HfGpt2Tensors(const Gpt& m) {
  std::vector<SafetensorsTensor> out;
  for (const HfGpt2Name& n : HfGpt2Names(m.config().num_layers)) {
    if (n.transposed) {
      out.push_back(Transposed(m, n.drover, n.hf));
    } else {
      out.push_back(Copy(m, n.drover, n.hf, n.drover == "wte" ? m.config().vocab_size : -1));
    }
  }
  return out;
}

std::map<std::string, std::string> HfGpt2Metadata(const GptConfig& c) {
  return {{"format", "pt"},
          {"producer", "drover"},
          {"model_type", "gpt2"},
          {"n_layer", std::to_string(c.num_layers)},
          {"n_head", std::to_string(c.num_heads)},
          {"n_embd", std::to_string(c.channels)},
          {"n_positions", std::to_string(c.max_seq_len)},
          {"vocab_size", std::to_string(c.vocab_size)}};
}

std::string HfGpt2ConfigJson(const GptConfig& c, const std::string& torch_dtype) {
  constexpr int kGpt2Vocab = 50257;
  nlohmann::ordered_json j = {{"architectures", {"GPT2LMHeadModel"}},
                              {"model_type", "gpt2"},
                              {"activation_function", "gelu_new"},
                              {"n_layer", c.num_layers},
                              {"n_head", c.num_heads},
                              {"n_embd", c.channels},
                              {"n_positions", c.max_seq_len},
                              {"n_ctx", c.max_seq_len},
                              {"n_inner", nullptr},
                              {"vocab_size", c.vocab_size},
                              {"layer_norm_epsilon", 1e-5},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"attn_pdrop", 0.0},
                              {"scale_attn_weights", true},
                              {"scale_attn_by_inverse_layer_idx", false},
                              {"tie_word_embeddings", true},
                              {"torch_dtype", torch_dtype}};
  if (c.vocab_size == kGpt2Vocab) {
    j["bos_token_id"] = kGpt2Vocab - 1;
    j["eos_token_id"] = kGpt2Vocab - 1;
  }
  return j.dump(2) + "\n";
}

}  // namespace drover::engine
