// Math functions that StableHLO has no op for, written from the ones it has
// in forms that keep precision where the naive formula loses it (near 0,
// near +-1, for large arguments), and with the CPU's answers for NaN, +-inf
// and the domain edges: inverse trigonometric and hyperbolic functions,
// log2/log10/exp2, logaddexp, xlogy, nan_to_num, frac, sinc, fmax/fmin,
// hypot, heaviside, logit, entr, erfinv, the gamma family and zeta, the
// modified Bessel functions i0/i1 (and kaiser_window), gcd/lcm, frexp,
// nextafter, and clamp_min/clamp_max by a tensor.
//
// Their gradients are PyTorch's own formulas (derivatives.yaml) over lowered
// ops, except logit's backward, which is an op of its own.
#include <ATen/native/Math.h>
#include <ATen/native/Resize.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLn10 = 2.30258509299404568402;
constexpr double kPi = 3.14159265358979323846;

// One lowering's values: device, dtype and shape of the result.
struct Ctx {
  int d;
  at::ScalarType t;
  std::vector<int64_t> shape;
  ir::Builder& b() const { return B(d); }
  ir::Value c(double v) const { return Fill(d, v, t, shape); }
  ir::Value un(Op op, ir::Value x) const { return b().Unary(op, x); }
  ir::Value bin(Op op, ir::Value x, ir::Value y) const { return b().Binary(op, x, y); }
  ir::Value cmp(CompareDir dir, ir::Value x, ir::Value y) const { return b().Compare(dir, x, y); }
  ir::Value sel(ir::Value p, ir::Value x, ir::Value y) const { return b().Select(p, x, y); }
  ir::Value nan(ir::Value x) const { return cmp(CompareDir::NE, x, x); }
};

// The dtype a function of dtype t computes in: the CPU's opmath, or for
// `wide` functions float64 where t's opmath is float32 on the CPU plugin.
// XLA's float32 expansions of lgamma, erfc and zeta are 7-1300x less
// accurate than the CPU's kernels (lgamma: 1.9e-4 relative near its roots
// against 1.5e-7, 5e-6 absolute against 5e-7; digamma's is as accurate as
// the CPU's); in float64, rounded once, each is within half an ulp. GPUs
// and TPUs keep float32 (float64 is slow or absent there).
at::ScalarType Compute(at::ScalarType t, int device, bool wide) {
  const at::ScalarType math = OpMath(t);
  return wide && math == at::kFloat && B(device).cpu_backend() ? at::kDouble : math;
}

// A float-valued function of one tensor (integers and bool promote to the
// default float dtype, as PyTorch's unary float ops do).
// Half and bfloat16 compute in float and round once, as the CPU's opmath.

// Complex inputs run `op` on the CPU (these formulas are for real numbers).
// `wide`: float32 (and half) compute in float64 on the CPU plugin (see
// Compute).
template <typename F>
at::Tensor FloatUnary(const char* op, const at::Tensor& a, F f, bool wide = false) {
  if (a.is_complex()) return OnCpu(op, "", a);
  TraceScope s;
  const at::ScalarType t = FloatType(a.scalar_type());
  Ctx c{DeviceIndex(a), Compute(t, DeviceIndex(a), wide), a.sizes().vec()};
  return Wrap(c.b().Convert(f(c, ValAs(a, c.t)), ToIr(t)), c.d);
}

// A function of two broadcast tensors whose result has dtype t.
template <typename F>
at::Tensor BinaryIn(const at::Tensor& a, const at::Tensor& b, at::ScalarType t, F f, bool wide = false) {
  TraceScope s;
  const at::ScalarType compute = Compute(t, CommonDevice({&a, &b}), wide);
  // Each operand in t first, as TensorIterator casts them (a number or an
  // integer tensor beside a half one is rounded to half: xlogy(x, 70000) is
  // x * log(inf) in float16), then in the type computed in.
  Operands o = Prepare(a, b, t);
  if (compute != t) {
    o.x = B(o.device).Convert(o.x, ToIr(compute));
    o.y = B(o.device).Convert(o.y, ToIr(compute));
  }
  Ctx c{o.device, compute, o.shape};
  return Wrap(c.b().Convert(f(c, o.x, o.y), ToIr(t)), c.d);
}

void CheckFloat(at::ScalarType t, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t), op, " on pjrt expects floating-point inputs, got ", t);
}

// sqrt((1 - x)(1 + x)): 1 - x^2 without the cancellation near +-1.
ir::Value OneMinusSquareRoot(const Ctx& c, ir::Value x) {
  return c.un(Op::Sqrt, c.bin(Op::Mul, c.bin(Op::Sub, c.c(1), x), c.bin(Op::Add, c.c(1), x)));
}

at::Tensor asin(const at::Tensor& a) {
  return FloatUnary("aten::asin", a,
                    [](const Ctx& c, ir::Value x) { return c.bin(Op::Atan2, x, OneMinusSquareRoot(c, x)); });
}
at::Tensor acos(const at::Tensor& a) {
  return FloatUnary("aten::acos", a,
                    [](const Ctx& c, ir::Value x) { return c.bin(Op::Atan2, OneMinusSquareRoot(c, x), x); });
}
at::Tensor atan(const at::Tensor& a) {
  return FloatUnary("aten::atan", a, [](const Ctx& c, ir::Value x) { return c.bin(Op::Atan2, x, c.c(1)); });
}

// exp(|x|) / 2 as (exp(|x|/2) / 2) exp(|x|/2): finite wherever sinh and
// cosh are, without rounding |x| - ln 2 first.
ir::Value HalfExpAbs(const Ctx& c, ir::Value x) {
  ir::Value e = c.un(Op::Exp, c.bin(Op::Mul, c.un(Op::Abs, x), c.c(0.5)));
  return c.bin(Op::Mul, c.bin(Op::Mul, c.c(0.5), e), e);
}

// sinh: (expm1(x) - expm1(-x)) / 2 for |x| < 1 (no cancellation near 0),
// sign(x) (e/2 - 1/(2e)) beyond.
at::Tensor sinh(const at::Tensor& a) {
  return FloatUnary("aten::sinh", a, [](const Ctx& c, ir::Value x) {
    ir::Value small = c.bin(Op::Div, c.bin(Op::Sub, c.un(Op::Expm1, x), c.un(Op::Expm1, c.un(Op::Neg, x))), c.c(2));
    ir::Value h = HalfExpAbs(c, x);
    ir::Value big = c.bin(Op::Sub, h, c.bin(Op::Div, c.c(0.25), h));
    big = c.sel(c.cmp(CompareDir::LT, x, c.c(0)), c.un(Op::Neg, big), big);
    return c.sel(c.cmp(CompareDir::LT, c.un(Op::Abs, x), c.c(1)), small, big);
  });
}
at::Tensor cosh(const at::Tensor& a) {
  return FloatUnary("aten::cosh", a, [](const Ctx& c, ir::Value x) {
    ir::Value h = HalfExpAbs(c, x);
    return c.bin(Op::Add, h, c.bin(Op::Div, c.c(0.25), h));
  });
}

// Beyond 2^28, x^2 + 1 is x^2 in float and x^2 overflows sooner or later:
// asinh and acosh are log(2|x|) there.
constexpr double kHuge = 268435456.0;

// asinh: sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); -0.0 stays -0.0.
at::Tensor asinh(const at::Tensor& a) {
  return FloatUnary("aten::asinh", a, [](const Ctx& c, ir::Value x) {
    ir::Value ax = c.un(Op::Abs, x);
    ir::Value sq = c.bin(Op::Mul, ax, ax);
    ir::Value near = c.un(Op::Log1p, c.bin(Op::Add, ax, c.bin(Op::Div, sq, c.bin(Op::Add, c.c(1), c.un(Op::Sqrt, c.bin(Op::Add, c.c(1), sq))))));
    ir::Value far = c.bin(Op::Add, c.un(Op::Log, ax), c.c(kLn2));
    ir::Value r = c.sel(c.cmp(CompareDir::GT, ax, c.c(kHuge)), far, near);
    r = c.sel(c.cmp(CompareDir::LT, x, c.c(0)), c.un(Op::Neg, r), r);
    return c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), x, r);
  });
}

// acosh: log1p(t + sqrt(t (x + 1))), t = x - 1 (precise near 1); NaN below 1.
at::Tensor acosh(const at::Tensor& a) {
  return FloatUnary("aten::acosh", a, [](const Ctx& c, ir::Value x) {
    ir::Value t = c.bin(Op::Sub, x, c.c(1));
    ir::Value near = c.un(Op::Log1p, c.bin(Op::Add, t, c.un(Op::Sqrt, c.bin(Op::Mul, t, c.bin(Op::Add, x, c.c(1))))));
    ir::Value far = c.bin(Op::Add, c.un(Op::Log, x), c.c(kLn2));
    ir::Value r = c.sel(c.cmp(CompareDir::GT, x, c.c(kHuge)), far, near);
    // below -1, t (x + 1) is positive again: the NaN is set, not left to sqrt
    return c.sel(c.cmp(CompareDir::LT, x, c.c(1)), c.c(NAN), r);
  });
}

// atanh: sign(x) log1p(2|x| / (1 - |x|)) / 2 (precise near both +-1): +-inf
// at +-1, NaN beyond; -0.0 stays -0.0.
at::Tensor atanh(const at::Tensor& a) {
  return FloatUnary("aten::atanh", a, [](const Ctx& c, ir::Value x) {
    ir::Value ax = c.un(Op::Abs, x);
    ir::Value q = c.bin(Op::Div, c.bin(Op::Mul, c.c(2), ax), c.bin(Op::Sub, c.c(1), ax));
    ir::Value r = c.bin(Op::Mul, c.c(0.5), c.un(Op::Log1p, q));
    r = c.sel(c.cmp(CompareDir::LT, x, c.c(0)), c.un(Op::Neg, r), r);
    return c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), x, r);
  });
}

// log(x) / log(base), rounded to the integer where the base's power is
// exactly x: log2(8) is 3, not 2.9999998 (code takes floor(log2(n))).
ir::Value LogBase(const Ctx& c, ir::Value x, double base) {
  ir::Value r = c.bin(Op::Div, c.un(Op::Log, x), c.c(std::log(base)));
  ir::Value k = c.un(Op::RoundAwayFromZero, r);
  ir::Value exact = c.cmp(CompareDir::EQ, c.bin(Op::Pow, c.c(base), k), x);
  return c.sel(exact, k, r);
}
at::Tensor log2(const at::Tensor& a) {
  return FloatUnary("aten::log2", a, [](const Ctx& c, ir::Value x) { return LogBase(c, x, 2); });
}
at::Tensor log10(const at::Tensor& a) {
  return FloatUnary("aten::log10", a, [](const Ctx& c, ir::Value x) { return LogBase(c, x, 10); });
}
at::Tensor exp2(const at::Tensor& a) {
  return FloatUnary("aten::exp2", a, [](const Ctx& c, ir::Value x) { return c.bin(Op::Pow, c.c(2), x); });
}

// max + log1p(exp(-|a - b|)) (in base 2 for logaddexp2); equal infinities
// give themselves, as on the CPU (inf - inf would be NaN).
at::Tensor LogAddExp(const at::Tensor& a, const at::Tensor& b, bool base2) {
  const at::ScalarType t = at::result_type(a, b);
  if (at::isComplexType(t)) return OnCpu(base2 ? "aten::logaddexp2" : "aten::logaddexp", "", a, b);
  CheckFloat(t, base2 ? "logaddexp2" : "logaddexp");
  return BinaryIn(a, b, t, [base2](const Ctx& c, ir::Value x, ir::Value y) {
    ir::Value m = c.bin(Op::Max, x, y);
    ir::Value gap = c.un(Op::Neg, c.un(Op::Abs, c.bin(Op::Sub, x, y)));
    ir::Value r = base2 ? c.bin(Op::Add, m, c.bin(Op::Div, c.un(Op::Log1p, c.un(Op::Exp, c.bin(Op::Mul, gap, c.c(kLn2)))), c.c(kLn2)))
                        : c.bin(Op::Add, m, c.un(Op::Log1p, c.un(Op::Exp, gap)));
    ir::Value same_inf = c.b().Binary(Op::And, c.cmp(CompareDir::EQ, x, y), c.cmp(CompareDir::EQ, c.un(Op::Abs, x), c.c(INFINITY)));
    r = c.sel(same_inf, x, r);
    // NaN in either gives NaN (max leaves it to the backend)
    return c.sel(c.b().Binary(Op::Or, c.nan(x), c.nan(y)), c.bin(Op::Add, x, y), r);
  });
}
at::Tensor logaddexp(const at::Tensor& a, const at::Tensor& b) { return LogAddExp(a, b, false); }
at::Tensor logaddexp2(const at::Tensor& a, const at::Tensor& b) { return LogAddExp(a, b, true); }

// x log(y) (x log1p(y)), 0 where x is 0 unless y is NaN.
at::Tensor XLog(const at::Tensor& a, const at::Tensor& b, Op log) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex() && !b.is_complex(), log == Op::Log ? "xlogy" : "xlog1py",
                              " is not implemented for complex tensors");
  return BinaryIn(a, b, FloatType(at::result_type(a, b)), [log](const Ctx& c, ir::Value x, ir::Value y) {
    ir::Value r = c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), c.c(0), c.bin(Op::Mul, x, c.un(log, y)));
    return c.sel(c.nan(y), y, r);
  });
}
at::Tensor xlogy(const at::Tensor& a, const at::Tensor& b) { return XLog(a, b, Op::Log); }
at::Tensor xlogy_ss(const at::Scalar& a, const at::Tensor& b) { return XLog(WrappedScalar(a), b, Op::Log); }
at::Tensor xlogy_so(const at::Tensor& a, const at::Scalar& b) { return XLog(a, WrappedScalar(b), Op::Log); }
at::Tensor xlog1py(const at::Tensor& a, const at::Tensor& b) { return XLog(a, b, Op::Log1p); }
at::Tensor xlog1py_ss(const at::Scalar& a, const at::Tensor& b) { return XLog(WrappedScalar(a), b, Op::Log1p); }
at::Tensor xlog1py_so(const at::Tensor& a, const at::Scalar& b) { return XLog(a, WrappedScalar(b), Op::Log1p); }

// NaN -> nan, +inf -> posinf (default: the dtype's largest), -inf -> neginf
// (default: its lowest); other dtypes are returned as they are.
at::Tensor nan_to_num(const at::Tensor& a, std::optional<double> nan, std::optional<double> posinf,
                      std::optional<double> neginf) {
  if (a.is_complex()) return OnCpu("aten::nan_to_num", "", a, nan, posinf, neginf);
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = a.scalar_type();
  if (!at::isFloatingType(t)) return Wrap(Val(a), d);
  double hi = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "nan_to_num", [&] {
    hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
  });
  Ctx c{d, t, a.sizes().vec()};
  ir::Value x = Val(a);
  ir::Value r = c.sel(c.nan(x), c.c(nan.value_or(0.0)), x);
  r = c.sel(c.cmp(CompareDir::EQ, x, c.c(INFINITY)), c.c(posinf.value_or(hi)), r);
  return Wrap(c.sel(c.cmp(CompareDir::EQ, x, c.c(-INFINITY)), c.c(neginf.value_or(-hi)), r), d);
}

// frac = x - trunc(x), keeping the sign of x; NaN and inf give NaN.
at::Tensor frac(const at::Tensor& a) {
  CheckFloat(a.scalar_type(), "frac");
  TraceScope s;
  Ctx c{DeviceIndex(a), a.scalar_type(), a.sizes().vec()};
  ir::Value x = Val(a);
  ir::Value tr = c.sel(c.cmp(CompareDir::LT, x, c.c(0)), c.un(Op::Ceil, x), c.un(Op::Floor, x));
  return Wrap(c.bin(Op::Sub, x, tr), c.d);
}

// sinc = sin(pi x) / (pi x), 1 at 0.
at::Tensor sinc(const at::Tensor& a) {
  return FloatUnary("aten::sinc", a, [](const Ctx& c, ir::Value x) {
    ir::Value px = c.bin(Op::Mul, x, c.c(kPi));
    return c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), c.c(1), c.bin(Op::Div, c.un(Op::Sin, px), px));
  });
}

// fmax/fmin: the other operand where one is NaN (NaN only where both are).
at::Tensor FMaxMin(const at::Tensor& a, const at::Tensor& b, Op op) {
  TORCH_CHECK(!a.is_complex() && !b.is_complex(), op == Op::Max ? "fmax" : "fmin", " not implemented for complex tensors.");
  return BinaryIn(a, b, at::result_type(a, b), [op](const Ctx& c, ir::Value x, ir::Value y) {
    ir::Value r = c.bin(op, x, y);
    if (!at::isFloatingType(c.t)) return r;
    return c.sel(c.nan(x), y, c.sel(c.nan(y), x, r));
  });
}
at::Tensor fmax(const at::Tensor& a, const at::Tensor& b) { return FMaxMin(a, b, Op::Max); }
at::Tensor fmin(const at::Tensor& a, const at::Tensor& b) { return FMaxMin(a, b, Op::Min); }

// hypot = m sqrt(1 + (n/m)^2), m = max(|a|, |b|), n = min: no overflow of
// the squares; 0 where both are 0, inf where either is (NaN or not).
at::Tensor hypot(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType t = at::result_type(a, b);
  CheckFloat(t, "hypot");
  return BinaryIn(a, b, t, [](const Ctx& c, ir::Value x, ir::Value y) {
    ir::Value ax = c.un(Op::Abs, x), ay = c.un(Op::Abs, y);
    ir::Value m = c.bin(Op::Max, ax, ay), n = c.bin(Op::Min, ax, ay);
    ir::Value q = c.bin(Op::Div, n, m);
    ir::Value r = c.bin(Op::Mul, m, c.un(Op::Sqrt, c.bin(Op::Add, c.c(1), c.bin(Op::Mul, q, q))));
    r = c.sel(c.cmp(CompareDir::EQ, m, c.c(0)), c.c(0), r);
    r = c.sel(c.b().Binary(Op::Or, c.nan(x), c.nan(y)), c.bin(Op::Add, x, y), r);
    ir::Value inf = c.b().Binary(Op::Or, c.cmp(CompareDir::EQ, ax, c.c(INFINITY)), c.cmp(CompareDir::EQ, ay, c.c(INFINITY)));
    return c.sel(inf, c.c(INFINITY), r);
  });
}

// heaviside: values where x is 0, else x > 0 (NaN gives 0, as the CPU).
at::Tensor heaviside(const at::Tensor& a, const at::Tensor& values) {
  TORCH_CHECK(a.scalar_type() == values.scalar_type(), "heaviside is not yet implemented for tensors with different dtypes");
  TORCH_CHECK(!at::isComplexType(a.scalar_type()), "heaviside is not yet implemented for complex tensors.");
  return BinaryIn(a, values, a.scalar_type(), [](const Ctx& c, ir::Value x, ir::Value v) {
    ir::Value pos = c.b().Convert(c.cmp(CompareDir::GT, x, c.c(0)), ToIr(c.t));
    return c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), v, pos);
  });
}

// logit = log(z / (1 - z)), z = x clamped to [eps, 1 - eps] when eps is given.
// (a negative eps is no eps, as on the CPU)
at::Tensor logit(const at::Tensor& a, std::optional<double> eps) {
  if (eps && *eps < 0) eps = std::nullopt;
  CheckNotComplex(a.scalar_type(), "logit_cpu");
  return FloatUnary("aten::logit", a, [eps](const Ctx& c, ir::Value x) {
    ir::Value z = x;
    if (eps) z = c.b().Clamp(c.c(*eps), x, c.c(1 - *eps));
    return c.un(Op::Log, c.bin(Op::Div, z, c.bin(Op::Sub, c.c(1), z)));
  });
}

// grad / (x (1 - x)); with eps, 0 outside [eps, 1 - eps] (NaN included);
// without, NaN outside [0, 1] (the CPU's vectorized kernel, which runs all
// but a tail).
at::Tensor logit_backward(const at::Tensor& grad, const at::Tensor& self, std::optional<double> eps) {
  if (eps && *eps < 0) eps = std::nullopt;
  const at::ScalarType t = at::result_type(grad, self);
  return BinaryIn(grad, self, t, [eps](const Ctx& c, ir::Value g, ir::Value x) {
    ir::Value r = c.bin(Op::Div, g, c.bin(Op::Mul, x, c.bin(Op::Sub, c.c(1), x)));
    if (eps) {
      ir::Value inside = c.b().Binary(Op::And, c.cmp(CompareDir::GE, x, c.c(*eps)), c.cmp(CompareDir::LE, x, c.c(1 - *eps)));
      return c.sel(inside, r, c.c(0));
    }
    ir::Value out = c.b().Binary(Op::Or, c.cmp(CompareDir::LT, x, c.c(0)), c.cmp(CompareDir::GT, x, c.c(1)));
    return c.sel(out, c.c(NAN), r);
  });
}

// erfc, lgamma, digamma, polygamma and the Hurwitz zeta: XLA's expansions
// of CHLO's ops where they agree with the CPU (within 5e-7 relative in
// float32, 1e-13 in float64, measured), the CPU's own answers written in
// where they do not: at the poles, for trigamma everywhere (its short
// closed form is the CPU's), and for zeta's q <= 0, where XLA's series is
// not valid.
at::Tensor erfc(const at::Tensor& a) {
  return FloatUnary("aten::erfc", a, [](const Ctx& c, ir::Value x) { return c.un(Op::Erfc, x); }, /*wide=*/true);
}

at::Tensor lgamma(const at::Tensor& a) {
  return FloatUnary("aten::lgamma", a, [](const Ctx& c, ir::Value x) { return c.un(Op::Lgamma, x); }, /*wide=*/true);
}

// digamma(+-0) is -+inf on the CPU (XLA: NaN).
at::Tensor digamma(const at::Tensor& a) {
  return FloatUnary(
      "aten::digamma", a,
      [](const Ctx& c, ir::Value x) {
        ir::Value zero = c.cmp(CompareDir::EQ, x, c.c(0));
        return c.sel(zero, c.bin(Op::Div, c.c(-1), x), c.un(Op::Digamma, x));  // -1/x: the sign of the zero
      },
      /*wide=*/true);
}

// trigamma as the CPU computes it: below 0.5 the reflection
// -pi^2 / sin^2(pi x) with x -> 1 - x and the sign flipped, then six steps
// of the recurrence and the asymptotic series.
ir::Value Trigamma(const Ctx& c, ir::Value x) {
  ir::Value reflect = c.cmp(CompareDir::LT, x, c.c(0.5));
  ir::Value sin_pi_x = c.un(Op::Sin, c.bin(Op::Mul, c.c(kPi), x));
  ir::Value result = c.sel(reflect, c.bin(Op::Div, c.c(-kPi * kPi), c.bin(Op::Mul, sin_pi_x, sin_pi_x)), c.c(0));
  x = c.sel(reflect, c.bin(Op::Sub, c.c(1), x), x);
  for (int i = 0; i < 6; ++i) {
    result = c.bin(Op::Add, result, c.bin(Op::Div, c.c(1), c.bin(Op::Mul, x, x)));
    x = c.bin(Op::Add, x, c.c(1));
  }
  ir::Value ixx = c.bin(Op::Div, c.c(1), c.bin(Op::Mul, x, x));
  // 1 + 1/(2x) + ixx * (1/6 - ixx * (1/30 - ixx / 42))
  ir::Value series = c.bin(Op::Sub, c.c(1.0 / 30), c.bin(Op::Mul, ixx, c.c(1.0 / 42)));
  series = c.bin(Op::Sub, c.c(1.0 / 6), c.bin(Op::Mul, ixx, series));
  series = c.bin(Op::Add, c.bin(Op::Add, c.c(1), c.bin(Op::Div, c.c(1), c.bin(Op::Mul, c.c(2), x))), c.bin(Op::Mul, ixx, series));
  result = c.bin(Op::Add, result, c.bin(Op::Div, series, x));
  return c.sel(reflect, c.un(Op::Neg, result), result);
}

// Hurwitz zeta(s, q) by the CPU's (Cephes') rules: s == 1 is +inf, s < 1
// NaN; q <= 0 is +inf at an integer q, NaN at a non-integer s, and
// otherwise the series' first terms summed directly (as the CPU does) until
// q + k > 0, then XLA's zeta from there. pjrt sums up to kZetaShift terms
// so; a compiled check raises for a q further below 0.
// Where XLA's series over- or underflows (a finite s in the thousands) its
// NaN is the leading term q^-s, which is then the CPU's 0 or inf (for s
// past about 1e29 the CPU's own series gives NaN; pjrt gives the limit).
constexpr int kZetaShift = 16;

ir::Value Zeta(const Ctx& c, ir::Value s, ir::Value q, const char* op) {
  auto both = [&](ir::Value x, ir::Value y) { return c.b().Binary(Op::And, x, y); };
  ir::Value q_low = c.cmp(CompareDir::LE, q, c.c(0));  // NaN is neither
  ir::Value q_int = c.cmp(CompareDir::EQ, q, c.un(Op::Floor, q));
  ir::Value s_int = c.cmp(CompareDir::EQ, s, c.un(Op::Floor, s));
  ir::Value s_odd = c.cmp(CompareDir::EQ, c.bin(Op::Sub, s, c.bin(Op::Mul, c.c(2), c.un(Op::Floor, c.bin(Op::Mul, s, c.c(0.5))))), c.c(1));
  // terms (q + k)^-s while q + k <= 0, with the sign of an odd power
  // (where the CPU sums: an integer s > 1; otherwise its answer is NaN or inf)
  ir::Value sums = both(both(q_low, c.b().Unary(Op::Not, q_int)), both(s_int, c.cmp(CompareDir::GT, s, c.c(1))));
  ir::Value steps = c.sel(sums, c.un(Op::Ceil, c.un(Op::Neg, q)), c.c(0));
  CheckNone(c.d, c.cmp(CompareDir::GT, steps, c.c(kZetaShift)), runtime::ErrorKind::kValue,
            std::string(op) + " on pjrt: a non-integer q (or x) below -" + std::to_string(kZetaShift) +
                " is not supported; compute it on the CPU");
  ir::Value head = c.c(0);
  for (int k = 0; k < kZetaShift; ++k) {
    ir::Value qk = c.bin(Op::Add, q, c.c(k));
    ir::Value term = c.bin(Op::Pow, c.un(Op::Abs, qk), c.un(Op::Neg, s));
    term = c.sel(both(s_odd, c.cmp(CompareDir::LT, qk, c.c(0))), c.un(Op::Neg, term), term);
    head = c.bin(Op::Add, head, c.sel(c.cmp(CompareDir::LT, c.c(k), steps), term, c.c(0)));
  }
  ir::Value shifted = c.bin(Op::Add, q, c.bin(Op::Min, steps, c.c(kZetaShift)));
  ir::Value z = c.bin(Op::Add, head, c.bin(Op::Zeta, s, shifted));
  ir::Value lead = c.bin(Op::Pow, shifted, c.un(Op::Neg, s));
  ir::Value finite = both(c.b().IsFinite(s), c.b().IsFinite(q));
  z = c.sel(both(both(c.nan(z), finite), c.cmp(CompareDir::GT, s, c.c(1))), c.bin(Op::Add, head, lead), z);
  z = c.sel(c.b().Binary(Op::Or, c.nan(s), c.nan(q)), c.c(NAN), z);
  // s = +inf: the CPU's series stops at its first term, q^-inf: 1 at q = 1,
  // inf below 1, NaN (0 / 0) above
  ir::Value s_inf = c.cmp(CompareDir::EQ, s, c.c(INFINITY));
  z = c.sel(s_inf, c.sel(c.cmp(CompareDir::EQ, q, c.c(1)), c.c(1), c.sel(c.cmp(CompareDir::LT, q, c.c(1)), c.c(INFINITY), c.c(NAN))), z);
  // the CPU's checks, the last one applied first: s == 1, s < 1, then q <= 0
  z = c.sel(q_low, c.sel(q_int, c.c(INFINITY), c.sel(s_int, z, c.c(NAN))), z);
  z = c.sel(c.cmp(CompareDir::LT, s, c.c(1)), c.c(NAN), z);
  return c.sel(c.cmp(CompareDir::EQ, s, c.c(1)), c.c(INFINITY), z);
}

at::Tensor polygamma(int64_t n, const at::Tensor& a) {
  TORCH_CHECK(n >= 0, "polygamma(n, x) does not support negative n.");
  if (n == 0) return tpj::aten::digamma(a);
  if (n == 1) return FloatUnary("aten::polygamma", a, [](const Ctx& c, ir::Value x) { return Trigamma(c, x); });
  // (-1)^(n+1) n! zeta(n + 1, x), as the CPU
  return FloatUnary(
      "aten::polygamma", a,
      [n](const Ctx& c, ir::Value x) {
        const double factor = (n % 2 ? 1.0 : -1.0) * std::exp(std::lgamma(static_cast<double>(n) + 1.0));
        return c.bin(Op::Mul, c.c(factor), Zeta(c, c.c(static_cast<double>(n) + 1.0), x, "polygamma"));
      },
      /*wide=*/true);
}

at::Tensor zeta(const at::Tensor& x, const at::Tensor& q) {
  const at::ScalarType t = FloatType(at::result_type(x, q));
  TORCH_CHECK(!at::isComplexType(t), "special_zeta on pjrt expects real inputs, got ", t);
  return BinaryIn(
      x, q, t, [](const Ctx& c, ir::Value a, ir::Value b) { return Zeta(c, a, b, "special_zeta"); }, /*wide=*/true);
}
at::Tensor zeta_ss(const at::Tensor& x, const at::Scalar& q) { return zeta(x, WrappedScalar(q)); }
at::Tensor zeta_st(const at::Scalar& x, const at::Tensor& q) { return zeta(WrappedScalar(x), q); }

// i0, i0e, i1 and i1e as the CPU computes them: Cephes' two Chebyshev
// expansions (|x| <= 8 and above) with the coefficients PyTorch ships in
// ATen/native/Math.h (float ones for float inputs, as the CPU).

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

enum class BesselKind { I0, I0e, I1, I1e };

template <typename T>
ir::Value BesselOf(const Ctx& c, ir::Value x_in, BesselKind k) {
  ir::Value x = c.un(Op::Abs, x_in);
  const bool first = k == BesselKind::I1 || k == BesselKind::I1e;
  const bool scaled = k == BesselKind::I0e || k == BesselKind::I1e;
  ir::Value small_y = c.bin(Op::Sub, c.bin(Op::Div, x, c.c(2)), c.c(2));
  ir::Value large_y = c.bin(Op::Sub, c.bin(Op::Div, c.c(32), x), c.c(2));
  ir::Value small = first ? Chebyshev<T>(c, small_y, ::chebyshev_coefficients_i1e_A<T>())
                          : Chebyshev<T>(c, small_y, ::chebyshev_coefficients_i0e_A<T>());
  ir::Value large = first ? Chebyshev<T>(c, large_y, ::chebyshev_coefficients_i1e_B<T>())
                          : Chebyshev<T>(c, large_y, ::chebyshev_coefficients_i0e_B<T>());
  ir::Value e = c.un(Op::Exp, x);
  // the CPU's order of operations per branch
  if (first) small = scaled ? c.bin(Op::Mul, small, x) : c.bin(Op::Mul, c.bin(Op::Mul, e, x), small);
  else if (!scaled) small = c.bin(Op::Mul, e, small);
  if (!scaled) large = c.bin(Op::Mul, e, large);
  large = c.bin(Op::Div, large, c.un(Op::Sqrt, x));
  ir::Value r = c.sel(c.cmp(CompareDir::LE, x, c.c(8)), small, large);
  if (first) r = c.sel(c.cmp(CompareDir::LT, x_in, c.c(0)), c.un(Op::Neg, r), r);
  return r;
}

at::Tensor Bessel(const char* op, const at::Tensor& a, BesselKind k) {
  return FloatUnary(op, a, [k](const Ctx& c, ir::Value x) {
    return c.t == at::kDouble ? BesselOf<double>(c, x, k) : BesselOf<float>(c, x, k);
  });
}
at::Tensor i0(const at::Tensor& a) { return Bessel("aten::i0", a, BesselKind::I0); }
at::Tensor i0e(const at::Tensor& a) { return Bessel("aten::special_i0e", a, BesselKind::I0e); }
at::Tensor i1(const at::Tensor& a) { return Bessel("aten::special_i1", a, BesselKind::I1); }
at::Tensor i1e(const at::Tensor& a) { return Bessel("aten::special_i1e", a, BesselKind::I1e); }

// kaiser_window, whose CPU kernel is a dispatch stub no other device has:
// I0(beta * sqrt(|1 - ((n - alpha) / alpha)^2|)) / I0(beta), alpha =
// (N - 1) / 2, in the CPU kernel's arithmetic (the index counted in the
// window's dtype, the rest in its opmath type).
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
  const at::ScalarType ct = OpMath(t);
  const double alpha = ct == at::kFloat ? static_cast<double>(static_cast<float>((length - 1) / 2.0)) : (length - 1) / 2.0;
  const double i0_beta = ct == at::kFloat ? static_cast<double>(calc_i0(static_cast<float>(beta))) : calc_i0(beta);
  at::Tensor n = at::arange(length, options).to(ct);
  at::Tensor r = (n - alpha) / alpha;
  at::Tensor w = (at::i0(beta * at::sqrt(at::abs(1 - r * r))) / i0_beta).to(t);
  return periodic ? w.narrow(0, 0, length - 1) : w;
}

// The overloads without beta (12.0) or periodic (true): PyTorch's own call
// the CPU kernel's function directly, which reaches its dispatch stub.
at::Tensor kaiser_window_default(int64_t length, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                 std::optional<at::Device> device, std::optional<bool> pin) {
  return kaiser_window(length, true, 12.0, dtype, layout, device, pin);
}
at::Tensor kaiser_window_periodic(int64_t length, bool periodic, std::optional<at::ScalarType> dtype,
                                  std::optional<at::Layout> layout, std::optional<at::Device> device,
                                  std::optional<bool> pin) {
  return kaiser_window(length, periodic, 12.0, dtype, layout, device, pin);
}

// erfinv: Giles' single-precision approximation ("Approximating the erfinv
// function", GPU Computing Gems, 2011), then Newton steps on erf where it
// is steep, |y| < 2 (one for float; two, |y| < 5.5, for double); +-inf at +-1, NaN
// beyond.
at::Tensor erfinv(const at::Tensor& a) {
  return FloatUnary("aten::erfinv", a, [](const Ctx& c, ir::Value x) {
    auto poly = [&](ir::Value w, std::initializer_list<double> coef) {
      ir::Value p = c.c(*coef.begin());
      for (auto it = coef.begin() + 1; it != coef.end(); ++it) p = c.bin(Op::Add, c.c(*it), c.bin(Op::Mul, p, w));
      return p;
    };
    ir::Value w = c.un(Op::Neg, c.un(Op::Log, c.bin(Op::Mul, c.bin(Op::Sub, c.c(1), x), c.bin(Op::Add, c.c(1), x))));
    ir::Value central = poly(c.bin(Op::Sub, w, c.c(2.5)),
                             {2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                              -0.00125372503, -0.00417768164, 0.246640727, 1.50140941});
    ir::Value tail = poly(c.bin(Op::Sub, c.un(Op::Sqrt, w), c.c(3)),
                          {-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                           -0.0076224613, 0.00943887047, 1.00167406, 2.83297682});
    ir::Value y = c.bin(Op::Mul, c.sel(c.cmp(CompareDir::LT, w, c.c(5)), central, tail), x);
    const int steps = c.t == at::kDouble ? 2 : 1;
    for (int i = 0; i < steps; ++i) {
      // y -= (erf(y) - x) / (2 / sqrt(pi) exp(-y^2))
      ir::Value slope = c.bin(Op::Mul, c.c(1.12837916709551257390), c.un(Op::Exp, c.un(Op::Neg, c.bin(Op::Mul, y, y))));
      ir::Value refined = c.bin(Op::Sub, y, c.bin(Op::Div, c.bin(Op::Sub, c.un(Op::Erf, y), x), slope));
      // where erf is flat the step would amplify its rounding (float's erf
      // saturates sooner)
      y = c.sel(c.cmp(CompareDir::LT, c.un(Op::Abs, y), c.c(c.t == at::kDouble ? 5.5 : 2)), refined, y);
    }
    ir::Value one = c.cmp(CompareDir::EQ, c.un(Op::Abs, x), c.c(1));
    return c.sel(one, c.bin(Op::Mul, x, c.c(INFINITY)), y);
  });
}

// entr = -x log(x) for x > 0, 0 at 0, -inf below; NaN stays NaN.
at::Tensor entr(const at::Tensor& a) {
  return FloatUnary("aten::special_entr", a, [](const Ctx& c, ir::Value x) {
    ir::Value r = c.sel(c.cmp(CompareDir::GT, x, c.c(0)), c.un(Op::Neg, c.bin(Op::Mul, x, c.un(Op::Log, x))), c.c(-INFINITY));
    r = c.sel(c.cmp(CompareDir::EQ, x, c.c(0)), c.c(0), r);
    return c.sel(c.nan(x), x, r);
  });
}

// gcd as the CPU's loop: a, b = |a|, |b| (abs wraps at the type's minimum,
// as there), then (a, b) = (b % a, a) while a != 0, unrolled: two n-bit
// numbers need at most about 1.44 n steps (consecutive Fibonacci numbers are
// the worst case), and a finished pair stays as it is.
ir::Value GcdOf(const Ctx& c, ir::Value a, ir::Value b) {
  if (c10::isSignedType(c.t)) {
    a = c.un(Op::Abs, a);
    b = c.un(Op::Abs, b);
  }
  const int steps = static_cast<int>(c10::elementSize(c.t)) * 8 * 3 / 2 + 2;
  for (int i = 0; i < steps; ++i) {
    ir::Value more = c.cmp(CompareDir::NE, a, c.c(0));
    ir::Value rem = c.bin(Op::Rem, b, c.sel(more, a, c.c(1)));
    b = c.sel(more, a, b);
    a = c.sel(more, rem, a);
  }
  return b;
}

at::ScalarType IntegerResult(const at::Tensor& a, const at::Tensor& b, const char* op) {
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(t, false), "\"", op, "_cpu\" not implemented for '", c10::toString(t), "'");
  return t;
}

at::Tensor gcd(const at::Tensor& a, const at::Tensor& b) {
  return BinaryIn(a, b, IntegerResult(a, b, "gcd"), [](const Ctx& c, ir::Value x, ir::Value y) { return GcdOf(c, x, y); });
}

// lcm = |a / gcd * b|, 0 when the gcd is 0, as the CPU: 8- and 16-bit types
// multiply and take abs in int (C++'s promotion), then wrap to their width.
at::Tensor lcm(const at::Tensor& a, const at::Tensor& b) {
  return BinaryIn(a, b, IntegerResult(a, b, "lcm"), [](const Ctx& c, ir::Value x, ir::Value y) {
    ir::Value g = GcdOf(c, x, y);
    ir::Value zero = c.cmp(CompareDir::EQ, g, c.c(0));
    const Ctx w{c.d, c10::elementSize(c.t) < 4 ? at::kInt : c.t, c.shape};
    const ir::DType wt = ToIr(w.t);
    ir::Value l = w.bin(Op::Mul, w.b().Convert(c.bin(Op::Div, x, c.sel(zero, c.c(1), g)), wt), w.b().Convert(y, wt));
    if (c10::isSignedType(c.t)) l = w.un(Op::Abs, l);
    return c.sel(zero, c.c(0), c.b().Convert(l, ToIr(c.t)));
  });
}

// frexp: x = mantissa * 2^exponent with |mantissa| in [0.5, 1), from the
// bits alone (XLA's CPU arithmetic treats subnormal inputs as zero): the
// exponent field less the bias, the mantissa the same bits with the exponent
// of 0.5. A subnormal's significand, converted to a float (exact), gives
// the mantissa bits and its exponent less the subnormal scale. 0, +-inf and
// NaN give themselves and exponent 0, as the C library. Half and bfloat16
// work in float, where their values are exact and normal.
std::tuple<at::Tensor, at::Tensor> frexp(const at::Tensor& a) {
  TORCH_CHECK(at::isFloatingType(a.scalar_type()), "torch.frexp() only supports floating-point dtypes");
  TraceScope s;
  const at::ScalarType t = a.scalar_type();
  const bool dbl = t == at::kDouble;
  Ctx c{DeviceIndex(a), dbl ? at::kDouble : at::kFloat, a.sizes().vec()};
  ir::Builder& b = c.b();
  const int width = dbl ? 64 : 32, mant = dbl ? 52 : 23;
  const double bias = dbl ? 1022 : 126, field_max = dbl ? 0x7ff : 0xff;
  const at::ScalarType ut = dbl ? at::kUInt64 : at::kUInt32;
  auto u = [&](double v) { return Fill(c.d, v, ut, c.shape); };
  auto i32 = [&](double v) { return Fill(c.d, v, at::kInt, c.shape); };
  struct Parts {
    ir::Value field, low;
  };
  auto parts = [&](ir::Value bits) {
    return Parts{c.bin(Op::And, c.bin(Op::ShiftRightLogical, bits, u(mant)), u(field_max)),
                 c.bin(Op::ShiftRightLogical, c.bin(Op::ShiftLeft, bits, u(width - mant)), u(width - mant))};
  };
  ir::Value x = ValAs(a, c.t);
  ir::Value bits = b.Bitcast(x, ToIr(ut));
  const Parts p = parts(bits);
  ir::Value sign = c.bin(Op::ShiftLeft, c.bin(Op::ShiftRightLogical, bits, u(width - 1)), u(width - 1));
  const Parts q = parts(b.Bitcast(b.Convert(p.low, ToIr(c.t)), ToIr(ut)));  // the significand as a number
  ir::Value no_field = c.cmp(CompareDir::EQ, p.field, u(0));
  ir::Value sub = c.bin(Op::And, no_field, c.cmp(CompareDir::NE, p.low, u(0)));
  ir::Value field = c.sel(sub, q.field, p.field);
  ir::Value e = c.bin(Op::Sub, b.Convert(field, ir::DType::I32), c.sel(sub, i32(2 * bias + mant), i32(bias)));
  ir::Value m = b.Bitcast(c.bin(Op::Or, c.bin(Op::Or, sign, c.sel(sub, q.low, p.low)), u(std::ldexp(bias, mant))),
                          ToIr(c.t));
  ir::Value special = c.bin(Op::Or, c.bin(Op::And, no_field, c.un(Op::Not, sub)),
                            c.cmp(CompareDir::EQ, p.field, u(field_max)));
  return {Wrap(b.Convert(c.sel(special, x, m), ToIr(t)), c.d), Wrap(c.sel(special, i32(0), e), c.d)};
}

// ldexp with an integer exponent: x * 2^e rounded once, as the CPU's
// std::ldexp kernel. torch's composite for other devices multiplies by
// pow(2, e) in x's dtype, which overflows or flushes first: ldexp(0, 200)
// was NaN and ldexp(3e38, -140) 0 in float32 (the CPU: 0 and 2.1e-4). Here
// 2^e is three normal factors built from their bits, e clamped where every
// finite x over- or underflows anyway, and x is scaled by each in turn
// (half types in float: exact there, rounded once at the end).
// Integer x: the CPU's composite, x * pow(2.0, e) in the default float
// dtype, where 2^e is exact down to the smallest subnormal (0 below it,
// inf above the largest power): ldexp(3, -127) is 1.8e-38 there, where a
// subnormal factor, flushed by XLA, gave 0. Other dtype pairs take torch's
// composite.
at::Tensor ldexp(const at::Tensor& a, const at::Tensor& e) {
  const at::ScalarType t = a.scalar_type();
  const bool int_x = at::isIntegralType(t, /*includeBool=*/true);
  if (!(at::isFloatingType(t) || int_x) || !at::isIntegralType(e.scalar_type(), true)) {
    return at::mul(a, at::pow(2.0, e));
  }
  TraceScope s;
  const int d = CommonDevice({&a, &e});
  const at::ScalarType rt = int_x ? at::typeMetaToScalarType(at::get_default_dtype()) : t;
  const bool dbl = rt == at::kDouble;
  const at::ScalarType ct = dbl ? at::kDouble : at::kFloat, it = dbl ? at::kLong : at::kInt;
  const int64_t bias = dbl ? 1023 : 127, mant = dbl ? 52 : 23;
  const std::vector<int64_t> shape = at::infer_size(a.sizes(), e.sizes());
  Ctx c{d, it, shape};
  ir::Builder& b = c.b();
  ir::Value x = BroadcastTo(d, Operand(a, d, ct), shape);
  ir::Value k = BroadcastTo(d, Operand(e, d, e.scalar_type()), shape);
  auto clamp = [&](const Ctx& ck, ir::Value v, double lo, double hi) {
    return ck.sel(ck.cmp(CompareDir::LT, v, ck.c(lo)), ck.c(lo), ck.sel(ck.cmp(CompareDir::GT, v, ck.c(hi)), ck.c(hi), v));
  };
  ir::Value under, over;
  if (int_x) {
    const Ctx cl{d, at::kLong, shape};
    k = b.Convert(k, ir::DType::I64);
    const double lo = static_cast<double>(1 - bias - mant), hi = static_cast<double>(bias);
    under = cl.cmp(CompareDir::LT, k, cl.c(lo));
    over = cl.cmp(CompareDir::GT, k, cl.c(hi));
    k = b.Convert(clamp(cl, k, lo, hi), ToIr(it));
  } else {
    // std::ldexp takes a C int: a wider exponent wraps to int32 first (as on
    // the CPU: ldexp(3, 2^40) is 3), then is clamped
    const Ctx ci{d, at::kInt, shape};
    const double lim = static_cast<double>(3 * (bias - 1));
    k = b.Convert(clamp(ci, b.Convert(k, ir::DType::I32), -lim, lim), ToIr(it));
  }
  ir::Value k1 = c.bin(Op::Div, k, c.c(3));
  ir::Value k2 = c.bin(Op::Div, c.bin(Op::Sub, k, k1), c.c(2));
  ir::Value k3 = c.bin(Op::Sub, c.bin(Op::Sub, k, k1), k2);
  auto pow2 = [&](ir::Value n) {  // 2^n for n in [1 - bias, bias]: a normal number's bits
    return b.Bitcast(c.bin(Op::ShiftLeft, c.bin(Op::Add, n, c.c(static_cast<double>(bias))), c.c(static_cast<double>(mant))),
                     ToIr(ct));
  };
  ir::Value r = x;
  for (ir::Value part : {k1, k2, k3}) r = b.Binary(Op::Mul, r, pow2(part));
  if (int_x) {
    const Ctx cf{d, ct, shape};
    r = cf.sel(under, cf.bin(Op::Mul, x, cf.c(0)), cf.sel(over, cf.bin(Op::Mul, x, cf.c(INFINITY)), r));
  }
  return Wrap(b.Convert(r, ToIr(rt)), d);
}

// nextafter: the next value after x toward y, from the bits alone (XLA's
// CPU arithmetic and comparisons treat subnormals as zero): NaN when either
// is NaN, y when x == y (+0 toward -0 gives -0), the smallest subnormal with
// y's sign from a zero x, else x's bits one step away from or toward zero.
// Order is compared on sign-magnitude keys, exact for subnormals too.
at::Tensor nextafter(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t), "\"nextafter_cpu\" not implemented for '", c10::toString(t), "'");
  TraceScope s;
  Operands o = Prepare(a, b, t);
  const int width = static_cast<int>(c10::elementSize(t)) * 8;
  const at::ScalarType it = width == 64 ? at::kLong : width == 32 ? at::kInt : at::kShort;
  const double inf_bits = t == at::kDouble ? std::ldexp(2047.0, 52)
                          : t == at::kFloat ? std::ldexp(255.0, 23)
                          : t == at::kHalf  ? std::ldexp(31.0, 10)
                                            : std::ldexp(255.0, 7);
  Ctx c{o.device, it, o.shape};
  ir::Builder& bld = c.b();
  struct Bits {
    ir::Value bits, mag, neg, key;
  };
  auto bits_of = [&](ir::Value v) {
    Bits r;
    r.bits = bld.Bitcast(v, ToIr(it));
    r.mag = c.bin(Op::ShiftRightLogical, c.bin(Op::ShiftLeft, r.bits, c.c(1)), c.c(1));
    r.neg = c.cmp(CompareDir::LT, r.bits, c.c(0));
    r.key = c.sel(r.neg, c.un(Op::Neg, r.mag), r.mag);
    return r;
  };
  const Bits x = bits_of(o.x), y = bits_of(o.y);
  ir::Value up = c.cmp(CompareDir::GT, y.key, x.key);
  ir::Value away = c.cmp(CompareDir::NE, up, x.neg);
  ir::Value r = c.sel(away, c.bin(Op::Add, x.bits, c.c(1)), c.bin(Op::Sub, x.bits, c.c(1)));
  ir::Value y_sign = c.bin(Op::ShiftLeft, c.bin(Op::ShiftRightLogical, y.bits, c.c(width - 1)), c.c(width - 1));
  r = c.sel(c.cmp(CompareDir::EQ, x.mag, c.c(0)), c.bin(Op::Or, y_sign, c.c(1)), r);
  r = c.sel(c.cmp(CompareDir::EQ, x.key, y.key), y.bits, r);
  ir::Value nan = c.bin(Op::Or, c.cmp(CompareDir::GT, x.mag, c.c(inf_bits)), c.cmp(CompareDir::GT, y.mag, c.c(inf_bits)));
  return Wrap(bld.Select(nan, bld.Binary(Op::Add, o.x, o.y), bld.Bitcast(r, ToIr(t))), o.device);
}

at::Tensor clamp_min_t(const at::Tensor& a, const at::Tensor& lo) {
  return at::clamp(a, std::optional<at::Tensor>(lo), std::nullopt);
}
at::Tensor clamp_max_t(const at::Tensor& a, const at::Tensor& hi) {
  return at::clamp(a, std::nullopt, std::optional<at::Tensor>(hi));
}

// mvlgamma's in-place and out= forms (the functional form is composite and
// traces through lgamma), as the CPU's: the result into self, or into out
// when its dtype can hold the result's.
at::Tensor& mvlgamma_out(const at::Tensor& self, int64_t p, at::Tensor& out) {
  at::Tensor r = at::mvlgamma(self, p);
  TORCH_CHECK(at::can_cast(r.scalar_type(), out.scalar_type()), "mvlgamma: result type ", self.scalar_type(),
              " can't be cast to the desired output type ", r.scalar_type());
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

at::Tensor& mvlgamma_(at::Tensor& self, int64_t p) { return mvlgamma_out(self, p, self); }

}  // namespace
}  // namespace tpj::aten

// Results are laid out as TensorIterator lays them out (aten/layout.h).
#define K(name, fn) TPJ_LAID(m, name, kOperands, fn)
#define KN(name, fn) TPJ_LAID(m, name, kOperandsAndNumber, fn)  // a number operand TensorIterator counts (ops_elementwise.cc)

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mvlgamma_", TORCH_FN(tpj::aten::mvlgamma_));  // not elementwise: no layout rule
  m.impl("mvlgamma.out", TORCH_FN(tpj::aten::mvlgamma_out));
  K("asin", asin);
  K("acos", acos);
  K("atan", atan);
  K("sinh", sinh);
  K("cosh", cosh);
  K("asinh", asinh);
  K("acosh", acosh);
  K("atanh", atanh);
  K("log2", log2);
  K("log10", log10);
  K("exp2", exp2);
  K("logaddexp", logaddexp);
  K("logaddexp2", logaddexp2);
  K("xlogy.Tensor", xlogy);
  K("ldexp.Tensor", ldexp);
  K("xlogy.Scalar_Self", xlogy_ss);
  KN("xlogy.Scalar_Other", xlogy_so);
  K("special_xlog1py", xlog1py);
  K("special_xlog1py.self_scalar", xlog1py_ss);
  K("special_xlog1py.other_scalar", xlog1py_so);
  K("nan_to_num", nan_to_num);
  K("frac", frac);
  K("sinc", sinc);
  K("fmax", fmax);
  K("fmin", fmin);
  K("hypot", hypot);
  K("heaviside", heaviside);
  K("logit", logit);
  K("logit_backward", logit_backward);
  K("special_entr", entr);
  K("erfinv", erfinv);
  K("erfc", erfc);
  K("i0", i0);
  K("special_i0e", i0e);
  K("special_i1", i1);
  K("special_i1e", i1e);
  K("kaiser_window", kaiser_window_default);
  K("kaiser_window.periodic", kaiser_window_periodic);
  K("kaiser_window.beta", kaiser_window);
  K("lgamma", lgamma);
  K("digamma", digamma);
  K("polygamma", polygamma);
  K("special_zeta", zeta);
  K("special_zeta.other_scalar", zeta_ss);
  K("special_zeta.self_scalar", zeta_st);
  K("gcd", gcd);
  K("lcm", lcm);
  K("frexp.Tensor", frexp);
  K("nextafter", nextafter);
  K("clamp_min.Tensor", clamp_min_t);
  K("clamp_max.Tensor", clamp_max_t);
}
