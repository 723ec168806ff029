#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace drover {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusTest, OkIsDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = NotFoundError("no such job j-1");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: no such job j-1");
  EXPECT_EQ(s.WithContext("load").message(), "load: no such job j-1");
}

TEST(StatusTest, StatusOrPropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(StatusTest, ErrnoTranslatesToCodes) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write x").code(), StatusCode::kResourceExhausted);
  EXPECT_NE(ErrnoToStatus(ENOENT, "open x").message().find("open x: "), std::string::npos);
}

TEST(StatusDeathTest, CheckAbortsWithLocation) {
  EXPECT_DEATH(DROVER_CHECK(1 + 1 == 3), "status_test.cc:[0-9]+: CHECK failed: 1 \\+ 1 == 3");
}

}  // namespace
}  // namespace drover
