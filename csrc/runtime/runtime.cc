// The runtime instance: configuration, plugin and client, seeds, replicas,
// and the trace scope every lowering holds.
#include "runtime/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>

#include "pjrt/discovery.h"
#include "pjrt/error.h"
#include "pjrt/plugin.h"
#include "runtime/program.h"
#include "runtime/warnings.h"

namespace tpj::runtime {
namespace {

struct Configuration {
  std::mutex mu;
  std::vector<std::string> search_dirs;
  std::vector<pjrt::NamedOption> overrides;
};

Configuration& Config() {
  static Configuration* c = new Configuration();  // never destroyed: read from exit paths
  return *c;
}

// Creates `dir` and its parents; whether it is now a directory we can write.
bool MakeDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return std::filesystem::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0;
}

std::atomic<Runtime*>& Instance() {
  static std::atomic<Runtime*> r{nullptr};
  return r;
}

std::mutex& LocationMutex() {
  static std::mutex mu;
  return mu;
}

std::function<std::string()>& LocationFn() {
  static std::function<std::string()> f;
  return f;
}

pjrt::WaitCheck& WaitCheckSlot() {
  static pjrt::WaitCheck f;
  return f;
}

pjrt::WaitCheck& CompileInterruptCheckSlot() {
  static pjrt::WaitCheck f;
  return f;
}

std::function<std::shared_ptr<void>()>& WaitScopeSlot() {
  static std::function<std::shared_ptr<void>()> f;
  return f;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Storage::~Storage() {
  // volatile: a store into an object that is being destroyed is otherwise
  // one the compiler may drop
  *static_cast<volatile uint64_t*>(&tag_) = 0;
  // In a forked child the runtime is unusable (and its lock may be held by a
  // thread that did not survive the fork): drop the storage without it.
  if (pjrt::InForkedChild()) return;
  // Under the runtime lock: a sync may be updating this storage right now.
  if (Runtime::Initialized()) Runtime::Get().Unregister(this);
}

void Runtime::Configure(std::vector<std::string> search_dirs, std::vector<pjrt::NamedOption> overrides) {
  Configuration& c = Config();
  std::lock_guard<std::mutex> l(c.mu);
  if (Instance().load() != nullptr) {
    throw pjrt::Error(pjrt::Code::kFailedPrecondition,
                      "torch_pjrt is already initialized: configure it before the first pjrt tensor");
  }
  c.search_dirs = std::move(search_dirs);
  c.overrides = std::move(overrides);
}

bool Runtime::Initialized() { return Instance().load(std::memory_order_acquire) != nullptr; }

Runtime& Runtime::Get() {
  pjrt::Plugin::RefuseInForkedChild();
  Runtime* r = Instance().load(std::memory_order_acquire);
  if (r) return *r;
  {
    std::lock_guard<std::mutex> l(Config().mu);
    if (Instance().load(std::memory_order_relaxed) == nullptr) {
      auto fresh = std::unique_ptr<Runtime>(new Runtime());
      fresh->Init();  // a failure leaves no instance: the next use tries again
      Instance().store(fresh.release(), std::memory_order_release);  // lives for the process
    }
  }
  FlushWarnings();  // Init's, outside the lock: the sink may take the GIL
  return *Instance().load(std::memory_order_acquire);
}

void Runtime::Init() {
  options_ = Options::FromEnvironment();
  const Configuration& c = Config();
  pjrt::PluginChoice choice = ChoosePlugin(options_, "", c.search_dirs);
  plugin_path_ = choice.path;
  std::vector<pjrt::NamedOption> client_options = ClientOptions(options_, choice);
  for (const pjrt::NamedOption& o : c.overrides) {
    std::erase_if(client_options, [&](const pjrt::NamedOption& e) { return e.name == o.name; });
    client_options.push_back(o);
  }
  ApplyPluginLogLevel();
  auto plugin = pjrt::Plugin::Load(choice.path);
  client_ = pjrt::Client::Create(plugin, client_options);
  if (client_->addressable_device_ids().empty()) {
    throw pjrt::Error(pjrt::Code::kNotFound, "the PJRT plugin '" + choice.path + "' has no addressable devices");
  }
  traces_.resize(client_->addressable_device_ids().size());
  for (Trace& t : traces_) ResetTrace(t);
  fingerprint_ = CompileCache::Fingerprint(*plugin, client_->platform_version(), options_.xla_flags);
  // An unusable directory costs a warning, never the run.
  if (!options_.cache_dir.empty()) {
    try {
      cache_.SetDiskDir(options_.cache_dir, false, fingerprint_);
    } catch (const pjrt::Error& e) {
      Warn("TORCH_PJRT_CACHE_DIR='" + options_.cache_dir + "' cannot be used (" + e.what() +
           "): compiled programs are cached in memory only");
    }
  }
  if (!options_.dump_dir.empty() && !MakeDirectories(options_.dump_dir)) {
    Warn("TORCH_PJRT_DUMP_DIR='" + options_.dump_dir + "' cannot be created or written: programs are not dumped");
    options_.dump_dir.clear();
  }
}

void Runtime::InitializeDiskCache(const std::string& dir, bool readonly) {
  cache_.SetDiskDir(dir, readonly, fingerprint_);
  FlushWarnings();
}

pjrt::BufferBytes Runtime::LiveBytes(int device) const { return pjrt::LiveBufferBytes(global_id(device)); }

void Runtime::ResetPeakBytes(int device) { pjrt::ResetPeakBufferBytes(global_id(device)); }

std::string Runtime::DeviceIndexError(int device) const {
  std::string m = "pjrt device index " + std::to_string(device) + " is out of range: there are " +
                  std::to_string(device_count()) + " pjrt device(s)";
  if (options_.world_size > 1) {
    m += " in this process (one of " + std::to_string(options_.world_size) +
         " in the job, each with its own devices numbered from 0: use torch.device(\"pjrt\"), not the process's "
         "LOCAL_RANK as a device index)";
  }
  return m;
}

void Runtime::CheckDevice(int device) const {
  if (device < 0 || device >= device_count()) throw pjrt::Error(pjrt::Code::kOutOfRange, DeviceIndexError(device));
}

int Runtime::global_id(int device) const {
  CheckDevice(device);
  return client_->addressable_device_ids()[static_cast<size_t>(device)];
}

void Runtime::SetReplicas(int n) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (n < 1 || n > device_count()) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "cannot replicate over " + std::to_string(n) +
                                                        " devices: this process has " +
                                                        std::to_string(device_count()) + " pjrt device(s)");
  }
  Trace& t = traces_.at(0);
  if (t.replicas == n) return;
  if (n > 1 && !t.mesh.empty()) {
    throw pjrt::Error(pjrt::Code::kFailedPrecondition,
                      "torch_pjrt.replicated() cannot start while pjrt:0 runs an SPMD mesh (torch_pjrt.spmd)");
  }
  ClearCompileInterrupted();
  try {
    SyncDevice(0);
  } catch (...) {
    // Ctrl-C during the compile: no switch, and the work stays pending (a
    // reset would leave its storages pending in no trace: stale values).
    if (CompileInterrupted()) throw;
    t.replicas = n;  // switch anyway: leaving the old mode on would surprise more
    ResetTrace(t);
    throw;
  }
  t.replicas = n;
  ResetTrace(t);  // a trace belongs to one replica count
}

void Runtime::ManualSeed(int device, uint64_t seed) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  global_id(device);
  Trace& t = traces_[device];
  t.seed = seed;
  t.rng_buffer.reset();
  t.rng_base = {seed, 0};
  t.rng_drawn = 0;
  t.rng_pending = false;
  ++t.rng_resets;
}

uint64_t Runtime::InitialSeed(int device) const {
  global_id(device);
  return traces_[device].seed;
}

std::array<uint64_t, 2> Runtime::RngState(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  global_id(device);
  const Trace& t = traces_[device];
  return {t.rng_base[0], t.rng_base[1] + t.rng_drawn};
}

void Runtime::SetRngState(int device, const std::array<uint64_t, 2>& state) {
  DeviceBuffer buffer = Upload(state.data(), ir::DType::U64, {2}, device);
  std::lock_guard<std::recursive_mutex> l(mu_);
  Trace& t = traces_[device];
  t.rng_buffer = std::move(buffer);
  t.rng_base = state;
  t.rng_drawn = 0;
  t.rng_pending = false;
  ++t.rng_resets;
}

void Runtime::SetWaitCheck(pjrt::WaitCheck check) {
  std::lock_guard<std::mutex> l(LocationMutex());
  WaitCheckSlot() = std::move(check);
}

pjrt::WaitCheck Runtime::WaitCheckFn() {
  std::lock_guard<std::mutex> l(LocationMutex());
  return WaitCheckSlot();
}

void Runtime::SetCompileInterruptCheck(pjrt::WaitCheck check) {
  std::lock_guard<std::mutex> l(LocationMutex());
  CompileInterruptCheckSlot() = std::move(check);
}

pjrt::WaitCheck Runtime::CompileInterruptCheckFn() {
  std::lock_guard<std::mutex> l(LocationMutex());
  return CompileInterruptCheckSlot();
}

void Runtime::SetWaitScope(std::function<std::shared_ptr<void>()> enter) {
  std::lock_guard<std::mutex> l(LocationMutex());
  WaitScopeSlot() = std::move(enter);
}

std::shared_ptr<void> Runtime::EnterWait() {
  std::function<std::shared_ptr<void>()> enter;
  {
    std::lock_guard<std::mutex> l(LocationMutex());
    enter = WaitScopeSlot();
  }
  return enter ? enter() : nullptr;
}

void Runtime::SetLocationProvider(std::function<std::string()> f) {
  std::lock_guard<std::mutex> l(LocationMutex());
  LocationFn() = std::move(f);
}

std::string Runtime::Location() {
  std::function<std::string()> f;
  {
    std::lock_guard<std::mutex> l(LocationMutex());
    f = LocationFn();
  }
  return f ? f() : std::string();
}

namespace {
thread_local int trace_depth = 0;
thread_local int64_t runtime_ns_at_trace_start = 0;  // Metrics::RuntimeNsOfThread() when the outer scope began
}  // namespace

void Runtime::MergeCheck(Trace& t, ir::Value code) {
  if (trace_depth > 0) {
    const int device = static_cast<int>(&t - traces_.data());
    bool seen = false;
    for (const CheckBefore& c : op_checks_before_) seen |= c.device == device;
    if (!seen) op_checks_before_.push_back(CheckBefore{device, t.epoch, t.check_code});
  }
  if (t.recording) t.recorded_checks.push_back(code);
  if (!t.check_code.valid()) {
    t.check_code = code;
    return;
  }
  // the first failed check in trace order, as eager raises at the first
  // failing op (the largest id named a backward's scatter check for the
  // gather index the user wrote)
  ir::Builder& b = *t.builder;
  ir::Value failed = b.Compare(ir::CompareDir::NE, t.check_code, b.ScalarConstant(ir::DType::I32, 0));
  t.check_code = b.Select(failed, t.check_code, code);
}

TraceScope::TraceScope() : lock_(Runtime::Get().mu()) {
  outer_ = trace_depth++ == 0;
  if (!outer_) return;
  start_ns_ = NowNs();
  runtime_ns_at_trace_start = Metrics::RuntimeNsOfThread();
  uncaught_ = std::uncaught_exceptions();
  Runtime& rt = Runtime::Get();
  rt.op_unlocated_before_ = rt.unlocated_checks_.size();
}

TraceScope::~TraceScope() {
  --trace_depth;
  if (!outer_) return;
  Metrics& m = Metrics::Get();
  const int64_t syncing = Metrics::RuntimeNsOfThread() - runtime_ns_at_trace_start;
  m.trace_ns += std::max<int64_t>(0, NowNs() - start_ns_ - syncing);
  m.traced_ops += 1;
  Runtime& rt = Runtime::Get();
  if (!rt.op_checks_before_.empty()) {
    if (std::uncaught_exceptions() > uncaught_) {
      // The op threw: its checks go with it. A trace launched meanwhile
      // (a read to the host inside the op) keeps what it launched with.
      for (const Runtime::CheckBefore& c : rt.op_checks_before_) {
        Runtime::Trace& t = rt.traces_[static_cast<size_t>(c.device)];
        if (t.epoch == c.epoch) t.check_code = c.code;
      }
      if (rt.unlocated_checks_.size() > rt.op_unlocated_before_) {
        rt.unlocated_checks_.erase(rt.unlocated_checks_.begin() + static_cast<std::ptrdiff_t>(rt.op_unlocated_before_),
                                   rt.unlocated_checks_.end());
      }
    }
    rt.op_checks_before_.clear();
  }
  // Checked while the lock is still held: an op with nothing to report
  // (nearly all of them) does not take the lock a second time.
  const bool deferred = !rt.unreported_.empty() || !rt.debug_lines_.empty() || !rt.unlocated_checks_.empty() ||
                        WarningsQueued();
  lock_.unlock();
  if (deferred) rt.ReportDeferred();
}

}  // namespace tpj::runtime
