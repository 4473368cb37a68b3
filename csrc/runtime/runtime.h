// The lazy runtime: it owns the storages' contents (runtime/storage.h), one
// trace (IR builder) per device, every host<->device transfer, and Sync(),
// which turns the pending values of all live storages into one program per
// device, compiles it once (cache) and runs it.
//
// Files: runtime.cc (instance, configuration, seeds), trace.cc (building the
// trace), sync.cc (plan, donation, launch, failures), recompile.cc
// (explaining recompiles), transfer.cc (uploads and downloads).
//
// Thread model: one recursive mutex (mu()) guards traces and storages. Op
// lowerings hold it (TraceScope) while they read and write storages; Sync()
// holds it while it builds and launches programs. Execution is asynchronous
// in the plugin; a download waits for its buffer outside the lock.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "pjrt/buffer_bytes.h"
#include "pjrt/client.h"
#include "pjrt/executable.h"
#include "runtime/cache.h"
#include "runtime/metrics.h"
#include "runtime/options.h"
#include "runtime/replay.h"
#include "runtime/storage.h"
#include "runtime/strided.h"

namespace tpj::runtime {

struct SyncOptions {
  bool wait = false;  // block until the programs finished
};

class Runtime {
 public:
  // The process-wide runtime. The first call reads the options (environment),
  // loads the plugin and creates the client.
  static Runtime& Get();
  // Before first use: directories to search for plugins (when
  // TORCH_PJRT_SEARCH_PATH is unset) and client options that override those
  // the environment implies.
  static void Configure(std::vector<std::string> search_dirs, std::vector<pjrt::NamedOption> overrides);
  static bool Initialized();

  std::recursive_mutex& mu() { return mu_; }
  pjrt::Client& client() { return *client_; }
  const Options& options() const { return options_; }
  int device_count() const { return static_cast<int>(client_->addressable_device_ids().size()); }
  // The error for a device index past device_count(); in a job of several
  // processes it says that each numbers its own devices from 0.
  std::string DeviceIndexError(int device) const;
  // Throws pjrt::Error (kOutOfRange) with DeviceIndexError for an index this process does not have.
  void CheckDevice(int device) const;
  int global_id(int device) const;  // PJRT device id of local device `device`; checks the range
  const std::string& plugin_path() const { return plugin_path_; }

  // --- tracing (caller holds mu()) ---
  ir::Builder& builder(int device);
  // The storage's flat value in the current trace, typed `dtype`
  // (a bitcast when the storage was typed differently with the same width).
  ir::Value ReadFlat(Storage& s, ir::DType dtype);
  // Makes `flat` (rank 1, all elements) the storage's pending contents.
  void AssignFlat(Storage& s, ir::Value flat);
  // Resizes the storage to `nbytes`: its first bytes kept, a grown tail
  // zeros; 0 frees its memory. `dtype` types a storage never written.
  void Resize(Storage& s, size_t nbytes, ir::DType dtype);
  // Names the tensor shape a storage's parameter was read as (e.g.
  // "float32[4,16]"): recompile reasons name inputs so. Once per parameter.
  void DescribeRead(Storage& s, ir::Value flat, const std::function<std::string()>& description);
  // Random bits: threads the device's Threefry state through the trace.
  ir::Value RandomBits(int device, const ir::Shape& bits);
  // Threefry counters a draw of `bits` takes (one per 64 bits, as XLA's
  // generator consumes them): the state's counter advances by this much.
  static uint64_t RngAdvance(const ir::Shape& bits) { return (bits.bytes() + 7) / 8; }
  // A check compiled into the program: `violated` (a bool scalar of the
  // trace) true makes every tensor the program writes raise `what` when
  // read, and sync(wait=True) raise it. Off with TORCH_PJRT_CHECKS=0.
  void AddCheck(int device, ir::Value violated, ErrorKind kind, const std::string& what);
  bool checks_enabled() const { return options_.checks; }
  // Overrides TORCH_PJRT_CHECKS for ops traced from now on (bench measures their cost).
  void SetChecks(bool enabled);

  // Replicated data parallelism in one process: device 0's trace becomes one
  // program replicated over the first `n` local devices (collectives in the
  // IR span them). n = 1 ends it. Syncs device 0 first.
  void SetReplicas(int n);
  int replicas() const { return traces_.empty() ? 1 : traces_[0].replicas; }

  // --- SPMD (runtime/spmd.cc) ---
  // Makes `device`'s trace one program over the mesh `devices` (local
  // indices, devices[0] == device), partitioned by XLA's SPMD partitioner:
  // every storage it reads or writes is sharded (Storage::sharding), one
  // buffer per mesh device. Syncs the device first when the mesh changes;
  // an empty list ends it.
  void SetMesh(int device, std::vector<int> devices);
  std::vector<int> Mesh(int device);
  bool SpmdInUse();
  // Uploads each piece of `data` (the storage's whole contents, dense, as
  // sharding->dims elements of `dtype`) straight to its device.
  void DistributeTo(Storage& s, const void* data, ir::DType dtype, std::shared_ptr<const Sharding> sharding);
  // The storage's contents take `sharding` in the next program (a
  // constraint on its value; the partitioner moves data device to device).
  void Reshard(Storage& s, ir::DType dtype, std::shared_ptr<const Sharding> sharding);
  // `x` (a value of `device`'s trace) constrained to `sharding`.
  ir::Value ShardingConstraint(int device, ir::Value x, const Sharding& sharding);
  // Bytes of the storage's buffer on each mesh position (one entry when unsharded).
  std::vector<int64_t> ShardBytes(Storage& s);
  // Bytes of the live buffers on local device `device`, and the most since
  // ResetPeakBytes (our own count, for plugins that report no statistics).
  pjrt::BufferBytes LiveBytes(int device) const;
  void ResetPeakBytes(int device);

  // --- random state ---
  void ManualSeed(int device, uint64_t seed);
  uint64_t InitialSeed(int device) const;
  // The Threefry key/counter the next random op of `device` starts from,
  // known on the host (no sync). SetRngState restores it.
  std::array<uint64_t, 2> RngState(int device);
  void SetRngState(int device, const std::array<uint64_t, 2>& state);
  // Whether `device` has no pending work (a sync would launch nothing).
  bool Idle(int device);
  // Whether every program launched on `device` has finished (looked at, not waited for).
  bool LaunchesDone(int device);

  // --- transfers: the only paths between host and device memory ---
  // A device buffer of `dims` elements of `dtype` from host memory.
  DeviceBuffer Upload(const void* data, ir::DType dtype, const std::vector<int64_t>& dims, int device);
  // The storage's whole contents from host memory (nbytes() bytes of `dtype`).
  void UploadTo(Storage& s, const void* data, ir::DType dtype);
  // A 0-d value of `dtype` holding `bytes` (one element), fed from a device
  // buffer cached per (device, dtype, bytes): a changing Python number does
  // not change the program, a repeated one is not uploaded again.
  ir::Value ScalarValue(int device, ir::DType dtype, const void* bytes);
  // Host data as a value of the device's current trace (rank 1).
  ir::Value UploadValue(int device, const void* data, ir::DType dtype, int64_t numel);
  // In a replicated region: replica r of the storage holds parts[r].
  void UploadReplicas(Storage& s, const std::vector<const void*>& parts, ir::DType dtype);
  // Throws TensorError when the storage's value was lost (a failed program
  // or a failed check already read): callers check before allocating.
  void CheckReadable(Storage& s);
  // Throws what reading the storage would (a lost value, a failed program
  // or check, as Download), without copying it: syncs and waits for it.
  void Settle(Storage& s);
  // The storage's dtype, fixing it to `if_untyped` on first use.
  ir::DType TypeOf(Storage& s, ir::DType if_untyped);
  // A storage that holds bytes (torch.load uploads untyped storages) takes
  // `dtype` when a tensor of that dtype is set on it: the reinterpretation
  // runs once, in the next program, instead of in every program that reads
  // it. No-op for typed, pending or empty storages.
  void TypeBytes(Storage& s, ir::DType dtype);
  // The storage's contents on the host (whole elements of its dtype:
  // nbytes() rounded down), syncing its device first when it is pending;
  // waits for the buffer outside the runtime lock. The bytes are shared
  // with the runtime's host copy where it keeps one (CopyToHostKept):
  // read them, never write them.
  std::shared_ptr<const std::vector<uint8_t>> Download(Storage& s);
  // Whether a host read of a small part of `s` (materialized) should
  // download it whole: its buffer has a host copy already, or this is the
  // fourth partial read in a row of that buffer (of at most 64 MiB), which
  // is then kept. A loop over the rows of a 1-64 MiB tensor reads three
  // small programs and one download rather than a program per row.
  bool ReadWhole(Storage& s);
  // The same for each replica of a replicated storage (one replica otherwise).
  void DownloadReplicas(Storage& s, const std::vector<void*>& dsts);
  size_t ReplicaCount(Storage& s);

  // --- materialization ---
  void Sync(const std::vector<int>& devices, const SyncOptions& options = {});
  void SyncAll(const SyncOptions& options = {});
  // Waits for every program already launched, launching nothing and raising
  // nothing (a failed program's error stays with its outputs). Called at
  // interpreter exit: a process that exits while the plugin still runs a
  // program has the plugin's worker threads use what exit() is destroying
  // (a crash, or std::terminate in the plugin). No-op in a forked child.
  // Returns the failures that nothing read or raised: programs that failed
  // to run, and failed checks (each once; those inherited by a later
  // program are named by their origin only).
  std::vector<std::string> AwaitLaunched() noexcept;
  // Whether a device's pending work holds a check (an index, divisor, ...):
  // at exit it is launched so that a failure is not dropped unseen.
  bool PendingChecks();
  void Unregister(Storage* s);
  size_t pending_count(int device);
  size_t trace_nodes(int device);  // IR nodes of the device's trace
  // Counts the device's traces: it moves when the pending work launches
  // (or is dropped), so two equal values saw no launch between them.
  int64_t trace_epoch(int device);

  // --- replay of recorded programs (runtime/replay.h; torch.compile graphs) ---
  // Runs `p` on `inputs` (same layout as recorded); `fresh` (new, empty
  // storages) receive the graph's new outputs. False, with nothing done,
  // when the call does not match the recording. Throws TensorError when an
  // input's value was lost. How it runs (ReplayJoin): the executable is
  // launched on the inputs' buffers (pending inputs launched first, as their
  // own program), or the recorded graph joins the device's trace, its
  // outputs pending like those of traced ops. A graph joins a trace once:
  // called again while the first call is still pending (a loop that never
  // syncs), the trace is launched first.
  enum class ReplayJoin { kNever, kWhenPending, kAlways };
  // Before tracing a graph's first call. A call that would join the trace
  // (`join` kAlways, or kWhenPending with work pending: ReplayJoin) is
  // traced into the pending trace and recorded there, without a launch
  // (EndRecording). Otherwise the recording is of a program of its own:
  // syncs `device` when an input or the random state is pending, and gives
  // every input storage a buffer. `inputs`: one per graph input, null where
  // the input is not a storage.
  RecordingStart BeginRecording(int device, const std::vector<Storage*>& inputs, ReplayJoin join);
  // After tracing it: returns the program as a function of `inputs` and
  // `fresh` (the distinct storages of the graph's outputs that are not
  // inputs), or null with *why_not set (and the device synced) when the call
  // cannot be replayed. A recording of its own syncs the device and records
  // the program that sync launched; one in the pending trace takes the
  // graph's part of the trace as the program's graph and leaves the trace
  // pending, with that part as one call (what a later call's join adds): the
  // step launches as the program that later steps reuse. Its executable is
  // compiled when a call first launches it alone.
  std::shared_ptr<const ReplayProgram> EndRecording(const RecordingStart& start, const std::vector<Storage*>& inputs,
                                                    const std::vector<Storage*>& fresh, std::string* why_not);
  bool Replay(const ReplayProgram& p, const std::vector<Storage*>& inputs, const std::vector<Storage*>& fresh,
              ReplayJoin join);

  // --- execute only (bench): XLA's own time for a step's programs ---
  // From now on, remember each launched program and its argument shapes
  // (not the buffers: holding them would change donation decisions).
  void StartLaunchLog();
  // Stops remembering; runs the programs remembered since StartLaunchLog,
  // in order, `iterations` times on fresh zero-filled arguments (uploaded
  // before each timed iteration) and returns the mean seconds per iteration
  // from the first launch to the last program's completion.
  double ExecuteLoggedPrograms(int iterations);

  CompileCache& cache() { return cache_; }
  void InitializeDiskCache(const std::string& dir, bool readonly);
  // The StableHLO program that would compute `values` of `device`'s trace now.
  std::string ProgramText(int device, const std::vector<ir::Value>& values);

  // Called while a wait blocks (about every 50 ms), outside the runtime lock;
  // throws to abandon the wait (the bindings raise KeyboardInterrupt).
  static void SetWaitCheck(pjrt::WaitCheck check);
  static pjrt::WaitCheck WaitCheckFn();
  // Called by a compile's wait once SIGINT came (CompileText), under the
  // runtime lock in the middle of a sync; throws to abandon the wait. Unset
  // (C++ tests): a compile is the plain call on the caller's thread.
  static void SetCompileInterruptCheck(pjrt::WaitCheck check);
  static pjrt::WaitCheck CompileInterruptCheckFn();
  // Held around each such wait, outside the runtime lock: the bindings
  // release the GIL there when the waiting thread holds it (a storage copy
  // that PyTorch calls with the GIL held: torch.save or pickle of a pending
  // tensor), so that other Python threads run during the program.
  static void SetWaitScope(std::function<std::shared_ptr<void>()> enter);
  static std::shared_ptr<void> EnterWait();

  // Where a sync was requested from (Python file:line), for recompile logs.
  // Static: may be set before the runtime starts.
  static void SetLocationProvider(std::function<std::string()> f);
  static std::string Location();

 private:
  Runtime() = default;
  struct Param {
    DeviceBuffer buffer;         // device data
    ir::DType dtype = ir::DType::F32;
    std::string description;     // how a tensor read it, for recompile reasons
    std::vector<DeviceBuffer> per_replica;  // replicated programs: one per replica; SPMD: one per mesh position
    std::shared_ptr<const Sharding> sharding;  // SPMD: of a storage's pieces
  };
  // What a storage holds in a trace: its pending value there, or its buffer.
  struct JoinState {
    ir::Value value;
    const pjrt::Buffer* buffer = nullptr;
    bool operator==(const JoinState& o) const { return value == o.value && buffer == o.buffer; }
  };
  static constexpr int kMaxJoins = 16;
  static constexpr int kMaxJoinCompiles = 4;
  struct Trace {
    std::unique_ptr<ir::Builder> builder;
    int64_t epoch = 0;
    // Storage values read to the host from this device: a graph whose trace
    // read one (.item() in a custom op) holds that value in its program, so
    // it is not recorded for replay.
    int64_t host_reads = 0;
    std::vector<Param> params;
    std::unordered_map<const pjrt::Buffer*, ir::Value> buffer_params;
    std::unordered_set<Storage*> pending;
    // Threefry state {key, counter}: rng_buffer holds rng_base (uploaded
    // when there is none); draws traced since add rng_drawn to the counter,
    // and rng_value is that sum in the trace. Each draw's counter advance is
    // computed in the program, not taken from XLA's generator, so the host
    // knows the state without reading it (get_rng_state does not sync).
    DeviceBuffer rng_buffer;
    std::array<uint64_t, 2> rng_base{0, 0};
    uint64_t rng_drawn = 0;
    ir::Value rng_value;
    bool rng_pending = false;
    uint64_t seed = 0;
    // manual_seed and set_rng_state calls: a graph that made one cannot be
    // recorded (its program's draws would not advance the state it left).
    int64_t rng_resets = 0;
    // Nothing traced and not yet launched: no pending storage, no pending draw.
    bool idle() const { return pending.empty() && !rng_pending; }
    // Programs launched since the last wait: Sync(wait=true) waits for all
    // of them (programs without data dependencies may run concurrently, so
    // the last one alone says nothing) and reads their checks. Events, not
    // buffers: holding a buffer would change donation decisions.
    std::vector<std::unique_ptr<pjrt::Event>> inflight;
    // Buffers a launch took whose last reference went after it. Dropped at
    // once, each would wait inside the plugin for the launches in flight to
    // let go of it (measured: the main thread blocked there on every step;
    // with torch.compile, whose forward replay follows the launch of the lazy
    // optimizer at once, for most of that launch). `retired` gathers them
    // until the next launch is tracked (TrackLaunch), which moves them to
    // `retiring` with that launch's completion: they go once it and every
    // launch before it are done (looked at, not waited for, at each launch)
    // or at a wait. Last references only: no storage sees them, so no
    // donation decision does.
    std::vector<DeviceBuffer> retired;
    struct Retiring {
      std::unique_ptr<pjrt::Event> launch_done;
      std::vector<DeviceBuffer> buffers;
    };
    std::deque<Retiring> retiring;
    // The first failure (the plugin's error) of a launch found done at a
    // later launch (TrackLaunch), for the next sync() to raise; and whether
    // it was out of memory.
    std::string failed_run;
    bool failed_run_oom = false;
    std::vector<std::shared_ptr<Outcome>> unverified;
    // The checks' result so far (i32 scalar, the id of the first failed check in trace order), or none.
    ir::Value check_code;
    // The unverified outcomes of the storages this trace read (Outcome::inputs
    // of its program's outcome).
    std::vector<std::shared_ptr<Outcome>> read;
    // Where this trace's checks were traced, at most 64; given to its Outcome.
    std::vector<std::pair<int32_t, std::string>> check_sites;
    void AddCheckSite(int32_t id, const std::string& where);
    // Recorded graphs that joined this trace (Replay), until it is launched:
    // how many calls, and what each input storage of the last call held
    // after it (JoinState). A graph called again joins again (gradient
    // accumulation's micro-batches, a model applied to two inputs, a block
    // shared by layers) unless something else wrote one of those storages
    // since (the optimizer wrote the parameters: a new step of a loop that
    // never syncs) or it joined kMaxJoins times, or programs in which it
    // joined more than once compiled kMaxJoinCompiles times already (calls
    // whose order Python control flow changes every step): then the trace
    // so far is launched first, and a trace holds one step's work.
    struct Joined {
      const ReplayProgram* program = nullptr;
      int calls = 0;
      std::vector<std::pair<uint64_t, JoinState>> after;  // per graph input: Storage::serial_, state
    };
    std::vector<Joined> joined;
    // A graph being recorded in this trace (BeginRecording in the pending
    // trace): the check codes merged since it began, its own checks.
    bool recording = false;
    std::vector<ir::Value> recorded_checks;
    int replicas = 1;  // > 1: the trace is one program over this many devices
    std::vector<int> mesh;  // SPMD: non-empty, one program partitioned over these local devices
  };
  // Steady state: a trace identical to an earlier one (same nodes, outputs,
  // donations) reuses its executable and argument order without pruning or
  // rehashing the graph.
  struct Plan {
    std::shared_ptr<pjrt::Executable> executable;
    std::vector<int64_t> used;  // trace parameter index of each program argument
    size_t num_aliases = 0;
    // Host memory a run allocates, on the CPU plugin (0: not checked).
    int64_t run_bytes = 0;
  };

  void Init();
  void ResetTrace(Trace& t);
  // Pending storages in the order of their values; storages of one value (a
  // clone, b.copy_(a)) in the order of the parameters holding their buffers,
  // so that their outputs, and the buffers they donate, are the same at every
  // step (not in the order of their addresses: a DQN's target update kept
  // compiling new programs).
  static void OrderByValue(const Trace& t, std::vector<Storage*>& storages);
  // Lets go of `b`; its last reference waits in `t.retired` (see there).
  static void Retire(Trace& t, DeviceBuffer& b);
  // SPMD: a storage's pieces as a parameter of a mesh trace (flat value);
  // a storage of one device joins the mesh replicated (device-to-device copies).
  ir::Value ShardedRead(Storage& s, ir::DType dtype);
  // SPMD: the sharding each pending storage's value is pinned to (runtime/spmd.cc).
  std::vector<std::shared_ptr<const Sharding>> PinShardings(Trace& t, const std::vector<Storage*>& storages);
  // SPMD: the whole contents of a sharded storage into `dst`, piece by piece.
  void Gather(const Sharding& sh, size_t item, const std::vector<DeviceBuffer>& pieces, void* dst);
  // A device buffer as a parameter of the current trace (memoized per
  // buffer). With per-replica buffers, replica r of a replicated program
  // reads replicas[r]; without, every replica gets a copy of `buffer`.
  ir::Value BufferParam(int device, const DeviceBuffer& buffer, ir::DType dtype,
                        const std::vector<DeviceBuffer>* replicas = nullptr);
  // A new parameter on every call, even for a buffer already a parameter:
  // for Python numbers, whose equal values share a cached buffer, so that
  // `a*0.3 + a*0.3` traces the same program as `a*0.3 + a*0.7`.
  ir::Value FreshParam(int device, const DeviceBuffer& buffer, ir::DType dtype);
  // The storage's device buffer: syncs its device when pending, uploads
  // zeros when it was never written. Caller holds mu().
  DeviceBuffer Materialize(Storage& s);
  // Replaces the storage's contents by `buffer` (drops a pending value).
  void SetBuffer(Storage& s, DeviceBuffer buffer, ir::DType dtype);
  // Waits for `buffer` and copies it to `dst`. A failure of the program that
  // wrote it is thrown; when `reported` (it reaches the user) the next
  // sync(wait=True) does not raise it again (ForgetReportedFailures).
  void CopyToHost(const DeviceBuffer& buffer, void* dst, size_t nbytes, bool reported = true);
  // A storage's buffers (one per replica or mesh position) once its
  // checks passed, for a host read: syncs it when pending.
  struct Readable {
    std::vector<DeviceBuffer> buffers;
    size_t nbytes = 0;  // of each buffer
    std::shared_ptr<const Sharding> sharding;
    size_t item = 0;  // bytes per element
  };
  Readable ReadyToRead(Storage& s);
  // CopyToHost of a whole storage's buffer, from a host copy kept of the
  // last few small buffers read (HostCopy): a loop that reads a small
  // tensor's elements one by one (`for p in preds: p.item()`) downloads it
  // once, not once per element (20,000 reads of a 156 KiB tensor moved
  // 3 GiB). A PJRT buffer is never written after it is computed, so a copy
  // stays true while its buffer lives and is not donated.
  std::shared_ptr<const std::vector<uint8_t>> CopyToHostKept(const DeviceBuffer& buffer, size_t nbytes);

  // Builds, compiles and launches device's pending work. Caller holds mu().
  void SyncDevice(int device);
  // Raises the lost value or failed check of a program (reads its flag);
  // `again`: also when it was raised before (reads raise every time).
  // Called without mu() held.
  void Verify(const std::shared_ptr<Outcome>& outcome, bool again);
  // Marks verified the unverified outcomes of `t` whose programs finished
  // with every check passed, and failed those that failed or read a failed
  // one (reads flags that are ready; never waits, never throws).
  void SettleFinished(Trace& t);
  // Fails outcome `o`, whose flag read `code` (not 0). Caller holds mu().
  void FailCheck(Outcome& o, int32_t code);
  // Marks `o` verified: its flag and every input read 0.
  static void MarkVerified(Outcome& o);
  // Adds `o` to `to` as an input of a program that read a storage it covers.
  static void AddInput(std::vector<std::shared_ptr<Outcome>>& to, const std::shared_ptr<Outcome>& o);
  // The outcome of a program of `t` with check flag `flag` (null: none) that
  // read the outcomes `inputs`; null when there is nothing to check.
  std::shared_ptr<Outcome> NewOutcome(Trace& t, DeviceBuffer flag, std::vector<std::shared_ptr<Outcome>> inputs);
  // Throws TensorError when a read of `s` must fail. Caller holds mu().
  // `by_op`: the read is an op's (or a program's) input, not a host read,
  // which the message says (it is raised where that op was traced).
  void RaiseIfLost(const Storage& s, bool by_op = false) const;
  int32_t CheckId(ErrorKind kind, const std::string& what);
  // `args`: the argument buffers' types and dims (SPMD: the pieces'); empty: the graph's parameters.
  std::shared_ptr<pjrt::Executable> GetExecutable(int device, const ir::Graph& g, const std::string& key,
                                                  const std::vector<std::string>& param_desc,
                                                  std::vector<pjrt::ArgSpec> args = {});
  void ExplainRecompile(uint64_t shape_blind_hash, const ir::Graph& g, const std::vector<std::string>& param_desc,
                        const std::vector<int>& device_ids);
  // Recompile reasons wait here until the runtime lock is released: their
  // Python location needs the GIL, which must never be taken under the lock.
  void ReportDeferred();
  // Folds one more check result (an i32 scalar: 0 or a failed check's id)
  // into t.check_code; inside an op (a TraceScope), undone if the op throws.
  void MergeCheck(Trace& t, ir::Value code);
  // After a launch: remembers its completion event, bounds the lists.
  void TrackLaunch(Trace& t, const DeviceBuffer& first_result);
  // Sync without waiting: waits for the launches (device, launch) it took
  // off the traces' lists as too far behind; raises a failure among them,
  // else `failed` (a failed launch found done since the last sync).
  void AwaitBehind(std::vector<std::pair<int, Trace::Retiring>>& behind, const std::string& failed, bool failed_oom);
  // What SyncDevice launched, for EndRecording (set only while it records).
  struct SyncCapture {
    std::shared_ptr<pjrt::Executable> executable;
    std::vector<DeviceBuffer> args;  // program arguments in order
    std::vector<bool> donated;
    std::vector<std::pair<Storage*, size_t>> writes;  // storage, program result
    size_t num_outputs = 0;
    size_t rng_output = SIZE_MAX;
    size_t check_output = SIZE_MAX;
    const pjrt::Buffer* rng_param = nullptr;
    std::shared_ptr<const ir::Graph> body;  // the program's graph (ReplayProgram::body)
    std::vector<std::pair<int32_t, std::string>> check_sites;  // Trace::check_sites of the recorded trace
  };
  // The threefry state as a value of `device`'s trace (pending, or read
  // from its buffer, uploading rng_base when there is none).
  ir::Value RngStateValue(int device);
  // `device`'s random state buffer (not pending): rng_base uploaded when
  // there is none or it was lost. Caller holds mu_.
  const DeviceBuffer& RngBuffer(int device);
  // Drops a state buffer that a failed program left as its error (when
  // that program has finished): the next draw uploads rng_base, the state
  // the program would have left. Caller holds mu_.
  void DropLostRng(int device);
  // After a read raised a program's failure (`what`): see sync.cc.
  void ForgetReportedFailures(const std::string& what);
  // Replay's joining path: `p`'s graph added to the trace (see Replay).
  void JoinTrace(const ReplayProgram& p, const std::vector<Storage*>& inputs, const std::vector<Storage*>& fresh);
  // `p`'s graph as one call on `args` (the values of its arguments in the
  // trace), its results given to the storages, random state and checks.
  void AddCall(const ReplayProgram& p, const std::vector<ir::Value>& args, const std::vector<Storage*>& inputs,
               const std::vector<Storage*>& fresh);
  // EndRecording of a graph traced into the pending trace.
  std::shared_ptr<const ReplayProgram> EndRecordingInTrace(const RecordingStart& start,
                                                           const std::vector<Storage*>& inputs,
                                                           const std::vector<Storage*>& fresh, std::string* why_not);
  // The executable of `p` launched alone (compiled on first use for a
  // recording made in the pending trace).
  const pjrt::Executable& ExecutableOf(const ReplayProgram& p);
  // Whether `p` may join `t` once more (Trace::joined says when not).
  bool MayJoinAgain(const Trace& t, const ReplayProgram& p, const std::vector<Storage*>& inputs) const;
  // Per recorded program: programs compiled in which it had joined more than once.
  std::unordered_map<const ReplayProgram*, int> multi_join_compiles_;
  static JoinState StateIn(const Trace& t, const Storage& s);
  SyncCapture* capture_ = nullptr;
  struct LoggedLaunch {
    std::shared_ptr<pjrt::Executable> executable;
    int device = 0;
    std::vector<pjrt::ArgSpec> args;
  };
  void LogLaunch(int device, const std::shared_ptr<pjrt::Executable>& exe, const std::vector<pjrt::Buffer*>& args);
  std::unique_ptr<std::vector<LoggedLaunch>> launch_log_;
  friend class TraceScope;

  std::recursive_mutex mu_;
  Options options_;
  std::shared_ptr<pjrt::Client> client_;
  std::string plugin_path_;
  std::vector<Trace> traces_;
  CompileCache cache_;
  std::string fingerprint_;
  std::unordered_map<uint64_t, Plan> plans_;  // by trace key
  // ScalarValue's buffers by (device, dtype, the number's bytes, zero
  // padded), least recently inserted first out.
  struct ScalarKey {
    int device;
    ir::DType dtype;
    std::array<uint64_t, 2> bits;
    bool operator==(const ScalarKey& o) const { return device == o.device && dtype == o.dtype && bits == o.bits; }
  };
  struct ScalarKeyHash {
    size_t operator()(const ScalarKey& k) const {
      return std::hash<uint64_t>{}(k.bits[0] * 0x9e3779b97f4a7c15ull ^ k.bits[1] ^
                                   (static_cast<uint64_t>(k.device) << 8 | static_cast<uint64_t>(k.dtype)) << 48);
    }
  };
  std::unordered_map<ScalarKey, DeviceBuffer, ScalarKeyHash> scalars_;
  struct HostCopy {
    std::weak_ptr<pjrt::Buffer> buffer;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
  };
  std::mutex host_copies_mu_;           // not mu_: downloads run without it
  std::deque<HostCopy> host_copies_;    // most recent first
  std::weak_ptr<pjrt::Buffer> partly_read_;  // the last buffer read in part (ReadWhole) ...
  int partial_reads_ = 0;                     // ... and how many times in a row
  std::weak_ptr<pjrt::Buffer> keep_whole_;   // ... the one ReadWhole chose: its download is kept
  std::list<ScalarKey> scalar_order_;
  // ShapeBlindHash -> signature of the last compiled graph with it.
  std::unordered_map<uint64_t, std::vector<std::string>> seen_structures_;
  std::vector<RecompileReason> unreported_;
  std::vector<std::string> debug_lines_;
  // Check id - 1 -> what failed; ids are stable per message, so identical
  // steps trace identical programs. Where each check of a trace was traced
  // is found once the lock is released (Trace::check_sites).
  std::vector<std::pair<ErrorKind, std::string>> checks_;
  std::unordered_map<std::string, int32_t> check_ids_;
  struct UnlocatedCheck {
    int device;
    int64_t epoch;  // of the trace that added it: a trace launched since keeps no site
    int32_t id;
  };
  std::vector<UnlocatedCheck> unlocated_checks_;
  // The op being traced (the outermost TraceScope): each trace's check_code
  // before its first MergeCheck, and unlocated_checks_' length at its start.
  // An op that throws (a lowering refusing its operands after it compiled a
  // check in) takes its checks back, or the next program would fail for it.
  struct CheckBefore {
    int device;
    int64_t epoch;
    ir::Value code;
  };
  std::vector<CheckBefore> op_checks_before_;
  size_t op_unlocated_before_ = 0;
  bool long_trace_warned_ = false;  // AssignFlat's warning, once per process
};

// RAII: holds Runtime::mu() and accumulates trace time in the metrics.
class TraceScope {
 public:
  TraceScope();
  ~TraceScope();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  int64_t start_ns_;
  int uncaught_;  // std::uncaught_exceptions() at the start: more at the end means the op threw
  bool outer_;
};

}  // namespace tpj::runtime
