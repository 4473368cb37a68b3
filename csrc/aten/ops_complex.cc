// Complex numbers: building them (complex, polar), taking them apart
// (angle; real and imag are PyTorch's views through view_as_real), the
// conjugate, and the views between a complex tensor and its (real, imag)
// pairs. Elementwise arithmetic, abs, exp, log, sums and means of complex
// tensors are the ordinary lowerings (StableHLO's ops take complex operands;
// abs of a complex value is real, see ir/infer.cc).
//
// view_as_real / view_as_complex are true views, as on the CPU: the new
// tensor shares the storage with another dtype, and reads and writes through
// either are exact (ir::Builder::Bitcast takes complex values apart into
// their parts and builds them back; XLA has no complex bitcast).
#include <cmath>

#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

at::Tensor conj_physical(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  return Wrap(Conjugate(B(d), Val(a)), d);
}

// (its default kernel writes through conj_physical.out, a CPU/CUDA kernel)
at::Tensor& conj_physical_(at::Tensor& self) {
  if (!self.is_complex()) return self;
  TraceScope s;
  Assign(self, Conjugate(B(DeviceIndex(self)), Val(self)));
  return self;
}

at::Tensor complex(const at::Tensor& re, const at::Tensor& im) {
  TORCH_CHECK(re.scalar_type() == im.scalar_type(), "Expected object of scalar type ", re.scalar_type(),
              " but got scalar type ", im.scalar_type(), " for second argument");
  TORCH_CHECK(re.scalar_type() == at::kFloat || re.scalar_type() == at::kDouble,
              "complex on pjrt takes float32 or float64 parts (complex32 has no PJRT type), got ", re.scalar_type());
  TraceScope s;
  Operands o = Prepare(re, im, re.scalar_type());
  return Wrap(B(o.device).Complex(o.x, o.y), o.device);
}

at::Tensor polar(const at::Tensor& abs, const at::Tensor& angle) {
  TORCH_CHECK(abs.scalar_type() == angle.scalar_type(), "Expected object of scalar type ", abs.scalar_type(),
              " but got scalar type ", angle.scalar_type(), " for second argument");
  TORCH_CHECK(abs.scalar_type() == at::kFloat || abs.scalar_type() == at::kDouble,
              "polar on pjrt takes float32 or float64 tensors, got ", abs.scalar_type());
  TraceScope s;
  Operands o = Prepare(abs, angle, abs.scalar_type());
  ir::Builder& b = B(o.device);
  return Wrap(b.Complex(b.Binary(Op::Mul, o.x, b.Unary(Op::Cos, o.y)), b.Binary(Op::Mul, o.x, b.Unary(Op::Sin, o.y))),
              o.device);
}

// angle: atan2(imag, real) of complex values; of real ones pi below zero,
// 0 otherwise, NaN kept (as the CPU).
at::Tensor angle(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  if (a.is_complex()) {
    ir::Value x = Val(a);
    return Wrap(b.Binary(Op::Atan2, b.Imag(x), b.Real(x)), d);
  }
  const at::ScalarType t = FloatType(a.scalar_type());
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  ir::Value r = b.Select(b.Compare(ir::CompareDir::LT, x, Fill(d, 0, t, shape)), Fill(d, M_PI, t, shape),
                         Fill(d, 0, t, shape));
  return Wrap(b.Select(IsNan(d, x), x, r), d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));  // generic over strides and storages
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  K("_conj_physical", conj_physical);  // conj_physical is a composite over it (autograd included)
  K("conj_physical_", conj_physical_);
  K("complex", complex);
  K("polar", polar);
  K("angle", angle);
}
