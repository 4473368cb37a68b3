// Random numbers on the device: uniform/normal/bernoulli/integers,
// exponential/cauchy/geometric/log-normal, normal with tensor mean or std,
// randperm, multinomial and dropout, from the runtime's per-device Threefry state
// (seeded by torch_pjrt.manual_seed / torch.manual_seed), or from a
// torch.Generator(device="pjrt") passed to the op (aten/generator.h).
#include <ATen/Dispatch.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/native/DistributionTemplates.h>
#include <ATen/native/Resize.h>

#include <cmath>
#include <limits>

#include "aten/generator.h"
#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

// Uniform [0, 1) of dtype t (float or double), shape `shape`: 24 (53)
// random bits times 2^-24 (2^-53), as the CPU draws them (exact: the
// integer fits the significand).
ir::Value Uniform01(int d, const std::vector<int64_t>& shape, at::ScalarType t) {
  ir::Builder& b = B(d);
  if (t == at::kDouble) {
    ir::Value bits = b.Binary(Op::ShiftRightLogical, RandomBits(d, {ir::DType::U64, shape}), Fill(d, 11, at::kUInt64, shape));
    return b.Binary(Op::Mul, b.Convert(bits, ir::DType::F64), Fill(d, std::ldexp(1.0, -53), at::kDouble, shape));
  }
  ir::Value bits = b.Binary(Op::ShiftRightLogical, RandomBits(d, {ir::DType::U32, shape}), Fill(d, 8, at::kUInt32, shape));
  return b.Binary(Op::Mul, b.Convert(bits, ir::DType::F32), Fill(d, std::ldexp(1.0, -24), at::kFloat, shape));
}

at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.is_complex()) {  // real and imaginary parts drawn alike, as on the CPU
    at::Tensor parts = at::view_as_real(self);
    uniform_(parts, from, to, std::move(gen));
    return self;
  }
  GeneratorScope scope(gen, self);
  // The CPU's checks of the bounds (check_uniform_bounds), with its messages
  const at::ScalarType t = self.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t), "\"check_uniform_bounds\" not implemented for '", t, "'");
  double lowest = 0, max = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "check_uniform_bounds", [&] {
    lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    max = static_cast<double>(std::numeric_limits<scalar_t>::max());
  });
  TORCH_CHECK(from >= lowest && from <= max, "from is out of bounds for ", self.dtype());
  TORCH_CHECK(to >= lowest && to <= max, "to is out of bounds for ", self.dtype());
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  TORCH_CHECK(to - from <= max, "uniform_ expects to-from <= std::numeric_limits<", t, ">::max(), but found to=", to,
              " and from=", from, " which result in to-from to exceed the limit");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  // As the CPU: from + u (to - from) in float for half types, rounded once;
  // a value that rounds up to `to` becomes `from` (so each value of the
  // type in [from, to) is as likely as its share of the interval).
  const at::ScalarType ct = t == at::kDouble ? at::kDouble : at::kFloat;
  ir::Value u = Uniform01(d, shape, ct);
  if (from != 0 || to != 1) {
    u = b.Binary(Op::Add, b.Binary(Op::Mul, u, Number(d, to - from, ct, shape)), Number(d, from, ct, shape));
  }
  u = b.Convert(u, ToIr(t));
  Assign(self, b.Select(b.Compare(ir::CompareDir::EQ, u, Number(d, to, t, shape)), Number(d, from, t, shape), u));
  return self;
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0, "normal expects std >= 0.0, but found std ", std);
  if (self.is_complex()) {  // as the CPU: both parts N(mean, std^2 / 2), the variance split between them
    at::Tensor parts = at::view_as_real(self);
    normal_(parts, mean, std / std::sqrt(2.0), std::move(gen));
    return self;
  }
  GeneratorScope scope(gen, self);
  CheckFloating(self.scalar_type(), "normal_kernel_cpu");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const at::ScalarType ct = t == at::kDouble ? at::kDouble : at::kFloat;
  const auto shape = self.sizes().vec();
  // Box-Muller: sqrt(-2 ln(1 - u1)) * cos(2 pi u2)
  ir::Value u1 = Uniform01(d, shape, ct);
  ir::Value u2 = Uniform01(d, shape, ct);
  ir::Value r = b.Unary(Op::Sqrt, b.Binary(Op::Mul, Fill(d, -2, ct, shape),
                                           b.Unary(Op::Log, b.Binary(Op::Sub, Fill(d, 1, ct, shape), u1))));
  ir::Value z = b.Binary(Op::Mul, r, b.Unary(Op::Cos, b.Binary(Op::Mul, Fill(d, 2 * M_PI, ct, shape), u2)));
  if (std != 1) z = b.Binary(Op::Mul, z, Number(d, std, ct, shape));
  if (mean != 0) z = b.Binary(Op::Add, z, Number(d, mean, ct, shape));
  Assign(self, z);
  return self;
}

// Draws from a distribution by transforming uniform numbers strictly inside
// (0, 1), in float for half types: the midpoints of a grid one bit coarser
// than uniform_'s, (k + 1/2) 2^-23 (2^-52 for double), exact since k + 1/2
// fits the significand. (uniform_'s own grid, k 2^-24, plus half a step
// would round its top value up to 1.0: exponential_ would give inf.)
at::Tensor OpenUniform(const at::Tensor& self) {
  const at::ScalarType ct = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int bits = ct == at::kDouble ? 52 : 23;
  at::Tensor u = at::empty(self.sizes(), self.options().dtype(ct)).uniform_();
  return u.mul_(std::ldexp(1.0, bits)).floor_().add_(0.5).mul_(std::ldexp(1.0, -bits));
}

// exponential_: -log(1 - u) / lambda, never 0 (F.gumbel_softmax takes its log)
at::Tensor& exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "exponential_ expects a floating point tensor, got ", self.scalar_type());
  return self.copy_(OpenUniform(self).neg().log1p().neg().div(lambd));
}
// cauchy_: median + sigma * tan(pi (u - 1/2))
at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "cauchy_ expects a floating point tensor, got ", self.scalar_type());
  return self.copy_((OpenUniform(self).sub(0.5).mul(M_PI)).tan().mul(sigma).add(median));
}
// geometric_: the number of trials to the first success, ceil(log(u) / log(1 - p))
at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  return self.copy_(OpenUniform(self).log().div(std::log1p(-p)).ceil());
}
// log_normal_: exp of a normal draw
at::Tensor& log_normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "log_normal_ expects a floating point tensor, got ", self.scalar_type());
  const at::ScalarType ct = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return self.copy_(at::empty(self.sizes(), self.options().dtype(ct)).normal_(mean, std).exp());
}

// torch.normal with a tensor mean and/or std: N(0, 1) * std + mean, as the
// CPU computes it (normal_ refuses a non-float dtype); the result has mean's
// dtype (std's when mean is a number) and the broadcast shape of the two. A
// negative element of a std tensor is the CPU's error, checked inside the
// program.
void CheckStd(const at::Tensor& std) {
  TraceScope s;
  CheckNone(DeviceIndex(std), Val(std.lt(0).any()), runtime::ErrorKind::kValue,
            "normal expects all elements of std >= 0.0");
}

at::Tensor normal_tensor_float(const at::Tensor& mean, double std, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, mean);
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  return at::empty(mean.sizes(), mean.options()).normal_(0, std).add_(mean);
}

at::Tensor normal_float_tensor(double mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, std);
  CheckStd(std);
  return at::empty(std.sizes(), std.options()).normal_().mul_(std).add_(mean);
}

at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, mean);
  CheckStd(std);
  return at::empty(at::infer_size(mean.sizes(), std.sizes()), mean.options()).normal_().mul_(std).add_(mean);
}

// randperm: the order that sorts n random 64-bit keys (a repeated key, and
// so a bias, has odds of about n^2 / 2^65).
at::Tensor randperm(c10::SymInt sym_n, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                    std::optional<at::Device> device, std::optional<bool> pin_memory) {
  const int64_t n = sym_n.guard_int(__FILE__, __LINE__);
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  TORCH_CHECK(!layout || *layout == at::kStrided, "randperm on pjrt makes strided tensors only, got layout ", *layout);
  (void)pin_memory;
  const at::ScalarType t = dtype.value_or(at::kLong);
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool && !at::isComplexType(t), "\"randperm\" not implemented for '",
                              c10::toString(t), "'");
  // The CPU's limits: n - 1 within the integer type's range; for a float
  // type, n at most one more than the last of its consecutive integers.
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t, "randperm", [&] {
    using limits = std::numeric_limits<scalar_t>;
    const bool fits = limits::is_integer ? static_cast<double>(n) - 1 <= static_cast<double>(limits::max())
                                         : n <= (int64_t{1} << limits::digits) + 1;
    TORCH_CHECK(fits, "n is too large for result tensor type: '", c10::toString(t), "'");
  });
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(t).device(
                                      device.value_or(at::Device(c10::DeviceType::PrivateUse1))));
  if (n == 0) return out;
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  ir::Value keys = RandomBits(d, {ir::DType::U64, {n}});
  ir::Value order = b.Sort({keys, b.Iota({ir::DType::I64, {n}}, 0)}, 0, false).at(1);
  Assign(out, order);
  return out;
}

at::Tensor randperm_generator(c10::SymInt n, std::optional<at::Generator> gen, std::optional<at::ScalarType> dtype,
                              std::optional<at::Layout> layout, std::optional<at::Device> device,
                              std::optional<bool> pin_memory) {
  // The generator's device brings randperm(n, generator=g) here with the
  // CPU as the result's device (random_split's permutation).
  GeneratorScope scope(gen, device ? device->type() : c10::DeviceType::PrivateUse1);
  return randperm(std::move(n), dtype, layout, device, pin_memory);
}

// randperm(out=): the permutation in out's dtype, out resized to n
at::Tensor& randperm_generator_out(c10::SymInt n, std::optional<at::Generator> gen, at::Tensor& out) {
  at::Tensor r = randperm_generator(std::move(n), std::move(gen), out.scalar_type(), std::nullopt, out.device(),
                                    std::nullopt);
  at::native::resize_output(out, r.sizes());
  return out.copy_(r);
}

at::Tensor& randperm_out(c10::SymInt n, at::Tensor& out) {
  return randperm_generator_out(std::move(n), std::nullopt, out);
}

at::Tensor& bernoulli_float_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  CheckNotComplex(self.scalar_type(), "bernoulli_scalar_cpu_");
  GeneratorScope scope(gen, self);
  TORCH_CHECK(p >= 0 && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  ir::Value u = Uniform01(d, shape, at::kFloat);
  Assign(self, b.Compare(ir::CompareDir::LT, u, Number(d, p, at::kFloat, shape)));
  return self;
}

// The dtypes of the CPU's kernels for a tensor p: a floating p, a real result.
void CheckBernoulli(const at::Tensor& self, const at::Tensor& p) {
  CheckNotComplex(self.scalar_type(), "bernoulli_tensor_cpu_self_");
  CheckFloating(p.scalar_type(), "bernoulli_tensor_cpu_p_");
}

// p as float, with the CPU's check that every probability is in [0, 1]
// (NaN is not), raised when the program has run.
ir::Value Probabilities(int d, const at::Tensor& p) {
  ir::Builder& b = B(d);
  ir::Value v = Operand(p, d, at::kFloat);
  const std::vector<int64_t> dims = b.shape(v).dims;
  ir::Value in = b.Binary(ir::Op::And, b.Compare(ir::CompareDir::GE, v, Number(d, 0.0, at::kFloat, dims)),
                          b.Compare(ir::CompareDir::LE, v, Number(d, 1.0, at::kFloat, dims)));
  CheckNone(d, b.Unary(ir::Op::Not, in), runtime::ErrorKind::kValue, "bernoulli: every probability p must be in [0, 1]");
  return v;
}

at::Tensor& bernoulli_tensor_(at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  CheckBernoulli(self, p);
  GeneratorScope scope(gen, self);
  TraceScope s;
  const int d = CommonDevice({&self, &p});
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  ir::Value u = Uniform01(d, shape, at::kFloat);
  Assign(self, b.Compare(ir::CompareDir::LT, u, BroadcastTo(d, Probabilities(d, p), shape)));
  return self;
}

at::Tensor bernoulli(const at::Tensor& self, std::optional<at::Generator> gen) {
  CheckBernoulli(self, self);
  GeneratorScope scope(gen, self);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  ir::Value u = Uniform01(d, shape, at::kFloat);
  return Wrap(b.Convert(b.Compare(ir::CompareDir::LT, u, Probabilities(d, self)), ToIr(self.scalar_type())), d);
}

// random_(from, to) and randint: from + bits % range in 64-bit integers
// (range 0: all 2^64), converted to the tensor's dtype (the CPU takes 32
// random bits where the range fits them: the same distribution, but for its
// modulo bias). The bounds were checked as the CPU checks them.
at::Tensor& RandomFromTo(at::Tensor& self, uint64_t range, int64_t from) {
  if (self.numel() == 0) return self;
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  auto u64 = [&](uint64_t v) {  // exact, as a host-fed number (no recompile per bound)
    return b.Bitcast(Number(d, at::Scalar(static_cast<int64_t>(v)), at::kLong, shape), ir::DType::U64);
  };
  ir::Value r = RandomBits(d, {ir::DType::U64, shape});
  if (range != 0) r = b.Binary(Op::Rem, r, u64(range));
  if (from != 0) r = b.Binary(Op::Add, r, u64(static_cast<uint64_t>(from)));  // wraps, as the CPU's int64 sum
  Assign(self, b.Convert(b.Bitcast(r, ir::DType::I64), ToIr(self.scalar_type())));
  return self;
}

// The CPU's bounds (random_from_to_impl): for floating types the nearest
// bounds the type holds, each bound within the dtype, its messages.
at::Tensor& random_from_(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  namespace tm = at::native::templates;
  const at::ScalarType t = self.scalar_type();
  if (to) {  // [from, to)
    int64_t hi = *to;
    TORCH_CHECK(from < hi, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", hi);
    if (at::isFloatingType(t)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "random_update_from_to", [&] {
        from = tm::update_from<scalar_t>(from);
        hi = tm::update_to<scalar_t>(hi);
        TORCH_CHECK(from < hi, "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, but got from=",
                    from, " >= to=", hi);
      });
    }
    tm::check_from_to_in_range(from, hi - 1, self.dtype());
    return RandomFromTo(self, static_cast<uint64_t>(hi) - static_cast<uint64_t>(from), from);
  }
  if (from != std::numeric_limits<int64_t>::lowest()) {  // [from, the largest value of the dtype]
    int64_t to_inc = 0;
    if (at::isFloatingType(t)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "random_from_to_range_calc", [&] {
        constexpr int digits = std::numeric_limits<scalar_t>::digits;
        to_inc = digits >= 63 ? std::numeric_limits<int64_t>::max() : int64_t{1} << digits;
        from = tm::update_from<scalar_t>(from);
        TORCH_CHECK(from < to_inc, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to "
                    "dtype, but got from=", from, " > to_inc=", to_inc);
      });
    } else if (at::isIntegralType(t, /*includeBool=*/true)) {
      AT_DISPATCH_V2(t, "random_from_to_range_calc", AT_WRAP([&] {
        if constexpr (std::is_same_v<scalar_t, bool>) {
          to_inc = 1;
        } else {
          to_inc = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
        }
      }), AT_EXPAND(AT_INTEGRAL_TYPES_V2), at::kBool);
    } else {
      TORCH_CHECK(false, "random_from_to_impl handles only integral, floating-point and boolean types");
    }
    tm::check_from_to_in_range(from, to_inc, self.dtype());
    return RandomFromTo(self, static_cast<uint64_t>(to_inc) - static_cast<uint64_t>(from) + 1, from);
  }
  // all of int64
  TORCH_CHECK(t == at::kLong || t == at::kDouble || t == at::kFloat || t == at::kBFloat16,
              "random_full_64_bits_range_kernel_cpu handles only int64, double, float and bfloat16");
  return RandomFromTo(self, 0, 0);
}

// random_() without bounds, as the CPU: [0, 2^digits] for floating types
// (every integer they hold exactly), [0, max] for integers, 0 or 1 for bool.
at::Tensor& random_(at::Tensor& self, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  const at::ScalarType t = self.scalar_type();
  if (at::isFloatingType(t) && t != at::kDouble) {
    const int digits = t == at::kFloat ? std::numeric_limits<float>::digits : t == at::kHalf ? 11 : 8;  // bfloat16
    return RandomFromTo(self, (uint64_t{1} << digits) + 1, 0);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(t == at::kDouble || at::isIntegralType(t, /*includeBool=*/true),
                              "\"random_kernel_cpu\" not implemented for '", t, "'");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  if (t == at::kDouble) {
    // 53 random bits (a double uniform has 52: every draw was even); the
    // CPU's range also holds 2^53 itself, one chance in 2^53, never drawn here
    ir::Value r = b.Binary(Op::ShiftRightLogical, RandomBits(d, {ir::DType::U64, shape}), b.Full(ir::DType::U64, shape, 11));
    Assign(self, b.Convert(r, ir::DType::F64));
    return self;
  }
  const int64_t bits = t == at::kBool ? 1 : 8 * static_cast<int64_t>(c10::elementSize(t)) - (at::isSignedType(t) ? 1 : 0);
  ir::Value r = b.Binary(Op::ShiftRightLogical, RandomBits(d, {ir::DType::U64, shape}),
                         b.Full(ir::DType::U64, shape, static_cast<double>(64 - bits)));
  Assign(self, b.Convert(r, ToIr(t)));
  return self;
}

at::Tensor& random_to_(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from_(self, 0, to, std::move(gen));
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  TraceScope s;
  const int d = DeviceIndex(input);
  ir::Builder& b = B(d);
  const auto shape = input.sizes().vec();
  const at::ScalarType t = input.scalar_type();
  if (train.has_value() && !*train) {
    return {Wrap(Val(input), d), Wrap(Fill(d, 1, at::kBool, shape), d)};
  }
  // The CPU scales by a float number in place: an integer input is its error
  TORCH_CHECK(input.numel() == 0 || at::isFloatingType(t) || at::isComplexType(t),
              "result type Float can't be cast to the desired output type ", t);
  // and draws its mask in the input's dtype, which bernoulli_ refuses for complex
  TORCH_CHECK_NOT_IMPLEMENTED(input.numel() == 0 || !at::isComplexType(t) || p <= 0 || p >= 1,
                              "\"bernoulli_scalar_cpu_\" not implemented for '", t, "'");
  ir::Value keep = b.Compare(ir::CompareDir::GE, Uniform01(d, shape, at::kFloat), Number(d, p, at::kFloat, shape));
  // input.mul(mask).mul_(scale), as the CPU: a dropped NaN or inf stays NaN,
  // a dropped -x is -0.0; the scale (0 for p = 1) multiplies in the opmath
  // type and rounds once, as mul_ by a number does
  const at::ScalarType ct = OpMath(t);
  ir::Value masked = b.Binary(Op::Mul, Val(input), b.Select(keep, Fill(d, 1, t, shape), Fill(d, 0, t, shape)));
  ir::Value scaled = b.Binary(Op::Mul, b.Convert(masked, ToIr(ct)), Number(d, p == 1 ? 0.0 : 1.0 / (1.0 - p), ct, shape));
  return {Wrap(b.Convert(scaled, ToIr(t)), d), Wrap(keep, d)};
}

at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  TraceScope s;
  const int d = CommonDevice({&grad, &mask});
  ir::Builder& b = B(d);
  const auto shape = grad.sizes().vec();
  const at::ScalarType t = at::result_type(grad, scale);  // grad * mask * scale promotes like eager
  // a multiply, not a select: NaN * 0 is NaN and -g * 0 is -0.0, as on the CPU
  ir::Value masked = b.Binary(Op::Mul, ValAs(grad, t), ValAs(mask, t));
  return Wrap(b.Binary(Op::Mul, masked, Number(d, scale, t, shape)), d);
}

// multinomial: num_samples draws per row of (unnormalized) probabilities,
// as torch.multinomial. Without replacement (and for one draw), the top
// num_samples of log(p) + Gumbel noise (a category of probability 0 is never
// drawn); with replacement, inverse CDF sampling of independent uniforms.
// The CPU's checks (finite, non-negative, positive sum) are compiled into
// the program.
at::Tensor multinomial(const at::Tensor& self, int64_t num_samples, bool replacement, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  TORCH_CHECK(num_samples > 0, "cannot sample n_sample <= 0 samples");
  const int64_t k = self.size(-1);
  TORCH_CHECK(k > 0, "cannot sample from an empty distribution");
  TORCH_CHECK(replacement || num_samples <= k, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  at::Tensor p = (self.dim() == 1 ? self.unsqueeze(0) : self).to(self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  const int64_t rows = p.size(0);
  at::Tensor bad = at::logical_not(at::isfinite(p)).logical_or(p.lt(0)).any();
  at::Tensor empty = p.sum(-1).le(0).any().logical_and(bad.logical_not());  // the first check's error wins
  {
    TraceScope s;
    const int d = DeviceIndex(self);
    CheckNone(d, Val(bad), runtime::ErrorKind::kValue, "probability tensor contains either `inf`, `nan` or element < 0");
    CheckNone(d, Val(empty), runtime::ErrorKind::kValue, "invalid multinomial distribution (sum of probabilities <= 0)");
  }
  at::Tensor out;
  if (!replacement || num_samples == 1) {
    at::Tensor u = at::rand({rows, k}, p.options()).clamp_min(std::numeric_limits<float>::min());
    at::Tensor keys = p.log() - u.log().neg().log();
    out = std::get<1>(keys.topk(num_samples, -1));
  } else {
    at::Tensor cdf = p.cumsum(-1);
    cdf = cdf / cdf.narrow(-1, k - 1, 1);
    at::Tensor u = at::rand({rows, num_samples}, p.options());
    out = cdf.unsqueeze(1).le(u.unsqueeze(-1)).sum(-1).clamp_max(k - 1);
  }
  return self.dim() == 1 ? out.squeeze(0) : out;
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("uniform_", uniform_);
  K("exponential_", exponential_);
  K("cauchy_", cauchy_);
  K("geometric_", geometric_);
  K("log_normal_", log_normal_);
  K("normal_", normal_);
  K("normal.Tensor_float", normal_tensor_float);
  K("normal.float_Tensor", normal_float_tensor);
  K("normal.Tensor_Tensor", normal_tensor_tensor);
  K("randperm", randperm);
  K("randperm.generator", randperm_generator);
  K("randperm.out", randperm_out);
  K("randperm.generator_out", randperm_generator_out);
  K("bernoulli_.float", bernoulli_float_);
  K("bernoulli_.Tensor", bernoulli_tensor_);
  K("bernoulli", bernoulli);
  K("random_", random_);
  K("random_.from", random_from_);
  K("random_.to", random_to_);
  TPJ_LAID(m, "native_dropout", kOperands, native_dropout);
  TPJ_LAID(m, "native_dropout_backward", kOperands, native_dropout_backward);
  K("multinomial", multinomial);
}
