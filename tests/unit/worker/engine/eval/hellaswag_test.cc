// worker/engine/eval/hellaswag.h: reading the benchmark's JSON lines, and scoring endings
// against an oracle that predicts one token at a time (Gpt::NextTokenLogits, log-softmax in
// double), not one batched Forward.
#include "worker/engine/eval/hellaswag.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/files.h"
#include "worker/engine/eval/choice_batches.h"

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

// Examples of several shapes, tokenized: the round trip through a file of `drover data
// hellaswag` gives them back, the first N of them with a limit.
TEST_F(HellaSwagTest, AFileOfTokenizedExamplesGivesThemBack) {
  std::vector<ChoiceExample> examples(3);
  examples[0] = {4, {1, 2, 3}, {{4}, {5, 6}}, 1};
  examples[1] = {7, {70000}, {{8, 9, 10}, {11}, {12}, {13, 14}}, 3};
  examples[2] = {9, {15, 16}, {{17}, {18}, {19}}, 0};
  const std::string path = (dir_ / "hellaswag.bin").string();
  ASSERT_TRUE(WriteChoiceFile(path, examples).ok());
  auto read = ReadChoiceFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*read)[i].line, examples[i].line);
    EXPECT_EQ((*read)[i].label, examples[i].label);
    EXPECT_EQ((*read)[i].context, examples[i].context);
    EXPECT_EQ((*read)[i].endings, examples[i].endings);
  }
  auto two = ReadChoiceFile(path, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->size(), 2u);
}

// A file that is not one, or is cut short or malformed anywhere, is refused as DataLoss,
// naming the file and the example; a missing one is NotFound.
TEST_F(HellaSwagTest, AFileOfTokenizedExamplesThatIsNotOneIsRefusedByName) {
  const std::vector<ChoiceExample> examples = {{4, {1, 2, 3}, {{4}, {5, 6}}, 1},
                                               {5, {7}, {{8}, {9}}, 0}};
  const std::string good = (dir_ / "good.bin").string();
  ASSERT_TRUE(WriteChoiceFile(good, examples).ok());
  const std::string bytes = *ReadFileToString(good);
  auto words = [&](std::string b) {
    std::vector<int32_t> w(b.size() / 4);
    std::memcpy(w.data(), b.data(), w.size() * 4);
    return w;
  };
  auto as_bytes = [](const std::vector<int32_t>& w) {
    return std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4);
  };
  // Words: magic, version, count; example 1 at 3: line, label, endings, context length, ...
  std::vector<int32_t> w = words(bytes);
  struct Case {
    std::string content;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({"not a file", "not a file of tokenized examples"});
  cases.push_back({bytes.substr(0, bytes.size() - 4), "example 2's ending 1: "});
  cases.push_back({bytes + "xxxx", "bytes after its last example"});
  auto changed = [&](size_t at, int32_t value) {
    std::vector<int32_t> c = w;
    c[at] = value;
    return as_bytes(c);
  };
  cases.push_back({changed(1, 2), "version 2, this reads 1"});
  cases.push_back({changed(2, 0), "an example count of 0"});
  cases.push_back({changed(4, 2), "example 1 has label 2 of 2 endings"});
  cases.push_back({changed(5, 1), "example 1 has 1 endings"});
  cases.push_back({changed(6, 99), "example 1's context: "});
  cases.push_back({changed(7, -3), "a token of -3"});
  for (const Case& c : cases) {
    const std::string path = (dir_ / "bad.bin").string();
    std::ofstream(path, std::ios::binary) << c.content;
    auto read = ReadChoiceFile(path);
    ASSERT_FALSE(read.ok()) << c.says;
    EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(c.says), std::string::npos) << read.status();
    EXPECT_NE(read.status().message().find("bad.bin"), std::string::npos) << read.status();
  }
  EXPECT_EQ(ReadChoiceFile((dir_ / "none.bin").string()).status().code(), StatusCode::kNotFound);
}

// What a training job does at its evaluation steps: every ending a row of batches of B * T
// positions, each batch's per-position losses added to its rows. The accuracy and each
// ending's loss are drover eval's (EvaluateChoices, one example's rows a pass), whatever B:
// with rows of the model's block size where a context is longer than it, and rows of half
// of it (twice as many a batch) where every row fits that.
TEST_F(HellaSwagTest, BatchesOfEveryExamplesRowsGiveDroverEvalsScores) {
  Gpt model(Config(/*maxT=*/16));
  model.InitRandom(5);
  GptInference run(model, CpuOps());
  struct Case {
    std::vector<const char*> contexts;
    int row_length;  // the longest row: 16 (a cut context), and 2 + 6 = 8
  };
  for (const Case& c : {Case{{"Once", "A context longer than sixteen bytes", "Then"}, 16},
                        Case{{"On", "Go", "Up"}, 8}}) {
    std::vector<ChoiceExample> examples;
    for (int e = 0; e < 3; ++e) {
      ChoiceExample ex;
      ex.line = e + 1;
      ex.context = tokenizer_->Encode(c.contexts[static_cast<size_t>(e)]);
      for (int i = 0; i < 3 + e; ++i)
        ex.endings.push_back(tokenizer_->Encode(" e" + std::string(i, 'z')));
      examples.push_back(ex);
    }
    std::vector<double> want;
    for (ChoiceExample& ex : examples) {
      auto s = ScoreChoices(run, ex);
      ASSERT_TRUE(s.ok()) << s.status();
      ex.label = s->pick_mean;
      want.insert(want.end(), s->sum_loss.begin(), s->sum_loss.end());
    }
    examples[1].label = (examples[1].label + 1) % 4;  // one wrong pick
    auto truth = EvaluateChoices(run, examples);
    ASSERT_TRUE(truth.ok());
    for (int B : {1, 4, 5}) {
      auto batches = ChoiceBatches::Create(examples, B, 16, 256);
      ASSERT_TRUE(batches.ok()) << batches.status();
      const int rows = (*batches)->rows_per_batch(), T = (*batches)->row_length();
      ASSERT_EQ(T, c.row_length) << c.contexts[0];
      ASSERT_EQ(rows * T, B * 16);
      EXPECT_EQ((*batches)->num_batches(), (12 + rows - 1) / rows);  // 3 + 4 + 5 rows
      std::vector<int32_t> inputs(B * 16), targets(B * 16);
      std::vector<float> losses(B * 16);
      for (int pass = 0; pass < 2; ++pass) {  // Reset: a second evaluation counts afresh
        (*batches)->Reset();
        for (int64_t i = 0; i < (*batches)->num_batches(); ++i) {
          (*batches)->Batch(i, inputs.data(), targets.data());
          run.Loss(inputs.data(), targets.data(), rows, T, losses.data());
          (*batches)->AddLosses(i, losses.data());
        }
        ASSERT_EQ((*batches)->sums().size(), want.size());
        for (size_t r = 0; r < want.size(); ++r) {
          EXPECT_NEAR((*batches)->sums()[r], want[r], 1e-4 * std::max(1.0, want[r])) << r;
        }
        const ChoiceAccuracy acc = (*batches)->Accuracy();
        EXPECT_EQ(acc.examples, 3);
        EXPECT_EQ(acc.correct_mean, truth->correct_mean) << "B " << B;
        EXPECT_EQ(acc.correct_sum, truth->correct_sum) << "B " << B;
      }
    }
  }
  // An ending that does not fit the job's rows names train.seq_len.
  const std::vector<ChoiceExample> examples = {{1, {1, 2}, {{3}, {4, 5}, {6, 7, 8, 9}}, 0}};
  auto tight = ChoiceBatches::Create(examples, 2, 4, 256);
  ASSERT_EQ(tight.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tight.status().message().find(
                "line 1: ending 2 is 4 tokens; train.seq_len 4 holds at most 3"),
            std::string::npos)
      << tight.status();
}

}  // namespace
}  // namespace drover::engine
