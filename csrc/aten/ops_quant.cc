// Fake quantization (quantization-aware training, torch.ao.quantization's
// FakeQuantize and torch.fake_quantize_per_tensor/channel_affine) with the
// CPU kernels' arithmetic: q = zero_point + round(x * (1 / scale)) (round
// half to even, 1 / scale in float32), or round(x / scale + zero_point)
// for a floating zero point; out = (clamp(q, qmin, qmax) - zero_point) *
// scale; the mask (where q was in range) is what the backward multiplies
// the gradient by. Composed of lowered ops: no value is read to the host
// (the CPU reads fake_quant_enabled; here it selects).

#include <cmath>
#include <limits>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

void CheckRange(int64_t quant_min, int64_t quant_max) {
  TORCH_CHECK(quant_min <= quant_max, "`quant_min` should be less than or equal to `quant_max`.");
}

// Where the CPU kernels' q holds no integer: the per-tensor kernels clamp
// in floating point (NaN becomes quant_min, infinities clamp to the ends);
// the per-channel and learnable ones cast q to int64 first, which on x86
// (the CPU that is our reference) makes NaN and |q| >= 2^63 INT64_MIN, so
// quant_min.
at::Tensor BelowAll(const at::Tensor& q, bool through_int64) {
  return through_int64 ? q.isnan().logical_or(q.abs().ge(9.223372036854775808e18)) : q.isnan();
}

// scale and zero_point broadcast to x (already shaped for it); the output's
// product in `pt`: the CPU kernels form it in float32 per tensor and in
// float64 per channel. Per channel, pjrt uses float64 only for float64
// inputs (a float32 model's activations are not widened to float64, which
// would double their memory traffic, and is slow or missing on
// accelerators): the same bits, but for a floating zero point with float32
// inputs, where an output may differ from the CPU's by one float32
// rounding. (The qparams below are float64 as on the CPU: a few numbers.)
std::tuple<at::Tensor, at::Tensor> FakeQuant(const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point,
                                             int64_t quant_min, int64_t quant_max, at::ScalarType pt,
                                             bool through_int64) {
  const at::ScalarType ct = OpMath(self.scalar_type());
  const at::Tensor x = self.to(ct);
  const at::Tensor sc = scale.to(at::kFloat);
  const at::Tensor inv = sc.reciprocal().to(ct);
  const at::Tensor zp = zero_point.to(ct);
  const bool float_zp = at::isFloatingType(zero_point.scalar_type());
  const at::Tensor q = float_zp ? (x * inv + zp).round() : (x * inv).round() + zp;
  const at::Tensor clamped = q.clamp(static_cast<double>(quant_min), static_cast<double>(quant_max))
                                 .masked_fill(BelowAll(q, through_int64), static_cast<double>(quant_min));
  const at::Tensor out = (clamped.to(pt) - zero_point.to(pt)) * sc.to(pt);
  const at::Tensor mask = q.ge(static_cast<double>(quant_min)).logical_and(q.le(static_cast<double>(quant_max)));
  return {out.to(self.scalar_type()), mask};
}

std::tuple<at::Tensor, at::Tensor> per_tensor(const at::Tensor& self, double scale, int64_t zero_point, int64_t quant_min,
                                              int64_t quant_max) {
  CheckRange(quant_min, quant_max);
  TORCH_CHECK(zero_point >= quant_min && zero_point <= quant_max,
              "`zero_point` must be between `quant_min` and `quant_max`.");
  const at::TensorOptions on = self.options();
  return FakeQuant(self, at::scalar_tensor(static_cast<float>(scale), on.dtype(at::kFloat)),
                   at::scalar_tensor(zero_point, on.dtype(at::kLong)), quant_min, quant_max, at::kFloat, false);
}

std::tuple<at::Tensor, at::Tensor> per_tensor_tensor_qparams(const at::Tensor& self, const at::Tensor& scale,
                                                             const at::Tensor& zero_point,
                                                             const at::Tensor& fake_quant_enabled, int64_t quant_min,
                                                             int64_t quant_max) {
  CheckRange(quant_min, quant_max);
  auto [out, mask] = FakeQuant(self, scale.reshape({}), zero_point.reshape({}), quant_min, quant_max, at::kFloat, false);
  const at::Tensor on = fake_quant_enabled.reshape({}).ge(1);  // off: the input and an all-true mask
  return {at::where(on, out, self), at::where(on, mask, at::ones_like(mask))};
}

std::tuple<at::Tensor, at::Tensor> per_channel(const at::Tensor& self, const at::Tensor& scale,
                                               const at::Tensor& zero_point, int64_t axis, int64_t quant_min,
                                               int64_t quant_max) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "Scale must be Float, found ", scale.scalar_type());
  TORCH_CHECK(zero_point.scalar_type() == at::kInt || zero_point.scalar_type() == at::kFloat ||
                  zero_point.scalar_type() == at::kHalf,
              "Zero-point must be Int32, Float or Half, found ", zero_point.scalar_type());
  TORCH_CHECK(scale.dim() == 1, "scale should be a 1-D tensor");
  TORCH_CHECK(zero_point.dim() == 1, "zero point should be a 1-D tensor");
  TORCH_CHECK(scale.numel() == zero_point.numel(), "scale and zero-point need to have the same dimensions");
  TORCH_CHECK(axis >= 0 && axis < self.dim(), "`axis` must be between 0 and number of dimensions of input");
  TORCH_CHECK(scale.numel() == self.size(axis),
              "dimensions of scale and zero-point are not consistent with input tensor");
  CheckRange(quant_min, quant_max);
  // (the CPU reads the zero points to check them; here the check runs in the program)
  const at::Tensor outside = zero_point.lt(quant_min).logical_or(zero_point.gt(quant_max)).any();
  TraceScope scope;
  CheckNone(DeviceIndex(self), Val(outside), runtime::ErrorKind::kValue,
            "`zero_point` must be between `quant_min` and `quant_max`.");
  std::vector<int64_t> along(static_cast<size_t>(self.dim()), 1);
  along[static_cast<size_t>(axis)] = self.size(axis);
  return FakeQuant(self, scale.reshape(along), zero_point.reshape(along), quant_min, quant_max,
                   self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat, true);
}

// The scale and zero point of [min, max], elementwise, as PyTorch's
// ChooseQuantizationParams computes them for its fused observer (in float64,
// as there, the stored scale rounded to float32): the range widened to hold
// 0, symmetric ranges centred for preserve_sparsity, a scale of 0.1 where it
// would vanish, tiny scales raised to 6.1e-5 with the range stretched, and
// the zero point from whichever end loses less precision, nudged into
// [qmin, qmax].
std::tuple<at::Tensor, at::Tensor> ChooseQParams(at::Tensor min, at::Tensor max, int64_t qmin, int64_t qmax,
                                                 bool preserve_sparsity) {
  const double qrange = static_cast<double>(qmax - qmin);
  if (preserve_sparsity) {
    const double sym_qmin = static_cast<double>(-((qmax - qmin) / 2 + 1)), sym_qmax = static_cast<double>((qmax - qmin) / 2);
    const at::Tensor both = min.lt(0).logical_and(max.gt(0));
    const at::Tensor max_scale = at::maximum((min / sym_qmin).abs(), (max / sym_qmax).abs()).to(at::kDouble);
    min = at::where(both, (max_scale * sym_qmin).to(at::kFloat), min);
    max = at::where(both, (max_scale * sym_qmax).to(at::kFloat), max);
  }
  min = min.clamp_max(0);
  max = max.clamp_min(0);
  at::Tensor scale = (max.to(at::kDouble) - min.to(at::kDouble)) / qrange;
  const at::Tensor scale_f = scale.to(at::kFloat);
  scale = at::where(scale_f.eq(0).logical_or(scale_f.reciprocal().isinf()), at::full_like(scale, 0.1), scale);
  constexpr float kSmall = 6.1e-5f;
  const at::Tensor small = scale.lt(static_cast<double>(kSmall));
  const at::Tensor amplifier = static_cast<double>(kSmall) / scale.to(at::kFloat);  // float32, as org_scale there
  // (min == 0 first: then max becomes the range; else max == 0: min does)
  const at::Tensor small_min =
      at::where(min.eq(0), min, at::where(max.eq(0), at::full_like(min, -kSmall * static_cast<float>(qrange)), min * amplifier));
  const at::Tensor small_max = at::where(min.eq(0), at::full_like(max, kSmall * static_cast<float>(qrange)),
                                         at::where(max.eq(0), max, max * amplifier));
  min = at::where(small, small_min, min);
  max = at::where(small, small_max, max);
  scale = at::where(small, at::full_like(scale, static_cast<double>(kSmall)), scale);
  const at::Tensor lo = min.to(at::kDouble) / scale, hi = max.to(at::kDouble) / scale;
  const double fqmin = static_cast<double>(qmin), fqmax = static_cast<double>(qmax);
  const at::Tensor from_min_better = (std::abs(fqmin) - lo.abs()).lt(std::abs(fqmax) - hi.abs());
  at::Tensor zp = at::where(from_min_better, fqmin - lo, fqmax - hi);
  if (preserve_sparsity) {
    zp = at::where(min.lt(0).logical_and(max.gt(0)), at::full_like(zp, (fqmin + fqmax) / 2), zp);
  }
  zp = at::where(zp.lt(fqmin), at::full_like(zp, fqmin), at::where(zp.gt(fqmax), at::full_like(zp, fqmax), zp.round()));
  return {scale.to(at::kFloat), zp.to(at::kInt)};
}

// torch.fused_moving_avg_obs_fake_quant (FusedMovingAvgObsFakeQuantize, the
// default QAT qconfig's module): the moving-average min/max observer, the
// qparams of the running range and fake quantization in one op, as the
// CPU's fused kernel; the observer_on and fake_quant_on flags select on the
// device instead of being read to the host.
std::tuple<at::Tensor, at::Tensor> fused_moving_avg_obs_fq(
    const at::Tensor& self, const at::Tensor& observer_on, const at::Tensor& fake_quant_on, at::Tensor& running_min,
    at::Tensor& running_max, at::Tensor& scale, at::Tensor& zero_point, double averaging_const, int64_t quant_min,
    int64_t quant_max, int64_t ch_axis, bool per_row_fake_quant, bool symmetric_quant) {
  TORCH_CHECK(ch_axis < self.dim(), "Error in fused_moving_avg_obs_fq_helper: ch_axis must be < self.dim()");
  CheckRange(quant_min, quant_max);
  at::Tensor x_min, x_max;
  if (per_row_fake_quant) {
    TORCH_CHECK(ch_axis == 0, "Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is only supported on axis == 0");
    const int64_t size = self.size(ch_axis);
    if (running_min.numel() == 0) {
      running_min.resize_({size}).fill_(std::numeric_limits<float>::infinity());
      running_max.resize_({size}).fill_(-std::numeric_limits<float>::infinity());
      scale.resize_({size});
      zero_point.resize_({size});
    }
    std::tie(x_min, x_max) = at::aminmax(self.dim() == 2 ? self : self.flatten(1), 1);
  } else {
    std::tie(x_min, x_max) = at::aminmax(self);
  }
  const float c = static_cast<float>(averaging_const);
  auto average = [&](const at::Tensor& running, const at::Tensor& now) {
    const at::Tensor moved = at::where(running.isinf(), now, running + (now - running) * c);
    return at::where(observer_on.reshape({}).ne(0), moved, running);
  };
  const at::Tensor new_min = average(running_min, x_min.to(running_min.scalar_type()));
  const at::Tensor new_max = average(running_max, x_max.to(running_max.scalar_type()));
  running_min.copy_(new_min);
  running_max.copy_(new_max);
  auto [sc, zp] = ChooseQParams(new_min.to(at::kFloat), new_max.to(at::kFloat), quant_min, quant_max, symmetric_quant);
  const at::Tensor on = fake_quant_on.reshape({}).ne(0);
  scale.copy_(at::where(on, sc.reshape(scale.sizes()), scale));
  zero_point.copy_(at::where(on, zp.reshape(zero_point.sizes()).to(zero_point.scalar_type()), zero_point));
  at::Tensor out, mask;
  if (per_row_fake_quant) {
    std::vector<int64_t> along(static_cast<size_t>(self.dim()), 1);
    along[0] = self.size(0);
    std::tie(out, mask) = FakeQuant(self, sc.reshape(along), zp.reshape(along), quant_min, quant_max,
                                    self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat, true);
  } else {
    std::tie(out, mask) = FakeQuant(self, sc.reshape({}), zp.reshape({}), quant_min, quant_max, at::kFloat, false);
  }
  return {at::where(on, out, self), at::where(on, mask, at::ones_like(mask))};
}

// Learnable fake quantization (LSQ: torch.ao's _LearnableFakeQuantize). The
// forward is the fake quantization above with the float zero point rounded
// (half to even) and clamped into [qmin, qmax], as the CPU reads it. The
// backward is the CPU kernel's, elementwise in float32 with q = zero_point +
// round(x / scale): the gradient passes where q is in range; the scale's
// gradient is dy (out - x) / scale there and dy (qmin or qmax - zero_point)
// outside, the zero point's 0 there and -dy scale outside, both times
// grad_factor and summed (per channel: over every dimension but the axis).
at::Tensor RoundedZeroPoint(const at::Tensor& zero_point, int64_t quant_min, int64_t quant_max) {
  return zero_point.to(at::kFloat).round().clamp(static_cast<double>(quant_min), static_cast<double>(quant_max));
}

at::Tensor learnable_per_tensor(const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point,
                                int64_t quant_min, int64_t quant_max, double) {
  CheckRange(quant_min, quant_max);
  const at::Tensor zp = RoundedZeroPoint(zero_point.reshape({-1}).select(0, 0), quant_min, quant_max);
  return std::get<0>(FakeQuant(self, scale.reshape({-1}).select(0, 0), zp.to(at::kLong), quant_min, quant_max,
                               at::kFloat, false));
}

at::Tensor learnable_per_channel(const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point,
                                 int64_t axis, int64_t quant_min, int64_t quant_max, double) {
  CheckRange(quant_min, quant_max);
  return std::get<0>(
      per_channel(self, scale, RoundedZeroPoint(zero_point, quant_min, quant_max).to(at::kInt), axis, quant_min,
                  quant_max));
}

// (dx, dscale, dzero_point) with scale and zero_point shaped to broadcast
// over x; `keep`: the dimension the parameter gradients keep (-1: none).
std::tuple<at::Tensor, at::Tensor, at::Tensor> LearnableGrads(const at::Tensor& grad, const at::Tensor& self,
                                                              const at::Tensor& scale, const at::Tensor& zp,
                                                              int64_t quant_min, int64_t quant_max, double grad_factor,
                                                              int64_t keep) {
  TORCH_CHECK(grad.scalar_type() == at::kFloat && self.scalar_type() == at::kFloat,
              "the backward of learnable fake quantization takes float32 gradients and inputs (as on the CPU), got ",
              grad.scalar_type(), " and ", self.scalar_type());
  const double qmin = static_cast<double>(quant_min), qmax = static_cast<double>(quant_max);
  const at::Tensor inv = scale.reciprocal();
  const at::Tensor q = (self * inv).round() + zp;
  const at::Tensor in = q.ge(qmin).logical_and(q.le(qmax));
  const at::Tensor dx = grad * in.to(at::kFloat);
  const at::Tensor fq = (q.clamp(qmin, qmax) - zp) * scale;
  const at::Tensor edge = at::where(q.lt(qmin).logical_or(BelowAll(q, true)), qmin - zp, qmax - zp);
  const at::Tensor dscale = at::where(in, grad * (fq - self) * inv, grad * edge) * grad_factor;
  const at::Tensor dzp = at::where(in, at::zeros_like(grad), grad * -1 * scale) * grad_factor;
  if (keep < 0) return {dx, dscale.sum().unsqueeze(0), dzp.sum().unsqueeze(0)};
  if (self.dim() == 1) return {dx, dscale, dzp};  // nothing to sum over (sum({}) would take every dimension)
  std::vector<int64_t> dims;
  for (int64_t k = 0; k < self.dim(); ++k) {
    if (k != keep) dims.push_back(k);
  }
  return {dx, dscale.sum(dims), dzp.sum(dims)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_tensor_backward(
    const at::Tensor& grad, const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t quant_min, int64_t quant_max, double grad_factor) {
  CheckRange(quant_min, quant_max);
  if (self.numel() == 0) return {self.clone(), scale.clone(), zero_point.clone()};  // the CPU's
  // The CPU reads this zero point as trunc(clamp(z + 0.5)), not as its forward's round.
  const at::Tensor zp = (zero_point.reshape({-1}).select(0, 0).to(at::kFloat) + 0.5)
                            .clamp(static_cast<double>(quant_min), static_cast<double>(quant_max))
                            .trunc();
  return LearnableGrads(grad, self, scale.reshape({-1}).select(0, 0).to(at::kFloat), zp, quant_min, quant_max,
                        grad_factor, -1);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_channel_backward(
    const at::Tensor& grad, const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point, int64_t axis,
    int64_t quant_min, int64_t quant_max, double grad_factor) {
  CheckRange(quant_min, quant_max);
  if (self.numel() == 0) return {self.clone(), scale.clone(), zero_point.clone()};  // the CPU's
  TORCH_CHECK(axis >= 0 && axis < self.dim(), "`axis` must be between 0 and number of dimensions of input");
  TORCH_CHECK(scale.numel() == self.size(axis) && zero_point.numel() == self.size(axis),
              "dimensions of scale and zero-point are not consistent with input tensor");
  std::vector<int64_t> along(static_cast<size_t>(self.dim()), 1);
  along[static_cast<size_t>(axis)] = self.size(axis);
  return LearnableGrads(grad, self, scale.to(at::kFloat).reshape(along),
                        RoundedZeroPoint(zero_point, quant_min, quant_max).reshape(along), quant_min, quant_max,
                        grad_factor, axis);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("fake_quantize_per_tensor_affine_cachemask", per_tensor);
  K("_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", per_tensor_tensor_qparams);
  K("fake_quantize_per_channel_affine_cachemask", per_channel);
  K("_fused_moving_avg_obs_fq_helper", fused_moving_avg_obs_fq);
  K("_fake_quantize_learnable_per_tensor_affine", learnable_per_tensor);
  K("_fake_quantize_learnable_per_tensor_affine_backward", learnable_per_tensor_backward);
  K("_fake_quantize_learnable_per_channel_affine", learnable_per_channel);
  K("_fake_quantize_learnable_per_channel_affine_backward", learnable_per_channel_backward);
}
