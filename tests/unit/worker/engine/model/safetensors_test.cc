// The safetensors writer: the header the format specifies, the data back to back after it,
// refusals of tensors it cannot describe, and atomic replacement on a failing disk. The
// reader: what the writer wrote, every 16-bit value widened exactly, and a clear DataLoss for
// a damaged header.
#include "worker/engine/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/files.h"
#include "tests/unit/common/fault_injection_fs.h"
#include "worker/engine/kernels/cpu/round.h"

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

TEST_F(SafetensorsFileTest, TheReaderReadsWhatTheWriterWrote) {
  const std::string path = dir_ + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, TwoTensors(), {{"format", "pt"}, {"n_head", "2"}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("n_head"), "2");
  ASSERT_EQ((*file)->tensors().size(), 2u);
  const SafetensorsEntry& b = (*file)->tensors().at("b.weight");
  EXPECT_EQ(b.dtype, "F32");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.numel(), 6u);
  std::vector<float> got(6);
  ASSERT_TRUE((*file)->ReadFloats("b.weight", got.data()).ok());
  EXPECT_EQ(got, TwoTensors()[0].data);
  got.resize(3);
  ASSERT_TRUE((*file)->ReadFloats("a.bias", got.data()).ok());
  EXPECT_EQ(got, TwoTensors()[1].data);
  EXPECT_EQ((*file)->ReadFloats("c", got.data()).code(), StatusCode::kNotFound);
}

// A header and data written by hand: {"x": {dtype, shape, offsets}} over `data`.
void WriteOne(const std::string& path, const std::string& dtype, std::vector<int64_t> shape,
              const std::string& data, std::string json = "") {
  if (json.empty()) {
    json =
        nlohmann::json{
            {"x", {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {0, data.size()}}}}}
            .dump();
  }
  const uint64_t n = json.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  ASSERT_TRUE(WriteFileAtomic(path, bytes + json + data).ok());
}

template <typename T>
std::string Bytes(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return s;
}

TEST_F(SafetensorsFileTest, SixteenBitAndDoubleTensorsAreReadAsFloats) {
  const std::string path = dir_ + "/m.safetensors";
  struct Case {
    const char* dtype;
    std::string data;
    std::vector<float> want;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c :
       {// 1, -2, 65504 (largest), 2^-14 (smallest normal), 2^-24 and 1023 x 2^-24
        // (subnormals), -0, inf
        Case{"F16",
             Bytes<uint16_t>({0x3C00, 0xC000, 0x7BFF, 0x0400, 0x0001, 0x03FF, 0x8000, 0x7C00}),
             {1, -2, 65504, 0x1p-14f, 0x1p-24f, 1023 * 0x1p-24f, -0.0f, inf}},
        Case{"BF16", Bytes<uint16_t>({0x3F80, 0xC0A0, 0x0001, 0xFF80}), {1, -5, 0x1p-133f, -inf}},
        Case{"F64", Bytes<double>({0.1, -3.0}), {0.1f, -3.0f}}}) {
    WriteOne(path, c.dtype, {static_cast<int64_t>(c.want.size())}, c.data);
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<float> got(c.want.size());
    ASSERT_TRUE((*file)->ReadFloats("x", got.data()).ok()) << c.dtype;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], c.want[i]) << c.dtype << " [" << i << "]";
      EXPECT_EQ(std::signbit(got[i]), std::signbit(c.want[i])) << c.dtype << " [" << i << "]";
    }
  }
  WriteOne(path, "F16", {1}, Bytes<uint16_t>({0x7E00}));
  float nan = 0;
  ASSERT_TRUE((*SafetensorsFile::Open(path))->ReadFloats("x", &nan).ok());
  EXPECT_TRUE(std::isnan(nan));
  WriteOne(path, "I32", {1}, Bytes<int32_t>({7}));
  Status st = (*SafetensorsFile::Open(path))->ReadFloats("x", &nan);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dtype I32"), std::string::npos) << st;
}

// Narrowed on the way out, read back widened: each value is what the CPU engine's rounding
// to that type gives (kernels/cpu/round.h, which the writer rounds with), over random values
// of every magnitude, the fp16 subnormals, overflows and ties included, so the bits written
// and the reader's widening agree with it exactly. (PyTorch's casts of the same tensors give
// the same bits: tests/tools/hf_gpt2_check.py's export checks, by hand.)
TEST_F(SafetensorsFileTest, SixteenBitOutputRoundsToNearestEvenAsTheEngineDoes) {
  std::mt19937 rng(17);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               1.0f + 0x1p-11f,
                               1.0f + 3 * 0x1p-11f,
                               1.0f + 0x1p-8f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               -70000.0f,
                               0x1p-24f,
                               0x1p-25f,
                               3 * 0x1p-26f,
                               0x1p-14f,
                               1e-30f,
                               3e38f,
                               std::numeric_limits<float>::infinity()};
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  for (int i = 0; i < 20000; ++i) {
    values.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), exponent(rng)));
  }
  const std::string path = dir_ + "/n.safetensors";
  for (const SafetensorsDtype dtype : {SafetensorsDtype::kBF16, SafetensorsDtype::kF16}) {
    const bool bf16 = dtype == SafetensorsDtype::kBF16;
    ASSERT_TRUE(WriteSafetensors(path, {{"v", {static_cast<int64_t>(values.size())}, values}}, {},
                                 FileSystem::Default(), dtype)
                    .ok());
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->tensors().at("v").dtype, bf16 ? "BF16" : "F16");
    EXPECT_EQ((*file)->tensors().at("v").end, 2 * values.size());
    std::vector<float> got(values.size());
    ASSERT_TRUE((*file)->ReadFloats("v", got.data()).ok());
    std::vector<float> want = values;
    bf16 ? cpu::RoundToBf16(want.data(), want.size()) : cpu::RoundToFp16(want.data(), want.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << (bf16 ? "bf16" : "fp16") << " of " << values[i] << ": got " << got[i] << ", want "
          << want[i];
    }
  }
  // A NaN stays a NaN.
  ASSERT_TRUE(WriteSafetensors(path, {{"v", {1}, {std::nanf("")}}}, {}, FileSystem::Default(),
                               SafetensorsDtype::kF16)
                  .ok());
  float nan = 0;
  ASSERT_TRUE((*SafetensorsFile::Open(path))->ReadFloats("v", &nan).ok());
  EXPECT_TRUE(std::isnan(nan));
}

TEST_F(SafetensorsFileTest, ADamagedHeaderIsDataLossNamingWhatIsWrong) {
  const std::string path = dir_ + "/m.safetensors";
  const std::string four = Bytes<float>({1, 2, 3, 4});
  struct Case {
    std::string json;
    const char* says;
  };
  for (const Case& c :
       {Case{R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 20]}})",
             "offsets outside the file's 16 bytes"},
        Case{R"({"x": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})",
             "holds 16 bytes, its shape and dtype F32 need 20"},
        Case{R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], )"
             R"("data_offsets": [0, 16]}})",
             "F32 need over 2^64"},
        Case{R"({"x": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})",
             "no shape of non-negative integers"},
        Case{R"({"x": {"shape": [4], "data_offsets": [0, 16]}})", "'x' has no dtype"},
        Case{R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
             R"("y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
             "two tensors share the bytes from 4"},
        Case{R"({"x": )", "not a JSON object"}, Case{R"([1, 2])", "not a JSON object"}}) {
    WriteOne(path, "", {}, four, c.json);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.json;
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << c.json;
    EXPECT_NE(file.status().message().find(c.says), std::string::npos) << file.status();
    EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status();
  }
  const uint64_t huge = uint64_t{1} << 40;
  ASSERT_TRUE(
      WriteFileAtomic(path, std::string(reinterpret_cast<const char*>(&huge), 8) + "{}").ok());
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("not a safetensors file"), std::string::npos)
      << file.status();
  EXPECT_FALSE(LooksLikeSafetensors(std::string(reinterpret_cast<const char*>(&huge), 8) + "{"));
  EXPECT_EQ(SafetensorsFile::Open(dir_ + "/absent").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace drover::engine
