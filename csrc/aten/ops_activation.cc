// Activations beyond the elementwise file's: GLU (gated convolutions and
// feed-forward blocks), PReLU's kernel, hardshrink and softshrink, each with
// its backward, as the CPU computes them.
#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

// ---------------------------------------------------------------------- glu

struct Halves {
  int d;
  int64_t dim;
  std::vector<int64_t> shape, half;
  ir::Value a, b;  // first and second half along dim
};

Halves Split(const at::Tensor& self, int64_t dim) {
  TORCH_CHECK(self.dim() > 0, "glu does not support scalars because halving size must be even");
  dim = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(self.size(dim) % 2 == 0, "Halving dimension must be even, but dimension ", dim, " is size ",
              self.size(dim));
  CheckFloating(self.scalar_type(), "glu_cpu");
  Halves h;
  h.d = DeviceIndex(self);
  h.dim = dim;
  h.shape = self.sizes().vec();
  h.half = h.shape;
  h.half[dim] /= 2;
  ir::Builder& b = B(h.d);
  ir::Value x = ValAs(self, OpMath(self.scalar_type()));  // half types in float, rounded once
  std::vector<int64_t> start(h.shape.size(), 0), mid = h.half, limit = h.shape;
  start[dim] = h.half[dim];
  h.a = b.Slice(x, std::vector<int64_t>(h.shape.size(), 0), mid, std::vector<int64_t>(h.shape.size(), 1));
  h.b = b.Slice(x, start, limit, std::vector<int64_t>(h.shape.size(), 1));
  return h;
}

at::Tensor glu(const at::Tensor& self, int64_t dim) {
  TraceScope s;
  Halves h = Split(self, dim);
  ir::Builder& b = B(h.d);
  return WrapIn(b.Binary(Op::Mul, h.a, b.Unary(Op::Logistic, h.b)), self.scalar_type(), h.d);
}

// d/da = sigmoid(b) grad; d/db = a sigmoid(b) (1 - sigmoid(b)) grad
at::Tensor glu_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  TraceScope s;
  Halves h = Split(self, dim);
  TORCH_CHECK(grad.sizes().vec() == h.half, "glu_backward: grad of shape ", grad.sizes(), " for an output of shape ",
              at::IntArrayRef(h.half));
  ir::Builder& b = B(h.d);
  const at::ScalarType t = OpMath(self.scalar_type());
  ir::Value g = Operand(grad, h.d, t);
  ir::Value sg = b.Unary(Op::Logistic, h.b);
  ir::Value one = Fill(h.d, 1, t, h.half);
  ir::Value ga = b.Binary(Op::Mul, g, sg);
  ir::Value gb = b.Binary(Op::Mul, b.Binary(Op::Mul, ga, h.a), b.Binary(Op::Sub, one, sg));
  return WrapIn(b.Concatenate({ga, gb}, h.dim), self.scalar_type(), h.d);
}

// Forward-mode derivatives of glu and of its backward (jvp, jacfwd, hessian):
// with s = sigmoid(b), glu = a s and gx = (ga, gb) = (g s, ga a (1 - s)),
//   d glu = s da + glu (1 - s) db
//   d ga  = s dg + ga (1 - s) db
//   d gb  = d ga a (1 - s) + ga (1 - s) da - gb s db
// composed of pjrt ops in the input's op-math type (half types in float).
at::Tensor glu_jvp(const at::Tensor& glu, const at::Tensor& x, const at::Tensor& dx, int64_t dim) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int64_t n = glu.size(dim);
  const at::ScalarType t = OpMath(x.scalar_type());
  const at::Tensor s = x.narrow(dim, n, n).to(t).sigmoid();
  const at::Tensor da = dx.narrow(dim, 0, n).to(t), db = dx.narrow(dim, n, n).to(t);
  return (s * da + glu.to(t) * (1 - s) * db).to(glu.scalar_type());
}

at::Tensor glu_backward_jvp(const at::Tensor& grad_x, const at::Tensor& grad_glu, const at::Tensor& x,
                            const at::Tensor& dgrad_glu, const at::Tensor& dx, int64_t dim) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int64_t n = grad_glu.size(dim);
  const at::ScalarType t = OpMath(x.scalar_type());
  const at::Tensor a = x.narrow(dim, 0, n).to(t), s = x.narrow(dim, n, n).to(t).sigmoid();
  const at::Tensor da = dx.narrow(dim, 0, n).to(t), db = dx.narrow(dim, n, n).to(t);
  const at::Tensor ga = grad_x.narrow(dim, 0, n).to(t), gb = grad_x.narrow(dim, n, n).to(t);
  const at::Tensor dga = s * dgrad_glu.to(t) + ga * (1 - s) * db;
  const at::Tensor dgb = dga * a * (1 - s) + ga * (1 - s) * da - gb * s * db;
  return at::cat({dga, dgb}, dim).to(grad_x.scalar_type());
}

// -------------------------------------------------------------------- prelu

// x > 0 ? x : w x, weight broadcast to x (PyTorch's prelu has shaped it).
at::Tensor prelu_kernel(const at::Tensor& self, const at::Tensor& weight) {
  TraceScope s;
  const at::ScalarType t = at::result_type(self, weight);
  CheckFloating(t, "prelu_cpu");
  Operands o = Prepare(self, weight, t);
  ir::Builder& b = B(o.device);
  ir::Value pos = b.Compare(CompareDir::GT, o.x, Fill(o.device, 0, t, o.shape));
  return Wrap(b.Select(pos, o.x, b.Binary(Op::Mul, o.y, o.x)), o.device);
}

// (x > 0 ? g : w g, x > 0 ? 0 : x g), both of the shape grad, self and
// weight broadcast to, as the CPU's kernel (autograd sums each to its
// input's shape; under vmap the grad has more dimensions than self).
std::tuple<at::Tensor, at::Tensor> prelu_kernel_backward(const at::Tensor& grad, const at::Tensor& self,
                                                         const at::Tensor& weight) {
  TraceScope s;
  const at::ScalarType t = at::result_type(self, weight);
  const int d = CommonDevice({&grad, &self, &weight});
  const std::vector<int64_t> shape = at::infer_size(at::infer_size(grad.sizes(), self.sizes()), weight.sizes());
  ir::Builder& b = B(d);
  ir::Value x = BroadcastTo(d, Operand(self, d, t), shape);
  ir::Value w = BroadcastTo(d, Operand(weight, d, t), shape);
  ir::Value g = BroadcastTo(d, Operand(grad, d, t), shape);
  ir::Value zero = Fill(d, 0, t, shape);
  ir::Value pos = b.Compare(CompareDir::GT, x, zero);
  return {Wrap(b.Select(pos, g, b.Binary(Op::Mul, w, g)), d), Wrap(b.Select(pos, zero, b.Binary(Op::Mul, x, g)), d)};
}

// ----------------------------------------------------------------- shrinks

// hardshrink: 0 for -lambd <= x <= lambd, else x. softshrink:
// x - clamp(x, -lambd, lambd), as the CPU's vectorized kernel (-0.0 gives
// +0.0). NaN stays NaN in both.
at::Tensor Shrink(const at::Tensor& self, const at::Scalar& lambd, bool soft) {
  CheckFloating(self.scalar_type(), soft ? "softshrink_check" : "hardshrink_cpu");
  TraceScope s;
  const int d = DeviceIndex(self);
  const at::ScalarType t = self.scalar_type();
  const auto shape = self.sizes().vec();
  ir::Builder& b = B(d);
  ir::Value x = Val(self);
  ir::Value l = Number(d, lambd, t, shape);
  if (soft) {
    ir::Value r = b.Binary(Op::Sub, x, b.Clamp(b.Unary(Op::Neg, l), x, l));
    return Wrap(b.Select(IsNan(d, x), x, r), d);
  }
  ir::Value inside = b.Binary(Op::And, b.Compare(CompareDir::GE, x, b.Unary(Op::Neg, l)), b.Compare(CompareDir::LE, x, l));
  return Wrap(b.Select(inside, Fill(d, 0, t, shape), x), d);
}
at::Tensor hardshrink(const at::Tensor& self, const at::Scalar& lambd) { return Shrink(self, lambd, false); }
at::Tensor softshrink(const at::Tensor& self, const at::Scalar& lambd) {
  TORCH_CHECK(lambd.toDouble() >= 0, "lambda must be greater or equal to 0, but found to be ", lambd.toDouble(), ".");
  return Shrink(self, lambd, true);
}

// The shrinks' backward: grad where x < -lambd or x > lambd, else 0 (NaN
// gives 0, as the CPU's vectorized kernel, which runs all but a tail).
at::Tensor shrink_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lambd) {
  TraceScope s;
  const at::ScalarType t = at::result_type(grad, self);
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value l = Number(o.device, lambd, t, o.shape);
  ir::Value outside = b.Binary(Op::Or, b.Compare(CompareDir::LT, o.y, b.Unary(Op::Neg, l)), b.Compare(CompareDir::GT, o.y, l));
  return Wrap(b.Select(outside, o.x, Fill(o.device, 0, t, o.shape)), o.device);
}

// rrelu: in training, each non-positive element scaled by a slope drawn
// uniformly from [lower, upper] on the device (recorded in `noise`, 1 for
// the others); in evaluation, leaky_relu with the mean slope, as the CPU.
at::Tensor rrelu_with_noise(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower, const at::Scalar& upper,
                            bool training, std::optional<at::Generator> gen) {
  const double lo = lower.toDouble(), hi = upper.toDouble();
  if (!training) return at::leaky_relu(self, (lo + hi) / 2);
  TORCH_CHECK(noise.sizes() == self.sizes(), "rrelu_with_noise: noise of shape ", noise.sizes(),
              " does not match the input's ", self.sizes());
  at::Tensor slope = at::where(self <= 0, at::empty_like(self).uniform_(lo, hi, gen), at::ones_like(self));
  noise.copy_(slope);
  return self * slope;
}
at::Tensor& rrelu_with_noise_(at::Tensor& self, at::Tensor& noise, const at::Scalar& lower, const at::Scalar& upper,
                              bool training, std::optional<at::Generator> gen) {
  return self.copy_(tpj::aten::rrelu_with_noise(self, noise, lower, upper, training, std::move(gen)));
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  TPJ_LAID(m, "glu", kInput, glu);
  K("rrelu_with_noise", rrelu_with_noise);
  K("rrelu_with_noise_", rrelu_with_noise_);
  TPJ_LAID(m, "glu_backward", kInput, glu_backward);
  K("glu_jvp", glu_jvp);
  K("glu_backward_jvp", glu_backward_jvp);
  TPJ_LAID(m, "_prelu_kernel", kOperands, prelu_kernel);
  TPJ_LAID(m, "_prelu_kernel_backward", kOperands, prelu_kernel_backward);
  TPJ_LAID(m, "hardshrink", kOperands, hardshrink);
  TPJ_LAID(m, "hardshrink_backward", kOperands, shrink_backward);
  TPJ_LAID(m, "softshrink", kOperands, softshrink);
  TPJ_LAID(m, "softshrink_backward", kOperands, shrink_backward);
}
