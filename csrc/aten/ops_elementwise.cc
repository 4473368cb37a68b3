// Elementwise lowerings: arithmetic, comparisons, logic, math functions,
// activations and their backward formulas, with PyTorch's type promotion and
// broadcasting. The hot in-place forms (optimizers, activations) are spelled
// out below; every other in-place and out= form is derived (aten/derived.h).
#include <ATen/MemoryOverlap.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/TypeProperties.h>

#include <cmath>
#include <limits>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

// ------------------------------------------------------------------ binary

at::Tensor AddSub(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha, bool sub) {
  if (sub) at::native::sub_check(a, b);  // PyTorch's checks and messages
  const at::ScalarType t = at::result_type(a, b);
  at::native::alpha_check(t, alpha);
  TraceScope s;
  Operands o = Prepare(a, b, t);
  ir::Builder& bb = B(o.device);
  if (!IsOne(alpha)) {
    // x + alpha y in float for half types, rounded once, as the CPU's
    // vectorized loop (its scalar tail rounds alpha y first: docs/semantics.md)
    // (alpha itself refused out of the half type's range, as there)
    const at::ScalarType ct = OpMath(t);
    RefuseOutOfRange(alpha, t);
    ir::Value y = bb.Binary(Op::Mul, bb.Convert(o.y, ToIr(ct)), Number(o.device, alpha, ct, o.shape));
    return WrapIn(bb.Binary(sub ? Op::Sub : Op::Add, bb.Convert(o.x, ToIr(ct)), y), t, o.device);
  }
  return Wrap(bb.Binary(sub ? Op::Sub : Op::Add, o.x, o.y), o.device);
}

at::Tensor add_tensor(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) { return AddSub(a, b, alpha, false); }
at::Tensor sub_tensor(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) { return AddSub(a, b, alpha, true); }
at::Tensor add_scalar(const at::Tensor& a, const at::Scalar& b, const at::Scalar& alpha) {
  return AddSub(a, WrappedScalar(b), alpha, false);
}
at::Tensor sub_scalar(const at::Tensor& a, const at::Scalar& b, const at::Scalar& alpha) {
  return AddSub(a, WrappedScalar(b), alpha, true);
}
at::Tensor rsub_tensor(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) { return AddSub(b, a, alpha, true); }
at::Tensor rsub_scalar(const at::Tensor& a, const at::Scalar& b, const at::Scalar& alpha) {
  at::native::sub_check(a, b);
  TraceScope s;
  const at::ScalarType t = at::result_type(a, b);
  const int d = DeviceIndex(a);
  ir::Builder& bb = B(d);
  ir::Value x = ValAs(a, t);
  if (!IsOne(alpha)) x = bb.Binary(Op::Mul, x, Number(d, alpha, t, a.sizes().vec()));
  return Wrap(bb.Binary(Op::Sub, Number(d, b, t, a.sizes().vec(), /*wrapped=*/true), x), d);
}

at::Tensor Simple(const at::Tensor& a, const at::Tensor& b, Op op, at::ScalarType t) {
  TraceScope s;
  Operands o = Prepare(a, b, t);
  return Wrap(B(o.device).Binary(op, o.x, o.y), o.device);
}

at::Tensor MaxMin(const at::Tensor& a, const at::Tensor& b, Op op) {
  TraceScope s;
  Operands o = Prepare(a, b, at::result_type(a, b));
  return Wrap(MaxMinNan(o.device, op, o.x, o.y), o.device);
}

// Half and bfloat16 multiplied or divided by a one-element second operand:
// the CPU reads that operand's own value in float and rounds the result
// once (the reduced-float branch of its mul and true-division kernels), so a
// float16 x * 70000.0 stays finite and a bfloat16 x * 1.003 is not x. Every
// other case (add and sub, a one-element first operand) rounds the scalar
// to the result's dtype first, as Prepare does.
bool ScalarInFloat(const at::Tensor& b, at::ScalarType t) { return at::isReducedFloatingType(t) && b.numel() == 1; }

// a in t, then in float; b read in float from its own value.
Operands ScalarInFloatOperands(const at::Tensor& a, const at::Tensor& b, at::ScalarType t) {
  Operands o;
  o.device = CommonDevice({&a, &b});
  o.shape = at::infer_size(a.sizes(), b.sizes());
  o.x = B(o.device).Convert(BroadcastTo(o.device, Operand(a, o.device, t), o.shape), ir::DType::F32);
  o.y = BroadcastTo(o.device, Operand(b, o.device, at::kFloat), o.shape);
  return o;
}

at::Tensor ByScalarInFloat(const at::Tensor& a, const at::Tensor& b, Op op, at::ScalarType t) {
  TraceScope s;
  Operands o = ScalarInFloatOperands(a, b, t);
  return WrapIn(B(o.device).Binary(op, o.x, o.y), t, o.device);
}

at::Tensor mul_tensor(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType t = at::result_type(a, b);
  return ScalarInFloat(b, t) ? ByScalarInFloat(a, b, Op::Mul, t) : Simple(a, b, Op::Mul, t);
}
at::Tensor mul_scalar(const at::Tensor& a, const at::Scalar& b) { return mul_tensor(a, WrappedScalar(b)); }
at::Tensor maximum(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(!a.is_complex() && !b.is_complex(), "maximum not implemented for complex tensors.");
  return MaxMin(a, b, Op::Max);
}
at::Tensor minimum(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(!a.is_complex() && !b.is_complex(), "minimum not implemented for complex tensors.");
  return MaxMin(a, b, Op::Min);
}
at::Tensor atan2(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType t = FloatType(at::result_type(a, b));
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t), "\"atan2_cpu\" not implemented for '", t, "'");
  return Simple(a, b, Op::Atan2, t);
}

// Integer division by zero raises on the CPU (RuntimeError: ZeroDivisionError);
// here it is a check compiled into the program. The divisor becomes 1 where
// it is 0 (the check reports those elements): XLA folds a division of
// constants on the host, where 0 / 0 is SIGFPE (torch.zeros(2) % torch.zeros(2)
// in int64 killed the process).
void CheckIntegerDivisor(Operands& o, at::ScalarType t) {
  if (!at::isIntegralType(t, /*includeBool=*/true)) return;
  ir::Builder& b = B(o.device);
  ir::Value zero = b.Compare(ir::CompareDir::EQ, o.y, Fill(o.device, 0, t, o.shape));
  CheckNone(o.device, zero, runtime::ErrorKind::kValue, "ZeroDivisionError: integer division or remainder by zero");
  o.y = b.Select(zero, Fill(o.device, 1, t, o.shape), o.y);
}

// Float floor division as PyTorch computes it (div_floor_floating): from
// fmod, so -7.9 // inf is -1 (not floor(-0.0)) and a zero quotient keeps the
// sign of a / b; a / b itself where b is 0.
ir::Value FloorDivFloat(int d, ir::Value a, ir::Value b) {
  ir::Builder& bb = B(d);
  const ir::Shape s = bb.shape(a);
  auto fill = [&](double v) { return bb.Full(s.dtype, s.dims, v); };
  auto lt0 = [&](ir::Value v) { return bb.Compare(ir::CompareDir::LT, v, fill(0)); };
  ir::Value quotient = bb.Binary(Op::Div, a, b);
  ir::Value mod = bb.Binary(Op::Rem, a, b);
  ir::Value div = bb.Binary(Op::Div, bb.Binary(Op::Sub, a, mod), b);
  ir::Value step = bb.Binary(Op::And, bb.Compare(ir::CompareDir::NE, mod, fill(0)),
                             bb.Compare(ir::CompareDir::NE, lt0(b), lt0(mod)));
  div = bb.Select(step, bb.Binary(Op::Sub, div, fill(1)), div);
  ir::Value floored = bb.Unary(Op::Floor, div);
  ir::Value up = bb.Compare(ir::CompareDir::GT, bb.Binary(Op::Sub, div, floored), fill(0.5));
  floored = bb.Select(up, bb.Binary(Op::Add, floored, fill(1)), floored);
  // div == 0: a zero with the sign of a / b (finite there, so 0 * q is it)
  ir::Value r = bb.Select(bb.Compare(ir::CompareDir::NE, div, fill(0)), floored, bb.Binary(Op::Mul, fill(0), quotient));
  return bb.Select(bb.Compare(ir::CompareDir::EQ, b, fill(0)), quotient, r);
}

at::Tensor Div(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> mode) {
  TraceScope s;
  const at::ScalarType rt = at::result_type(a, b);
  const bool integral = at::isIntegralType(rt, /*includeBool=*/true);
  if (!mode) {
    if (ScalarInFloat(b, FloatType(rt))) return ByScalarInFloat(a, b, Op::Div, FloatType(rt));
    Operands o = Prepare(a, b, FloatType(rt));
    return Wrap(B(o.device).Binary(Op::Div, o.x, o.y), o.device);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(rt != at::kBool && !at::isComplexType(rt), "\"div_", *mode, "_cpu\" not implemented for '",
                              rt, "'");
  // rounded division by a one-element divisor: in float for half types, as true division
  const bool in_float = !integral && ScalarInFloat(b, rt);
  const at::ScalarType ct = in_float ? at::kFloat : rt;
  Operands o = in_float ? ScalarInFloatOperands(a, b, rt) : Prepare(a, b, rt);
  ir::Builder& bb = B(o.device);
  if (*mode == "trunc" || *mode == "floor") CheckIntegerDivisor(o, rt);
  if (*mode == "trunc") {
    if (integral) return Wrap(bb.Binary(Op::Div, o.x, o.y), o.device);  // integer division truncates
    ir::Value q = bb.Binary(Op::Div, o.x, o.y);
    ir::Value neg = bb.Compare(ir::CompareDir::LT, q, Fill(o.device, 0, ct, o.shape));
    return WrapIn(bb.Select(neg, bb.Unary(Op::Ceil, q), bb.Unary(Op::Floor, q)), rt, o.device);
  }
  TORCH_CHECK(*mode == "floor", "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  if (integral) {
    // floor division: truncate, then step down where signs differ and it was inexact.
    ir::Value q = bb.Binary(Op::Div, o.x, o.y);
    ir::Value r = bb.Binary(Op::Rem, o.x, o.y);
    ir::Value zero = Fill(o.device, 0, rt, o.shape);
    ir::Value inexact = bb.Compare(ir::CompareDir::NE, r, zero);
    ir::Value signs = bb.Compare(ir::CompareDir::NE, bb.Compare(ir::CompareDir::LT, r, zero),
                                 bb.Compare(ir::CompareDir::LT, o.y, zero));
    ir::Value adjust = bb.Binary(Op::And, inexact, signs);
    return Wrap(bb.Select(adjust, bb.Binary(Op::Sub, q, Fill(o.device, 1, rt, o.shape)), q), o.device);
  }
  return WrapIn(FloorDivFloat(o.device, o.x, o.y), rt, o.device);
}
at::Tensor div_tensor(const at::Tensor& a, const at::Tensor& b) { return Div(a, b, std::nullopt); }
at::Tensor div_tensor_mode(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> m) { return Div(a, b, m); }
at::Tensor div_scalar(const at::Tensor& a, const at::Scalar& b) { return Div(a, WrappedScalar(b), std::nullopt); }
at::Tensor floor_divide(const at::Tensor& a, const at::Tensor& b) { return Div(a, b, c10::string_view("floor")); }
at::Tensor floor_divide_scalar(const at::Tensor& a, const at::Scalar& b) {
  return Div(a, WrappedScalar(b), c10::string_view("floor"));
}

at::Tensor remainder_tensor(const at::Tensor& a, const at::Tensor& b) {
  TraceScope s;
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool && !at::isComplexType(t), "\"remainder_cpu\" not implemented for '", t, "'");
  Operands o = Prepare(a, b, t);
  ir::Builder& bb = B(o.device);
  CheckIntegerDivisor(o, t);
  ir::Value r = bb.Binary(Op::Rem, o.x, o.y);
  ir::Value zero = Fill(o.device, 0, t, o.shape);
  ir::Value fix = bb.Binary(Op::And, bb.Compare(ir::CompareDir::NE, r, zero),
                            bb.Compare(ir::CompareDir::NE, bb.Compare(ir::CompareDir::LT, r, zero),
                                       bb.Compare(ir::CompareDir::LT, o.y, zero)));
  return Wrap(bb.Select(fix, bb.Binary(Op::Add, r, o.y), r), o.device);
}
at::Tensor remainder_scalar(const at::Tensor& a, const at::Scalar& b) { return remainder_tensor(a, WrappedScalar(b)); }
at::Tensor remainder_scalar_tensor(const at::Scalar& a, const at::Tensor& b) { return remainder_tensor(WrappedScalar(a), b); }

// fmod: the remainder with the dividend's sign, which is stablehlo.remainder.
at::Tensor fmod_tensor(const at::Tensor& a, const at::Tensor& b) {
  TraceScope s;
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool && !at::isComplexType(t), "\"fmod_cpu\" not implemented for '", t, "'");
  Operands o = Prepare(a, b, t);
  CheckIntegerDivisor(o, t);
  return Wrap(B(o.device).Binary(Op::Rem, o.x, o.y), o.device);
}
at::Tensor fmod_scalar(const at::Tensor& a, const at::Scalar& b) { return fmod_tensor(a, WrappedScalar(b)); }

// x ** e in `t`. XLA's integer power is right only for exponents below 64
// (on the CPU plugin 3 ** 64 and 2 ** 300 come out wrong; 2 ** 300 as 2 **
// 44): the exponent is taken 6 bits at a time, x ** e being the product
// over chunks k of (x ** 64^k) ** chunk_k, each a power XLA gets right,
// wrapping as the CPU's repeated multiplication does. Negative exponents
// keep XLA's answer (0, or +-1 for a base of +-1, as the CPU). `x` is e's
// shape, or a number (rank 0) squared before it is broadcast.
ir::Value Power(int d, ir::Value x, ir::Value e, at::ScalarType t) {
  ir::Builder& bb = B(d);
  const auto dims = bb.shape(e).dims;
  // booleans to a number exponent (the CPU computes those; a tensor
  // exponent it refuses): x ** e is x or not e; StableHLO's power takes numbers only
  if (t == at::kBool) return bb.Binary(Op::Or, BroadcastTo(d, x, dims), bb.Unary(Op::Not, e));
  ir::Value direct = bb.Binary(Op::Pow, BroadcastTo(d, x, dims), e);
  if (at::isComplexType(t)) {
    // XLA's complex power is exp(e log x): NaN at x = 0, where the CPU (and
    // mathematics) give 0 for Re(e) > 0
    const at::ScalarType rt = c10::toRealValueType(t);
    ir::Value zero_base = bb.Compare(ir::CompareDir::EQ, BroadcastTo(d, x, dims), Fill(d, 0, t, dims));
    ir::Value positive = bb.Compare(ir::CompareDir::GT, bb.Real(e), Fill(d, 0, rt, dims));
    return bb.Select(bb.Binary(Op::And, zero_base, positive), Fill(d, 0, t, dims), direct);
  }
  if (!at::isIntegralType(t, /*includeBool=*/false)) return direct;
  constexpr int64_t kBits = 6;
  const int64_t value_bits = 8 * static_cast<int64_t>(c10::elementSize(t)) - (at::isSignedType(t) ? 1 : 0);
  const int64_t chunks = (value_bits + kBits - 1) / kBits;
  ir::Value r, base = x;
  for (int64_t k = 0; k < chunks; ++k) {
    ir::Value chunk = bb.Binary(Op::And, bb.Binary(Op::ShiftRightLogical, e, Fill(d, kBits * k, t, dims)),
                                Fill(d, (1 << kBits) - 1, t, dims));
    ir::Value p = bb.Binary(Op::Pow, BroadcastTo(d, base, dims), chunk);
    r = k == 0 ? p : bb.Binary(Op::Mul, r, p);
    for (int64_t i = 0; k + 1 < chunks && i < kBits; ++i) base = bb.Binary(Op::Mul, base, base);
  }
  if (!at::isSignedType(t)) return r;
  return bb.Select(bb.Compare(ir::CompareDir::LT, e, Fill(d, 0, t, dims)), direct, r);
}

at::Tensor pow_tensor_scalar(const at::Tensor& a, const at::Scalar& e) {
  TORCH_CHECK(!(at::isIntegralType(a.scalar_type(), true) && e.isIntegral(true) && e.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
  TraceScope s;
  const at::ScalarType t = at::result_type(a, e);
  const int d = DeviceIndex(a);
  ir::Builder& bb = B(d);
  ir::Value x = ValAs(a, t);
  if (!e.isComplex()) {
    const double v = e.toDouble();
    if (v == 1) return Wrap(x, d);
    if (v == 2) return Wrap(bb.Binary(Op::Mul, x, x), d);
    if (v == 3 && t == at::kHalf) {
      // the CPU's half pow is std::pow in float, rounded once (bfloat16's
      // repeats the rounding product by product, as below)
      ir::Value f = bb.Convert(x, ir::DType::F32);
      return Wrap(bb.Convert(bb.Binary(Op::Mul, bb.Binary(Op::Mul, f, f), f), ir::DType::F16), d);
    }
    if (v == 3) return Wrap(bb.Binary(Op::Mul, bb.Binary(Op::Mul, x, x), x), d);
    // the CPU's kernel takes 0.5 and -0.5 as sqrt and 1 / sqrt (-0 ** -0.5
    // is -inf there, -inf ** -0.5 NaN; a power gives inf and 0), except
    // for float16, a power in float (-0 ** 0.5 is +0, -inf ** 0.5 inf)
    if (v == 0.5 && at::isFloatingType(t) && t != at::kHalf) return Wrap(bb.Unary(Op::Sqrt, x), d);
    if (v == -0.5 && at::isFloatingType(t) && t != at::kHalf) {
      return Wrap(bb.Binary(Op::Div, Fill(d, 1, t, a.sizes().vec()), bb.Unary(Op::Sqrt, x)), d);
    }
    if (v == -1 && at::isFloatingType(t)) return Wrap(bb.Binary(Op::Div, Fill(d, 1, t, a.sizes().vec()), x), d);
  }
  return Wrap(Power(d, x, Number(d, e, t, a.sizes().vec()), t), d);
}
at::Tensor pow_tensor_tensor(const at::Tensor& a, const at::Tensor& b) {
  TraceScope s;
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool, "\"pow\" not implemented for 'Bool'");  // as the CPU (a number exponent works)
  // A base of one element is squared before it is broadcast (squares of a
  // broadcast value send XLA's algebraic simplifier round a loop, which it
  // reports).
  const int d = CommonDevice({&a, &b});
  const std::vector<int64_t> shape = at::infer_size(a.sizes(), b.sizes());
  ir::Value x = Operand(a, d, t);
  x = a.numel() == 1 ? B(d).Reshape(x, {}) : BroadcastTo(d, x, shape);
  return Wrap(Power(d, x, BroadcastTo(d, Operand(b, d, t), shape), t), d);
}
at::Tensor pow_scalar(const at::Scalar& base, const at::Tensor& e) {
  TraceScope s;
  const at::ScalarType t = at::result_type(base, e);
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool, "\"pow\" not implemented for 'Bool'");  // as the CPU
  const int d = DeviceIndex(e);
  return Wrap(Power(d, Number(d, base, t, {}, /*wrapped=*/true), ValAs(e, t), t), d);
}

at::Tensor Logical(const at::Tensor& a, const at::Tensor& b, Op op) {
  TraceScope s;
  Operands o = Prepare(a, b, at::kBool);
  return Wrap(B(o.device).Binary(op, o.x, o.y), o.device);
}
at::Tensor logical_and(const at::Tensor& a, const at::Tensor& b) { return Logical(a, b, Op::And); }
at::Tensor logical_or(const at::Tensor& a, const at::Tensor& b) { return Logical(a, b, Op::Or); }
at::Tensor logical_xor(const at::Tensor& a, const at::Tensor& b) { return Logical(a, b, Op::Xor); }

at::Tensor Bitwise(const at::Tensor& a, const at::Tensor& b, Op op) {
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(t, true), "bitwise ops are only defined for integer and bool tensors, got ",
                              t);
  return Simple(a, b, op, t);
}
at::Tensor bitwise_and(const at::Tensor& a, const at::Tensor& b) { return Bitwise(a, b, Op::And); }
at::Tensor bitwise_or(const at::Tensor& a, const at::Tensor& b) { return Bitwise(a, b, Op::Or); }
at::Tensor bitwise_xor(const at::Tensor& a, const at::Tensor& b) { return Bitwise(a, b, Op::Xor); }
at::Tensor bitwise_and_s(const at::Tensor& a, const at::Scalar& b) { return Bitwise(a, WrappedScalar(b), Op::And); }
at::Tensor bitwise_or_s(const at::Tensor& a, const at::Scalar& b) { return Bitwise(a, WrappedScalar(b), Op::Or); }

// Shifts of integers, as the CPU: a shift by a negative amount or by the
// width or more gives 0 (left) or the sign fill (right); StableHLO's shifts
// read the amount as unsigned, which gives just that.
at::Tensor Shift(const at::Tensor& a, const at::Tensor& b, bool left) {
  const at::ScalarType t = at::result_type(a, b);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(t, false), "\"", left ? "lshift" : "rshift", "\" not implemented for '",
                              t, "'");
  const bool is_unsigned = t == at::kByte || t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
  return Simple(a, b, left ? Op::ShiftLeft : is_unsigned ? Op::ShiftRightLogical : Op::ShiftRightArithmetic, t);
}
at::Tensor lshift(const at::Tensor& a, const at::Tensor& b) { return Shift(a, b, true); }
at::Tensor rshift(const at::Tensor& a, const at::Tensor& b) { return Shift(a, b, false); }
at::Tensor lshift_s(const at::Tensor& a, const at::Scalar& b) { return Shift(a, WrappedScalar(b), true); }
at::Tensor rshift_s(const at::Tensor& a, const at::Scalar& b) { return Shift(a, WrappedScalar(b), false); }

// ------------------------------------------------------------- comparisons

at::Tensor Cmp(const at::Tensor& a, const at::Tensor& b, ir::CompareDir dir) {
  const at::ScalarType t = at::result_type(a, b);
  // complex numbers have no order: NotImplementedError, as the CPU's kernels
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t) || dir == ir::CompareDir::EQ || dir == ir::CompareDir::NE,
                              "ordering comparisons (<, <=, >, >=) are not implemented for '", t, "'");
  TraceScope s;
  Operands o = Prepare(a, b, t);
  return Wrap(B(o.device).Compare(dir, o.x, o.y), o.device);
}
#define TPJ_CMP(name, dir)                                                                            \
  at::Tensor name##_tensor(const at::Tensor& a, const at::Tensor& b) { return Cmp(a, b, ir::CompareDir::dir); } \
  at::Tensor name##_scalar(const at::Tensor& a, const at::Scalar& b) {                                 \
    return Cmp(a, WrappedScalar(b), ir::CompareDir::dir);                                        \
  }
TPJ_CMP(eq, EQ)
TPJ_CMP(ne, NE)
TPJ_CMP(lt, LT)
TPJ_CMP(le, LE)
TPJ_CMP(gt, GT)
TPJ_CMP(ge, GE)
#undef TPJ_CMP

// ----------------------------------------------------------------- unary

at::Tensor Unary(const at::Tensor& a, Op op, bool to_float) {
  TraceScope s;
  if (!to_float) return Wrap(B(DeviceIndex(a)).Unary(op, Val(a)), DeviceIndex(a));
  const at::ScalarType t = FloatType(a.scalar_type()), ct = OpMath(t);
  return WrapIn(B(DeviceIndex(a)).Unary(op, ValAs(a, ct)), t, DeviceIndex(a));
}

#define TPJ_UNARY(name, op, to_float) \
  at::Tensor name(const at::Tensor& a) { return Unary(a, Op::op, to_float); }
TPJ_UNARY(exp, Exp, true)
TPJ_UNARY(expm1, Expm1, true)
TPJ_UNARY(log, Log, true)
TPJ_UNARY(log1p, Log1p, true)
TPJ_UNARY(tanh, Tanh, true)
TPJ_UNARY(sigmoid, Logistic, true)
TPJ_UNARY(rsqrt, Rsqrt, true)
TPJ_UNARY(sin, Sin, true)
TPJ_UNARY(cos, Cos, true)
TPJ_UNARY(tan, Tan, true)
#undef TPJ_UNARY

// sqrt; a complex one keeps the sign of the input's imaginary part, -0.0
// included (C99's csqrt, the CPU's: sqrt(-4-0j) is -2j, XLA's +2j).
ir::Value SignBit(int d, ir::Value x, at::ScalarType t);
at::Tensor sqrt(const at::Tensor& a) {
  if (!at::isComplexType(a.scalar_type())) return Unary(a, Op::Sqrt, true);
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = a.scalar_type(), ct = OpMath(t);
  ir::Value z = ValAs(a, ct);
  ir::Value r = b.Unary(Op::Sqrt, z);
  ir::Value im = b.Unary(Op::Abs, b.Imag(r));
  im = b.Select(SignBit(d, b.Imag(z), c10::toRealValueType(ct)), b.Unary(Op::Neg, im), im);
  return WrapIn(b.Complex(b.Real(r), im), t, d);
}

// erf, exactly +-1 where float32 rounds it there (|x| > 3.9; the CPU's
// answer, erf(inf) included): XLA's f32 approximation stops at 1 - 2e-7,
// so gelu's 1 + erf(x) of a large negative x was 2e-7 instead of 0.
ir::Value ErfSaturated(int d, ir::Value x) {
  ir::Builder& b = B(d);
  ir::Value e = b.Unary(Op::Erf, x);
  const ir::Shape s = b.shape(x);
  if (s.dtype == ir::DType::F64) return e;
  ir::Value far = b.Compare(ir::CompareDir::GT, b.Unary(Op::Abs, x), b.Full(s.dtype, s.dims, 3.9));
  ir::Value one = b.Select(b.Compare(ir::CompareDir::GT, x, b.Full(s.dtype, s.dims, 0)), b.Full(s.dtype, s.dims, 1),
                           b.Full(s.dtype, s.dims, -1));
  return b.Select(far, one, e);
}

at::Tensor erf(const at::Tensor& a) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "\"erf_vml_cpu\" not implemented for '", a.scalar_type(), "'");
  TraceScope s;
  const int d = DeviceIndex(a);
  return Wrap(ErfSaturated(d, ValAs(a, FloatType(a.scalar_type()))), d);
}

at::Tensor IntegerSafe(const at::Tensor& a, Op op) {
  if (at::isIntegralType(a.scalar_type(), true)) {
    TraceScope s;
    return Wrap(Val(a), DeviceIndex(a));  // floor/ceil/round/trunc of integers: identity
  }
  return Unary(a, op, false);
}
// floor, ceil, round and trunc: no complex, no bool (the CPU's messages)
void RoundingDtype(const at::Tensor& a, const char* name, const char* kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex() || name, "\"", kernel, "\" not implemented for '", a.scalar_type(), "'");
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), name ? name : "", " is not supported for complex inputs");
  TORCH_CHECK_NOT_IMPLEMENTED(a.scalar_type() != at::kBool, "\"", kernel, "\" not implemented for 'Bool'");
}

at::Tensor floor(const at::Tensor& a) {
  RoundingDtype(a, "floor", "floor_vml_cpu");
  return IntegerSafe(a, Op::Floor);
}
at::Tensor ceil(const at::Tensor& a) {
  RoundingDtype(a, "ceil", "ceil_vml_cpu");
  return IntegerSafe(a, Op::Ceil);
}
at::Tensor round(const at::Tensor& a) {
  RoundingDtype(a, nullptr, "round_vml_cpu");
  return IntegerSafe(a, Op::Round);
}
// A constant divisor fed from the host: XLA rewrites a division by a
// constant into a multiplication by its reciprocal, a rounding off the
// CPU's (hardswish's gradient at -1.5 would be -1.5e-8, not 0).
ir::Value Divisor(int d, double v, at::ScalarType t, const std::vector<int64_t>& shape) {
  return BroadcastTo(d, ScalarParam(d, v, t), shape);
}

// round to `decimals` places as the CPU: nearbyint(x * 10^d) / 10^d, or
// nearbyint(x / 10^-d) * 10^-d for negative d
at::Tensor round_decimals(const at::Tensor& a, int64_t decimals) {
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isIntegralType(a.scalar_type(), true) || decimals == 0,
                              "\"round_cpu\" not implemented for '", a.scalar_type(), "'");
  if (decimals == 0) return IntegerSafe(a, Op::Round);
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  // half types in float, rounded once (the CPU's opmath)
  const at::ScalarType t = a.scalar_type(), ct = OpMath(t);
  // 10^|d| past the type's range is inf there, as the CPU's cast makes it
  // (x * inf / inf: NaN)
  double p = std::pow(10.0, static_cast<double>(decimals < 0 ? -decimals : decimals));
  if (ct == at::kFloat && p > std::numeric_limits<float>::max()) p = std::numeric_limits<double>::infinity();
  // a Divisor: -0.43 would print as -0.42999998
  ir::Value ten = Divisor(d, p, ct, a.sizes().vec());
  ir::Value x = ValAs(a, ct);
  ir::Value r = decimals > 0 ? b.Binary(Op::Div, b.Unary(Op::Round, b.Binary(Op::Mul, x, ten)), ten)
                             : b.Binary(Op::Mul, b.Unary(Op::Round, b.Binary(Op::Div, x, ten)), ten);
  return Wrap(b.Convert(r, ToIr(t)), d);
}

// signbit: the sign bit itself (-0.0 and -NaN included), read by bitcast
ir::Value SignBit(int d, ir::Value x, at::ScalarType t) {
  ir::Builder& b = B(d);
  if (t == at::kBool) return b.Full(ir::DType::Bool, b.shape(x).dims, 0);
  const auto dims = b.shape(x).dims;
  if (!at::isFloatingType(t)) return b.Compare(ir::CompareDir::LT, x, Fill(d, 0, t, dims));
  const at::ScalarType bits = t == at::kDouble ? at::kLong : t == at::kFloat ? at::kInt : at::kShort;
  return b.Compare(ir::CompareDir::LT, b.Bitcast(x, ToIr(bits)), Fill(d, 0, bits, dims));
}
at::Tensor signbit(const at::Tensor& a) {
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(a.scalar_type()), "signbit is not implemented for complex tensors.");
  TraceScope s;
  const int d = DeviceIndex(a);
  return Wrap(SignBit(d, Val(a), a.scalar_type()), d);
}

// copysign: |a| with b's sign bit
at::Tensor copysign(const at::Tensor& a, const at::Tensor& other) {
  TraceScope s;
  const at::ScalarType t = FloatType(at::result_type(a, other));
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t), "\"copysign\" not implemented for '", t, "'");
  Operands o = Prepare(a, other, t);
  ir::Builder& b = B(o.device);
  ir::Value m = b.Unary(Op::Abs, o.x);
  return Wrap(b.Select(SignBit(o.device, o.y, t), b.Unary(Op::Neg, m), m), o.device);
}
at::Tensor copysign_scalar(const at::Tensor& a, const at::Scalar& other) { return tpj::aten::copysign(a, WrappedScalar(other)); }
at::Tensor trunc(const at::Tensor& a) {
  RoundingDtype(a, "trunc", "trunc_vml_cpu");
  if (at::isIntegralType(a.scalar_type(), true)) return IntegerSafe(a, Op::Floor);
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  ir::Value x = Val(a);
  ir::Value neg = b.Compare(ir::CompareDir::LT, x, Fill(d, 0, a.scalar_type(), a.sizes().vec()));
  return Wrap(b.Select(neg, b.Unary(Op::Ceil, x), b.Unary(Op::Floor, x)), d);
}

// bool and the unsigned integers (stablehlo.abs/sign/negate take signed
// types only).
bool Unsigned(at::ScalarType t) { return at::isIntegralType(t, /*includeBool=*/true) && !at::isSignedType(t); }

at::Tensor abs(const at::Tensor& a) {
  CheckNotBool(a.scalar_type(), "abs_cpu");
  if (Unsigned(a.scalar_type())) {
    TraceScope s;
    return Wrap(Val(a), DeviceIndex(a));
  }
  return Unary(a, Op::Abs, false);
}

at::Tensor neg(const at::Tensor& a) {
  TORCH_CHECK(a.scalar_type() != at::kBool,
              "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the "
              "`~` or `logical_not()` operator instead.");
  if (!Unsigned(a.scalar_type())) return Unary(a, Op::Neg, false);
  TraceScope s;  // 0 - x, wrapping as on the CPU
  const int d = DeviceIndex(a);
  return Wrap(B(d).Binary(Op::Sub, Fill(d, 0, a.scalar_type(), a.sizes().vec()), Val(a)), d);
}

at::Tensor sgn(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  if (a.scalar_type() == at::kBool) return Wrap(Val(a), d);
  if (Unsigned(a.scalar_type())) {
    ir::Builder& b = B(d);
    return Wrap(b.Convert(b.Compare(ir::CompareDir::NE, Val(a), Fill(d, 0, a.scalar_type(), a.sizes().vec())),
                          ToIr(a.scalar_type())),
                d);
  }
  if (!at::isFloatingType(a.scalar_type())) return Wrap(B(d).Unary(Op::Sign, Val(a)), d);
  // (0 < x) - (x < 0), as the CPU: NaN and -0.0 give +0.0 (stablehlo.sign
  // keeps both)
  ir::Builder& b = B(d);
  ir::Value x = Val(a);
  const auto shape = a.sizes().vec();
  ir::Value zero = Fill(d, 0, a.scalar_type(), shape);
  ir::Value neg = b.Select(b.Compare(ir::CompareDir::LT, x, zero), Fill(d, -1, a.scalar_type(), shape), zero);
  return Wrap(b.Select(b.Compare(ir::CompareDir::GT, x, zero), Fill(d, 1, a.scalar_type(), shape), neg), d);
}
at::Tensor sign(const at::Tensor& a) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(),
                              "Unlike NumPy, torch.sign is not intended to support complex numbers. Please use torch.sgn instead.");
  return tpj::aten::sgn(a);
}

at::Tensor reciprocal(const at::Tensor& a) {
  TraceScope s;
  const at::ScalarType t = FloatType(a.scalar_type());
  const int d = DeviceIndex(a);
  return Wrap(B(d).Binary(Op::Div, Fill(d, 1, t, a.sizes().vec()), ValAs(a, t)), d);
}

at::Tensor logical_not(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  return Wrap(B(d).Unary(Op::Not, ValAs(a, at::kBool)), d);
}

at::Tensor bitwise_not(const at::Tensor& a) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(a.scalar_type(), true), "\"bitwise_not_cpu\" not implemented for '",
                              a.scalar_type(), "'");
  TraceScope s;
  return Wrap(B(DeviceIndex(a)).Unary(Op::Not, Val(a)), DeviceIndex(a));
}

// Complex values are NaN (infinite) when either part is, as on the CPU.
at::Tensor isnan(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  if (!at::isFloatingType(a.scalar_type()) && !a.is_complex()) return Wrap(Fill(d, 0, at::kBool, a.sizes().vec()), d);
  ir::Builder& b = B(d);
  auto nan = [&](ir::Value x) { return b.Compare(ir::CompareDir::NE, x, x); };
  ir::Value x = Val(a);
  if (!a.is_complex()) return Wrap(nan(x), d);
  return Wrap(b.Binary(Op::Or, nan(b.Real(x)), nan(b.Imag(x))), d);
}

at::Tensor isinf(const at::Tensor& a) {
  TraceScope s;
  const int d = DeviceIndex(a);
  if (!at::isFloatingType(a.scalar_type()) && !a.is_complex()) return Wrap(Fill(d, 0, at::kBool, a.sizes().vec()), d);
  ir::Builder& b = B(d);
  const ir::Value inf = Fill(d, INFINITY, c10::toRealValueType(a.scalar_type()), a.sizes().vec());
  auto infinite = [&](ir::Value x) { return b.Compare(ir::CompareDir::EQ, b.Unary(Op::Abs, x), inf); };
  ir::Value x = Val(a);
  if (!a.is_complex()) return Wrap(infinite(x), d);
  return Wrap(b.Binary(Op::Or, infinite(b.Real(x)), infinite(b.Imag(x))), d);
}

// x == +inf (or -inf); all false for non-float dtypes.
at::Tensor IsSignedInf(const at::Tensor& a, double inf) {
  TraceScope s;
  const int d = DeviceIndex(a);
  if (!at::isFloatingType(a.scalar_type())) return Wrap(Fill(d, 0, at::kBool, a.sizes().vec()), d);
  return Wrap(B(d).Compare(ir::CompareDir::EQ, Val(a), Fill(d, inf, a.scalar_type(), a.sizes().vec())), d);
}
at::Tensor isposinf(const at::Tensor& a) {
  TORCH_CHECK(!a.is_complex(), "isposinf does not support complex inputs.");
  return IsSignedInf(a, INFINITY);
}
at::Tensor isneginf(const at::Tensor& a) {
  TORCH_CHECK(!a.is_complex(), "isneginf does not support complex inputs.");
  return IsSignedInf(a, -INFINITY);
}

// isin: each element compared with every test element (a [n, m] compare
// reduced over m): exact, and fine for the small test sets models use.
ir::Value IsIn(int d, ir::Value elements, ir::Value test, const std::vector<int64_t>& shape, bool invert) {
  ir::Builder& b = B(d);
  const int64_t n = b.shape(elements).numel(), m = b.shape(test).numel();
  if (m == 0) return b.Full(ir::DType::Bool, shape, invert ? 1 : 0);
  ir::Value x = b.BroadcastInDim(b.Reshape(elements, {n}), {n, m}, {0});
  ir::Value y = b.BroadcastInDim(b.Reshape(test, {m}), {n, m}, {1});
  ir::Value hit = b.Reduce(b.Compare(ir::CompareDir::EQ, x, y), b.ScalarConstant(ir::DType::Bool, 0), {1},
                           ir::ReduceKind::Or);
  if (invert) hit = b.Unary(Op::Not, hit);
  return b.Reshape(hit, shape);
}
// the CPU's refusal of complex elements (it compared them as all absent here)
void CheckIsInType(at::ScalarType t) {
  TORCH_CHECK(!at::isComplexType(t), "Unsupported input type encountered for isin(): ", t);
}
at::Tensor isin_tt(const at::Tensor& e, const at::Tensor& t, bool, bool invert) {
  TraceScope s;
  const int d = CommonDevice({&e, &t});
  const at::ScalarType ty = at::promoteTypes(e.scalar_type(), t.scalar_type());
  CheckIsInType(ty);
  return Wrap(IsIn(d, Operand(e, d, ty), Operand(t, d, ty), e.sizes().vec(), invert), d);
}
at::Tensor isin_ts(const at::Tensor& e, const at::Scalar& t, bool, bool invert) {
  TraceScope s;
  const int d = DeviceIndex(e);
  const at::ScalarType ty = at::result_type(e, t);
  CheckIsInType(ty);
  return Wrap(IsIn(d, ValAs(e, ty), Number(d, t, ty, {1}), e.sizes().vec(), invert), d);
}
at::Tensor isin_st(const at::Scalar& e, const at::Tensor& t, bool, bool invert) {
  TraceScope s;
  const int d = DeviceIndex(t);
  const at::ScalarType ty = at::result_type(t, e);
  CheckIsInType(ty);
  return Wrap(IsIn(d, Number(d, e, ty, {1}), ValAs(t, ty), {}, invert), d);
}

// ------------------------------------------------------------ activations

at::Tensor relu(const at::Tensor& a) {
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "clamp is not supported for complex types");
  TORCH_CHECK(a.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  ir::Value x = Val(a);
  ir::Value zero = Fill(d, 0, a.scalar_type(), a.sizes().vec());
  // x < 0 ? 0 : x keeps NaN and -0.0, as the CPU does; maximum(x, 0) leaves
  // both to the backend.
  return Wrap(b.Select(b.Compare(ir::CompareDir::LT, x, zero), zero, x), d);
}

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  TraceScope s;
  const at::ScalarType t = grad.scalar_type();
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  // x <= threshold ? 0 : grad, as the CPU: a NaN input keeps its gradient
  ir::Value drop = b.Compare(ir::CompareDir::LE, o.y, Number(o.device, threshold, t, o.shape));
  return Wrap(b.Select(drop, Fill(o.device, 0, t, o.shape), o.x), o.device);
}

at::Tensor threshold(const at::Tensor& a, const at::Scalar& th, const at::Scalar& value) {
  CheckNotComplex(a.scalar_type(), "threshold_cpu");
  CheckNotBool(a.scalar_type(), "threshold_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const auto shape = a.sizes().vec();
  const at::ScalarType t = OpMath(a.scalar_type());  // the numbers as half types' float, as the CPU
  ir::Value x = ValAs(a, t);
  // x <= threshold ? value : x, as the CPU: NaN stays NaN
  ir::Value drop = b.Compare(ir::CompareDir::LE, x, Number(d, th, t, shape));
  ir::Value v = b.Convert(Number(d, value, a.scalar_type(), shape), ToIr(t));  // the value in range (the CPU's check)
  return WrapIn(b.Select(drop, v, x), a.scalar_type(), d);
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluC = 0.044715;

at::Tensor gelu(const at::Tensor& a, c10::string_view approximate) {
  CheckFloating(a.scalar_type(), "GeluKernelImpl");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = OpMath(a.scalar_type());
  const auto shape = a.sizes().vec();
  auto c = [&](double v) { return Fill(d, v, t, shape); };
  ir::Value x = ValAs(a, t);
  ir::Value inner;
  if (approximate == "tanh") {
    ir::Value x3 = b.Binary(Op::Mul, b.Binary(Op::Mul, x, x), x);
    inner = b.Unary(Op::Tanh, b.Binary(Op::Mul, c(kSqrt2OverPi), b.Binary(Op::Add, x, b.Binary(Op::Mul, c(kGeluC), x3))));
  } else {
    inner = ErfSaturated(d, b.Binary(Op::Mul, x, c(kSqrt1_2)));
  }
  return WrapIn(b.Binary(Op::Mul, b.Binary(Op::Mul, c(0.5), x), b.Binary(Op::Add, c(1), inner)), a.scalar_type(), d);
}

// The activations' backward ops broadcast grad and input against each other,
// as the CPU's TensorIterator does (torch.func's jacrev and hessian batch
// one of them only).
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  const int d = o.device;
  ir::Builder& b = B(d);
  auto c = [&](double v) { return Fill(d, v, t, o.shape); };
  ir::Value x = o.y;
  ir::Value g = o.x;
  ir::Value dx;
  if (approximate == "tanh") {
    ir::Value x2 = b.Binary(Op::Mul, x, x);
    ir::Value inner = b.Binary(Op::Mul, c(kSqrt2OverPi), b.Binary(Op::Add, x, b.Binary(Op::Mul, c(kGeluC), b.Binary(Op::Mul, x2, x))));
    ir::Value th = b.Unary(Op::Tanh, inner);
    ir::Value left = b.Binary(Op::Mul, c(0.5), b.Binary(Op::Add, c(1), th));
    ir::Value dinner = b.Binary(Op::Mul, c(kSqrt2OverPi), b.Binary(Op::Add, c(1), b.Binary(Op::Mul, c(3 * kGeluC), x2)));
    ir::Value right = b.Binary(Op::Mul, b.Binary(Op::Mul, c(0.5), x),
                               b.Binary(Op::Mul, b.Binary(Op::Sub, c(1), b.Binary(Op::Mul, th, th)), dinner));
    dx = b.Binary(Op::Add, left, right);
  } else {
    ir::Value cdf = b.Binary(Op::Mul, c(0.5), b.Binary(Op::Add, c(1), ErfSaturated(d, b.Binary(Op::Mul, x, c(kSqrt1_2)))));
    ir::Value pdf = b.Binary(Op::Mul, c(0.39894228040143267794),
                             b.Unary(Op::Exp, b.Binary(Op::Mul, c(-0.5), b.Binary(Op::Mul, x, x))));
    dx = b.Binary(Op::Add, cdf, b.Binary(Op::Mul, x, pdf));
  }
  return WrapIn(b.Binary(Op::Mul, g, dx), self.scalar_type(), d);
}

at::Tensor silu(const at::Tensor& a) {
  if (!a.is_complex()) CheckFloating(a.scalar_type(), "silu_cpu");  // (complex too, as on the CPU)
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  ir::Value x = ValAs(a, OpMath(a.scalar_type()));
  return WrapIn(b.Binary(Op::Mul, x, b.Unary(Op::Logistic, x)), a.scalar_type(), d);
}

at::Tensor silu_backward(const at::Tensor& grad, const at::Tensor& self) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value x = o.y;
  ir::Value sg = b.Unary(Op::Logistic, x);
  ir::Value one = Fill(o.device, 1, t, o.shape);
  ir::Value dx = b.Binary(Op::Mul, sg, b.Binary(Op::Add, one, b.Binary(Op::Mul, x, b.Binary(Op::Sub, one, sg))));
  return WrapIn(b.Binary(Op::Mul, o.x, dx), self.scalar_type(), o.device);
}

at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& out) {
  TraceScope s;
  const at::ScalarType t = OpMath(out.scalar_type());
  Operands o = Prepare(grad, out, t);
  ir::Builder& b = B(o.device);
  ir::Value y = o.y;
  ir::Value one = Fill(o.device, 1, t, o.shape);
  // grad * conj(y (1 - y)): complex gradients take the conjugate, as PyTorch's
  return WrapIn(b.Binary(Op::Mul, o.x, Conjugate(b, b.Binary(Op::Mul, y, b.Binary(Op::Sub, one, y)))), out.scalar_type(),
                o.device);
}

at::Tensor tanh_backward(const at::Tensor& grad, const at::Tensor& out) {
  TraceScope s;
  const at::ScalarType t = OpMath(out.scalar_type());
  Operands o = Prepare(grad, out, t);
  ir::Builder& b = B(o.device);
  ir::Value y = o.y;
  ir::Value one = Fill(o.device, 1, t, o.shape);
  // grad * conj(1 - y^2) (see sigmoid_backward)
  return WrapIn(b.Binary(Op::Mul, o.x, Conjugate(b, b.Binary(Op::Sub, one, b.Binary(Op::Mul, y, y)))), out.scalar_type(),
                o.device);
}

at::Tensor leaky_relu(const at::Tensor& a, const at::Scalar& slope) {
  CheckFloating(a.scalar_type(), "leaky_relu_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const auto shape = a.sizes().vec();
  const at::ScalarType t = OpMath(a.scalar_type());
  ir::Value x = ValAs(a, t);
  ir::Value pos = b.Compare(ir::CompareDir::GT, x, Fill(d, 0, t, shape));
  return WrapIn(b.Select(pos, x, b.Binary(Op::Mul, x, Number(d, slope, t, shape))), a.scalar_type(), d);
}

at::Tensor leaky_relu_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope, bool) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());  // the slope read in float for half types
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value pos = b.Compare(ir::CompareDir::GT, o.y, Fill(o.device, 0, t, o.shape));
  return WrapIn(b.Select(pos, o.x, b.Binary(Op::Mul, o.x, Number(o.device, slope, t, o.shape))), self.scalar_type(),
                o.device);
}

// hardtanh(x) = min(max(x, lo), hi) with NaN kept (as relu6 on the CPU).
ir::Value HardClamp(int d, ir::Value x, double lo, double hi, at::ScalarType t, const std::vector<int64_t>& shape) {
  ir::Builder& b = B(d);
  ir::Value l = Fill(d, lo, t, shape), h = Fill(d, hi, t, shape);
  x = b.Select(b.Compare(ir::CompareDir::LT, x, l), l, x);
  return b.Select(b.Compare(ir::CompareDir::GT, x, h), h, x);
}

at::Tensor hardtanh(const at::Tensor& a, const at::Scalar& lo, const at::Scalar& hi) {
  TORCH_CHECK(a.scalar_type() != at::kBool, "Bool inputs not supported for hardtanh");
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "clamp is not supported for complex types");
  TORCH_CHECK(at::isSignedType(a.scalar_type()) || (lo.toDouble() >= 0 && hi.toDouble() >= 0),
              "cannot do hardtanh on an unsigned type with negative limits");
  RefuseOutOfRange(lo, a.scalar_type());
  RefuseOutOfRange(hi, a.scalar_type());
  TraceScope s;
  const int d = DeviceIndex(a);
  return Wrap(HardClamp(d, Val(a), lo.toDouble(), hi.toDouble(), a.scalar_type(), a.sizes().vec()), d);
}

at::Tensor hardtanh_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& lo, const at::Scalar& hi) {
  TraceScope s;
  const at::ScalarType t = self.scalar_type();
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  // x <= lo or x >= hi: no gradient, as the CPU (a NaN input keeps it)
  ir::Value out = b.Binary(Op::Or, b.Compare(ir::CompareDir::LE, o.y, Number(o.device, lo, t, o.shape)),
                           b.Compare(ir::CompareDir::GE, o.y, Number(o.device, hi, t, o.shape)));
  return Wrap(b.Select(out, Fill(o.device, 0, t, o.shape), o.x), o.device);
}

// hardsigmoid(x) = clamp(x + 3, 0, 6) / 6; hardswish(x) = x * hardsigmoid(x)
ir::Value HardSigmoid(int d, ir::Value x, at::ScalarType t, const std::vector<int64_t>& shape) {
  ir::Builder& b = B(d);
  ir::Value r = HardClamp(d, b.Binary(Op::Add, x, Fill(d, 3, t, shape)), 0, 6, t, shape);
  return b.Binary(Op::Div, r, Divisor(d, 6, t, shape));
}

at::Tensor hardsigmoid(const at::Tensor& a) {
  CheckFloating(a.scalar_type(), "hardsigmoid_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = OpMath(a.scalar_type());
  return WrapIn(HardSigmoid(d, ValAs(a, t), t, a.sizes().vec()), a.scalar_type(), d);
}

at::Tensor hardswish(const at::Tensor& a) {
  CheckFloating(a.scalar_type(), "hardswish_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = OpMath(a.scalar_type());
  ir::Value x = ValAs(a, t);
  // x * clamp(x + 3, 0, 6) / 6, in the CPU's order of operations
  const auto shape = a.sizes().vec();
  ir::Builder& b = B(d);
  ir::Value r = HardClamp(d, b.Binary(Op::Add, x, Fill(d, 3, t, shape)), 0, 6, t, shape);
  return WrapIn(b.Binary(Op::Div, b.Binary(Op::Mul, x, r), Divisor(d, 6, t, shape)), a.scalar_type(), d);
}

at::Tensor hardsigmoid_backward(const at::Tensor& grad, const at::Tensor& self) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  // -3 < x < 3: grad / 6, else 0
  ir::Value in = b.Binary(Op::And, b.Compare(ir::CompareDir::GT, o.y, Fill(o.device, -3, t, o.shape)),
                          b.Compare(ir::CompareDir::LT, o.y, Fill(o.device, 3, t, o.shape)));
  return WrapIn(b.Select(in, b.Binary(Op::Div, o.x, Divisor(o.device, 6, t, o.shape)), Fill(o.device, 0, t, o.shape)),
                self.scalar_type(), o.device);
}

at::Tensor hardswish_backward(const at::Tensor& grad, const at::Tensor& self) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  auto c = [&](double v) { return Fill(o.device, v, t, o.shape); };
  // x <= -3: 0; x < 3: grad * (x / 3 + 0.5); else grad (the CPU's branches)
  ir::Value mid = b.Binary(Op::Mul, o.x, b.Binary(Op::Add, b.Binary(Op::Div, o.y, Divisor(o.device, 3, t, o.shape)), c(0.5)));
  ir::Value r = b.Select(b.Compare(ir::CompareDir::LT, o.y, c(3)), mid, o.x);
  return WrapIn(b.Select(b.Compare(ir::CompareDir::LE, o.y, c(-3)), c(0), r), self.scalar_type(), o.device);
}

// log(1 + e^x) as the CPU's softplus and mish write it
ir::Value Log1pExp(ir::Builder& b, ir::Value x) { return b.Unary(Op::Log1p, b.Unary(Op::Exp, x)); }

// softplus(x) = log1p(exp(beta x)) / beta, or x where beta x > threshold
at::Tensor softplus(const at::Tensor& a, const at::Scalar& beta, const at::Scalar& threshold) {
  CheckFloating(a.scalar_type(), "softplus_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = OpMath(a.scalar_type());
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  ir::Value bx = b.Binary(Op::Mul, x, Number(d, beta, t, shape));
  ir::Value sp = b.Binary(Op::Div, Log1pExp(b, bx), Number(d, beta, t, shape));
  return WrapIn(b.Select(b.Compare(ir::CompareDir::GT, bx, Number(d, threshold, t, shape)), x, sp), a.scalar_type(), d);
}

at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta,
                             const at::Scalar& threshold) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value bx = b.Binary(Op::Mul, o.y, Number(o.device, beta, t, o.shape));
  ir::Value z = b.Unary(Op::Exp, bx);
  ir::Value g = b.Binary(Op::Div, b.Binary(Op::Mul, o.x, z), b.Binary(Op::Add, z, Fill(o.device, 1, t, o.shape)));
  return WrapIn(b.Select(b.Compare(ir::CompareDir::GT, bx, Number(o.device, threshold, t, o.shape)), o.x, g),
                self.scalar_type(), o.device);
}

// mish(x) = x * tanh(softplus(x)), as the CPU: x * tanh(log1p(exp(x)))
at::Tensor mish(const at::Tensor& a) {
  CheckFloating(a.scalar_type(), "mish_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  ir::Value x = ValAs(a, OpMath(a.scalar_type()));
  return WrapIn(b.Binary(Op::Mul, x, b.Unary(Op::Tanh, Log1pExp(b, x))), a.scalar_type(), d);
}

at::Tensor mish_backward(const at::Tensor& grad, const at::Tensor& self) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value one = Fill(o.device, 1, t, o.shape);
  ir::Value sg = b.Unary(Op::Logistic, o.y);
  ir::Value th = b.Unary(Op::Tanh, Log1pExp(b, o.y));
  // grad * (tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2))
  ir::Value dx = b.Binary(Op::Add, th, b.Binary(Op::Mul, b.Binary(Op::Mul, o.y, sg),
                                                b.Binary(Op::Sub, one, b.Binary(Op::Mul, th, th))));
  return WrapIn(b.Binary(Op::Mul, o.x, dx), self.scalar_type(), o.device);
}

// log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), as the CPU writes it; the
// buffer is exp(-|x|), the CPU's (the backward recomputes it from x, as CUDA's)
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& a) {
  CheckFloating(a.scalar_type(), "log_sigmoid_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = OpMath(a.scalar_type());
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  ir::Value z = b.Unary(Op::Exp, b.Unary(Op::Neg, b.Unary(Op::Abs, x)));
  ir::Value lo = b.Binary(Op::Min, x, Fill(d, 0, t, shape));
  return {WrapIn(b.Binary(Op::Sub, lo, b.Unary(Op::Log1p, z)), a.scalar_type(), d), WrapIn(z, a.scalar_type(), d)};
}

// d/dx = x < 0 ? 1 - z / (1 + z) : z / (1 + z), z = exp(-|x|)
at::Tensor log_sigmoid_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& buffer) {
  TraceScope s;
  const at::ScalarType t = OpMath(self.scalar_type());
  Operands o = Prepare(grad, self, t);
  ir::Builder& b = B(o.device);
  ir::Value one = Fill(o.device, 1, t, o.shape);
  ir::Value z = b.Unary(Op::Exp, b.Unary(Op::Neg, b.Unary(Op::Abs, o.y)));
  ir::Value q = b.Binary(Op::Div, z, b.Binary(Op::Add, one, z));
  ir::Value neg = b.Compare(ir::CompareDir::LT, o.y, Fill(o.device, 0, t, o.shape));
  return WrapIn(b.Binary(Op::Mul, o.x, b.Select(neg, b.Binary(Op::Sub, one, q), q)), self.scalar_type(), o.device);
}

// elu(x) = x > 0 ? scale x : scale alpha (exp(x input_scale) - 1)
at::Tensor elu(const at::Tensor& a, const at::Scalar& alpha, const at::Scalar& scale, const at::Scalar& input_scale) {
  CheckFloating(a.scalar_type(), "elu_cpu");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = OpMath(a.scalar_type());
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  ir::Value neg = b.Binary(Op::Mul, Number(d, alpha, t, shape),
                           b.Unary(Op::Expm1, b.Binary(Op::Mul, x, Number(d, input_scale, t, shape))));
  ir::Value r = b.Select(b.Compare(ir::CompareDir::GT, x, Fill(d, 0, t, shape)), x, neg);
  return WrapIn(b.Binary(Op::Mul, r, Number(d, scale, t, shape)), a.scalar_type(), d);
}

at::Tensor elu_backward(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                        const at::Scalar& input_scale, bool is_result, const at::Tensor& self_or_result) {
  TraceScope s;
  const at::ScalarType t = OpMath(self_or_result.scalar_type());
  Operands o = Prepare(grad, self_or_result, t);
  ir::Builder& b = B(o.device);
  auto n = [&](const at::Scalar& v) { return Number(o.device, v, t, o.shape); };
  ir::Value neg_slope;
  if (is_result) {
    // y <= 0: grad * input_scale * (y + alpha scale)
    neg_slope = b.Binary(Op::Mul, n(input_scale), b.Binary(Op::Add, o.y, b.Binary(Op::Mul, n(alpha), n(scale))));
  } else {
    // x <= 0: grad * input_scale * alpha scale exp(x input_scale)
    neg_slope = b.Binary(Op::Mul, b.Binary(Op::Mul, n(input_scale), b.Binary(Op::Mul, n(alpha), n(scale))),
                         b.Unary(Op::Exp, b.Binary(Op::Mul, o.y, n(input_scale))));
  }
  // x <= 0 takes the negative branch: a NaN input keeps grad * scale, as the CPU
  ir::Value neg = b.Compare(ir::CompareDir::LE, o.y, Fill(o.device, 0, t, o.shape));
  return WrapIn(b.Select(neg, b.Binary(Op::Mul, o.x, neg_slope), b.Binary(Op::Mul, o.x, n(scale))),
                self_or_result.scalar_type(), o.device);
}

// ------------------------------------------------------ clamp, where, fill

// One bound of clamp: the bound where x is beyond it, else x itself (so a
// +0.0/-0.0 tie keeps x's zero, as the CPU's clamp with a scalar bound
// does). A NaN x or a NaN bound gives NaN, as on the CPU.
ir::Value ClampTo(int d, ir::Value x, ir::Value bound, bool lower) {
  ir::Builder& b = B(d);
  ir::Value beyond = b.Compare(lower ? ir::CompareDir::LT : ir::CompareDir::GT, x, bound);
  if (ir::IsFloat(b.shape(x).dtype)) beyond = b.Binary(Op::Or, beyond, IsNan(d, bound));
  return b.Select(beyond, bound, x);
}

at::Tensor clamp(const at::Tensor& a, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi) {
  TORCH_CHECK(lo || hi, "torch.clamp: At least one of 'min' or 'max' must not be None");
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "clamp is not supported for complex types");
  TraceScope s;
  const int d = DeviceIndex(a);
  at::ScalarType t = a.scalar_type();
  if (lo) t = at::promoteTypes(t, at::result_type(a, *lo));
  if (hi) t = at::promoteTypes(t, at::result_type(a, *hi));
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  if (lo) x = ClampTo(d, x, Number(d, *lo, t, shape), true);
  if (hi) x = ClampTo(d, x, Number(d, *hi, t, shape), false);
  return Wrap(x, d);
}

at::Tensor clamp_tensor(const at::Tensor& a, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi) {
  TORCH_CHECK((lo && lo->defined()) || (hi && hi->defined()), "torch.clamp: At least one of 'min' or 'max' must not be None");
  TORCH_CHECK_NOT_IMPLEMENTED(!a.is_complex(), "clamp is not supported for complex types");
  TraceScope s;
  // the three operands promote together, as in the CPU's TensorIterator: a
  // dimensioned bound's dtype wins over a 0-d self's of the same kind
  at::native::ResultTypeState state = at::native::update_result_type_state(a, {});
  if (lo && lo->defined()) state = at::native::update_result_type_state(*lo, state);
  if (hi && hi->defined()) state = at::native::update_result_type_state(*hi, state);
  const at::ScalarType t = at::native::result_type(state);
  std::vector<int64_t> shape = a.sizes().vec();
  if (lo && lo->defined()) shape = at::infer_size(shape, lo->sizes());
  if (hi && hi->defined()) shape = at::infer_size(shape, hi->sizes());
  const int d = CommonDevice({&a, lo ? &*lo : nullptr, hi ? &*hi : nullptr});
  ir::Value x = BroadcastTo(d, Operand(a, d, t), shape);
  if (lo && lo->defined()) x = ClampTo(d, x, BroadcastTo(d, Operand(*lo, d, t), shape), true);
  if (hi && hi->defined()) x = ClampTo(d, x, BroadcastTo(d, Operand(*hi, d, t), shape), false);
  return Wrap(x, d);
}

at::Tensor clamp_min(const at::Tensor& a, const at::Scalar& lo) { return tpj::aten::clamp(a, lo, std::nullopt); }
at::Tensor clamp_max(const at::Tensor& a, const at::Scalar& hi) { return tpj::aten::clamp(a, std::nullopt, hi); }

at::Tensor where_self(const at::Tensor& cond, const at::Tensor& a, const at::Tensor& other) {
  // The CPU's check: a bool condition (uint8 still taken, with its warning).
  if (cond.scalar_type() == at::kByte) {
    TORCH_WARN_ONCE("where received a uint8 condition tensor. This behavior is deprecated and will be removed in a "
                    "future version of PyTorch. Use a boolean condition instead.");
  } else {
    TORCH_CHECK(cond.scalar_type() == at::kBool, "where expected condition to be a boolean tensor, but got a tensor "
                "with dtype ", cond.scalar_type());
  }
  TraceScope s;
  const at::ScalarType t = at::result_type(a, other);
  const int d = CommonDevice({&cond, &a, &other});
  std::vector<int64_t> shape = at::infer_size(at::infer_size(cond.sizes(), a.sizes()), other.sizes());
  ir::Value c = BroadcastTo(d, Operand(cond, d, at::kBool), shape);
  ir::Value x = BroadcastTo(d, Operand(a, d, t), shape);
  ir::Value y = BroadcastTo(d, Operand(other, d, t), shape);
  return Wrap(B(d).Select(c, x, y), d);
}

void CheckBoolMask(const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.dtype());
}

at::Tensor& masked_fill_scalar_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  CheckBoolMask(mask);
  AssertNoInternalOverlap(self);  // a shared element masked in one place and not in another
  TraceScope s;
  const int d = CommonDevice({&self, &mask});
  const auto shape = self.sizes().vec();
  ir::Value m = BroadcastTo(d, Operand(mask, d, at::kBool), shape);
  Assign(self, B(d).Select(m, Number(d, value, self.scalar_type(), shape), Val(self)));
  return self;
}

at::Tensor& masked_fill_tensor_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  CheckBoolMask(mask);
  AssertNoInternalOverlap(self);
  TraceScope s;
  const int d = CommonDevice({&self, &mask, &value});
  const auto shape = self.sizes().vec();
  ir::Value m = BroadcastTo(d, Operand(mask, d, at::kBool), shape);
  Assign(self, B(d).Select(m, BroadcastTo(d, Operand(value, d, self.scalar_type()), shape), Val(self)));
  return self;
}

// ------------------------------------------------- fused optimizer helpers

at::Tensor AddcOp(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value, Op op) {
  TraceScope s;
  // PyTorch's promotion over the three (a 0-d operand does not widen the
  // others' category, as promoteTypes of its dtype would)
  at::native::ResultTypeState st;
  for (const at::Tensor* x : {&self, &t1, &t2}) st = at::native::update_result_type_state(*x, st);
  const at::ScalarType t = at::native::result_type(st);
  const int d = CommonDevice({&self, &t1, &t2});
  std::vector<int64_t> shape = at::infer_size(at::infer_size(self.sizes(), t1.sizes()), t2.sizes());
  ir::Builder& b = B(d);
  // self + value * t1 op t2, in that order, half types in float (the CPU's kernels)
  const at::ScalarType ct = OpMath(t);
  auto in = [&](const at::Tensor& x) { return b.Convert(BroadcastTo(d, Operand(x, d, t), shape), ToIr(ct)); };
  ir::Value x1 = in(t1);
  if (!IsOne(value)) x1 = b.Binary(Op::Mul, Number(d, value, ct, shape), x1);
  return WrapIn(b.Binary(Op::Add, in(self), b.Binary(op, x1, in(t2))), t, d);
}
at::Tensor addcmul(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  CheckNotBool(at::promote_types(at::result_type(self, a), b.scalar_type()), "addcmul_cpu_out");
  return AddcOp(self, a, b, v, Op::Mul);
}
at::Tensor addcdiv(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  TORCH_CHECK(!at::isIntegralType(a.scalar_type(), true) || !at::isIntegralType(b.scalar_type(), true),
              "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a "
              "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
              "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
              "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
              "(input + value * tensor1 / tensor2), for all dtypes.");
  return AddcOp(self, a, b, v, Op::Div);
}

// The CPU's lerp: x + w (y - x) where |w| < 0.5, else y - (y - x)(1 - w),
// exact at both ends; complex weights take the first form throughout (the
// CPU picks by |w| for them too: not matched, as before). A
// number weight picks its form while tracing (`small`), a tensor one per
// element.
ir::Value Lerp(int d, ir::Value x, ir::Value y, ir::Value w, at::ScalarType t, std::optional<bool> small = {}) {
  ir::Builder& b = B(d);
  ir::Value diff = b.Binary(Op::Sub, y, x);
  auto near_x = [&] { return b.Binary(Op::Add, x, b.Binary(Op::Mul, w, diff)); };
  if (at::isComplexType(t) || small == std::optional<bool>(true)) return near_x();
  const auto shape = b.shape(x).dims;
  ir::Value near_y = b.Binary(Op::Sub, y, b.Binary(Op::Mul, diff, b.Binary(Op::Sub, Fill(d, 1, t, shape), w)));
  if (small) return near_y;
  ir::Value below = b.Compare(ir::CompareDir::LT, b.Unary(Op::Abs, w), Fill(d, 0.5, t, shape));
  return b.Select(below, near_x(), near_y);
}

// The CPU's dtype rules (Lerp.cpp): `end` has self's dtype; a weight
// tensor too unless it is 0-d, which promotes with them as a number would.
void CheckLerpDtype(const at::Tensor& self, const at::Tensor& other, const char* name) {
  TORCH_CHECK(self.dtype() == other.dtype(), "expected dtype ", self.dtype(), " for `", name, "` but got dtype ",
              other.dtype());
}

at::Tensor lerp_scalar(const at::Tensor& self, const at::Tensor& end, const at::Scalar& w) {
  TraceScope s;
  CheckLerpDtype(self, end, "end");
  const at::ScalarType t = self.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t) || at::isComplexType(t), "\"lerp_kernel_scalar\" not implemented for '", t, "'");
  const at::ScalarType ct = OpMath(t);
  Operands o = Prepare(self, end, ct);
  // |w| < 0.5 in the type the CPU reads w in (float for float and half types)
  const double wv = w.isComplex() ? 0 : w.toDouble();
  const bool small = w.isComplex() || (ct == at::kDouble ? std::abs(wv) < 0.5 : std::abs(static_cast<float>(wv)) < 0.5f);
  return WrapIn(Lerp(o.device, o.x, o.y, Number(o.device, w, ct, o.shape), ct, small), t, o.device);
}

at::Tensor lerp_tensor(const at::Tensor& self, const at::Tensor& end, const at::Tensor& w) {
  TraceScope s;
  CheckLerpDtype(self, end, "end");
  if (w.dim() != 0) CheckLerpDtype(self, w, "weight");
  at::native::ResultTypeState st;  // a 0-d weight promotes with both, as in TensorIterator
  for (const at::Tensor* x : {&self, &end, &w}) st = at::native::update_result_type_state(*x, st);
  const at::ScalarType t = w.dim() == 0 ? at::native::result_type(st) : self.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t) || at::isComplexType(t), "\"lerp_kernel_tensor\" not implemented for '", t, "'");
  const int d = CommonDevice({&self, &end, &w});
  std::vector<int64_t> shape = at::infer_size(at::infer_size(self.sizes(), end.sizes()), w.sizes());
  const at::ScalarType ct = OpMath(t);
  // each read in t first (a 0-d float32 weight beside bfloat16 tensors is
  // rounded to bfloat16, as TensorIterator casts it), then computed in ct
  auto read = [&](const at::Tensor& x) { return B(d).Convert(BroadcastTo(d, Operand(x, d, t), shape), ToIr(ct)); };
  return WrapIn(Lerp(d, read(self), read(end), read(w), ct), t, d);
}

inline void NoPartialOverlap(const at::Tensor& self, const at::Tensor& operand) {
  AssertNoPartialOverlap(self, operand);
}
template <class T>
void NoPartialOverlap(const at::Tensor&, const T&) {}

// In-place twins: compute functionally, then write into self (WriteInto).
template <class F, class... A>
at::Tensor& Inplace(at::Tensor& self, F f, const A&... args) {
  AssertNoInternalOverlap(self);
  (NoPartialOverlap(self, args), ...);
  return WriteInto(self, [&] {
    at::Tensor r = f(self, args...);
    CheckInplace(self, r.scalar_type());
    TORCH_CHECK(r.sizes() == self.sizes(), "output with shape ", self.sizes(), " doesn't match the broadcast shape ",
                r.sizes());
    return r;
  });
}

}  // namespace

// In-place kernels of the hot ops, unboxed: deriving them (aten/derived.h)
// gives the same program, with more dispatch overhead (docs/device.md).
namespace inplace {
at::Tensor& add_(at::Tensor& s, const at::Tensor& o, const at::Scalar& a) { return Inplace(s, add_tensor, o, a); }
at::Tensor& add_s_(at::Tensor& s, const at::Scalar& o, const at::Scalar& a) { return Inplace(s, add_scalar, o, a); }
at::Tensor& sub_(at::Tensor& s, const at::Tensor& o, const at::Scalar& a) { return Inplace(s, sub_tensor, o, a); }
at::Tensor& sub_s_(at::Tensor& s, const at::Scalar& o, const at::Scalar& a) { return Inplace(s, sub_scalar, o, a); }
at::Tensor& mul_(at::Tensor& s, const at::Tensor& o) { return Inplace(s, mul_tensor, o); }
at::Tensor& mul_s_(at::Tensor& s, const at::Scalar& o) { return Inplace(s, mul_scalar, o); }
at::Tensor& div_(at::Tensor& s, const at::Tensor& o) { return Inplace(s, div_tensor, o); }
at::Tensor& div_s_(at::Tensor& s, const at::Scalar& o) { return Inplace(s, div_scalar, o); }
at::Tensor& div_mode_(at::Tensor& s, const at::Tensor& o, std::optional<c10::string_view> m) {
  return Inplace(s, div_tensor_mode, o, m);
}
at::Tensor& pow_s_(at::Tensor& s, const at::Scalar& e) { return Inplace(s, pow_tensor_scalar, e); }
at::Tensor& pow_t_(at::Tensor& s, const at::Tensor& e) { return Inplace(s, pow_tensor_tensor, e); }
at::Tensor& remainder_(at::Tensor& s, const at::Tensor& o) { return Inplace(s, remainder_tensor, o); }
at::Tensor& floor_divide_(at::Tensor& s, const at::Tensor& o) { return Inplace(s, floor_divide, o); }
at::Tensor& neg_(at::Tensor& s) { return Inplace(s, neg); }
at::Tensor& exp_(at::Tensor& s) { return Inplace(s, exp); }
at::Tensor& log_(at::Tensor& s) { return Inplace(s, log); }
at::Tensor& sqrt_(at::Tensor& s) { return Inplace(s, sqrt); }
at::Tensor& rsqrt_(at::Tensor& s) { return Inplace(s, rsqrt); }
at::Tensor& tanh_(at::Tensor& s) { return Inplace(s, tanh); }
at::Tensor& sigmoid_(at::Tensor& s) { return Inplace(s, sigmoid); }
at::Tensor& relu_(at::Tensor& s) { return Inplace(s, relu); }
at::Tensor& abs_(at::Tensor& s) {
  TORCH_CHECK(!s.is_complex(), "In-place abs is not supported for complex tensors.");  // (abs is real: as the CPU)
  return Inplace(s, abs);
}
at::Tensor& floor_(at::Tensor& s) { return Inplace(s, floor); }
at::Tensor& reciprocal_(at::Tensor& s) { return Inplace(s, reciprocal); }
at::Tensor& silu_(at::Tensor& s) { return Inplace(s, silu); }
at::Tensor& clamp_(at::Tensor& s, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi) {
  return Inplace(s, clamp, lo, hi);
}
at::Tensor& clamp_min_(at::Tensor& s, const at::Scalar& lo) { return Inplace(s, clamp_min, lo); }
at::Tensor& clamp_max_(at::Tensor& s, const at::Scalar& hi) { return Inplace(s, clamp_max, hi); }
at::Tensor& addcmul_(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return Inplace(s, addcmul, a, b, v);
}
at::Tensor& addcdiv_(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return Inplace(s, addcdiv, a, b, v);
}
at::Tensor& lerp_s_(at::Tensor& s, const at::Tensor& e, const at::Scalar& w) { return Inplace(s, lerp_scalar, e, w); }
at::Tensor& lerp_t_(at::Tensor& s, const at::Tensor& e, const at::Tensor& w) { return Inplace(s, lerp_tensor, e, w); }
at::Tensor& logical_not_(at::Tensor& s) { return Inplace(s, logical_not); }
at::Tensor& leaky_relu_(at::Tensor& s, const at::Scalar& slope) { return Inplace(s, leaky_relu, slope); }
at::Tensor& gelu_(at::Tensor& s, c10::string_view a) { return Inplace(s, gelu, a); }
at::Tensor& threshold_(at::Tensor& s, const at::Scalar& th, const at::Scalar& v) { return Inplace(s, threshold, th, v); }
at::Tensor& eq_s_(at::Tensor& s, const at::Scalar& o) { return Inplace(s, eq_scalar, o); }
}  // namespace inplace

}  // namespace tpj::aten

// Results are laid out as TensorIterator lays them out (aten/layout.h); KN:
// ops whose number operand is one of TensorIterator's operands on the CPU.
#define K(name, fn) TPJ_LAID(m, name, kOperands, fn)
#define KN(name, fn) TPJ_LAID(m, name, kOperandsAndNumber, fn)
#define KI(name, fn) m.impl(name, TORCH_FN(tpj::aten::inplace::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("add.Tensor", add_tensor);
  KN("add.Scalar", add_scalar);
  K("sub.Tensor", sub_tensor);
  KN("sub.Scalar", sub_scalar);
  K("rsub.Tensor", rsub_tensor);
  KN("rsub.Scalar", rsub_scalar);
  K("mul.Tensor", mul_tensor);
  KN("mul.Scalar", mul_scalar);
  K("div.Tensor", div_tensor);
  K("div.Tensor_mode", div_tensor_mode);
  KN("div.Scalar", div_scalar);
  K("remainder.Tensor", remainder_tensor);
  K("floor_divide", floor_divide);
  KN("floor_divide.Scalar", floor_divide_scalar);
  KN("remainder.Scalar", remainder_scalar);
  K("remainder.Scalar_Tensor", remainder_scalar_tensor);
  K("fmod.Tensor", fmod_tensor);
  KN("fmod.Scalar", fmod_scalar);
  K("pow.Tensor_Scalar", pow_tensor_scalar);
  K("pow.Tensor_Tensor", pow_tensor_tensor);
  K("pow.Scalar", pow_scalar);
  K("maximum", maximum);
  K("minimum", minimum);
  K("atan2", atan2);
  K("logical_and", logical_and);
  K("logical_or", logical_or);
  K("logical_xor", logical_xor);
  K("logical_not", logical_not);
  K("bitwise_and.Tensor", bitwise_and);
  K("bitwise_or.Tensor", bitwise_or);
  K("bitwise_xor.Tensor", bitwise_xor);
  KN("bitwise_and.Scalar", bitwise_and_s);
  KN("bitwise_or.Scalar", bitwise_or_s);
  K("bitwise_not", bitwise_not);
  K("bitwise_left_shift.Tensor", lshift);
  K("bitwise_right_shift.Tensor", rshift);
  KN("bitwise_left_shift.Tensor_Scalar", lshift_s);
  KN("bitwise_right_shift.Tensor_Scalar", rshift_s);
  K("__lshift__.Tensor", lshift);
  K("__rshift__.Tensor", rshift);
  KN("__lshift__.Scalar", lshift_s);
  KN("__rshift__.Scalar", rshift_s);
  K("eq.Tensor", eq_tensor);
  KN("eq.Scalar", eq_scalar);
  K("ne.Tensor", ne_tensor);
  KN("ne.Scalar", ne_scalar);
  K("lt.Tensor", lt_tensor);
  KN("lt.Scalar", lt_scalar);
  K("le.Tensor", le_tensor);
  KN("le.Scalar", le_scalar);
  K("gt.Tensor", gt_tensor);
  KN("gt.Scalar", gt_scalar);
  K("ge.Tensor", ge_tensor);
  KN("ge.Scalar", ge_scalar);
  K("neg", neg);
  K("exp", exp);
  K("expm1", expm1);
  K("log", log);
  K("log1p", log1p);
  K("tanh", tanh);
  K("sigmoid", sigmoid);
  K("sqrt", sqrt);
  K("rsqrt", rsqrt);
  K("sin", sin);
  K("cos", cos);
  K("tan", tan);
  K("erf", erf);
  K("floor", floor);
  K("ceil", ceil);
  K("round", round);
  K("round.decimals", round_decimals);
  K("signbit", signbit);
  K("copysign.Tensor", copysign);
  KN("copysign.Scalar", copysign_scalar);
  K("trunc", trunc);
  K("abs", abs);
  K("sign", sign);
  K("sgn", sgn);
  K("reciprocal", reciprocal);
  K("isnan", isnan);
  K("isinf", isinf);
  K("isposinf", isposinf);
  K("isneginf", isneginf);
  K("isin.Tensor_Tensor", isin_tt);
  K("isin.Tensor_Scalar", isin_ts);
  K("isin.Scalar_Tensor", isin_st);
  K("relu", relu);
  K("threshold", threshold);
  K("threshold_backward", threshold_backward);
  K("gelu", gelu);
  K("gelu_backward", gelu_backward);
  K("silu", silu);
  K("silu_backward", silu_backward);
  K("sigmoid_backward", sigmoid_backward);
  K("tanh_backward", tanh_backward);
  K("leaky_relu", leaky_relu);
  K("leaky_relu_backward", leaky_relu_backward);
  K("hardtanh", hardtanh);
  K("hardtanh_backward", hardtanh_backward);
  K("hardsigmoid", hardsigmoid);
  K("hardsigmoid_backward", hardsigmoid_backward);
  K("hardswish", hardswish);
  K("hardswish_backward", hardswish_backward);
  K("softplus", softplus);
  K("softplus_backward", softplus_backward);
  K("mish", mish);
  K("mish_backward", mish_backward);
  K("log_sigmoid_forward", log_sigmoid_forward);
  K("log_sigmoid_backward", log_sigmoid_backward);
  K("elu", elu);
  K("elu_backward", elu_backward);
  K("clamp", clamp);
  K("clamp.Tensor", clamp_tensor);
  K("clamp_min", clamp_min);
  K("clamp_max", clamp_max);
  K("where.self", where_self);
  m.impl("masked_fill_.Scalar", TORCH_FN(tpj::aten::masked_fill_scalar_));  // in place: plain
  m.impl("masked_fill_.Tensor", TORCH_FN(tpj::aten::masked_fill_tensor_));
  K("addcmul", addcmul);
  K("addcdiv", addcdiv);
  K("lerp.Scalar", lerp_scalar);
  K("lerp.Tensor", lerp_tensor);

  KI("add_.Tensor", add_);
  KI("add_.Scalar", add_s_);
  KI("sub_.Tensor", sub_);
  KI("sub_.Scalar", sub_s_);
  KI("mul_.Tensor", mul_);
  KI("mul_.Scalar", mul_s_);
  KI("div_.Tensor", div_);
  KI("div_.Scalar", div_s_);
  KI("div_.Tensor_mode", div_mode_);
  KI("pow_.Scalar", pow_s_);
  KI("pow_.Tensor", pow_t_);
  KI("remainder_.Tensor", remainder_);
  KI("floor_divide_.Tensor", floor_divide_);
  KI("neg_", neg_);
  KI("exp_", exp_);
  KI("log_", log_);
  KI("sqrt_", sqrt_);
  KI("rsqrt_", rsqrt_);
  KI("tanh_", tanh_);
  KI("sigmoid_", sigmoid_);
  KI("relu_", relu_);
  KI("abs_", abs_);
  KI("floor_", floor_);
  KI("reciprocal_", reciprocal_);
  KI("silu_", silu_);
  KI("clamp_", clamp_);
  KI("clamp_min_", clamp_min_);
  KI("clamp_max_", clamp_max_);
  KI("addcmul_", addcmul_);
  KI("addcdiv_", addcdiv_);
  KI("lerp_.Scalar", lerp_s_);
  KI("lerp_.Tensor", lerp_t_);
  KI("logical_not_", logical_not_);
  KI("leaky_relu_", leaky_relu_);
  KI("gelu_", gelu_);
  KI("threshold_", threshold_);
  KI("eq_.Scalar", eq_s_);
}
