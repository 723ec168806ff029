// `drover data prepare`, run as the real executable.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/token_shard.h"

namespace drover {
namespace {

class DataPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    drover_ = std::string(DROVER_BIN_DIR) + "/bin/drover";
    if (!std::filesystem::exists(drover_)) GTEST_SKIP() << drover_ << " is not built";
    char tmpl[] = "/tmp/drover_prepare_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Runs drover with `args`; returns its exit code.
  int Drover(const std::string& args) {
    const std::string cmd = drover_ + " " + args + " >" + dir_ + "/out.txt 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  std::string Output() {
    std::ifstream in(dir_ + "/out.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
    return dir_ + "/" + name;
  }
  static std::vector<uint16_t> Bytes(const std::string& s) {
    return std::vector<uint16_t>(s.begin(), s.end());
  }

  std::string drover_;
  std::string dir_;
};

TEST_F(DataPrepareTest, ByteLevelSplitsTheLastFractionIntoVal) {
  const std::string a = Write("a.txt", "0123456789");
  const std::string b = Write("b.txt", "abcdefghij");
  ASSERT_EQ(Drover("data prepare " + a + " " + b + " --out " + dir_ + "/out --val-fraction 0.25"),
            0)
      << Output();
  auto train = ReadTokenShard(dir_ + "/out/train_000000.bin");
  auto val = ReadTokenShard(dir_ + "/out/val.bin");
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ(*train, Bytes("0123456789abcde"));
  EXPECT_EQ(*val, Bytes("fghij"));
  EXPECT_NE(Output().find("15 tokens"), std::string::npos) << Output();
}

TEST_F(DataPrepareTest, ShardTokensCutsTrainIntoNumberedShards) {
  const std::string in = Write("t.txt", std::string(25, 'x'));
  ASSERT_EQ(
      Drover("data prepare " + in + " --out " + dir_ + " --val-fraction 0.2 --shard-tokens 8"), 0)
      << Output();
  for (const auto& [name, n] : std::vector<std::pair<std::string, uint64_t>>{
           {"train_000000.bin", 8}, {"train_000001.bin", 8}, {"train_000002.bin", 4}}) {
    auto count = ReadTokenShardCount(dir_ + "/" + name);
    ASSERT_TRUE(count.ok()) << name;
    EXPECT_EQ(*count, n) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/train_000003.bin"));
  EXPECT_EQ(*ReadTokenShardCount(dir_ + "/val.bin"), 5u);
}

TEST_F(DataPrepareTest, InvalidInputsExitTwoWithAMessage) {
  const std::string in = Write("t.txt", "text");
  EXPECT_EQ(Drover("data prepare " + dir_ + "/missing.txt --out " + dir_), 2);
  EXPECT_NE(Output().find("missing.txt"), std::string::npos) << Output();
  EXPECT_EQ(Drover("data prepare " + in + " --out " + dir_ + " --val-fraction 1.5"), 2);
  EXPECT_NE(Output().find("--val-fraction"), std::string::npos) << Output();
  EXPECT_EQ(Drover("data prepare " + in + " --out " + dir_ + " --tokenizer gpt2"), 2);
  EXPECT_NE(Output().find("--encoder"), std::string::npos) << Output();
  EXPECT_EQ(Drover("data prepare " + in + " --out " + dir_ + " --tokenizer wordpiece"), 2);
  EXPECT_EQ(Drover("data prepare " + in), 2);  // --out is required
}

TEST_F(DataPrepareTest, TokenIdsAbove65535AreRejected) {
  // A GPT-2 vocabulary whose byte tokens sit at ids 70000 + b.
  std::ofstream enc(dir_ + "/encoder.json");
  enc << "{";
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    int cp = b;
    if (!direct) {
      int n = 0;
      for (int x = 0; x < b; ++x) {
        n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174));
      }
      cp = 256 + n;
    }
    char key[16];
    std::snprintf(key, sizeof(key), "\\u%04x", cp);
    enc << (b ? "," : "") << "\"" << key << "\": " << 70000 + b;
  }
  // Ids must stay below the number of tokens: fill 0..69999 with merged tokens no text
  // here produces.
  for (int i = 0; i < 70000; ++i) enc << ",\"~~" << i << "\": " << i;
  enc << "}";
  enc.close();
  Write("vocab.bpe", "#version: 0.2\n");
  const std::string in = Write("t.txt", "hello");
  EXPECT_EQ(Drover("data prepare " + in + " --out " + dir_ + "/o --tokenizer gpt2 --encoder " +
                   dir_ + "/encoder.json --merges " + dir_ + "/vocab.bpe"),
            2);
  EXPECT_NE(Output().find("65535"), std::string::npos) << Output();
}

}  // namespace
}  // namespace drover
