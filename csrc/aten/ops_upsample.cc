// Upsampling: nearest, nearest-exact, (bi/tri)linear and bicubic, and the
// antialiased bilinear and bicubic (interpolate(antialias=True), torchvision's
// Resize), forward and backward.
//
// Shapes are static, so every source index and weight is computed here, once
// per trace, with the CPU kernel's own arithmetic (float for float, half and
// bfloat16 inputs, double for double), and enters the program as a constant.
// Each spatial dimension is one pass, last dimension first as the CPU nests
// its loops: one gather along that dimension reads all k taps (k = 1, 2 or
// 4; for antialiasing, the widest window of the scaled filter), each tap is
// scaled by its weight and added in the CPU's order; the
// backward scatter-adds the same taps in one scatter, first dimension first. Gathers rather than a dense (out x in)
// weight matrix: a matrix product would multiply every inf or NaN of a row by
// zero weights and spread it over the row, costs out*in per row instead of
// out*k, and runs at reduced precision on TPUs by default. Nearest upsampling
// by an integer factor (the UNet case) needs no gather at all: a broadcast and
// a reshape forward, a reshape and a sum backward.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include <ATen/ops/_upsample_bicubic2d_aa.h>
#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/upsample_bicubic2d.h>
#include <ATen/ops/upsample_bilinear2d.h>
#include <ATen/ops/upsample_linear1d.h>
#include <ATen/ops/upsample_trilinear3d.h>

#include "aten/layout.h"
#include "aten/lowering.h"
#include "runtime/metrics.h"

namespace tpj::aten {
namespace {

using ir::Op;

enum class Mode { kNearest, kNearestExact, kLinear, kCubic, kLinearAA, kCubicAA };

// The source taps of one dimension: output o reads idx[j][o] with weight
// w[j][o], for each tap j (weights are empty for nearest: all ones).
struct Taps {
  int64_t in = 0, out = 0;
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<double>> w;
  // padded[j][o]: tap j of output o is not one (antialiased windows vary in
  // width; the CPU reads only the real taps, so an inf or NaN outside the
  // window must not reach the output through a zero weight). Empty: none is.
  std::vector<std::vector<bool>> padded;
  bool identity = false;  // output o reads input o alone
  int64_t repeat = 0;     // > 0: nearest, output o reads input o / repeat (out == repeat * in)
};

// The helpers below follow the CPU kernels' formulas (ATen/native/UpSample.h)
// in T, the type the CPU computes them in.
template <class T>
T ScaleValue(std::optional<double> scale, int64_t in, int64_t out) {
  return scale && *scale > 0 ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
}

template <class T>
T AreaScale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (align_corners) return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  return ScaleValue<T>(scale, in, out);
}

template <class T>
T SourceIndex(T scale, int64_t o, bool align_corners, bool cubic) {
  if (align_corners) return scale * static_cast<T>(o);
  const T src = scale * (static_cast<T>(o) + static_cast<T>(0.5)) - static_cast<T>(0.5);
  return !cubic && src < T(0) ? T(0) : src;
}

// Integer part (bounded by in - 1) and fraction in [0, 1] of a source index.
template <class T>
void IndexAndLambda(T real, int64_t in, int64_t* index, T* lambda) {
  *index = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
  *lambda = std::min(std::max(real - static_cast<T>(*index), T(0)), T(1));
}

template <class T>
T Cubic1(T x, T a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
template <class T>
T Cubic2(T x, T a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }

// Antialiased taps (the CPU's _compute_indices_min_size_weights_aa, in its
// mixed float/double arithmetic): a window of the filter widened by the
// downscale factor, weights normalized to sum 1; a = -0.5 for bicubic, as PIL.
template <class T>
T AAFilter(bool cubic, T x) {
  x = std::abs(x);
  if (!cubic) return x < T(1) ? T(1) - x : T(0);
  if (x < T(1)) return Cubic1<T>(x, T(-0.5));
  if (x < T(2)) return Cubic2<T>(x, T(-0.5));
  return T(0);
}

template <class T>
void MakeAATaps(Taps& t, bool cubic, bool align_corners, std::optional<double> scale) {
  const int64_t in = t.in, out = t.out;
  const T sc = AreaScale<T>(in, out, align_corners, scale);
  const T half = static_cast<T>((cubic ? 4 : 2) * 0.5);
  const T support = sc >= T(1) ? half * sc : half;
  const int64_t size = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const T invscale = sc >= T(1) ? T(1) / sc : T(1);
  t.idx.assign(static_cast<size_t>(size), {});
  t.w.assign(static_cast<size_t>(size), {});
  t.padded.assign(static_cast<size_t>(size), {});
  for (int64_t o = 0; o < out; ++o) {
    const T center = static_cast<T>(static_cast<double>(sc) * (static_cast<double>(o) + 0.5));
    const int64_t xmin = std::max(static_cast<int64_t>(static_cast<double>(center - support) + 0.5), int64_t{0});
    const int64_t xsize = std::clamp(
        std::min(static_cast<int64_t>(static_cast<double>(center + support) + 0.5), in) - xmin, int64_t{0}, size);
    std::vector<T> w(static_cast<size_t>(size), T(0));
    T total = T(0);
    for (int64_t j = 0; j < xsize; ++j) {
      const double arg = (static_cast<double>(static_cast<T>(j + xmin) - center) + 0.5) * static_cast<double>(invscale);
      w[j] = AAFilter<T>(cubic, static_cast<T>(arg));
      total += w[j];
    }
    if (total != T(0)) {
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    }
    for (int64_t j = 0; j < size; ++j) {
      t.idx[j].push_back(std::min(xmin + (j < xsize ? j : 0), in - 1));
      t.w[j].push_back(static_cast<double>(w[j]));
      t.padded[j].push_back(j >= xsize);
    }
  }
}

template <class T>
Taps MakeTaps(Mode mode, int64_t in, int64_t out, bool align_corners, std::optional<double> scale, bool shortcut) {
  Taps t;
  t.in = in;
  t.out = out;
  if (mode == Mode::kLinearAA || mode == Mode::kCubicAA) {
    // The CPU skips a dimension whose size does not change.
    t.identity = in == out;
    if (!t.identity) MakeAATaps<T>(t, mode == Mode::kCubicAA, align_corners, scale);
    return t;
  }
  if (mode == Mode::kNearest || mode == Mode::kNearestExact) {
    t.idx.resize(1);
    const float s = ScaleValue<float>(scale, in, out);
    for (int64_t o = 0; o < out; ++o) {
      int64_t i;
      if (mode == Mode::kNearest) {
        // The CPU's backward, and its 2-D forward, copy when the sizes agree
        // and halve at twice the size, whatever the scale says.
        if (shortcut && out == in) i = o;
        else if (shortcut && out == 2 * in) i = o >> 1;
        else i = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * s)), in - 1);
      } else {
        const float p = static_cast<float>((static_cast<double>(o) + 0.5) * s);
        i = std::min(static_cast<int64_t>(std::floor(p)), in - 1);
      }
      t.idx[0].push_back(i);
    }
    bool ident = out == in, rep = out % in == 0;
    for (int64_t o = 0; o < out; ++o) {
      ident = ident && t.idx[0][o] == o;
      rep = rep && t.idx[0][o] == o / (out / in);
    }
    t.identity = ident;
    if (rep && !ident) t.repeat = out / in;
    return t;
  }
  const T sc = AreaScale<T>(in, out, align_corners, scale);
  if (mode == Mode::kLinear) {
    t.idx.resize(2);
    t.w.resize(2);
    // The CPU copies when the sizes agree, whatever the scale says.
    t.identity = out == in;
    for (int64_t o = 0; o < out; ++o) {
      int64_t i0;
      T l1;
      if (t.identity) {
        i0 = o;
        l1 = T(0);
      } else {
        IndexAndLambda(SourceIndex(sc, o, align_corners, false), in, &i0, &l1);
      }
      const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
      t.idx[0].push_back(i0);
      t.idx[1].push_back(i1);
      t.w[0].push_back(static_cast<double>(T(1) - l1));
      t.w[1].push_back(static_cast<double>(l1));
    }
    return t;
  }
  t.idx.resize(4);
  t.w.resize(4);
  const T a = static_cast<T>(-0.75);
  for (int64_t o = 0; o < out; ++o) {
    const T real = SourceIndex(sc, o, align_corners, true);
    int64_t i;
    T l;
    IndexAndLambda(real, in, &i, &l);
    const T x2 = T(1) - l;
    const T c[4] = {Cubic2<T>(l + T(1), a), Cubic1<T>(l, a), Cubic1<T>(x2, a), Cubic2<T>(x2 + T(1), a)};
    for (int j = 0; j < 4; ++j) {
      t.idx[j].push_back(std::max<int64_t>(std::min<int64_t>(i - 1 + j, in - 1), 0));
      t.w[j].push_back(static_cast<double>(c[j]));
    }
  }
  return t;
}

// The type the weights are applied in: the CPU's opmath type.
at::ScalarType ComputeType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// shortcut: nearest takes the CPU's copy/halve shortcuts (see MakeTaps).
Taps TapsFor(Mode mode, at::ScalarType t, int64_t in, int64_t out, bool align_corners, std::optional<double> scale,
             bool shortcut) {
  return t == at::kDouble ? MakeTaps<double>(mode, in, out, align_corners, scale, shortcut)
                          : MakeTaps<float>(mode, in, out, align_corners, scale, shortcut);
}

ir::Value IndexConstant(int d, const std::vector<int64_t>& idx) {
  std::vector<uint8_t> bytes(idx.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), idx.data(), bytes.size());
  return B(d).Constant({ir::DType::I64, {static_cast<int64_t>(idx.size()), 1}}, std::move(bytes));
}

// Weights along `dim` of a value of dims `shape`, in compute type `ct`.
ir::Value WeightConstant(int d, const std::vector<double>& w, at::ScalarType ct, const std::vector<int64_t>& shape,
                         int64_t dim) {
  ir::Builder& b = B(d);
  std::vector<uint8_t> bytes;
  if (ct == at::kDouble) {
    bytes.resize(w.size() * sizeof(double));
    std::memcpy(bytes.data(), w.data(), bytes.size());
  } else {
    std::vector<float> f(w.begin(), w.end());
    bytes.resize(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
  }
  ir::Value c = b.Constant({ToIr(ct), {static_cast<int64_t>(w.size())}}, std::move(bytes));
  return b.BroadcastInDim(c, shape, {dim});
}

// v (tap j of `t`, along `dim`) with 0 where that tap is padding.
ir::Value DropPadded(int d, ir::Value v, int64_t dim, const Taps& t, size_t j) {
  if (t.padded.empty()) return v;
  const std::vector<bool>& pad = t.padded[j];
  if (std::none_of(pad.begin(), pad.end(), [](bool p) { return p; })) return v;
  ir::Builder& b = B(d);
  const ir::Shape vs = b.shape(v);
  std::vector<uint8_t> bytes(pad.begin(), pad.end());
  ir::Value mask = b.BroadcastInDim(b.Constant({ir::DType::Bool, {static_cast<int64_t>(pad.size())}}, std::move(bytes)),
                                    vs.dims, {dim});
  return b.Select(mask, b.Full(vs.dtype, vs.dims, 0), v);
}

// x taken at `idx` along `dim`.
ir::Value TakeAlong(int d, ir::Value x, int64_t dim, const std::vector<int64_t>& idx) {
  ir::Builder& b = B(d);
  const std::vector<int64_t> shape = b.shape(x).dims;
  ir::GatherDims g;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i != dim) g.offset_dims.push_back(i);
  }
  g.collapsed_slice_dims = {dim};
  g.start_index_map = {dim};
  g.index_vector_dim = 1;
  std::vector<int64_t> slice = shape;
  slice[dim] = 1;
  return b.Gather(x, IndexConstant(d, idx), g, slice);
}

// acc plus `updates` added at `idx` along `dim`.
ir::Value AddAlong(int d, ir::Value acc, int64_t dim, const std::vector<int64_t>& idx, ir::Value updates) {
  ir::Builder& b = B(d);
  const int64_t rank = static_cast<int64_t>(b.shape(acc).dims.size());
  ir::ScatterDims s;
  for (int64_t i = 0; i < rank; ++i) {
    if (i != dim) s.update_window_dims.push_back(i);
  }
  s.inserted_window_dims = {dim};
  s.scatter_dims_to_operand_dims = {dim};
  s.index_vector_dim = 1;
  return b.Scatter(acc, IndexConstant(d, idx), updates, s, false);
}

// One forward pass along `dim` (x in the compute type, or any type for nearest).
ir::Value Forward(int d, ir::Value x, int64_t dim, const Taps& t) {
  ir::Builder& b = B(d);
  if (t.identity && t.w.empty()) return x;
  std::vector<int64_t> shape = b.shape(x).dims;
  if (t.repeat > 0) {
    std::vector<int64_t> split(shape.begin(), shape.begin() + dim + 1);
    split.push_back(t.repeat);
    split.insert(split.end(), shape.begin() + dim + 1, shape.end());
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < static_cast<int64_t>(split.size()); ++i) {
      if (i != dim + 1) keep.push_back(i);
    }
    shape[dim] = t.out;
    return b.Reshape(b.BroadcastInDim(x, split, keep), shape);
  }
  // One gather reads every tap (tap-major), then each tap is a slice: one
  // gather kernel per pass rather than one per tap.
  const int64_t k = static_cast<int64_t>(t.idx.size());
  std::vector<int64_t> all;
  for (const auto& v : t.idx) all.insert(all.end(), v.begin(), v.end());
  ir::Value taken = TakeAlong(d, x, dim, all);
  const std::vector<int64_t> tshape = b.shape(taken).dims;
  std::vector<int64_t> starts(tshape.size(), 0), limits = tshape, strides(tshape.size(), 1);
  ir::Value r;
  for (int64_t j = 0; j < k; ++j) {
    starts[dim] = j * t.out;
    limits[dim] = (j + 1) * t.out;
    ir::Value v = k == 1 ? taken : b.Slice(taken, starts, limits, strides);
    if (!t.w.empty()) {
      const ir::Shape& vs = b.shape(v);
      v = b.Binary(Op::Mul, v, WeightConstant(d, t.w[j], ToAten(vs.dtype), vs.dims, dim));
      v = DropPadded(d, v, dim, t, j);
    }
    r = j == 0 ? v : b.Binary(Op::Add, r, v);
  }
  return r;
}

// One backward pass along `dim`: g has t.out there; the result t.in.
ir::Value Backward(int d, ir::Value g, int64_t dim, const Taps& t) {
  ir::Builder& b = B(d);
  if (t.identity && t.w.empty()) return g;
  const ir::Shape gs = b.shape(g);
  std::vector<int64_t> shape = gs.dims;
  if (t.repeat > 0) {
    std::vector<int64_t> split(shape.begin(), shape.begin() + dim);
    split.push_back(t.in);
    split.push_back(t.repeat);
    split.insert(split.end(), shape.begin() + dim + 1, shape.end());
    return b.Reduce(b.Reshape(g, split), b.ScalarConstant(gs.dtype, 0), {dim + 1}, ir::ReduceKind::Sum);
  }
  shape[dim] = t.in;
  // Every tap's weighted gradient in one scatter (tap-major, as Forward).
  std::vector<int64_t> all;
  std::vector<ir::Value> parts;
  for (size_t j = 0; j < t.idx.size(); ++j) {
    all.insert(all.end(), t.idx[j].begin(), t.idx[j].end());
    parts.push_back(t.w.empty() ? g
                                : DropPadded(d, b.Binary(Op::Mul, g, WeightConstant(d, t.w[j], ToAten(gs.dtype), gs.dims, dim)),
                                             dim, t, j));
  }
  ir::Value updates = parts.size() == 1 ? parts[0] : b.Concatenate(parts, dim);
  return AddAlong(d, b.Full(gs.dtype, shape, 0), dim, all, updates);
}

// The spatial dims of an input of rank 2 + n, and its validity.
void CheckSizes(const char* op, at::IntArrayRef input, at::IntArrayRef output, size_t n) {
  TORCH_CHECK(output.size() == n, op, ": expected output_size with ", n, " elements, got ", output.size());
  TORCH_CHECK(input.size() == n + 2, op, ": expected a ", n + 2, "D input (batch, channels and ", n,
              " spatial dimensions), got ", input.size(), "D");
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(input[i + 2] > 0 && output[i] > 0, op, ": input and output sizes should be greater than 0, got input ",
                input, " and output ", output);
  }
}

bool IsNearest(Mode m) { return m == Mode::kNearest || m == Mode::kNearestExact; }

// `cpu` runs the op on a CPU tensor, for the inputs that fall back.
at::Tensor Upsample(const char* op, Mode mode, const at::Tensor& self, at::IntArrayRef output_size, bool align_corners,
                    const std::vector<std::optional<double>>& scales,
                    const std::function<at::Tensor(const at::Tensor&)>& cpu = nullptr) {
  const size_t n = scales.size();
  CheckSizes(op, self.sizes(), output_size, n);
  const at::ScalarType t = self.scalar_type();
  // The CPU's kernels: nearest for floating types and uint8, the others for real types.
  if (at::isComplexType(t) || (IsNearest(mode) && !at::isFloatingType(t) && t != at::kByte)) {
    const bool nearest = IsNearest(mode), linear = mode == Mode::kLinear || mode == Mode::kLinearAA;
    TORCH_CHECK_NOT_IMPLEMENTED(false, "\"",
                                n == 2 && nearest  ? "upsample_nearest2d_channels_last"
                                : n == 2 && linear ? "upsample_bilinear2d_channels_last"
                                : nearest          ? "compute_indices_weights_nearest"
                                : linear           ? "compute_indices_weights_linear"
                                                   : "compute_indices_weights_cubic",
                                "\" not implemented for '", t, "'");
  }
  if (!IsNearest(mode) && !at::isFloatingType(t)) {
    // The CPU interpolates integer images (uint8) with its own fixed-point
    // rounding: run it there, counted as a fallback (docs/semantics.md).
    runtime::Metrics::Get().Fallback(std::string("aten::") + op, runtime::Runtime::Location());
    return cpu(self.cpu()).to(self.device());
  }
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const at::ScalarType ct = IsNearest(mode) ? t : ComputeType(t);
  ir::Value x = ValAs(self, ct);
  for (size_t k = n; k-- > 0;) {
    const int64_t dim = static_cast<int64_t>(k) + 2;
    x = Forward(d, x, dim, TapsFor(mode, t, self.size(dim), output_size[k], align_corners, scales[k], n == 2));
  }
  return Wrap(b.Convert(x, ToIr(t)), d);
}

at::Tensor UpsampleBackward(const char* op, Mode mode, const at::Tensor& grad, at::IntArrayRef output_size,
                            at::IntArrayRef input_size, bool align_corners,
                            const std::vector<std::optional<double>>& scales) {
  const size_t n = scales.size();
  CheckSizes(op, input_size, output_size, n);
  std::vector<int64_t> expect(input_size.begin(), input_size.begin() + 2);
  expect.insert(expect.end(), output_size.begin(), output_size.end());
  TORCH_CHECK(grad.sizes().vec() == expect, op, ": expected grad_output of size ", expect, ", got ", grad.sizes());
  const at::ScalarType t = grad.scalar_type();
  TORCH_CHECK(at::isFloatingType(t), op, " on pjrt supports floating-point gradients, got ", t);
  TraceScope s;
  const int d = DeviceIndex(grad);
  ir::Builder& b = B(d);
  ir::Value g = ValAs(grad, ComputeType(t));
  // The CPU's bicubic backward copies when all sizes agree, whatever the scales.
  bool same = mode == Mode::kCubic;
  for (size_t k = 0; k < n; ++k) same = same && input_size[k + 2] == output_size[k];
  if (same) return Wrap(b.Convert(g, ToIr(t)), d);
  for (size_t k = 0; k < n; ++k) {
    const int64_t dim = static_cast<int64_t>(k) + 2;
    g = Backward(d, g, dim, TapsFor(mode, t, input_size[dim], output_size[k], align_corners, scales[k], true));
  }
  return Wrap(b.Convert(g, ToIr(t)), d);
}

using Scale = std::optional<double>;

// ------------------------------------------------------------------ nearest

at::Tensor nearest1d(const at::Tensor& x, at::IntArrayRef o, Scale sw) {
  return Upsample("upsample_nearest1d", Mode::kNearest, x, o, false, {sw});
}
at::Tensor nearest2d(const at::Tensor& x, at::IntArrayRef o, Scale sh, Scale sw) {
  return Upsample("upsample_nearest2d", Mode::kNearest, x, o, false, {sh, sw});
}
at::Tensor nearest3d(const at::Tensor& x, at::IntArrayRef o, Scale sd, Scale sh, Scale sw) {
  return Upsample("upsample_nearest3d", Mode::kNearest, x, o, false, {sd, sh, sw});
}
at::Tensor nearest1d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sw) {
  return UpsampleBackward("upsample_nearest1d_backward", Mode::kNearest, g, o, i, false, {sw});
}
at::Tensor nearest2d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sh, Scale sw) {
  return UpsampleBackward("upsample_nearest2d_backward", Mode::kNearest, g, o, i, false, {sh, sw});
}
at::Tensor nearest3d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sd, Scale sh, Scale sw) {
  return UpsampleBackward("upsample_nearest3d_backward", Mode::kNearest, g, o, i, false, {sd, sh, sw});
}

at::Tensor exact1d(const at::Tensor& x, at::IntArrayRef o, Scale sw) {
  return Upsample("_upsample_nearest_exact1d", Mode::kNearestExact, x, o, false, {sw});
}
at::Tensor exact2d(const at::Tensor& x, at::IntArrayRef o, Scale sh, Scale sw) {
  return Upsample("_upsample_nearest_exact2d", Mode::kNearestExact, x, o, false, {sh, sw});
}
at::Tensor exact3d(const at::Tensor& x, at::IntArrayRef o, Scale sd, Scale sh, Scale sw) {
  return Upsample("_upsample_nearest_exact3d", Mode::kNearestExact, x, o, false, {sd, sh, sw});
}
at::Tensor exact1d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sw) {
  return UpsampleBackward("_upsample_nearest_exact1d_backward", Mode::kNearestExact, g, o, i, false, {sw});
}
at::Tensor exact2d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sh, Scale sw) {
  return UpsampleBackward("_upsample_nearest_exact2d_backward", Mode::kNearestExact, g, o, i, false, {sh, sw});
}
at::Tensor exact3d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, Scale sd, Scale sh, Scale sw) {
  return UpsampleBackward("_upsample_nearest_exact3d_backward", Mode::kNearestExact, g, o, i, false, {sd, sh, sw});
}

// ------------------------------------------------------- linear and cubic

at::Tensor linear1d(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sw) {
  return Upsample("upsample_linear1d", Mode::kLinear, x, o, ac, {sw},
                  [&](const at::Tensor& c) { return at::upsample_linear1d(c, o, ac, sw); });
}
at::Tensor bilinear2d(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sh, Scale sw) {
  return Upsample("upsample_bilinear2d", Mode::kLinear, x, o, ac, {sh, sw},
                  [&](const at::Tensor& c) { return at::upsample_bilinear2d(c, o, ac, sh, sw); });
}
at::Tensor trilinear3d(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sd, Scale sh, Scale sw) {
  return Upsample("upsample_trilinear3d", Mode::kLinear, x, o, ac, {sd, sh, sw},
                  [&](const at::Tensor& c) { return at::upsample_trilinear3d(c, o, ac, sd, sh, sw); });
}
at::Tensor bicubic2d(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sh, Scale sw) {
  return Upsample("upsample_bicubic2d", Mode::kCubic, x, o, ac, {sh, sw},
                  [&](const at::Tensor& c) { return at::upsample_bicubic2d(c, o, ac, sh, sw); });
}
at::Tensor linear1d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sw) {
  return UpsampleBackward("upsample_linear1d_backward", Mode::kLinear, g, o, i, ac, {sw});
}
at::Tensor bilinear2d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sh, Scale sw) {
  return UpsampleBackward("upsample_bilinear2d_backward", Mode::kLinear, g, o, i, ac, {sh, sw});
}
at::Tensor trilinear3d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sd, Scale sh,
                          Scale sw) {
  return UpsampleBackward("upsample_trilinear3d_backward", Mode::kLinear, g, o, i, ac, {sd, sh, sw});
}
at::Tensor bicubic2d_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sh, Scale sw) {
  return UpsampleBackward("upsample_bicubic2d_backward", Mode::kCubic, g, o, i, ac, {sh, sw});
}
at::Tensor bilinear2d_aa(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sh, Scale sw) {
  return Upsample("_upsample_bilinear2d_aa", Mode::kLinearAA, x, o, ac, {sh, sw},
                  [&](const at::Tensor& c) { return at::_upsample_bilinear2d_aa(c, o, ac, sh, sw); });
}
at::Tensor bicubic2d_aa(const at::Tensor& x, at::IntArrayRef o, bool ac, Scale sh, Scale sw) {
  return Upsample("_upsample_bicubic2d_aa", Mode::kCubicAA, x, o, ac, {sh, sw},
                  [&](const at::Tensor& c) { return at::_upsample_bicubic2d_aa(c, o, ac, sh, sw); });
}
at::Tensor bilinear2d_aa_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sh, Scale sw) {
  return UpsampleBackward("_upsample_bilinear2d_aa_backward", Mode::kLinearAA, g, o, i, ac, {sh, sw});
}
at::Tensor bicubic2d_aa_bw(const at::Tensor& g, at::IntArrayRef o, at::IntArrayRef i, bool ac, Scale sh, Scale sw) {
  return UpsampleBackward("_upsample_bicubic2d_aa_backward", Mode::kCubicAA, g, o, i, ac, {sh, sw});
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("upsample_nearest1d", nearest1d);
  TPJ_LAID(m, "upsample_nearest2d", kInput, nearest2d);
  K("upsample_nearest3d", nearest3d);
  K("upsample_nearest1d_backward", nearest1d_bw);
  TPJ_LAID(m, "upsample_nearest2d_backward", kInput, nearest2d_bw);
  K("upsample_nearest3d_backward", nearest3d_bw);
  K("_upsample_nearest_exact1d", exact1d);
  TPJ_LAID(m, "_upsample_nearest_exact2d", kInput, exact2d);
  K("_upsample_nearest_exact3d", exact3d);
  K("_upsample_nearest_exact1d_backward", exact1d_bw);
  TPJ_LAID(m, "_upsample_nearest_exact2d_backward", kInput, exact2d_bw);
  K("_upsample_nearest_exact3d_backward", exact3d_bw);
  K("upsample_linear1d", linear1d);
  TPJ_LAID(m, "upsample_bilinear2d", kInput, bilinear2d);
  K("upsample_trilinear3d", trilinear3d);
  TPJ_LAID(m, "upsample_bicubic2d", kInput, bicubic2d);
  K("upsample_linear1d_backward", linear1d_bw);
  TPJ_LAID(m, "upsample_bilinear2d_backward", kInput, bilinear2d_bw);
  K("upsample_trilinear3d_backward", trilinear3d_bw);
  TPJ_LAID(m, "upsample_bicubic2d_backward", kInput, bicubic2d_bw);
  TPJ_LAID(m, "_upsample_bilinear2d_aa", kInput, bilinear2d_aa);
  TPJ_LAID(m, "_upsample_bicubic2d_aa", kInput, bicubic2d_aa);
  TPJ_LAID(m, "_upsample_bilinear2d_aa_backward", kInput, bilinear2d_aa_bw);
  TPJ_LAID(m, "_upsample_bicubic2d_aa_backward", kInput, bicubic2d_aa_bw);
}
