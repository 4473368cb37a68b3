#include "aten/replay.h"

#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <c10/core/TensorImpl.h>

#include "aten/device.h"
#include "aten/tensor.h"

namespace tpj::aten {
namespace {

TensorLayout LayoutOf(const at::Tensor& t) {
  return {t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

// The stride of a dimension of size 1 (or of an empty tensor) addresses
// nothing: a recorded forward's output and the traced one it replaces may
// differ there (Mamba's saved slices: 3072 traced, 16 replayed, as the fake
// tensor says), which would send the backward that reads them to tracing.
bool Matches(const TensorLayout& l, const at::Tensor& t) {
  if (t.scalar_type() != l.dtype || t.storage_offset() != l.offset || !t.sizes().equals(l.sizes)) return false;
  if (t.numel() == 0) return true;
  const auto strides = t.strides();
  for (size_t i = 0; i < l.sizes.size(); ++i) {
    if (l.sizes[i] != 1 && strides[i] != l.strides[i]) return false;
  }
  return true;
}

at::Tensor ViewOn(const c10::Storage& storage, const TensorLayout& l) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    caffe2::TypeMeta::fromScalarType(l.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(l.sizes, l.strides, l.offset);
  return t;
}

// The pjrt device of the inputs (the current device when none is on pjrt);
// empty `why` unless an input is a tensor elsewhere or the inputs are on
// several pjrt devices (a pipeline's graph that moves a value across: traced
// on every call, as its program is one per device).
int DeviceOf(const MaybeTensors& inputs, std::string* why) {
  int device = -1;
  for (const auto& t : inputs) {
    if (!t || !t->defined()) continue;
    if (!IsPjrt(*t)) {
      *why = "an input is a tensor on " + t->device().str();
      continue;
    }
    const int d = DeviceIndex(*t);
    if (device >= 0 && d != device) {
      *why = "its inputs are on several pjrt devices (pjrt:" + std::to_string(device) + " and pjrt:" +
             std::to_string(d) + ")";
    }
    device = device < 0 ? d : device;
  }
  return device < 0 ? CurrentDevice() : device;
}

std::vector<runtime::Storage*> StoragesOf(const MaybeTensors& ts) {
  std::vector<runtime::Storage*> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t && IsPjrt(*t) ? &StorageOf(*t) : nullptr);
  return out;
}

}  // namespace

std::unique_ptr<Recording> BeginRecording(const MaybeTensors& inputs, runtime::Runtime::ReplayJoin join) {
  auto rec = std::make_unique<Recording>();
  const int device = DeviceOf(inputs, &rec->why_not);
  if (!rec->why_not.empty()) return rec;
  for (const auto& t : inputs) {
    if (t && !t->defined()) rec->why_not = "an input is an undefined tensor";
    // vmap's batched tensors (and the grad_outputs of is_grads_batched)
    // wrap others and hold no storage: traced on such calls, never replayed
    if (t && t->defined() && !t->has_storage()) rec->why_not = "an input is a batched tensor (vmap), without storage";
  }
  if (!rec->why_not.empty()) return rec;
  rec->start = RaisingTensorErrors([&] { return runtime::Runtime::Get().BeginRecording(device, StoragesOf(inputs), join); });
  rec->why_not = rec->start.refused;
  return rec;
}

std::shared_ptr<Replayable> EndRecording(Recording& rec, const MaybeTensors& inputs, const MaybeTensors& outputs,
                                         std::string* why_not) {
  auto& rt = runtime::Runtime::Get();
  auto refuse = [&](const std::string& why) -> std::shared_ptr<Replayable> {
    *why_not = why;
    rt.SyncAll();
    return nullptr;
  };
  if (!rec.why_not.empty()) return refuse(rec.why_not);
  auto r = std::make_shared<Replayable>();
  const std::vector<runtime::Storage*> in = StoragesOf(inputs);
  for (const auto& t : inputs) r->inputs_.push_back(t ? std::optional<TensorLayout>(LayoutOf(*t)) : std::nullopt);
  std::vector<runtime::Storage*> fresh;
  for (const auto& t : outputs) {
    Replayable::Output o;
    if (t) {
      if (!t->defined() || !IsPjrt(*t)) return refuse("an output is not a pjrt tensor");
      if (DeviceIndex(*t) != rec.start.device) return refuse("an output is on another pjrt device");
      runtime::Storage* s = &StorageOf(*t);
      o.layout = LayoutOf(*t);
      for (size_t i = 0; i < in.size() && o.input < 0; ++i) {
        if (in[i] == s) o.input = static_cast<int>(i);
      }
      if (o.input < 0) {
        auto at = std::find(fresh.begin(), fresh.end(), s);
        o.fresh = static_cast<int>(at - fresh.begin());
        if (at == fresh.end()) {
          fresh.push_back(s);
          r->fresh_nbytes_.push_back(s->nbytes());
        }
      }
    }
    r->outputs_.push_back(std::move(o));
  }
  r->program_ = RaisingTensorErrors([&] { return rt.EndRecording(rec.start, in, fresh, why_not); });
  if (!r->program_) return nullptr;
  return r;
}

std::optional<MaybeTensors> Replayable::Run(const MaybeTensors& inputs, runtime::Runtime::ReplayJoin join) const {
  if (inputs.size() != inputs_.size()) return std::nullopt;
  std::vector<runtime::Storage*> in(inputs.size(), nullptr);
  const int device = program_->device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& want = inputs_[i];
    const auto& t = inputs[i];
    if (want.has_value() != t.has_value()) return std::nullopt;
    if (!t) continue;
    if (!IsPjrt(*t) || !t->has_storage() || DeviceIndex(*t) != device || !Matches(*want, *t)) return std::nullopt;
    in[i] = &StorageOf(*t);
  }
  // Fresh storages for the new outputs, as the allocator makes them.
  std::vector<c10::Storage> storages;
  std::vector<runtime::Storage*> fresh;
  storages.reserve(fresh_nbytes_.size());
  for (size_t k = 0; k < fresh_nbytes_.size(); ++k) {
    storages.push_back(Empty({static_cast<int64_t>(fresh_nbytes_[k])}, at::kByte, device).storage());
    fresh.push_back(static_cast<runtime::Storage*>(storages.back().data_ptr().get_context()));
  }
  const bool ran = RaisingTensorErrors([&] { return runtime::Runtime::Get().Replay(*program_, in, fresh, join); });
  if (!ran) return std::nullopt;
  MaybeTensors out;
  out.reserve(outputs_.size());
  for (const Output& o : outputs_) {
    if (o.fresh >= 0) {
      out.emplace_back(ViewOn(storages[static_cast<size_t>(o.fresh)], o.layout));
    } else if (o.input >= 0) {
      out.emplace_back(ViewOn(inputs[static_cast<size_t>(o.input)]->storage(), o.layout));
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  return out;
}

}  // namespace tpj::aten
