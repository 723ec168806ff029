#include "worker/log_shipper.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace drover {
namespace {

class LogShipperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("drover_logship_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "rank-0.log").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Append(const std::string& s) { std::ofstream(path_, std::ios::app) << s; }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(LogShipperTest, ShipsNewBytesWithTheirOffsets) {
  std::vector<v1::AppendLogsRequest> sent;
  LogShipper shipper([&](const v1::AppendLogsRequest& r) {
    sent.push_back(r);
    return OkStatus();
  });
  TrainerKey key{"j-1", 3, 1};
  Append("hello ");
  shipper.Add(key, path_);
  EXPECT_EQ(shipper.ShipOnce(), 6u);
  Append("world\n");
  EXPECT_EQ(shipper.ShipOnce(), 6u);
  EXPECT_EQ(shipper.ShipOnce(), 0u);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].job_id(), "j-1");
  EXPECT_EQ(sent[0].attempt(), 3);
  EXPECT_EQ(sent[0].rank(), 1);
  EXPECT_EQ(sent[0].offset(), 0);
  EXPECT_EQ(sent[0].data(), "hello ");
  EXPECT_EQ(sent[1].offset(), 6);
  EXPECT_EQ(sent[1].data(), "world\n");
}

TEST_F(LogShipperTest, FailedSendIsRetriedFromTheSameOffset) {
  bool fail = true;
  std::vector<v1::AppendLogsRequest> sent;
  LogShipper shipper([&](const v1::AppendLogsRequest& r) {
    sent.push_back(r);
    return fail ? UnavailableError("down") : OkStatus();
  });
  TrainerKey key{"j-1", 1, 0};
  Append("abc");
  shipper.Add(key, path_);
  EXPECT_EQ(shipper.ShipOnce(), 0u);
  EXPECT_EQ(shipper.ShippedOffset(key), 0);
  fail = false;
  Append("def");
  EXPECT_EQ(shipper.ShipOnce(), 6u);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].offset(), 0);
  EXPECT_EQ(sent[1].data(), "abcdef");
}

TEST_F(LogShipperTest, LargeFileGoesInChunksAndFinishedFileIsDropped) {
  std::string all;
  LogShipper shipper(
      [&](const v1::AppendLogsRequest& r) {
        EXPECT_EQ(r.offset(), static_cast<int64_t>(all.size()));
        all += r.data();
        return OkStatus();
      },
      200, /*max_chunk=*/1000);
  std::string big(4500, 'x');
  Append(big);
  TrainerKey key{"j-2", 1, 0};
  shipper.Add(key, path_);
  shipper.Finish(key);
  EXPECT_EQ(shipper.ShipOnce(), 4500u);
  EXPECT_EQ(all, big);
  EXPECT_EQ(shipper.ShippedOffset(key), -1);  // dropped after the tail went out
}

TEST_F(LogShipperTest, BackgroundThreadShipsWithoutBeingAsked) {
  std::mutex mu;
  std::string got;
  LogShipper shipper(
      [&](const v1::AppendLogsRequest& r) {
        std::lock_guard<std::mutex> lock(mu);
        got += r.data();
        return OkStatus();
      },
      /*poll_ms=*/10);
  Append("line\n");
  shipper.Add(TrainerKey{"j-3", 1, 0}, path_);
  shipper.Start();
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (got == "line\n") break;
    }
    usleep(10000);
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(got, "line\n");
}

}  // namespace
}  // namespace drover
