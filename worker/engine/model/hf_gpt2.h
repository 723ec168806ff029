// drover's GPT-2 parameters under Hugging Face transformers' GPT2Model names and shapes, so
// that `GPT2LMHeadModel.from_pretrained` (or a plain safetensors reader) takes a drover model,
// and drover takes a GPT-2 from the Hugging Face Hub or `save_pretrained` (to fine-tune it,
// sample from it or evaluate it).
//
// The mapping, per layer i (drover name -> HF name, HF shape):
//   wte (Vp, C)            -> wte.weight (V, C)         padded rows V..Vp-1 dropped
//   wpe (maxT, C)          -> wpe.weight (maxT, C)
//   h.i.ln1w / ln1b (C)    -> h.i.ln_1.weight / bias
//   h.i.qkvw (3C, C)       -> h.i.attn.c_attn.weight (C, 3C)   transposed
//   h.i.qkvb (3C)          -> h.i.attn.c_attn.bias (3C)
//   h.i.attprojw (C, C)    -> h.i.attn.c_proj.weight (C, C)    transposed
//   h.i.attprojb (C)       -> h.i.attn.c_proj.bias
//   h.i.ln2w / ln2b (C)    -> h.i.ln_2.weight / bias
//   h.i.fcw (4C, C)        -> h.i.mlp.c_fc.weight (C, 4C)      transposed
//   h.i.fcb (4C)           -> h.i.mlp.c_fc.bias (4C)
//   h.i.fcprojw (C, 4C)    -> h.i.mlp.c_proj.weight (4C, C)    transposed
//   h.i.fcprojb (C)        -> h.i.mlp.c_proj.bias
//   lnfw / lnfb (C)        -> ln_f.weight / bias
// The transposes: drover (like llm.c) stores a matmul weight as (out, in), a Linear's
// layout; GPT-2's Conv1D stores (in, out) and computes x @ W. The q | k | v blocks of the
// fused attention projection and the head order inside each block are the same in both, and
// both use tanh-approximated GELU and LayerNorm eps 1e-5, so no other reordering is needed.
// The LM head is tied to wte in both; HF has no separate tensor for it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/model/gpt.h"
#include "worker/engine/model/safetensors.h"

namespace drover::engine {

// One row of the mapping above: drover's tensor name, HF's (without a module prefix), and
// whether HF stores the matrix transposed.
struct HfGpt2Name {
  std::string drover;
  std::string hf;
  bool transposed = false;
};

// The whole mapping for `num_layers` layers, in HF's state-dict order.
std::vector<HfGpt2Name> HfGpt2Names(int num_layers);

// The model's parameters as HF GPT-2 tensors, in HF's state-dict order (wte, wpe, h.0 ...
// h.L-1, ln_f). Copies: the model is left as it is.
std::vector<SafetensorsTensor> HfGpt2Tensors(const Gpt& model);

// Metadata that transformers expects ("format": "pt") and the model's shape under the keys
// of GPT2Config (n_layer, n_head, n_embd, n_positions, vocab_size).
std::map<std::string, std::string> HfGpt2Metadata(const GptConfig& config);

// A transformers GPT2Config (`config.json`) for `config`, so that
// `GPT2LMHeadModel.from_pretrained(dir)` takes a directory holding it beside the tensors: the
// sizes, and what drover's model computes (tanh GELU, LayerNorm eps 1e-5, tied embeddings).
// Dropout is 0: drover trains without it. GPT-2's <|endoftext|> ids only with its vocabulary.
// `torch_dtype` names the tensors' dtype as transformers does (float32, bfloat16, float16).
std::string HfGpt2ConfigJson(const GptConfig& config, const std::string& torch_dtype = "float32");

// The shape of the GPT-2 in a safetensors file. The tensors give all of it but the number of
// heads: that comes from the file's metadata when drover wrote it (HfGpt2Metadata), and
// otherwise from the `config.json` beside the file, as the Hub and `save_pretrained` lay a
// model out. That config must describe what drover's model computes (model_type gpt2, a
// tanh GELU, LayerNorm eps 1e-5, an MLP of 4 x n_embd, attention scaled by 1/sqrt(head
// size) alone); each difference is an InvalidArgument naming the key, its value and what
// would do. Tensor names may carry GPT2LMHeadModel's "transformer." prefix or none.
StatusOr<GptConfig> ReadHfGpt2Config(const SafetensorsFile& file);

// Builds the model in the safetensors file at `path`: every tensor of the mapping, of the
// shape it must have and any dtype SafetensorsFile reads (F16 and BF16 widen exactly), the
// padded vocabulary rows zero. The attention-mask buffers older transformers saved are
// skipped, and an `lm_head.weight` must equal `wte.weight` (drover ties them); any other
// tensor is an InvalidArgument naming it, so a model of another architecture is refused
// rather than half loaded. Errors name the path.
StatusOr<std::unique_ptr<Gpt>> LoadHfGpt2(const std::string& path);

}  // namespace drover::engine
