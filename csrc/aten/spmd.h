// SPMD sharding of pjrt tensors (torch_pjrt.spmd): the torch side of
// runtime/spmd.cc. A sharding is given as the runtime reads it
// (runtime/sharding.h): mesh devices, pieces per dimension, copies per
// piece, and the mesh position of each (piece, copy); torch_pjrt.spmd
// computes it from a mesh and a spec. Each function takes the runtime lock.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace tpj::aten {

struct ShardingArgs {
  std::vector<int> devices;
  std::vector<int64_t> tiles;
  int64_t replicate = 1;
  std::vector<int> tile_devices;
};

// A pjrt tensor on the mesh's first device whose pieces are uploaded from
// `cpu` straight to their devices.
at::Tensor Distribute(const at::Tensor& cpu, const ShardingArgs& sharding);
// The tensor's storage takes the sharding in the next program (a constraint
// on its value); the tensor must cover its storage.
void MarkSharding(const at::Tensor& t, const ShardingArgs& sharding);
// (hlo sharding, mesh devices, logical dims) of the tensor's storage, or none.
std::optional<std::tuple<std::string, std::vector<int>, std::vector<int64_t>>> ShardingOf(const at::Tensor& t);
// Bytes of the tensor's storage on each mesh device (one entry when unsharded).
std::vector<int64_t> ShardBytes(const at::Tensor& t);

}  // namespace tpj::aten
