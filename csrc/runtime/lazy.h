// The lazy runtime: storages whose contents are device buffers or pending IR
// values, one trace (IR builder) per device, and Sync(), which turns every
// pending value of every live storage into one program per device, compiles
// it once (cache), and runs it.
//
// Thread model: one recursive mutex (Runtime::mu()) guards traces and storage
// states. Op lowerings hold it while they read and write storages; Sync()
// holds it while it builds and launches programs. Program execution itself
// is asynchronous in the plugin; reading a buffer waits for it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "pjrt/client.h"
#include "pjrt/executable.h"
#include "runtime/cache.h"
#include "runtime/metrics.h"
#include "runtime/strided.h"

namespace tpj::runtime {

using DeviceBuffer = std::shared_ptr<pjrt::Buffer>;

// The contents of one PyTorch storage on one device: `numel` elements of
// `dtype`, held flat (rank 1). Exactly one of: a device buffer, a pending
// value of the device's current trace, or nothing (never written: zeros).
struct Storage {
  Storage(int device, size_t nbytes) : device(device), nbytes(nbytes) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const int device;     // local device index (0..device_count-1)
  size_t nbytes;
  std::optional<ir::DType> dtype;  // fixed by the first typed use
  DeviceBuffer buffer;  // materialized contents (kept while pending: it may be donated)
  // In a replicated region: one buffer per replica (replicas[0] == buffer).
  std::vector<DeviceBuffer> replicas;
  ir::Value value;      // pending contents, valid when epoch == trace epoch
  int64_t epoch = -1;
  bool pending = false;
};

struct SyncOptions {
  bool wait = false;  // block until the programs finished
};

class Runtime {
 public:
  // The process-wide runtime. The first call loads the plugin (discovery over
  // `search_dirs` given by Configure, or the environment) and creates the client.
  static Runtime& Get();
  // Before first use: where to look for plugins, and client options.
  static void Configure(std::vector<std::string> search_dirs, std::vector<pjrt::NamedOption> options);
  static bool Initialized();

  std::recursive_mutex& mu() { return mu_; }
  pjrt::Client& client() { return *client_; }
  const std::shared_ptr<pjrt::Client>& client_ptr() { return client_; }
  int device_count() const { return static_cast<int>(client_->addressable_device_ids().size()); }
  int global_id(int device) const;  // PJRT device id of local device `device`
  const std::string& plugin_path() const { return plugin_path_; }

  // --- tracing (caller holds mu()) ---
  ir::Builder& builder(int device);
  // The storage's flat value in the current trace, typed `dtype`
  // (a bitcast when the storage was typed differently with the same width).
  ir::Value ReadFlat(Storage& s, ir::DType dtype);
  // Makes `flat` (rank 1, numel elements) the storage's pending contents.
  void AssignFlat(Storage& s, ir::Value flat);
  // A device buffer as a parameter of the current trace (memoized). With
  // per-replica buffers, replica r of a replicated program reads replicas[r];
  // without, every replica gets a copy of `buffer`.
  ir::Value BufferParam(int device, const DeviceBuffer& buffer, ir::DType dtype,
                        const std::vector<DeviceBuffer>* replicas = nullptr);

  // Replicated data parallelism in one process: device 0's trace becomes one
  // program replicated over the first `n` local devices (collectives in the
  // IR span them). n = 1 ends it. Syncs device 0 first.
  void SetReplicas(int n);
  int replicas() const { return traces_.empty() ? 1 : traces_[0].replicas; }
  // Describes the parameter behind `flat` (if it is one) by the tensor shape
  // it was read as, e.g. "float32[4,16]": recompile reasons name inputs so.
  void DescribeParam(int device, ir::Value flat, const std::string& description);
  bool NeedsDescription(int device, ir::Value flat);

  // Random bits: threads the device's Threefry state through the trace.
  ir::Value RandomBits(int device, const ir::Shape& bits);
  void ManualSeed(int device, uint64_t seed);
  uint64_t InitialSeed(int device) const;

  // --- materialization ---
  void Sync(const std::vector<int>& devices, const SyncOptions& options = {});
  void SyncAll(const SyncOptions& options = {});
  // The storage as a device buffer (syncs its device when pending; zeros
  // when never written).
  DeviceBuffer Materialize(Storage& s);
  void SetBuffer(Storage& s, DeviceBuffer buffer, ir::DType dtype);
  void Unregister(Storage* s);

  CompileCache& cache() { return cache_; }
  void InitializeDiskCache(const std::string& dir, bool readonly);

  // Where a sync was requested from (Python file:line), for recompile logs.
  // Static: may be set before the runtime starts.
  static void SetLocationProvider(std::function<std::string()> f);
  static std::string Location();
  size_t pending_count(int device);

 private:
  Runtime() = default;
  struct Param {
    DeviceBuffer buffer;         // device data
    ir::DType dtype = ir::DType::F32;
    std::string description;     // how a tensor read it, for recompile reasons
    std::vector<DeviceBuffer> per_replica;  // replicated programs: one per replica
  };
  struct Trace {
    std::unique_ptr<ir::Builder> builder;
    int64_t epoch = 0;
    std::vector<Param> params;
    std::unordered_map<const pjrt::Buffer*, ir::Value> buffer_params;
    std::unordered_set<Storage*> pending;
    // Threefry state: host seed, device buffer, or a pending value.
    DeviceBuffer rng_buffer;
    ir::Value rng_value;
    bool rng_pending = false;
    uint64_t seed = 0;
    // Outputs of programs launched since the last wait: Sync(wait=true)
    // waits for all of them (programs without data dependencies may run
    // concurrently, so the last one alone says nothing).
    std::vector<DeviceBuffer> inflight;
    int replicas = 1;  // > 1: the trace is one program over this many devices
  };
  void Init();
  void ResetTrace(Trace& t);
  void SyncDevice(int device, const SyncOptions& options);
  void WaitDevice(int device);
  std::shared_ptr<pjrt::Executable> GetExecutable(int device, const ir::Graph& g, const std::string& key,
                                                  const std::vector<std::string>& param_desc);
  void ExplainRecompile(uint64_t structure, const ir::Graph& g, const std::vector<std::string>& param_desc);
  // Recompile reasons wait here until the runtime lock is released: their
  // Python location needs the GIL, which must never be taken under the lock.
  std::vector<RecompileReason> unreported_;
  std::vector<std::string> debug_lines_;
  void ReportDeferred();
  friend class TraceScope;

  std::recursive_mutex mu_;
  std::shared_ptr<pjrt::Client> client_;
  std::string plugin_path_;
  std::vector<Trace> traces_;
  CompileCache cache_;
  std::string fingerprint_;
  // Steady state: a trace identical to an earlier one (same nodes, outputs,
  // donations) reuses its executable and argument order without pruning or
  // rehashing the graph.
  struct Plan {
    std::shared_ptr<pjrt::Executable> executable;
    std::vector<int64_t> used;  // trace parameter index of each program argument
    size_t num_aliases = 0;
  };
  std::unordered_map<uint64_t, Plan> plans_;
  // StructureHash -> description of the last compiled graph with it.
  std::unordered_map<uint64_t, std::vector<std::string>> seen_structures_;
};

// RAII: holds Runtime::mu() and accumulates trace time in the metrics.
class TraceScope {
 public:
  TraceScope();
  ~TraceScope();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  int64_t start_ns_;
  bool outer_;
};

}  // namespace tpj::runtime
