// A Hugging Face GPT-2 safetensors file read back into drover's model, through the readers
// every command uses (LoadModelFile, ReadModelFileConfig): drover's own export, the layout
// save_pretrained writes (prefixed names, config.json beside, mask buffers, 16-bit dtypes),
// and a refusal naming the problem for every file that is not a GPT-2 drover computes.
// tests/tools/hf_gpt2_check.py --load checks the same against transformers itself.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/files.h"
#include "worker/engine/model/hf_gpt2.h"
#include "worker/engine/model/model_file.h"

namespace drover::engine {
namespace {

namespace fs = std::filesystem;

const GptConfig kConfig{8, 37, 128, 2, 2, 16};  // maxT V Vp L NH C

// Every parameter a distinct value (its arena index, scaled) but wte's padded rows, which
// are zero as a loaded model has them. The values are small integers over 8, exact in bf16
// and fp16 too.
std::unique_ptr<Gpt> IndexedModel() {
  auto m = std::make_unique<Gpt>(kConfig);
  for (size_t i = 0; i < m->num_params(); ++i) {
    m->params()[i] = static_cast<float>(static_cast<int>(i % 512) - 256) / 8.0f;
  }
  const TensorInfo* wte = m->FindTensor("wte");
  std::fill(m->params() + wte->offset + kConfig.vocab_size * kConfig.channels,
            m->params() + wte->offset + wte->numel, 0.0f);
  return m;
}

void ExpectSameModel(const Gpt& a, const Gpt& b) {
  ASSERT_EQ(a.config(), b.config());
  ASSERT_EQ(a.num_params(), b.num_params());
  for (const TensorInfo& t : a.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      ASSERT_EQ(a.params()[t.offset + i], b.params()[t.offset + i]) << t.name << " [" << i << "]";
    }
  }
}

// A safetensors file written by hand: any dtype, any header. Each tensor's values are stored
// as `dtype` (F32, F16 or BF16; the test values are exact in each).
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

uint16_t ToHalf(float f) {  // exact for the test values: small multiples of 1/8
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int exponent = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (exponent << 10) | ((b >> 13) & 0x3FFu));
}

RawTensor Encode(const SafetensorsTensor& t, const std::string& dtype, const std::string& name) {
  RawTensor r{name, dtype, t.shape, {}};
  for (float v : t.data) {
    if (dtype == "F32") {
      r.bytes.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t h =
          dtype == "F16" ? ToHalf(v) : static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
      r.bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return r;
}

void WriteRaw(const std::string& path, const std::vector<RawTensor>& tensors,
              const nlohmann::json& metadata = nlohmann::json::object()) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
    data += t.bytes;
  }
  const std::string json = header.dump();
  const uint64_t n = json.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << json << data;
}

// What save_pretrained writes for GPT2LMHeadModel: "transformer." names, mask buffers in
// older versions, {"format": "pt"} and the shape in config.json.
std::vector<RawTensor> SavePretrainedTensors(const Gpt& m, const std::string& dtype) {
  std::vector<RawTensor> out;
  for (const SafetensorsTensor& t : HfGpt2Tensors(m)) {
    out.push_back(Encode(t, dtype, "transformer." + t.name));
  }
  const int T = kConfig.max_seq_len;
  SafetensorsTensor mask{"", {1, 1, T, T}, std::vector<float>(static_cast<size_t>(T) * T, 1.0f)};
  out.push_back(Encode(mask, dtype, "transformer.h.0.attn.bias"));
  out.push_back(Encode({"", {}, {-1e4f}}, "F32", "transformer.h.0.attn.masked_bias"));
  return out;
}

nlohmann::json Gpt2ConfigJson() {
  return {{"activation_function", "gelu_new"},
          {"architectures", {"GPT2LMHeadModel"}},
          {"layer_norm_epsilon", 1e-05},
          {"model_type", "gpt2"},
          {"n_embd", 16},
          {"n_head", 2},
          {"n_inner", nullptr},
          {"n_layer", 2},
          {"n_positions", 8},
          {"reorder_and_upcast_attn", false},
          {"scale_attn_by_inverse_layer_idx", false},
          {"scale_attn_weights", true},
          {"torch_dtype", "float32"},
          {"vocab_size", 37}};
}

class HfGpt2LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTempDir("drover_hf_gpt2_load_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    model_ = IndexedModel();
  }
  void TearDown() override { (void)RemoveAll(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void WriteConfig(const nlohmann::json& config) const {
    std::ofstream(Path("config.json")) << config.dump(2);
  }
  // The save_pretrained layout with config.json changed by `edit`; the load's status.
  Status LoadWithConfig(const std::function<void(nlohmann::json&)>& edit) {
    WriteRaw(Path("model.safetensors"), SavePretrainedTensors(*model_, "F32"), {{"format", "pt"}});
    nlohmann::json config = Gpt2ConfigJson();
    edit(config);
    WriteConfig(config);
    return LoadModelFile(Path("model.safetensors")).status();
  }

  std::string dir_;
  std::unique_ptr<Gpt> model_;
};

TEST_F(HfGpt2LoadTest, DroversOwnExportLoadsBackAsTheSameModel) {
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), HfGpt2Tensors(*model_), HfGpt2Metadata(kConfig))
          .ok());
  auto config = ReadModelFileConfig(Path("model.safetensors"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, kConfig);
  auto loaded = LoadModelFile(Path("model.safetensors"));  // no config.json: the metadata has it
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameModel(**loaded, *model_);
}

TEST_F(HfGpt2LoadTest, ADirectoryNamesTheModelSafetensorsInIt) {
  Status empty = LoadModelFile(dir_).status();
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("is a directory, not a model file, and holds no "
                                 "model.safetensors"),
            std::string::npos)
      << empty;
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), HfGpt2Tensors(*model_), HfGpt2Metadata(kConfig))
          .ok());
  auto config = ReadModelFileConfig(dir_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, kConfig);
  auto loaded = LoadModelFile(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameModel(**loaded, *model_);
}

TEST_F(HfGpt2LoadTest, SavePretrainedLayoutLoadsInEachDtype) {
  WriteConfig(Gpt2ConfigJson());
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    WriteRaw(Path("model.safetensors"), SavePretrainedTensors(*model_, dtype), {{"format", "pt"}});
    auto loaded = LoadModelFile(Path("model.safetensors"));
    ASSERT_TRUE(loaded.ok()) << dtype << ": " << loaded.status();
    ExpectSameModel(**loaded, *model_);
  }
}

TEST_F(HfGpt2LoadTest, TheHubsUnprefixedNamesAndATiedLmHeadLoad) {
  std::vector<RawTensor> tensors;
  for (const SafetensorsTensor& t : HfGpt2Tensors(*model_)) {
    tensors.push_back(Encode(t, "F32", t.name));
    if (t.name == "wte.weight") tensors.push_back(Encode(t, "F32", "lm_head.weight"));
  }
  WriteRaw(Path("model.safetensors"), tensors);
  nlohmann::json config = Gpt2ConfigJson();
  config.erase("n_positions");
  config["n_ctx"] = 8;  // configs older than n_positions
  WriteConfig(config);
  auto loaded = LoadModelFile(Path("model.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameModel(**loaded, *model_);
}

TEST_F(HfGpt2LoadTest, AConfigDroversModelDoesNotComputeIsRefusedNamingTheKey) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Case& c : {Case{"activation_function", "relu", "activation_function is \"relu\""},
                        Case{"layer_norm_epsilon", 1e-6, "layer_norm_epsilon is 1e-06"},
                        Case{"n_inner", 32, "n_inner is 32; drover's GPT-2 has an MLP of 4 x"},
                        Case{"scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse"},
                        Case{"model_type", "gpt_neo", "model_type is \"gpt_neo\""},
                        Case{"n_head", 3, "must be divisible by num_heads (3)"},
                        Case{"vocab_size", 50257, "wte.weight has shape (37, 16); its config"},
                        Case{"n_layer", 3, "n_layer 3 needs 12 tensors a layer"},
                        Case{"n_layer", 1,
                             "'transformer.h.1.attn.c_attn.bias' is of layer 1, "
                             "but the config has n_layer 1"}}) {
    Status st = LoadWithConfig([&](nlohmann::json& j) { j[c.key] = c.value; });
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.key << ": " << st;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.key << ": " << st.message();
  }
  Status st = LoadWithConfig([](nlohmann::json& j) { j.erase("n_head"); });
  EXPECT_NE(st.message().find("n_head missing"), std::string::npos) << st.message();
}

TEST_F(HfGpt2LoadTest, TheConfigJsonDroverWritesDescribesTheModel) {
  std::vector<RawTensor> tensors;
  for (const SafetensorsTensor& t : HfGpt2Tensors(*model_))
    tensors.push_back(Encode(t, "F32", t.name));
  WriteRaw(Path("model.safetensors"), tensors,
           {{"format", "pt"}});  // the head count: config.json's
  std::ofstream(Path("config.json")) << HfGpt2ConfigJson(kConfig);
  auto loaded = LoadModelFile(Path("model.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameModel(**loaded, *model_);
  const auto j = nlohmann::json::parse(HfGpt2ConfigJson(kConfig));
  EXPECT_EQ(j["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["resid_pdrop"], 0.0);
  EXPECT_FALSE(j.contains("eos_token_id"))
      << "GPT-2's <|endoftext|> id is not in a 37-token vocabulary";
  GptConfig gpt2 = kConfig;
  gpt2.vocab_size = 50257;
  EXPECT_EQ(nlohmann::json::parse(HfGpt2ConfigJson(gpt2))["eos_token_id"], 50256);
}

TEST_F(HfGpt2LoadTest, WithoutMetadataOrConfigJsonTheMissingHeadCountIsNamed) {
  WriteRaw(Path("model.safetensors"), SavePretrainedTensors(*model_, "F32"), {{"format", "pt"}});
  Status st = LoadModelFile(Path("model.safetensors")).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("number of attention heads"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("config.json"), std::string::npos) << st.message();
}

TEST_F(HfGpt2LoadTest, TensorsOfAnotherModelAreRefusedNamingTheTensor) {
  WriteConfig(Gpt2ConfigJson());
  auto with = [&](const std::function<void(std::vector<RawTensor>&)>& edit) {
    std::vector<RawTensor> tensors = SavePretrainedTensors(*model_, "F32");
    edit(tensors);
    WriteRaw(Path("model.safetensors"), tensors);
    return LoadModelFile(Path("model.safetensors")).status();
  };
  auto find = [](std::vector<RawTensor>& ts, const std::string& name) -> RawTensor& {
    for (RawTensor& t : ts) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << name;
    return ts.front();
  };
  Status extra = with([](std::vector<RawTensor>& ts) {
    ts.push_back(Encode({"", {2}, {1, 2}}, "F32", "transformer.h.0.attn.lora_A"));
  });
  EXPECT_NE(extra.message().find("'transformer.h.0.attn.lora_A' is not part of a GPT-2"),
            std::string::npos)
      << extra;
  Status missing = with([](std::vector<RawTensor>& ts) {
    std::erase_if(ts, [](const RawTensor& t) { return t.name == "transformer.h.1.ln_2.bias"; });
  });
  EXPECT_NE(missing.message().find("'transformer.h.1.ln_2.bias' is missing"), std::string::npos)
      << missing;
  Status shape = with([&](std::vector<RawTensor>& ts) {
    find(ts, "transformer.h.0.mlp.c_fc.weight").shape = {64, 16};  // (out, in): not transposed
  });
  EXPECT_NE(shape.message().find("'transformer.h.0.mlp.c_fc.weight' has shape (64, 16), the "
                                 "model's config needs (16, 64)"),
            std::string::npos)
      << shape;
  Status untied = with([&](std::vector<RawTensor>& ts) {
    RawTensor head = find(ts, "transformer.wte.weight");
    head.name = "lm_head.weight";
    head.bytes[5] ^= 1;
    ts.push_back(head);
  });
  EXPECT_NE(untied.message().find("lm_head.weight differs from wte.weight"), std::string::npos)
      << untied;
  Status dtype =
      with([&](std::vector<RawTensor>& ts) { find(ts, "transformer.ln_f.bias").dtype = "I32"; });
  EXPECT_NE(dtype.message().find("'transformer.ln_f.bias' has dtype I32"), std::string::npos)
      << dtype;
}

TEST_F(HfGpt2LoadTest, NonFiniteWeightsAreRefusedAsInAnLlmcFile) {
  model_->params()[model_->FindTensor("lnfb")->offset + 3] = std::nanf("");
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), HfGpt2Tensors(*model_), HfGpt2Metadata(kConfig))
          .ok());
  Status st = LoadModelFile(Path("model.safetensors")).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("non-finite weights in tensor lnfb (element 3 is nan)"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace drover::engine
