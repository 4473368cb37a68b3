// SPMD: a device's trace as one program partitioned over a mesh by XLA
// (num_partitions = mesh size, shardings on arguments and results), the
// sharding rule for results, and the upload and gather of pieces.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "pjrt/error.h"
#include "runtime/dtype_map.h"
#include "runtime/runtime.h"

namespace tpj::runtime {
namespace {

std::string DevicesText(const std::vector<int>& devices) {
  std::string s = "[";
  for (size_t i = 0; i < devices.size(); ++i) s += (i ? ", " : "") + std::string("pjrt:") + std::to_string(devices[i]);
  return s + "]";
}

}  // namespace

void Runtime::SetMesh(int device, std::vector<int> devices) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  global_id(device);
  for (int d : devices) {
    if (d < 0 || d >= device_count()) {
      throw pjrt::Error(pjrt::Code::kInvalidArgument, "a mesh over " + DevicesText(devices) + " names pjrt:" +
                                                          std::to_string(d) + ", but this process has " +
                                                          std::to_string(device_count()) + " pjrt device(s)");
    }
  }
  if (!devices.empty() && devices[0] != device) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "a mesh's trace is the one of its first device");
  }
  Trace& t = traces_.at(device);
  if (t.mesh == devices) return;
  if (!devices.empty() && t.replicas > 1) {
    throw pjrt::Error(pjrt::Code::kFailedPrecondition,
                      "SPMD sharding cannot be used inside torch_pjrt.replicated(): leave the replicated region first");
  }
  SyncDevice(device);
  t.mesh = std::move(devices);
  ResetTrace(t);  // a trace belongs to one mesh
}

std::vector<int> Runtime::Mesh(int device) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  global_id(device);
  return traces_[device].mesh;
}

bool Runtime::SpmdInUse() {
  std::lock_guard<std::recursive_mutex> l(mu_);
  for (const Trace& t : traces_) {
    if (!t.mesh.empty()) return true;
  }
  return false;
}

ir::Value Runtime::ShardedRead(Storage& s, ir::DType dtype) {
  Trace& t = traces_[s.device_];
  const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(dtype));
  if (!s.sharding_) {
    // A storage of one device (uploaded, or written before the mesh was
    // set) joins the mesh replicated: copies device to device, once.
    std::vector<DeviceBuffer> pieces{s.buffer_};
    for (size_t p = 1; p < t.mesh.size(); ++p) {
      pieces.push_back(DeviceBuffer(s.buffer_->CopyToDevice(global_id(t.mesh[p]))));
    }
    s.replicas_ = std::move(pieces);
    s.sharding_ = ReplicatedSharding(t.mesh, {numel});
  } else if (s.sharding_->devices != t.mesh) {
    throw TensorError(ErrorKind::kValue, "this pjrt tensor is sharded over the mesh " +
                                             DevicesText(s.sharding_->devices) +
                                             ", but the program on its device runs over the mesh " +
                                             (t.mesh.empty() ? std::string("[] (none)") : DevicesText(t.mesh)) +
                                             ": tensors of different meshes do not mix; redistribute it "
                                             "(torch_pjrt.spmd.distribute(t.cpu(), mesh, spec))");
  }
  auto it = t.buffer_params.find(s.buffer_.get());
  if (it != t.buffer_params.end()) return it->second;
  if (s.sharding_->numel() != numel) {
    throw TensorError(ErrorKind::kFailure, "a sharded storage of " + std::to_string(numel) +
                                               " elements has a sharding of " +
                                               std::to_string(s.sharding_->numel()) + " (internal error)");
  }
  Param p;
  p.buffer = s.buffer_;
  p.dtype = dtype;
  p.per_replica = s.replicas_;
  p.sharding = s.sharding_;
  t.params.push_back(std::move(p));
  ir::Value v = t.builder->Parameter({dtype, s.sharding_->dims}, s.sharding_->hlo);
  ir::Value flat = t.builder->Reshape(v, {numel});
  t.buffer_params[s.buffer_.get()] = flat;
  return flat;
}

// The sharding rule: the C API cannot tell which shardings XLA chose for
// results, so each result is pinned: a storage keeps its own sharding (in
// place updates, marked tensors); a value computed from a sharded input of
// the same shape (elementwise chains, reshapes) takes that input's; else one
// of the same logical shape as a sharded tensor of the program (gradients,
// optimizer state: the first such, in parameter order); else replicated.
std::vector<std::shared_ptr<const Sharding>> Runtime::PinShardings(Trace& t, const std::vector<Storage*>& storages) {
  const ir::Graph& g = t.builder->graph();
  std::vector<std::shared_ptr<const Sharding>> cands;
  std::vector<int32_t> hint(g.nodes.size(), -1);
  for (size_t i = 0; i < t.params.size(); ++i) {
    const auto& sh = t.params[i].sharding;
    if (!sh || sh->replicated()) continue;
    hint[g.params[i]] = static_cast<int32_t>(cands.size());
    cands.push_back(sh);
  }
  for (const Storage* s : storages) {
    if (s->sharding_ && !s->sharding_->replicated() && s->sharding_->devices == t.mesh) cands.push_back(s->sharding_);
  }
  if (!cands.empty()) {
    for (size_t id = 0; id < g.nodes.size(); ++id) {
      const ir::Node& n = g.nodes[id];
      if (n.op == ir::Op::Parameter || n.results.size() != 1) continue;
      const ir::Shape& r = n.results[0];
      for (const ir::Value& o : n.operands) {
        const int32_t h = hint[o.node];
        if (h < 0) continue;
        if (r.dims == cands[h]->dims || (n.op == ir::Op::Reshape && r.numel() == cands[h]->numel())) {
          hint[id] = h;
          break;
        }
      }
    }
  }
  std::vector<std::shared_ptr<const Sharding>> pins(storages.size());
  std::shared_ptr<const Sharding> last_replicated;
  for (size_t i = 0; i < storages.size(); ++i) {
    const Storage* s = storages[i];
    const int64_t numel = static_cast<int64_t>(s->nbytes_ / ir::ByteSize(*s->dtype_));
    if (s->sharding_ && s->sharding_->devices == t.mesh && s->sharding_->numel() == numel) {
      pins[i] = s->sharding_;
      continue;
    }
    const int32_t h = hint[s->value_.node];
    if (h >= 0 && cands[h]->numel() == numel) {
      pins[i] = cands[h];
      continue;
    }
    // the value's logical shape: before its flattening reshape (rank-1 values are their own)
    const ir::Node& n = g.nodes[s->value_.node];
    const std::vector<int64_t>& dims =
        n.op == ir::Op::Reshape ? g.shape(n.operands[0]).dims : g.shape(s->value_).dims;
    for (const auto& c : cands) {
      if (c->dims == dims) {
        pins[i] = c;
        break;
      }
    }
    if (pins[i]) continue;
    if (!last_replicated || last_replicated->numel() != numel) last_replicated = ReplicatedSharding(t.mesh, {numel});
    pins[i] = last_replicated;
  }
  return pins;
}

void Runtime::DistributeTo(Storage& s, const void* data, ir::DType dtype, std::shared_ptr<const Sharding> sharding) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  const size_t item = ir::ByteSize(dtype);
  if (static_cast<size_t>(sharding->numel()) * item != s.nbytes_) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "a sharding of " + std::to_string(sharding->numel()) +
                                                        " elements for a storage of " + std::to_string(s.nbytes_) +
                                                        " bytes");
  }
  if (Mesh(s.device_) != sharding->devices) {
    throw pjrt::Error(pjrt::Code::kFailedPrecondition, "the storage's device does not run this mesh (SetMesh first)");
  }
  const std::vector<int64_t> shard_dims = sharding->ShardDims();
  int64_t shard_numel = 1;
  for (int64_t d : shard_dims) shard_numel *= d;
  std::vector<uint8_t> piece(static_cast<size_t>(shard_numel) * item);
  std::vector<DeviceBuffer> buffers;
  for (size_t p = 0; p < sharding->devices.size(); ++p) {
    CopyShardOut(*sharding, static_cast<int>(p), item, data, piece.data());
    buffers.push_back(Upload(piece.data(), dtype, shard_dims, sharding->devices[p]));
  }
  SetBuffer(s, buffers[0], dtype);
  s.replicas_ = std::move(buffers);
  s.sharding_ = std::move(sharding);
}

ir::Value Runtime::ShardingConstraint(int device, ir::Value x, const Sharding& sharding) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  Trace& t = traces_.at(device);
  if (t.mesh != sharding.devices) {
    throw pjrt::Error(pjrt::Code::kFailedPrecondition, "the device does not run this mesh (SetMesh first)");
  }
  return t.builder->ShardingConstraint(x, sharding.hlo);
}

void Runtime::Reshard(Storage& s, ir::DType dtype, std::shared_ptr<const Sharding> sharding) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  const int64_t numel = static_cast<int64_t>(s.nbytes_ / ir::ByteSize(dtype));
  if (sharding->numel() != numel) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "a sharding of " + std::to_string(sharding->numel()) +
                                                        " elements for a storage of " + std::to_string(numel));
  }
  ir::Builder& b = builder(s.device_);
  ir::Value flat = ReadFlat(s, dtype);
  ir::Value v = ShardingConstraint(s.device_, b.Reshape(flat, sharding->dims), *sharding);
  AssignFlat(s, b.Reshape(v, {numel}));
  s.sharding_ = std::move(sharding);  // the pin of the pending value
}

std::vector<int64_t> Runtime::ShardBytes(Storage& s) {
  TraceScope scope;
  DeviceBuffer first = Materialize(s);
  const size_t item = ir::ByteSize(*s.dtype_);
  std::vector<int64_t> out;
  if (!s.sharding_) {
    out.push_back(first->element_count() * static_cast<int64_t>(item));
    return out;
  }
  for (const DeviceBuffer& b : s.replicas_) out.push_back(b->element_count() * static_cast<int64_t>(item));
  return out;
}

void Runtime::Gather(const Sharding& sh, size_t item, const std::vector<DeviceBuffer>& pieces, void* dst) {
  if (sh.replicated()) {
    CopyToHost(pieces.at(0), dst, static_cast<size_t>(sh.numel()) * item);
    return;
  }
  int64_t shard_numel = 1;
  for (int64_t d : sh.ShardDims()) shard_numel *= d;
  std::vector<uint8_t> piece(static_cast<size_t>(shard_numel) * item);
  for (int p : CoveringPositions(sh)) {
    CopyToHost(pieces.at(static_cast<size_t>(p)), piece.data(), piece.size());
    CopyShardIn(sh, p, item, piece.data(), dst);
  }
}

}  // namespace tpj::runtime
