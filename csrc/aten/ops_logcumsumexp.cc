// torch.logcumsumexp as a log-step (Hillis-Steele) scan whose combine is
// PyTorch's own log-add-exp, so -inf, +inf and values far apart come out as
// on the CPU (a max-shifted log(cumsum(exp)) would underflow early prefixes).
// Its backward is composite: PyTorch builds it from _logcumsumexp itself.
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

// log(exp(x) + exp(y)) as ATen's _log_add_exp_helper: when both are the same
// infinity the result is x (no inf - inf); a NaN in either is NaN (the
// backend's min/max may drop it, so it is carried by x + y).
ir::Value LogAddExp(ir::Builder& b, ir::Value x, ir::Value y) {
  ir::Value lo = b.Binary(Op::Min, x, y);
  ir::Value hi = b.Binary(Op::Max, x, y);
  ir::Value v = b.Binary(Op::Add, b.Unary(Op::Log1p, b.Unary(Op::Exp, b.Binary(Op::Sub, lo, hi))), hi);
  ir::Value use = b.Binary(Op::Or, b.Compare(ir::CompareDir::NE, lo, hi), b.IsFinite(lo));
  ir::Value nan = b.Binary(Op::Or, b.Compare(ir::CompareDir::NE, x, x), b.Compare(ir::CompareDir::NE, y, y));
  return b.Select(nan, b.Binary(Op::Add, x, y), b.Select(use, v, x));
}

at::Tensor logcumsumexp(const at::Tensor& self, int64_t dim) {
  CheckNotComplex(self.scalar_type(), "logcumsumexp on pjrt");  // (the CPU takes complex inputs)
  CheckFloating(self.scalar_type(), "logcumsumexp_out_cpu");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  if (self.dim() == 0) return Wrap(Val(self), d);
  const int64_t w = WrapDim(dim, self.dim());
  const auto shape = self.sizes().vec();
  const int64_t n = shape[w];
  const int64_t r = self.dim();
  // half types in float, each result rounded once (rounding every step was
  // 14 ulp off in bfloat16; the CPU's kernel accumulates in its accumulate
  // type, double for float32, which pjrt keeps in float32)
  const at::ScalarType t = self.scalar_type(), ct = OpMath(t);
  ir::Value neg_inf = ExtremeConst(d, ct, true);
  ir::Value y = ValAs(self, ct);
  // After the step with shift k, y[i] covers x[max(0, i-2k+1) .. i].
  for (int64_t k = 1; k < n; k *= 2) {
    std::vector<int64_t> low(r, 0), high(r, 0), zero(r, 0), start(r, 0), limit = shape, one(r, 1);
    low[w] = k;
    limit[w] = n;
    ir::Value shifted = b.Slice(b.Pad(y, neg_inf, low, high, zero), start, limit, one);
    y = LogAddExp(b, y, shifted);
  }
  return WrapIn(y, t, d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_logcumsumexp", logcumsumexp);
}
