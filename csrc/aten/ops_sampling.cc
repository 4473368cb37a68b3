// Samplers of torch.distributions that the CPU runs as per-element loops:
// _standard_gamma (Gamma, Chi2, StudentT, Beta), its reparameterized
// gradient _standard_gamma_grad, _sample_dirichlet (Dirichlet, Beta),
// _dirichlet_grad, poisson and binomial. They draw from the device's generator
// (ops_random.cc), so their numbers differ from the CPU's, not their
// distribution.
//
// The CPU's samplers are rejection loops with no bound on the number of
// tries. Here every element draws a fixed number of tries at once, along a
// trailing dimension (one batch of elementwise ops, not an unrolled loop:
// XLA compiles it in about a second), keeps its first accepted one, and an
// element that accepted none raises (a compiled check) instead of returning
// a biased value. The tries are chosen so that this happens with
// probability below 1e-15 per element (each try accepts with probability
// >= 0.95 for gamma, >= 0.75 for Poisson's transformed rejection, >= 0.71
// for binomial's, measured; the product method for small Poisson rates, and
// binomial's inversion, stop within 48 steps except with probability 4e-17
// at a mean of 10). The draws take that many times the result's memory
// while the program runs.
//
// The samplers' math runs in float64 for float64 tensors, float32 otherwise
// (the CPU runs them in float64 for every dtype: the draws differ by
// rounding, not in distribution). The two gradients run in float64 for
// every dtype, as the CPU: Rice's expansion near the mean cancels to a few
// percent in float32.
#include <cmath>
#include <cstring>
#include <limits>

#include "aten/generator.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

constexpr int kGammaTries = 12;  // draws per element, see above
constexpr int kPoissonTries = 25;
constexpr int kPoissonFactors = 48;  // also binomial's geometric jumps
constexpr int kBinomialTries = 28;

at::ScalarType MathType(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

void Raise(const at::Tensor& bad, const std::string& message) {
  TraceScope s;
  CheckNone(DeviceIndex(bad), Val(bad.any()), runtime::ErrorKind::kValue, message);
}

// `n` draws per element of `like` along a new last dimension.
at::Tensor Tries(const at::Tensor& like, int n, bool normal = false) {
  std::vector<int64_t> sizes = like.sizes().vec();
  sizes.push_back(n);
  return normal ? at::randn(sizes, like.options()) : at::rand(sizes, like.options());
}

// (the value of the first accepted try along the last dimension (0 where
// none was), whether one was).
std::pair<at::Tensor, at::Tensor> FirstAccepted(const at::Tensor& ok, const at::Tensor& value) {
  const int64_t n = ok.size(-1);
  at::Tensor index = at::arange(n, ok.options().dtype(at::kInt));
  at::Tensor first = at::where(ok, index, n).amin(-1, true);
  at::Tensor picked = at::where(index.eq(first), value, at::zeros_like(value)).sum(-1);
  return {picked, first.squeeze(-1).lt(n)};
}

// log of a Gamma(alpha, 1) draw per element of alpha (of the math type):
// Marsaglia and Tsang's method, as the CPU's sample_gamma, on alpha + 1
// with the boost u^(1/alpha) for alpha < 1. In logs so that a Dirichlet of
// small concentrations keeps the ratios of draws that underflow.
at::Tensor LogGamma(const at::Tensor& alpha) {
  at::Tensor small = alpha.lt(1);
  at::Tensor log_boost = at::where(small, at::log1p(-at::rand_like(alpha)) / alpha, at::zeros_like(alpha));
  at::Tensor a = at::where(small, alpha + 1, alpha);
  at::Tensor d = (a - 1.0 / 3.0).unsqueeze(-1);
  at::Tensor c = at::rsqrt(d * 9);
  at::Tensor x = Tries(alpha, kGammaTries, /*normal=*/true);
  at::Tensor y = x * c + 1;
  at::Tensor u = 1 - Tries(alpha, kGammaTries);
  at::Tensor v = y * y * y;
  at::Tensor xx = x * x;
  at::Tensor ok = y.gt(0).logical_and(
      u.lt(1 - 0.0331 * xx * xx).logical_or(at::log(u).lt(xx * 0.5 + d * (1 - v + at::log(v)))));
  auto [value, accepted] = FirstAccepted(ok, at::log(d * v));
  at::Tensor done = accepted.logical_or(at::isnan(alpha));  // NaN stays NaN (the CPU's loop never ends)
  Raise(done.logical_not(), "_standard_gamma on pjrt: the sampler accepted none of its " +
                                std::to_string(kGammaTries) +
                                " tries for some element (its concentration must be > 0)");
  value = at::where(at::isnan(alpha), alpha, value + log_boost);
  // alpha == 0 is 0 on the CPU (then raised to the smallest normal number)
  return at::where(alpha.eq(0), at::full_like(alpha, -INFINITY), value);
}

// The smallest positive normal number of float type t.
double SmallestNormal(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::numeric_limits<double>::min();
    case at::kHalf: return static_cast<double>(std::numeric_limits<c10::Half>::min());
    case at::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::min());
    default: return static_cast<double>(std::numeric_limits<float>::min());
  }
}

at::Tensor standard_gamma(const at::Tensor& self, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "\"gamma_cpu\" not implemented for '",
              c10::toString(self.scalar_type()), "'");
  at::Tensor g = at::exp(LogGamma(self.to(MathType(self)))).to(self.scalar_type());
  return at::clamp_min(g, SmallestNormal(g.scalar_type()));  // never 0, as the CPU
}

// d(sample)/d(alpha) of a Gamma(alpha, 1) sample x, by the CPU's
// standard_gamma_grad_one: a Taylor series below x = 0.8, Rice's saddle
// point expansion for alpha > 8, a bivariate rational approximation
// otherwise. Every branch is computed and the CPU's choice selected.
at::Tensor standard_gamma_grad(const at::Tensor& self, const at::Tensor& output) {
  const at::ScalarType rt = at::result_type(self, output);
  TORCH_CHECK(at::isFloatingType(rt), "_standard_gamma_grad expects floating point tensors, got ", rt);
  at::Tensor alpha = self.to(at::kDouble), x = output.to(at::kDouble);
  // Taylor series in x
  at::Tensor numer = at::ones_like(x), denom = alpha.clone();
  at::Tensor series1 = numer / denom, series2 = numer / (denom * denom);
  for (int i = 1; i <= 5; ++i) {
    numer = numer * (-x / i);
    denom = denom + 1;
    series1 = series1 + numer / denom;
    series2 = series2 + numer / (denom * denom);
  }
  at::Tensor pow_x_alpha = at::pow(x, alpha);
  at::Tensor pdf = at::pow(x, alpha - 1) * at::exp(-x);
  at::Tensor cdf_alpha = (at::log(x) - at::digamma(alpha)) * (pow_x_alpha * series1) - pow_x_alpha * series2;
  at::Tensor taylor = -cdf_alpha / pdf;
  taylor = at::where(at::isnan(taylor), at::zeros_like(taylor), taylor);
  // Rice saddle point, near the mean and away from it
  at::Tensor near = (1 + 24 * alpha * (1 + 12 * alpha)) *
                    (1440 * alpha * alpha + 6 * x * (53 - 120 * x) - 65 * x * x / alpha + alpha * (107 + 3600 * x)) /
                    (1244160 * (alpha * alpha) * (alpha * alpha));
  at::Tensor sq = at::sqrt(8 * alpha);
  at::Tensor term2 = sq / (alpha - x);
  at::Tensor term3 = at::pow(x - alpha - alpha * at::log(x / alpha), -1.5);
  at::Tensor term23 = at::where(x.lt(alpha), term2 - term3, term2 + term3);
  at::Tensor term1 = at::log(x / alpha) * term23 - at::sqrt(2 / alpha) * (alpha + x) / ((alpha - x) * (alpha - x));
  at::Tensor stirling = 1 + 1 / (12 * alpha) * (1 + 1 / (24 * alpha));
  at::Tensor far = -stirling * (x * term1) / sq;
  at::Tensor rice = at::where(x.ge(0.9 * alpha).logical_and(x.le(1.1 * alpha)), near, far);
  // rational approximation in u = log(x / alpha), v = log(alpha)
  static const double coef[3][8] = {
      {0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084},
      {0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623},
      {0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367,
       -1.5247877e-07},
  };
  at::Tensor u = at::log(x / alpha), v = at::log(alpha);
  auto cv = [&](int i) { return coef[0][i] + u * (coef[1][i] + u * coef[2][i]); };
  at::Tensor p = cv(0) + v * (cv(1) + v * (cv(2) + v * cv(3)));
  at::Tensor q = cv(4) + v * (cv(5) + v * (cv(6) + v * cv(7)));
  at::Tensor rational = at::exp(p / q);
  at::Tensor r = at::where(x.lt(0.8), taylor, at::where(alpha.gt(8), rice, rational));
  return r.to(rt);
}

at::Tensor sample_dirichlet(const at::Tensor& alpha, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, alpha);
  TORCH_CHECK(at::isFloatingType(alpha.scalar_type()), "\"dirichlet\" not implemented for '",
              c10::toString(alpha.scalar_type()), "'");
  TORCH_CHECK(alpha.dim() >= 1, "_sample_dirichlet expects a tensor of at least one dimension");
  // Gamma draws normalized along the last dimension: a softmax of their
  // logs (each raised to float64's smallest normal number first, as the
  // CPU), then kept inside (0, 1) as the CPU does.
  at::Tensor logs = at::clamp_min(LogGamma(alpha.to(MathType(alpha))), std::log(std::numeric_limits<double>::min()));
  const at::ScalarType t = alpha.scalar_type();
  const double below_one = 1.0 - std::ldexp(1.0, -(t == at::kDouble  ? 53
                                                   : t == at::kFloat ? 24
                                                   : t == at::kHalf  ? 11
                                                                     : 8));
  return at::clamp(at::softmax(logs, -1).to(t), SmallestNormal(t), below_one);
}

// The scaled reparameterized gradient of a Beta(alpha, total - alpha) sample
// x, by the CPU's dirichlet_grad_one: Taylor expansions near x = 0 and x = 1,
// Rice's expansion when both parameters exceed 6, else a rational
// correction of an analytic approximation.
at::Tensor BetaGradAlphaSmall(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& beta) {
  at::Tensor factor = at::digamma(alpha) - at::digamma(alpha + beta) - at::log(x);
  at::Tensor numer = at::ones_like(x);
  at::Tensor series = numer / alpha * (factor + 1 / alpha);
  for (int i = 1; i <= 10; ++i) {
    numer = numer * ((i - beta) * x / i);
    at::Tensor denom = alpha + i;
    series = series + numer / denom * (factor + 1 / denom);
  }
  at::Tensor r = x * at::pow(1 - x, -beta) * series;
  return at::where(at::isnan(r), at::zeros_like(r), r);
}

at::Tensor BetaGradBetaSmall(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& beta) {
  at::Tensor factor = at::digamma(alpha + beta) - at::digamma(beta);
  at::Tensor numer = at::ones_like(x), betas = at::ones_like(x), dbetas = at::zeros_like(x);
  at::Tensor series = factor / alpha;
  for (int i = 1; i <= 8; ++i) {
    numer = numer * (-x / i);
    dbetas = dbetas * (beta - i) + betas;
    betas = betas * (beta - i);
    series = series + numer / (alpha + i) * (dbetas + factor * betas);
  }
  at::Tensor r = -at::pow(1 - x, 1 - beta) * series;
  return at::where(at::isnan(r), at::zeros_like(r), r);
}

at::Tensor BetaGradAlphaMid(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& beta) {
  at::Tensor total = alpha + beta;
  at::Tensor mean = alpha / total;
  at::Tensor std = at::sqrt(alpha * beta / (total + 1)) / total;
  at::Tensor b2 = beta * beta;
  at::Tensor poly =
      47 * x * b2 * b2 +
      alpha * ((43 + 20 * (16 + 27 * beta) * x) * b2 * beta +
               alpha * (3 * (59 + 180 * beta - 90 * x) * b2 +
                        alpha * ((453 + 1620 * beta * (1 - x) - 455 * x) * beta + alpha * (8 * (1 - x) * (135 * beta - 11)))));
  at::Tensor prefactor_num = (1 + 12 * alpha) * (1 + 12 * beta) / (total * total);
  at::Tensor prefactor_den = 12960 * alpha * alpha * alpha * beta * beta * (1 + 12 * total);
  at::Tensor near = prefactor_num / (1 - x) * poly / prefactor_den;
  at::Tensor prefactor = -x / at::sqrt(2 * alpha * beta / total);
  auto st = [](const at::Tensor& a) { return 1 + 1 / (12 * a) + 1 / (288 * a * a); };
  at::Tensor stirling = st(alpha) * st(beta) / st(total);
  at::Tensor term1_num = 2 * (alpha * alpha) * (x - 1) + alpha * beta * (x - 1) - x * b2;
  at::Tensor axbx = alpha * (x - 1) + beta * x;
  at::Tensor term1 = term1_num / (at::sqrt(2 * alpha / beta) * at::pow(total, 1.5) * axbx * axbx);
  at::Tensor term2 = 0.5 * at::log(alpha / (total * x));
  at::Tensor term3 = at::sqrt(8 * alpha * beta / total) / (beta * x + alpha * (x - 1));
  at::Tensor term4 = at::pow(beta * at::log(beta / (total * (1 - x))) + alpha * at::log(alpha / (total * x)), -1.5);
  at::Tensor far = stirling * prefactor * (term1 + term2 * (term3 + at::where(x.lt(mean), term4, -term4)));
  return at::where(x.ge(mean - 0.1 * std).logical_and(x.le(mean + 0.1 * std)), near, far);
}

at::Tensor dirichlet_grad(const at::Tensor& x_in, const at::Tensor& alpha_in, const at::Tensor& total_in) {
  TORCH_CHECK(x_in.sizes() == alpha_in.sizes() && x_in.sizes() == total_in.sizes(),
              "_dirichlet_grad expects x, alpha and total of one shape, got ", x_in.sizes(), ", ", alpha_in.sizes(),
              " and ", total_in.sizes());
  const at::ScalarType rt = x_in.scalar_type();
  TORCH_CHECK(at::isFloatingType(rt), "_dirichlet_grad expects floating point tensors, got ", rt);
  at::Tensor x = x_in.to(at::kDouble), alpha = alpha_in.to(at::kDouble), total = total_in.to(at::kDouble);
  at::Tensor beta = total - alpha;
  at::Tensor boundary = total * x * (1 - x);
  static const double c[2][3][3][4] = {
      {{{1.003668233, -0.01061107488, -0.0657888334, 0.01201642863},
        {0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033},
        {-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013}},
       {{0.221950385, -0.3187676331, 0.01799915743, 0.01074823814},
        {-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057},
        {0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05}},
       {{-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565},
        {0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181},
        {0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05}}},
      {{{1, -0.02924021934, -0.04438342661, 0.007285809825},
        {0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521},
        {-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149}},
       {{0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273},
        {0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956},
        {-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05}},
       {{0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05},
        {0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05},
        {-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06}}},
  };
  at::Tensor u = at::log(x);
  at::Tensor a = at::log(alpha) - u;
  at::Tensor b = at::log(total) - a;
  const at::Tensor pow_u[3] = {at::ones_like(x), u, u * u};
  const at::Tensor pow_a[3] = {at::ones_like(x), a, a * a};
  at::Tensor p = at::zeros_like(x), q = at::zeros_like(x);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      at::Tensor ua = pow_u[i] * pow_a[j];
      const double* cp = c[0][i][j];
      const double* cq = c[1][i][j];
      p = p + ua * (cp[0] + b * (cp[1] + b * (cp[2] + b * cp[3])));
      q = q + ua * (cq[0] + b * (cq[1] + b * (cq[2] + b * cq[3])));
    }
  }
  at::Tensor rational = p / q * (x * (at::digamma(total) - at::digamma(alpha)) / beta);
  at::Tensor r = at::where(alpha.gt(6).logical_and(beta.gt(6)), BetaGradAlphaMid(x, alpha, beta), rational);
  r = at::where(x.ge(0.5).logical_and(boundary.lt(0.75)), -BetaGradBetaSmall(1 - x, beta, alpha), r);
  r = at::where(x.le(0.5).logical_and(boundary.lt(2.5)), BetaGradAlphaSmall(x, alpha, beta), r);
  return r.to(rt);
}

// poisson as the CPU's sample_poisson: rates >= 10 by Hoermann's
// transformed rejection (PTRS), smaller ones by counting the factors of a
// product of uniform numbers that stay above exp(-rate).
at::Tensor poisson(const at::Tensor& self, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, self);
  CheckFloating(self.scalar_type(), "poisson_cpu");
  at::Tensor lam = self.to(MathType(self));
  at::Tensor invalid = lam.ge(0).logical_not();  // negative or NaN
  Raise(invalid, "invalid Poisson rate, expected rate to be non-negative");
  // product method, in logs: the partial sums of log(u) that stay above -rate
  at::Tensor sums = at::cumsum(at::log(Tries(lam, kPoissonFactors)), -1);
  at::Tensor count = sums.gt(-lam.unsqueeze(-1)).sum(-1).to(lam.scalar_type());
  at::Tensor small = lam.lt(10);
  Raise(small.logical_and(sums.select(-1, kPoissonFactors - 1).gt(-lam)),
        "poisson on pjrt: a draw for a rate below 10 needed more than " + std::to_string(kPoissonFactors) +
            " factors");
  // transformed rejection
  at::Tensor big = at::where(small, at::full_like(lam, 10), lam).unsqueeze(-1);  // keeps the unused branch finite
  at::Tensor slam = at::sqrt(big), loglam = at::log(big);
  at::Tensor b = 0.931 + 2.53 * slam;
  at::Tensor a = -0.059 + 0.02483 * b;
  at::Tensor invalpha = 1.1239 + 1.1328 / (b - 3.4);
  at::Tensor vr = 0.9277 - 3.6224 / (b - 2);
  at::Tensor u = Tries(lam, kPoissonTries) - 0.5;
  at::Tensor v = Tries(lam, kPoissonTries);
  at::Tensor us = 0.5 - at::abs(u);
  at::Tensor k = at::floor((2 * a / us + b) * u + big + 0.43);
  at::Tensor quick = us.ge(0.07).logical_and(v.le(vr));
  at::Tensor skip = k.lt(0).logical_or(us.lt(0.013).logical_and(v.gt(us)));
  at::Tensor exact = (at::log(v) + at::log(invalpha) - at::log(a / (us * us) + b))
                         .le(-big + k * loglam - at::lgamma(k + 1));
  auto [value, accepted] = FirstAccepted(quick.logical_or(skip.logical_not().logical_and(exact)), k);
  // only the first check raises for an invalid rate
  Raise(accepted.logical_or(small).logical_or(invalid).logical_not(),
        "poisson on pjrt: the sampler accepted none of its " + std::to_string(kPoissonTries) +
            " tries for some element");
  return at::where(small, count, value).to(self.scalar_type());
}

// `values` as a constant of the program, of like's (float) dtype and device.
template <size_t N>
at::Tensor Table(const at::Tensor& like, const double (&values)[N]) {
  TraceScope s;
  const int d = DeviceIndex(like);
  std::vector<uint8_t> bytes;
  if (like.scalar_type() == at::kDouble) {
    bytes.resize(sizeof(values));
    std::memcpy(bytes.data(), values, bytes.size());
  } else {
    float f[N];
    for (size_t i = 0; i < N; ++i) f[i] = static_cast<float>(values[i]);
    bytes.resize(sizeof(f));
    std::memcpy(bytes.data(), f, bytes.size());
  }
  const ir::DType t = like.scalar_type() == at::kDouble ? ir::DType::F64 : ir::DType::F32;
  return Wrap(B(d).Constant({t, {static_cast<int64_t>(N)}}, std::move(bytes)), d);
}

// binomial as the CPU's sample_binomial: on q = min(p, 1 - p), counting
// geometric jumps (inversion) while count * q < 10, else Hoermann's BTRS
// transformed rejection; for p > 1/2 the count minus the draw.
at::Tensor StirlingTail(const at::Tensor& k) {
  static const double table[] = {0.0810614667953272,  0.0413406959554092,  0.0276779256849983, 0.02079067210376509,
                                 0.0166446911898211,  0.0138761288230707,  0.0118967099458917, 0.0104112652619720,
                                 0.00925546218271273, 0.00833056343336287};
  at::Tensor kp1sq = (k + 1) * (k + 1);
  at::Tensor r = (1.0 / 12 - (1.0 / 360 - 1.0 / 1260 / kp1sq) / kp1sq) / (k + 1);
  at::Tensor looked_up = Table(k, table).take(k.clamp(0, 9).to(at::kLong));
  return at::where(k.lt(10), looked_up, r);
}

at::Tensor binomial(const at::Tensor& count, const at::Tensor& prob, std::optional<at::Generator> gen) {
  GeneratorScope scope(gen, count);
  TORCH_CHECK(at::isFloatingType(count.scalar_type()), "\"binomial_cpu\" not implemented for '",
              c10::toString(count.scalar_type()), "'");
  const at::ScalarType mt = MathType(count);
  // count and prob broadcast together, as the CPU's iterator does them (it
  // also warns that its output was resized where count is the smaller)
  const std::vector<int64_t> shape = at::infer_size(count.sizes(), prob.sizes());
  at::Tensor n = count.to(mt).expand(shape);
  at::Tensor p = prob.to(mt).expand(shape);
  at::Tensor flip = p.gt(0.5);
  at::Tensor q = at::where(flip, 1 - p, p);
  at::Tensor valid = n.gt(0).logical_and(p.gt(0)).logical_and(p.lt(1));
  at::Tensor use_btrs = (n * q).ge(10);
  // inversion: the geometric jumps that stay within the count
  at::Tensor jumps = at::cumsum(at::ceil(at::log(Tries(n, kPoissonFactors)) / at::log1p(-q).unsqueeze(-1)), -1);
  at::Tensor inverted = jumps.le(n.unsqueeze(-1)).sum(-1).to(mt);
  Raise(valid.logical_and(use_btrs.logical_not()).logical_and(jumps.select(-1, kPoissonFactors - 1).le(n)),
        "binomial on pjrt: a draw with count * min(p, 1 - p) below 10 needed more than " +
            std::to_string(kPoissonFactors) + " jumps");
  // BTRS, on parameters that keep the unused elements finite
  at::Tensor bn = at::where(use_btrs, n, at::full_like(n, 100)).unsqueeze(-1);
  at::Tensor bq = at::where(use_btrs, q, at::full_like(q, 0.5)).unsqueeze(-1);
  at::Tensor stddev = at::sqrt(bn * bq * (1 - bq));
  at::Tensor b = 1.15 + 2.53 * stddev;
  at::Tensor a = -0.0873 + 0.0248 * b + 0.01 * bq;
  at::Tensor c = bn * bq + 0.5;
  at::Tensor v_r = 0.92 - 4.2 / b;
  at::Tensor r = bq / (1 - bq);
  at::Tensor alpha = (2.83 + 5.1 / b) * stddev;
  at::Tensor m = at::floor((bn + 1) * bq);
  at::Tensor fixed = (m + 0.5) * at::log((m + 1) / (r * (bn - m + 1))) + StirlingTail(m) + StirlingTail(bn - m);
  at::Tensor u = Tries(n, kBinomialTries) - 0.5;
  at::Tensor v = Tries(n, kBinomialTries);
  at::Tensor us = 0.5 - at::abs(u);
  at::Tensor k = at::floor((2 * a / us + b) * u + c);
  at::Tensor inside = k.ge(0).logical_and(k.le(bn));
  at::Tensor quick = us.ge(0.07).logical_and(v.le(v_r));
  at::Tensor bound = fixed + (bn + 1) * at::log((bn - m + 1) / (bn - k + 1)) +
                     (k + 0.5) * at::log(r * (bn - k + 1) / (k + 1)) - StirlingTail(k) - StirlingTail(bn - k);
  auto [drawn, accepted] =
      FirstAccepted(inside.logical_and(quick.logical_or(at::log(v * alpha / (a / (us * us) + b)).le(bound))), k);
  Raise(accepted.logical_or(valid.logical_and(use_btrs).logical_not()).logical_not(),
        "binomial on pjrt: the sampler accepted none of its " + std::to_string(kBinomialTries) +
            " tries for some element");
  at::Tensor x = at::where(use_btrs, drawn, inverted);
  x = at::where(flip, n - x, x);
  x = at::where(valid, x, at::where(n.le(0).logical_or(p.le(0)), at::zeros_like(n), n));
  return at::where(at::isnan(p), p, x).to(count.scalar_type());
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_standard_gamma", standard_gamma);
  K("_standard_gamma_grad", standard_gamma_grad);
  K("_sample_dirichlet", sample_dirichlet);
  K("_dirichlet_grad", dirichlet_grad);
  K("poisson", poisson);
  K("binomial", binomial);
}
