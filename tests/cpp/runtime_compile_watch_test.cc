// CompileWatch: the lines it writes for a compile, and none when off.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "runtime/compile_watch.h"

namespace tpj::runtime {
namespace {

std::string Watched(double after_s, std::chrono::milliseconds compile) {
  testing::internal::CaptureStderr();
  {
    CompileWatch watch(after_s, "program P");
    std::this_thread::sleep_for(compile);
  }
  return testing::internal::GetCapturedStderr();
}

TEST(CompileWatch, OffWritesNothing) {
  EXPECT_EQ(Watched(-1, std::chrono::milliseconds(30)), "");
}

TEST(CompileWatch, ShorterThanTheThresholdWritesNothing) {
  EXPECT_EQ(Watched(10, std::chrono::milliseconds(5)), "");
}

TEST(CompileWatch, ZeroReportsTheStartAndTheEnd) {
  const std::string out = Watched(0, std::chrono::milliseconds(0));
  EXPECT_EQ(out.rfind("torch_pjrt: compiling program P\ntorch_pjrt: compiled program P in ", 0), 0u) << out;
}

TEST(CompileWatch, ALongCompileIsReportedWhileItRunsAndWhenItEnds) {
  const std::string out = Watched(0.02, std::chrono::milliseconds(100));
  // Reports at about 0.02, 0.04 and 0.08 s, then the end.
  const size_t still = out.find("torch_pjrt: still compiling program P after ");
  const size_t end = out.find("torch_pjrt: compiled program P in ");
  EXPECT_NE(still, std::string::npos) << out;
  EXPECT_NE(end, std::string::npos) << out;
  EXPECT_LT(still, end) << out;
  EXPECT_EQ(out.find("compiling program P\n"), std::string::npos) << out;  // no start line above 0
}

}  // namespace
}  // namespace tpj::runtime
