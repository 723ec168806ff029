// drover's GPT-2 under HF names: every tensor once, HF's shapes, Conv1D weights transposed,
// wte without its padded rows (tests/tools/safetensors_check.py runs the exported model).
#include "worker/engine/model/hf_gpt2.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

namespace drover::engine {
namespace {

const GptConfig kConfig{8, 37, 128, 2, 2, 16};  // maxT V Vp L NH C

// A model whose every parameter is its own arena index, so each value says where it came from.
std::unique_ptr<Gpt> IndexedModel() {
  auto m = std::make_unique<Gpt>(kConfig);
  std::iota(m->params(), m->params() + m->num_params(), 0.0f);
  return m;
}

std::map<std::string, const SafetensorsTensor*> ByName(const std::vector<SafetensorsTensor>& ts) {
  std::map<std::string, const SafetensorsTensor*> m;
  for (const auto& t : ts) m[t.name] = &t;
  return m;
}

TEST(HfGpt2Test, EveryTensorHasItsHfNameAndShapeInStateDictOrder) {
  auto model = IndexedModel();
  const auto tensors = HfGpt2Tensors(*model);
  const int64_t C = 16;
  ASSERT_EQ(tensors.size(), 2u + 12u * 2 + 2u);
  EXPECT_EQ(tensors.front().name, "wte.weight");
  EXPECT_EQ(tensors[1].name, "wpe.weight");
  EXPECT_EQ(tensors[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(tensors.back().name, "ln_f.bias");
  const std::map<std::string, std::vector<int64_t>> want = {{"wte.weight", {37, C}},
                                                            {"wpe.weight", {8, C}},
                                                            {"h.1.ln_1.weight", {C}},
                                                            {"h.1.ln_1.bias", {C}},
                                                            {"h.1.attn.c_attn.weight", {C, 3 * C}},
                                                            {"h.1.attn.c_attn.bias", {3 * C}},
                                                            {"h.1.attn.c_proj.weight", {C, C}},
                                                            {"h.1.attn.c_proj.bias", {C}},
                                                            {"h.1.ln_2.weight", {C}},
                                                            {"h.1.ln_2.bias", {C}},
                                                            {"h.1.mlp.c_fc.weight", {C, 4 * C}},
                                                            {"h.1.mlp.c_fc.bias", {4 * C}},
                                                            {"h.1.mlp.c_proj.weight", {4 * C, C}},
                                                            {"h.1.mlp.c_proj.bias", {C}},
                                                            {"ln_f.weight", {C}},
                                                            {"ln_f.bias", {C}}};
  const auto by_name = ByName(tensors);
  EXPECT_EQ(by_name.size(), tensors.size()) << "a name appears twice";
  for (const auto& [name, shape] : want) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name.at(name)->shape, shape) << name;
  }
  // Every parameter but wte's padding rows appears exactly once.
  std::multiset<float> seen;
  for (const auto& t : tensors) seen.insert(t.data.begin(), t.data.end());
  const size_t padding = static_cast<size_t>(128 - 37) * C;
  EXPECT_EQ(seen.size(), model->num_params() - padding);
  EXPECT_EQ(std::set<float>(seen.begin(), seen.end()).size(), seen.size());
}

TEST(HfGpt2Test, Conv1DWeightsAreTheTransposeOfDroversLinearLayout) {
  auto model = IndexedModel();
  const auto tensors = HfGpt2Tensors(*model);  // by_name points into it
  const auto by_name = ByName(tensors);
  const int C = 16;
  struct Pair {
    const char* drover;
    const char* hf;
    int out, in;
  };
  for (const Pair& p : {Pair{"h.1.qkvw", "h.1.attn.c_attn.weight", 3 * C, C},
                        Pair{"h.1.attprojw", "h.1.attn.c_proj.weight", C, C},
                        Pair{"h.0.fcw", "h.0.mlp.c_fc.weight", 4 * C, C},
                        Pair{"h.0.fcprojw", "h.0.mlp.c_proj.weight", C, 4 * C}}) {
    const TensorInfo* src = model->FindTensor(p.drover);
    const SafetensorsTensor* dst = by_name.at(p.hf);
    for (int o = 0; o < p.out; ++o) {
      for (int i = 0; i < p.in; ++i) {
        // drover (out, in) at [o][i]; HF (in, out) at [i][o].
        ASSERT_EQ(dst->data[static_cast<size_t>(i) * p.out + o],
                  model->params()[src->offset + static_cast<size_t>(o) * p.in + i])
            << p.hf << " [" << i << "][" << o << "]";
      }
    }
  }
  // Vectors are copied as they are.
  const TensorInfo* qkvb = model->FindTensor("h.1.qkvb");
  EXPECT_EQ(by_name.at("h.1.attn.c_attn.bias")->data,
            std::vector<float>(model->params() + qkvb->offset,
                               model->params() + qkvb->offset + qkvb->numel));
}

TEST(HfGpt2Test, MetadataCarriesTheFormatAndTheGpt2ConfigKeys) {
  const auto meta = HfGpt2Metadata(kConfig);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.at("n_layer"), "2");
  EXPECT_EQ(meta.at("n_head"), "2");
  EXPECT_EQ(meta.at("n_embd"), "16");
  EXPECT_EQ(meta.at("n_positions"), "8");
  EXPECT_EQ(meta.at("vocab_size"), "37");
}

}  // namespace
}  // namespace drover::engine
