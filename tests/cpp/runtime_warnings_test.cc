// Warnings the runtime gives instead of failing (runtime/warnings.h): queued
// anywhere, delivered once each by FlushWarnings; and the compile cache's
// refusal of a directory it cannot use, which the runtime turns into one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "pjrt/error.h"
#include "runtime/cache.h"
#include "runtime/warnings.h"

namespace tpj::runtime {
namespace {

class Sink {
 public:
  Sink() {
    SetWarningSink([this](const std::string& m) { seen.push_back(m); });
  }
  ~Sink() { SetWarningSink(nullptr); }
  std::vector<std::string> seen;
};

TEST(Warnings, FlushDeliversEachQueuedWarningOnceInOrder) {
  Sink sink;
  Warn("first");
  Warn("second");
  EXPECT_TRUE(sink.seen.empty());  // queued, not delivered where raised
  FlushWarnings();
  FlushWarnings();
  EXPECT_EQ(sink.seen, (std::vector<std::string>{"first", "second"}));
}

TEST(Warnings, ASinkErrorPropagatesAndTheQueueIsNotRedelivered) {
  SetWarningSink([](const std::string& m) { throw std::runtime_error(m); });
  Warn("as error");
  Warn("dropped");
  EXPECT_THROW(FlushWarnings(), std::runtime_error);
  Sink sink;
  FlushWarnings();
  EXPECT_TRUE(sink.seen.empty());
}

TEST(CompileCache, ARegularFileIsNotACacheDirectory) {
  char path[] = "/tmp/tpj_cache_fileXXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  CompileCache cache;
  EXPECT_THROW(cache.SetDiskDir(path, false, "fp"), pjrt::Error);
  EXPECT_THROW(cache.SetDiskDir(path, true, "fp"), pjrt::Error);
  EXPECT_EQ(cache.disk_dir(), "");
  std::remove(path);
}

}  // namespace
}  // namespace tpj::runtime
