// Building the trace: storages read as values of the device's current
// trace, pending values assigned to storages, random bits.
#include <algorithm>
#include <cstring>
#include <string>

#include "ir/printer.h"
#include "pjrt/error.h"
#include "runtime/runtime.h"
#include "runtime/warnings.h"

namespace tpj::runtime {

void Runtime::ResetTrace(Trace& t) {
  const int partitions = t.mesh.empty() ? 1 : static_cast<int>(t.mesh.size());
  if (t.builder && t.builder->graph().num_replicas == t.replicas && t.builder->graph().num_partitions == partitions) {
    t.builder->Restart();  // a step traced again takes over the last trace's nodes
  } else {
    t.builder = std::make_unique<ir::Builder>(t.replicas, partitions);
    t.builder->SetCpuBackend(client_->platform_name() == "cpu");
    t.builder->SetStagedSums(partitions == 1 && t.builder->cpu_backend());
  }
  t.epoch += 1;
  for (Param& p : t.params) {
    Retire(t, p.buffer);
    for (DeviceBuffer& b : p.per_replica) Retire(t, b);
  }
  t.params.clear();
  t.buffer_params.clear();
  t.pending.clear();
  t.rng_pending = false;
  t.rng_drawn = 0;  // (a launch first moved rng_base past them)
  t.rng_value = ir::Value{};
  t.check_code = ir::Value{};
  t.check_sites.clear();
  t.read.clear();
  t.joined.clear();
  t.recording = false;  // (EndRecording sees the epoch change)
  t.recorded_checks.clear();
}

void Runtime::Retire(Trace& t, DeviceBuffer& b) {
  if (b && b.use_count() == 1) {
    b->Untally();  // memory_allocated() counts what tensors hold
    t.retired.push_back(std::move(b));
  }
  b.reset();
}

ir::Builder& Runtime::builder(int device) {
  global_id(device);
  return *traces_[device].builder;
}

size_t Runtime::pending_count(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  return traces_.at(device).pending.size();
}

int64_t Runtime::trace_epoch(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  return traces_.at(device).epoch;
}

void Runtime::OrderByValue(const Trace& t, std::vector<Storage*>& storages) {
  auto param_node = [&](const Storage* s) -> int32_t {
    auto it = s->buffer_ ? t.buffer_params.find(s->buffer_.get()) : t.buffer_params.end();
    return it == t.buffer_params.end() ? -1 : it->second.node;
  };
  std::sort(storages.begin(), storages.end(), [&](const Storage* a, const Storage* b) {
    if (a->value_.node != b->value_.node) return a->value_.node < b->value_.node;
    if (a->value_.index != b->value_.index) return a->value_.index < b->value_.index;
    return param_node(a) < param_node(b);
  });
}

size_t Runtime::trace_nodes(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  const Trace& t = traces_.at(device);
  return t.builder ? t.builder->graph().nodes.size() : 0;
}

ir::Value Runtime::BufferParam(int device, const DeviceBuffer& buffer, ir::DType dtype,
                               const std::vector<DeviceBuffer>* replicas) {
  Trace& t = traces_[device];
  auto it = t.buffer_params.find(buffer.get());
  if (it != t.buffer_params.end()) return it->second;
  ir::Value v = FreshParam(device, buffer, dtype);
  if (replicas && static_cast<int>(replicas->size()) == t.replicas) t.params.back().per_replica = *replicas;
  t.buffer_params[buffer.get()] = v;
  return v;
}

ir::Value Runtime::FreshParam(int device, const DeviceBuffer& buffer, ir::DType dtype) {
  Trace& t = traces_[device];
  Param p;
  p.buffer = buffer;
  p.dtype = dtype;
  t.params.push_back(std::move(p));
  // SPMD: a buffer of one device (numbers, random state) is
  // copied to every mesh device at launch; the program reads it replicated.
  return t.builder->Parameter({dtype, buffer->dims()}, t.mesh.empty() ? "" : "{replicated}");
}

void Runtime::DescribeRead(Storage& s, ir::Value flat, const std::function<std::string()>& description) {
  if (s.pending_ || !s.buffer_) return;  // only parameters are described
  Trace& t = traces_[s.device_];
  const ir::Node& n = t.builder->graph().nodes[flat.node];
  if (n.op != ir::Op::Parameter) return;
  std::string& d = t.params[ir::ParamIndex(n)].description;
  if (d.empty()) d = description();
}

void Runtime::RaiseIfLost(const Storage& s, bool by_op) const {
  if (s.outcome_ && !s.outcome_->error.empty()) {
    s.outcome_->reported = true;
    throw TensorError(s.outcome_->kind, by_op ? s.outcome_->error + "; raised here by an op that reads one of those tensors"
                                              : s.outcome_->error);
  }
}

ir::Value Runtime::ReadFlat(Storage& s, ir::DType dtype) {
  Trace& t = traces_[s.device_];
  RaiseIfLost(s, /*by_op=*/true);
  // Checks of the program that wrote s: this program's results are as
  // invalid as s if they failed.
  if (!s.pending_) AddInput(t.read, s.outcome_);
  if (!s.dtype_) s.dtype_ = dtype;
  const ir::DType have = *s.dtype_;
  const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(have));
  ir::Value v;
  if (s.pending_ && s.epoch_ == t.epoch) {
    v = s.value_;
  } else if (s.buffer_ && (!t.mesh.empty() || s.sharding_)) {
    v = ShardedRead(s, have);
  } else if (s.buffer_) {
    v = BufferParam(s.device_, s.buffer_, have, s.replicas_.empty() ? nullptr : &s.replicas_);
  } else {
    v = t.builder->Full(have, {numel}, 0);
  }
  if (have == dtype) return v;
  // A view of a wider type on a storage whose bytes are no whole number of
  // its elements (u[:4].view(torch.int32) of 7 bytes, a storage resized to
  // 6 bytes under a float view): the bytes past its last whole element are
  // in no element of it.
  const size_t width = ir::ByteSize(dtype);
  if (width > ir::ByteSize(have) && s.nbytes_ % width != 0) {
    v = t.builder->Slice(v, {0}, {static_cast<int64_t>(s.nbytes_ / width * width / ir::ByteSize(have))}, {1});
  }
  // Of another element size too: torch.load uploads bytes, view_as_real
  // reads complex storage as floats (Bitcast takes complex values apart).
  return t.builder->Bitcast(v, dtype);
}

void Runtime::AssignFlat(Storage& s, ir::Value flat) {
  Trace& t = traces_[s.device_];
  // A trace far longer than a training step's (bench's 4-layer GPT step is
  // about 4500 nodes): a loop without sync() keeps growing it, and XLA's
  // compile time and memory grow faster than the program (5000 add_ on one
  // tensor compiled for 28 s in 3 GB, 10000 for 5 minutes in 15 GB).
  constexpr size_t kLongTrace = 100000;
  if (!long_trace_warned_ && t.builder->graph().nodes.size() >= kLongTrace) {
    long_trace_warned_ = true;
    Warn("the pending trace of pjrt:" + std::to_string(s.device_) + " has grown to " + std::to_string(kLongTrace) +
         " nodes without a sync(): compiling it will take long and much memory. Call torch_pjrt.sync() once per "
         "step or loop iteration (docs/device.md). Warned once per process");
  }
  const ir::Shape& shape = t.builder->shape(flat);
  if (!s.pending_) {  // its state before this trace, for a rollback (SyncDevice)
    s.outcome_before_ = s.outcome_;
    s.dtype_before_ = s.dtype_;
  }
  // A value of another dtype that covers the whole storage retypes it rather
  // than being bitcast back: storages that torch.load uploaded as bytes take
  // the dtype of their first full write (an optimizer state after resuming),
  // so later programs read them without a bitcast, the same programs as in
  // training that was never interrupted.
  if (!s.dtype_ || (shape.dtype != *s.dtype_ && shape.bytes() == s.nbytes_)) s.dtype_ = shape.dtype;
  if (shape.dtype != *s.dtype_) {
    flat = t.builder->Bitcast(flat, *s.dtype_);
    // A value of a wider type leaves out the bytes past its last whole
    // element (ReadFlat): they keep their value.
    const int64_t got = t.builder->shape(flat).dims.at(0);
    const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(*s.dtype_));
    if (got < numel) {
      const ir::Value tail = t.builder->Slice(ReadFlat(s, *s.dtype_), {got}, {numel}, {1});
      flat = t.builder->Concatenate({flat, tail}, 0);
    }
  }
  s.value_ = flat;
  s.epoch_ = t.epoch;
  s.outcome_.reset();  // the outcomes of what the value read are in t.read
  if (!s.pending_) {
    s.pending_ = true;
    t.pending.insert(&s);
  }
}

void Runtime::Resize(Storage& s, size_t nbytes, ir::DType dtype) {
  if (nbytes == s.nbytes_) return;
  Trace& t = traces_[s.device_];
  if (nbytes == 0) {  // storage.resize_(0) frees the memory (FSDP, offloading)
    if (s.pending_) t.pending.erase(&s);
    s.pending_ = false;
    s.nbytes_ = 0;
    s.buffer_.reset();
    s.replicas_.clear();
    s.sharding_.reset();
    s.outcome_.reset();
    return;
  }
  ir::Builder& b = builder(s.device_);
  // By elements of `dtype` (or of the storage's own type) when both sizes are
  // whole elements, else by bytes.
  const ir::DType want_type = s.dtype_.value_or(dtype);
  const ir::DType by = s.nbytes_ % ir::ByteSize(want_type) == 0 && nbytes % ir::ByteSize(want_type) == 0
                           ? want_type
                           : ir::DType::U8;
  ir::Value flat = ReadFlat(s, by);
  const size_t item = ir::ByteSize(by);
  const int64_t have = static_cast<int64_t>(s.nbytes_ / item);
  const int64_t want = static_cast<int64_t>(nbytes / item);
  ir::Value resized = want > have ? b.Pad(flat, b.ScalarConstant(by, 0), {0}, {want - have}, {0})
                                  : b.Slice(flat, {0}, {want}, {1});
  s.nbytes_ = nbytes;
  s.buffer_.reset();
  s.replicas_.clear();
  s.sharding_.reset();
  AssignFlat(s, resized);
}

void Runtime::Unregister(Storage* s) {
  // Freed from Python, with the GIL held. Where a sync holds the lock (a
  // compile), the GIL is let go while waiting for it: that compile's wait
  // takes the GIL to raise Ctrl-C (program.cc, SigintWatch).
  std::unique_lock<std::recursive_mutex> l(mu_, std::try_to_lock);
  std::shared_ptr<void> waiting;
  if (!l.owns_lock()) {
    waiting = EnterWait();
    l.lock();
  }
  if (s->pending_ && s->device_ >= 0 && s->device_ < static_cast<int>(traces_.size())) {
    traces_[s->device_].pending.erase(s);
  }
  l.unlock();  // before the GIL comes back (`waiting`)
}

void Runtime::DropLostRng(int device) {
  Trace& t = traces_[device];
  if (!t.rng_buffer) return;
  const std::unique_ptr<pjrt::Event> done = t.rng_buffer->ReadyEvent();
  if (!done->IsReady()) return;
  // A program that drew numbers and then failed (out of memory while it
  // ran) left its error as the state buffer: every later draw would fail
  // with it. The state it would have left is known (rng_base): uploaded
  // again, the stream goes on as if the program had run.
  try {
    done->Await();
  } catch (const pjrt::Error&) {
    t.rng_buffer.reset();
  }
}

const DeviceBuffer& Runtime::RngBuffer(int device) {
  Trace& t = traces_[device];
  DropLostRng(device);
  if (!t.rng_buffer) {
    // Uploaded, not a constant: programs that draw after manual_seed(s) are
    // the same program for every s.
    t.rng_buffer = Upload(t.rng_base.data(), ir::DType::U64, {2}, device);
  }
  return t.rng_buffer;
}

ir::Value Runtime::RngStateValue(int device) {
  Trace& t = traces_[device];
  if (t.rng_pending) return t.rng_value;
  return BufferParam(device, RngBuffer(device), ir::DType::U64);
}

ir::Value Runtime::RandomBits(int device, const ir::Shape& bits) {
  Trace& t = traces_[device];
  const ir::Value state = RngStateValue(device);
  ir::Builder& b = *t.builder;
  ir::Value out = b.RngBitGenerator(state, bits)[1];
  // The next state: the counter moved past this draw's, by us (RngAdvance)
  // rather than by XLA's generator, so that the host knows it.
  const uint64_t advance = RngAdvance(bits);
  const uint64_t step[2] = {0, advance};
  std::vector<uint8_t> bytes(sizeof(step));
  std::memcpy(bytes.data(), step, sizeof(step));
  t.rng_value = b.Binary(ir::Op::Add, state, b.Constant({ir::DType::U64, {2}}, std::move(bytes)));
  t.rng_drawn += advance;
  t.rng_pending = true;
  return out;
}

int32_t Runtime::CheckId(ErrorKind kind, const std::string& what) {
  // by message and exception: one message may stand for two (index_add's
  // RuntimeError over rows, IndexError over a vector)
  std::string key = what;
  key += static_cast<char>('0' + static_cast<int>(kind));
  auto it = check_ids_.find(key);
  if (it != check_ids_.end()) return it->second;
  checks_.emplace_back(kind, what);
  const auto id = static_cast<int32_t>(checks_.size());
  check_ids_.emplace(std::move(key), id);
  return id;
}

void Runtime::AddInput(std::vector<std::shared_ptr<Outcome>>& to, const std::shared_ptr<Outcome>& o) {
  if (!o || o->verified) return;
  if (!o->flag && o->error.empty()) {  // nothing of its own to check: what it read
    for (const auto& in : o->inputs) AddInput(to, in);
    return;
  }
  if (std::find(to.begin(), to.end(), o) == to.end()) to.push_back(o);
}

std::shared_ptr<Outcome> Runtime::NewOutcome(Trace& t, DeviceBuffer flag, std::vector<std::shared_ptr<Outcome>> inputs) {
  if (!flag && inputs.empty()) return nullptr;
  auto outcome = std::make_shared<Outcome>();
  outcome->flag = std::move(flag);
  outcome->inputs = std::move(inputs);
  if (outcome->flag) t.unverified.push_back(outcome);
  return outcome;
}

void Runtime::Trace::AddCheckSite(int32_t id, const std::string& where) {
  // Bounded: a loop that never syncs adds the same few sites over and over.
  constexpr size_t kMaxCheckSites = 64;
  if (where.empty() || check_sites.size() >= kMaxCheckSites) return;
  for (const auto& site : check_sites) {
    if (site.first == id && site.second == where) return;
  }
  check_sites.emplace_back(id, where);
}

void Runtime::SetChecks(bool enabled) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  options_.checks = enabled;
}

void Runtime::AddCheck(int device, ir::Value violated, ErrorKind kind, const std::string& what) {
  if (!options_.checks) return;
  Trace& t = traces_[device];
  ir::Builder& b = *t.builder;
  const int32_t id = CheckId(kind, what);
  unlocated_checks_.push_back(UnlocatedCheck{device, t.epoch, id});
  ir::Value code = b.Select(violated, b.ScalarConstant(ir::DType::I32, id), b.ScalarConstant(ir::DType::I32, 0));
  MergeCheck(t, code);
}

std::string Runtime::ProgramText(int device, const std::vector<ir::Value>& values) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  return ir::PrintStableHlo(ir::Extract(builder(device).graph(), values, {}, nullptr));
}

}  // namespace tpj::runtime
