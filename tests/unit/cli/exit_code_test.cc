// cli/exit_code.h: which failures to use a named file are the user's to fix (2).
#include "cli/exit_code.h"

#include <gtest/gtest.h>

namespace drover::cli {
namespace {

TEST(ExitCodeForInputTest, AMissingForeignOrCorruptFileIsBadInput) {
  EXPECT_EQ(ExitCodeForInput(OkStatus()), 0);
  EXPECT_EQ(ExitCodeForInput(NotFoundError("open m.bin: No such file or directory")), 2);
  EXPECT_EQ(ExitCodeForInput(InvalidArgumentError("bad header")), 2);
  EXPECT_EQ(ExitCodeForInput(FailedPreconditionError("open m.bin: Permission denied")), 2);
  EXPECT_EQ(ExitCodeForInput(DataLossError("m.bin: not an llm.c model file")), 2);
}

TEST(ExitCodeForInputTest, AMachineThatFailedIsARuntimeFailure) {
  EXPECT_EQ(ExitCodeForInput(ResourceExhaustedError("out of memory")), 1);
  EXPECT_EQ(ExitCodeForInput(InternalError("bug")), 1);
  EXPECT_EQ(ExitCodeForInput(UnavailableError("gone")), 1);
}

}  // namespace
}  // namespace drover::cli
