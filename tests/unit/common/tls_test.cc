#include "common/tls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace drover {
namespace {

using ::testing::HasSubstr;

// PEM-shaped files: LoadTlsCredentials checks the kind of block, gRPC checks the rest.
class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tls_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/ca.pem")
        << "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n";
    std::ofstream(dir_ + "/node.pem")
        << "-----BEGIN CERTIFICATE-----\nnode\n-----END CERTIFICATE-----\n";
    std::ofstream(dir_ + "/node.key")
        << "-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string F(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST_F(TlsFilesTest, NoFlagMeansPlaintext) {
  auto creds = LoadTlsCredentials({}, CertNeed::kRequired);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_FALSE(creds->enabled);
}

TEST_F(TlsFilesTest, ReadsAllThreeFiles) {
  auto creds = LoadTlsCredentials({F("node.pem"), F("node.key"), F("ca.pem")}, CertNeed::kRequired);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_TRUE(creds->enabled);
  EXPECT_THAT(creds->cert_pem, HasSubstr("node"));
  EXPECT_THAT(creds->key_pem, HasSubstr("PRIVATE KEY"));
  EXPECT_THAT(creds->ca_pem, HasSubstr("ca"));
}

TEST_F(TlsFilesTest, CaAloneIsEnoughWhereTheCertificateIsOptional) {
  auto creds = LoadTlsCredentials({"", "", F("ca.pem")}, CertNeed::kOptional);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_TRUE(creds->enabled);
  EXPECT_TRUE(creds->cert_pem.empty());
  auto required = LoadTlsCredentials({"", "", F("ca.pem")}, CertNeed::kRequired);
  ASSERT_FALSE(required.ok());
  EXPECT_THAT(required.status().message(), HasSubstr("--tls-cert and --tls-key are missing"));
}

TEST_F(TlsFilesTest, EachMissingPieceIsNamed) {
  auto no_ca = LoadTlsCredentials({F("node.pem"), F("node.key"), ""}, CertNeed::kRequired);
  ASSERT_FALSE(no_ca.ok());
  EXPECT_EQ(no_ca.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_ca.status().message(), HasSubstr("--tls-ca is missing"));
  auto no_key = LoadTlsCredentials({F("node.pem"), "", F("ca.pem")}, CertNeed::kOptional);
  ASSERT_FALSE(no_key.ok());
  EXPECT_THAT(no_key.status().message(), HasSubstr("--tls-cert is given without --tls-key"));
  auto missing = LoadTlsCredentials({"", "", F("nope.pem")}, CertNeed::kOptional);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-ca '" + F("nope.pem") + "'"));
}

TEST_F(TlsFilesTest, AKeyGivenAsTheCertificateIsCaught) {
  auto swapped =
      LoadTlsCredentials({F("node.key"), F("node.pem"), F("ca.pem")}, CertNeed::kRequired);
  ASSERT_FALSE(swapped.ok());
  EXPECT_THAT(swapped.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(swapped.status().message(), HasSubstr("holds no PEM CERTIFICATE"));
}

TEST(AddressTest, HostOfAddressDropsPortAndBrackets) {
  EXPECT_EQ(HostOfAddress("127.0.0.1:7600"), "127.0.0.1");
  EXPECT_EQ(HostOfAddress("[::1]:7600"), "::1");
  EXPECT_EQ(HostOfAddress("node7.cluster:7600"), "node7.cluster");
}

TEST(AddressTest, OnlyLoopbackAddressesAreLoopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.8.9.10"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
  EXPECT_FALSE(IsLoopbackHost("127.example.com"));
  EXPECT_FALSE(IsLoopbackHost(""));
}

}  // namespace
}  // namespace drover
