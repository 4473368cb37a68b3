// linspace (F.affine_grid builds its base grid with it): an iota, each half
// counted from its own end as the CPU kernel does, so the last element is
// `end` exactly.
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  TORCH_CHECK(!start.isComplex() && !end.isComplex() && !at::isComplexType(out.scalar_type()),
              "linspace on pjrt supports real dtypes; build complex ranges from two real ones");
  if (out.numel() != steps) out.resize_({steps});
  if (steps == 0) return out;
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  const at::ScalarType t = out.scalar_type();
  // The CPU steps in float for float outputs and in double for double and
  // integer ones (then truncates).
  const at::ScalarType ct = t == at::kFloat || t == at::kHalf || t == at::kBFloat16 ? at::kFloat : at::kDouble;
  double lo = start.toDouble(), hi = end.toDouble(), step = 0;
  if (ct == at::kFloat) {
    const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
    lo = flo;
    hi = fhi;
    step = steps > 1 ? static_cast<double>((fhi - flo) / static_cast<float>(steps - 1)) : 0.0;
  } else {
    step = steps > 1 ? (hi - lo) / static_cast<double>(steps - 1) : 0.0;
  }
  const std::vector<int64_t> shape = {steps};
  ir::Value i = b.Iota({ToIr(ct), shape}, 0);
  ir::Value st = Number(d, step, ct, shape);
  ir::Value from_start = b.Binary(Op::Add, Number(d, lo, ct, shape), b.Binary(Op::Mul, st, i));
  ir::Value back = b.Binary(Op::Sub, Fill(d, static_cast<double>(steps - 1), ct, shape), i);
  ir::Value from_end = b.Binary(Op::Sub, Number(d, hi, ct, shape), b.Binary(Op::Mul, st, back));
  ir::Value first_half = b.Compare(ir::CompareDir::LT, i, Fill(d, static_cast<double>(steps / 2), ct, shape));
  Assign(out, b.Select(first_half, from_start, from_end));
  return out;
}

}  // namespace
}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("linspace.out", TORCH_FN(tpj::aten::linspace_out)); }
