// The engine's readers of files a user hands it: model files, token shards, tokenizers,
// benchmark files.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/token_shard.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/targets.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/data/tokenizer.h"
#include "worker/engine/eval/choice_batches.h"
#include "worker/engine/eval/hellaswag.h"
#include "worker/engine/model/model_file.h"

namespace drover::fuzz {

int FuzzModelFile(const uint8_t* data, size_t size) {
  const std::string path = FreshScratchDir() + "/model.bin";
  WriteFileOrDie(path, {reinterpret_cast<const char*>(data), size});
  (void)engine::ReadModelFileConfig(path);
  (void)engine::LoadModelFile(path);
  return 0;
}

int FuzzTokenFile(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int seq_len = 1 + data[0] % 64;
  const std::string path = FreshScratchDir() + "/tokens.bin";
  WriteFileOrDie(path, {reinterpret_cast<const char*>(data + 1), size - 1});
  (void)ReadTokenShard(path);
  auto dataset = engine::TokenDataset::Open(path, seq_len);
  if (!dataset.ok()) return 0;
  const engine::TokenDataset& d = **dataset;
  std::vector<int32_t> inputs(seq_len), targets(seq_len);
  for (uint64_t w : {uint64_t{0}, d.num_windows() - 1}) {
    d.ReadWindow(w, inputs.data(), targets.data());
  }
  for (size_t s = 0; s < d.num_shards(); ++s) {
    (void)d.CheckTokens(s, 0, d.shard_tokens(s), 50257);
  }
  return 0;
}

int FuzzTokenizer(const uint8_t* data, size_t size) {
  const auto [encoder, merges] = SplitInput(data, size);
  const std::string dir = FreshScratchDir();
  WriteFileOrDie(dir + "/encoder.json", encoder);
  WriteFileOrDie(dir + "/vocab.bpe", merges);
  auto tok = engine::LoadGpt2Tokenizer(dir + "/encoder.json", dir + "/vocab.bpe");
  if (!tok.ok()) return 0;
  // Any text encodes with a loaded tokenizer (every byte has a token), and decodes back.
  const std::string text = "Hello world, it's 42\xC3\xA9! \n\x01\xFF";
  const std::vector<int32_t> ids = (*tok)->Encode(text);
  if ((*tok)->Decode(ids) != text) {
    std::fprintf(stderr, "tokenizer does not round-trip\n");
    std::abort();
  }
  return 0;
}

int FuzzHellaSwag(const uint8_t* data, size_t size) {
  const std::string path = FreshScratchDir() + "/val.jsonl";
  WriteFileOrDie(path, {reinterpret_cast<const char*>(data), size});
  static const std::unique_ptr<engine::Tokenizer> bytes = engine::MakeByteTokenizer();
  auto examples = engine::ReadChoiceExamples(path, *bytes, /*limit=*/4);
  if (!examples.ok()) return 0;
  // Scored by a tiny model whose vocabulary and block size the bytes can exceed.
  static engine::GptInference* model = [] {
    auto* m = new engine::Gpt(engine::GptConfig{/*maxT=*/16, /*V=*/200, /*Vp=*/256, 1, 1, 8});
    m->InitRandom(1);
    return new engine::GptInference(*m, engine::CpuOps());
  }();
  for (const engine::ChoiceExample& ex : *examples) {
    if (ex.label < 0 || ex.label >= static_cast<int>(ex.endings.size())) {
      std::fprintf(stderr, "an example with label %d of %zu endings was accepted\n", ex.label,
                   ex.endings.size());
      std::abort();
    }
    (void)engine::ScoreChoices(*model, ex);
  }
  return 0;
}

int FuzzChoiceFile(const uint8_t* data, size_t size) {
  const std::string path = FreshScratchDir() + "/hellaswag.bin";
  WriteFileOrDie(path, {reinterpret_cast<const char*>(data), size});
  auto examples = engine::ReadChoiceFile(path, /*limit=*/8);
  if (!examples.ok()) return 0;
  for (const engine::ChoiceExample& ex : *examples) {
    if (ex.label < 0 || ex.label >= static_cast<int>(ex.endings.size())) {
      std::fprintf(stderr, "an example with label %d of %zu endings was accepted\n", ex.label,
                   ex.endings.size());
      std::abort();
    }
  }
  // Rows of a job with micro_batch 2, seq_len 16 and a vocabulary of 200, which the tokens
  // and endings can exceed; every batch's losses added (each position's loss 1).
  auto batches = engine::ChoiceBatches::Create(std::move(examples).value(), 2, 16, 200);
  if (!batches.ok()) return 0;
  std::vector<int32_t> inputs(32), targets(32);
  const std::vector<float> losses(32, 1.0f);
  for (int64_t i = 0; i < (*batches)->num_batches(); ++i) {
    (*batches)->Batch(i, inputs.data(), targets.data());
    (*batches)->AddLosses(i, losses.data());
  }
  const engine::ChoiceAccuracy acc = (*batches)->Accuracy();
  if (acc.examples != (*batches)->num_examples() || acc.correct_mean > acc.examples) {
    std::fprintf(stderr, "accuracy of %d examples, %d right, of %lld read\n", acc.examples,
                 acc.correct_mean, static_cast<long long>((*batches)->num_examples()));
    std::abort();
  }
  return 0;
}

}  // namespace drover::fuzz
