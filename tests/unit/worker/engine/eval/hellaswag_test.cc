// worker/engine/eval/hellaswag.h: reading the benchmark's JSON lines, and scoring endings
// against an oracle that predicts one token at a time (Gpt::NextTokenLogits, log-softmax in
// double), not one batched Forward.
#include "worker/engine/eval/hellaswag.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace drover::engine {
namespace {

class HellaSwagTest : public ::testing::Test {
 protected:
  HellaSwagTest() : tokenizer_(MakeByteTokenizer()) {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("hellaswag_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  ~HellaSwagTest() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "val.jsonl").string();
    std::ofstream(path) << text;
    return path;
  }
  static GptConfig Config(int maxT) {
    GptConfig c;
    c.max_seq_len = maxT;
    c.vocab_size = 256;
    c.padded_vocab_size = PaddedVocabSize(256);
    c.num_layers = 1;
    c.num_heads = 2;
    c.channels = 16;
    return c;
  }
  // The oracle: -log p(ending token k | the row's tokens before it), one prefix at a time,
  // over the same left-truncated context ScoreChoices documents.
  static double OracleSumLoss(Gpt& model, const std::vector<int32_t>& context,
                              const std::vector<int32_t>& ending) {
    const size_t maxT = static_cast<size_t>(model.config().max_seq_len);
    const size_t keep = std::min(context.size(), maxT - ending.size());
    std::vector<int32_t> row(context.end() - static_cast<ptrdiff_t>(keep), context.end());
    double sum = 0;
    for (const int32_t token : ending) {
      const std::vector<float> logits =
          model.NextTokenLogits(row.data(), static_cast<int>(row.size()));
      double max = -INFINITY;
      for (float l : logits) max = std::max(max, static_cast<double>(l));
      double z = 0;
      for (float l : logits) z += std::exp(static_cast<double>(l) - max);
      sum += max + std::log(z) - logits[token];
      row.push_back(token);
    }
    return sum;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(HellaSwagTest, ReadsTheBenchmarksLinesTokenizingEachEndingAfterASpace) {
  const std::string path = Write(
      R"({"ind": 4, "activity_label": "Baking", "ctx": "She mixes", "endings": ["flour.", "a cat", "x"], "label": 0, "split": "val"})"
      "\n\n"
      R"({"ctx": "He runs", "endings": ["fast", "slow"], "label": "1"})"
      "\n");
  auto examples = ReadChoiceExamples(path, *tokenizer_);
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->size(), 2u);
  const ChoiceExample& a = (*examples)[0];
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.label, 0);
  EXPECT_EQ(a.context, tokenizer_->Encode("She mixes"));
  ASSERT_EQ(a.endings.size(), 3u);
  EXPECT_EQ(a.endings[0], tokenizer_->Encode(" flour."));
  EXPECT_EQ(a.endings[2], tokenizer_->Encode(" x"));
  EXPECT_EQ((*examples)[1].line, 3) << "the blank line counts";
  EXPECT_EQ((*examples)[1].label, 1) << "a label written as a string";
  auto first = ReadChoiceExamples(path, *tokenizer_, /*limit=*/1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->size(), 1u);
}

TEST_F(HellaSwagTest, ABadLineIsRefusedNamingTheLineAndTheKey) {
  const std::string ok = R"({"ctx": "a", "endings": ["b", "c"], "label": 1})";
  struct Case {
    std::string line;
    std::string says;
  } cases[] = {
      {"{\"ctx\": ", "val.jsonl:2: not a JSON object"},
      {"[1, 2]", "val.jsonl:2: not a JSON object"},
      {R"({"endings": ["b", "c"], "label": 0})", "val.jsonl:2: \"ctx\" must be"},
      {R"({"ctx": "", "endings": ["b", "c"], "label": 0})", "val.jsonl:2: \"ctx\" must be"},
      {R"({"ctx": "a", "endings": ["b"], "label": 0})", "val.jsonl:2: \"endings\" must be"},
      {R"({"ctx": "a", "endings": ["b", 3], "label": 0})", "val.jsonl:2: ending 1 must be"},
      {R"({"ctx": "a", "endings": ["b", "c"], "label": 2})", "val.jsonl:2: \"label\" must be"},
      {R"({"ctx": "a", "endings": ["b", "c"], "label": -1})", "val.jsonl:2: \"label\" must be"},
      {R"({"ctx": "a", "endings": ["b", "c"]})", "val.jsonl:2: \"label\" must be"},
  };
  for (const Case& c : cases) {
    auto read = ReadChoiceExamples(Write(ok + "\n" + c.line + "\n"), *tokenizer_);
    ASSERT_FALSE(read.ok()) << c.line;
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_NE(read.status().message().find(c.says), std::string::npos) << read.status();
  }
  EXPECT_EQ(ReadChoiceExamples(Write("\n\n"), *tokenizer_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadChoiceExamples((dir_ / "none.jsonl").string(), *tokenizer_).status().code(),
            StatusCode::kNotFound);
}

// One batched Forward over right-padded rows scores each ending as the one-token-at-a-time
// oracle does, contexts longer than the block size included (left-truncated so that the
// ending stays whole), and the picks are the argmins.
TEST_F(HellaSwagTest, ScoresEachEndingAsTheTokenByTokenOracleDoes) {
  Gpt model(Config(/*maxT=*/16));
  model.InitRandom(7);
  GptInference run(model, CpuOps());
  ChoiceExample ex;
  ex.line = 9;
  ex.context = tokenizer_->Encode("The long context is longer than sixteen");  // > maxT
  ex.endings = {tokenizer_->Encode(" a"), tokenizer_->Encode(" bcdefg"), tokenizer_->Encode(" hij"),
                tokenizer_->Encode(" klmnopqrstuvwx")};
  auto s = ScoreChoices(run, ex);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->sum_loss.size(), 4u);
  for (size_t i = 0; i < ex.endings.size(); ++i) {
    const double oracle = OracleSumLoss(model, ex.context, ex.endings[i]);
    EXPECT_NEAR(s->sum_loss[i], oracle, 1e-4 * std::max(1.0, oracle)) << "ending " << i;
    EXPECT_NEAR(s->mean_loss[i], oracle / ex.endings[i].size(), 1e-4) << "ending " << i;
  }
  EXPECT_EQ(s->pick_sum,
            std::min_element(s->sum_loss.begin(), s->sum_loss.end()) - s->sum_loss.begin());
  EXPECT_EQ(s->pick_mean,
            std::min_element(s->mean_loss.begin(), s->mean_loss.end()) - s->mean_loss.begin());
  // More endings than one Forward takes (8): each batch scores as the oracle does.
  ChoiceExample many = ex;
  for (int i = 0; i < 7; ++i)
    many.endings.push_back(tokenizer_->Encode(" x" + std::string(i, 'y')));
  auto ms = ScoreChoices(run, many);
  ASSERT_TRUE(ms.ok()) << ms.status();
  ASSERT_EQ(ms->sum_loss.size(), 11u);
  for (size_t i = 0; i < many.endings.size(); ++i) {
    const double oracle = OracleSumLoss(model, many.context, many.endings[i]);
    EXPECT_NEAR(ms->sum_loss[i], oracle, 1e-4 * std::max(1.0, oracle)) << "ending " << i;
  }
  // A short context, not truncated: the same oracle.
  ex.context = tokenizer_->Encode("Hi");
  s = ScoreChoices(run, ex);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->sum_loss[1], OracleSumLoss(model, ex.context, ex.endings[1]), 1e-4 * 10);
}

TEST_F(HellaSwagTest, AnEndingTooLongOrATokenOutsideTheVocabularyIsRefusedNamingTheLine) {
  Gpt model(Config(/*maxT=*/8));
  model.InitRandom(1);
  GptInference run(model, CpuOps());
  ChoiceExample ex;
  ex.line = 12;
  ex.context = {1, 2};
  ex.endings = {{3}, {4, 5, 6, 7, 8, 9, 10, 11}};  // 8 tokens: none left for context
  auto s = ScoreChoices(run, ex);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("line 12: ending 1 is 8 tokens"), std::string::npos)
      << s.status();
  ex.endings = {{3}, {300}};
  s = ScoreChoices(run, ex);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("token 300 is outside the model's vocabulary of 256"),
            std::string::npos)
      << s.status();
}

TEST_F(HellaSwagTest, AccuracyCountsThePicksThatMatchTheLabel) {
  Gpt model(Config(/*maxT=*/16));
  model.InitRandom(3);
  GptInference run(model, CpuOps());
  ChoiceExample ex;
  ex.context = tokenizer_->Encode("Once");
  ex.endings = {tokenizer_->Encode(" upon"), tokenizer_->Encode(" a"), tokenizer_->Encode(" time"),
                tokenizer_->Encode(" zz")};
  auto s = ScoreChoices(run, ex);
  ASSERT_TRUE(s.ok());
  std::vector<ChoiceExample> examples(4, ex);
  examples[0].label = s->pick_mean;
  examples[1].label = s->pick_mean;
  examples[2].label = (s->pick_mean + 1) % 4;
  examples[3].label = s->pick_sum;
  auto acc = EvaluateChoices(run, examples);
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ(acc->examples, 4);
  EXPECT_EQ(acc->correct_mean, 2 + (s->pick_sum == s->pick_mean ? 1 : 0));
  EXPECT_EQ(acc->correct_sum, 1 + 2 * (s->pick_sum == s->pick_mean ? 1 : 0));
  EXPECT_DOUBLE_EQ(acc->acc_norm(), acc->correct_mean / 4.0);
}

}  // namespace
}  // namespace drover::engine
