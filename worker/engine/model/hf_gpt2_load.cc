// The read side of hf_gpt2.h: a Hugging Face GPT-2 safetensors file into a drover model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/files.h"
#include "worker/engine/model/hf_gpt2.h"

namespace drover::engine {
namespace {

// GPT2LMHeadModel.save_pretrained names its tensors "transformer.wte.weight" ...; the Hub's
// openai-community/gpt2 file and GPT2Model's have no prefix.
constexpr char kLmPrefix[] = "transformer.";

std::string PrefixOf(const SafetensorsFile& file) {
  return file.tensors().count(std::string(kLmPrefix) + "wte.weight") != 0 ? kLmPrefix : "";
}

// The shape keys of GPT2Config, from drover's metadata or a config.json.
struct HfShape {
  int64_t n_layer = 0, n_head = 0, n_embd = 0, n_positions = 0, vocab_size = 0;
};

StatusOr<int64_t> MetadataInt(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    return InvalidArgumentError(file.path() + ": metadata has n_head but not " + key);
  }
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  return InvalidArgumentError(file.path() + ": metadata " + key + " '" + it->second +
                              "' is not an integer");
}

StatusOr<HfShape> ShapeFromMetadata(const SafetensorsFile& file) {
  HfShape s;
  ASSIGN_OR_RETURN(s.n_layer, MetadataInt(file, "n_layer"));
  ASSIGN_OR_RETURN(s.n_head, MetadataInt(file, "n_head"));
  ASSIGN_OR_RETURN(s.n_embd, MetadataInt(file, "n_embd"));
  ASSIGN_OR_RETURN(s.n_positions, MetadataInt(file, "n_positions"));
  ASSIGN_OR_RETURN(s.vocab_size, MetadataInt(file, "vocab_size"));
  return s;
}

// A config.json key drover's model cannot follow: names the key, its value, what would do.
Status Unsupported(const std::string& path, const std::string& key, const nlohmann::json& value,
                   const std::string& allowed) {
  return InvalidArgumentError(path + ": " + key + " is " + value.dump() + "; drover's GPT-2 " +
                              allowed);
}

StatusOr<HfShape> ShapeFromConfigJson(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(path + ": not a JSON object");
  }
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (has("model_type") && j["model_type"] != "gpt2") {
    return Unsupported(path, "model_type", j["model_type"], "is model_type \"gpt2\"");
  }
  if (has("activation_function") && j["activation_function"] != "gelu_new" &&
      j["activation_function"] != "gelu_pytorch_tanh" && j["activation_function"] != "gelu_fast") {
    return Unsupported(path, "activation_function", j["activation_function"],
                       "computes GELU's tanh form (gelu_new, gelu_pytorch_tanh or gelu_fast)");
  }
  if (has("layer_norm_epsilon") &&
      (!j["layer_norm_epsilon"].is_number() ||
       std::fabs(j["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12)) {
    return Unsupported(path, "layer_norm_epsilon", j["layer_norm_epsilon"],
                       "normalises with eps 1e-05");
  }
  if (has("scale_attn_by_inverse_layer_idx") && j["scale_attn_by_inverse_layer_idx"] != false) {
    return Unsupported(path, "scale_attn_by_inverse_layer_idx",
                       j["scale_attn_by_inverse_layer_idx"],
                       "scales attention by 1/sqrt(head size) alone (false)");
  }
  if (has("scale_attn_weights") && j["scale_attn_weights"] != true) {
    return Unsupported(path, "scale_attn_weights", j["scale_attn_weights"],
                       "scales attention by 1/sqrt(head size) (true)");
  }
  if (has("add_cross_attention") && j["add_cross_attention"] != false) {
    return Unsupported(path, "add_cross_attention", j["add_cross_attention"],
                       "is a decoder alone (false)");
  }
  auto integer = [&](const char* key, int64_t* out) -> Status {
    if (!has(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
      return InvalidArgumentError(path + ": " + key + " " + (has(key) ? j[key].dump() : "missing") +
                                  "; a positive integer is needed");
    }
    *out = j[key].get<int64_t>();
    return OkStatus();
  };
  HfShape s;
  RETURN_IF_ERROR(integer("n_layer", &s.n_layer));
  RETURN_IF_ERROR(integer("n_head", &s.n_head));
  RETURN_IF_ERROR(integer("n_embd", &s.n_embd));
  // Configs from before n_positions had only n_ctx, which meant the same.
  RETURN_IF_ERROR(integer(has("n_positions") ? "n_positions" : "n_ctx", &s.n_positions));
  RETURN_IF_ERROR(integer("vocab_size", &s.vocab_size));
  if (has("n_inner") && j["n_inner"] != 4 * s.n_embd) {
    return Unsupported(path, "n_inner", j["n_inner"],
                       "has an MLP of 4 x n_embd = " + std::to_string(4 * s.n_embd) + " (or null)");
  }
  return s;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// The tensors a GPT-2 file may hold besides the mapping's: the causal-mask buffers of older
// transformers ("h.N.attn.bias" of shape (1, 1, maxT, maxT), "h.N.attn.masked_bias"), which
// carry no weights.
bool IsMaskBuffer(const std::string& name, const std::string& prefix, int num_layers) {
  for (int l = 0; l < num_layers; ++l) {
    const std::string h = prefix + "h." + std::to_string(l) + ".attn.";
    if (name == h + "bias" || name == h + "masked_bias") return true;
  }
  return false;
}

// Refuses a tensor outside the mapping, and an untied LM head.
Status CheckNoOtherTensors(const SafetensorsFile& file, const std::vector<HfGpt2Name>& names,
                           const std::string& prefix, const Gpt& model) {
  std::set<std::string> known;
  for (const HfGpt2Name& n : names) known.insert(prefix + n.hf);
  for (const auto& [name, entry] : file.tensors()) {
    if (known.count(name) != 0 || IsMaskBuffer(name, prefix, model.config().num_layers)) continue;
    int layer = -1;
    if (name.rfind(prefix + "h.", 0) == 0 &&
        std::sscanf(name.c_str() + prefix.size() + 2, "%d.", &layer) == 1 &&
        layer >= model.config().num_layers) {
      return InvalidArgumentError(file.path() + ": tensor '" + name + "' is of layer " +
                                  std::to_string(layer) + ", but the config has n_layer " +
                                  std::to_string(model.config().num_layers));
    }
    if (name != "lm_head.weight") {
      return InvalidArgumentError(file.path() + ": tensor '" + name +
                                  "' is not part of a GPT-2 (is this another architecture, or "
                                  "a model with adapters?)");
    }
    const GptConfig& c = model.config();
    const TensorInfo* wte = model.FindTensor("wte");
    std::vector<float> head(static_cast<size_t>(c.vocab_size) * c.channels);
    if (entry.shape != std::vector<int64_t>{c.vocab_size, c.channels}) {
      return InvalidArgumentError(file.path() + ": lm_head.weight has shape " +
                                  ShapeString(entry.shape) + ", not wte.weight's");
    }
    RETURN_IF_ERROR(file.ReadFloats(name, head.data()));
    if (!std::equal(head.begin(), head.end(), model.params() + wte->offset)) {
      return InvalidArgumentError(file.path() +
                                  ": lm_head.weight differs from wte.weight; drover's GPT-2 "
                                  "ties the LM head to the token embedding, so it cannot hold "
                                  "this model");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<GptConfig> ReadHfGpt2Config(const SafetensorsFile& file) {
  HfShape s;
  if (file.metadata().count("n_head") != 0) {
    ASSIGN_OR_RETURN(s, ShapeFromMetadata(file));
  } else {
    const std::string config_json = Dirname(file.path()) + "/config.json";
    if (!PathExists(config_json)) {
      return InvalidArgumentError(
          file.path() +
          ": the number of attention heads is in neither the file's metadata nor "
          "a config.json beside it; put the model's config.json (from the Hub or "
          "save_pretrained) in " +
          Dirname(file.path()));
    }
    ASSIGN_OR_RETURN(s, ShapeFromConfigJson(config_json));
  }
  const std::string prefix = PrefixOf(file);
  auto wte = file.tensors().find(prefix + "wte.weight");
  if (wte == file.tensors().end()) {
    return InvalidArgumentError(file.path() + ": no tensor wte.weight: not a GPT-2 model");
  }
  if (wte->second.shape != std::vector<int64_t>{s.vocab_size, s.n_embd}) {
    return InvalidArgumentError(file.path() + ": wte.weight has shape " +
                                ShapeString(wte->second.shape) + "; its config says (" +
                                std::to_string(s.vocab_size) + ", " + std::to_string(s.n_embd) +
                                ") (vocab_size, n_embd)");
  }
  // Before a tensor table of n_layer layers is built: a damaged count must not make one.
  const size_t held = file.tensors().size();
  if (s.n_layer < 0 || held < 4 || static_cast<uint64_t>(s.n_layer) > (held - 4) / 12) {
    return InvalidArgumentError(file.path() + ": n_layer " + std::to_string(s.n_layer) +
                                " needs 12 tensors a layer and 4 more; the file holds " +
                                std::to_string(held));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (std::max({s.n_layer, s.n_head, s.n_embd, s.n_positions, s.vocab_size}) > kMax) {
    return InvalidArgumentError(file.path() + ": the model's sizes exceed 2^31");
  }
  GptConfig c;
  c.num_layers = static_cast<int>(s.n_layer);
  c.num_heads = static_cast<int>(s.n_head);
  c.channels = static_cast<int>(s.n_embd);
  c.max_seq_len = static_cast<int>(s.n_positions);
  c.vocab_size = static_cast<int>(s.vocab_size);
  c.padded_vocab_size = PaddedVocabSize(c.vocab_size);
  Status valid = c.Validate();
  if (!valid.ok()) return InvalidArgumentError(file.path() + ": " + valid.message());
  return c;
}

StatusOr<std::unique_ptr<Gpt>> LoadHfGpt2(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  ASSIGN_OR_RETURN(const GptConfig config, ReadHfGpt2Config(*file));
  const std::string prefix = PrefixOf(*file);
  const std::vector<HfGpt2Name> names = HfGpt2Names(config.num_layers);
  std::map<std::string, const TensorInfo*> table;
  const std::vector<TensorInfo> tensors = GptTensorTable(config);
  for (const TensorInfo& t : tensors) table[t.name] = &t;
  // Every tensor's presence and shape first: a wrong file fails before a model of its size
  // is allocated. HF stores wte without the padded rows and the matrices as (in, out).
  std::vector<std::vector<int64_t>> shapes;
  for (const HfGpt2Name& n : names) {
    DROVER_CHECK(table.count(n.drover) != 0);
    std::vector<int64_t> want = table[n.drover]->shape;
    if (n.drover == "wte") want[0] = config.vocab_size;
    if (n.transposed) std::swap(want[0], want[1]);
    auto it = file->tensors().find(prefix + n.hf);
    if (it == file->tensors().end()) {
      return InvalidArgumentError(path + ": tensor '" + prefix + n.hf + "' is missing");
    }
    if (it->second.shape != want) {
      return InvalidArgumentError(path + ": tensor '" + prefix + n.hf + "' has shape " +
                                  ShapeString(it->second.shape) + ", the model's config needs " +
                                  ShapeString(want));
    }
    shapes.push_back(std::move(want));
  }
  auto model = std::make_unique<Gpt>(config);
  std::fill(model->params(), model->params() + model->num_params(), 0.0f);
  std::vector<float> staged;
  for (size_t k = 0; k < names.size(); ++k) {
    const HfGpt2Name& n = names[k];
    const TensorInfo* t = model->FindTensor(n.drover);
    DROVER_CHECK(t != nullptr);
    float* dst = model->params() + t->offset;
    if (!n.transposed) {
      RETURN_IF_ERROR(file->ReadFloats(prefix + n.hf, dst));
      continue;
    }
    // HF's (in, out) back to drover's (out, in).
    const size_t in = static_cast<size_t>(shapes[k][0]), out = static_cast<size_t>(shapes[k][1]);
    staged.resize(in * out);
    RETURN_IF_ERROR(file->ReadFloats(prefix + n.hf, staged.data()));
    for (size_t o = 0; o < out; ++o) {
      for (size_t i = 0; i < in; ++i) dst[o * in + i] = staged[i * out + o];
    }
  }
  RETURN_IF_ERROR(CheckNoOtherTensors(*file, names, prefix, *model));
  return model;
}

}  // namespace drover::engine
