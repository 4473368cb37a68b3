// Collectives inside a replicated program (torch_pjrt.replicated()): each
// becomes one IR collective over the replicas of device 0's trace.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tpj::aten {

// t <- reduce(t over replicas) * scale; kind: "sum", "max" or "min".
void AllReduce_(const at::Tensor& t, const std::string& kind, double scale);
// The replicas' tensors concatenated along `dim`.
at::Tensor AllGather(const at::Tensor& t, int64_t dim);
// The sum over replicas, scattered along `dim` (replica r keeps part r), times scale.
at::Tensor ReduceScatter(const at::Tensor& t, int64_t dim, double scale);
// t <- replica `root`'s t.
void Broadcast_(const at::Tensor& t, int64_t root);

// Host tensors handed to a torch.distributed (gloo) collective, held from
// C++ until gloo's thread has let go of them. A tensor made in Python keeps
// its Python object alive while C++ holds it, and the holder whose release
// leaves only the Python object drops that reference, taking the GIL; were
// that gloo's thread during interpreter teardown, the process would abort
// (std::terminate in ~AsyncAllgatherWork). Held here, gloo's release never
// is the last C++ one: tensors are let go of here, with the GIL, once only
// their Python object and this hold remain (checked on each call). Call with
// the GIL held. What gloo still holds at exit stays held (never destroyed).
void HoldForCollective(const std::vector<at::Tensor>& tensors);

}  // namespace tpj::aten
