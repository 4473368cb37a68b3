// var_mean and std_mean: both statistics from one pass over the data (the
// mean is the variance's own), so a model's normalization does not fall back.
#include <algorithm>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

std::tuple<at::Tensor, at::Tensor> VarMean(const char* op, const at::Tensor& a, at::OptionalIntArrayRef dim,
                                           const std::optional<at::Scalar>& correction, bool keepdim,
                                           bool take_sqrt) {
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type()),
              op, " only support floating point and complex dtypes");
  const int64_t rank = a.dim();
  std::vector<int64_t> dims;
  if (!dim || dim->empty()) {
    for (int64_t i = 0; i < rank; ++i) dims.push_back(i);
  } else {
    for (int64_t k : *dim) {
      const int64_t w = WrapDim(k, rank);
      if (rank == 0) continue;
      TORCH_CHECK(std::find(dims.begin(), dims.end(), w) == dims.end(), "dim ", w,
                  " appears multiple times in the list of dims");
      dims.push_back(w);
    }
    std::sort(dims.begin(), dims.end());
  }
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = a.scalar_type();
  const bool complex = at::isComplexType(t);
  const at::ScalarType ct = t == at::kDouble            ? at::kDouble
                            : t == at::kComplexDouble   ? at::kComplexDouble
                            : complex                   ? at::kComplexFloat
                                                        : at::kFloat;
  const at::ScalarType rt = c10::toRealValueType(ct);  // a complex variance is real: the mean of |x - mean|^2
  const auto shape = a.sizes().vec();
  double n = 1;
  for (int64_t k : dims) n *= static_cast<double>(shape[k]);
  std::vector<int64_t> kept = shape;
  for (int64_t k : dims) kept[k] = 1;
  ir::Value x = ValAs(a, ct);
  ir::Value zero = b.ScalarConstant(ToIr(ct), 0);
  ir::Value sum = b.Reshape(b.Reduce(x, zero, dims, ir::ReduceKind::Sum), kept);
  ir::Value mean = b.Binary(Op::Div, sum, Fill(d, n, ct, kept));
  ir::Value diff = b.Binary(Op::Sub, x, BroadcastTo(d, mean, shape));
  ir::Value sq = complex ? b.Binary(Op::Add, b.Binary(Op::Mul, b.Real(diff), b.Real(diff)),
                                    b.Binary(Op::Mul, b.Imag(diff), b.Imag(diff)))
                         : b.Binary(Op::Mul, diff, diff);
  ir::Value ss = b.Reduce(sq, b.ScalarConstant(ToIr(rt), 0), dims, ir::ReduceKind::Sum);
  const double corr = correction ? correction->toDouble() : 1.0;
  // n - correction <= 0 divides by zero: inf or NaN, as on the CPU.
  WarnIfNoDegreesOfFreedom(op, n, corr);
  ir::Value var = b.Binary(Op::Div, ss, Fill(d, std::max(n - corr, 0.0), rt, b.shape(ss).dims));
  if (take_sqrt) var = b.Unary(Op::Sqrt, var);
  const std::vector<int64_t> out_dims = b.shape(ss).dims;
  if (keepdim) var = b.Reshape(var, kept);
  ir::Value m = keepdim ? mean : b.Reshape(mean, out_dims);
  return {Wrap(b.Convert(var, ToIr(c10::toRealValueType(t))), d), Wrap(b.Convert(m, ToIr(t)), d)};
}

std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& a, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& c, bool keepdim) {
  return VarMean("var_mean", a, dim, c, keepdim, false);
}
std::tuple<at::Tensor, at::Tensor> std_mean(const at::Tensor& a, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& c, bool keepdim) {
  return VarMean("std_mean", a, dim, c, keepdim, true);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("var_mean.correction", var_mean);
  K("std_mean.correction", std_mean);
}
