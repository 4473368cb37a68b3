// Modified Bessel functions of the first kind, i0, i0e, i1 and i1e, as the
// CPU computes them: Cephes' two Chebyshev expansions (|x| <= 8 and above),
// with the coefficients PyTorch ships in ATen/native/Math.h (float ones for
// float inputs, as the CPU), half types in float. And kaiser_window, whose
// CPU kernel is a dispatch stub no other device has.
#include <ATen/native/Math.h>

#include <cmath>
#include <tuple>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

at::ScalarType Acc(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t; }

struct Ctx {
  int d;
  at::ScalarType t;
  std::vector<int64_t> shape;
  ir::Builder& b() const { return B(d); }
  ir::Value c(double v) const { return Fill(d, v, t, shape); }
  ir::Value bin(Op op, ir::Value x, ir::Value y) const { return b().Binary(op, x, y); }
};

// Cephes' chbevl: the series sum_i array[i] T_i(y/2), coefficients highest
// order first.
template <typename T>
ir::Value Chebyshev(const Ctx& c, ir::Value y, std::tuple<const T*, size_t> coeffs) {
  const auto [a, len] = coeffs;
  ir::Value b0 = c.c(static_cast<double>(a[0])), b1 = c.c(0), b2 = c.c(0);
  for (size_t i = 1; i < len; ++i) {
    b2 = b1;
    b1 = b0;
    b0 = c.bin(Op::Add, c.bin(Op::Sub, c.bin(Op::Mul, y, b1), b2), c.c(static_cast<double>(a[i])));
  }
  return c.bin(Op::Mul, c.c(0.5), c.bin(Op::Sub, b0, b2));
}

enum class Kind { I0, I0e, I1, I1e };

template <typename T>
ir::Value Bessel(const Ctx& c, ir::Value x_in, Kind k) {
  ir::Builder& b = c.b();
  ir::Value x = b.Unary(Op::Abs, x_in);
  const bool first = k == Kind::I1 || k == Kind::I1e;
  const bool scaled = k == Kind::I0e || k == Kind::I1e;
  ir::Value small_y = c.bin(Op::Sub, c.bin(Op::Div, x, c.c(2)), c.c(2));
  ir::Value large_y = c.bin(Op::Sub, c.bin(Op::Div, c.c(32), x), c.c(2));
  ir::Value small = first ? Chebyshev<T>(c, small_y, ::chebyshev_coefficients_i1e_A<T>())
                          : Chebyshev<T>(c, small_y, ::chebyshev_coefficients_i0e_A<T>());
  ir::Value large = first ? Chebyshev<T>(c, large_y, ::chebyshev_coefficients_i1e_B<T>())
                          : Chebyshev<T>(c, large_y, ::chebyshev_coefficients_i0e_B<T>());
  ir::Value e = b.Unary(Op::Exp, x);
  // the CPU's order of operations per branch
  if (first) small = scaled ? c.bin(Op::Mul, small, x) : c.bin(Op::Mul, c.bin(Op::Mul, e, x), small);
  else if (!scaled) small = c.bin(Op::Mul, e, small);
  if (!scaled) large = c.bin(Op::Mul, e, large);
  large = c.bin(Op::Div, large, b.Unary(Op::Sqrt, x));
  ir::Value r = b.Select(b.Compare(CompareDir::LE, x, c.c(8)), small, large);
  if (first) r = b.Select(b.Compare(CompareDir::LT, x_in, c.c(0)), b.Unary(Op::Neg, r), r);
  return r;
}

at::Tensor BesselOp(const at::Tensor& a, Kind k, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "\"", op, "\" not implemented for '", a.scalar_type(), "'");
  TraceScope s;
  const at::ScalarType t = FloatType(a.scalar_type()), ct = Acc(t);
  Ctx c{DeviceIndex(a), ct, a.sizes().vec()};
  ir::Value x = ValAs(a, ct);
  ir::Value r = ct == at::kDouble ? Bessel<double>(c, x, k) : Bessel<float>(c, x, k);
  return Wrap(c.b().Convert(r, ToIr(t)), c.d);
}

at::Tensor i0(const at::Tensor& a) { return BesselOp(a, Kind::I0, "i0"); }
at::Tensor i0e(const at::Tensor& a) { return BesselOp(a, Kind::I0e, "special_i0e"); }
at::Tensor i1(const at::Tensor& a) { return BesselOp(a, Kind::I1, "special_i1"); }
at::Tensor i1e(const at::Tensor& a) { return BesselOp(a, Kind::I1e, "special_i1e"); }

// kaiser_window: I0(beta * sqrt(|1 - ((n - alpha) / alpha)^2|)) / I0(beta),
// alpha = (N - 1) / 2, in the CPU kernel's arithmetic (the index counted in
// the window's dtype, the rest in its accumulate type).
at::Tensor kaiser_window(int64_t length, bool periodic, double beta, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin) {
  const at::ScalarType t = dtype ? *dtype : at::typeMetaToScalarType(at::get_default_dtype());
  const at::TensorOptions options = at::TensorOptions().dtype(t).layout(layout).device(device).pinned_memory(pin);
  TORCH_CHECK(!layout || *layout == at::kStrided, "kaiser_window is not implemented for sparse types, got: ", *layout);
  TORCH_CHECK(at::isFloatingType(t), "kaiser_window expects floating point dtypes, got: ", t);
  TORCH_CHECK(length >= 0, "kaiser_window requires non-negative window_length, got window_length=", length);
  if (length == 0) return at::empty({0}, options);
  if (length == 1) return at::ones({1}, options);
  if (periodic) length += 1;
  const at::ScalarType ct = Acc(t);
  const double alpha = ct == at::kFloat ? static_cast<double>(static_cast<float>((length - 1) / 2.0)) : (length - 1) / 2.0;
  const double i0_beta = ct == at::kFloat ? static_cast<double>(calc_i0(static_cast<float>(beta))) : calc_i0(beta);
  at::Tensor n = at::arange(length, options).to(ct);
  at::Tensor r = (n - alpha) / alpha;
  at::Tensor w = (at::i0(beta * at::sqrt(at::abs(1 - r * r))) / i0_beta).to(t);
  return periodic ? w.narrow(0, 0, length - 1) : w;
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("i0", i0);
  K("special_i0e", i0e);
  K("special_i1", i1);
  K("special_i1e", i1e);
  K("kaiser_window.beta", kaiser_window);
}
