// linspace (F.affine_grid builds its base grid with it): an iota, each half
// counted from its own end as the CPU kernel does, so the last element is
// `end` exactly. logspace: the CPU's values, copied.
#include <type_traits>

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
  // One step is `start`: the CPU fills it, whatever the dtype, without
  // converting `end`.
  if (steps == 1) return out.fill_(start);
  TORCH_CHECK_NOT_IMPLEMENTED(out.scalar_type() != at::kBool, "\"linspace\" not implemented for 'Bool'");
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  const at::ScalarType t = out.scalar_type();
  // The CPU kernel's arithmetic, step for step: start and end rounded to the
  // output dtype (an integer range from -2.5 starts at -2), the step in
  // double for integer outputs and in the output dtype otherwise; a half or
  // bfloat16 output rounds step * i and start + step * i to its dtype, as
  // c10's half arithmetic does.
  double lo = 0, hi = 0, step = 0;
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t, "linspace", [&] {
    using step_t = std::conditional_t<std::is_integral_v<scalar_t>, double, scalar_t>;
    const scalar_t s0 = start.to<scalar_t>(), s1 = end.to<scalar_t>();
    lo = static_cast<double>(s0);
    hi = static_cast<double>(s1);
    step = static_cast<double>((static_cast<step_t>(s1) - static_cast<step_t>(s0)) / (steps - 1));
  });
  const bool half = t == at::kHalf || t == at::kBFloat16;
  const at::ScalarType ct = t == at::kFloat || half ? at::kFloat : at::kDouble;
  const std::vector<int64_t> shape = {steps};
  auto round = [&](ir::Value v) { return half ? b.Convert(b.Convert(v, ToIr(t)), ToIr(ct)) : v; };
  ir::Value i = b.Iota({ToIr(ct), shape}, 0);
  ir::Value st = Number(d, step, ct, shape);
  ir::Value from_start = round(b.Binary(Op::Add, Number(d, lo, ct, shape), round(b.Binary(Op::Mul, st, round(i)))));
  ir::Value back = b.Binary(Op::Sub, Fill(d, static_cast<double>(steps - 1), ct, shape), i);
  ir::Value from_end = round(b.Binary(Op::Sub, Number(d, hi, ct, shape), round(b.Binary(Op::Mul, st, round(back)))));
  ir::Value first_half = b.Compare(ir::CompareDir::LT, i, Fill(d, static_cast<double>(steps / 2), ct, shape));
  Assign(out, b.Select(first_half, from_start, from_end));
  return out;
}

// logspace: its values depend on the arguments alone, and XLA's fused
// multiply-add and power round the exponents differently from the CPU's
// double arithmetic (an integer output then truncates 0.99999 to 0), so the
// CPU kernel computes them and they are copied to the device as data, as
// tril_indices does.
at::Tensor& logspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  if (out.numel() != steps) out.resize_({steps});
  if (steps == 0) return out;
  return out.copy_(at::logspace(start, end, steps, base, at::TensorOptions().dtype(out.scalar_type())));
}

}  // namespace
}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("linspace.out", TORCH_FN(tpj::aten::linspace_out));
  m.impl("logspace.out", TORCH_FN(tpj::aten::logspace_out));
}
