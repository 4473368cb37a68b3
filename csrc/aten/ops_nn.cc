// Neural-network lowerings: layer, batch and synchronized batch
// normalization, convolution,
// losses, each with its backward (pooling: ops_pool.cc).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;
using ir::ReduceKind;

ir::Value Sum(int d, ir::Value x, const std::vector<int64_t>& dims, bool keep) {
  ir::Builder& b = B(d);
  const ir::Shape s = b.shape(x);
  ir::Value r = b.Reduce(x, b.ScalarConstant(s.dtype, 0), dims, ReduceKind::Sum);
  if (keep) {
    std::vector<int64_t> kept = s.dims;
    for (int64_t k : dims) kept[k] = 1;
    r = b.Reshape(r, kept);
  }
  return r;
}

ir::Value Mul(int d, ir::Value x, ir::Value y) { return B(d).Binary(Op::Mul, x, y); }
ir::Value Add(int d, ir::Value x, ir::Value y) { return B(d).Binary(Op::Add, x, y); }
ir::Value Sub(int d, ir::Value x, ir::Value y) { return B(d).Binary(Op::Sub, x, y); }

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}

at::Tensor EmptyOut(int d, at::ScalarType t) { return Wrap(Fill(d, 0, t, {0}), d); }

}  // namespace

at::ScalarType CheckNormParams(const at::Tensor& input, std::initializer_list<const std::optional<at::Tensor>*> params) {
  std::optional<at::ScalarType> first;
  for (const auto* p : params) {
    if (*p && (*p)->defined()) {
      first = (*p)->scalar_type();
      break;
    }
  }
  if (!first || *first == input.scalar_type()) {
    for (const auto* p : params) {
      if (*p && (*p)->defined()) {
        TORCH_CHECK((*p)->scalar_type() == input.scalar_type(), "expected scalar type ", input.scalar_type(),
                    " but found ", (*p)->scalar_type());
      }
    }
    return input.scalar_type();
  }
  // The CPU's messages, which name it: the rule is the CPU's.
  for (const auto* p : params) {
    if (*p && (*p)->defined()) {
      TORCH_CHECK((*p)->scalar_type() == at::kFloat, "mixed dtype (CPU): expect parameter to have scalar type of Float");
    }
  }
  TORCH_CHECK(at::isReducedFloatingType(input.scalar_type()), "mixed dtype (CPU): all inputs must share same datatype.");
  return at::kFloat;
}

namespace {

// -------------------------------------------------------------- layer norm

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps) {
  CheckFloating(input.scalar_type(), "LayerNormKernelImpl");
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  if (axis < 0 || !input.sizes().slice(axis).equals(normalized_shape)) {
    std::ostringstream dims;  // the CPU's message: [*, 2, 3]
    for (int64_t n : normalized_shape) dims << ", " << n;
    TORCH_CHECK(false, "Given normalized_shape=", normalized_shape, ", expected input with shape [*", dims.str(),
                "], but got input of size", input.sizes());
  }
  const ir::DType stats = ToIr(CheckNormParams(input, {&weight, &bias}));
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  // Half types normalize in float and round once, as on the CPU (a float16
  // sum of squares past 65504 is no overflow then).
  const at::ScalarType out = input.scalar_type(), t = OpMath(out);
  const auto shape = input.sizes().vec();
  const auto dims = Range(axis, input.dim());
  double n = 1;
  for (int64_t k : normalized_shape) n *= static_cast<double>(k);
  ir::Value x = ValAs(input, t);
  ir::Value sum = Sum(d, x, dims, true);
  ir::Value mean = b.Binary(Op::Div, sum, Fill(d, n, t, b.shape(sum).dims));
  ir::Value xc = Sub(d, x, BroadcastTo(d, mean, shape));
  ir::Value var_sum = Sum(d, Mul(d, xc, xc), dims, true);
  const auto stat_shape = b.shape(var_sum).dims;
  ir::Value var = b.Binary(Op::Div, var_sum, Fill(d, n, t, stat_shape));
  ir::Value rstd = b.Unary(Op::Rsqrt, Add(d, var, Fill(d, eps, t, stat_shape)));
  ir::Value y = Mul(d, xc, BroadcastTo(d, rstd, shape));
  if (weight && weight->defined()) y = Mul(d, y, BroadcastTo(d, Operand(*weight, d, t), shape));
  if (bias && bias->defined()) y = Add(d, y, BroadcastTo(d, Operand(*bias, d, t), shape));
  return {Wrap(b.Convert(y, ToIr(out)), d), Wrap(b.Convert(mean, stats), d), Wrap(b.Convert(rstd, stats), d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType out = input.scalar_type(), t = OpMath(out);  // half types in float
  const auto shape = input.sizes().vec();
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  const auto norm_dims = Range(axis, input.dim());
  const auto batch_dims = Range(0, axis);
  double n = 1;
  for (int64_t k : normalized_shape) n *= static_cast<double>(k);
  ir::Value go = ValAs(grad_out, t);
  ir::Value r = BroadcastTo(d, ValAs(rstd, t), shape);
  ir::Value xhat = Mul(d, Sub(d, ValAs(input, t), BroadcastTo(d, ValAs(mean, t), shape)), r);
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    ir::Value g = go;
    if (weight && weight->defined()) g = Mul(d, g, BroadcastTo(d, Operand(*weight, d, t), shape));
    ir::Value mg = BroadcastTo(d, b.Binary(Op::Div, Sum(d, g, norm_dims, true),
                                           Fill(d, n, t, b.shape(Sum(d, g, norm_dims, true)).dims)), shape);
    ir::Value gx = Sum(d, Mul(d, g, xhat), norm_dims, true);
    ir::Value mgx = BroadcastTo(d, b.Binary(Op::Div, gx, Fill(d, n, t, b.shape(gx).dims)), shape);
    gi = Wrap(b.Convert(Mul(d, r, Sub(d, Sub(d, g, mg), Mul(d, xhat, mgx))), ToIr(out)), d);
  }
  if (mask[1] && weight && weight->defined()) gw = Wrap(b.Convert(b.Reshape(Sum(d, Mul(d, go, xhat), batch_dims, false), weight->sizes().vec()), ToIr(weight->scalar_type())), d);
  if (mask[2] && bias && bias->defined()) gb = Wrap(b.Convert(b.Reshape(Sum(d, go, batch_dims, false), bias->sizes().vec()), ToIr(bias->scalar_type())), d);
  return {gi, gw, gb};
}

// -------------------------------------------------------------- batch norm

// Channel statistics broadcast helpers: channel dim is 1.
ir::Value PerChannel(int d, ir::Value c, const std::vector<int64_t>& shape) {
  ir::Builder& b = B(d);
  return b.BroadcastInDim(c, shape, {1});
}

// Batch-norm statistics reduce every dim but the channel dim (1); `count`
// is the number of elements per channel.
std::vector<int64_t> ChannelReduction(const std::vector<int64_t>& shape, double* count) {
  std::vector<int64_t> red{0};
  for (size_t i = 2; i < shape.size(); ++i) red.push_back(static_cast<int64_t>(i));
  *count = 1;
  for (int64_t k : red) *count *= static_cast<double>(shape[k]);
  return red;
}

// Per-channel mean and biased variance of `x` (of `shape`) over the dims
// `red`, `n` elements per channel, in `t`.
std::pair<ir::Value, ir::Value> ChannelMeanVar(int d, ir::Value x, const std::vector<int64_t>& shape,
                                               const std::vector<int64_t>& red, double n, at::ScalarType t) {
  ir::Builder& b = B(d);
  const int64_t c = shape[1];
  ir::Value mean = b.Binary(Op::Div, Sum(d, x, red, false), Fill(d, n, t, {c}));
  ir::Value xc = Sub(d, x, PerChannel(d, mean, shape));
  return {mean, b.Binary(Op::Div, Sum(d, Mul(d, xc, xc), red, false), Fill(d, n, t, {c}))};
}

// running = (1 - momentum) * running + momentum * value for the running mean
// and variance that are defined, in their dtype. The momentum is a
// parameter, not a constant: BatchNorm(momentum=None) (a cumulative average,
// as swa_utils.update_bn sets) passes 1/num_batches_tracked.
void UpdateRunning(int d, const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
                   ir::Value mean, ir::Value unbiased_var, double momentum, int64_t c) {
  const bool has_mean = running_mean && running_mean->defined(), has_var = running_var && running_var->defined();
  if (!has_mean && !has_var) return;
  ir::Builder& b = B(d);
  const at::ScalarType rt = (has_mean ? *running_mean : *running_var).scalar_type();
  ir::Value m = Number(d, momentum, rt, {c});
  ir::Value one_m = Number(d, 1 - momentum, rt, {c});
  auto update = [&](const at::Tensor& running, ir::Value v) {
    Assign(running, Add(d, Mul(d, one_m, ValAs(running, rt)), Mul(d, m, b.Convert(v, ToIr(rt)))));
  };
  if (has_mean) update(*running_mean, mean);
  if (has_var) update(*running_var, unbiased_var);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> BatchNorm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         const std::optional<at::Tensor>& running_mean,
                                                         const std::optional<at::Tensor>& running_var, bool training,
                                                         double momentum, double eps) {
  CheckFloating(input.scalar_type(), "batch_norm");
  TORCH_CHECK(input.dim() >= 2, "batch_norm: expected at least 2D input, got ", input.dim(), "D");
  TORCH_CHECK_VALUE((running_mean && running_mean->defined()) == (running_var && running_var->defined()),
                    "running_mean and running_var must either both be None or neither be None");
  const at::ScalarType stats = CheckNormParams(input, {&weight, &bias, &running_mean, &running_var});
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType out = input.scalar_type(), t = OpMath(out);  // half types in float
  const auto shape = input.sizes().vec();
  const int64_t c = shape[1];
  // Nothing to normalize: the CPU returns empty results before it looks at
  // the other arguments.
  if (!training && input.numel() == 0) return {Wrap(Fill(d, 0, out, shape), d), EmptyOut(d, stats), EmptyOut(d, stats)};
  double n = 1;
  const std::vector<int64_t> red = ChannelReduction(shape, &n);
  ir::Value x = ValAs(input, t);
  ir::Value mean, invstd, var;
  const bool have_running = running_mean && running_mean->defined() && running_var && running_var->defined();
  if (training) {
    TORCH_CHECK(n > 1 || input.numel() == 0, "Expected more than 1 value per channel when training, got input size ", input.sizes());
    std::tie(mean, var) = ChannelMeanVar(d, x, shape, red, n, t);
    if (have_running) {
      const at::ScalarType rt = running_mean->scalar_type();
      ir::Value unbiased = b.Binary(Op::Mul, b.Convert(var, ToIr(rt)), Fill(d, n / std::max(n - 1, 1.0), rt, {c}));
      UpdateRunning(d, running_mean, running_var, mean, unbiased, momentum, c);
    }
  } else {
    TORCH_CHECK(have_running, "batch_norm in eval mode needs running_mean and running_var");
    mean = ValAs(*running_mean, t);
    var = ValAs(*running_var, t);
  }
  invstd = b.Unary(Op::Rsqrt, Add(d, var, Fill(d, eps, t, {c})));
  if (training && stats != t) {
    // half parameters: the CPU saves mean and invstd in their dtype and
    // normalizes with the saved (rounded) ones (3 in 10 bfloat16 outputs
    // were a rounding off with float32 statistics)
    mean = b.Convert(b.Convert(mean, ToIr(stats)), ToIr(t));
    invstd = b.Convert(b.Convert(invstd, ToIr(stats)), ToIr(t));
  }
  // y = x * alpha + beta per channel, alpha = invstd * weight and beta =
  // bias - mean * alpha: the CPU kernel's form, so rounding and inf/NaN
  // (an inf weight or running statistic) come out as there.
  ir::Value alpha = invstd;
  if (weight && weight->defined()) alpha = Mul(d, alpha, ValAs(*weight, t));
  ir::Value beta = b.Unary(Op::Neg, Mul(d, mean, alpha));
  if (bias && bias->defined()) beta = Sub(d, ValAs(*bias, t), Mul(d, mean, alpha));
  ir::Value y = Add(d, Mul(d, x, PerChannel(d, alpha, shape)), PerChannel(d, beta, shape));
  const ir::DType o = ToIr(out), so = ToIr(stats);
  if (!training) return {Wrap(b.Convert(y, o), d), EmptyOut(d, stats), EmptyOut(d, stats)};
  return {Wrap(b.Convert(y, o), d), Wrap(b.Convert(mean, so), d), Wrap(b.Convert(invstd, so), d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input, const std::optional<at::Tensor>& w,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const std::optional<at::Tensor>& rm,
                                                                 const std::optional<at::Tensor>& rv, bool training,
                                                                 double momentum, double eps) {
  return BatchNorm(input, w, bias, rm, rv, training, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit(const at::Tensor& input, const std::optional<at::Tensor>& w,
                                                        const std::optional<at::Tensor>& bias, at::Tensor& rm, at::Tensor& rv,
                                                        bool training, double momentum, double eps) {
  return BatchNorm(input, w, bias, rm, rv, training, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_no_stats(const at::Tensor& input, const std::optional<at::Tensor>& w,
                                                                 const std::optional<at::Tensor>& bias, bool training,
                                                                 double momentum, double eps) {
  return BatchNorm(input, w, bias, std::nullopt, std::nullopt, true, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_no_training(const at::Tensor& input,
                                                                    const std::optional<at::Tensor>& w,
                                                                    const std::optional<at::Tensor>& bias,
                                                                    const at::Tensor& rm, const at::Tensor& rv,
                                                                    double momentum, double eps) {
  return BatchNorm(input, w, bias, rm, rv, false, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> mask) {
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType out = input.scalar_type(), t = OpMath(out);  // half types in float
  const auto shape = input.sizes().vec();
  const int64_t c = shape[1];
  double n = 1;
  const std::vector<int64_t> red = ChannelReduction(shape, &n);
  ir::Value go = ValAs(grad_out, t);
  ir::Value mean, invstd;
  if (train) {
    mean = ValAs(*save_mean, t);
    invstd = ValAs(*save_invstd, t);
  } else {
    mean = ValAs(*running_mean, t);
    invstd = b.Unary(Op::Rsqrt, Add(d, ValAs(*running_var, t), Fill(d, eps, t, {c})));
  }
  ir::Value xhat = Mul(d, Sub(d, ValAs(input, t), PerChannel(d, mean, shape)), PerChannel(d, invstd, shape));
  ir::Value gb = Sum(d, go, red, false);
  ir::Value gw = Sum(d, Mul(d, go, xhat), red, false);
  ir::Value w = weight && weight->defined() ? ValAs(*weight, t) : Fill(d, 1, t, {c});
  at::Tensor gi;
  if (mask[0]) {
    ir::Value scale = Mul(d, w, invstd);
    if (train) {
      ir::Value inner = Sub(d, Sub(d, Mul(d, go, Fill(d, n, t, shape)), PerChannel(d, gb, shape)),
                            Mul(d, xhat, PerChannel(d, gw, shape)));
      gi = Wrap(b.Convert(Mul(d, PerChannel(d, b.Binary(Op::Div, scale, Fill(d, n, t, {c})), shape), inner), ToIr(out)), d);
    } else {
      gi = Wrap(b.Convert(Mul(d, go, PerChannel(d, scale, shape)), ToIr(out)), d);
    }
  }
  const ir::DType o = ToIr(out);
  return {gi, mask[1] ? Wrap(b.Convert(gw, o), d) : at::Tensor(), mask[2] ? Wrap(b.Convert(gb, o), d) : at::Tensor()};
}

// ------------------------------------------------- synchronized batch norm
//
// The kernels nn.SyncBatchNorm's autograd function calls around its
// collectives (CUDA's, in Normalization.cuh): local statistics, the merge of
// every process's (mean, invstd, count), the normalization, and the backward's
// reduction and elementwise part. Statistics are in OpMath of the input
// (float for half types), as CUDA's accumulate type.

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  TORCH_CHECK(input.dim() >= 2, "batch_norm_stats: expected at least 2D input, got ", input.dim(), "D");
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), "batch_norm_stats: expected a floating-point input, got ",
              input.scalar_type());
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType t = OpMath(input.scalar_type());
  const auto shape = input.sizes().vec();
  const int64_t c = shape[1];
  double n = 1;
  const std::vector<int64_t> red = ChannelReduction(shape, &n);
  auto [mean, var] = ChannelMeanVar(d, ValAs(input, t), shape, red, n, t);
  ir::Value invstd = b.Unary(Op::Rsqrt, Add(d, var, Fill(d, eps, t, {c})));
  return {Wrap(mean, d), Wrap(invstd, d)};
}

// Merges per-process statistics [W, C] with counts [W]: the pooled mean and
// biased variance (each process's variance recovered from its invstd), the
// running statistics updated with the unbiased one.
std::tuple<at::Tensor, at::Tensor> gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps, const at::Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes() && counts.numel() == mean.size(0),
              "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [world, C] and counts of [world], "
              "got ", mean.sizes(), ", ", invstd.sizes(), " and ", counts.sizes());
  TraceScope s;
  const int d = DeviceIndex(mean);
  ir::Builder& b = B(d);
  const at::ScalarType t = mean.scalar_type();
  const int64_t w = mean.size(0), c = mean.size(1);
  const std::vector<int64_t> wc{w, c};
  ir::Value cnt = b.BroadcastInDim(b.Reshape(ValAs(counts, t), {w}), wc, {0});
  ir::Value total = Sum(d, cnt, {0}, false);  // [C]
  ir::Value m = ValAs(mean, t);
  ir::Value avg = b.Binary(Op::Div, Sum(d, Mul(d, cnt, m), {0}, false), total);
  ir::Value inv = ValAs(invstd, t);
  ir::Value local_var = Sub(d, b.Binary(Op::Div, Fill(d, 1, t, wc), Mul(d, inv, inv)), Fill(d, eps, t, wc));
  ir::Value dev = Sub(d, m, b.BroadcastInDim(avg, wc, {1}));
  ir::Value var_n = Sum(d, Mul(d, cnt, Add(d, local_var, Mul(d, dev, dev))), {0}, false);
  ir::Value out_invstd = b.Unary(Op::Rsqrt, Add(d, b.Binary(Op::Div, var_n, total), Fill(d, eps, t, {c})));
  UpdateRunning(d, running_mean, running_var, avg, b.Binary(Op::Div, var_n, Sub(d, total, Fill(d, 1, t, {c}))),
                momentum, c);
  return {Wrap(avg, d), Wrap(out_invstd, d)};
}

// The same with one count for every process (older callers).
std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats(const at::Tensor& input, const at::Tensor& mean,
                                                           const at::Tensor& invstd,
                                                           const std::optional<at::Tensor>& running_mean,
                                                           const std::optional<at::Tensor>& running_var,
                                                           double momentum, double eps, int64_t count) {
  at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double eps) {
  TORCH_CHECK(input.dim() >= 2, "batch_norm_elemt: expected at least 2D input, got ", input.dim(), "D");
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType out = input.scalar_type(), t = OpMath(out);
  const auto shape = input.sizes().vec();
  ir::Value alpha = ValAs(invstd, t);
  if (weight && weight->defined()) alpha = Mul(d, alpha, ValAs(*weight, t));
  ir::Value y = Mul(d, Sub(d, ValAs(input, t), PerChannel(d, ValAs(mean, t), shape)), PerChannel(d, alpha, shape));
  if (bias && bias->defined()) y = Add(d, y, PerChannel(d, ValAs(*bias, t), shape));
  return Wrap(b.Convert(y, ToIr(out)), d);
}

// Per channel: sum(dy), sum(dy * (x - mean)), and from them the weight's and
// bias's gradients; each only when asked for (CUDA returns undefined tensors
// for the others).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType t = mean.scalar_type();
  const auto shape = input.sizes().vec();
  double n = 1;
  const std::vector<int64_t> red = ChannelReduction(shape, &n);
  ir::Value go = ValAs(grad_out, t);
  ir::Value sum_dy = Sum(d, go, red, false);
  ir::Value sum_dy_xmu = Sum(d, Mul(d, go, Sub(d, ValAs(input, t), PerChannel(d, ValAs(mean, t), shape))), red, false);
  const at::ScalarType wt = weight && weight->defined() ? weight->scalar_type() : input.scalar_type();
  at::Tensor gw, gb;
  if (weight_g) gw = Wrap(b.Convert(Mul(d, sum_dy_xmu, ValAs(invstd, t)), ToIr(wt)), d);
  if (bias_g) gb = Wrap(b.Convert(sum_dy, ToIr(wt)), d);
  if (!input_g) return {at::Tensor(), at::Tensor(), gw, gb};
  return {Wrap(sum_dy, d), Wrap(sum_dy_xmu, d), gw, gb};
}

// dx from the summed (over every process) sum_dy and sum_dy_xmu and the
// per-process counts [W] (or [W, 1]).
at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const at::ScalarType out = input.scalar_type(), t = mean.scalar_type();
  const auto shape = input.sizes().vec();
  const int64_t c = shape[1];
  ir::Value total = Sum(d, b.Reshape(ValAs(count, t), {count.numel()}), {0}, false);
  ir::Value total_c = b.BroadcastInDim(total, {c}, {});
  ir::Value mean_dy = b.Binary(Op::Div, ValAs(sum_dy, t), total_c);
  ir::Value inv = ValAs(invstd, t);
  ir::Value factor_1 = Mul(d, Mul(d, inv, inv), b.Binary(Op::Div, ValAs(sum_dy_xmu, t), total_c));
  ir::Value factor_2 = inv;
  if (weight && weight->defined()) factor_2 = Mul(d, factor_2, ValAs(*weight, t));
  ir::Value xmu = Sub(d, ValAs(input, t), PerChannel(d, ValAs(mean, t), shape));
  ir::Value g = Sub(d, Sub(d, ValAs(grad_out, t), PerChannel(d, mean_dy, shape)), Mul(d, xmu, PerChannel(d, factor_1, shape)));
  return Wrap(b.Convert(Mul(d, g, PerChannel(d, factor_2, shape)), ToIr(out)), d);
}

// ------------------------------------------------------------- convolution

ir::ConvDims StandardDims(int64_t rank) {
  ir::ConvDims c;
  c.in_spatial = c.k_spatial = c.out_spatial = Range(2, rank);
  return c;
}

std::vector<int64_t> Expand(at::IntArrayRef v, int64_t n, int64_t fill = 1) {
  if (v.empty()) return std::vector<int64_t>(n, fill);
  if (v.size() == 1 && n > 1) return std::vector<int64_t>(n, v[0]);
  return v.vec();
}

// Weight [Cin, Cout/g, k...] of a transposed conv as the kernel
// [Cout, Cin/g, k...] of the equivalent direct conv, spatially flipped.
ir::Value TransposedKernel(int d, ir::Value w, const std::vector<int64_t>& ws, int64_t groups) {
  ir::Builder& b = B(d);
  const int64_t cin = ws[0], cout_g = ws[1], r = static_cast<int64_t>(ws.size());
  std::vector<int64_t> split{groups, cin / groups, cout_g};
  split.insert(split.end(), ws.begin() + 2, ws.end());
  ir::Value x = b.Reshape(w, split);
  std::vector<int64_t> perm{0, 2, 1};
  for (int64_t i = 3; i < r + 1; ++i) perm.push_back(i);
  x = b.Transpose(x, perm);
  std::vector<int64_t> merged{groups * cout_g, cin / groups};
  merged.insert(merged.end(), ws.begin() + 2, ws.end());
  x = b.Reshape(x, merged);
  return b.Reverse(x, Range(2, r));
}

// Channels [g * n, (g + 1) * n) of x (dim 1).
ir::Value ChannelSlice(ir::Builder& b, ir::Value x, int64_t g, int64_t n) {
  const auto dims = b.shape(x).dims;
  std::vector<int64_t> lo(dims.size(), 0), hi = dims, step(dims.size(), 1);
  lo[1] = g * n;
  hi[1] = (g + 1) * n;
  return b.Slice(x, lo, hi, step);
}

// Depthwise convolutions (a channel per group, one kernel per channel) on
// XLA's CPU backend, forward and input gradient: the sum over the kernel's
// taps of strided slices of the padded input times the tap's weight per
// channel, one fused loop. XLA ran the grouped convolution 10-30x slower
// than this (docs/performance.md, "Depthwise convolutions"). Up to 27 taps
// (5x5, 3x3x3): 7x7 kernels keep the convolution (ConvNeXt's step was
// slower as taps). The weight gradient keeps it too (WeightGrad).
constexpr int64_t kMaxDepthwiseTaps = 27;

int64_t Taps(const std::vector<int64_t>& kernel_dims) {
  int64_t n = 1;
  for (size_t i = 2; i < kernel_dims.size(); ++i) n *= kernel_dims[i];
  return n;
}

bool DepthwiseOnCpu(ir::Builder& b, const std::vector<int64_t>& xs, const std::vector<int64_t>& ks, int64_t groups) {
  if (!b.cpu_backend() || groups <= 1 || xs[1] != groups || ks[0] != groups || ks[1] != 1) return false;
  for (int64_t v : xs) {
    if (v == 0) return false;
  }
  const int64_t taps = Taps(ks);
  return taps >= 1 && taps <= kMaxDepthwiseTaps;
}

// Returns an undefined value where the output would be empty (the
// convolution handles those).
ir::Value DepthwiseTaps(int d, ir::Value x, ir::Value k, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                        const std::vector<int64_t>& lhs_dil, const std::vector<int64_t>& dil, bool f32_result) {
  ir::Builder& b = B(d);
  const ir::DType t = b.shape(x).dtype;
  // half types multiply and accumulate in float, rounded once, as the CPU's kernel
  const ir::DType ct = t == ir::DType::BF16 || t == ir::DType::F16 ? ir::DType::F32 : t;
  const auto xs = b.shape(x).dims, ks = b.shape(k).dims;
  const size_t ns = ks.size() - 2;
  std::vector<int64_t> plo{0, 0}, phi{0, 0}, interior{0, 0}, out(ns);
  for (size_t i = 0; i < ns; ++i) {
    plo.push_back(lo[i]);
    phi.push_back(hi[i]);
    interior.push_back(lhs_dil[i] - 1);
    const int64_t padded = xs[2 + i] + (xs[2 + i] - 1) * (lhs_dil[i] - 1) + lo[i] + hi[i];
    const int64_t span = padded - dil[i] * (ks[2 + i] - 1);
    if (span <= 0) return {};
    out[i] = (span - 1) / stride[i] + 1;
  }
  ir::Value xp = b.Pad(b.Convert(x, ct), b.ScalarConstant(ct, 0), plo, phi, interior);
  const auto ps = b.shape(xp).dims;
  const int64_t taps = Taps(ks);
  ir::Value kc = b.Reshape(b.Convert(k, ct), {ks[0], taps});
  ir::Value acc;
  std::vector<int64_t> tap(ns, 0);  // the tap's spatial index, last dim fastest
  for (int64_t n = 0; n < taps; ++n) {
    std::vector<int64_t> start(ps.size(), 0), limit = ps, step(ps.size(), 1);
    for (size_t i = 0; i < ns; ++i) {
      start[2 + i] = tap[i] * dil[i];
      limit[2 + i] = start[2 + i] + stride[i] * (out[i] - 1) + 1;
      step[2 + i] = stride[i];
    }
    ir::Value s = b.Slice(xp, start, limit, step);
    ir::Value w = b.Reshape(b.Slice(kc, {0, n}, {ks[0], n + 1}, {1, 1}), {ks[0]});
    ir::Value term = Mul(d, s, b.BroadcastInDim(w, b.shape(s).dims, {1}));
    acc = n == 0 ? term : Add(d, acc, term);
    for (size_t i = ns; i-- > 0;) {
      if (++tap[i] < ks[2 + i]) break;
      tap[i] = 0;
    }
  }
  return f32_result ? acc : b.Convert(acc, t);
}

// Direct convolution with PyTorch's arguments, NC<spatial> layout.
// f32_result: float16/bfloat16 operands' sums left in float32 (a bias is
// added there and the whole rounded once, as the CPU's kernel does).
ir::Value Conv(int d, ir::Value x, ir::Value k, const std::vector<int64_t>& stride, const std::vector<int64_t>& lo,
               const std::vector<int64_t>& hi, const std::vector<int64_t>& lhs_dil, const std::vector<int64_t>& dil,
               int64_t groups, bool f32_result = false) {
  if (DepthwiseOnCpu(B(d), B(d).shape(x).dims, B(d).shape(k).dims, groups)) {
    ir::Value y = DepthwiseTaps(d, x, k, stride, lo, hi, lhs_dil, dil, f32_result);
    if (y.valid()) return y;
  }
  const int64_t rank = static_cast<int64_t>(B(d).shape(x).dims.size());
  return B(d).Convolution(x, k, StandardDims(rank), stride, lo, hi, lhs_dil, dil, groups, 1,
                          ProductPrecision(B(d).shape(x).dtype), f32_result);
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                    at::IntArrayRef stride_, at::IntArrayRef padding_, at::IntArrayRef dilation_,
                                    bool transposed, at::IntArrayRef output_padding_, int64_t groups) {
  // The CPU's checks (a transposed convolution's bias is cast to the input's dtype there).
  TORCH_CHECK(weight.scalar_type() == input.scalar_type(), "expected scalar type ", input.scalar_type(), " but found ",
              weight.scalar_type());
  TORCH_CHECK(transposed || !bias || !bias->defined() || bias->scalar_type() == input.scalar_type(), "Input type (",
              input.dtype(), ") and bias type (", bias ? bias->dtype() : input.dtype(), ") should be the same");
  TraceScope s;
  const int d = CommonDevice({&input, &weight});
  const int64_t ns = input.dim() - 2;
  TORCH_CHECK(ns >= 1, "convolution: expected at least 3D input, got ", input.dim(), "D");
  const auto stride = Expand(stride_, ns), padding = Expand(padding_, ns, 0), dilation = Expand(dilation_, ns);
  const auto out_pad = Expand(output_padding_, ns, 0);
  const auto ws = weight.sizes().vec();
  // The checks of the CPU's own kernels (a program would compute an empty
  // or padded result where they raise)
  auto list = [](const std::vector<int64_t>& v) { return c10::IntArrayRef(v); };
  TORCH_CHECK(std::all_of(dilation.begin(), dilation.end(), [](int64_t x) { return x > 0; }),
              "dilation should be greater than zero, but got ", list(dilation));
  // The integer types the CPU's kernels are built for: none is for bool,
  // the transposed and dilated ones only for int64.
  if (const at::ScalarType it = input.scalar_type(); at::isIntegralType(it, /*includeBool=*/true)) {
    const bool dilated = std::any_of(dilation.begin(), dilation.end(), [](int64_t x) { return x > 1; });
    const char* kernel = transposed ? (ns == 3 ? "slow_conv_transpose3d_out_cpu" : "slow_conv_transpose2d_out_cpu")
                         : dilated  ? "slow_conv_dilated<>"
                         : ns == 3  ? "compute_columns3d"
                                    : "slow_conv2d_cpu";
    TORCH_CHECK_NOT_IMPLEMENTED(it != at::kBool && (it == at::kLong || (!transposed && !dilated)), "\"", kernel,
                                "\" not implemented for '", it, "'");
  }
  if (transposed) {
    std::vector<int64_t> in, out;
    for (int64_t i = 0; i < ns; ++i) {
      TORCH_CHECK(out_pad[i] < stride[i] || out_pad[i] < dilation[i],
                  "output padding must be smaller than either stride or dilation, but got output_padding: ",
                  list(out_pad), ", stride: ", list(stride), ", dilation: ", list(dilation));
      in.push_back(input.size(2 + i));
      out.push_back((in[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ws[2 + i] - 1) + out_pad[i] + 1);
    }
    TORCH_CHECK(std::all_of(out.begin(), out.end(), [](int64_t x) { return x > 0; }),
                "Given input size per channel: ", list(in), ". Calculated output size per channel: ", list(out),
                ". Output size is too small");
  }
  ir::Value x = Val(input);
  ir::Value w = ValAs(weight, input.scalar_type());
  const at::ScalarType t = input.scalar_type();
  // a half input's bias is added to the float32 sums, rounded once (it was
  // added to the rounded sums: 3 in 10 bfloat16 outputs a rounding off)
  const bool wide = bias && bias->defined() && at::isReducedFloatingType(t);
  ir::Value y;
  try {
    if (!transposed) {
      y = Conv(d, x, w, stride, padding, padding, std::vector<int64_t>(ns, 1), dilation, groups, wide);
    } else {
      std::vector<int64_t> lo(ns), hi(ns);
      for (int64_t i = 0; i < ns; ++i) {
        lo[i] = dilation[i] * (ws[2 + i] - 1) - padding[i];
        hi[i] = lo[i] + out_pad[i];
      }
      y = Conv(d, x, TransposedKernel(d, w, ws, groups), std::vector<int64_t>(ns, 1), lo, hi, stride, dilation, groups,
               wide);
    }
  } catch (const ir::Error& e) {
    TORCH_CHECK(false, "convolution: ", e.what());
  }
  if (bias && bias->defined()) {
    const auto shape = B(d).shape(y).dims;
    ir::Value bv = ValAs(*bias, t);  // (a transposed convolution's rounded to t first, as the CPU's)
    y = Add(d, y, B(d).BroadcastInDim(wide ? B(d).Convert(bv, ir::DType::F32) : bv, shape, {1}));
  }
  return WrapIn(y, t, d);
}

// dL/dW of a direct conv y = conv(x, W): a convolution of x with dy.
ir::Value WeightGrad(int d, ir::Value x, ir::Value dy, const std::vector<int64_t>& ks, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups) {
  ir::Builder& b = B(d);
  const auto xs = b.shape(x).dims, ys = b.shape(dy).dims;
  const int64_t ns = static_cast<int64_t>(xs.size()) - 2;
  if (groups > 1 && xs[1] > groups && b.cpu_backend()) {
    // One convolution per group, joined: XLA's CPU backend ran the grouped
    // form (batch_group_count) 350x slower than the CPU's kernel (a
    // ResNeXt block's 32 groups of 4 channels: 310 against 0.9 ms; 2.8 ms
    // so). Only the depthwise case (a channel per group) keeps it: 12x,
    // not 350x, where a convolution per channel would be hundreds of them.
    // The grouped forward and input gradient (3-8x eager's time with 32
    // groups) were no faster split; depthwise ones are sums of taps
    // (DepthwiseTaps). GPUs run the grouped form in their own kernels.
    std::vector<ir::Value> parts;
    for (int64_t g = 0; g < groups; ++g) {
      parts.push_back(WeightGrad(d, ChannelSlice(b, x, g, xs[1] / groups), ChannelSlice(b, dy, g, ys[1] / groups), ks,
                                 stride, padding, dilation, 1));
    }
    return b.Concatenate(parts, 0);
  }
  ir::ConvDims c;
  c.in_batch = 1;  // Cin plays the batch
  c.in_feature = 0;  // N is contracted
  c.in_spatial = Range(2, ns + 2);
  c.k_in = 0;
  c.k_out = 1;
  c.k_spatial = Range(2, ns + 2);
  c.out_feature = 0;
  c.out_batch = 1;
  c.out_spatial = Range(2, ns + 2);
  std::vector<int64_t> hi(ns);
  for (int64_t i = 0; i < ns; ++i) {
    hi[i] = (ks[2 + i] - 1) * dilation[i] + stride[i] * (ys[2 + i] - 1) + 1 - xs[2 + i] - padding[i];
  }
  return b.Convolution(x, dy, c, dilation, padding, hi, std::vector<int64_t>(ns, 1), stride, 1, groups,
                       ProductPrecision(b.shape(x).dtype));
}

// dL/dx of a direct conv: the transposed conv of dy with W.
ir::Value InputGrad(int d, ir::Value dy, ir::Value w, const std::vector<int64_t>& ws, const std::vector<int64_t>& xs,
                    const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                    const std::vector<int64_t>& dilation, int64_t groups) {
  ir::Builder& b = B(d);
  const int64_t ns = static_cast<int64_t>(xs.size()) - 2;
  const auto ys = b.shape(dy).dims;
  std::vector<int64_t> lo(ns), hi(ns);
  for (int64_t i = 0; i < ns; ++i) {
    lo[i] = dilation[i] * (ws[2 + i] - 1) - padding[i];
    // rows of x past the last window get no gradient: pad up to x's size
    const int64_t covered = (ys[2 + i] - 1) * stride[i] + 1 + 2 * lo[i] - dilation[i] * (ws[2 + i] - 1);
    hi[i] = lo[i] + (xs[2 + i] - covered);
  }
  // The direct-conv weight [Cout, Cin/g, k] is, read as a transposed-conv
  // weight from dy's Cout channels to x's Cin channels, already in layout.
  ir::Value k = TransposedKernel(d, w, ws, groups);
  return Conv(d, dy, k, std::vector<int64_t>(ns, 1), lo, hi, stride, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride_,
    at::IntArrayRef padding_, at::IntArrayRef dilation_, bool transposed, at::IntArrayRef output_padding_,
    int64_t groups, std::array<bool, 3> mask) {
  TraceScope s;
  const int d = CommonDevice({&grad_output, &input, &weight});
  const int64_t ns = input.dim() - 2;
  const auto stride = Expand(stride_, ns), padding = Expand(padding_, ns, 0), dilation = Expand(dilation_, ns);
  const auto ws = weight.sizes().vec(), xs = input.sizes().vec();
  const at::ScalarType t = input.scalar_type();
  ir::Value dy = ValAs(grad_output, t);
  ir::Value x = Val(input);
  ir::Value w = ValAs(weight, t);
  at::Tensor gi, gw, gb;
  if (!transposed) {
    if (mask[0]) gi = Wrap(InputGrad(d, dy, w, ws, xs, stride, padding, dilation, groups), d);
    if (mask[1]) gw = Wrap(WeightGrad(d, x, dy, ws, stride, padding, dilation, groups), d);
  } else {
    // y = convT(x, W) is the input-gradient of a direct conv; its gradients
    // are a direct conv (for x) and a weight gradient with the roles swapped.
    if (mask[0]) {
      // x rows past the last full window (output_padding) get no gradient:
      // pad high so the direct conv's output has x's size exactly.
      const auto ys = B(d).shape(dy).dims;
      std::vector<int64_t> hi(ns);
      for (int64_t i = 0; i < ns; ++i) {
        hi[i] = (xs[2 + i] - 1) * stride[i] + dilation[i] * (ws[2 + i] - 1) + 1 - ys[2 + i] - padding[i];
      }
      gi = Wrap(Conv(d, dy, w, stride, padding, hi, std::vector<int64_t>(ns, 1), dilation, groups), d);
    }
    if (mask[1]) gw = Wrap(WeightGrad(d, dy, x, ws, stride, padding, dilation, groups), d);
  }
  if (mask[2]) {
    std::vector<int64_t> red{0};
    for (int64_t i = 2; i < grad_output.dim(); ++i) red.push_back(i);
    gb = Wrap(Sum(d, dy, red, false), d);
  }
  return {gi, gw, gb};
}

// ------------------------------------------------------------------ losses

// NLL over class dim 1 (or 0 for 1-D input). Returns per-element losses
// (target shape) and the weight of each element.
void NllParts(int d, const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
              int64_t ignore_index, ir::Value* loss, ir::Value* wmask, std::vector<int64_t>* tshape) {
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const int64_t cdim = self.dim() == 1 ? 0 : 1;
  const int64_t c = self.size(cdim);
  *tshape = target.sizes().vec();
  ir::Value tgt = b.Convert(Val(target), ir::DType::I64);
  ir::Value valid = b.Compare(ir::CompareDir::NE, tgt, Fill(d, static_cast<double>(ignore_index), at::kLong, *tshape));
  ir::Value safe = b.Select(valid, tgt, Fill(d, 0, at::kLong, *tshape));
  ir::Value out_of_range = b.Binary(Op::Or, b.Compare(ir::CompareDir::LT, safe, Fill(d, 0, at::kLong, *tshape)),
                                    b.Compare(ir::CompareDir::GE, safe, Fill(d, static_cast<double>(c), at::kLong, *tshape)));
  CheckNone(d, out_of_range, runtime::ErrorKind::kIndex,
            "nll_loss: Target out of bounds: a target is outside [0, " + std::to_string(c) + ") and not ignore_index");
  // one-hot over classes: [*tshape with class dim inserted]
  std::vector<int64_t> xshape = self.sizes().vec();
  std::vector<int64_t> tdims;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i != cdim) tdims.push_back(i);
  }
  ir::Value tb = b.BroadcastInDim(safe, xshape, tdims);
  ir::Value hot = b.Compare(ir::CompareDir::EQ, b.Iota({ir::DType::I64, xshape}, cdim), tb);
  ir::Value picked = b.Reduce(b.Select(hot, Val(self), Fill(d, 0, t, xshape)), b.ScalarConstant(ToIr(t), 0), {cdim},
                              ReduceKind::Sum);
  ir::Value w = b.Convert(valid, ToIr(t));
  if (weight && weight->defined()) {
    ir::Value wc = b.BroadcastInDim(ValAs(*weight, t), xshape, {cdim});
    ir::Value wt = b.Reduce(b.Select(hot, wc, Fill(d, 0, t, xshape)), b.ScalarConstant(ToIr(t), 0), {cdim}, ReduceKind::Sum);
    w = Mul(d, w, wt);
  }
  (void)c;
  *wmask = w;
  *loss = b.Select(valid, b.Unary(Op::Neg, Mul(d, picked, w)), Fill(d, 0, t, *tshape));  // ignored: +0 as on the CPU
}

std::tuple<at::Tensor, at::Tensor> NllForward(const at::Tensor& self, const at::Tensor& target,
                                              const std::optional<at::Tensor>& weight, int64_t reduction,
                                              int64_t ignore_index) {
  TraceScope s;
  const int d = CommonDevice({&self, &target});
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  ir::Value loss, w;
  std::vector<int64_t> tshape;
  NllParts(d, self, target, weight, ignore_index, &loss, &w, &tshape);
  std::vector<int64_t> all = Range(0, static_cast<int64_t>(tshape.size()));
  ir::Value total = b.Reduce(w, b.ScalarConstant(ToIr(t), 0), all, ReduceKind::Sum);
  if (reduction == at::Reduction::None) return {Wrap(loss, d), Wrap(total, d)};
  ir::Value sum = b.Reduce(loss, b.ScalarConstant(ToIr(t), 0), all, ReduceKind::Sum);
  if (reduction == at::Reduction::Sum) return {Wrap(sum, d), Wrap(total, d)};
  return {Wrap(b.Binary(Op::Div, sum, total), d), Wrap(total, d)};
}

// nll_loss's class weights have the input's dtype (the CPU's check; no
// mixed precision there).
void CheckWeightDtype(const at::Tensor& self, const std::optional<at::Tensor>& weight) {
  TORCH_CHECK(!weight || !weight->defined() || weight->scalar_type() == self.scalar_type(), "expected scalar type ",
              self.scalar_type(), " but found ", weight->scalar_type());
}

at::Tensor NllBackward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                       const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                       const at::Tensor& total_weight) {
  TraceScope s;
  const int d = CommonDevice({&grad, &self, &target});
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const int64_t cdim = self.dim() == 1 ? 0 : 1;
  const std::vector<int64_t> xshape = self.sizes().vec();
  const std::vector<int64_t> tshape = target.sizes().vec();
  ir::Value tgt = b.Convert(Val(target), ir::DType::I64);
  ir::Value valid = b.Compare(ir::CompareDir::NE, tgt, Fill(d, static_cast<double>(ignore_index), at::kLong, tshape));
  ir::Value w = b.Convert(valid, ToIr(t));
  std::vector<int64_t> tdims;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i != cdim) tdims.push_back(i);
  }
  ir::Value tb = b.BroadcastInDim(b.Select(valid, tgt, Fill(d, 0, at::kLong, tshape)), xshape, tdims);
  // An ignored target has no hot class (its gradient is 0 even where a mean
  // over no targets divides by a total weight of 0, as on the CPU).
  ir::Value hot = b.Binary(Op::And, b.Compare(ir::CompareDir::EQ, b.Iota({ir::DType::I64, xshape}, cdim), tb),
                           b.BroadcastInDim(valid, xshape, tdims));
  if (weight && weight->defined()) {
    ir::Value wc = b.BroadcastInDim(ValAs(*weight, t), xshape, {cdim});
    ir::Value wt = b.Reduce(b.Select(hot, wc, Fill(d, 0, t, xshape)), b.ScalarConstant(ToIr(t), 0), {cdim}, ReduceKind::Sum);
    w = Mul(d, w, wt);
  }
  ir::Value g = ValAs(grad, t);
  ir::Value per;  // gradient per target element
  if (reduction == at::Reduction::None) {
    per = Mul(d, b.Unary(Op::Neg, w), g);
  } else {
    ir::Value scale = reduction == at::Reduction::Mean ? b.Binary(Op::Div, g, ValAs(total_weight, t)) : g;
    per = Mul(d, b.Unary(Op::Neg, w), BroadcastTo(d, b.Reshape(scale, {}), tshape));
  }
  return Wrap(b.Select(hot, b.BroadcastInDim(per, xshape, tdims), Fill(d, 0, t, xshape)), d);
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                    const std::optional<at::Tensor>& weight, int64_t reduction,
                                                    int64_t ignore_index) {
  TORCH_CHECK(self.dim() >= 1 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  CheckWeightDtype(self, weight);
  TORCH_CHECK(self.dim() == 1 || self.size(0) == target.size(0), "Expected input batch_size (", self.size(0),
              ") to match target batch_size (", target.size(0), ").");
  // the CPU's checks (a shorter weight broadcast or failed to broadcast)
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kByte,
              "expected target dtype to be Long or Byte, but got ", target.scalar_type());
  const int64_t classes = self.size(-1);
  TORCH_CHECK(!weight || !weight->defined() || (weight->dim() == 1 && weight->numel() == classes),
              "weight tensor should be defined either for all ", classes, " classes or no classes but got weight tensor of shape: ",
              weight && weight->defined() ? weight->sizes() : at::IntArrayRef{});
  return NllForward(self, target, weight, reduction, ignore_index);
}

at::Tensor nll_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight) {
  return NllBackward(grad, self, target, weight, reduction, ignore_index, total_weight);
}

std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self, const at::Tensor& target,
                                                      const std::optional<at::Tensor>& weight, int64_t reduction,
                                                      int64_t ignore_index) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3, "nll_loss2d: expected 4D input and 3D target");
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kByte,
              "expected target dtype to be Long or Byte, but got ", target.scalar_type());
  TORCH_CHECK(target.scalar_type() == at::kLong, "expected scalar type Long but found ", target.scalar_type());
  CheckWeightDtype(self, weight);
  TORCH_CHECK(!weight || !weight->defined() || weight->numel() == self.size(1),
              "weight tensor should be defined either for all or no classes");
  // the CPU reads a weight of any shape with one entry per class
  return NllForward(self, target, weight && weight->defined() ? std::optional<at::Tensor>(weight->reshape({-1})) : weight,
                    reduction, ignore_index);
}

at::Tensor nll_loss2d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                               const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                               const at::Tensor& total_weight) {
  return NllBackward(grad, self, target,
                     weight && weight->defined() ? std::optional<at::Tensor>(weight->reshape({-1})) : weight, reduction,
                     ignore_index, total_weight);
}

at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  TraceScope s;
  const at::ScalarType t = at::result_type(self, target);
  CheckFloating(t, "mse_cpu");
  Operands o = Prepare(self, target, t);
  ir::Builder& b = B(o.device);
  ir::Value diff = Sub(o.device, o.x, o.y);
  ir::Value sq = Mul(o.device, diff, diff);
  if (reduction == at::Reduction::None) return Wrap(sq, o.device);
  const auto all = Range(0, static_cast<int64_t>(o.shape.size()));
  if (reduction == at::Reduction::Sum) return Wrap(b.Reduce(sq, b.ScalarConstant(ToIr(t), 0), all, ReduceKind::Sum), o.device);
  double n = 1;
  for (int64_t k : o.shape) n *= static_cast<double>(k);
  return Wrap(MeanOf(o.device, sq, all, n), o.device);
}

at::Tensor mse_loss_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  TraceScope s;
  const at::ScalarType t = self.scalar_type();
  CheckFloating(t, "mse_backward_cpu_out");
  Operands o = Prepare(self, target, t);
  ir::Builder& b = B(o.device);
  double scale = 2;
  if (reduction == at::Reduction::Mean) {
    double n = 1;
    for (int64_t k : o.shape) n *= static_cast<double>(k);
    scale /= n;
  }
  ir::Value g = BroadcastTo(o.device, ValAs(grad, t), o.shape);
  ir::Value r = Mul(o.device, Mul(o.device, Sub(o.device, o.x, o.y), Fill(o.device, scale, t, o.shape)), g);
  (void)b;
  return Wrap(r, o.device);
}

// _batch_norm_with_update / batch_norm_backward: the training-mode batch
// norm that updates running statistics, as torch.compile's graphs spell it;
// the same lowering as native_batch_norm, with an empty reserve.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_with_update(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, double momentum, double eps) {
  auto [out, mean, invstd] = at::native_batch_norm(input, weight, bias, running_mean, running_var, true, momentum, eps);
  return {out, mean, invstd, at::empty({0}, input.options().dtype(at::kByte))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var, bool update, double eps,
    std::array<bool, 3> mask, const at::Tensor&) {
  return at::native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update,
                                        eps, mask);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("native_layer_norm", native_layer_norm);
  K("native_layer_norm_backward", native_layer_norm_backward);
  TPJ_LAID(m, "native_batch_norm", kInput, native_batch_norm);
  TPJ_LAID(m, "_batch_norm_with_update", kInput, batch_norm_with_update);
  TPJ_LAID(m, "batch_norm_backward", kInput, batch_norm_backward);
  TPJ_LAID(m, "_native_batch_norm_legit", kInput, bn_legit);
  TPJ_LAID(m, "_native_batch_norm_legit.no_stats", kInput, bn_legit_no_stats);
  TPJ_LAID(m, "_native_batch_norm_legit_no_training", kInput, bn_legit_no_training);
  TPJ_LAID(m, "native_batch_norm_backward", kInput, native_batch_norm_backward);
  K("batch_norm_stats", batch_norm_stats);
  K("batch_norm_gather_stats", batch_norm_gather_stats);
  K("batch_norm_gather_stats_with_counts", gather_stats_with_counts);
  TPJ_LAID(m, "batch_norm_elemt", kInput, batch_norm_elemt);
  K("batch_norm_backward_reduce", batch_norm_backward_reduce);
  TPJ_LAID(m, "batch_norm_backward_elemt", kInput, batch_norm_backward_elemt);
  TPJ_LAID(m, "convolution_overrideable", kInput, convolution_overrideable);
  TPJ_LAID(m, "convolution_backward_overrideable", kInput, convolution_backward_overrideable);
  K("nll_loss_forward", nll_loss_forward);
  K("nll_loss_backward", nll_loss_backward);
  K("nll_loss2d_forward", nll_loss2d_forward);
  K("nll_loss2d_backward", nll_loss2d_backward);
  K("mse_loss", mse_loss);
  K("mse_loss_backward", mse_loss_backward);
}
