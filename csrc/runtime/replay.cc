// Recording the program a traced graph launched, and replaying it on new
// inputs (runtime/replay.h).
#include <algorithm>
#include <chrono>
#include <sstream>
#include <unordered_map>

#include "ir/hash.h"
#include "pjrt/error.h"
#include "runtime/dtype_map.h"
#include "runtime/program.h"
#include "runtime/runtime.h"

namespace tpj::runtime {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RecordingStart Runtime::BeginRecording(int device, const std::vector<Storage*>& inputs, ReplayJoin join) {
  TraceScope scope;
  global_id(device);
  Trace& t = traces_[device];
  RecordingStart start;
  start.device = device;
  if (t.replicas > 1) start.refused = "the device runs replicated programs";
  if (!t.mesh.empty()) start.refused = "the device runs SPMD programs (a mesh is in use)";
  if (!start.refused.empty()) return start;
  for (Storage* s : inputs) {
    if (s && s->device_ != device) {
      throw pjrt::Error(pjrt::Code::kInvalidArgument, "expected all tensors to be on pjrt:" +
                                                          std::to_string(device) + ", found one on pjrt:" +
                                                          std::to_string(s->device_));
    }
  }
  // A call that joins the trace is recorded there (EndRecordingInTrace).
  // Otherwise the recorded program must be the graph's alone: earlier
  // pending work (inputs computed lazily, e.g. by an optimizer step)
  // launches first.
  start.in_trace = join == ReplayJoin::kAlways || (join == ReplayJoin::kWhenPending && !t.idle());
  if (!start.in_trace && !t.idle()) SyncDevice(device);
  if (start.in_trace) {
    if (!t.builder) ResetTrace(t);
    start.first_node = static_cast<int32_t>(t.builder->graph().nodes.size());
    start.rng_pending = t.rng_pending;
    start.rng_value = t.rng_value;
    start.rng_drawn = t.rng_drawn;
    start.check_code = t.check_code;
    start.check_sites = t.check_sites.size();
    for (Storage* s : t.pending) start.pending.emplace(s, s->value_);
    t.recording = true;
    t.recorded_checks.clear();
    t.builder->SetFoldFloor(start.first_node);
  }
  for (Storage* s : inputs) {
    ir::Value pending;
    if (s && start.in_trace && s->pending_) {
      if (s->epoch_ == t.epoch) pending = s->value_;
    } else if (s && (!s->outcome_ || s->outcome_->error.empty())) {
      Materialize(*s);  // lost values raise when read (not pending here: no sync)
    }
    start.values.push_back(pending);
    start.buffers.push_back(s && !pending.valid() ? s->buffer_.get() : nullptr);
    start.nbytes.push_back(s ? s->nbytes_ : 0);
    start.dtypes.push_back(s && s->dtype_ ? *s->dtype_ : ir::DType::U8);
  }
  start.epoch = t.epoch;
  start.host_reads = t.host_reads;
  start.rng_resets = t.rng_resets;
  return start;
}

std::shared_ptr<const ReplayProgram> Runtime::EndRecording(const RecordingStart& start,
                                                           const std::vector<Storage*>& inputs,
                                                           const std::vector<Storage*>& fresh, std::string* why_not) {
  TraceScope scope;
  const int device = start.device;
  Trace& t = traces_.at(device);
  auto refuse = [&](const std::string& why) -> std::shared_ptr<const ReplayProgram> {
    *why_not = why;
    SyncDevice(device);
    return nullptr;
  };
  if (start.in_trace) {
    // The trace records no more, refused or not (a sync since began a new
    // builder, whose fold floor is 0).
    t.recording = false;
    if (t.epoch == start.epoch) t.builder->SetFoldFloor(0);
  }
  // (a region or mesh begun during the trace synced: the epoch says so)
  if (!start.refused.empty()) return refuse(start.refused);
  if (t.epoch != start.epoch) return refuse("the device synced while the graph was traced (a CPU fallback or a value read)");
  if (t.rng_resets != start.rng_resets) {
    return refuse("the graph sets the random state (manual_seed, set_rng_state): its program's draws would not "
                  "follow it");
  }
  if (t.host_reads != start.host_reads) {
    return refuse("a value was read to the host while the graph was traced (.item(), .tolist(), a data-dependent "
                  "size): the program holds what was read");
  }
  if (inputs.size() != start.buffers.size()) return refuse("the inputs changed");
  for (size_t i = 0; i < inputs.size(); ++i) {
    Storage* s = inputs[i];
    if (!s) continue;
    if (s->nbytes_ != start.nbytes[i] || !s->dtype_ || *s->dtype_ != start.dtypes[i]) {
      return refuse("the graph resizes or retypes an input's storage");
    }
  }
  if (start.in_trace) return EndRecordingInTrace(start, inputs, fresh, why_not);
  if (t.idle()) return refuse("the graph computes nothing on the device");
  const uint64_t drawn = t.rng_drawn;  // (nothing was pending when the graph began)
  SyncCapture capture;
  capture_ = &capture;
  try {
    SyncDevice(device);
  } catch (...) {
    capture_ = nullptr;
    throw;
  }
  capture_ = nullptr;
  if (!capture.executable) {
    *why_not = "nothing was launched";
    return nullptr;
  }

  auto p = std::make_shared<ReplayProgram>();
  p->device = device;
  p->executable = capture.executable;
  p->run_bytes = HostRunBytes(*client_, *p->executable);
  std::unordered_map<const pjrt::Buffer*, int> by_buffer;
  std::unordered_map<const Storage*, int> by_storage;
  p->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    ReplayProgram::Input& in = p->inputs[i];
    Storage* s = inputs[i];
    if (!s) continue;
    in.storage = true;
    in.nbytes = start.nbytes[i];
    in.dtype = start.dtypes[i];
    auto [it, inserted] = by_storage.emplace(s, static_cast<int>(i));
    if (!inserted) in.same_as = it->second;
    if (start.buffers[i]) by_buffer.emplace(start.buffers[i], static_cast<int>(i));
  }
  for (size_t k = 0; k < capture.args.size(); ++k) {
    ReplayProgram::Arg a;
    const pjrt::Buffer* b = capture.args[k].get();
    a.donated = capture.donated[k];
    if (auto it = by_buffer.find(b); it != by_buffer.end()) {
      a.source = ReplayProgram::Source::kInput;
      a.input = it->second;
    } else if (b == capture.rng_param) {
      a.source = ReplayProgram::Source::kRng;
    } else {
      a.source = ReplayProgram::Source::kConst;
      a.constant = capture.args[k];
      if (a.donated) {
        *why_not = "the program reuses the buffer of a tensor that is not an input";
        return nullptr;
      }
    }
    p->args.push_back(std::move(a));
  }
  std::unordered_map<const Storage*, int> fresh_index;
  for (size_t k = 0; k < fresh.size(); ++k) fresh_index.emplace(fresh[k], static_cast<int>(k));
  p->results.resize(capture.num_outputs);
  p->fresh.assign(fresh.size(), ir::DType::U8);
  std::vector<bool> fresh_written(fresh.size(), false);
  for (const auto& [s, o] : capture.writes) {
    if (auto it = by_storage.find(s); it != by_storage.end()) {
      p->results[o].push_back({ReplayProgram::Target::kInput, it->second});
    } else if (auto f = fresh_index.find(s); f != fresh_index.end()) {
      p->results[o].push_back({ReplayProgram::Target::kFresh, f->second});
      p->fresh[static_cast<size_t>(f->second)] = *s->dtype_;
      fresh_written[static_cast<size_t>(f->second)] = true;
    } else {
      *why_not = "the graph writes a tensor that is neither an input nor an output";
      return nullptr;
    }
  }
  if (std::find(fresh_written.begin(), fresh_written.end(), false) != fresh_written.end()) {
    *why_not = "an output of the graph is not computed by the program";
    return nullptr;
  }
  if (capture.rng_output != SIZE_MAX) {
    p->results[capture.rng_output].push_back({ReplayProgram::Target::kRng, -1});
    p->rng_advance = drawn;
  }
  if (capture.check_output != SIZE_MAX) {
    p->results[capture.check_output].push_back({ReplayProgram::Target::kFlag, -1});
    p->checked = true;
    p->check_sites = std::move(capture.check_sites);
  }
  p->body = std::move(capture.body);
  if (p->body) {
    for (size_t k = 0; k < p->args.size(); ++k) {
      p->args[k].dtype = p->body->nodes[static_cast<size_t>(p->body->params[k])].results[0].dtype;
    }
  }
  Metrics::Get().Add("replay_recordings");
  return p;
}

void Runtime::JoinTrace(const ReplayProgram& p, const std::vector<Storage*>& inputs,
                        const std::vector<Storage*>& fresh) {
  std::vector<ir::Value> args(p.args.size());
  for (size_t k = 0; k < p.args.size(); ++k) {
    const ReplayProgram::Arg& a = p.args[k];
    const ir::DType dtype = a.dtype;  // not read from the body: its nodes are cold in the cache
    switch (a.source) {
      case ReplayProgram::Source::kInput:
        args[k] = ReadFlat(*inputs[static_cast<size_t>(a.input)], dtype);  // its outcome joins t.read
        break;
      case ReplayProgram::Source::kRng:
        args[k] = RngStateValue(p.device);
        break;
      case ReplayProgram::Source::kConst:  // a cached scalar: its own parameter, as ScalarValue makes them
        args[k] = FreshParam(p.device, a.constant, dtype);
        break;
    }
  }
  AddCall(p, args, inputs, fresh);
}

void Runtime::AddCall(const ReplayProgram& p, const std::vector<ir::Value>& args, const std::vector<Storage*>& inputs,
                      const std::vector<Storage*>& fresh) {
  Trace& t = traces_[p.device];
  const std::vector<ir::Value> outs = t.builder->Call(p.body, args);
  for (size_t o = 0; o < p.results.size(); ++o) {
    for (const ReplayProgram::Result& r : p.results[o]) {
      switch (r.target) {
        case ReplayProgram::Target::kInput:
          AssignFlat(*inputs[static_cast<size_t>(r.index)], outs[o]);
          break;
        case ReplayProgram::Target::kFresh: {
          Storage& s = *fresh[static_cast<size_t>(r.index)];
          s.dtype_ = p.fresh[static_cast<size_t>(r.index)];
          AssignFlat(s, outs[o]);
          break;
        }
        case ReplayProgram::Target::kRng:
          t.rng_value = outs[o];
          t.rng_drawn += p.rng_advance;
          t.rng_pending = true;
          break;
        case ReplayProgram::Target::kFlag:
          MergeCheck(t, outs[o]);
          for (const auto& [id, where] : p.check_sites) t.AddCheckSite(id, where);
          break;
      }
    }
  }
  Trace::Joined* j = nullptr;
  for (Trace::Joined& e : t.joined) {
    if (e.program == &p) j = &e;
  }
  if (!j) {
    t.joined.push_back({&p, 0, {}});
    j = &t.joined.back();
  }
  ++j->calls;
  j->after.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]) {
      j->after[i] = {inputs[i]->serial_, StateIn(t, *inputs[i])};
    } else {
      j->after[i] = {UINT64_MAX, JoinState{}};
    }
  }
}

std::shared_ptr<const ReplayProgram> Runtime::EndRecordingInTrace(const RecordingStart& start,
                                                                  const std::vector<Storage*>& inputs,
                                                                  const std::vector<Storage*>& fresh,
                                                                  std::string* why_not) {
  const int device = start.device;
  Trace& t = traces_.at(device);
  auto refuse = [&](const std::string& why) -> std::shared_ptr<const ReplayProgram> {
    *why_not = why;
    SyncDevice(device);
    return nullptr;
  };
  std::unordered_map<const Storage*, int> by_storage;
  auto p = std::make_shared<ReplayProgram>();
  p->device = device;
  p->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Storage* s = inputs[i];
    if (!s) continue;
    ReplayProgram::Input& in = p->inputs[i];
    in.storage = true;
    in.nbytes = start.nbytes[i];
    in.dtype = start.dtypes[i];
    auto [it, inserted] = by_storage.emplace(s, static_cast<int>(i));
    if (!inserted) in.same_as = it->second;
  }
  std::unordered_map<const Storage*, int> fresh_index;
  for (size_t k = 0; k < fresh.size(); ++k) fresh_index.emplace(fresh[k], static_cast<int>(k));

  // What the graph wrote: storages pending now that were not, or held
  // another value, when it began; in the order SyncDevice gives them.
  std::vector<Storage*> written;
  for (Storage* s : t.pending) {
    auto it = start.pending.find(s);
    if (it == start.pending.end() || !(it->second == s->value_)) written.push_back(s);
  }
  OrderByValue(t, written);
  // One output per storage, also for storages of one value, as SyncDevice
  // gives them: a replay launched alone can then donate each one's buffer.
  std::vector<ir::Value> outputs;
  auto output_of = [&](ir::Value v) {
    outputs.push_back(v);
    p->results.emplace_back();
    return outputs.size() - 1;
  };
  p->fresh.assign(fresh.size(), ir::DType::U8);
  std::vector<bool> fresh_written(fresh.size(), false);
  for (Storage* s : written) {
    if (auto it = by_storage.find(s); it != by_storage.end()) {
      p->results[output_of(s->value_)].push_back({ReplayProgram::Target::kInput, it->second});
    } else if (auto f = fresh_index.find(s); f != fresh_index.end()) {
      p->results[output_of(s->value_)].push_back({ReplayProgram::Target::kFresh, f->second});
      p->fresh[static_cast<size_t>(f->second)] = *s->dtype_;
      fresh_written[static_cast<size_t>(f->second)] = true;
    } else {
      return refuse("the graph writes a tensor that is neither an input nor an output");
    }
  }
  if (std::find(fresh_written.begin(), fresh_written.end(), false) != fresh_written.end()) {
    return refuse("an output of the graph is not computed by the program");
  }
  if (t.rng_pending && !(start.rng_pending && t.rng_value == start.rng_value)) {
    p->results.emplace_back().push_back({ReplayProgram::Target::kRng, -1});
    outputs.push_back(t.rng_value);
    p->rng_advance = t.rng_drawn - start.rng_drawn;
  }
  if (!t.recorded_checks.empty()) {
    // The graph's own checks, merged as MergeCheck does (the first failed
    // one in trace order); in the trace they were merged into what came
    // before the graph.
    ir::Builder& b = *t.builder;
    ir::Value code = t.recorded_checks.front();
    for (size_t k = 1; k < t.recorded_checks.size(); ++k) {
      const ir::Value failed = b.Compare(ir::CompareDir::NE, code, b.ScalarConstant(ir::DType::I32, 0));
      code = b.Select(failed, code, t.recorded_checks[k]);
    }
    p->results.emplace_back().push_back({ReplayProgram::Target::kFlag, -1});
    outputs.push_back(code);
    p->checked = true;
    p->check_sites.assign(t.check_sites.begin() + static_cast<std::ptrdiff_t>(std::min(start.check_sites,
                                                                                       t.check_sites.size())),
                          t.check_sites.end());
  }
  if (outputs.empty()) return refuse("the graph computes nothing on the device");

  // The program's graph: the graph's part of the trace, reading what came
  // before it (inputs' pending values, parameters) as its arguments.
  std::vector<ir::Value> externals;
  p->body = std::make_shared<ir::Graph>(ir::ExtractFrom(t.builder->graph(), outputs, start.first_node, &externals));
  const ir::Graph& g = t.builder->graph();
  for (const ir::Value& e : externals) {
    ReplayProgram::Arg a;
    a.dtype = g.shape(e).dtype;
    const ir::Node& n = g.nodes[static_cast<size_t>(e.node)];
    const pjrt::Buffer* buffer = n.op == ir::Op::Parameter ? t.params[ir::ParamIndex(n)].buffer.get() : nullptr;
    for (size_t i = 0; i < inputs.size() && a.input < 0; ++i) {
      if (!inputs[i] || p->inputs[i].same_as >= 0) continue;
      if (start.values[i].valid() ? start.values[i] == e : (buffer && start.buffers[i] == buffer)) {
        a.source = ReplayProgram::Source::kInput;
        a.input = static_cast<int>(i);
      }
    }
    if (a.input < 0) {
      if (start.rng_pending ? e == start.rng_value : (buffer && buffer == t.rng_buffer.get())) {
        a.source = ReplayProgram::Source::kRng;
      } else if (buffer) {
        a.source = ReplayProgram::Source::kConst;  // a cached scalar
        a.constant = t.params[ir::ParamIndex(n)].buffer;
      } else {
        return refuse("the graph reads a value computed before it that is not one of its inputs");
      }
    }
    p->args.push_back(std::move(a));
  }
  // Launched alone, the program writes each input it overwrites into that
  // input's buffer.
  std::vector<bool> aliased(outputs.size(), false);
  for (size_t k = 0; k < p->args.size(); ++k) {
    ReplayProgram::Arg& a = p->args[k];
    if (a.source != ReplayProgram::Source::kInput) continue;
    for (size_t o = 0; o < p->results.size() && !a.donated; ++o) {
      if (aliased[o] || !(g.shape(outputs[o]) == g.shape(externals[k]))) continue;
      for (const ReplayProgram::Result& r : p->results[o]) {
        if (r.target == ReplayProgram::Target::kInput && r.index == a.input) {
          a.donated = true;
          aliased[o] = true;
          p->aliases.push_back({static_cast<int64_t>(k), static_cast<int64_t>(o)});
          break;
        }
      }
    }
  }
  // The trace from here on: the graph's part as one call, as a later call
  // joins (its nodes stay behind, read by nothing).
  t.check_code = start.check_code;
  t.rng_drawn = start.rng_drawn;  // (the call draws them again)
  AddCall(*p, externals, inputs, fresh);
  Metrics::Get().Add("replay_recordings");
  return p;
}

const pjrt::Executable& Runtime::ExecutableOf(const ReplayProgram& p) {
  if (!p.executable) {
    ir::Graph g = *p.body;
    g.aliases = p.aliases;
    std::ostringstream key;
    key << std::hex << ir::ProgramHash(g) << "-d" << std::dec << global_id(p.device);
    p.executable = GetExecutable(p.device, g, key.str(), std::vector<std::string>(g.params.size()), {});
    p.run_bytes = HostRunBytes(*client_, *p.executable);
  }
  return *p.executable;
}

Runtime::JoinState Runtime::StateIn(const Trace& t, const Storage& s) {
  if (s.pending_ && s.epoch_ == t.epoch) return {s.value_, nullptr};
  return {ir::Value{}, s.buffer_.get()};
}

bool Runtime::MayJoinAgain(const Trace& t, const ReplayProgram& p, const std::vector<Storage*>& inputs) const {
  for (const Trace::Joined& j : t.joined) {
    if (j.program != &p) continue;
    if (j.calls >= kMaxJoins) return false;
    // Programs in which it joined more than once kept compiling (calls
    // that Python control flow orders differently each step, e.g. random
    // teacher forcing: a step of 6 calls has up to 64 such programs): it
    // joins once per trace from then on, a program per call, each cached.
    if (auto it = multi_join_compiles_.find(&p); it != multi_join_compiles_.end() && it->second >= kMaxJoinCompiles) {
      return false;
    }
    // The same storage in the same place as in the last call (a parameter,
    // a buffer the graph updates): it must hold what that call left in it.
    // Another storage there is new data (the next micro-batch).
    for (size_t i = 0; i < inputs.size() && i < j.after.size(); ++i) {
      const Storage* s = inputs[i];
      if (s && s->serial_ == j.after[i].first && !(StateIn(t, *s) == j.after[i].second)) return false;
    }
    return true;
  }
  return true;
}

bool Runtime::Replay(const ReplayProgram& p, const std::vector<Storage*>& inputs, const std::vector<Storage*>& fresh,
                     ReplayJoin join) {
  // Not a TraceScope: a replay traces no op (traced_ops counts ATen ops).
  struct Unlock {
    Runtime& rt;
    std::unique_lock<std::recursive_mutex> lock;
    ~Unlock() {
      lock.unlock();
      try {
        rt.ReportDeferred();  // of a sync of pending inputs
      } catch (...) {        // a destructor must not throw; the reasons are reported by the next trace
      }
    }
  } scope{*this, std::unique_lock<std::recursive_mutex>(mu_)};
  auto t0 = std::chrono::steady_clock::now();
  Metrics& m = Metrics::Get();
  Trace& t = traces_.at(p.device);
  if (t.replicas > 1 || !t.mesh.empty() || inputs.size() != p.inputs.size() || fresh.size() != p.fresh.size()) {
    return false;
  }
  // The storages, as recorded: the same sizes, the same aliasing between inputs.
  bool pending = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ReplayProgram::Input& in = p.inputs[i];
    Storage* s = inputs[i];
    if (in.storage != (s != nullptr)) return false;
    if (!s) continue;
    if (s->device_ != p.device || s->nbytes_ != in.nbytes || s->sharding_) return false;
    if (in.same_as >= 0) {
      if (inputs[static_cast<size_t>(in.same_as)] != s) return false;
    } else {
      for (size_t j = 0; j < i; ++j) {
        if (inputs[j] == s) return false;
      }
    }
    pending = pending || s->pending_;
  }
  bool uses_rng = false;
  for (const ReplayProgram::Arg& a : p.args) uses_rng = uses_rng || a.source == ReplayProgram::Source::kRng;
  bool joins = p.body && t.mesh.empty() && join != ReplayJoin::kNever;
  if (joins && !MayJoinAgain(t, p, inputs)) {
    SyncDevice(p.device);  // a new step (Trace::joined): the trace so far is one step's work
    pending = false;
  }
  const bool busy = !t.idle();
  joins = joins && (join == ReplayJoin::kAlways || busy);
  if (!joins && (pending || (uses_rng && t.rng_pending))) SyncDevice(p.device);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Storage* s = inputs[i];
    if (!s) continue;
    RaiseIfLost(*s, /*by_op=*/true);
    if (!s->dtype_) s->dtype_ = p.inputs[i].dtype;
    if (*s->dtype_ != p.inputs[i].dtype) return false;
    if (!s->buffer_ && !joins) Materialize(*s);
  }
  if (joins) {
    JoinTrace(p, inputs, fresh);
    m.Add("replays");
    m.Add("replays_joined");
    m.AddTime("replay", Seconds(t0));
    return true;
  }
  ExecutableOf(p);  // (a compile failure loses nothing)
  // Arguments.
  std::vector<pjrt::Buffer*> args(p.args.size(), nullptr);
  for (size_t k = 0; k < p.args.size(); ++k) {
    const ReplayProgram::Arg& a = p.args[k];
    switch (a.source) {
      case ReplayProgram::Source::kInput: {
        const DeviceBuffer& b = inputs[static_cast<size_t>(a.input)]->buffer_;
        // A donated buffer must be this storage's alone (a pending trace or
        // another storage that holds it would read freed memory).
        if (a.donated && b.use_count() != 1) return false;
        args[k] = b.get();
        break;
      }
      case ReplayProgram::Source::kRng: {
        const DeviceBuffer& rng = RngBuffer(p.device);
        if (a.donated && rng.use_count() != 1) return false;
        args[k] = rng.get();
        break;
      }
      case ReplayProgram::Source::kConst:
        args[k] = a.constant.get();
        break;
    }
  }
  std::vector<std::unique_ptr<pjrt::Buffer>> outs;
  try {
    CheckHostMemory(p.run_bytes);
    if (launch_log_) LogLaunch(p.device, p.executable, args);
    auto t1 = std::chrono::steady_clock::now();
    outs = p.executable->Execute(args);
    m.AddTime("execute_launch", Seconds(t1));
  } catch (...) {
    // As a failed sync: what the program would have written is lost, but
    // out of memory before it ran leaves intact inputs as they were.
    auto lost = LostToCurrentException("run");
    for (const auto& rs : p.results) {
      for (const ReplayProgram::Result& r : rs) {
        if (r.target != ReplayProgram::Target::kInput) continue;
        Storage& s = *inputs[static_cast<size_t>(r.index)];
        if (lost->kind == ErrorKind::kOutOfMemory && s.buffer_ && !s.buffer_->is_deleted()) continue;
        s.outcome_ = lost;
      }
    }
    throw;
  }
  m.Add("executions");
  m.Add("replays");
  std::vector<DeviceBuffer> results(outs.size());
  for (size_t o = 0; o < outs.size(); ++o) results[o] = DeviceBuffer(std::move(outs[o]));
  DeviceBuffer flag;
  for (size_t o = 0; o < p.results.size() && p.checked; ++o) {
    for (const ReplayProgram::Result& r : p.results[o]) {
      if (r.target == ReplayProgram::Target::kFlag) flag = results[o];
    }
  }
  std::vector<std::shared_ptr<Outcome>> read;  // before the results replace the inputs' outcomes
  for (const ReplayProgram::Arg& a : p.args) {  // inputs only overwritten carry nothing
    if (a.source == ReplayProgram::Source::kInput) AddInput(read, inputs[static_cast<size_t>(a.input)]->outcome_);
  }
  const std::shared_ptr<Outcome> outcome = NewOutcome(t, std::move(flag), std::move(read));
  if (outcome) outcome->check_sites = p.check_sites;
  int64_t donated = 0;
  for (const ReplayProgram::Arg& a : p.args) donated += a.donated ? 1 : 0;
  if (donated) m.Add("donated_buffers", donated);
  for (size_t o = 0; o < p.results.size() && o < results.size(); ++o) {
    for (const ReplayProgram::Result& r : p.results[o]) {
      Storage* s = nullptr;
      switch (r.target) {
        case ReplayProgram::Target::kInput:
          s = inputs[static_cast<size_t>(r.index)];
          break;
        case ReplayProgram::Target::kFresh:
          s = fresh[static_cast<size_t>(r.index)];
          s->dtype_ = p.fresh[static_cast<size_t>(r.index)];
          break;
        case ReplayProgram::Target::kRng:
          t.rng_buffer = results[o];
          t.rng_base[1] += p.rng_advance;  // (nothing was pending: synced above)
          break;
        case ReplayProgram::Target::kFlag:
          break;
      }
      if (!s) continue;
      Retire(t, s->buffer_);
      s->buffer_ = results[o];
      s->replicas_.clear();
      s->outcome_ = outcome;
    }
  }
  if (!results.empty()) TrackLaunch(t, results.front());
  m.AddTime("replay", Seconds(t0));
  return true;
}

void Runtime::StartLaunchLog() {
  std::lock_guard<std::recursive_mutex> l(mu_);
  launch_log_ = std::make_unique<std::vector<LoggedLaunch>>();
}

void Runtime::LogLaunch(int device, const std::shared_ptr<pjrt::Executable>& exe,
                        const std::vector<pjrt::Buffer*>& args) {
  LoggedLaunch l{exe, device, {}};
  for (const pjrt::Buffer* b : args) l.args.push_back({b->element_type(), b->dims()});
  launch_log_->push_back(std::move(l));
}

double Runtime::ExecuteLoggedPrograms(int iterations) {
  std::vector<LoggedLaunch> log;
  {
    std::lock_guard<std::recursive_mutex> l(mu_);
    if (launch_log_) log.swap(*launch_log_);
    launch_log_.reset();
  }
  if (log.empty() || iterations < 1) return 0.0;
  double total = 0.0;
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> args(log.size());
    for (size_t k = 0; k < log.size(); ++k) {
      for (const pjrt::ArgSpec& a : log[k].args) {
        int64_t numel = 1;
        for (int64_t d : a.dims) numel *= d;
        std::vector<uint8_t> zeros(static_cast<size_t>(numel) * ir::ByteSize(FromPjrt(a.type)), 0);
        args[k].push_back(client_->BufferFromHost(zeros.data(), a.type, a.dims, global_id(log[k].device)));
      }
    }
    for (auto& as : args) {
      for (auto& b : as) b->AwaitReady();
    }
    std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> outs;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t k = 0; k < log.size(); ++k) {
      std::vector<pjrt::Buffer*> raw;
      for (auto& b : args[k]) raw.push_back(b.get());
      outs.push_back(log[k].executable->Execute(raw));
    }
    for (auto& os : outs) {
      for (auto& b : os) b->AwaitReady();
    }
    total += Seconds(t0);
  }
  return total / iterations;
}

}  // namespace tpj::runtime
