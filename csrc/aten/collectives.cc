#include "aten/collectives.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "aten/lowering.h"
#include "aten/tensor.h"
#include "runtime/runtime.h"

namespace tpj::aten {
namespace {

ir::Value Scaled(ir::Builder& b, ir::Value v, double scale) {
  if (scale == 1.0) return v;
  return b.Binary(ir::Op::Mul, v, b.Full(b.shape(v).dtype, b.shape(v).dims, scale));
}

}  // namespace

void AllReduce_(const at::Tensor& t, const std::string& kind, double scale) {
  TORCH_CHECK(kind == "sum" || kind == "max" || kind == "min", "reduction must be sum, max or min, got '", kind, "'");
  runtime::TraceScope scope;
  const int d = DeviceIndex(t);
  ir::Builder& b = B(d);
  const ir::ReduceKind k = kind == "max" ? ir::ReduceKind::Max : kind == "min" ? ir::ReduceKind::Min : ir::ReduceKind::Sum;
  const ir::Value x = Val(t);
  ir::Value r = b.AllReduce(x, k);
  const ir::Shape sh = b.shape(x);
  if (k != ir::ReduceKind::Sum && ir::IsFloat(sh.dtype)) {
    // NaN where a replica holds one, as torch.max over the replicas' values
    // (XLA's maximum across replicas drops it)
    const ir::Value nan = b.Convert(IsNan(d, x), ir::DType::I32);
    const ir::Value any = b.Compare(ir::CompareDir::NE, b.AllReduce(nan, ir::ReduceKind::Max),
                                    b.Full(ir::DType::I32, sh.dims, 0));
    r = b.Select(any, b.Full(sh.dtype, sh.dims, NAN), r);
  }
  Assign(t, Scaled(b, r, scale));
}

at::Tensor AllGather(const at::Tensor& t, int64_t dim) {
  runtime::TraceScope scope;
  const int d = DeviceIndex(t);
  return Wrap(B(d).AllGather(Val(t), WrapDim(dim, t.dim())), d);
}

at::Tensor ReduceScatter(const at::Tensor& t, int64_t dim, double scale) {
  runtime::TraceScope scope;
  const int d = DeviceIndex(t);
  ir::Builder& b = B(d);
  return Wrap(Scaled(b, b.ReduceScatter(Val(t), WrapDim(dim, t.dim()), ir::ReduceKind::Sum), scale), d);
}

void Broadcast_(const at::Tensor& t, int64_t root) {
  runtime::TraceScope scope;
  ir::Builder& b = B(DeviceIndex(t));
  std::vector<int64_t> one{1};
  for (int64_t s : t.sizes()) one.push_back(s);
  ir::Value all = b.AllGather(b.Reshape(Val(t), one), 0);
  std::vector<int64_t> start(one.size(), 0), limit = one, stride(one.size(), 1);
  start[0] = root;
  limit[0] = root + 1;
  Assign(t, b.Reshape(b.Slice(all, start, limit, stride), t.sizes().vec()));
}

void HoldForCollective(const std::vector<at::Tensor>& tensors) {
  static auto* held = new std::vector<at::Tensor>();  // never destroyed: see the header
  // use_count 2: this hold and the tensor's Python object; no collective left.
  held->erase(std::remove_if(held->begin(), held->end(), [](const at::Tensor& t) { return t.use_count() <= 2; }),
              held->end());
  held->insert(held->end(), tensors.begin(), tensors.end());
}

}  // namespace tpj::aten
