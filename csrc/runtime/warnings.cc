#include "runtime/warnings.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>

namespace tpj::runtime {
namespace {

struct State {
  std::mutex mu;
  std::vector<std::string> queue;
  std::atomic<bool> queued{false};
  std::function<void(const std::string&)> sink;
};

State& Get() {
  static State* s = new State();  // never destroyed: may be used during exit
  return *s;
}

}  // namespace

void Warn(std::string message) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  s.queue.push_back(std::move(message));
  s.queued.store(true, std::memory_order_release);
}

bool WarningsQueued() { return Get().queued.load(std::memory_order_acquire); }

void FlushWarnings() {
  State& s = Get();
  std::vector<std::string> queue;
  std::function<void(const std::string&)> sink;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.queue.empty()) return;
    queue.swap(s.queue);
    s.queued.store(false, std::memory_order_release);
    sink = s.sink;
  }
  for (const std::string& m : queue) {
    if (sink) {
      sink(m);
    } else {
      std::fprintf(stderr, "torch_pjrt: warning: %s\n", m.c_str());
    }
  }
}

void SetWarningSink(std::function<void(const std::string&)> sink) {
  State& s = Get();
  std::lock_guard<std::mutex> l(s.mu);
  s.sink = std::move(sink);
}

}  // namespace tpj::runtime
