#include "runtime/compile_watch.h"

#include <cstdio>

namespace tpj::runtime {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CompileWatch::CompileWatch(double after_s, std::string what)
    : what_(std::move(what)), start_(std::chrono::steady_clock::now()) {
  if (after_s < 0) return;
  if (after_s == 0) {  // every compile, from its start (written here: no race with a fast compile)
    std::fprintf(stderr, "torch_pjrt: compiling %s\n", what_.c_str());
    reported_ = true;
  }
  const double first = after_s > 0 ? after_s : 1;
  thread_ = std::thread([this, first] { Watch(first); });
}

CompileWatch::~CompileWatch() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (reported_) std::fprintf(stderr, "torch_pjrt: compiled %s in %.2f s\n", what_.c_str(), Since(start_));
}

void CompileWatch::Watch(double after_s) {
  std::unique_lock<std::mutex> l(mu_);
  // Sleeps until the next report is due or the compile ends, whichever is first.
  for (double next = after_s;; next *= 2) {
    const auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(next));
    if (cv_.wait_until(l, due, [this] { return done_; })) return;
    std::fprintf(stderr, "torch_pjrt: still compiling %s after %.2f s\n", what_.c_str(), Since(start_));
    reported_ = true;
  }
}

}  // namespace tpj::runtime
