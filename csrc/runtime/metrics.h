// Counters and timers of the runtime: what compiled, what was served from the
// caches, what ran, what fell back to the CPU, and why graphs recompiled.
// Thread-safe; every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tpj::runtime {

struct RecompileReason {
  uint64_t structure = 0;  // ir::ShapeBlindHash of the graph
  std::string why;         // "input 2 changed from float32[4,8] to float32[5,8]" etc.
  std::string where;       // Python location of the sync, when known
};

class Metrics {
 public:
  static Metrics& Get();

  void Add(const std::string& counter, int64_t delta = 1);
  void AddTime(const std::string& timer, double seconds);
  // A counter that keeps the largest value it was given (e.g. the most memory
  // one compiled program plans for).
  void Max(const std::string& counter, int64_t value);
  // One CPU fallback of `op`, triggered at Python location `where` (""
  // when unknown). Up to kMaxSites locations are kept per op.
  void Fallback(const std::string& op, const std::string& where);
  void Recompiled(RecompileReason r);
  // One program compiled (not served by a cache) for a sync at Python
  // location `where` ("" when unknown): a new graph or a recompile. Up to
  // kMaxCompileSites locations are kept.
  void CompiledAt(const std::string& where);

  std::map<std::string, int64_t> Counters() const;   // includes "cpu_fallbacks" and "traced_ops"
  std::map<std::string, double> Timers() const;      // seconds
  std::map<std::string, int64_t> Fallbacks() const;  // op -> count
  std::map<std::string, std::map<std::string, int64_t>> FallbackSites() const;  // op -> where -> count
  static constexpr size_t kMaxSites = 16;
  std::vector<RecompileReason> Recompiles() const;
  std::map<std::string, int64_t> CompileSites() const;  // where -> programs compiled there
  static constexpr size_t kMaxCompileSites = 64;
  void Reset();

  // Time spent tracing (inside op lowerings), accumulated cheaply.
  std::atomic<int64_t> trace_ns{0};
  // This thread's nanoseconds in syncs and waits ("sync" and "execute_wait"
  // of AddTime): an op that reads a value (its sync, compile and wait) is
  // not tracing, and TraceScope leaves that time out of trace_ns.
  static int64_t& RuntimeNsOfThread();
  std::atomic<int64_t> traced_ops{0};

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  std::map<std::string, double> timers_;
  std::map<std::string, int64_t> fallbacks_;
  std::map<std::string, std::map<std::string, int64_t>> fallback_sites_;
  std::vector<RecompileReason> recompiles_;
  std::map<std::string, int64_t> compile_sites_;
};

}  // namespace tpj::runtime
