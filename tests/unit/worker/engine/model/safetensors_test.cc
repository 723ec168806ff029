// The safetensors writer: the header the format specifies, the data back to back after it,
// refusals of tensors it cannot describe, and atomic replacement on a failing disk.
#include "worker/engine/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tests/unit/common/fault_injection_fs.h"

namespace drover::engine {
namespace {

namespace fs = std::filesystem;

std::vector<SafetensorsTensor> TwoTensors() {
  return {{"b.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"a.bias", {3}, {-1, 0.5f, 7}}};
}

uint64_t HeaderLength(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), sizeof(n));
  return n;
}

TEST(SafetensorsTest, HeaderDescribesEachTensorInOrderWithContiguousOffsets) {
  auto header = SafetensorsHeader(TwoTensors(), {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  const uint64_t n = HeaderLength(*header);
  ASSERT_EQ(header->size(), 8 + n);
  EXPECT_EQ(header->size() % 8, 0u) << "tensor data must start 8-byte aligned";
  EXPECT_EQ((*header)[8], '{');
  const auto json = nlohmann::ordered_json::parse(header->substr(8));
  EXPECT_EQ(json["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  EXPECT_EQ(json["b.weight"]["dtype"], "F32");
  EXPECT_EQ(json["b.weight"]["shape"], (nlohmann::json{2, 3}));
  EXPECT_EQ(json["b.weight"]["data_offsets"], (nlohmann::json{0, 24}));
  EXPECT_EQ(json["a.bias"]["shape"], (nlohmann::json{3}));
  EXPECT_EQ(json["a.bias"]["data_offsets"], (nlohmann::json{24, 36}));
  // In the order given, not sorted: the file reads like the model.
  std::vector<std::string> keys;
  for (const auto& [k, v] : json.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "b.weight", "a.bias"}));
}

TEST(SafetensorsTest, RefusesTensorsTheHeaderCannotDescribe) {
  auto wrong_size = TwoTensors();
  wrong_size[0].data.pop_back();
  auto st = SafetensorsHeader(wrong_size, {}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'b.weight' has 5 values, its shape needs 6"), std::string::npos)
      << st.message();
  auto twice = TwoTensors();
  twice[1].name = "b.weight";
  EXPECT_NE(SafetensorsHeader(twice, {}).status().message().find("appears twice"),
            std::string::npos);
  auto reserved = TwoTensors();
  reserved[0].name = "__metadata__";
  EXPECT_EQ(SafetensorsHeader(reserved, {}).status().code(), StatusCode::kInvalidArgument);
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTempDir("drover_safetensors_");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
  }
  void TearDown() override { (void)RemoveAll(dir_); }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    return names;
  }
  std::string dir_;
};

TEST_F(SafetensorsFileTest, FileIsTheHeaderThenEveryTensorsFloats) {
  const std::string path = dir_ + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, TwoTensors(), {{"format", "pt"}}).ok());
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  const size_t data_at = 8 + HeaderLength(*bytes);
  ASSERT_EQ(bytes->size(), data_at + 9 * sizeof(float));
  float data[9];
  std::memcpy(data, bytes->data() + data_at, sizeof(data));
  const float want[9] = {1, 2, 3, 4, 5, 6, -1, 0.5f, 7};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(data[i], want[i]) << i;
  EXPECT_EQ(Names(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsFileTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string path = dir_ + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, TwoTensors(), {}).ok());
  auto before = ReadFileToString(path);
  ASSERT_TRUE(before.ok());
  testing::FaultInjectionFileSystem faulty(FileSystem::Default());
  faulty.FailNth(testing::FaultInjectionFileSystem::Op::kAppend, 2, ENOSPC);
  auto changed = TwoTensors();
  changed[0].data[0] = 42;
  Status st = WriteSafetensors(path, changed, {}, &faulty);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(*ReadFileToString(path), *before);
  EXPECT_EQ(Names(), std::vector<std::string>{"m.safetensors"});
}

}  // namespace
}  // namespace drover::engine
