#include "worker/engine/data/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/worker/engine/data/gpt2_test_vocab.h"

namespace drover::engine {
namespace {

using Pieces = std::vector<std::string_view>;

TEST(ByteTokenizerTest, TokensAreBytes) {
  auto tok = MakeByteTokenizer();
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eot_token(), -1);
  const std::string text = "h\xC3\xA9\n\x01\xFF";
  const std::vector<int32_t> ids = tok->Encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{104, 195, 169, 10, 1, 255}));
  EXPECT_EQ(tok->Decode(ids), text);
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{65, 300, -1, 66}), "AB");
}

TEST(Gpt2PreTokenizeTest, WordsNumbersPunctuationAndContractions) {
  EXPECT_EQ(Gpt2PreTokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Gpt2PreTokenize("I'm here's you'll"),
            (Pieces{"I", "'m", " here", "'s", " you", "'ll"}));
  EXPECT_EQ(Gpt2PreTokenize(" 42 is 4.5!?"), (Pieces{" 42", " is", " 4", ".", "5", "!?"}));
  EXPECT_EQ(Gpt2PreTokenize("abc123!!"), (Pieces{"abc", "123", "!!"}));
  EXPECT_EQ(Gpt2PreTokenize("!'s"), (Pieces{"!'", "s"}));      // punctuation run wins
  EXPECT_EQ(Gpt2PreTokenize("I'M"), (Pieces{"I", "'", "M"}));  // case-sensitive, as GPT-2
}

TEST(Gpt2PreTokenizeTest, WhitespaceRunsLeaveTheLastSpaceToTheNextWord) {
  EXPECT_EQ(Gpt2PreTokenize("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(Gpt2PreTokenize("x   \n\ny"), (Pieces{"x", "   \n", "\n", "y"}));
  EXPECT_EQ(Gpt2PreTokenize("end.  "), (Pieces{"end", ".", "  "}));
  EXPECT_EQ(Gpt2PreTokenize("a\nb"), (Pieces{"a", "\n", "b"}));
  EXPECT_EQ(Gpt2PreTokenize(""), Pieces{});
}

TEST(Gpt2PreTokenizeTest, LatinLettersAndSymbols) {
  EXPECT_EQ(Gpt2PreTokenize("caf\xC3\xA9 \xC3\xBC"
                            "ber"),
            (Pieces{"caf\xC3\xA9",
                    " \xC3\xBC"
                    "ber"}));
  EXPECT_EQ(Gpt2PreTokenize("x\xC3\x97y"),
            (Pieces{"x", "\xC3\x97", "y"}));  // U+00D7 is not a letter
  EXPECT_EQ(Gpt2PreTokenize("a\xC2\xA0"
                            "b"),
            (Pieces{"a", "\xC2\xA0", "b"}));  // NBSP is space
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/drover_tokenizer_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteVocab(int offset = 0) {
    WriteGpt2TestVocab(dir_ + "/encoder.json", dir_ + "/vocab.bpe", offset);
  }

  StatusOr<std::unique_ptr<Tokenizer>> Load() {
    return LoadGpt2Tokenizer(dir_ + "/encoder.json", dir_ + "/vocab.bpe");
  }

  std::string dir_;
};

TEST_F(Gpt2TokenizerTest, AppliesMergesByRank) {
  WriteVocab();
  auto tok = Load();
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 262);
  EXPECT_EQ((*tok)->eot_token(), 261);
  // "hello": h e -> he (rank 0), l l -> ll (1), he ll -> hell (4); " the": h e first, then
  // Ġ t, then Ġt he.
  EXPECT_EQ((*tok)->Encode("hello the"), (std::vector<int32_t>{260, 'o', 259}));
  // No merge crosses a pre-token boundary: "he" and " ll" (Ġ + ll; Ġ is byte 32's token).
  EXPECT_EQ((*tok)->Encode("he ll"), (std::vector<int32_t>{256, 32, 257}));
}

TEST_F(Gpt2TokenizerTest, RoundTripsArbitraryBytes) {
  WriteVocab();
  auto tok = Load();
  ASSERT_TRUE(tok.ok());
  std::string text = "the hell, he said\n\t \"quoted\" \\ caf\xC3\xA9 \x01\x7F\xFF end ";
  for (int b = 0; b < 256; ++b) text.push_back(char(b));
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(text)), text);
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{261}), "<|endoftext|>");
  // A space is byte 32, whose symbol is U+0120 'Ġ', id 32 here.
  EXPECT_EQ((*tok)->Encode(" "), (std::vector<int32_t>{32}));
}

TEST_F(Gpt2TokenizerTest, ReportsMissingAndMalformedFiles) {
  auto missing = Load();
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("encoder.json"), std::string::npos);

  WriteVocab();
  std::ofstream(dir_ + "/vocab.bpe") << "#version: 0.2\nh e\nbad line here\n";
  auto bad_merges = Load();
  ASSERT_FALSE(bad_merges.ok());
  EXPECT_NE(bad_merges.status().message().find("line 3"), std::string::npos) << bad_merges.status();

  WriteVocab();
  std::ofstream(dir_ + "/encoder.json") << "{\"a\": 1, \"b\" 2}";
  auto bad_json = Load();
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("expected ':'"), std::string::npos);

  // Well-formed JSON of the wrong shape names the file and what was wrong.
  for (const auto& [json, why] :
       std::vector<std::pair<std::string, std::string>>{{"[1, 2]", "expected an object"},
                                                        {"{\"a\": \"1\"}", "expected an integer"},
                                                        {"{\"a\": 1.5}", "expected an integer"},
                                                        {"{\"a\": -1}", "negative id"},
                                                        {"{\"a\": 4294967296}", "out of range"}}) {
    std::ofstream(dir_ + "/encoder.json") << json;
    auto wrong = Load();
    ASSERT_FALSE(wrong.ok()) << json;
    EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(wrong.status().message().find(why), std::string::npos) << wrong.status();
    EXPECT_NE(wrong.status().message().find("encoder.json"), std::string::npos) << wrong.status();
  }

  std::ofstream(dir_ + "/encoder.json") << "{\"a\": 0}";
  auto no_bytes = Load();
  ASSERT_FALSE(no_bytes.ok());
  EXPECT_NE(no_bytes.status().message().find("256 byte tokens"), std::string::npos);
}

TEST(MakeTokenizerTest, ChoosesByNameAndNeedsFilesForGpt2) {
  auto byte = MakeTokenizer("byte");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->vocab_size(), 256);
  EXPECT_EQ(MakeTokenizer("gpt2").status().code(), StatusCode::kInvalidArgument);
  const Status unknown = MakeTokenizer("sentencepiece").status();
  EXPECT_NE(unknown.message().find("byte | gpt2"), std::string::npos);
}

}  // namespace
}  // namespace drover::engine
