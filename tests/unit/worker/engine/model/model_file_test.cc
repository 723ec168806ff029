// llm.c model files: round trip, the on-disk order, and every corrupt-file error.
#include "worker/engine/model/model_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tests/unit/common/fault_injection_fs.h"

namespace drover::engine {
namespace {

namespace fs = std::filesystem;

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("drover_model_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const char* name) const { return (dir_ / name).string(); }
  static std::vector<char> Read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
  }
  static void Write(const std::string& p, const std::vector<char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), bytes.size());
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    return names;
  }
  fs::path dir_;
};

const GptConfig kConfig{8, 37, 128, 2, 2, 16};

TEST_F(ModelFileTest, RoundTripRestoresConfigAndEveryParameter) {
  Gpt m(kConfig);
  m.InitRandom(5);
  ASSERT_TRUE(SaveModelFile(m, Path("m.bin")).ok());
  EXPECT_EQ(Names(), std::vector<std::string>{"m.bin"});  // no temporary file left
  auto loaded = LoadModelFile(Path("m.bin"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config(), kConfig);
  EXPECT_EQ(std::memcmp((*loaded)->params(), m.params(), sizeof(float) * m.num_params()), 0);
  auto cfg = ReadModelFileConfig(Path("m.bin"));
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(*cfg, kConfig);
}

TEST_F(ModelFileTest, WritesLlmcHeaderAndTensorMajorOrder) {
  Gpt m(kConfig);
  for (size_t i = 0; i < m.num_params(); i++) m.params()[i] = static_cast<float>(i);
  ASSERT_TRUE(SaveModelFile(m, Path("m.bin")).ok());
  const std::vector<char> bytes = Read(Path("m.bin"));
  ASSERT_EQ(bytes.size(), 1024 + 4 * m.num_params());
  const int32_t* h = reinterpret_cast<const int32_t*>(bytes.data());
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[2], 8);
  EXPECT_EQ(h[3], 37);
  EXPECT_EQ(h[4], 2);
  EXPECT_EQ(h[5], 2);
  EXPECT_EQ(h[6], 16);
  EXPECT_EQ(h[7], 128);
  for (int i = 8; i < 256; i++) ASSERT_EQ(h[i], 0);
  const float* p = reinterpret_cast<const float*>(bytes.data() + 1024);
  // wte (128*16), wpe (8*16), then ln1w of layer 0 and of layer 1, then ln1b ...
  const size_t after_wpe = 128 * 16 + 8 * 16;
  EXPECT_EQ(p[0], m.params()[m.FindTensor("wte")->offset]);
  EXPECT_EQ(p[after_wpe], m.params()[m.FindTensor("h.0.ln1w")->offset]);
  EXPECT_EQ(p[after_wpe + 16], m.params()[m.FindTensor("h.1.ln1w")->offset]);
  EXPECT_EQ(p[after_wpe + 32], m.params()[m.FindTensor("h.0.ln1b")->offset]);
  EXPECT_EQ(p[after_wpe + 64], m.params()[m.FindTensor("h.0.qkvw")->offset]);
  EXPECT_EQ(p[m.num_params() - 32], m.params()[m.FindTensor("lnfw")->offset]);
}

TEST_F(ModelFileTest, CorruptFilesAreNamedErrors) {
  Gpt m(kConfig);
  m.InitRandom(1);
  ASSERT_TRUE(SaveModelFile(m, Path("good.bin")).ok());
  const std::vector<char> good = Read(Path("good.bin"));
  auto expect_error = [&](const char* name, std::vector<char> bytes, StatusCode code,
                          const char* needle) {
    Write(Path(name), bytes);
    auto r = LoadModelFile(Path(name));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(name), std::string::npos) << "names the file";
  };
  auto with_header = [&](int index, int32_t value) {
    std::vector<char> b = good;
    std::memcpy(b.data() + 4 * index, &value, 4);
    return b;
  };
  expect_error("magic.bin", with_header(0, 20240520), StatusCode::kDataLoss, "magic");
  expect_error("version.bin", with_header(1, 5), StatusCode::kInvalidArgument, "version 5");
  expect_error("heads.bin", with_header(5, 3), StatusCode::kInvalidArgument, "num_heads");
  expect_error("layers.bin", with_header(4, -1), StatusCode::kInvalidArgument, "num_layers");
  expect_error("header.bin", std::vector<char>(good.begin(), good.begin() + 100),
               StatusCode::kDataLoss, "header");
  expect_error("short.bin", std::vector<char>(good.begin(), good.end() - 4), StatusCode::kDataLoss,
               "file size");
  std::vector<char> longer = good;
  longer.push_back(0);
  expect_error("long.bin", longer, StatusCode::kDataLoss, "file size");
  auto missing = LoadModelFile(Path("missing.bin"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
}

// Whatever step of the save fails (a full disk mid-parameters, a short write, EIO on fsync,
// a failed rename), the error names the file, the old model is untouched and no temporary
// file is left holding the space.
TEST_F(ModelFileTest, NonFiniteWeightsAreRefusedNamingTheTensor) {
  Gpt m(kConfig);
  m.InitRandom(5);
  const TensorInfo* fcb = m.FindTensor("h.1.fcb");
  ASSERT_NE(fcb, nullptr);
  m.params()[fcb->offset + 3] = std::nanf("");
  ASSERT_TRUE(SaveModelFile(m, Path("nan.bin")).ok());
  auto loaded = LoadModelFile(Path("nan.bin"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(loaded.status().message(),
            Path("nan.bin") +
                ": the model file has non-finite weights in tensor h.1.fcb "
                "(element 3 is nan)");
  m.params()[fcb->offset + 3] = 0;
  m.params()[0] = -INFINITY;
  ASSERT_TRUE(SaveModelFile(m, Path("inf.bin")).ok());
  loaded = LoadModelFile(Path("inf.bin"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("tensor wte (element 0 is inf)"), std::string::npos)
      << loaded.status();
}

TEST_F(ModelFileTest, FailedSaveRemovesItsTemporaryFileAndKeepsTheOldModel) {
  using Op = testing::FaultInjectionFileSystem::Op;
  Gpt old_model(kConfig), new_model(kConfig);
  old_model.InitRandom(1);
  new_model.InitRandom(2);
  ASSERT_TRUE(SaveModelFile(old_model, Path("m.bin")).ok());
  const std::vector<char> old_bytes = Read(Path("m.bin"));
  struct Case {
    const char* what;
    std::function<void(testing::FaultInjectionFileSystem&)> inject;
  };
  const Case cases[] = {
      {"ENOSPC on the 3rd write", [](auto& f) { f.FailNth(Op::kAppend, 3, ENOSPC); }},
      {"short 5th write", [](auto& f) { f.ShortWriteNth(5, ENOSPC); }},
      {"EIO on fsync", [](auto& f) { f.FailNth(Op::kSync, 1, EIO); }},
      {"EIO on close", [](auto& f) { f.FailNth(Op::kClose, 1, EIO); }},
      {"failed rename", [](auto& f) { f.FailNth(Op::kRename, 1, EIO); }},
  };
  for (const Case& c : cases) {
    testing::FaultInjectionFileSystem fake(FileSystem::Default());
    c.inject(fake);
    Status st = SaveModelFile(new_model, Path("m.bin"), &fake);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(Path("m.bin")), std::string::npos) << c.what << ": " << st;
    EXPECT_EQ(Names(), std::vector<std::string>{"m.bin"}) << c.what;
    EXPECT_TRUE(Read(Path("m.bin")) == old_bytes) << c.what;
  }
}

// A saved model survives a crash right after SaveModelFile returns: its data was fsynced
// and so was the directory holding its new name.
TEST_F(ModelFileTest, SavedModelSurvivesACrash) {
  Gpt m(kConfig);
  m.InitRandom(3);
  testing::FaultInjectionFileSystem fake(FileSystem::Default());
  ASSERT_TRUE(SaveModelFile(m, Path("m.bin"), &fake).ok());
  fake.DropUnsyncedData();
  auto loaded = LoadModelFile(Path("m.bin"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(std::memcmp((*loaded)->params(), m.params(), sizeof(float) * m.num_params()), 0);
}

}  // namespace
}  // namespace drover::engine
