// Fake quantization (quantization-aware training, torch.ao.quantization's
// FakeQuantize and torch.fake_quantize_per_tensor/channel_affine) with the
// CPU kernels' arithmetic: q = zero_point + round(x * (1 / scale)) (round
// half to even, 1 / scale in float32), or round(x / scale + zero_point)
// for a floating zero point; out = (clamp(q, qmin, qmax) - zero_point) *
// scale; the mask (where q was in range) is what the backward multiplies
// the gradient by. Composed of lowered ops: no value is read to the host
// (the CPU reads fake_quant_enabled; here it selects).
#include <ATen/OpMathType.h>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

void CheckRange(int64_t quant_min, int64_t quant_max) {
  TORCH_CHECK(quant_min <= quant_max, "`quant_min` should be less than or equal to `quant_max`.");
}

// scale and zero_point broadcast to x (already shaped for it); the output's
// product in `pt`: the CPU kernels form it in float32 per tensor and in
// float64 per channel. Per channel, pjrt uses float64 only for float64
// inputs (a float32 model's program stays free of float64, which TPUs
// lack): the same bits, but for a floating zero point with float32 inputs,
// where an output may differ from the CPU's by one float32 rounding.
std::tuple<at::Tensor, at::Tensor> FakeQuant(const at::Tensor& self, const at::Tensor& scale, const at::Tensor& zero_point,
                                             int64_t quant_min, int64_t quant_max, at::ScalarType pt) {
  const at::ScalarType ct = at::toOpMathType(self.scalar_type());
  const at::Tensor x = self.to(ct);
  const at::Tensor sc = scale.to(at::kFloat);
  const at::Tensor inv = sc.reciprocal().to(ct);
  const at::Tensor zp = zero_point.to(ct);
  const bool float_zp = at::isFloatingType(zero_point.scalar_type());
  const at::Tensor q = float_zp ? (x * inv + zp).round() : (x * inv).round() + zp;
  const at::Tensor clamped = q.clamp(static_cast<double>(quant_min), static_cast<double>(quant_max));
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
                   at::scalar_tensor(zero_point, on.dtype(at::kLong)), quant_min, quant_max, at::kFloat);
}

std::tuple<at::Tensor, at::Tensor> per_tensor_tensor_qparams(const at::Tensor& self, const at::Tensor& scale,
                                                             const at::Tensor& zero_point,
                                                             const at::Tensor& fake_quant_enabled, int64_t quant_min,
                                                             int64_t quant_max) {
  CheckRange(quant_min, quant_max);
  auto [out, mask] = FakeQuant(self, scale.reshape({}), zero_point.reshape({}), quant_min, quant_max, at::kFloat);
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
                   self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("fake_quantize_per_tensor_affine_cachemask", per_tensor);
  K("_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", per_tensor_tensor_qparams);
  K("fake_quantize_per_channel_affine_cachemask", per_channel);
}
