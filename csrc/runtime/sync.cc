// Sync: the pending values of a device's trace become one program (plan),
// overwritten inputs donate their buffers, the program is compiled once
// (memory and disk cache) and launched; its results become the storages'
// new buffers. A compile or launch failure drops the trace's pending work.
#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>

#include "ir/hash.h"
#include "ir/printer.h"
#include "pjrt/plugin.h"
#include "runtime/compile_watch.h"
#include "runtime/dtype_map.h"
#include "runtime/program.h"
#include "runtime/runtime.h"

namespace tpj::runtime {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The largest planned memory over programs is the counter
// program_peak_bytes (the plugin's own peak figure, else arguments + what a
// run allocates).
void RecordProgramMemory(const pjrt::Executable& exe) {
  auto p = MemoryOf(exe);
  if (!p) return;
  Metrics& m = Metrics::Get();
  m.Max("program_peak_bytes", p->peak > 0 ? p->peak : p->argument + p->run());
  m.Max("program_temp_bytes", p->temp);
}

// How many launches of a device may still be running after a sync() that
// does not wait (see Runtime::Sync).
constexpr size_t kRunAhead = 3;

}  // namespace

std::shared_ptr<Outcome> LostToCurrentException(const char* stage) {
  std::string what = "unknown error";
  auto lost = std::make_shared<Outcome>();
  try {
    throw;
  } catch (const pjrt::Error& e) {
    what = e.what();
    if (e.out_of_memory()) lost->kind = ErrorKind::kOutOfMemory;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  lost->error = std::string("the value of this pjrt tensor was lost: the program computing it failed to ") + stage +
                " (" + what + "). Compute it again (after freeing memory, if it was an out-of-memory error)";
  if (lost->kind == ErrorKind::kOutOfMemory) {
    lost->error += "; state that the failed step created is lost with it (an optimizer's first-step buffers: "
                   "optimizer.state.clear() before trying again)";
  }
  lost->error += ".";
  return lost;
}

void Runtime::SyncAll(const SyncOptions& options) {
  std::vector<int> all(traces_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  Sync(all, options);
}

void Runtime::Sync(const std::vector<int>& devices, const SyncOptions& options) {
  for (int d : devices) CheckDevice(d);
  std::vector<std::unique_ptr<pjrt::Event>> events;
  std::vector<std::shared_ptr<Outcome>> outcomes;
  std::vector<DeviceBuffer> retired;  // dropped once the launches are done
  std::vector<std::pair<int, Trace::Retiring>> behind;  // (device, launch): see below
  std::string failed;  // a failed launch found done since the last sync (Trace::failed_run)
  bool failed_oom = false;
  {
    TraceScope scope;  // reports deferred recompile reasons once the lock is released
    for (int d : devices) SyncDevice(d);
    if (!options.wait) {
      // How far the host runs ahead of the device: a loop that never reads
      // (sync() per step) queued programs as fast as it traced them, each
      // holding its inputs (an uploaded batch per step: 700 MB more after 40
      // steps), and Ctrl-C or the first read waited for all of them (30 s of
      // queued steps in a Lightning fit). The launches before the last
      // kRunAhead are waited for (below), and a failure among them (a
      // program that ran out of memory while it ran) is raised by this
      // sync(), as a read would raise it, rather than found at the end.
      for (int d : devices) {
        Trace& t = traces_.at(d);
        while (t.retiring.size() > kRunAhead) {
          behind.emplace_back(d, std::move(t.retiring.front()));
          t.retiring.pop_front();
        }
        if (failed.empty() && !t.failed_run.empty()) {
          failed = t.failed_run;
          failed_oom = t.failed_run_oom;
        }
        t.failed_run.clear();
      }
    } else {
      for (int d : devices) {
        Trace& t = traces_.at(d);
        for (auto& e : t.inflight) events.push_back(std::move(e));
        for (auto& o : t.unverified) outcomes.push_back(std::move(o));
        for (auto& b : t.retired) retired.push_back(std::move(b));
        for (auto& r : t.retiring) {
          for (auto& b : r.buffers) retired.push_back(std::move(b));
        }
        t.inflight.clear();
        t.unverified.clear();
        t.retired.clear();
        t.retiring.clear();
        t.failed_run.clear();  // (its launch is in the wait list: raised below)
      }
    }
  }
  if (!options.wait) {
    AwaitBehind(behind, failed, failed_oom);
    return;
  }
  // Outside the lock: the wait check may take the GIL.
  auto t0 = std::chrono::steady_clock::now();
  const pjrt::WaitCheck check = WaitCheckFn();
  const std::shared_ptr<void> waiting = events.empty() ? nullptr : EnterWait();
  for (size_t i = 0; i < events.size(); ++i) {
    try {
      pjrt::Event::AwaitInterruptible(std::move(events[i]), check);
    } catch (...) {
      // Interrupted or failed: the programs not awaited yet stay launched;
      // their outcomes are verified when their tensors are read. The buffers
      // they may still use go back to the trace, dropped after its next
      // launch or wait: destroyed here, each would block in the plugin until
      // its program let go of it (Ctrl-C during a step that donates a buffer
      // was raised only when the program had finished).
      Metrics::Get().AddTime("execute_wait", Seconds(t0));
      std::lock_guard<std::recursive_mutex> l(mu_);
      auto& keep = traces_.at(devices.front()).retired;
      for (auto& b : retired) keep.push_back(std::move(b));
      throw;
    }
  }
  Metrics::Get().AddTime("execute_wait", Seconds(t0));
  retired.clear();
  // Every outcome is verified (one that throws must not leave the others
  // unread: what read them could never be settled); the first failure is
  // raised.
  std::exception_ptr first;
  for (const auto& o : outcomes) {
    try {
      Verify(o, /*again=*/false);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void Runtime::AwaitBehind(std::vector<std::pair<int, Trace::Retiring>>& behind, const std::string& failed,
                          bool failed_oom) {
  auto raise = [this](const std::string& what, bool oom) {
    ForgetReportedFailures(what);
    throw TensorError(oom ? ErrorKind::kOutOfMemory : ErrorKind::kFailure,
                      "a program launched earlier failed while it ran (" + what +
                          "): the tensors it computed, and those computed from them since, are lost; compute them "
                          "again (after freeing memory, if it ran out of it)");
  };
  if (behind.empty()) {
    if (!failed.empty()) raise(failed, failed_oom);
    return;
  }
  // Outside the lock: the wait check may take the GIL.
  auto t0 = std::chrono::steady_clock::now();
  const pjrt::WaitCheck check = WaitCheckFn();
  const std::shared_ptr<void> waiting = EnterWait();
  for (size_t i = 0; i < behind.size(); ++i) {
    try {
      pjrt::Event::AwaitInterruptible(std::move(behind[i].second.launch_done), check);
    } catch (...) {
      // Interrupted, or the program failed: the buffers of the launches not
      // awaited go back to their traces (dropped after a later launch or wait).
      Metrics::Get().AddTime("execute_wait", Seconds(t0));
      {
        std::lock_guard<std::recursive_mutex> l(mu_);
        for (size_t j = i; j < behind.size(); ++j) {
          auto& keep = traces_.at(behind[j].first).retired;
          for (auto& b : behind[j].second.buffers) keep.push_back(std::move(b));
        }
      }
      try {
        throw;
      } catch (const pjrt::Error& e) {
        raise(e.what(), e.out_of_memory());
      }
    }
    behind[i].second.buffers.clear();
  }
  Metrics::Get().AddTime("execute_wait", Seconds(t0));
  if (!failed.empty()) raise(failed, failed_oom);
}

std::vector<std::string> Runtime::AwaitLaunched() noexcept {
  std::vector<std::string> unread;
  if (pjrt::InForkedChild()) return unread;
  std::vector<std::unique_ptr<pjrt::Event>> events;
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (Trace& t : traces_) {
      for (auto& e : t.inflight) events.push_back(std::move(e));
      t.inflight.clear();
    }
  }
  for (auto& e : events) {
    try {
      e->Await();
    } catch (const std::exception& ex) {  // not read, or a read would have dropped it (ForgetReportedFailures)
      unread.push_back(ex.what());
    } catch (...) {
      unread.push_back("a program failed to run");
    }
  }
  try {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (Trace& t : traces_) {
      SettleFinished(t);  // every flag is ready now
      for (const auto& o : t.unverified) {
        // An inherited failure is its origin's, which is in the list too
        // (an outcome keeps its flag's until verified).
        if (o->error.empty() || o->reported || o->error.find(kInheritedClause) != std::string::npos) continue;
        o->reported = true;
        unread.push_back(o->error.substr(0, o->error.find(kFailedCheckTail)));
      }
    }
  } catch (...) {  // at exit: what cannot be read stays unsaid
  }
  return unread;
}

bool Runtime::PendingChecks() {
  std::lock_guard<std::recursive_mutex> l(mu_);
  return std::any_of(traces_.begin(), traces_.end(), [](const Trace& t) { return t.check_code.valid(); });
}

std::shared_ptr<pjrt::Executable> Runtime::GetExecutable(int device, const ir::Graph& g, const std::string& key,
                                                         const std::vector<std::string>& param_desc,
                                                         std::vector<pjrt::ArgSpec> args) {
  Metrics& m = Metrics::Get();
  if (auto exe = cache_.Lookup(key)) {
    m.Add("cache_hits");
    return exe;
  }
  if (args.empty()) {
    for (int32_t id : g.params) {
      const ir::Shape& s = g.nodes[id].results[0];
      args.push_back({ToPjrt(s.dtype), s.dims});
    }
  }
  pjrt::CompileOptions options;
  const Trace& trace = traces_.at(device);
  if (!trace.mesh.empty()) {
    // SPMD: one replica of num_partitions partitions; partition p runs on mesh device p.
    options.num_partitions = static_cast<int>(trace.mesh.size());
    options.use_spmd_partitioning = true;
    for (int d : trace.mesh) options.device_ids.push_back(global_id(d));
  } else {
    const int n = trace.replicas;
    options.num_replicas = n;
    for (int r = 0; r < n; ++r) options.device_ids.push_back(global_id(device + r));
  }
  bool corrupt = false;
  if (auto exe = cache_.LoadDisk(key, *client_, options, args, &corrupt)) {
    m.Add("disk_cache_hits");
    RecordProgramMemory(*exe);
    cache_.Insert(key, exe);
    return exe;
  }
  if (corrupt) m.Add("disk_cache_corrupt");
  auto t0 = std::chrono::steady_clock::now();
  const std::string text = ir::PrintStableHlo(g);
  if (!options_.dump_dir.empty()) std::ofstream(options_.dump_dir + "/" + key + ".mlir") << text;
  std::shared_ptr<pjrt::Executable> exe;
  try {
    size_t ops = 0;
    for (const ir::Node& node : g.nodes) ops += node.op != ir::Op::Parameter;
    CompileWatch watch(options_.compile_progress_s,
                       "a program of " + std::to_string(ops) + " ops (cache key " + key + ")");
    exe.reset(runtime::CompileText(*client_, text, options, args).release());
  } catch (...) {
    // An interrupted compile is not one: its sync comes again (CompileText)
    // and must not find its own structure and report a recompile.
    if (!CompileInterrupted()) ExplainRecompile(ir::ShapeBlindHash(g), g, param_desc, options.device_ids);
    throw;
  }
  m.AddTime("compile", Seconds(t0));
  m.Add("compiles");
  ExplainRecompile(ir::ShapeBlindHash(g), g, param_desc, options.device_ids);
  for (const Trace::Joined& j : trace.joined) {
    if (j.calls > 1) ++multi_join_compiles_[j.program];  // MayJoinAgain
  }
  RecordProgramMemory(*exe);
  cache_.Insert(key, exe);
  cache_.StoreDisk(key, *exe);
  return exe;
}

void Runtime::SyncDevice(int device) {
  Trace& t = traces_.at(device);
  // (a check alone is work: an assertion, torch._assert_async, writes
  // nothing, and its failure must still reach sync(wait=True))
  if (t.idle() && !t.check_code.valid()) {
    // Nothing to compute: ops whose results were all dropped leave nodes
    // (and parameters that hold their inputs' buffers) behind; drop them
    // too, or a loop of discarded work grows the trace without end.
    if (t.builder && !t.builder->graph().nodes.empty()) ResetTrace(t);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  Metrics& m = Metrics::Get();

  std::vector<Storage*> storages(t.pending.begin(), t.pending.end());
  OrderByValue(t, storages);
  // SPMD: every result is pinned to a sharding (PinShardings) and emitted
  // in its logical shape.
  const bool spmd = !t.mesh.empty();
  std::vector<std::shared_ptr<const Sharding>> pins;
  if (spmd) pins = PinShardings(t, storages);
  std::vector<ir::Value> outputs;
  std::vector<std::string> output_shardings;
  std::vector<size_t> output_of(storages.size());
  for (size_t i = 0; i < storages.size(); ++i) {
    ir::Value v = storages[i]->value_;
    std::string sharding;
    if (spmd) {
      v = t.builder->Reshape(v, pins[i]->dims);
      sharding = pins[i]->hlo;
    }
    // One output per storage, also where storages hold one value (a clone,
    // b.copy_(a)): storages sharing a buffer could not donate it, and the
    // next step, donating, would be another program to compile (an SGD
    // momentum buffer cloned from a kept gradient compiled 3 programs
    // where 2 do).
    output_of[i] = outputs.size();
    outputs.push_back(v);
    if (spmd) output_shardings.push_back(sharding);
  }
  size_t rng_output = SIZE_MAX;
  if (t.rng_pending) {
    rng_output = outputs.size();
    outputs.push_back(t.rng_value);
    if (spmd) output_shardings.push_back("{replicated}");
  }
  size_t check_output = SIZE_MAX;
  if (t.check_code.valid()) {
    check_output = outputs.size();
    // Replicated: a check that failed on any replica fails the program (replica 0's flag is read).
    outputs.push_back(t.replicas > 1 ? t.builder->AllReduce(t.check_code, ir::ReduceKind::Max) : t.check_code);
    if (spmd) output_shardings.push_back("{replicated}");
  }
  // Donation: a parameter buffer held only by this trace and by the one
  // storage that gets a new value in this program is reused for that value.
  std::vector<ir::Alias> aliases;
  auto param_index = [&](const pjrt::Buffer* b) -> int64_t {
    auto it = t.buffer_params.find(b);
    if (it == t.buffer_params.end()) return -1;
    const ir::Graph& graph = t.builder->graph();
    const ir::Node* n = &graph.nodes[it->second.node];
    if (n->op == ir::Op::Reshape) n = &graph.nodes[n->operands[0].node];  // SPMD: a piece read flat
    return ir::ParamIndex(*n);
  };
  const bool replicated = t.replicas > 1;
  // SPMD: a storage's pieces are held by it (buffer_ and replicas_) and by
  // its parameter (buffer and per_replica); donated per piece when nobody
  // else holds any, into a result of the same sharding.
  auto only_holders = [&](const Storage* s) {
    if (!spmd) return s->buffer_.use_count() == 2;
    if (!s->sharding_ || s->replicas_.size() != t.mesh.size() || s->buffer_.use_count() != 4) return false;
    for (size_t p = 1; p < s->replicas_.size(); ++p) {
      if (s->replicas_[p].use_count() != 2) return false;
    }
    return true;
  };
  std::vector<int64_t> donor(outputs.size(), -1);
  for (size_t i = 0; i < storages.size() && !replicated; ++i) {
    Storage* s = storages[i];
    if (!s->buffer_ || !only_holders(s)) continue;
    const int64_t p = param_index(s->buffer_.get());
    if (p < 0) continue;
    if (spmd && (!t.params[p].sharding || t.params[p].sharding->hlo != pins[i]->hlo)) continue;
    if (t.builder->shape(outputs[output_of[i]]) != t.builder->graph().nodes[t.builder->graph().params[p]].results[0]) {
      continue;
    }
    int64_t& d = donor[output_of[i]];
    if (d < 0 || p < d) d = p;
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (donor[o] >= 0) aliases.push_back({donor[o], static_cast<int64_t>(o)});
  }
  if (!replicated && !spmd && t.rng_pending && t.rng_buffer && t.rng_buffer.use_count() == 2) {
    const int64_t p = param_index(t.rng_buffer.get());
    if (p >= 0) aliases.push_back({p, static_cast<int64_t>(rng_output)});
  }
  // On a compile or launch failure, leave the device usable: drop this
  // trace's pending work; every storage it would have written (donated
  // buffers included) raises the failure when read, until overwritten.
  // Storages it only read keep their values.
  // Out of memory before anything ran (a refused launch, a plugin that
  // fails the launch at once): a storage whose buffer from before this
  // trace is intact keeps that value instead, as if the work since the last
  // sync had not been traced, so that code catching torch.OutOfMemoryError
  // (a batch-size search) goes on with its parameters.
  auto abandon = [&](const char* stage) {
    auto lost = LostToCurrentException(stage);
    const bool roll_back = lost->kind == ErrorKind::kOutOfMemory;
    for (Storage* s : storages) {
      s->pending_ = false;
      s->epoch_ = -1;
      if (roll_back && s->buffer_ && s->dtype_before_ && !s->sharding_ && !s->buffer_->is_deleted() &&
          s->buffer_->element_type() == ToPjrt(*s->dtype_before_) &&
          static_cast<size_t>(s->buffer_->element_count()) * ir::ByteSize(*s->dtype_before_) == s->nbytes_) {
        s->outcome_ = std::move(s->outcome_before_);  // a failure from before stays one
        s->dtype_ = s->dtype_before_;
        continue;
      }
      s->outcome_ = lost;
      s->outcome_before_.reset();
    }
    ResetTrace(t);
  };

  // The trace's own hash (all nodes, not only live ones) plus what this sync
  // asks of it identifies the program without pruning it.
  uint64_t trace_key = t.builder->Fingerprint();
  // Nodes built rather than taken over from an earlier trace
  // (ir::Builder::Restart): none in a steady training step.
  m.Add("ir_nodes_built", static_cast<int64_t>(t.builder->graph().nodes.size() - t.builder->taken_over()));
  auto mix = [&trace_key](uint64_t v) { trace_key = (trace_key ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; };
  for (const ir::Value& v : outputs) mix((static_cast<uint64_t>(v.node) << 8) ^ static_cast<uint64_t>(v.index));
  for (const ir::Alias& a : aliases) mix((static_cast<uint64_t>(a.param) << 32) ^ static_cast<uint64_t>(a.output));
  mix(static_cast<uint64_t>(global_id(device)));
  mix(static_cast<uint64_t>(t.replicas));
  for (int d : t.mesh) mix(static_cast<uint64_t>(global_id(d)) + 0x5bd1e995ull);
  for (const std::string& sh : output_shardings) mix(std::hash<std::string>{}(sh));

  std::vector<int64_t> used;
  std::shared_ptr<pjrt::Executable> exe;
  size_t num_aliases = aliases.size();
  int64_t run_bytes = 0;
  if (auto it = plans_.find(trace_key); it != plans_.end()) {
    exe = it->second.executable;
    used = it->second.used;
    num_aliases = it->second.num_aliases;
    run_bytes = it->second.run_bytes;
    m.Add("cache_hits");
    m.AddTime("graph_build", Seconds(t0));
  } else {
    ir::Graph g = ir::Extract(t.builder->graph(), outputs, aliases, &used);
    g.output_shardings = output_shardings;
    num_aliases = g.aliases.size();
    std::ostringstream key;
    key << std::hex << ir::ProgramHash(g) << "-d" << std::dec << global_id(device);
    if (replicated) key << "-r" << t.replicas;
    if (spmd) {
      key << "-p";
      for (int d : t.mesh) key << "." << global_id(d);
    }
    m.AddTime("graph_build", Seconds(t0));
    ClearCompileInterrupted();  // (one from another caller's compile is not this one's)
    try {
      std::vector<std::string> desc;
      std::vector<pjrt::ArgSpec> args;
      for (int64_t p : used) {
        desc.push_back(t.params[p].description);
        // SPMD: each partition's argument is its piece
        if (spmd) args.push_back({ToPjrt(t.params[p].dtype), t.params[p].buffer->dims()});
      }
      exe = GetExecutable(device, g, key.str(), desc, std::move(args));
    } catch (...) {
      // Ctrl-C during the compile: the work stays pending, and the next
      // sync takes the compile over where it has got to (CompileText).
      if (!CompileInterrupted()) abandon("compile");
      throw;
    }
    run_bytes = HostRunBytes(*client_, *exe);
    if (plans_.size() > 1024) plans_.clear();  // bounded; the compile cache keeps the executables
    plans_[trace_key] = Plan{exe, used, num_aliases, run_bytes};
  }

  // Arguments per replica: per-replica buffers, else copies of the one buffer.
  const int n = spmd ? static_cast<int>(t.mesh.size()) : t.replicas;
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
          keep_alive.push_back(DeviceBuffer(base->CopyToDevice(global_id(spmd ? t.mesh[r] : device + r))));
          args[r].push_back(keep_alive.back().get());
        }
      }
    }
    CheckHostMemory(run_bytes * n);
    if (launch_log_ && n == 1) LogLaunch(device, exe, args[0]);
    auto t1 = std::chrono::steady_clock::now();
    outs = exe->ExecuteReplicated(args);
    m.AddTime("execute_launch", Seconds(t1));
  } catch (...) {
    abandon("run");
    throw;
  }
  m.Add("executions");
  if (num_aliases) m.Add("donated_buffers", static_cast<int64_t>(num_aliases));

  std::vector<std::vector<DeviceBuffer>> per(n, std::vector<DeviceBuffer>(outputs.size()));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < outputs.size(); ++i) per[r][i] = DeviceBuffer(std::move(outs[r][i]));
  }
  const std::vector<DeviceBuffer>& shared = per[0];
  std::shared_ptr<Outcome> outcome =
      NewOutcome(t, check_output != SIZE_MAX ? shared[check_output] : DeviceBuffer(), std::move(t.read));
  if (capture_) capture_->check_sites = t.check_sites;  // a replay's failure names them too
  if (outcome) outcome->check_sites = std::move(t.check_sites);
  for (size_t i = 0; i < storages.size(); ++i) {
    Storage* s = storages[i];
    Retire(t, s->buffer_);
    s->buffer_ = shared[output_of[i]];
    s->replicas_.clear();
    if (replicated || spmd) {
      for (int r = 0; r < n; ++r) s->replicas_.push_back(per[r][output_of[i]]);
    }
    s->sharding_ = spmd ? pins[i] : nullptr;
    s->pending_ = false;
    s->epoch_ = -1;
    s->outcome_ = outcome;
    s->outcome_before_.reset();
  }
  if (capture_) {
    SyncCapture& c = *capture_;
    c.executable = exe;
    for (int64_t p : used) c.args.push_back(t.params[p].buffer);
    c.donated.assign(used.size(), false);
    for (const ir::Alias& a : aliases) {
      auto at = std::find(used.begin(), used.end(), a.param);
      if (at != used.end()) c.donated[static_cast<size_t>(at - used.begin())] = true;
    }
    for (size_t i = 0; i < storages.size(); ++i) c.writes.emplace_back(storages[i], output_of[i]);
    c.num_outputs = outputs.size();
    c.rng_output = rng_output;
    c.check_output = check_output;
    c.rng_param = t.rng_buffer.get();
    if (!spmd) {
      std::vector<int64_t> params;
      auto body = std::make_shared<ir::Graph>(ir::Extract(t.builder->graph(), outputs, {}, &params));
      if (params == used) c.body = std::move(body);
    }
  }
  if (rng_output != SIZE_MAX) {
    t.rng_buffer = shared[rng_output];
    t.rng_base[1] += t.rng_drawn;
  }
  ResetTrace(t);
  for (int r = 1; r < n; ++r) {
    if (!per[r].empty()) t.inflight.push_back(per[r].front()->ReadyEvent());
  }
  if (!shared.empty()) TrackLaunch(t, shared.front());
  m.AddTime("sync", Seconds(t0));
}

void Runtime::TrackLaunch(Trace& t, const DeviceBuffer& first_result) {
  t.inflight.push_back(first_result->ReadyEvent());
  t.retiring.push_back(Trace::Retiring{first_result->ReadyEvent(), std::move(t.retired)});
  t.retired.clear();
  while (!t.retiring.empty() && t.retiring.front().launch_done->IsReady()) {
    try {
      t.retiring.front().launch_done->Await();  // done: returns at once, or throws its failure
    } catch (const pjrt::Error& e) {
      // (one that failed for an input's earlier failure is not one of its own)
      if (t.failed_run.empty() && std::string_view(e.what()).find(pjrt::kEarlierFailure) == std::string_view::npos) {
        t.failed_run = e.what();
        t.failed_run_oom = e.out_of_memory();
      }
    }
    t.retiring.pop_front();
  }
  if (t.unverified.size() > 32) SettleFinished(t);
  if (t.inflight.size() > 256) {
    // bound the lists: drop the programs already finished, and outcomes
    // nobody can observe any more (their storages were overwritten or freed)
    std::erase_if(t.inflight, [](const std::unique_ptr<pjrt::Event>& e) { return e->IsReady(); });
    std::erase_if(t.unverified, [](const std::shared_ptr<Outcome>& o) { return o.use_count() == 1; });
  }
}

void Runtime::ForgetReportedFailures(const std::string& what) {
  // A read just raised a program's failure (`what`): that program has
  // finished, and sync(wait=True) would raise the same error again (a
  // batch-size search that caught it on .item() and retried would catch it
  // twice). Launches that finished with that error, or with none, leave
  // the wait list; another failure stays for the next wait to raise.
  // Launches not finished yet are waited for: the failed program's own
  // completion event may become ready a moment after the buffer that
  // reported its failure (seen on a loaded machine), and a failure path may
  // wait.
  std::lock_guard<std::recursive_mutex> l(mu_);
  for (Trace& t : traces_) {
    if (t.failed_run == what) t.failed_run.clear();
    // nor must a later sync() raise it (Trace::failed_run): its launch
    // leaves the list TrackLaunch looks at (its buffers go with the next)
    for (auto it = t.retiring.begin(); it != t.retiring.end();) {
      try {
        it->launch_done->Await();
      } catch (const pjrt::Error& failed) {
        if (what != failed.what()) {
          ++it;
          continue;
        }
      }
      for (auto& b : it->buffers) t.retired.push_back(std::move(b));
      it = t.retiring.erase(it);
    }
    std::erase_if(t.inflight, [&](const std::unique_ptr<pjrt::Event>& e) {
      try {
        e->Await();
        return true;
      } catch (const pjrt::Error& failed) {
        return what == failed.what();
      }
    });
  }
}

bool Runtime::Idle(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  const Trace& t = traces_.at(static_cast<size_t>(device));
  return t.idle();
}

bool Runtime::LaunchesDone(int device) {
  CheckDevice(device);
  std::lock_guard<std::recursive_mutex> l(mu_);
  for (const auto& e : traces_.at(static_cast<size_t>(device)).inflight) {
    if (!e->IsReady()) return false;
  }
  return true;
}

}  // namespace tpj::runtime
