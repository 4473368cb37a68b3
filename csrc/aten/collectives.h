// Collectives inside a replicated program (torch_pjrt.replicated()): each
// becomes one IR collective over the replicas of device 0's trace.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace tpj::aten {

// t <- reduce(t over replicas) * scale; kind: "sum", "max" or "min".
void AllReduce_(const at::Tensor& t, const std::string& kind, double scale);
// The replicas' tensors concatenated along `dim`.
at::Tensor AllGather(const at::Tensor& t, int64_t dim);
// The sum over replicas, scattered along `dim` (replica r keeps part r), times scale.
at::Tensor ReduceScatter(const at::Tensor& t, int64_t dim, double scale);
// t <- replica `root`'s t.
void Broadcast_(const at::Tensor& t, int64_t root);

}  // namespace tpj::aten
