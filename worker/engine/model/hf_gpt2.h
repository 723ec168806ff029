// drover's GPT-2 parameters under Hugging Face transformers' GPT2Model names and shapes, so
// that `GPT2LMHeadModel.from_pretrained` (or a plain safetensors reader) takes a drover model.
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
#include <string>
#include <vector>

#include "worker/engine/model/gpt.h"
#include "worker/engine/model/safetensors.h"

namespace drover::engine {

// The model's parameters as HF GPT-2 tensors, in HF's state-dict order (wte, wpe, h.0 ...
// h.L-1, ln_f). Copies: the model is left as it is.
std::vector<SafetensorsTensor> HfGpt2Tensors(const Gpt& model);

// Metadata that transformers expects ("format": "pt") and the model's shape under the keys
// of GPT2Config (n_layer, n_head, n_embd, n_positions, vocab_size).
std::map<std::string, std::string> HfGpt2Metadata(const GptConfig& config);

}  // namespace drover::engine
