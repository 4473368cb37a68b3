// Reductions and matrix products: sum/mean/max/min/aminmax/argmax/any/all/
// norm/var/prod/nansum/trace/equal, cumulative sums and products, softmax and
// log-softmax with their backward formulas, mm/bmm/addmm/baddbmm/dot/vdot/mv,
// the 3-vector cross product.
#include <ATen/AccumulateType.h>

#include <cmath>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;
using ir::ReduceKind;

std::vector<int64_t> ReduceDims(at::OptionalIntArrayRef dims, int64_t rank) {
  std::vector<int64_t> out;
  if (!dims || dims->empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : *dims) {
    const int64_t w = WrapDim(d, rank);
    if (rank == 0) continue;
    TORCH_CHECK(std::find(out.begin(), out.end(), w) == out.end(), "dim ", w, " appears multiple times in the list of dims");
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The start of a sum, product, or, and reduction.
double InitFor(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: case ReduceKind::Or: return 0;
    case ReduceKind::Prod: case ReduceKind::And: return 1;
    case ReduceKind::Max: case ReduceKind::Min: break;  // ExtremeConst
  }
  return 0;
}

// Reduces `x` (shape `shape`, dtype t) over dims; keepdim reshapes back.
ir::Value ReduceValue(int d, ir::Value x, const std::vector<int64_t>& shape, const std::vector<int64_t>& dims,
                      ReduceKind kind, at::ScalarType t, bool keepdim) {
  ir::Builder& b = B(d);
  ir::Value init = kind == ReduceKind::Max || kind == ReduceKind::Min
                       ? ExtremeConst(d, t, /*lowest=*/kind == ReduceKind::Max)
                       : b.ScalarConstant(ToIr(t), InitFor(kind));
  ir::Value r = b.Reduce(x, init, dims, kind);
  if (kind == ReduceKind::Sum) {
    int64_t count = 1;
    for (int64_t dim : dims) count *= shape[dim];
    if (count == 1) r = PlusZero(d, r);
  }
  if (keepdim) {
    std::vector<int64_t> kept = shape;
    for (int64_t dim : dims) kept[dim] = 1;
    r = b.Reshape(r, kept);
  }
  return r;
}

// max/min over `dims` as PyTorch defines them: a NaN anywhere gives NaN.
// StableHLO's reduce(maximum) leaves NaN to the backend (the XLA CPU plugin
// drops it), so float types reduce an any-NaN flag alongside. The sign of a
// +0.0/-0.0 tie is the backend's: the CPU's own answer changes with its
// vector width (docs/semantics.md).
ir::Value ReduceExtreme(int d, ir::Value x, const std::vector<int64_t>& shape, const std::vector<int64_t>& dims,
                        ReduceKind kind, at::ScalarType t, bool keepdim) {
  ir::Value m = ReduceValue(d, x, shape, dims, kind, t, keepdim);
  if (!at::isFloatingType(t)) return m;
  ir::Builder& b = B(d);
  ir::Value any_nan = ReduceValue(d, IsNan(d, x), shape, dims, ReduceKind::Or, at::kBool, keepdim);
  return b.Select(any_nan, Fill(d, NAN, t, b.shape(m).dims), m);
}

at::ScalarType SumType(const at::Tensor& a, std::optional<at::ScalarType> dtype) {
  if (dtype) return *dtype;
  return at::isIntegralType(a.scalar_type(), true) ? at::kLong : a.scalar_type();
}

at::Tensor sum_dim(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = SumType(a, dtype);
  const auto shape = a.sizes().vec();
  return Wrap(ReduceValue(d, ValAs(a, t), shape, ReduceDims(dim, a.dim()), ReduceKind::Sum, t, keepdim), d);
}
at::Tensor sum_all(const at::Tensor& a, std::optional<at::ScalarType> dtype) { return sum_dim(a, std::nullopt, false, dtype); }

int64_t Count(const at::Tensor& a, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t dim : dims) n *= a.dim() == 0 ? 1 : a.size(dim);
  return n;
}

at::Tensor mean_dim(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  const at::ScalarType t = dtype.value_or(a.scalar_type());
  TORCH_CHECK(at::isFloatingType(t) || at::isComplexType(t),
              "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: ",
              t);
  TraceScope s;
  const int d = DeviceIndex(a);
  const auto dims = ReduceDims(dim, a.dim());
  ir::Value mean = MeanOf(d, ValAs(a, t), dims, static_cast<double>(Count(a, dims)));  // half types in float
  if (keepdim) {
    std::vector<int64_t> kept = a.sizes().vec();
    for (int64_t dim : dims) kept[dim] = 1;
    mean = B(d).Reshape(mean, kept);
  }
  return Wrap(mean, d);
}
at::Tensor mean_all(const at::Tensor& a, std::optional<at::ScalarType> dtype) { return mean_dim(a, std::nullopt, false, dtype); }

// `op` names the op in the CPU's errors: "amax()" or "amin()" by default.
at::Tensor Extreme(const at::Tensor& a, at::IntArrayRef dim, bool keepdim, ReduceKind k, const char* op = nullptr) {
  const char* name = op ? op : k == ReduceKind::Max ? "amax()" : "amin()";
  TORCH_CHECK(!dim.empty() || a.numel() > 0, name, ": Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  TraceScope s;
  const int d = DeviceIndex(a);
  const auto dims = ReduceDims(dim, a.dim());
  for (int64_t x : dims) {
    TORCH_CHECK_INDEX(a.dim() == 0 || a.size(x) > 0, name, ": Expected reduction dim ", x, " to have non-zero size.");
  }
  return Wrap(ReduceExtreme(d, Val(a), a.sizes().vec(), dims, k, a.scalar_type(), keepdim), d);
}
at::Tensor amax(const at::Tensor& a, at::IntArrayRef dim, bool keepdim) { return Extreme(a, dim, keepdim, ReduceKind::Max); }
at::Tensor amin(const at::Tensor& a, at::IntArrayRef dim, bool keepdim) { return Extreme(a, dim, keepdim, ReduceKind::Min); }
// aminmax: (amin, amax) in one op (quantization observers); all dims when
// dim is None.
std::tuple<at::Tensor, at::Tensor> aminmax(const at::Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  TORCH_CHECK(a.numel() > 0 || dim, "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
              "identity.");
  const std::vector<int64_t> dims = dim ? std::vector<int64_t>{*dim} : std::vector<int64_t>{};
  return {Extreme(a, dims, keepdim, ReduceKind::Min, "aminmax"), Extreme(a, dims, keepdim, ReduceKind::Max, "aminmax")};
}

// prod (integers multiply in int64, as sum)
at::Tensor prod_dim(const at::Tensor& a, int64_t dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = SumType(a, dtype);
  const std::vector<int64_t> dims = ReduceDims(at::IntArrayRef{dim}, a.dim());
  return Wrap(ReduceValue(d, ValAs(a, t), a.sizes().vec(), dims, ReduceKind::Prod, t, keepdim), d);
}
at::Tensor prod_all(const at::Tensor& a, std::optional<at::ScalarType> dtype) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = SumType(a, dtype);
  return Wrap(ReduceValue(d, ValAs(a, t), a.sizes().vec(), ReduceDims(std::nullopt, a.dim()), ReduceKind::Prod, t, false), d);
}

// nansum: NaN counts as 0
at::Tensor nansum(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(!at::isComplexType(a.scalar_type()), "nansum does not support complex inputs");
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = SumType(a, dtype);
  ir::Value x = ValAs(a, t);
  if (at::isFloatingType(t)) x = B(d).Select(IsNan(d, x), Fill(d, 0, t, a.sizes().vec()), x);
  return Wrap(ReduceValue(d, x, a.sizes().vec(), ReduceDims(dim, a.dim()), ReduceKind::Sum, t, keepdim), d);
}

// trace: the diagonal's sum (int64 for integers)
at::Tensor trace(const at::Tensor& a) {
  TORCH_CHECK(a.dim() == 2, "trace: expected a matrix, but got tensor with dim ", a.dim());
  return at::sum(a.diagonal(), SumType(a, std::nullopt));
}

at::Tensor max_all(const at::Tensor& a) {
  TORCH_CHECK(a.numel() > 0, "max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
  return Extreme(a, {}, false, ReduceKind::Max);
}
at::Tensor min_all(const at::Tensor& a) {
  TORCH_CHECK(a.numel() > 0, "min(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
  return Extreme(a, {}, false, ReduceKind::Min);
}

}  // namespace

// The precision of float32 and complex64 products follows torch's float32
// matmul precision for CUDA, the device the plugin's GPU stands in for:
// "highest" (torch's default; torch.backends.cuda.matmul.fp32_precision
// "ieee") asks for full precision (HIGHEST), the CPU's answer; "high" ("tf32")
// for HIGH, which XLA GPU computes in TF32, as CUDA then does (torch 2.9
// and later read "medium" as TF32 for CUDA too); "bf16", and "medium" before
// 2.9, leave it to the plugin. Convolutions follow the same setting, not
// cuDNN's (TF32 by default): the CPU, the oracle, computes them in float32.
// torch 2.10 keys the setting by backend and op with enums, 2.9 with
// strings; older torch has only the legacy setting (which 2.9 and later
// refuse to read once the new API was used). A compiled graph keeps the
// precision it was traced under, as inductor's do.
ir::Precision ProductPrecision(ir::DType t) {
  if (t != ir::DType::F32 && t != ir::DType::C64) return ir::Precision::Default;
  const at::Context& ctx = at::globalContext();
#if TPJ_TORCH_VERSION_NUM >= 210
  switch (ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL)) {
    case at::Float32Precision::TF32: return ir::Precision::High;
    case at::Float32Precision::BF16: return ir::Precision::Default;
    default: return ir::Precision::Highest;  // IEEE, or NONE (inherited, none set)
  }
#elif TPJ_TORCH_VERSION_NUM >= 209
  const std::string p = ctx.float32Precision("cuda", "matmul");
  return p == "tf32" ? ir::Precision::High : p == "bf16" ? ir::Precision::Default : ir::Precision::Highest;
#else
  switch (ctx.float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGH: return ir::Precision::High;
    case at::Float32MatmulPrecision::MEDIUM: return ir::Precision::Default;
    default: return ir::Precision::Highest;
  }
#endif
}

ir::Value ArgExtreme(int d, ir::Value x, const std::vector<int64_t>& shape, int64_t dim, bool is_max, at::ScalarType t,
                     ir::Value* values) {
  ir::Builder& b = B(d);
  ir::Value m = ReduceValue(d, x, shape, {dim}, is_max ? ReduceKind::Max : ReduceKind::Min, t, true);
  ir::Value hit = b.Compare(ir::CompareDir::EQ, x, BroadcastTo(d, m, shape));
  ir::Value any_nan;
  if (at::isFloatingType(t)) {
    // the backend's reduce may or may not have kept the NaN: decide here
    ir::Value nan = IsNan(d, x);
    any_nan = ReduceValue(d, nan, shape, {dim}, ReduceKind::Or, at::kBool, true);
    hit = b.Select(BroadcastTo(d, any_nan, shape), nan, hit);
  }
  ir::Value iota = b.Iota({ir::DType::I64, shape}, dim);
  ir::Value big = Fill(d, static_cast<double>(shape[dim]), at::kLong, shape);
  ir::Value idx = ReduceValue(d, b.Select(hit, iota, big), shape, {dim}, ReduceKind::Min, at::kLong, true);
  if (values && any_nan.valid()) {
    // the one element at idx, over -inf elsewhere; NaN decided by the flag
    ir::Value at_idx = b.Compare(ir::CompareDir::EQ, iota, BroadcastTo(d, idx, shape));
    ir::Value picked = b.Select(at_idx, x, Fill(d, -INFINITY, t, shape));
    picked = ReduceValue(d, picked, shape, {dim}, ReduceKind::Max, t, true);
    *values = b.Select(any_nan, Fill(d, NAN, t, b.shape(m).dims), picked);
  } else if (values) {
    *values = m;
  }
  return idx;
}

namespace {

std::tuple<at::Tensor, at::Tensor> MaxMinDim(const at::Tensor& a, int64_t dim, bool keepdim, bool is_max,
                                             const char* op) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const int64_t w = WrapDim(dim, a.dim());
  std::vector<int64_t> shape = a.sizes().vec();
  ir::Value x = Val(a);
  if (shape.empty()) {
    return {Wrap(x, d), Wrap(Fill(d, 0, at::kLong, {}), d)};
  }
  TORCH_CHECK_INDEX(shape[w] > 0, op, "(): Expected reduction dim ", w, " to have non-zero size.");
  ir::Value values;
  ir::Value idx = ArgExtreme(d, x, shape, w, is_max, a.scalar_type(), &values);
  ir::Builder& b = B(d);
  if (!keepdim) {
    std::vector<int64_t> out = shape;
    out.erase(out.begin() + w);
    values = b.Reshape(values, out);
    idx = b.Reshape(idx, out);
  }
  return {Wrap(values, d), Wrap(idx, d)};
}
std::tuple<at::Tensor, at::Tensor> max_dim(const at::Tensor& a, int64_t dim, bool keepdim) {
  return MaxMinDim(a, dim, keepdim, true, "max");
}
std::tuple<at::Tensor, at::Tensor> min_dim(const at::Tensor& a, int64_t dim, bool keepdim) {
  return MaxMinDim(a, dim, keepdim, false, "min");
}

at::Tensor ArgMaxMin(const at::Tensor& a, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  TORCH_CHECK(a.scalar_type() != at::kBool, is_max ? "argmax" : "argmin", "(): does not support bool input");
  TORCH_CHECK(!a.is_complex(), is_max ? "argmax" : "argmin", "(): does not support complex input");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  if (!dim) {
    TORCH_CHECK_INDEX(a.numel() > 0, is_max ? "argmax" : "argmin",
                      "(): Expected reduction dim to be specified for input.numel() == 0.");
    ir::Value flat = b.Reshape(Val(a), {a.numel()});
    ir::Value idx = ArgExtreme(d, flat, {a.numel()}, 0, is_max, a.scalar_type(), nullptr);
    std::vector<int64_t> out = keepdim ? std::vector<int64_t>(a.dim(), 1) : std::vector<int64_t>{};
    return Wrap(b.Reshape(idx, out), d);
  }
  auto r = MaxMinDim(a, *dim, keepdim, is_max, is_max ? "argmax" : "argmin");
  return std::get<1>(r);
}
at::Tensor argmax(const at::Tensor& a, std::optional<int64_t> dim, bool keepdim) { return ArgMaxMin(a, dim, keepdim, true); }
at::Tensor argmin(const at::Tensor& a, std::optional<int64_t> dim, bool keepdim) { return ArgMaxMin(a, dim, keepdim, false); }

at::Tensor AnyAll(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim, bool any) {
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Value r = ReduceValue(d, ValAs(a, at::kBool), a.sizes().vec(), ReduceDims(dim, a.dim()),
                            any ? ReduceKind::Or : ReduceKind::And, at::kBool, keepdim);
  // uint8 in, uint8 out (0 or 1): PyTorch keeps this older rule for uint8 only
  if (a.scalar_type() == at::kByte) r = B(d).Convert(r, ir::DType::U8);
  return Wrap(r, d);
}
at::Tensor any_all(const at::Tensor& a) { return AnyAll(a, std::nullopt, false, true); }
at::Tensor all_all(const at::Tensor& a) { return AnyAll(a, std::nullopt, false, false); }
at::Tensor any_dim(const at::Tensor& a, int64_t dim, bool keepdim) { return AnyAll(a, at::IntArrayRef{dim}, keepdim, true); }
at::Tensor all_dim(const at::Tensor& a, int64_t dim, bool keepdim) { return AnyAll(a, at::IntArrayRef{dim}, keepdim, false); }
at::Tensor any_dims(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim) { return AnyAll(a, dim, keepdim, true); }
at::Tensor all_dims(const at::Tensor& a, at::OptionalIntArrayRef dim, bool keepdim) { return AnyAll(a, dim, keepdim, false); }

at::Tensor linalg_vector_norm(const at::Tensor& a, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type()),
              "linalg.vector_norm: Expected a floating point or complex tensor as input. Got ", a.scalar_type());
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType in = dtype.value_or(FloatType(a.scalar_type()));
  const at::ScalarType out = c10::toRealValueType(in);  // |z| of a complex is real
  const at::ScalarType t = OpMath(out);       // half types in float, rounded once
  const auto dims = ReduceDims(dim, a.dim());
  const auto shape = a.sizes().vec();
  const double p = ord.toDouble();
  if (a.numel() == 0 && (p < 0 || p == INFINITY)) {  // no identity: the CPU's errors
    TORCH_CHECK(dim.has_value() && !dim->empty(), "linalg.vector_norm cannot compute the ", ord,
                " norm on an empty tensor because the operation does not have an identity");
    for (int64_t k : dims) {
      TORCH_CHECK(shape[k] != 0, "linalg.vector_norm cannot compute the ", ord, " norm on the dimension ", k,
                  "because this dimension is empty and the operation does not have an identity");
    }
  }
  ir::Value x = b.Convert(b.Unary(Op::Abs, ValAs(a, in)), ToIr(t));
  auto result = [&](ir::Value v) { return Wrap(b.Convert(v, ToIr(out)), d); };
  if (std::isinf(p)) {
    return result(ReduceExtreme(d, x, shape, dims, p > 0 ? ReduceKind::Max : ReduceKind::Min, t, keepdim));
  }
  if (p == 0) {
    ir::Value nz = b.Convert(b.Compare(ir::CompareDir::NE, x, Fill(d, 0, t, shape)), ToIr(t));
    return result(ReduceValue(d, nz, shape, dims, ReduceKind::Sum, t, keepdim));
  }
  if (p == 1) return result(ReduceValue(d, x, shape, dims, ReduceKind::Sum, t, keepdim));
  if (p == 2) {
    ir::Value sq = ReduceValue(d, b.Binary(Op::Mul, x, x), shape, dims, ReduceKind::Sum, t, keepdim);
    return result(b.Unary(Op::Sqrt, sq));
  }
  ir::Value pw = ReduceValue(d, b.Binary(Op::Pow, x, Fill(d, p, t, shape)), shape, dims, ReduceKind::Sum, t, keepdim);
  return result(b.Binary(Op::Pow, pw, Fill(d, 1.0 / p, t, b.shape(pw).dims)));
}

// The legacy at::norm overloads (pairwise_distance, torch.norm with a
// dtype, older model code): the vector norm of order p, 2 when None.
at::Tensor NormOf(const at::Tensor& a, const std::optional<at::Scalar>& p, at::OptionalIntArrayRef dim, bool keepdim,
                  std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type()),
              "norm(): input dtype should be either floating point or complex. Got ", a.scalar_type(), " instead.");
  return tpj::aten::linalg_vector_norm(a, p.value_or(2), dim, keepdim, dtype);
}
at::Tensor norm_scalar(const at::Tensor& a, const at::Scalar& p) { return NormOf(a, p, std::nullopt, false, std::nullopt); }
at::Tensor norm_dim(const at::Tensor& a, const std::optional<at::Scalar>& p, at::IntArrayRef dim, bool keepdim) {
  return NormOf(a, p, dim, keepdim, std::nullopt);
}
at::Tensor norm_dtype(const at::Tensor& a, const std::optional<at::Scalar>& p, at::ScalarType dtype) {
  return NormOf(a, p, std::nullopt, false, dtype);
}
at::Tensor norm_dim_dtype(const at::Tensor& a, const std::optional<at::Scalar>& p, at::IntArrayRef dim, bool keepdim,
                          at::ScalarType dtype) {
  return NormOf(a, p, dim, keepdim, dtype);
}

at::Tensor VarStd(const at::Tensor& a, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
                  bool keepdim, bool take_sqrt) {
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type()),
              "std and var only support floating point and complex dtypes");
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType out = FloatType(a.scalar_type()), t = OpMath(out);  // half types in float
  const auto dims = ReduceDims(dim, a.dim());
  const auto shape = a.sizes().vec();
  ir::Value x = ValAs(a, t);
  const double n = static_cast<double>(Count(a, dims));
  ir::Value sum = ReduceValue(d, x, shape, dims, ReduceKind::Sum, t, true);
  ir::Value mean = b.Binary(Op::Div, sum, Fill(d, n, t, b.shape(sum).dims));
  ir::Value diff = b.Binary(Op::Sub, x, BroadcastTo(d, mean, shape));
  // A complex variance is real: the mean of |x - mean|^2 (the CPU's).
  const bool complex = at::isComplexType(t);
  const at::ScalarType rt = complex ? c10::toRealValueType(t) : t;
  ir::Value sq = complex ? b.Binary(Op::Add, b.Binary(Op::Mul, b.Real(diff), b.Real(diff)),
                                    b.Binary(Op::Mul, b.Imag(diff), b.Imag(diff)))
                         : b.Binary(Op::Mul, diff, diff);
  ir::Value ss = ReduceValue(d, sq, shape, dims, ReduceKind::Sum, rt, keepdim);
  const double corr = correction ? correction->toDouble() : 1.0;
  WarnIfNoDegreesOfFreedom(take_sqrt ? "std" : "var", n, corr);
  ir::Value var = b.Binary(Op::Div, ss, Fill(d, std::max(n - corr, 0.0), rt, b.shape(ss).dims));
  const at::ScalarType result = complex ? c10::toRealValueType(out) : out;
  return Wrap(b.Convert(take_sqrt ? b.Unary(Op::Sqrt, var) : var, ToIr(result)), d);
}
at::Tensor var_correction(const at::Tensor& a, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& c, bool keepdim) {
  return VarStd(a, dim, c, keepdim, false);
}
at::Tensor std_correction(const at::Tensor& a, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& c, bool keepdim) {
  return VarStd(a, dim, c, keepdim, true);
}

// cumsum and cumprod: a window over every earlier element along dim
at::Tensor Cumulative(const at::Tensor& a, int64_t dim, std::optional<at::ScalarType> dtype, ReduceKind kind) {
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType t = SumType(a, dtype);
  CheckNotBool(t, kind == ReduceKind::Sum ? "cumsum_out_cpu" : "cumprod_out_cpu");
  if (a.dim() == 0) return Wrap(ValAs(a, t), d);  // (a copy on the CPU too: -0.0 stays)
  const int64_t w = WrapDim(dim, a.dim());
  const auto shape = a.sizes().vec();
  if (kind == ReduceKind::Sum && shape[w] == 1) return Wrap(PlusZero(d, ValAs(a, t)), d);
  const int64_t r = a.dim();
  std::vector<int64_t> window(r, 1), strides(r, 1), low(r, 0), high(r, 0);
  window[w] = std::max<int64_t>(shape[w], 1);
  low[w] = window[w] - 1;
  return Wrap(b.ReduceWindow(ValAs(a, t), b.ScalarConstant(ToIr(t), InitFor(kind)), kind, window, strides, {}, {}, low,
                             high),
              d);
}
at::Tensor cumsum(const at::Tensor& a, int64_t dim, std::optional<at::ScalarType> dtype) {
  return Cumulative(a, dim, dtype, ReduceKind::Sum);
}
at::Tensor cumprod(const at::Tensor& a, int64_t dim, std::optional<at::ScalarType> dtype) {
  return Cumulative(a, dim, dtype, ReduceKind::Prod);
}

// count_nonzero: a sum of x != 0 (int64).
at::Tensor count_nonzero_dims(const at::Tensor& a, at::IntArrayRef dims) {
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const auto shape = a.sizes().vec();
  ir::Value x = Val(a);
  ir::Value nz = b.Unary(Op::Not, b.Compare(ir::CompareDir::EQ, x, b.Full(b.shape(x).dtype, shape, 0)));
  return Wrap(ReduceValue(d, b.Convert(nz, ir::DType::I64), shape, ReduceDims(dims, a.dim()), ReduceKind::Sum, at::kLong,
                          false),
              d);
}
at::Tensor count_nonzero(const at::Tensor& a, std::optional<int64_t> dim) {
  if (dim) return count_nonzero_dims(a, {*dim});
  return count_nonzero_dims(a, {});
}

// cummax/cummin: the CPU's index, the last place where x was the new
// extreme or equalled it (x >= the running max), or the last NaN so far (a
// prefix reduction), and the element there as the value.
void CumulativeExtreme(const at::Tensor& a, const at::Tensor& values, const at::Tensor& indices, int64_t dim, bool is_max) {
  TraceScope s;
  const int d = CommonDevice({&a, &values, &indices});
  ir::Builder& b = B(d);
  const at::ScalarType t = a.scalar_type();
  const auto shape = a.sizes().vec();
  if (a.dim() == 0 || a.numel() == 0) {
    Assign(values, Val(a));
    Assign(indices, Fill(d, 0, at::kLong, shape));
    return;
  }
  const int64_t w = WrapDim(dim, a.dim());
  const int64_t r = a.dim();
  std::vector<int64_t> window(r, 1), strides(r, 1), low(r, 0), high(r, 0);
  window[w] = shape[w];
  low[w] = shape[w] - 1;
  auto prefix = [&](ir::Value v, ReduceKind kind, ir::Value init) {
    return b.ReduceWindow(v, init, kind, window, strides, {}, {}, low, high);
  };
  const ReduceKind kind = is_max ? ReduceKind::Max : ReduceKind::Min;
  ir::Value x = Val(a);
  ir::Value run = prefix(x, kind, ExtremeConst(d, t, is_max));
  ir::Value pos = b.Iota({ir::DType::I64, shape}, w);
  // x_j >= max(x_0..x_j) (<= for min): x_j is the running extreme at j
  ir::Value record = b.Compare(ir::CompareDir::EQ, x, run);
  if (at::isFloatingType(t)) {
    ir::Value nan = IsNan(d, x);
    ir::Value seen = prefix(b.Convert(nan, ir::DType::I32), ReduceKind::Max, b.ScalarConstant(ir::DType::I32, 0));
    ir::Value any = b.Compare(ir::CompareDir::GT, seen, b.Full(ir::DType::I32, shape, 0));
    record = b.Binary(Op::Or, nan, b.Binary(Op::And, record, b.Unary(Op::Not, any)));
  }
  ir::Value idx = prefix(b.Select(record, pos, b.Full(ir::DType::I64, shape, 0)), ReduceKind::Max,
                         b.ScalarConstant(ir::DType::I64, 0));
  Assign(indices, idx);
  // the value is the element at the index (its sign of zero, its NaN)
  values.copy_(at::gather(a, w, indices));
}
void cummax_helper(const at::Tensor& a, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  CumulativeExtreme(a, values, indices, dim, true);
}
void cummin_helper(const at::Tensor& a, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  CumulativeExtreme(a, values, indices, dim, false);
}

// renorm: each slice along dim scaled to a p-norm of at most maxnorm, by the
// CPU's factor maxnorm / (norm + 1e-7), the norm in the accumulate type.
at::Tensor renorm(const at::Tensor& a, const at::Scalar& p, int64_t dim, const at::Scalar& maxnorm) {
  TORCH_CHECK(!maxnorm.isComplex() && maxnorm.toDouble() >= 0, "renorm: expected maxnorm to be >= 0 but got ",
              maxnorm.toDouble());
  TORCH_CHECK(!p.isComplex() && p.toDouble() > 0, "renorm: non-positive-norm not supported");
  TORCH_CHECK(!a.is_complex() && at::isFloatingType(a.scalar_type()), "renorm: expected a floating-point input, got ",
              a.scalar_type());
  TORCH_CHECK(a.dim() > 1, "renorm: input needs at least 2 dimensions, got ", a.dim(), " dimensions");
  const int64_t w = WrapDim(dim, a.dim());
  std::vector<int64_t> others;
  for (int64_t i = 0; i < a.dim(); ++i) {
    if (i != w) others.push_back(i);
  }
  const at::ScalarType acc = at::toAccumulateType(a.scalar_type(), /*is_cuda=*/true);
  at::Tensor norm = at::linalg_vector_norm(a, p, others, /*keepdim=*/true, acc);
  const double m = maxnorm.toDouble();
  at::Tensor factor = at::where(norm > m, m / (norm + 1e-7), at::ones_like(norm)).to(a.scalar_type());
  return a * factor;
}

// ---------------------------------------------------------------- softmax

ir::Value LogSoftmax(int d, ir::Value x, const std::vector<int64_t>& shape, int64_t dim, at::ScalarType t) {
  ir::Builder& b = B(d);
  ir::Value m = BroadcastTo(d, ReduceValue(d, x, shape, {dim}, ReduceKind::Max, t, true), shape);
  ir::Value z = b.Binary(Op::Sub, x, m);
  ir::Value lse = ReduceValue(d, b.Unary(Op::Exp, z), shape, {dim}, ReduceKind::Sum, t, true);
  return b.Binary(Op::Sub, z, BroadcastTo(d, b.Unary(Op::Log, lse), shape));
}

ir::Value Softmax(int d, ir::Value x, const std::vector<int64_t>& shape, int64_t w, at::ScalarType t) {
  ir::Builder& b = B(d);
  ir::Value m = BroadcastTo(d, ReduceValue(d, x, shape, {w}, ReduceKind::Max, t, true), shape);
  ir::Value e = b.Unary(Op::Exp, b.Binary(Op::Sub, x, m));
  ir::Value sum = BroadcastTo(d, ReduceValue(d, e, shape, {w}, ReduceKind::Sum, t, true), shape);
  return b.Binary(Op::Div, e, sum);
}

// The CPU's softmax and log_softmax of one number: 1 / 0 where it is finite,
// NaN where not (its x - max(x) is NaN there); of no numbers, an empty
// result; an integer input is its NotImplementedError unless empty.
bool SoftmaxOfNumber(const at::Tensor& a, int64_t dim, at::ScalarType t, const char* name, ir::Value* out,
                     double finite) {
  WrapDim(dim, std::max<int64_t>(a.dim(), 1));  // the CPU's IndexError for a dim out of range comes first
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(a.scalar_type()) || a.numel() == 0, "\"", name,
                              "\" not implemented for '", a.scalar_type(), "'");
  const int d = DeviceIndex(a);
  if (a.numel() == 0) {
    *out = Fill(d, 0, t, a.sizes().vec());
    return true;
  }
  if (a.dim() != 0) return false;
  ir::Builder& b = B(d);
  *out = b.Select(b.IsFinite(ValAs(a, t)), Fill(d, finite, t, {}), Fill(d, NAN, t, {}));
  return true;
}

at::Tensor softmax(const at::Tensor& a, int64_t dim, bool half_to_float) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = half_to_float ? at::kFloat : a.scalar_type();
  const auto shape = a.sizes().vec();
  if (ir::Value v; SoftmaxOfNumber(a, dim, t, "softmax", &v, 1)) return Wrap(v, d);
  const at::ScalarType ct = OpMath(t);  // half types in float, rounded once (the CPU's kernel)
  return WrapIn(Softmax(d, ValAs(a, ct), shape, WrapDim(dim, a.dim()), ct), t, d);
}

// softmax, with 0 for the rows that are all -inf (fully masked attention
// rows), as attention's math path wants: PyTorch's composite form of it
// would run where() on a CPU scalar.
at::Tensor safe_softmax(const at::Tensor& a, int64_t dim, std::optional<at::ScalarType> dtype) {
  TraceScope s;
  const int d = DeviceIndex(a);
  ir::Builder& b = B(d);
  const at::ScalarType ot = dtype ? *dtype : a.scalar_type(), t = OpMath(ot);
  const auto shape = a.sizes().vec();
  ir::Value x = b.Convert(ValAs(a, ot), ToIr(t));  // in `dtype` first, as at::softmax converts
  ir::Value neg_inf = b.Compare(ir::CompareDir::EQ, x, Fill(d, -INFINITY, t, shape));
  if (shape.empty()) return WrapIn(b.Select(neg_inf, Fill(d, 0, t, shape), Fill(d, 1, t, shape)), ot, d);
  const int64_t w = WrapDim(dim, a.dim());
  ir::Value masked = BroadcastTo(d, ReduceValue(d, neg_inf, shape, {w}, ReduceKind::And, at::kBool, true), shape);
  return WrapIn(b.Select(masked, Fill(d, 0, t, shape), Softmax(d, x, shape, w, t)), ot, d);
}

at::Tensor log_softmax(const at::Tensor& a, int64_t dim, bool half_to_float) {
  TraceScope s;
  const int d = DeviceIndex(a);
  const at::ScalarType t = half_to_float ? at::kFloat : a.scalar_type();
  const auto shape = a.sizes().vec();
  if (ir::Value v; SoftmaxOfNumber(a, dim, t, "log_softmax", &v, 0)) return Wrap(v, d);
  const at::ScalarType ct = OpMath(t);
  return WrapIn(LogSoftmax(d, ValAs(a, ct), shape, WrapDim(dim, a.dim()), ct), t, d);
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& out, int64_t dim, at::ScalarType input_dtype) {
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  const auto shape = out.sizes().vec();
  const at::ScalarType t = OpMath(out.scalar_type());
  if (shape.empty()) return Wrap(Fill(d, 0, input_dtype, {}), d);
  const int64_t w = WrapDim(dim, out.dim());
  ir::Value y = ValAs(out, t);
  ir::Value g = ValAs(grad, t);
  ir::Value gy = b.Binary(Op::Mul, g, y);
  ir::Value sum = BroadcastTo(d, ReduceValue(d, gy, shape, {w}, ReduceKind::Sum, t, true), shape);
  // y * (g - sum(g * y)): the CPU kernel's form (zero signs, inf and NaN as there)
  return Wrap(b.Convert(b.Binary(Op::Mul, y, b.Binary(Op::Sub, g, sum)), ToIr(input_dtype)), d);
}

at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& out, int64_t dim, at::ScalarType input_dtype) {
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  const auto shape = out.sizes().vec();
  const at::ScalarType t = OpMath(out.scalar_type());
  if (shape.empty()) return Wrap(Fill(d, 0, input_dtype, {}), d);
  const int64_t w = WrapDim(dim, out.dim());
  ir::Value g = ValAs(grad, t);
  ir::Value sum = BroadcastTo(d, ReduceValue(d, g, shape, {w}, ReduceKind::Sum, t, true), shape);
  return WrapIn(b.Binary(Op::Sub, g, b.Binary(Op::Mul, b.Unary(Op::Exp, ValAs(out, t)), sum)), input_dtype, d);
}

// ---------------------------------------------------------- matrix products

// f32_result: float16/bfloat16 operands' product left in float32 (Scaled).
ir::Value Dot(int d, ir::Value x, ir::Value y, std::vector<int64_t> lb, std::vector<int64_t> rb, int64_t lc, int64_t rc,
              bool f32_result = false) {
  ir::DotDims dd;
  dd.lhs_batch = std::move(lb);
  dd.rhs_batch = std::move(rb);
  dd.lhs_contract = {lc};
  dd.rhs_contract = {rc};
  return B(d).DotGeneral(x, y, dd, ProductPrecision(B(d).shape(x).dtype), f32_result);
}

void CheckMatmul(const at::Tensor& a, const at::Tensor& b, int64_t ra, int64_t rb, const char* name) {
  TORCH_CHECK(a.dim() == ra, name, ": self must be a ", ra, "D tensor");
  TORCH_CHECK(b.dim() == rb, name, ": mat2 must be a ", rb, "D tensor");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ", a.dtype(),
              " != ", b.dtype());
  CheckNotBool(a.scalar_type(), ra == 2 ? "addmm_impl_cpu_" : name);  // (mm and addmm are one CPU kernel)
}

// addmm's and addbmm's self: the operands' dtype (the CPU's check and message).
void CheckSelfDtype(const at::Tensor& self, const at::Tensor& mat2) {
  TORCH_CHECK(self.scalar_type() == mat2.scalar_type(), "self and mat2 must have the same dtype, but got ",
              self.scalar_type(), " and ", mat2.scalar_type());
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  CheckMatmul(a, b, 2, 2, "mm");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1), " and ",
              b.size(0), "x", b.size(1), ")");
  TraceScope s;
  const int d = CommonDevice({&a, &b});
  return Wrap(Dot(d, Val(a), Val(b), {}, {}, 1, 0), d);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  CheckMatmul(a, b, 3, 3, "bmm");
  TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [",
              a.size(0), ", ", a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  TraceScope s;
  const int d = CommonDevice({&a, &b});
  return Wrap(Dot(d, Val(a), Val(b), {0}, {0}, 2, 1), d);
}

bool IsZero(const at::Scalar& s) { return !s.isComplex() && s.toDouble() == 0; }

// Whether Scaled takes a float32 product: float16/bfloat16 operands whose
// product a beta or an alpha changes. The CPU's gemm rounds
// beta * self + alpha * sum once, from float; a product rounded first
// (and each step after it) doubled the error (bfloat16 Linear layers with a
// bias, addmm's beta and alpha in Muon's Newton-Schulz iteration).
bool WideProduct(at::ScalarType t, const at::Scalar& beta, const at::Scalar& alpha) {
  return at::isReducedFloatingType(t) && !(IsZero(beta) && IsOne(alpha));
}

// beta * self + alpha * prod in dtype t; a float32 `prod` (WideProduct) is
// scaled and summed in float32 and rounded to t once.
at::Tensor Scaled(int d, ir::Value prod, const at::Tensor& self, const at::Scalar& beta, const at::Scalar& alpha,
                  at::ScalarType t) {
  ir::Builder& b = B(d);
  const auto shape = b.shape(prod).dims;
  const at::ScalarType ct = b.shape(prod).dtype == ToIr(t) ? t : at::kFloat;
  if (!IsOne(alpha)) prod = b.Binary(Op::Mul, prod, Number(d, alpha, ct, shape));
  if (!IsZero(beta)) {
    ir::Value c = BroadcastTo(d, Operand(self, d, ct), shape);
    if (!IsOne(beta)) c = b.Binary(Op::Mul, c, Number(d, beta, ct, shape));
    prod = b.Binary(Op::Add, c, prod);
  }
  return WrapIn(prod, t, d);
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  CheckMatmul(m1, m2, 2, 2, "addmm");
  CheckSelfDtype(self, m2);
  TORCH_CHECK(m1.size(1) == m2.size(0), "mat1 and mat2 shapes cannot be multiplied (", m1.size(0), "x", m1.size(1),
              " and ", m2.size(0), "x", m2.size(1), ")");
  TraceScope s;
  const int d = CommonDevice({&self, &m1, &m2});
  const at::ScalarType t = m1.scalar_type();
  return Scaled(d, Dot(d, Val(m1), Val(m2), {}, {}, 1, 0, WideProduct(t, beta, alpha)), self, beta, alpha, t);
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, const at::Scalar& beta,
                   const at::Scalar& alpha) {
  CheckMatmul(b1, b2, 3, 3, "baddbmm");
  TORCH_CHECK(self.scalar_type() == b1.scalar_type(), "Input dtypes must be the same, got: input ", self.dtype(),
              ", batch1: ", b1.dtype(), ", batch2: ", b2.dtype());
  TORCH_CHECK(b2.size(0) == b1.size(0) && b2.size(1) == b1.size(2), "Expected size for first two dimensions of batch2 "
              "tensor to be: [", b1.size(0), ", ", b1.size(2), "] but got: [", b2.size(0), ", ", b2.size(1), "].");
  TraceScope s;
  const int d = CommonDevice({&self, &b1, &b2});
  const at::ScalarType t = b1.scalar_type();
  return Scaled(d, Dot(d, Val(b1), Val(b2), {0}, {0}, 2, 1, WideProduct(t, beta, alpha)), self, beta, alpha, t);
}

// _grouped_mm: the per-expert products of a mixture-of-experts layer. A 2-d
// operand is cut into groups along its jagged dimension by offs (the end of
// each group, int32); a 3-d operand holds one matrix per group. Every group's
// product is computed densely and each output element takes its own group's
// (G times the routed work, as XLA's CPU backend expands its own ragged dot),
// so that the routing is data, not shape: no host read of offs, one program
// for any routing. Elements are selected, not multiplied by a 0/1 mask, so an
// inf in another group's rows cannot turn a result into NaN. Rows past
// offs[-1] (uninitialized on the CPU and CUDA) are zeros here.
at::Tensor InGroup(const at::Tensor& offs, int64_t n) {
  at::Tensor end = offs.to(at::kLong).unsqueeze(1);
  at::Tensor start = at::cat({at::zeros({1, 1}, end.options()), end.narrow(0, 0, end.size(0) - 1)});
  at::Tensor idx = at::arange(n, end.options()).unsqueeze(0);
  return idx.ge(start).logical_and(idx.lt(end));  // [G, n]: index i is in group g
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3),
              "Multiplicands must be 2D or 3D but got mat_a.dim()=", a.dim(), " and mat_b.dim()=", b.dim());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "grouped_mm: expected mat_a and mat_b to have the same dtype, but got ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(at::isFloatingType(a.scalar_type()), "grouped_mm: expected floating point inputs, but got ", a.scalar_type());
  TORCH_CHECK(!bias || !bias->defined(), "Bias not supported yet");
  const at::ScalarType t = out_dtype.value_or(a.scalar_type());
  TORCH_CHECK(t == a.scalar_type() || (t == at::kFloat && at::isReducedFloatingType(a.scalar_type())),
              "grouped_mm: out_dtype must be the inputs' dtype or float32 for bfloat16/float16 inputs, but got ", t);
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  const bool grouped = offs && offs->defined();
  if (!a2 || !b2) TORCH_CHECK(a.size(-1) == b.size(-2), "contraction dimension of mat_a and mat_b must match");
  TORCH_CHECK(grouped == (a2 || b2), grouped ? "grouped_mm: offs must not be given when both operands are 3D"
                                             : "grouped_mm: offs is required when an operand is 2D");
  at::Tensor x = a.to(t), y = b.to(t);
  if (!grouped) {
    TORCH_CHECK(a.size(0) == b.size(0), "batched dimension has to match");
    return at::bmm(x, y);
  }
  TORCH_CHECK(offs->dim() == 1 && offs->scalar_type() == at::kInt, "grouped_mm: offs must be a 1D int32 tensor, but got ",
              offs->dim(), "D ", offs->scalar_type());
  TORCH_CHECK(offs->device() == a.device() && b.device() == a.device(),
              "grouped_mm: mat_a, mat_b and offs must be on one device, but got ", a.device(), ", ", b.device(), " and ",
              offs->device());
  const int64_t g = offs->size(0);
  TORCH_CHECK((a2 || g == a.size(0)) && (b2 || g == b.size(0)), "matrix batch sizes have to match");
  at::Tensor zero = at::zeros({}, x.options());
  if (a2 && b2) {  // groups along the contraction: [G, M, N], a weight gradient
    TORCH_CHECK(a.size(1) == b.size(0), "contraction dimension of mat_a and mat_b must match");
    if (g == 0) return at::zeros({0, a.size(0), b.size(1)}, x.options());
    at::Tensor in = InGroup(*offs, a.size(1));  // [G, K]
    return at::bmm(at::where(in.unsqueeze(1), x.unsqueeze(0), zero), at::where(in.unsqueeze(2), y.unsqueeze(0), zero));
  }
  if (g == 0) return at::zeros({a2 ? a.size(0) : a.size(1), b.size(-1)}, x.options());
  if (a2) {  // rows of a by group: [M, K] x [G, K, N]
    at::Tensor all = at::bmm(x.unsqueeze(0).expand({g, a.size(0), a.size(1)}), y);         // [G, M, N]
    return at::where(InGroup(*offs, a.size(0)).unsqueeze(2), all, zero).sum(0);
  }
  // columns of b by group: [G, M, K] x [K, N]
  at::Tensor all = at::bmm(x, y.unsqueeze(0).expand({g, b.size(0), b.size(1)}));            // [G, M, N]
  return at::where(InGroup(*offs, b.size(1)).unsqueeze(1), all, zero).sum(0);
}

at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  CheckNotBool(a.scalar_type(), "dot");
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.size(0) == b.size(0), "inconsistent tensor size, expected tensor [", a.size(0),
              "] and src [", b.size(0), "] to have the same number of elements, but got ", a.size(0), " and ", b.size(0),
              " elements respectively");
  TraceScope s;
  const int d = CommonDevice({&a, &b});
  return Wrap(Dot(d, Val(a), Val(b), {}, {}, 0, 0), d);
}

// vdot: conj(a) . b
at::Tensor vdot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "vdot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  return at::dot(a.is_complex() ? a.conj() : a, b);
}

// linalg_cross: the 3-vector cross product along dim, inputs broadcast
at::Tensor linalg_cross(const at::Tensor& a, const at::Tensor& b, int64_t dim) {
  TORCH_CHECK(a.dim() == b.dim(), "linalg.cross: inputs must have the same number of dimensions.");
  const auto shape = at::infer_size(a.sizes(), b.sizes());
  const int64_t w = WrapDim(dim, static_cast<int64_t>(shape.size()));
  TORCH_CHECK(a.size(w) == 3 && b.size(w) == 3, "linalg.cross: inputs dimension ", dim, " must have length 3. Got ",
              a.size(w), " and ", b.size(w));
  at::Tensor x = a.expand(shape), y = b.expand(shape);
  auto c = [&](const at::Tensor& t, int64_t i) { return t.narrow(w, i, 1); };
  return at::cat({c(x, 1) * c(y, 2) - c(x, 2) * c(y, 1), c(x, 2) * c(y, 0) - c(x, 0) * c(y, 2),
                  c(x, 0) * c(y, 1) - c(x, 1) * c(y, 0)}, w);
}

// equal: same sizes and every element equal (a read of one bool)
bool equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  return at::eq(a, b).all().item<bool>();
}

// addmv: beta * self + alpha * (mat @ vec), self broadcast to the result.
at::Tensor addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  CheckNotBool(mat.scalar_type(), "addmv_impl_cpu");
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1 && self.dim() <= 1,
              "vector + matrix @ vector expected, got ", self.dim(), ", ", mat.dim(), ", ", vec.dim());
  TORCH_CHECK(mat.size(1) == vec.size(0) && (self.dim() == 0 || self.size(0) == 1 || self.size(0) == mat.size(0)),
              "size mismatch, got input (", self.dim() ? self.size(0) : 1, "), mat (", mat.size(0), "x", mat.size(1),
              "), vec (", vec.size(0), ")");
  TORCH_CHECK(self.scalar_type() == mat.scalar_type() && mat.scalar_type() == vec.scalar_type(),
              "addmv input tensors must have the same dtype, but got ", self.scalar_type(), ", ", mat.scalar_type(),
              ", and ", vec.scalar_type());
  TraceScope s;
  const int d = CommonDevice({&self, &mat, &vec});
  const at::ScalarType t = mat.scalar_type();
  return Scaled(d, Dot(d, Val(mat), Val(vec), {}, {}, 1, 0, WideProduct(t, beta, alpha)), self, beta, alpha, t);
}

// addbmm: beta * self + alpha * sum_i batch1[i] @ batch2[i].
at::Tensor addbmm(const at::Tensor& self, const at::Tensor& b1, const at::Tensor& b2, const at::Scalar& beta,
                  const at::Scalar& alpha) {
  CheckMatmul(b1, b2, 3, 3, "addbmm");
  CheckSelfDtype(self, b2);
  TORCH_CHECK(b1.size(0) == b2.size(0) && b1.size(2) == b2.size(1), "addbmm: incompatible batch1 ", b1.sizes(),
              " and batch2 ", b2.sizes());
  const at::ScalarType t = b1.scalar_type();
  if (at::isReducedFloatingType(t) && b1.size(0) > 0) {
    // the CPU's loop for float16/bfloat16: an addmm per batch, each rounded
    at::Tensor r = self;
    for (int64_t i = 0; i < b1.size(0); ++i) r = at::addmm(r, b1[i], b2[i], i == 0 ? beta : at::Scalar(1), alpha);
    return r;
  }
  TraceScope s;
  const int d = CommonDevice({&self, &b1, &b2});
  ir::DotDims dd;
  dd.lhs_contract = {0, 2};
  dd.rhs_contract = {0, 1};
  return Scaled(d, B(d).DotGeneral(Val(b1), Val(b2), dd, ProductPrecision(ToIr(t))), self, beta, alpha, t);
}

at::Tensor mv(const at::Tensor& a, const at::Tensor& v) {
  CheckNotBool(a.scalar_type(), "addmv_impl_cpu");
  TORCH_CHECK(a.dim() == 2 && v.dim() == 1, "vector + matrix @ vector expected, got ", a.dim(), ", ", v.dim());
  TORCH_CHECK(a.size(1) == v.size(0), "size mismatch, got input (", a.size(0), "), mat (", a.size(0), "x", a.size(1),
              "), vec (", v.size(0), ")");
  TORCH_CHECK(a.scalar_type() == v.scalar_type(), "mv: expected mat and vec to have the same dtype, but got ",
              a.scalar_type(), " and ", v.scalar_type());
  TraceScope s;
  const int d = CommonDevice({&a, &v});
  return Wrap(Dot(d, Val(a), Val(v), {}, {}, 1, 0), d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("sum.dim_IntList", sum_dim);
  K("sum", sum_all);
  K("mean.dim", mean_dim);
  K("mean", mean_all);
  K("amax", amax);
  K("amin", amin);
  K("max", max_all);
  K("min", min_all);
  K("max.dim", max_dim);
  K("min.dim", min_dim);
  K("argmax", argmax);
  K("argmin", argmin);
  K("any", any_all);
  K("all", all_all);
  K("any.dim", any_dim);
  K("all.dim", all_dim);
  K("any.dims", any_dims);
  K("all.dims", all_dims);
  K("linalg_vector_norm", linalg_vector_norm);
  K("norm.Scalar", norm_scalar);
  K("norm.ScalarOpt_dim", norm_dim);
  K("norm.ScalarOpt_dtype", norm_dtype);
  K("norm.ScalarOpt_dim_dtype", norm_dim_dtype);
  K("var.correction", var_correction);
  K("std.correction", std_correction);
  K("cumsum", cumsum);
  K("_softmax", softmax);
  K("_safe_softmax", safe_softmax);
  K("_log_softmax", log_softmax);
  K("_softmax_backward_data", softmax_backward);
  K("_log_softmax_backward_data", log_softmax_backward);
  K("mm", mm);
  K("bmm", bmm);
  K("addmm", addmm);
  K("baddbmm", baddbmm);
  K("dot", dot);
  K("_grouped_mm", grouped_mm);
  K("vdot", vdot);
  K("linalg_cross", linalg_cross);
  K("equal", equal);
  K("aminmax", aminmax);
  K("prod", prod_all);
  K("prod.dim_int", prod_dim);
  K("nansum", nansum);
  K("trace", trace);
  K("cumprod", cumprod);
  K("mv", mv);
  K("addmv", addmv);
  K("addbmm", addbmm);
  K("count_nonzero", count_nonzero);
  K("count_nonzero.dim_IntList", count_nonzero_dims);
  K("_cummax_helper", cummax_helper);
  K("_cummin_helper", cummin_helper);
  K("renorm", renorm);
}
