// Host <-> device transfers: every copy between host memory and a device
// buffer goes through Upload or CopyToHost, which count bytes_to_device and
// bytes_to_host.
#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_set>
#include <vector>

#include "pjrt/error.h"
#include "runtime/dtype_map.h"
#include "runtime/runtime.h"

namespace tpj::runtime {

DeviceBuffer Runtime::Upload(const void* data, ir::DType dtype, const std::vector<int64_t>& dims, int device) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(ir::ByteSize(dtype));
  try {
    auto buffer = DeviceBuffer(client_->BufferFromHost(data, ToPjrt(dtype), dims, global_id(device)));
    Metrics::Get().Add("bytes_to_device", bytes);
    return buffer;
  } catch (const pjrt::Error& e) {
    // no room on the device for the copy: torch.OutOfMemoryError, as a program's
    if (e.out_of_memory()) {
      throw TensorError(ErrorKind::kOutOfMemory, "out of memory on pjrt:" + std::to_string(device) + " copying " +
                                                     std::to_string(bytes) + " bytes to it: " + e.what());
    }
    throw;
  }
}

void Runtime::CopyToHost(const DeviceBuffer& buffer, void* dst, size_t nbytes, bool reported) {
  const std::shared_ptr<void> waiting = EnterWait();
  try {
    buffer->AwaitReady(WaitCheckFn());  // interruptible; throws the producer's error
  } catch (const pjrt::Error& e) {
    if (reported) ForgetReportedFailures(e.what());
    // the program ran out of memory while it ran: torch.OutOfMemoryError
    if (e.out_of_memory()) throw TensorError(ErrorKind::kOutOfMemory, e.what());
    throw;
  }
  if (nbytes > 0) buffer->ToHost(dst, nbytes);
  Metrics::Get().Add("bytes_to_host", static_cast<int64_t>(nbytes));
}

void Runtime::SetBuffer(Storage& s, DeviceBuffer buffer, ir::DType dtype) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (s.pending_) {
    traces_[s.device_].pending.erase(&s);
    s.pending_ = false;
  }
  s.buffer_ = std::move(buffer);
  s.replicas_.clear();
  s.sharding_.reset();
  s.dtype_ = dtype;
  s.epoch_ = -1;
  s.outcome_.reset();
}

void Runtime::UploadTo(Storage& s, const void* data, ir::DType dtype) {
  const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(dtype));
  if (s.sharding_) {
    // A sharded storage keeps its sharding: the value is written as a copy
    // from another pjrt tensor is, and the next program lays it out (a
    // buffer on one device unsharded load_state_dict's parameters and the
    // results of collectives, written back with copy_).
    std::lock_guard<std::recursive_mutex> l(mu_);
    AssignFlat(s, UploadValue(s.device_, data, dtype, numel));
    return;
  }
  SetBuffer(s, Upload(data, dtype, {numel}, s.device_), dtype);
}

ir::Value Runtime::ScalarValue(int device, ir::DType dtype, const void* bytes) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  ScalarKey key{device, dtype, {0, 0}};
  std::memcpy(key.bits.data(), bytes, std::min(ir::ByteSize(dtype), sizeof(key.bits)));
  auto it = scalars_.find(key);
  if (it == scalars_.end()) {
    it = scalars_.emplace(key, Upload(bytes, dtype, {}, device)).first;
    scalar_order_.push_back(key);
    if (scalar_order_.size() > 4096) {
      scalars_.erase(scalar_order_.front());
      scalar_order_.pop_front();
    }
  }
  return FreshParam(device, it->second, dtype);
}

ir::Value Runtime::UploadValue(int device, const void* data, ir::DType dtype, int64_t numel) {
  DeviceBuffer buffer = Upload(data, dtype, {numel}, device);
  std::lock_guard<std::recursive_mutex> l(mu_);
  return BufferParam(device, buffer, dtype);
}

void Runtime::UploadReplicas(Storage& s, const std::vector<const void*>& parts, ir::DType dtype) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (static_cast<int>(parts.size()) != replicas()) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "need one part per replica (" + std::to_string(replicas()) +
                                                        "), got " + std::to_string(parts.size()));
  }
  const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(dtype));
  std::vector<DeviceBuffer> buffers;
  for (size_t r = 0; r < parts.size(); ++r) {
    buffers.push_back(Upload(parts[r], dtype, {numel}, s.device_ + static_cast<int>(r)));
  }
  SetBuffer(s, buffers[0], dtype);
  s.replicas_ = std::move(buffers);
}

void Runtime::CheckReadable(Storage& s) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  RaiseIfLost(s);
}

ir::DType Runtime::TypeOf(Storage& s, ir::DType if_untyped) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (!s.dtype_) s.dtype_ = if_untyped;
  return *s.dtype_;
}

void Runtime::TypeBytes(Storage& s, ir::DType dtype) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (s.pending_ || !s.buffer_ || !s.replicas_.empty() || s.dtype_ != ir::DType::U8 || dtype == ir::DType::U8 ||
      dtype == ir::DType::Bool || s.nbytes_ == 0 || s.nbytes_ % ir::ByteSize(dtype) != 0) {
    return;
  }
  AssignFlat(s, ReadFlat(s, dtype));  // a full write of another dtype retypes (AssignFlat)
}

DeviceBuffer Runtime::Materialize(Storage& s) {
  try {
    if (s.pending_) SyncDevice(s.device_);
  } catch (const pjrt::Error& e) {
    // the launch a read made ran out of memory: the reader's torch.OutOfMemoryError
    if (e.out_of_memory()) throw TensorError(ErrorKind::kOutOfMemory, e.what());
    throw;
  }
  if (!s.buffer_) {
    const ir::DType t = s.dtype_.value_or(ir::DType::U8);
    std::vector<uint8_t> zeros(s.nbytes_, 0);
    s.buffer_ = Upload(zeros.data(), t, {static_cast<int64_t>(s.nbytes_ / ir::ByteSize(t))}, s.device_);
    s.dtype_ = t;
  }
  return s.buffer_;
}

std::shared_ptr<const std::vector<uint8_t>> Runtime::Download(Storage& s) {
  const auto [buffers, nbytes, sharding, item] = ReadyToRead(s);
  if (sharding) {  // SPMD: the pieces put together
    auto whole = std::make_shared<std::vector<uint8_t>>(s.nbytes_ / item * item);
    Gather(*sharding, item, buffers, whole->data());
    return whole;
  }
  return CopyToHostKept(buffers[0], nbytes);
}

size_t Runtime::ReplicaCount(Storage& s) {
  TraceScope scope;
  Materialize(s);  // a pending value of a replicated trace gets its replicas here
  if (s.sharding_) return 1;  // SPMD: the pieces of one value
  return s.replicas_.empty() ? 1 : s.replicas_.size();
}

namespace {

// The error of a value a later program computed from a failed program's
// results: the failure, and that this value only inherits it.
std::string Inherited(const std::string& error) {
  return error.find(kInheritedClause) != std::string::npos ? error : error + std::string(kInheritedClause);
}

}  // namespace

void Runtime::FailCheck(Outcome& o, int32_t code) {
  const auto& [kind, what] = checks_.at(static_cast<size_t>(code) - 1);
  // Where this program traced the check that failed (one message may come
  // from several lines: each is named, as the flag does not tell them apart).
  std::string at;
  for (const auto& [id, where] : o.check_sites) {
    if (id == code) at += (at.empty() ? " (traced at " : " or at ") + where;
  }
  if (!at.empty()) at += ")";
  o.kind = kind;
  // After a bad batch, the next (good) batch raised the bad one's IndexError
  // from the parameters the failing step's optimizer had updated: say so.
  o.error = what + at + std::string(kFailedCheckTail) + ", or from its results, raises this error until " +
            "overwritten as a whole (parameters an optimizer step in that program updated too: reload them, e.g. " +
            "from a checkpoint)";
}

void Runtime::MarkVerified(Outcome& o) {
  o.verified = true;
  o.inputs.clear();
  o.flag.reset();
}

void Runtime::Verify(const std::shared_ptr<Outcome>& outcome, bool again) {
  if (!outcome) return;
  // The outcome and its unverified inputs (each once), and their flags.
  std::vector<std::shared_ptr<Outcome>> walk;
  std::vector<DeviceBuffer> flags;
  {
    std::lock_guard<std::recursive_mutex> l(mu_);
    if (!outcome->error.empty()) {
      if (outcome->reported && !again) return;
      outcome->reported = true;
      throw TensorError(outcome->kind, outcome->error);
    }
    if (outcome->verified) return;
    // Inputs before what read them (depth-first, post-order): the first
    // failure found is one whose own inputs passed, where it happened.
    std::unordered_set<const Outcome*> seen{outcome.get()};
    std::vector<std::pair<std::shared_ptr<Outcome>, size_t>> stack{{outcome, 0}};
    while (!stack.empty()) {
      auto& [o, next] = stack.back();
      if (next < o->inputs.size()) {
        std::shared_ptr<Outcome> in = o->inputs[next++];
        if (!in->verified && seen.insert(in.get()).second) stack.emplace_back(std::move(in), 0);
        continue;
      }
      flags.push_back(o->flag);
      walk.push_back(std::move(o));
      stack.pop_back();
    }
  }
  std::shared_ptr<Outcome> failed;
  for (size_t k = 0; k < walk.size() && !failed; ++k) {
    {
      std::lock_guard<std::recursive_mutex> l(mu_);
      if (!walk[k]->error.empty()) failed = walk[k];
    }
    if (failed || !flags[k]) continue;
    int32_t code = 0;
    CopyToHost(flags[k], &code, sizeof(code));
    if (code == 0) continue;
    std::lock_guard<std::recursive_mutex> l(mu_);
    FailCheck(*walk[k], code);
    failed = walk[k];
  }
  std::lock_guard<std::recursive_mutex> l(mu_);
  if (!failed) {
    for (const auto& o : walk) MarkVerified(*o);  // every check passed
    return;
  }
  const bool reported_before = failed->reported;
  failed->reported = true;
  if (failed != outcome) {
    outcome->kind = failed->kind;
    outcome->error = Inherited(failed->error);
  }
  outcome->reported = true;
  // sync(wait=True) raises a failure once: not again for a program that
  // read what failed (a read raises it every time)
  if (!again && reported_before) return;
  throw TensorError(outcome->kind, outcome->error);
}

void Runtime::SettleFinished(Trace& t) {
  // Outcomes whose flags are on the device already (their programs have
  // finished) are read now, inputs first, so that a loop that never reads a
  // value does not pile them up. A failed one keeps its error, which what
  // read it takes over (it is as invalid), ending the chain there. Best
  // effort: nothing here waits or throws.
  std::function<bool(Outcome&)> settle = [&](Outcome& o) {
    if (o.verified) return true;
    if (!o.error.empty() || (o.flag && !o.flag->IsReady())) return false;  // (programs finish in order)
    bool inputs_verified = true;
    for (const auto& in : o.inputs) {
      if (settle(*in)) continue;
      inputs_verified = false;
      if (!in->error.empty()) {
        o.kind = in->kind;
        o.error = Inherited(in->error);
        o.inputs.clear();
        return false;
      }
    }
    if (!inputs_verified) return false;
    int32_t code = 0;
    if (o.flag) {
      o.flag->ToHost(&code, sizeof(code));
      Metrics::Get().Add("bytes_to_host", static_cast<int64_t>(sizeof(code)));
    }
    if (code != 0) {
      FailCheck(o, code);
      o.inputs.clear();
      return false;
    }
    MarkVerified(o);
    return true;
  };
  try {
    for (const auto& o : t.unverified) settle(*o);
  } catch (...) {  // a flag the plugin could not read: its read raises that later
  }
  std::erase_if(t.unverified, [](const std::shared_ptr<Outcome>& o) { return o->verified; });
}

bool Runtime::ReadWhole(Storage& s) {
  constexpr size_t kMaxBytes = size_t{64} << 20;
  DeviceBuffer buffer;
  size_t nbytes = 0;
  {
    std::lock_guard<std::recursive_mutex> l(mu_);
    if (s.pending_ || !s.buffer_ || s.sharding_ || !s.replicas_.empty()) return false;
    buffer = s.buffer_;
    nbytes = s.nbytes_;
  }
  std::lock_guard<std::mutex> l(host_copies_mu_);
  for (const HostCopy& c : host_copies_) {
    if (c.buffer.lock() == buffer) return !buffer->is_deleted();
  }
  constexpr int kReads = 4;  // a loop, not a few separate reads of parts of a large value
  if (partly_read_.lock() != buffer) {
    partly_read_ = buffer;
    partial_reads_ = 0;
  }
  if (++partial_reads_ >= kReads && nbytes <= kMaxBytes) {
    keep_whole_ = buffer;
    return true;
  }
  return false;
}

Runtime::Readable Runtime::ReadyToRead(Storage& s) {
  Readable r;
  std::shared_ptr<Outcome> outcome;
  {
    TraceScope scope;  // reports recompile reasons once the lock is released
    RaiseIfLost(s);
    DeviceBuffer first = Materialize(s);
    ++traces_.at(s.device_).host_reads;
    outcome = s.outcome_;
    r.sharding = s.sharding_;
    r.item = ir::ByteSize(*s.dtype_);
    r.buffers = s.replicas_.empty() ? std::vector<DeviceBuffer>{first} : s.replicas_;
    r.nbytes = static_cast<size_t>(first->element_count()) * ir::ByteSize(*s.dtype_);
  }
  Verify(outcome, /*again=*/true);
  return r;
}

void Runtime::Settle(Storage& s) {
  for (const DeviceBuffer& b : ReadyToRead(s).buffers) CopyToHost(b, nullptr, 0);  // waits; throws its failure
}

void Runtime::DownloadReplicas(Storage& s, const std::vector<void*>& dsts) {
  const auto [buffers, nbytes, sharding, item] = ReadyToRead(s);
  if (dsts.size() > buffers.size()) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "asked for " + std::to_string(dsts.size()) +
                                                        " replicas of a storage that has " +
                                                        std::to_string(buffers.size()));
  }
  if (sharding) {  // SPMD: the pieces put together
    if (dsts.size() != 1) throw pjrt::Error(pjrt::Code::kInvalidArgument, "a sharded storage has one value");
    Gather(*sharding, item, buffers, dsts[0]);
    return;
  }
  for (size_t r = 0; r < dsts.size(); ++r) CopyToHost(buffers[r], dsts[r], nbytes);
}

std::shared_ptr<const std::vector<uint8_t>> Runtime::CopyToHostKept(const DeviceBuffer& buffer, size_t nbytes) {
  // Small buffers (what a host read downloads whole: larger storages send
  // a small part alone), and the one ReadWhole chose (64 MiB at most); the
  // last four of them.
  constexpr size_t kMaxBytes = size_t{1} << 20;
  constexpr size_t kCopies = 4;
  bool keep = nbytes > 0 && nbytes <= kMaxBytes;
  {
    std::lock_guard<std::mutex> l(host_copies_mu_);
    keep = keep || (nbytes > 0 && keep_whole_.lock() == buffer);
    for (const HostCopy& c : host_copies_) {
      if (keep && c.bytes->size() == nbytes && c.buffer.lock() == buffer && !buffer->is_deleted()) return c.bytes;
    }
  }
  auto bytes = std::make_shared<std::vector<uint8_t>>(nbytes);
  CopyToHost(buffer, bytes->data(), nbytes);  // outside the lock: the wait may take the GIL
  if (keep) {
    std::lock_guard<std::mutex> l(host_copies_mu_);
    host_copies_.push_front({buffer, bytes});
    if (host_copies_.size() > kCopies) host_copies_.pop_back();
  }
  return bytes;
}

}  // namespace tpj::runtime
