// Pointwise losses with their reductions and backward formulas, as the CPU
// computes them: binary cross entropy (log clamped at -100, input and target
// checked to lie in [0, 1] by checks compiled into the program), smooth L1
// and Huber, and the class-margin losses multi_margin_loss and
// multilabel_margin_loss.

#include <ATen/ops/cross_entropy_loss_native.h>

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
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t), op, " on pjrt expects floating-point inputs, got ", t);
  Operands o = Prepare(self, target, t);
  return Loss{o.device, t, o.shape, o.x, o.y};
}

// The elementwise loss reduced as `reduction` says.
at::Tensor Reduced(const Loss& l, ir::Value loss, int64_t reduction) {
  if (reduction == at::Reduction::None) return Wrap(loss, l.d);
  ir::Builder& b = B(l.d);
  std::vector<int64_t> all(l.shape.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  if (reduction == at::Reduction::Mean) return Wrap(MeanOf(l.d, loss, all, l.numel()), l.d);
  return Wrap(b.Reduce(loss, b.ScalarConstant(ToIr(l.t), 0), all, ir::ReduceKind::Sum), l.d);
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
  // the CPU's kernel takes no other target dtype (its message)
  TORCH_CHECK(target.scalar_type() == self.scalar_type(), "Found dtype ", target.scalar_type(), " but expected ",
              self.scalar_type());
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

// ------------------------------------------------------------ margin losses

// The rows of a class-score input: [nframe, dim] (a 0-d or 1-d input is one
// row), as the CPU reads it.
struct Rows {
  int d;
  at::ScalarType t;
  int64_t nframe, dim, rank;  // rank: the input's
  ir::Value x;
  ir::Value c(double v, const std::vector<int64_t>& shape) const { return Fill(d, v, t, shape); }
};

Rows RowsOf(const at::Tensor& self, int d, const char* op) {
  // as the CPU: a batch of no rows is allowed, no empty class dim
  TORCH_CHECK(self.dim() <= 2 && (self.dim() == 0 || self.size(-1) > 0), op, ": Expected non-empty vector or matrix with "
              "optional 0-dim batch size, but got: ", self.sizes());
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), op, " on pjrt expects a floating-point input, got ", self.scalar_type());
  Rows r{d, self.scalar_type(), self.dim() <= 1 ? 1 : self.size(0), self.dim() == 0 ? 1 : self.size(-1), self.dim(), {}};
  r.x = B(d).Reshape(Val(self), {r.nframe, r.dim});
  return r;
}

// Per-row losses [nframe] reduced; None keeps a row per target (0-d for a
// 0-d target).
at::Tensor RowsReduced(const Rows& r, ir::Value loss, int64_t reduction, bool scalar_target) {
  ir::Builder& b = B(r.d);
  if (reduction == at::Reduction::None) return Wrap(scalar_target ? b.Reshape(loss, {}) : loss, r.d);
  ir::Value sum = b.Reduce(loss, b.ScalarConstant(ToIr(r.t), 0), {0}, ir::ReduceKind::Sum);
  // the mean of no rows is 0, as the CPU's multi_margin_loss gives it
  if (reduction == at::Reduction::Mean && r.nframe > 0) sum = b.Binary(Op::Div, sum, r.c(static_cast<double>(r.nframe), {}));
  return Wrap(sum, r.d);
}

// The gradient of each row's loss: grad_output per row (None) or its one
// value, /nframe for a mean.
ir::Value RowScale(const Rows& r, const at::Tensor& grad, int64_t reduction) {
  ir::Builder& b = B(r.d);
  ir::Value g = ValAs(grad, r.t);
  g = reduction == at::Reduction::None && grad.numel() == r.nframe ? b.Reshape(g, {r.nframe})
                                                                     : BroadcastTo(r.d, b.Reshape(g, {}), {r.nframe});
  if (reduction == at::Reduction::Mean) g = b.Binary(Op::Div, g, r.c(static_cast<double>(r.nframe), {r.nframe}));
  return g;
}

// multi_margin_loss: per row sum over j != y of max(0, margin - x[y] + x[j])^p
// (times weight[y]), / dim, as the CPU.
struct MultiMargin {
  ir::Value z, mask, wy, is_y;  // [nframe, dim] (wy: [nframe, dim] broadcast)
};

MultiMargin MultiMarginParts(const Rows& r, const at::Tensor& target, const at::Scalar& margin,
                             const std::optional<at::Tensor>& weight) {
  ir::Builder& b = B(r.d);
  const std::vector<int64_t> m{r.nframe, r.dim};
  TORCH_CHECK(target.dim() <= 1 && target.numel() == r.nframe, "inconsistent target size, expected ", r.nframe,
              " but got ", target.sizes());
  ir::Value y = b.Reshape(CheckedIndex(r.d, Val(target), r.dim, false, "multi_margin_loss", runtime::ErrorKind::kValue), {r.nframe});
  MultiMargin p;
  p.is_y = b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, m}, 1), b.BroadcastInDim(y, m, {0}));
  // x[y] and weight[y] as sums of one selected element and -0.0 elsewhere
  // (no NaN from the rest; -0.0 + v is v, a -0.0 included)
  auto at_y = [&](ir::Value v) {
    ir::Value sel = b.Select(p.is_y, v, r.c(-0.0, m));
    return b.BroadcastInDim(b.Reduce(sel, b.ScalarConstant(ToIr(r.t), -0.0), {1}, ir::ReduceKind::Sum), m, {0});
  };
  p.z = b.Binary(Op::Add, b.Binary(Op::Sub, Number(r.d, margin, r.t, m), at_y(r.x)), r.x);
  p.mask = b.Binary(Op::And, b.Unary(Op::Not, p.is_y), b.Compare(CompareDir::GT, p.z, r.c(0, m)));
  if (weight && weight->defined()) {
    TORCH_CHECK(weight->numel() == r.dim && weight->dim() <= 1, "inconsistent weight size, expected ", r.dim, " but got ",
                weight->sizes());
    p.wy = at_y(b.BroadcastInDim(b.Reshape(ValAs(*weight, r.t), {r.dim}), m, {1}));
  }
  return p;
}

double MarginPower(const at::Scalar& p) {
  TORCH_CHECK(!p.isComplex() && (p.toDouble() == 1 || p.toDouble() == 2), "only p == 1 and p == 2 supported");
  return p.toDouble();
}

at::Tensor multi_margin_loss(const at::Tensor& self, const at::Tensor& target, const at::Scalar& p_,
                             const at::Scalar& margin, const std::optional<at::Tensor>& weight, int64_t reduction) {
  const double p = MarginPower(p_);
  TraceScope s;
  const int d = CommonDevice({&self, &target});
  ir::Builder& b = B(d);
  Rows r = RowsOf(self, d, "multi_margin_loss");
  MultiMargin parts = MultiMarginParts(r, target, margin, weight);
  const std::vector<int64_t> m{r.nframe, r.dim};
  ir::Value h = p == 1 ? parts.z : b.Binary(Op::Mul, parts.z, parts.z);
  if (parts.wy.valid()) h = b.Binary(Op::Mul, h, parts.wy);
  h = b.Select(parts.mask, h, r.c(0, m));
  ir::Value loss = b.Binary(Op::Div, b.Reduce(h, b.ScalarConstant(ToIr(r.t), 0), {1}, ir::ReduceKind::Sum),
                            r.c(static_cast<double>(r.dim), {r.nframe}));
  return RowsReduced(r, loss, reduction, target.dim() == 0);
}

at::Tensor multi_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                      const at::Scalar& p_, const at::Scalar& margin,
                                      const std::optional<at::Tensor>& weight, int64_t reduction) {
  const double p = MarginPower(p_);
  TraceScope s;
  const int d = CommonDevice({&grad, &self, &target});
  ir::Builder& b = B(d);
  Rows r = RowsOf(self, d, "multi_margin_loss_backward");
  MultiMargin parts = MultiMarginParts(r, target, margin, weight);
  const std::vector<int64_t> m{r.nframe, r.dim};
  ir::Value g = p == 1 ? r.c(1, m) : b.Binary(Op::Mul, r.c(2, m), parts.z);
  if (parts.wy.valid()) g = b.Binary(Op::Mul, g, parts.wy);
  g = b.Binary(Op::Div, b.Select(parts.mask, g, r.c(0, m)), r.c(static_cast<double>(r.dim), m));
  // each margin term pulls x[j] up and x[y] down
  ir::Value down = b.Reduce(g, b.ScalarConstant(ToIr(r.t), 0), {1}, ir::ReduceKind::Sum);
  g = b.Select(parts.is_y, b.Binary(Op::Sub, r.c(0, m), b.BroadcastInDim(down, m, {0})), g);  // 0 - sum: +0.0 as the CPU
  g = b.Binary(Op::Mul, g, b.BroadcastInDim(RowScale(r, grad, reduction), m, {0}));
  return Wrap(b.Reshape(g, self.sizes().vec()), d);
}

// multilabel_margin_loss: the targets of a row are its entries up to the
// first -1; per row, sum over targets y and non-targets j of
// max(0, 1 - x[y] + x[j]), / dim.
struct MultiLabel {
  ir::Value onehot;  // [nframe, K, dim]: target k of the row is class c
  ir::Value mask;    // [nframe, K, dim]: a positive margin term
  ir::Value z;       // [nframe, K, dim]
  ir::Value is_target;  // [nframe, dim], bool
};

MultiLabel MultiLabelParts(const Rows& r, const at::Tensor& target) {
  ir::Builder& b = B(r.d);
  // the input's own shape: [dim] (a 0-d input: at most one dim) or [nframe, dim]
  TORCH_CHECK(r.rank <= 1 ? target.dim() <= 1 && target.numel() == r.dim
                          : target.dim() == 2 && target.size(0) == r.nframe && target.size(1) == r.dim,
              "inconsistent target size: ", target.sizes(), " for input of size: ", r.nframe, "x", r.dim);
  const int64_t n = r.nframe, k = r.dim;
  const std::vector<int64_t> nk{n, k}, nkc{n, k, r.dim}, nc{n, r.dim};
  ir::Value tg = b.Reshape(b.Convert(Val(target), ir::DType::I64), nk);
  ir::Value bad = b.Binary(Op::Or, b.Compare(CompareDir::LT, tg, b.Full(ir::DType::I64, nk, -1)),
                           b.Compare(CompareDir::GE, tg, b.Full(ir::DType::I64, nk, static_cast<double>(r.dim))));
  CheckNone(r.d, bad, runtime::ErrorKind::kValue, "multilabel_margin_loss: target out of range");
  // a row's targets end at its first negative entry
  ir::Value neg = b.Convert(b.Compare(CompareDir::LT, tg, b.Full(ir::DType::I64, nk, 0)), ir::DType::I32);
  ir::Value ended = b.ReduceWindow(neg, b.ScalarConstant(ir::DType::I32, 0), ir::ReduceKind::Max, {1, k}, {1, 1}, {}, {},
                                   {0, k - 1}, {0, 0});
  ir::Value valid = b.Compare(CompareDir::EQ, ended, b.Full(ir::DType::I32, nk, 0));
  MultiLabel p;
  p.onehot = b.Binary(Op::And, b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, nkc}, 2), b.BroadcastInDim(tg, nkc, {0, 1})),
                      b.BroadcastInDim(valid, nkc, {0, 1}));
  ir::Value hits = b.Reduce(b.Convert(p.onehot, ir::DType::I32), b.ScalarConstant(ir::DType::I32, 0), {1},
                            ir::ReduceKind::Sum);
  p.is_target = b.Compare(CompareDir::GT, hits, b.Full(ir::DType::I32, nc, 0));
  ir::Value xb = b.BroadcastInDim(r.x, nkc, {0, 2});
  ir::Value xy = b.Reduce(b.Select(p.onehot, xb, r.c(-0.0, nkc)), b.ScalarConstant(ToIr(r.t), -0.0), {2},
                          ir::ReduceKind::Sum);  // x[y]: one element, -0.0 elsewhere
  p.z = b.Binary(Op::Add, b.Binary(Op::Sub, r.c(1, nkc), b.BroadcastInDim(xy, nkc, {0, 1})), xb);
  p.mask = b.Binary(Op::And, b.BroadcastInDim(valid, nkc, {0, 1}),
                    b.Binary(Op::And, b.Unary(Op::Not, b.BroadcastInDim(p.is_target, nkc, {0, 2})),
                             b.Compare(CompareDir::GT, p.z, r.c(0, nkc))));
  return p;
}

std::tuple<at::Tensor, at::Tensor> multilabel_margin_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                                  int64_t reduction) {
  TORCH_CHECK(target.scalar_type() == at::kLong, "multilabel_margin_loss: expected target of dtype int64, got ",
              target.scalar_type());
  TraceScope s;
  const int d = CommonDevice({&self, &target});
  ir::Builder& b = B(d);
  Rows r = RowsOf(self, d, "multilabel_margin_loss");
  MultiLabel parts = MultiLabelParts(r, target);
  const std::vector<int64_t> nkc{r.nframe, r.dim, r.dim};
  ir::Value h = b.Select(parts.mask, parts.z, r.c(0, nkc));
  ir::Value loss = b.Binary(Op::Div, b.Reduce(h, b.ScalarConstant(ToIr(r.t), 0), {1, 2}, ir::ReduceKind::Sum),
                            r.c(static_cast<double>(r.dim), {r.nframe}));
  ir::Value is_target = b.Reshape(b.Convert(parts.is_target, ToIr(r.t)), target.sizes().vec());
  return {RowsReduced(r, loss, reduction, target.dim() <= 1), Wrap(is_target, d)};
}

at::Tensor multilabel_margin_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                           int64_t reduction, const at::Tensor&) {
  TraceScope s;
  const int d = CommonDevice({&grad, &self, &target});
  ir::Builder& b = B(d);
  Rows r = RowsOf(self, d, "multilabel_margin_loss_backward");
  MultiLabel parts = MultiLabelParts(r, target);
  const std::vector<int64_t> nkc{r.nframe, r.dim, r.dim}, nc{r.nframe, r.dim};
  ir::Value one = b.Select(parts.mask, r.c(1, nkc), r.c(0, nkc));
  // +1 on x[j] for each positive term, -(its count) on that target's x[y]
  ir::Value up = b.Reduce(one, b.ScalarConstant(ToIr(r.t), 0), {1}, ir::ReduceKind::Sum);
  ir::Value per_target = b.Reduce(one, b.ScalarConstant(ToIr(r.t), 0), {2}, ir::ReduceKind::Sum);
  ir::Value down = b.Reduce(b.Select(parts.onehot, b.BroadcastInDim(per_target, nkc, {0, 1}), r.c(0, nkc)),
                            b.ScalarConstant(ToIr(r.t), 0), {1}, ir::ReduceKind::Sum);
  ir::Value g = b.Binary(Op::Div, b.Binary(Op::Sub, up, down), r.c(static_cast<double>(r.dim), nc));
  g = b.Binary(Op::Mul, g, b.BroadcastInDim(RowScale(r, grad, reduction), nc, {0}));
  return Wrap(b.Reshape(g, self.sizes().vec()), d);
}

// cross_entropy with class weights and label smoothing, mean reduction:
// ATen's composite divides the smoothing term by the weights of the targets
// it keeps, which it picks with masked_select, a shape read from the device
// (a host read and a program per count of ignored targets: a sequence model
// with padding compiled every step). Here the same sum with the ignored
// targets' weights masked to zero, ATen's own path for tensor subclasses;
// every other case is ATen's composite, unchanged. Registered for autograd
// (the composite's key), so it differentiates through the ops it calls.
at::Tensor cross_entropy_loss(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                              int64_t reduction, c10::SymInt ignore_index, double label_smoothing) {
  // ATen's check (a negative value is no smoothing there)
  TORCH_CHECK(label_smoothing <= 1.0, "label_smoothing must be between 0.0 and 1.0. Got: ", label_smoothing);
  const bool class_indices = self.sym_sizes() != target.sym_sizes();
  if (!weight || !weight->defined() || label_smoothing <= 0.0 || reduction != at::Reduction::Mean || !class_indices ||
      Symbolic(self) || Symbolic(target)) {
    return at::native::cross_entropy_loss_symint(self, target, weight, reduction, std::move(ignore_index),
                                                 label_smoothing);
  }
  const int64_t class_dim = self.dim() == 1 ? 0 : 1;
  const int64_t n_classes = self.size(class_dim);
  at::Tensor input = at::log_softmax(self, class_dim, self.scalar_type());
  at::Tensor nll = at::nll_loss_nd_symint(input, target, weight, reduction, ignore_index);
  at::Tensor ignored = target.eq(ignore_index.guard_int(__FILE__, __LINE__));
  std::vector<int64_t> per_class(static_cast<size_t>(input.dim()), 1);
  per_class[static_cast<size_t>(class_dim)] = weight->size(0);
  at::Tensor smooth = (input * weight->view(per_class)).sum(class_dim).neg().masked_fill(ignored, 0.0);
  // clamped: an out-of-range target is nll_loss's error, as on the CPU
  at::Tensor kept = target.masked_fill(ignored, 0).clamp(0, n_classes - 1);
  at::Tensor kept_weight = weight->gather(0, kept.flatten()).view_as(kept).masked_fill(ignored, 0.0).sum();
  return nll * (1.0 - label_smoothing) + smooth.sum() / kept_weight * (label_smoothing / static_cast<double>(n_classes));
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { K("cross_entropy_loss", cross_entropy_loss); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("binary_cross_entropy", binary_cross_entropy);
  K("binary_cross_entropy_backward", binary_cross_entropy_backward);
  K("smooth_l1_loss", smooth_l1_loss);
  K("smooth_l1_loss_backward", smooth_l1_loss_backward);
  K("huber_loss", huber_loss);
  K("huber_loss_backward", huber_loss_backward);
  K("multi_margin_loss", multi_margin_loss);
  K("multi_margin_loss_backward", multi_margin_loss_backward);
  K("multilabel_margin_loss_forward", multilabel_margin_loss_forward);
  K("multilabel_margin_loss_backward", multilabel_margin_loss_backward);
}
