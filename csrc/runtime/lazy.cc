#include "runtime/lazy.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ir/hash.h"
#include "ir/printer.h"
#include "pjrt/discovery.h"
#include "runtime/dtype_map.h"
#include "runtime/metrics.h"
#include "runtime/program.h"

namespace tpj::runtime {
namespace {

std::mutex& ConfigMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& ConfigDirs() {
  static std::vector<std::string> d;
  return d;
}
std::vector<pjrt::NamedOption>& ConfigOptions() {
  static std::vector<pjrt::NamedOption> o;
  return o;
}
std::atomic<Runtime*>& Instance() {
  static std::atomic<Runtime*> r{nullptr};
  return r;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool DebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("TORCH_PJRT_DEBUG");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

std::string ShapeText(const ir::Shape& s) {
  std::ostringstream os;
  os << ir::Name(s.dtype) << "[";
  for (size_t i = 0; i < s.dims.size(); ++i) os << (i ? "," : "") << s.dims[i];
  os << "]";
  return os.str();
}

// One line per parameter and constant: what ExplainRecompile compares.
std::vector<std::string> Signature(const ir::Graph& g, const std::vector<std::string>& param_desc) {
  std::vector<std::string> sig;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const std::string& desc = i < param_desc.size() ? param_desc[i] : std::string();
    sig.push_back("input " + std::to_string(i) + ": " +
                  (desc.empty() ? ShapeText(g.nodes[g.params[i]].results[0]) : desc));
  }
  int c = 0;
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::Constant) {
      std::ostringstream os;
      os << "constant " << c++ << ": " << ShapeText(n.results[0]);
      if (n.attrs.data && n.attrs.data->size() <= 16) {
        os << " bytes";
        for (uint8_t b : *n.attrs.data) os << " " << static_cast<int>(b);
      }
      sig.push_back(os.str());
    } else if (n.op != ir::Op::Parameter) {
      // Shapes of every other node are part of the structure key's blind spot.
      std::ostringstream os;
      os << ir::OpName(n.op);
      for (const auto& r : n.results) os << " " << ShapeText(r);
      sig.push_back(os.str());
    }
  }
  return sig;
}

}  // namespace

Storage::~Storage() {
  // Under the runtime lock: a sync may be updating this storage right now.
  if (Runtime::Initialized()) Runtime::Get().Unregister(this);
}

void Runtime::Configure(std::vector<std::string> search_dirs, std::vector<pjrt::NamedOption> options) {
  std::lock_guard<std::mutex> l(ConfigMutex());
  if (Instance().load() != nullptr) {
    throw pjrt::Error(9, "torch_pjrt is already initialized: configure it before the first pjrt tensor");
  }
  ConfigDirs() = std::move(search_dirs);
  ConfigOptions() = std::move(options);
}

bool Runtime::Initialized() { return Instance().load(std::memory_order_acquire) != nullptr; }

namespace {
std::mutex& LocationMutex() {
  static std::mutex mu;
  return mu;
}
std::function<std::string()>& LocationFn() {
  static std::function<std::string()> f;
  return f;
}
}  // namespace

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

Runtime& Runtime::Get() {
  Runtime* r = Instance().load(std::memory_order_acquire);
  if (r) return *r;
  std::lock_guard<std::mutex> l(ConfigMutex());
  if (Instance().load(std::memory_order_relaxed) == nullptr) {
    auto* fresh = new Runtime();  // lives for the process: tensors may outlive any scope
    fresh->Init();
    Instance().store(fresh, std::memory_order_release);
  }
  return *Instance().load(std::memory_order_acquire);
}

void Runtime::Init() {
  pjrt::PluginChoice choice = pjrt::FindPlugin("", ConfigDirs());
  plugin_path_ = choice.path;
  auto plugin = pjrt::Plugin::Load(choice.path);
  client_ = pjrt::Client::Create(plugin, ConfigOptions());
  if (client_->addressable_device_ids().empty()) {
    throw pjrt::Error(5, "the PJRT plugin '" + choice.path + "' has no addressable devices");
  }
  traces_.resize(client_->addressable_device_ids().size());
  for (size_t i = 0; i < traces_.size(); ++i) {
    ResetTrace(traces_[i]);
    traces_[i].seed = 0;
  }
  fingerprint_ = CompileCache::Fingerprint(*plugin, client_->platform_version());
  if (const char* dir = std::getenv("TORCH_PJRT_CACHE_DIR"); dir && *dir) {
    cache_.SetDiskDir(dir, false, fingerprint_);
  }
}

void Runtime::InitializeDiskCache(const std::string& dir, bool readonly) {
  cache_.SetDiskDir(dir, readonly, fingerprint_);
}

int Runtime::global_id(int device) const {
  const auto& ids = client_->addressable_device_ids();
  if (device < 0 || device >= static_cast<int>(ids.size())) {
    throw pjrt::Error(11, "pjrt device index " + std::to_string(device) + " is out of range: there are " +
                              std::to_string(ids.size()) + " pjrt device(s)");
  }
  return ids[device];
}

void Runtime::ResetTrace(Trace& t) {
  t.builder = std::make_unique<ir::Builder>(t.replicas);
  t.epoch += 1;
  t.params.clear();
  t.buffer_params.clear();
  t.pending.clear();
  t.rng_pending = false;
  t.rng_value = ir::Value{};
}

ir::Builder& Runtime::builder(int device) {
  global_id(device);
  return *traces_[device].builder;
}

size_t Runtime::pending_count(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  return traces_.at(device).pending.size();
}

ir::Value Runtime::BufferParam(int device, const DeviceBuffer& buffer, ir::DType dtype,
                              const std::vector<DeviceBuffer>* replicas) {
  Trace& t = traces_[device];
  auto it = t.buffer_params.find(buffer.get());
  if (it != t.buffer_params.end()) return it->second;
  Param p;
  p.buffer = buffer;
  p.dtype = dtype;
  if (replicas && static_cast<int>(replicas->size()) == t.replicas) p.per_replica = *replicas;
  t.params.push_back(std::move(p));
  ir::Value v = t.builder->Parameter({dtype, buffer->dims()});
  t.buffer_params[buffer.get()] = v;
  return v;
}

bool Runtime::NeedsDescription(int device, ir::Value flat) {
  Trace& t = traces_[device];
  const ir::Node& n = t.builder->graph().nodes[flat.node];
  return n.op == ir::Op::Parameter && t.params[n.attrs.axis].description.empty();
}

void Runtime::DescribeParam(int device, ir::Value flat, const std::string& description) {
  Trace& t = traces_[device];
  const ir::Node& n = t.builder->graph().nodes[flat.node];
  if (n.op != ir::Op::Parameter) return;
  std::string& d = t.params[n.attrs.axis].description;
  if (d.empty()) d = description;
}

ir::Value Runtime::ReadFlat(Storage& s, ir::DType dtype) {
  Trace& t = traces_[s.device];
  if (!s.dtype) s.dtype = dtype;
  const ir::DType have = *s.dtype;
  const int64_t numel = static_cast<int64_t>(s.nbytes / ir::ByteSize(have));
  ir::Value v;
  if (s.pending && s.epoch == t.epoch) {
    v = s.value;
  } else if (s.buffer) {
    v = BufferParam(s.device, s.buffer, have, s.replicas.empty() ? nullptr : &s.replicas);
  } else {
    v = t.builder->Full(have, {numel}, 0);
  }
  if (have == dtype) return v;
  if (ir::ByteSize(have) != ir::ByteSize(dtype)) {
    throw ir::Error(std::string("a pjrt storage of ") + ir::Name(have) + " cannot be read as " + ir::Name(dtype) +
                    " (element sizes differ)");
  }
  return t.builder->Bitcast(v, dtype);
}

void Runtime::AssignFlat(Storage& s, ir::Value flat) {
  Trace& t = traces_[s.device];
  const ir::Shape& shape = t.builder->shape(flat);
  if (!s.dtype) s.dtype = shape.dtype;
  if (shape.dtype != *s.dtype) flat = t.builder->Bitcast(flat, *s.dtype);
  s.value = flat;
  s.epoch = t.epoch;
  if (!s.pending) {
    s.pending = true;
    t.pending.insert(&s);
  }
}

void Runtime::SetReplicas(int n) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (n < 1 || n > device_count()) {
    throw pjrt::Error(3, "cannot replicate over " + std::to_string(n) + " devices: this process has " +
                             std::to_string(device_count()) + " pjrt device(s)");
  }
  Trace& t = traces_.at(0);
  if (t.replicas == n) return;
  try {
    SyncDevice(0, {});
  } catch (...) {
    t.replicas = n;  // switch anyway: leaving the old mode on would surprise more
    ResetTrace(t);
    throw;
  }
  t.replicas = n;
  ResetTrace(t);  // a trace belongs to one replica count
}

void Runtime::Unregister(Storage* s) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (s->pending && s->device >= 0 && s->device < static_cast<int>(traces_.size())) {
    traces_[s->device].pending.erase(s);
  }
}

void Runtime::SetBuffer(Storage& s, DeviceBuffer buffer, ir::DType dtype) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (s.pending) {
    traces_[s.device].pending.erase(&s);
    s.pending = false;
  }
  s.buffer = std::move(buffer);
  s.replicas.clear();
  s.dtype = dtype;
  s.epoch = -1;
}

ir::Value Runtime::RandomBits(int device, const ir::Shape& bits) {
  Trace& t = traces_[device];
  ir::Value state;
  if (t.rng_pending) {
    state = t.rng_value;
  } else if (t.rng_buffer) {
    state = BufferParam(device, t.rng_buffer, ir::DType::U64);
  } else {
    const uint64_t key[2] = {t.seed, 0};
    std::vector<uint8_t> bytes(16);
    std::memcpy(bytes.data(), key, 16);
    state = t.builder->Constant({ir::DType::U64, {2}}, std::move(bytes));
  }
  std::vector<ir::Value> out = t.builder->RngBitGenerator(state, bits);
  t.rng_value = out[0];
  t.rng_pending = true;
  return out[1];
}

void Runtime::ManualSeed(int device, uint64_t seed) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  Trace& t = traces_.at(device);
  t.seed = seed;
  t.rng_buffer.reset();
  t.rng_pending = false;
}

uint64_t Runtime::InitialSeed(int device) const { return traces_.at(device).seed; }

void Runtime::SyncAll(const SyncOptions& options) {
  std::vector<int> all(traces_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  Sync(all, options);
}

void Runtime::Sync(const std::vector<int>& devices, const SyncOptions& options) {
  TraceScope scope;  // reports deferred recompile reasons once the lock is released
  for (int d : devices) SyncDevice(d, options);
}

void Runtime::ReportDeferred() {
  std::vector<RecompileReason> reasons;
  std::vector<std::string> lines;
  {
    std::lock_guard<std::recursive_mutex> l(mu_);
    if (unreported_.empty() && debug_lines_.empty()) return;
    reasons.swap(unreported_);
    lines.swap(debug_lines_);
  }
  const std::string where = Location();  // may take the GIL: not under mu_
  for (auto& r : reasons) {
    r.where = where;
    if (DebugEnabled()) {
      std::fprintf(stderr, "torch_pjrt: recompiling a known graph (%s)%s%s\n", r.why.c_str(),
                   where.empty() ? "" : " at ", where.c_str());
    }
    Metrics::Get().Recompiled(std::move(r));
  }
  for (const auto& line : lines) {
    std::fprintf(stderr, "torch_pjrt: %s%s%s\n", line.c_str(), where.empty() ? "" : " at ", where.c_str());
  }
}

DeviceBuffer Runtime::Materialize(Storage& s) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (s.pending) SyncDevice(s.device, {});
  if (!s.buffer) {
    const ir::DType t = s.dtype.value_or(ir::DType::U8);
    const size_t numel = s.nbytes / ir::ByteSize(t);
    std::vector<uint8_t> zeros(s.nbytes, 0);
    s.buffer = client_->BufferFromHost(zeros.data(), ToPjrt(t), {static_cast<int64_t>(numel)}, global_id(s.device));
    s.dtype = t;
  }
  return s.buffer;
}

std::shared_ptr<pjrt::Executable> Runtime::GetExecutable(int device, const ir::Graph& g, const std::string& key,
                                                         const std::vector<std::string>& param_desc) {
  Metrics& m = Metrics::Get();
  if (auto exe = cache_.Lookup(key)) {
    m.Add("cache_hits");
    return exe;
  }
  std::vector<pjrt::ArgSpec> args;
  for (int32_t id : g.params) {
    const ir::Shape& s = g.nodes[id].results[0];
    args.push_back({ToPjrt(s.dtype), s.dims});
  }
  pjrt::CompileOptions options;
  const int n = traces_.at(device).replicas;
  options.num_replicas = n;
  for (int r = 0; r < n; ++r) options.device_ids.push_back(global_id(device + r));
  bool corrupt = false;
  if (auto exe = cache_.LoadDisk(key, *client_, options, args, &corrupt)) {
    m.Add("disk_cache_hits");
    cache_.Insert(key, exe);
    return exe;
  }
  if (corrupt) m.Add("disk_cache_corrupt");
  const uint64_t structure = ir::StructureHash(g);
  ExplainRecompile(structure, g, param_desc);
  auto t0 = std::chrono::steady_clock::now();
  const std::string text = ir::PrintStableHlo(g);
  if (const char* dir = std::getenv("TORCH_PJRT_DUMP_DIR"); dir && *dir) {
    std::ofstream(std::string(dir) + "/" + key + ".mlir") << text;
  }
  std::shared_ptr<pjrt::Executable> exe(runtime::CompileText(*client_, text, options, args));
  m.AddTime("compile", Seconds(t0));
  m.Add("compiles");
  cache_.Insert(key, exe);
  cache_.StoreDisk(key, *exe);
  return exe;
}

void Runtime::ExplainRecompile(uint64_t structure, const ir::Graph& g, const std::vector<std::string>& param_desc) {
  std::vector<std::string> sig = Signature(g, param_desc);
  auto it = seen_structures_.find(structure);
  if (it != seen_structures_.end()) {
    const std::vector<std::string>& old = it->second;
    std::string why;
    for (size_t i = 0; i < std::min(old.size(), sig.size()); ++i) {
      if (old[i] == sig[i]) continue;
      const size_t colon = old[i].find(':');
      if (old[i].rfind("input", 0) == 0 || old[i].rfind("constant", 0) == 0) {
        why += (why.empty() ? "" : "; ") + old[i].substr(0, colon) + " changed from" + old[i].substr(colon + 1) +
               " to" + sig[i].substr(sig[i].find(':') + 1);
      } else if (why.empty()) {
        why = "op " + old[i] + " became " + sig[i];
      }
      if (why.size() > 400) break;
    }
    if (why.empty()) why = "same structure, different details";
    unreported_.push_back(RecompileReason{structure, why, ""});
  } else if (DebugEnabled()) {
    debug_lines_.push_back("compiling a new graph (" + std::to_string(g.nodes.size()) + " nodes, " +
                           std::to_string(g.params.size()) + " parameters)");
  }
  seen_structures_[structure] = std::move(sig);
}

void Runtime::WaitDevice(int device) {
  Trace& t = traces_.at(device);
  auto t0 = std::chrono::steady_clock::now();
  for (auto& b : t.inflight) b->AwaitReady();
  t.inflight.clear();
  Metrics::Get().AddTime("execute_wait", Seconds(t0));
}

void Runtime::SyncDevice(int device, const SyncOptions& options) {
  Trace& t = traces_.at(device);
  if (t.pending.empty() && !t.rng_pending) {
    if (options.wait) WaitDevice(device);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  Metrics& m = Metrics::Get();

  std::vector<Storage*> storages(t.pending.begin(), t.pending.end());
  std::sort(storages.begin(), storages.end(), [](const Storage* a, const Storage* b) {
    return a->value.node != b->value.node ? a->value.node < b->value.node : a->value.index < b->value.index;
  });
  std::vector<ir::Value> outputs;
  std::vector<size_t> output_of(storages.size());
  for (size_t i = 0; i < storages.size(); ++i) {
    const ir::Value v = storages[i]->value;
    auto at = std::find(outputs.begin(), outputs.end(), v);
    output_of[i] = static_cast<size_t>(at - outputs.begin());
    if (at == outputs.end()) outputs.push_back(v);
  }
  size_t rng_output = SIZE_MAX;
  if (t.rng_pending) {
    rng_output = outputs.size();
    outputs.push_back(t.rng_value);
  }
  // Donation: a parameter buffer held only by this trace and by the one
  // storage that gets a new value in this program is reused for that value.
  std::vector<ir::Alias> aliases;
  std::vector<bool> output_aliased(outputs.size(), false);
  auto param_index = [&](const pjrt::Buffer* b) -> int64_t {
    auto it = t.buffer_params.find(b);
    if (it == t.buffer_params.end()) return -1;
    return t.builder->graph().nodes[it->second.node].attrs.axis;
  };
  const bool replicated = t.replicas > 1;
  for (size_t i = 0; i < storages.size() && !replicated; ++i) {
    Storage* s = storages[i];
    if (!s->buffer || s->buffer.use_count() != 2 || output_aliased[output_of[i]]) continue;
    const int64_t p = param_index(s->buffer.get());
    if (p < 0) continue;
    if (t.builder->shape(outputs[output_of[i]]) != t.builder->graph().nodes[t.builder->graph().params[p]].results[0]) {
      continue;
    }
    aliases.push_back({p, static_cast<int64_t>(output_of[i])});
    output_aliased[output_of[i]] = true;
  }
  if (!replicated && t.rng_pending && t.rng_buffer && t.rng_buffer.use_count() == 2) {
    const int64_t p = param_index(t.rng_buffer.get());
    if (p >= 0) aliases.push_back({p, static_cast<int64_t>(rng_output)});
  }
  // On a compile or launch failure, leave the device usable: drop this
  // trace's pending work, keep the last materialized contents of every storage.
  auto abandon = [&] {
    for (Storage* s : storages) {
      s->pending = false;
      s->epoch = -1;
    }
    ResetTrace(t);
  };

  // The trace's own hash (all nodes, not only live ones) plus what this sync
  // asks of it identifies the program without pruning it.
  uint64_t trace_key = ir::StructuralHash(t.builder->graph());
  auto mix = [&trace_key](uint64_t v) { trace_key = (trace_key ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; };
  for (const ir::Value& v : outputs) mix((static_cast<uint64_t>(v.node) << 8) ^ static_cast<uint64_t>(v.index));
  for (const ir::Alias& a : aliases) mix((static_cast<uint64_t>(a.param) << 32) ^ static_cast<uint64_t>(a.output));
  mix(static_cast<uint64_t>(global_id(device)));
  mix(static_cast<uint64_t>(t.replicas));

  std::vector<int64_t> used;
  std::shared_ptr<pjrt::Executable> exe;
  size_t num_aliases = aliases.size();
  if (auto it = plans_.find(trace_key); it != plans_.end()) {
    exe = it->second.executable;
    used = it->second.used;
    num_aliases = it->second.num_aliases;
    m.Add("cache_hits");
    m.AddTime("graph_build", Seconds(t0));
  } else {
    ir::Graph g = ir::Extract(t.builder->graph(), outputs, aliases, &used);
    num_aliases = g.aliases.size();
    std::ostringstream key;
    key << std::hex << ir::StructuralHash(g) << "-d" << std::dec << global_id(device);
    if (replicated) key << "-r" << t.replicas;
    m.AddTime("graph_build", Seconds(t0));
    try {
      std::vector<std::string> desc;
      for (int64_t p : used) desc.push_back(t.params[p].description);
      exe = GetExecutable(device, g, key.str(), desc);
    } catch (...) {
      abandon();
      throw;
    }
    if (plans_.size() > 1024) plans_.clear();  // bounded; the compile cache keeps the executables
    plans_[trace_key] = Plan{exe, used, num_aliases};
  }

  // Arguments per replica: per-replica buffers, else copies of the one buffer.
  const int n = t.replicas;
  std::vector<DeviceBuffer> keep_alive;
  std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> outs;
  try {
    std::vector<std::vector<pjrt::Buffer*>> args(n);
    for (int64_t p : used) {
      const Param& prm = t.params[p];
      const DeviceBuffer& base = prm.buffer;
      for (int r = 0; r < n; ++r) {
        if (!prm.per_replica.empty()) {
          args[r].push_back(prm.per_replica[r].get());
        } else if (r == 0) {
          args[r].push_back(base.get());
        } else {
          keep_alive.push_back(DeviceBuffer(base->CopyToDevice(global_id(device + r))));
          args[r].push_back(keep_alive.back().get());
        }
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    outs = exe->ExecuteReplicated(args);
    m.AddTime("execute_launch", Seconds(t1));
  } catch (...) {
    abandon();
    throw;
  }
  m.Add("executions");
  if (num_aliases) m.Add("donated_buffers", static_cast<int64_t>(num_aliases));

  std::vector<std::vector<DeviceBuffer>> per(n, std::vector<DeviceBuffer>(outputs.size()));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < outputs.size(); ++i) per[r][i] = DeviceBuffer(std::move(outs[r][i]));
  }
  const std::vector<DeviceBuffer>& shared = per[0];
  for (size_t i = 0; i < storages.size(); ++i) {
    Storage* s = storages[i];
    s->buffer = shared[output_of[i]];
    s->replicas.clear();
    if (replicated) {
      for (int r = 0; r < n; ++r) s->replicas.push_back(per[r][output_of[i]]);
    }
    s->pending = false;
    s->epoch = -1;
  }
  if (rng_output != SIZE_MAX) t.rng_buffer = shared[rng_output];
  ResetTrace(t);
  for (int r = 0; r < n; ++r) {
    if (!per[r].empty()) t.inflight.push_back(per[r].front());
  }
  if (t.inflight.size() > 256) {
    // bound the list: drop the ones already finished
    std::vector<DeviceBuffer> still;
    for (auto& b : t.inflight) {
      if (!b->IsReady()) still.push_back(b);
    }
    t.inflight.swap(still);
  }
  if (options.wait) WaitDevice(device);
  m.AddTime("sync", Seconds(t0));
}

namespace {
thread_local int trace_depth = 0;
}  // namespace

TraceScope::TraceScope() : lock_(Runtime::Get().mu()) {
  outer_ = trace_depth++ == 0;
  start_ns_ = outer_ ? NowNs() : 0;
}

TraceScope::~TraceScope() {
  --trace_depth;
  if (!outer_) return;
  Metrics& m = Metrics::Get();
  m.trace_ns += NowNs() - start_ns_;
  m.traced_ops += 1;
  lock_.unlock();
  Runtime::Get().ReportDeferred();
}

}  // namespace tpj::runtime
