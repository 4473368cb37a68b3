#include "runtime/metrics.h"

namespace tpj::runtime {

Metrics& Metrics::Get() {
  static Metrics* m = new Metrics();  // never destroyed: used from exit paths
  return *m;
}

void Metrics::Add(const std::string& counter, int64_t delta) {
  std::lock_guard<std::mutex> l(mu_);
  counters_[counter] += delta;
}

void Metrics::AddTime(const std::string& timer, double seconds) {
  if (timer == "sync" || timer == "execute_wait") RuntimeNsOfThread() += static_cast<int64_t>(seconds * 1e9);
  std::lock_guard<std::mutex> l(mu_);
  timers_[timer] += seconds;
}

int64_t& Metrics::RuntimeNsOfThread() {
  thread_local int64_t ns = 0;
  return ns;
}

void Metrics::Fallback(const std::string& op, const std::string& where) {
  std::lock_guard<std::mutex> l(mu_);
  fallbacks_[op] += 1;
  counters_["cpu_fallbacks"] += 1;
  auto& sites = fallback_sites_[op];
  auto it = sites.find(where);
  if (it != sites.end()) {
    it->second += 1;
  } else if (sites.size() < kMaxSites) {
    sites.emplace(where, 1);
  }
}

void Metrics::Recompiled(RecompileReason r) {
  std::lock_guard<std::mutex> l(mu_);
  recompiles_.push_back(std::move(r));
  counters_["recompiles"] += 1;
  if (recompiles_.size() > 1000) recompiles_.erase(recompiles_.begin());  // bounded
}

void Metrics::CompiledAt(const std::string& where) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = compile_sites_.find(where);
  if (it != compile_sites_.end()) {
    it->second += 1;
  } else if (compile_sites_.size() < kMaxCompileSites) {
    compile_sites_.emplace(where, 1);
  }
}

void Metrics::Max(const std::string& counter, int64_t value) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t& v = counters_[counter];
  if (value > v) v = value;
}

std::map<std::string, int64_t> Metrics::Counters() const {
  std::lock_guard<std::mutex> l(mu_);
  auto out = counters_;
  out["traced_ops"] = traced_ops.load();
  return out;
}

std::map<std::string, double> Metrics::Timers() const {
  std::lock_guard<std::mutex> l(mu_);
  auto out = timers_;
  out["trace"] = trace_ns.load() * 1e-9;
  return out;
}

std::map<std::string, int64_t> Metrics::Fallbacks() const {
  std::lock_guard<std::mutex> l(mu_);
  return fallbacks_;
}

std::map<std::string, std::map<std::string, int64_t>> Metrics::FallbackSites() const {
  std::lock_guard<std::mutex> l(mu_);
  return fallback_sites_;
}

std::vector<RecompileReason> Metrics::Recompiles() const {
  std::lock_guard<std::mutex> l(mu_);
  return recompiles_;
}

std::map<std::string, int64_t> Metrics::CompileSites() const {
  std::lock_guard<std::mutex> l(mu_);
  return compile_sites_;
}

void Metrics::Reset() {
  std::lock_guard<std::mutex> l(mu_);
  counters_.clear();
  timers_.clear();
  fallbacks_.clear();
  fallback_sites_.clear();
  compile_sites_.clear();
  recompiles_.clear();
  trace_ns = 0;
  traced_ops = 0;
}

}  // namespace tpj::runtime
