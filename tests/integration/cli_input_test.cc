// The `drover` binary given bad files: every subcommand says what is wrong with the file
// and exits 2 (input the user must fix), never 0 and never the runtime-failure code 1.
// No coordinator is needed: each command refuses before it would dial one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/token_shard.h"
#include "tests/integration/cluster.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/model/model_file.h"

namespace drover::testing {
namespace {

namespace fs = std::filesystem;

class CliInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("cli_input_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  // A token shard whose header has llm.c's model-file magic instead of the shard magic.
  std::string WrongMagicShard(const std::string& name) const {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240326;
    header[1] = 1;
    std::ofstream f(Path(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
    return Path(name);
  }
  std::string GoodShard(const std::string& name) const {
    std::vector<uint16_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 64);
    EXPECT_TRUE(WriteTokenShard(Path(name), tokens).ok());
    return Path(name);
  }
  // A small model whose `tensor` holds a NaN, as a diverged run saves it.
  std::string NanModel(const std::string& name, const std::string& tensor) const {
    engine::Gpt m(engine::GptConfig{16, 64, 128, 1, 2, 8});
    m.InitRandom(1);
    const engine::TensorInfo* t = m.FindTensor(tensor);
    EXPECT_NE(t, nullptr);
    m.params()[t->offset] = std::nanf("");
    EXPECT_TRUE(engine::SaveModelFile(m, Path(name)).ok());
    return Path(name);
  }
  // Runs drover; expects exit code 2 and `expect` in what it printed.
  void ExpectBadInput(std::vector<std::string> args, const std::string& expect) {
    args.insert(args.begin(), {"--coordinator", "127.0.0.1:1", "--retry-for", "0"});
    CliResult r = RunCli(dir_, args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << "expected: " << expect << "\n" << r.out;
  }
  std::string Spec(const std::string& body) const {
    return "name: t\noutput_dir: " + Path("out") + "\ndata: {train: " + Path("train.bin") + "}\n" +
           body;
  }

  fs::path dir_;
};

TEST_F(CliInputTest, SubmitOfADirectorySaysItIsADirectory) {
  ExpectBadInput({"submit", dir_.string()}, "is a directory, not a YAML file");
}

TEST_F(CliInputTest, SubmitOfAMissingFileGivesTheReason) {
  ExpectBadInput({"submit", Path("nope.yaml")}, "cannot read job spec '" + Path("nope.yaml") +
                                                    "': open " + Path("nope.yaml") +
                                                    ": No such file or directory");
}

TEST_F(CliInputTest, SubmitOfA23DigitIntegerSaysOutOfRange) {
  ExpectBadInput({"submit", Write("big.yaml", Spec("train: {steps: 12345678901234567890123}\n"))},
                 "train.steps (line 4): '12345678901234567890123' is out of range");
}

TEST_F(CliInputTest, SubmitOfASecondYamlDocumentIsRefused) {
  ExpectBadInput({"submit", Write("two.yaml", Spec("---\nname: other\n"))}, "2 YAML documents");
}

TEST_F(CliInputTest, SubmitOfUnknownYamlTagsIsRefused) {
  ExpectBadInput(
      {"submit", Write("tag.yaml", Spec("train: {steps: !!python/object:os.system 5}\n"))},
      "unknown YAML tag 'tag:yaml.org,2002:python/object:os.system' at line 4");
  ExpectBadInput({"submit", Write("local.yaml", Spec("train: {steps: !foo 5}\n"))},
                 "unknown YAML tag '!foo'");
}

TEST_F(CliInputTest, TrainOfAMissingSpecOrADirectoryIsBadInput) {
  ExpectBadInput({"train", Path("nope.yaml")}, "No such file or directory");
  ExpectBadInput({"train", dir_.string()}, "is a directory");
}

TEST_F(CliInputTest, TrainOnAShardWithTheWrongMagicIsBadInput) {
  WrongMagicShard("train.bin");
  const std::string spec =
      Write("job.yaml", Spec("model: {n_layer: 1, n_head: 2, n_embd: 8, block_size: 16, "
                             "vocab_size: 64}\ntrain: {steps: 2, global_batch: 1, micro_batch: 1, "
                             "seq_len: 16, eval_every: 0}\nresources: {device: cpu}\n"));
  ExpectBadInput({"train", spec, "--fresh"},
                 "data.train: token shard " + Path("train.bin") + ": bad magic 20240326");
}

TEST_F(CliInputTest, EvalAndSampleOfAFileThatIsNoModelAreBadInput) {
  const std::string junk = Write("junk.bin", std::string(2000, 'x'));
  ExpectBadInput({"eval", junk, "--data", GoodShard("val.bin")}, "not an llm.c model file");
  ExpectBadInput({"sample", junk, "--tokens", "1"}, "not an llm.c model file");
  ExpectBadInput({"sample", Path("missing.bin")}, "No such file or directory");
}

TEST_F(CliInputTest, EvalAndSampleOfAModelWithNanWeightsAreRefusedNamingTheTensor) {
  const std::string model = NanModel("nan.bin", "h.0.qkvw");
  ExpectBadInput({"eval", model, "--data", GoodShard("val.bin"), "--seq", "8", "--batches", "1"},
                 "the model file has non-finite weights in tensor h.0.qkvw");
  ExpectBadInput({"sample", model, "--tokens", "1"},
                 "the model file has non-finite weights in tensor h.0.qkvw");
}

TEST_F(CliInputTest, EvalOnAShardWithTheWrongMagicIsBadInput) {
  engine::Gpt m(engine::GptConfig{16, 64, 128, 1, 2, 8});
  m.InitRandom(1);
  ASSERT_TRUE(engine::SaveModelFile(m, Path("m.bin")).ok());
  ExpectBadInput({"eval", Path("m.bin"), "--data", WrongMagicShard("val.bin"), "--seq", "8"},
                 "bad magic 20240326");
  ExpectBadInput({"eval", Path("m.bin")}, "give --data, --hellaswag or both");
  // A byte token beyond the model's 64-token vocabulary: the tokenizer does not fit it.
  const std::string bench = Write("b.jsonl", R"({"ctx": "zz", "endings": ["a", "b"], "label": 0})");
  ExpectBadInput({"eval", Path("m.bin"), "--hellaswag", bench},
                 "line 1: token 122 is outside the model's vocabulary of 64");
  ExpectBadInput({"eval", Path("m.bin"), "--hellaswag", Path("none.jsonl")}, "none.jsonl");
}

TEST_F(CliInputTest, DataPrepareOfAMissingInputAndCkptOfAnEmptyDirectoryAreBadInput) {
  ExpectBadInput({"data", "prepare", Path("nope.txt"), "--out", Path("data")},
                 Path("nope.txt") + "' does not exist");
  ExpectBadInput({"ckpt", "ls", dir_.string()}, "no checkpoint");
  ExpectBadInput({"ckpt", "verify", dir_.string()}, "no checkpoint");
}

}  // namespace
}  // namespace drover::testing
