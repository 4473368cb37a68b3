// Reporting a long compile while it runs: with TORCH_PJRT_DEBUG on (or
// TORCH_PJRT_LOG_LEVEL=info), a compile still running after
// TORCH_PJRT_COMPILE_PROGRESS seconds gets a line on stderr, another each
// time its running time doubles, and one when it ends, each naming the
// program (op count, cache key). Off, it starts nothing: no thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace tpj::runtime {

class CompileWatch {
 public:
  // `after_s` < 0: off; 0: a line at the start of every compile. `what`
  // names the program in the lines.
  CompileWatch(double after_s, std::string what);
  ~CompileWatch();  // the compile ended (or threw): stops the watcher
  CompileWatch(const CompileWatch&) = delete;
  CompileWatch& operator=(const CompileWatch&) = delete;

 private:
  void Watch(double after_s);

  const std::string what_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool reported_ = false;  // a "still compiling" line was written
  std::thread thread_;
};

}  // namespace tpj::runtime
