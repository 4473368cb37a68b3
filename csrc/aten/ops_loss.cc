// Pointwise losses with their reductions and backward formulas, as the CPU
// computes them: binary cross entropy (log clamped at -100, input and target
// checked to lie in [0, 1] by checks compiled into the program), smooth L1
// and Huber.

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

struct Loss {
  int d;
  at::ScalarType t;
  std::vector<int64_t> shape;
  ir::Value x, y;  // input, target
  ir::Value c(double v) const { return Fill(d, v, t, shape); }
  double numel() const {
    double n = 1;
    for (int64_t k : shape) n *= static_cast<double>(k);
    return n;
  }
};

Loss Prepared(const at::Tensor& self, const at::Tensor& target, const char* op) {
  const at::ScalarType t = at::result_type(self, target);
  TORCH_CHECK(at::isFloatingType(t), op, " on pjrt expects floating-point inputs, got ", t);
  Operands o = Prepare(self, target, t);
  return Loss{o.device, t, o.shape, o.x, o.y};
}

// The elementwise loss reduced as `reduction` says.
at::Tensor Reduced(const Loss& l, ir::Value loss, int64_t reduction) {
  if (reduction == at::Reduction::None) return Wrap(loss, l.d);
  ir::Builder& b = B(l.d);
  std::vector<int64_t> all(l.shape.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  ir::Value sum = b.Reduce(loss, b.ScalarConstant(ToIr(l.t), 0), all, ir::ReduceKind::Sum);
  if (reduction == at::Reduction::Mean) sum = b.Binary(Op::Div, sum, Fill(l.d, l.numel(), l.t, {}));
  return Wrap(sum, l.d);
}

// grad (a scalar unless reduction is None) spread over the loss's shape, /n
// for a mean.
ir::Value Spread(const Loss& l, const at::Tensor& grad, int64_t reduction) {
  ir::Value g = BroadcastTo(l.d, Operand(grad, l.d, l.t), l.shape);
  if (reduction == at::Reduction::Mean) g = B(l.d).Binary(Op::Div, g, l.c(l.numel()));
  return g;
}

// A gradient computed over the broadcast shape, as the input's shape.
at::Tensor AsInput(const Loss& l, ir::Value grad, const at::Tensor& self) {
  at::Tensor r = Wrap(grad, l.d);
  return r.sizes() == self.sizes() ? r : r.sum_to_size(self.sizes());
}

ir::Value Weighted(const Loss& l, ir::Value v, const std::optional<at::Tensor>& weight) {
  if (!weight || !weight->defined()) return v;
  return B(l.d).Binary(Op::Mul, v, BroadcastTo(l.d, Operand(*weight, l.d, l.t), l.shape));
}

// ------------------------------------------------------ binary cross entropy

at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                int64_t reduction) {
  TraceScope s;
  Loss l = Prepared(self, target, "binary_cross_entropy");
  ir::Builder& b = B(l.d);
  ir::Value in_range = b.Binary(Op::And, b.Compare(CompareDir::GE, l.x, l.c(0)), b.Compare(CompareDir::LE, l.x, l.c(1)));
  CheckNone(l.d, b.Unary(Op::Not, in_range), runtime::ErrorKind::kValue, "all elements of input should be between 0 and 1");
  ir::Value target_in_range =
      b.Binary(Op::And, b.Compare(CompareDir::GE, l.y, l.c(0)), b.Compare(CompareDir::LE, l.y, l.c(1)));
  CheckNone(l.d, b.Unary(Op::Not, target_in_range), runtime::ErrorKind::kValue,
            "all elements of target should be between 0 and 1");
  // (t - 1) max(log(1 - x), -100) - t max(log(x), -100)
  ir::Value log_x = b.Binary(Op::Max, b.Unary(Op::Log, l.x), l.c(-100));
  ir::Value log_1mx = b.Binary(Op::Max, b.Unary(Op::Log1p, b.Unary(Op::Neg, l.x)), l.c(-100));
  ir::Value loss = b.Binary(Op::Sub, b.Binary(Op::Mul, b.Binary(Op::Sub, l.y, l.c(1)), log_1mx), b.Binary(Op::Mul, l.y, log_x));
  return Reduced(l, Weighted(l, loss, weight), reduction);
}

// grad (x - t) / max((1 - x) x, 1e-12)
at::Tensor binary_cross_entropy_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                         const std::optional<at::Tensor>& weight, int64_t reduction) {
  TraceScope s;
  Loss l = Prepared(self, target, "binary_cross_entropy_backward");
  ir::Builder& b = B(l.d);
  ir::Value denom = b.Binary(Op::Max, b.Binary(Op::Mul, b.Binary(Op::Sub, l.c(1), l.x), l.x), l.c(1e-12));
  ir::Value r = b.Binary(Op::Mul, Spread(l, grad, reduction), b.Binary(Op::Div, b.Binary(Op::Sub, l.x, l.y), denom));
  return AsInput(l, Weighted(l, r, weight), self);
}

// ------------------------------------------------------- smooth L1, Huber

// Smooth L1 (beta) and Huber (delta) share a shape: quadratic inside the
// threshold, linear beyond. `huber` scales the linear part by delta and
// leaves the quadratic unscaled; smooth L1 divides the quadratic by beta.
ir::Value SmoothLoss(const Loss& l, double th, bool huber) {
  ir::Builder& b = B(l.d);
  ir::Value z = b.Unary(Op::Abs, b.Binary(Op::Sub, l.x, l.y));
  ir::Value quad = b.Binary(Op::Mul, l.c(0.5), b.Binary(Op::Mul, z, z));
  ir::Value lin = b.Binary(Op::Sub, z, l.c(0.5 * th));
  if (huber) {
    lin = b.Binary(Op::Mul, l.c(th), lin);
  } else if (th > 0) {
    quad = b.Binary(Op::Div, quad, l.c(th));
  }
  if (!huber && th == 0) return z;  // L1
  return b.Select(b.Compare(CompareDir::LT, z, l.c(th)), quad, lin);
}

// d/dx: x - t clamped to [-th, th], divided by beta for smooth L1 (the CPU's
// branches: x <= -beta, x >= beta for smooth L1; x < -delta, x > delta for Huber)
ir::Value SmoothGrad(const Loss& l, double th, bool huber) {
  ir::Builder& b = B(l.d);
  ir::Value x = b.Binary(Op::Sub, l.x, l.y);
  if (huber) {
    ir::Value r = b.Select(b.Compare(CompareDir::GT, x, l.c(th)), l.c(th), x);
    return b.Select(b.Compare(CompareDir::LT, x, l.c(-th)), l.c(-th), r);
  }
  ir::Value inner = th > 0 ? b.Binary(Op::Div, x, l.c(th)) : x;
  ir::Value r = b.Select(b.Compare(CompareDir::GE, x, l.c(th)), l.c(1), inner);
  return b.Select(b.Compare(CompareDir::LE, x, l.c(-th)), l.c(-1), r);
}

at::Tensor SmoothForward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double th, bool huber) {
  TraceScope s;
  Loss l = Prepared(self, target, huber ? "huber_loss" : "smooth_l1_loss");
  return Reduced(l, SmoothLoss(l, th, huber), reduction);
}

at::Tensor SmoothBackward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                          double th, bool huber) {
  TraceScope s;
  Loss l = Prepared(self, target, huber ? "huber_loss_backward" : "smooth_l1_loss_backward");
  return AsInput(l, B(l.d).Binary(Op::Mul, Spread(l, grad, reduction), SmoothGrad(l, th, huber)), self);
}

at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  TORCH_CHECK(beta >= 0, "smooth_l1_loss does not support negative values for beta.");
  return SmoothForward(self, target, reduction, beta, false);
}
at::Tensor smooth_l1_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                   int64_t reduction, double beta) {
  return SmoothBackward(grad, self, target, reduction, beta, false);
}
at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  TORCH_CHECK(delta > 0, "huber_loss does not support non-positive values for delta.");
  return SmoothForward(self, target, reduction, delta, true);
}
at::Tensor huber_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                               int64_t reduction, double delta) {
  return SmoothBackward(grad, self, target, reduction, delta, true);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("binary_cross_entropy", binary_cross_entropy);
  K("binary_cross_entropy_backward", binary_cross_entropy_backward);
  K("smooth_l1_loss", smooth_l1_loss);
  K("smooth_l1_loss_backward", smooth_l1_loss_backward);
  K("huber_loss", huber_loss);
  K("huber_loss_backward", huber_loss_backward);
}
