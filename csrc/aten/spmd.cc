#include "aten/spmd.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "aten/tensor.h"
#include "runtime/sharding.h"
#include "runtime/strided.h"

namespace tpj::aten {
namespace {

std::shared_ptr<const runtime::Sharding> Make(const ShardingArgs& a, at::IntArrayRef sizes) {
  try {
    return runtime::MakeSharding(a.devices, sizes.vec(), a.tiles, a.replicate, a.tile_devices);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "cannot shard a tensor of shape ", sizes, ": ", e.what());
  }
}

}  // namespace

at::Tensor Distribute(const at::Tensor& cpu, const ShardingArgs& args) {
  TORCH_CHECK(cpu.device().is_cpu(), "distribute takes a CPU tensor, got one on ", cpu.device());
  auto sharding = Make(args, cpu.sizes());
  auto& rt = runtime::Runtime::Get();
  rt.SetMesh(args.devices.at(0), args.devices);
  at::Tensor dense = cpu.contiguous();
  at::Tensor out = Empty(cpu.sizes(), cpu.scalar_type(), args.devices[0]);
  rt.DistributeTo(StorageOf(out), dense.const_data_ptr(), ToIr(cpu.scalar_type()), std::move(sharding));
  return out;
}

void MarkSharding(const at::Tensor& t, const ShardingArgs& args) {
  TORCH_CHECK(IsPjrt(t), "mark_sharding takes a pjrt tensor, got one on ", t.device());
  TORCH_CHECK_VALUE(DeviceIndex(t) == args.devices.at(0), "mark_sharding: the tensor is on ", t.device(),
                    ", but the mesh's first device is pjrt:", args.devices[0],
                    " (a sharded tensor lives on its mesh's first device)");
  auto sharding = Make(args, t.sizes());
  auto& rt = runtime::Runtime::Get();
  rt.SetMesh(args.devices[0], args.devices);
  runtime::TraceScope scope;
  runtime::Storage& s = StorageOf(t);
  const ir::DType dt = ToIr(t.scalar_type());
  const int64_t numel = static_cast<int64_t>(s.nbytes() / c10::elementSize(t.scalar_type()));
  TORCH_CHECK_VALUE(runtime::CoversStorage(ViewOf(t), numel) && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
                        (!s.dtype() || *s.dtype() == dt),
                    "mark_sharding needs a tensor that is its whole storage (contiguous, not a view): "
                    "call .contiguous() or .clone() first, or use torch_pjrt.spmd.with_sharding_constraint");
  RaisingTensorErrors([&] { rt.Reshard(s, dt, std::move(sharding)); });
}

std::optional<std::tuple<std::string, std::vector<int>, std::vector<int64_t>>> ShardingOf(const at::Tensor& t) {
  runtime::TraceScope scope;
  const auto& sh = StorageOf(t).sharding();
  if (!sh) return std::nullopt;
  return std::make_tuple(sh->hlo, sh->devices, sh->dims);
}

std::vector<int64_t> ShardBytes(const at::Tensor& t) {
  return RaisingTensorErrors([&] { return runtime::Runtime::Get().ShardBytes(StorageOf(t)); });
}

}  // namespace tpj::aten
