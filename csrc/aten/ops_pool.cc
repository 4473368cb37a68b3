// Pooling over 2 or 3 spatial dims, forward and backward: max (with the
// CPU's flat indices) and its inverse max_unpool, average (its divisors:
// padding counted or not, a divisor override, ceil_mode windows cut at the
// padded edge), adaptive average and adaptive max (windows
// [floor(o*in/out), ceil((o+1)*in/out))). 1-d pooling reaches these through
// the 2-d ops, as on the CPU.
//
// Inputs are viewed as [N, spatial...] with batch and channels merged; the
// spatial dims are 1..n of that view.

#include <algorithm>
#include <cstring>

#include <ATen/ops/max_pool1d_native.h>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;
using ir::ReduceKind;

// One pooling's geometry, per spatial dim.
struct Pool {
  int64_t n = 0;  // spatial dims
  std::vector<int64_t> k, s, p, dil, in, out;
  std::vector<int64_t> extra;  // ceil_mode padding beyond p at the high end
};

const char* Words(int64_t n) { return n == 2 ? "two" : "three"; }

// A size argument of one or n ints (an empty stride is the kernel).
std::vector<int64_t> PerDim(at::IntArrayRef v, int64_t n, const char* op, const char* what,
                            const std::vector<int64_t>& if_empty) {
  if (v.empty() && !if_empty.empty()) return if_empty;
  TORCH_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == n, op, ": ", what,
              " must either be a single int, or a tuple of ", Words(n), " ints");
  return v.size() == 1 ? std::vector<int64_t>(static_cast<size_t>(n), v[0]) : v.vec();
}

// The input's rank: n + 1 (unbatched) or n + 2; only a batch may be empty.
void CheckInput(const at::Tensor& x, int64_t n, const char* op) {
  bool ok = x.dim() == n + 1 || x.dim() == n + 2;
  for (int64_t i = x.dim() == n + 2 ? 1 : 0; ok && i < x.dim(); ++i) ok = x.size(i) > 0;
  TORCH_CHECK(ok, op, ": Expected ", n + 1, "D or ", n + 2, "D (batch mode) tensor with optional 0 dim batch size for "
              "input, but got: ", x.sizes());
}

// PyTorch's pooling_output_shape.
int64_t PoolOut(int64_t in, int64_t k, int64_t p, int64_t s, int64_t dil, bool ceil_mode) {
  const int64_t span = in + 2 * p - dil * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (span >= 0 ? span / s : -((-span + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

Pool MakePool(const at::Tensor& x, int64_t n, at::IntArrayRef k, at::IntArrayRef st, at::IntArrayRef pad,
              at::IntArrayRef dil, bool ceil_mode, const char* op) {
  CheckInput(x, n, op);
  Pool p;
  p.n = n;
  p.k = PerDim(k, n, op, "kernel_size", {});
  p.s = PerDim(st, n, op, "stride", p.k);
  p.p = PerDim(pad, n, op, "padding", {});
  p.dil = PerDim(dil, n, op, "dilation", std::vector<int64_t>(static_cast<size_t>(n), 1));
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(p.k[i] > 0, op, ": kernel size should be greater than zero, but got ", p.k);
    TORCH_CHECK(p.s[i] > 0, op, ": stride should be greater than zero, but got ", p.s);
    TORCH_CHECK(p.dil[i] > 0, op, ": dilation should be greater than zero, but got ", p.dil);
    TORCH_CHECK(p.p[i] >= 0 && p.p[i] <= p.k[i] / 2, op, ": pad should be at most half of effective kernel size, but got pad=",
                p.p, ", kernel_size=", p.k, " and dilation=", p.dil);
  }
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    p.in.push_back(x.size(x.dim() - n + i));
    p.out.push_back(PoolOut(p.in[i], p.k[i], p.p[i], p.s[i], p.dil[i], ceil_mode));
    ok = ok && p.out[i] > 0;
    p.extra.push_back(std::max<int64_t>(0, (p.out[i] - 1) * p.s[i] + (p.k[i] - 1) * p.dil[i] + 1 - (p.in[i] + 2 * p.p[i])));
  }
  TORCH_CHECK(ok, op, ": given input size ", x.sizes(), ", the calculated output size ", p.out, " is too small");
  return p;
}

int64_t Numel(const std::vector<int64_t>& v) {
  int64_t r = 1;
  for (int64_t x : v) r *= x;
  return r;
}

// x of `shape` as [N, last n dims...].
ir::Value Batched(int d, ir::Value x, const std::vector<int64_t>& shape, int64_t n) {
  std::vector<int64_t> dims(shape.end() - n, shape.end());
  dims.insert(dims.begin(), Numel(shape) / std::max<int64_t>(Numel(dims), 1));
  return B(d).Reshape(x, dims);
}

// `shape` with its last n dims replaced by `spatial`.
std::vector<int64_t> WithSpatial(std::vector<int64_t> shape, const std::vector<int64_t>& spatial) {
  std::copy(spatial.begin(), spatial.end(), shape.end() - static_cast<int64_t>(spatial.size()));
  return shape;
}

// v repeated over [N, dims...] (v has the spatial dims only).
ir::Value OverBatch(int d, ir::Value v, int64_t bsz, const std::vector<int64_t>& dims) {
  std::vector<int64_t> to{bsz}, map;
  to.insert(to.end(), dims.begin(), dims.end());
  for (size_t i = 0; i < dims.size(); ++i) map.push_back(static_cast<int64_t>(i) + 1);
  return B(d).BroadcastInDim(v, to, map);
}

// Values placed by flat spatial index into `shape` (zeros elsewhere), over
// [N, spatial...]: the gradient of a pooling that picked input elements
// (added where windows overlap), and max_unpool (written, replace).
ir::Value PlaceByIndex(int d, ir::Value values, ir::Value index, const std::vector<int64_t>& shape, int64_t n,
                       at::ScalarType t, bool replace) {
  ir::Builder& b = B(d);
  const int64_t in = Numel({shape.end() - n, shape.end()});
  const int64_t bsz = Numel(shape) / std::max<int64_t>(in, 1);
  const int64_t per = b.shape(values).numel() / std::max<int64_t>(bsz, 1);
  ir::Value g = b.Reshape(values, {bsz, per});
  ir::Value idx = b.Reshape(index, {bsz, per});
  ir::Value brow = b.Iota({ir::DType::I64, {bsz, per}}, 0);
  ir::Value coords = b.Concatenate({b.Reshape(brow, {bsz, per, 1}), b.Reshape(idx, {bsz, per, 1})}, 2);
  ir::ScatterDims sd;
  sd.inserted_window_dims = {0, 1};
  sd.scatter_dims_to_operand_dims = {0, 1};
  sd.index_vector_dim = 2;
  ir::Value r = b.Scatter(Fill(d, 0, t, {bsz, in}), coords, g, sd, replace);
  return b.Reshape(r, shape);
}

at::Tensor ScatterByIndex(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices, int64_t n) {
  TraceScope s;
  const int d = CommonDevice({&grad, &self, &indices});
  TORCH_CHECK(grad.sizes() == indices.sizes(), "pooling backward: grad of shape ", grad.sizes(),
              " does not match the indices' shape ", indices.sizes());
  const at::ScalarType t = self.scalar_type();
  return Wrap(PlaceByIndex(d, ValAs(grad, t), Val(indices), self.sizes().vec(), n, t, false), d);
}

// max_unpool: each value written at its index of an output of
// `output_size`; an index outside it raises when the result is read.
at::Tensor MaxUnpool(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef output_size, int64_t n,
                     const char* op) {
  TORCH_CHECK(indices.scalar_type() == at::kLong, op, "(): elements in indices should be type int64 but got: ",
              indices.scalar_type());
  TORCH_CHECK(static_cast<int64_t>(output_size.size()) == n, op, "(): There should be exactly ", n,
              " elements (depth, height, width) in output_size, but got ", output_size.size(), " elements.");
  TORCH_CHECK(self.dim() == n + 1 || self.dim() == n + 2, op, "(): Expected ", n + 1, "d or ", n + 2,
              "d tensor, but got ", self.sizes());
  TORCH_CHECK(self.sizes() == indices.sizes(), op, "(): Shape of indices (", indices.sizes(),
              ") should match shape of input (", self.sizes(), ")");
  std::vector<int64_t> out;
  for (const c10::SymInt& v : output_size) out.push_back(v.guard_int(__FILE__, __LINE__));
  TraceScope s;
  const int d = CommonDevice({&self, &indices});
  const at::ScalarType t = self.scalar_type();
  const auto oshape = WithSpatial(self.sizes().vec(), out);
  if (self.numel() == 0) return Wrap(Fill(d, 0, t, oshape), d);
  ir::Value idx = CheckedIndex(d, Val(indices), Numel(out), false, op, runtime::ErrorKind::kValue);
  return Wrap(PlaceByIndex(d, Val(self), idx, oshape, n, t, true), d);
}
at::Tensor max_unpool2d(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef output_size) {
  return MaxUnpool(self, indices, output_size, 2, "max_unpool2d");
}
at::Tensor max_unpool3d(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef output_size,
                        at::IntArrayRef, at::IntArrayRef) {
  return MaxUnpool(self, indices, output_size, 3, "max_unpool3d");
}

// The window element that beats `best`, in the CPU's loop: greater, or any
// NaN (so the last NaN of a window wins).
ir::Value Better(ir::Builder& b, ir::Value v, ir::Value best, at::ScalarType t) {
  ir::Value better = b.Compare(ir::CompareDir::GT, v, best);
  if (!at::isFloatingType(t)) return better;
  return b.Binary(Op::Or, better, b.Compare(ir::CompareDir::NE, v, v));
}

// ---------------------------------------------------------------------- max

// One strided slice of the padded input per kernel offset, compared in the
// CPU's order: from the lowest value at the window's first element inside
// the input, an element wins when greater or NaN (the first maximum, the
// last NaN); padding never wins.
std::tuple<at::Tensor, at::Tensor> MaxPool(const at::Tensor& self, int64_t n, at::IntArrayRef k, at::IntArrayRef st,
                                           at::IntArrayRef pad, at::IntArrayRef dil, bool ceil_mode, const char* op) {
  CheckNotBool(self.scalar_type(), n == 2 ? "max_pool2d" : "max_pool3d");
  Pool p = MakePool(self, n, k, st, pad, dil, ceil_mode, op);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const auto shape = self.sizes().vec();
  ir::Value x = Batched(d, Val(self), shape, n);
  const int64_t bsz = b.shape(x).dims[0];
  std::vector<int64_t> lo{0}, hi{0}, oshape{bsz};
  for (int64_t i = 0; i < n; ++i) {
    lo.push_back(p.p[i]);
    hi.push_back(p.p[i] + p.extra[i]);
    oshape.push_back(p.out[i]);
  }
  ir::Value padded = b.Pad(x, ExtremeConst(d, t, /*lowest=*/true), lo, hi, std::vector<int64_t>(n + 1, 0));
  // which padded positions are the input's
  const std::vector<int64_t> none(n, 0);
  ir::Value inside = b.Pad(b.Full(ir::DType::Bool, p.in, 1), b.ScalarConstant(ir::DType::Bool, 0),
                           std::vector<int64_t>(lo.begin() + 1, lo.end()), std::vector<int64_t>(hi.begin() + 1, hi.end()), none);
  std::vector<int64_t> in_stride(n, 1);
  for (int64_t i = n - 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * p.in[i + 1];
  auto i64 = [&](double v) { return Fill(d, v, at::kLong, oshape); };
  // flat index of the window's first element, o_i * s_i - p_i per dim, and
  // of its first element inside the input (the CPU's index when no element
  // beats the lowest value)
  ir::Value base = i64(0), first = i64(0);
  for (int64_t i = 0; i < n; ++i) {
    ir::Value o = b.Iota({ir::DType::I64, oshape}, i + 1);
    ir::Value pos = b.Binary(Op::Sub, b.Binary(Op::Mul, o, i64(static_cast<double>(p.s[i]))), i64(static_cast<double>(p.p[i])));
    ir::Value below = b.Binary(Op::Max, b.Binary(Op::Sub, i64(0), pos), i64(0));
    ir::Value steps = b.Binary(Op::Div, b.Binary(Op::Add, below, i64(static_cast<double>(p.dil[i] - 1))),
                               i64(static_cast<double>(p.dil[i])));
    ir::Value in_pos = b.Binary(Op::Add, pos, b.Binary(Op::Mul, steps, i64(static_cast<double>(p.dil[i]))));
    base = b.Binary(Op::Add, base, b.Binary(Op::Mul, pos, i64(static_cast<double>(in_stride[i]))));
    first = b.Binary(Op::Add, first, b.Binary(Op::Mul, in_pos, i64(static_cast<double>(in_stride[i]))));
  }
  ir::Value best = BroadcastTo(d, ExtremeConst(d, t, /*lowest=*/true), oshape), best_idx = first;
  std::vector<int64_t> off(n, 0);  // the kernel offset, row-major
  for (int64_t w = 0, count = Numel(p.k); w < count; ++w) {
    for (int64_t i = n - 1, rest = w; i >= 0; --i) {
      off[i] = rest % p.k[i];
      rest /= p.k[i];
    }
    std::vector<int64_t> start{0}, limit{bsz}, step{1};
    int64_t shift = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r0 = off[i] * p.dil[i];
      start.push_back(r0);
      limit.push_back(r0 + (p.out[i] - 1) * p.s[i] + 1);
      step.push_back(p.s[i]);
      shift += r0 * in_stride[i];
    }
    ir::Value v = b.Slice(padded, start, limit, step);
    ir::Value valid = b.Slice(inside, std::vector<int64_t>(start.begin() + 1, start.end()),
                              std::vector<int64_t>(limit.begin() + 1, limit.end()), std::vector<int64_t>(step.begin() + 1, step.end()));
    ir::Value idx = b.Binary(Op::Add, base, i64(static_cast<double>(shift)));
    ir::Value better = b.Binary(Op::And, OverBatch(d, valid, bsz, p.out), Better(b, v, best, t));
    best = b.Select(better, v, best);
    best_idx = b.Select(better, idx, best_idx);
  }
  const auto out = WithSpatial(shape, p.out);
  return {Wrap(b.Reshape(best, out), d), Wrap(b.Reshape(best_idx, out), d)};
}

// max_pool1d without indices: the CPU runs its own kernel, built for
// floating types only; elsewhere the composite takes max_pool2d's path,
// which would pool integers.
at::Tensor max_pool1d_autograd(const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st, at::IntArrayRef pad,
                               at::IntArrayRef dil, bool ceil_mode) {
  CheckFloating(self.scalar_type(), "max_pool1d_impl");
  return at::native::max_pool1d(self, k, st, pad, dil, ceil_mode);
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st,
                                                           at::IntArrayRef pad, at::IntArrayRef dil, bool ceil_mode) {
  return MaxPool(self, 2, k, st, pad, dil, ceil_mode, "max_pool2d");
}
std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st,
                                                           at::IntArrayRef pad, at::IntArrayRef dil, bool ceil_mode) {
  return MaxPool(self, 3, k, st, pad, dil, ceil_mode, "max_pool3d");
}
at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef,
                                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                                            const at::Tensor& indices) {
  return ScatterByIndex(grad, self, indices, 2);
}
at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef,
                                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                                            const at::Tensor& indices) {
  return ScatterByIndex(grad, self, indices, 3);
}

// ------------------------------------------------------------------ average

// Divisors per output position, over the spatial dims: the override, or the
// number of window positions inside the input plus (count_include_pad) its
// padding; a ceil_mode window past the padding counts nothing there.
ir::Value AvgDivisor(int d, const Pool& p, bool count_include_pad, std::optional<int64_t> divisor_override,
                     at::ScalarType t) {
  ir::Builder& b = B(d);
  if (divisor_override) return Fill(d, static_cast<double>(*divisor_override), t, p.out);
  const std::vector<int64_t> none(p.n, 0);
  ir::Value region = b.Pad(Fill(d, 1, t, p.in), b.ScalarConstant(ToIr(t), count_include_pad ? 1 : 0), p.p, p.p, none);
  region = b.Pad(region, b.ScalarConstant(ToIr(t), 0), none, p.extra, none);
  return b.ReduceWindow(region, b.ScalarConstant(ToIr(t), 0), ReduceKind::Sum, p.k, p.s, {}, {}, none, none);
}

at::Tensor AvgPool(const at::Tensor& self, int64_t n, at::IntArrayRef k, at::IntArrayRef st, at::IntArrayRef pad,
                   bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override, const char* op) {
  const at::ScalarType t = self.scalar_type(), ct = OpMath(t);
  // the CPU's kernels: floating types and int64
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t) || t == at::kLong, "\"", n == 2 ? "avg_pool2d" : "avg_pool3d_out_frame",
                              "\" not implemented for '", t, "'");
  Pool p = MakePool(self, n, k, st, pad, {}, ceil_mode, op);
  TORCH_CHECK(!divisor_override || *divisor_override != 0, op, ": divisor must be not zero");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  ir::Value x = Batched(d, ValAs(self, ct), shape, n);
  const int64_t bsz = b.shape(x).dims[0];
  std::vector<int64_t> window{1}, stride{1}, lo{0}, hi{0};
  for (int64_t i = 0; i < n; ++i) {
    window.push_back(p.k[i]);
    stride.push_back(p.s[i]);
    lo.push_back(p.p[i]);
    hi.push_back(p.p[i] + p.extra[i]);
  }
  ir::Value sum = b.ReduceWindow(x, b.ScalarConstant(ToIr(ct), 0), ReduceKind::Sum, window, stride, {}, {}, lo, hi);
  ir::Value div = OverBatch(d, AvgDivisor(d, p, count_include_pad, divisor_override, ct), bsz, p.out);
  // the CPU adds each quotient to a zeroed output: never -0.0
  return Wrap(b.Convert(b.Reshape(PlusZero(d, b.Binary(Op::Div, sum, div)), WithSpatial(shape, p.out)), ToIr(t)), d);
}

at::Tensor AvgPoolBackward(const at::Tensor& grad, const at::Tensor& self, int64_t n, at::IntArrayRef k,
                           at::IntArrayRef st, at::IntArrayRef pad, bool ceil_mode, bool count_include_pad,
                           std::optional<int64_t> divisor_override, const char* op) {
  Pool p = MakePool(self, n, k, st, pad, {}, ceil_mode, op);
  TORCH_CHECK(grad.sizes() == at::IntArrayRef(WithSpatial(self.sizes().vec(), p.out)), op,
              ": grad of shape ", grad.sizes(), " does not match the pooled shape");
  TraceScope s;
  const int d = CommonDevice({&grad, &self});
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type(), ct = OpMath(t);
  const auto shape = self.sizes().vec();
  const int64_t bsz = self.numel() / std::max<int64_t>(Numel(p.in), 1);
  std::vector<int64_t> gshape{bsz};
  gshape.insert(gshape.end(), p.out.begin(), p.out.end());
  ir::Value g = b.Reshape(ValAs(grad, ct), gshape);
  g = b.Binary(Op::Div, g, OverBatch(d, AvgDivisor(d, p, count_include_pad, divisor_override, ct), bsz, p.out));
  // Spread each output's gradient over its window: dilate by the stride, pad
  // by k - 1, sum windows of k; then drop the padding.
  std::vector<int64_t> lo{0}, hi{0}, interior{0}, window{1}, start{0}, limit{bsz};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t padded = p.in[i] + 2 * p.p[i] + p.extra[i], spread = (p.out[i] - 1) * p.s[i] + 1;
    lo.push_back(p.k[i] - 1);
    hi.push_back(padded - spread);
    interior.push_back(p.s[i] - 1);
    window.push_back(p.k[i]);
    start.push_back(p.p[i]);
    limit.push_back(p.p[i] + p.in[i]);
  }
  ir::Value dilated = b.Pad(g, b.ScalarConstant(ToIr(ct), 0), lo, hi, interior);
  const std::vector<int64_t> ones(n + 1, 1), none(n + 1, 0);
  ir::Value full = b.ReduceWindow(dilated, b.ScalarConstant(ToIr(ct), 0), ReduceKind::Sum, window, ones, {}, {}, none, none);
  return Wrap(b.Convert(b.Reshape(b.Slice(full, start, limit, ones), shape), ToIr(t)), d);
}

at::Tensor avg_pool2d(const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st, at::IntArrayRef pad, bool ceil_mode,
                      bool count_include_pad, std::optional<int64_t> divisor_override) {
  return AvgPool(self, 2, k, st, pad, ceil_mode, count_include_pad, divisor_override, "avg_pool2d");
}
at::Tensor avg_pool3d(const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st, at::IntArrayRef pad, bool ceil_mode,
                      bool count_include_pad, std::optional<int64_t> divisor_override) {
  return AvgPool(self, 3, k, st, pad, ceil_mode, count_include_pad, divisor_override, "avg_pool3d");
}
at::Tensor avg_pool2d_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st,
                               at::IntArrayRef pad, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override) {
  return AvgPoolBackward(grad, self, 2, k, st, pad, ceil_mode, count_include_pad, divisor_override, "avg_pool2d");
}
at::Tensor avg_pool3d_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef k, at::IntArrayRef st,
                               at::IntArrayRef pad, bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override) {
  return AvgPoolBackward(grad, self, 3, k, st, pad, ceil_mode, count_include_pad, divisor_override, "avg_pool3d");
}

// ----------------------------------------------------------------- adaptive

int64_t WindowStart(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t WindowEnd(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

template <class T>
ir::Value HostConstant(int d, ir::DType t, std::vector<int64_t> dims, const std::vector<T>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(T));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return B(d).Constant({t, std::move(dims)}, std::move(bytes));
}

// The widest window from `in` to `out` elements.
int64_t WidestWindow(int64_t in, int64_t out) {
  int64_t kmax = 0;
  for (int64_t o = 0; o < out; ++o) kmax = std::max(kmax, WindowEnd(o, in, out) - WindowStart(o, in, out));
  return kmax;
}

// The windows of x along `dim` (from `in` to `out` elements) side by side:
// dim becomes [out, kmax]; places past a window's end repeat its last
// element (`valid` says which are its own). `coord` receives each place's
// input position, [out, kmax].
ir::Value Windows(int d, ir::Value x, int64_t dim, int64_t in, int64_t out, std::vector<int64_t>* coord,
                  std::vector<uint8_t>* valid) {
  ir::Builder& b = B(d);
  const std::vector<int64_t> shape = b.shape(x).dims;
  const int64_t kmax = WidestWindow(in, out);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = WindowStart(o, in, out), end = WindowEnd(o, in, out);
    for (int64_t j = 0; j < kmax; ++j) {
      coord->push_back(std::min(start + j, end - 1));
      if (valid) valid->push_back(start + j < end);
    }
  }
  ir::GatherDims g;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (static_cast<int64_t>(i) != dim) g.offset_dims.push_back(static_cast<int64_t>(i));
  }
  g.collapsed_slice_dims = {dim};
  g.start_index_map = {dim};
  g.index_vector_dim = 1;
  std::vector<int64_t> slice = shape;
  slice[dim] = 1;
  ir::Value taken = b.Gather(x, HostConstant(d, ir::DType::I64, {out * kmax, 1}, *coord), g, slice);
  std::vector<int64_t> split(shape.begin(), shape.begin() + dim);
  split.push_back(out);
  split.push_back(kmax);
  split.insert(split.end(), shape.begin() + dim + 1, shape.end());
  return b.Reshape(taken, split);
}

// Adaptive average pooling of x along `dim`. Like the CPU it reads only each
// window's own elements (a matrix product would multiply every NaN or inf
// of the row by zero weights and spread it).
ir::Value AdaptiveAvgAlong(int d, ir::Value x, int64_t dim, int64_t in, int64_t out, at::ScalarType t) {
  ir::Builder& b = B(d);
  const size_t rank = b.shape(x).dims.size();
  ir::Value zero = b.ScalarConstant(ToIr(t), 0);
  if (in % out == 0) {
    std::vector<int64_t> window(rank, 1), none(rank, 0);
    window[dim] = in / out;
    ir::Value sum = PlusZero(d, b.ReduceWindow(x, zero, ReduceKind::Sum, window, window, {}, {}, none, none));
    return b.Binary(Op::Div, sum, Fill(d, static_cast<double>(in / out), t, b.shape(sum).dims));
  }
  std::vector<int64_t> coord;
  std::vector<uint8_t> valid;
  ir::Value taken = Windows(d, x, dim, in, out, &coord, &valid);
  const std::vector<int64_t> split = b.shape(taken).dims;
  const int64_t kmax = split[dim + 1];
  ir::Value mask = b.BroadcastInDim(HostConstant(d, ir::DType::Bool, {out, kmax}, valid), split, {dim, dim + 1});
  ir::Value sum = PlusZero(d, b.Reduce(b.Select(mask, taken, Fill(d, 0, t, split)), zero, {dim + 1}, ReduceKind::Sum));
  std::vector<float> count;
  for (int64_t o = 0; o < out; ++o) count.push_back(static_cast<float>(WindowEnd(o, in, out) - WindowStart(o, in, out)));
  ir::Value c = b.Convert(HostConstant(d, ir::DType::F32, {out}, count), ToIr(t));
  return b.Binary(Op::Div, sum, b.BroadcastInDim(c, b.shape(sum).dims, {dim}));
}

std::vector<int64_t> AdaptiveSize(const at::Tensor& self, at::IntArrayRef output_size, int64_t n, const char* op) {
  TORCH_CHECK(static_cast<int64_t>(output_size.size()) == n, op, ": output_size must be ", n);
  CheckInput(self, n, op);
  for (int64_t o : output_size) TORCH_CHECK(o >= 0, op, ": elements of output_size must be greater than or equal to 0");
  return output_size.vec();
}

at::Tensor AdaptiveAvgPool(const at::Tensor& self, at::IntArrayRef output_size, int64_t n, const char* op) {
  CheckFloating(self.scalar_type(), n == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d_cpu");
  const std::vector<int64_t> out = AdaptiveSize(self, output_size, n, op);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type(), ct = OpMath(t);
  const auto shape = self.sizes().vec();
  const auto oshape = WithSpatial(shape, out);
  if (Numel(oshape) == 0) return Wrap(Fill(d, 0, t, oshape), d);
  ir::Value y = Batched(d, ValAs(self, ct), shape, n);
  for (int64_t i = 0; i < n; ++i) y = AdaptiveAvgAlong(d, y, i + 1, shape[shape.size() - n + i], out[i], ct);
  return Wrap(b.Convert(b.Reshape(y, oshape), ToIr(t)), d);
}

// The gradient of adaptive average pooling along `dim` (from `in` to `out`
// elements): each output's gradient, divided by its window's extent, added
// onto that window's own elements (one scatter), as the CPU spreads it; a
// NaN or inf stays in its window.
ir::Value AdaptiveSpreadAlong(int d, ir::Value g, int64_t dim, int64_t in, int64_t out, at::ScalarType t) {
  ir::Builder& b = B(d);
  const std::vector<int64_t> shape = b.shape(g).dims;
  const int64_t kmax = WidestWindow(in, out);
  std::vector<int64_t> coord;
  std::vector<uint8_t> valid;
  std::vector<float> count;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = WindowStart(o, in, out), end = WindowEnd(o, in, out);
    for (int64_t j = 0; j < kmax; ++j) {
      coord.push_back(std::min(start + j, end - 1));
      valid.push_back(start + j < end);
    }
    count.push_back(static_cast<float>(end - start));
  }
  ir::Value c = b.Convert(HostConstant(d, ir::DType::F32, {out}, count), ToIr(t));
  g = b.Binary(Op::Div, g, b.BroadcastInDim(c, shape, {dim}));
  std::vector<int64_t> split = shape, map;
  split.insert(split.begin() + dim + 1, kmax);
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) map.push_back(i <= dim ? i : i + 1);
  ir::Value spread = b.Select(b.BroadcastInDim(HostConstant(d, ir::DType::Bool, {out, kmax}, valid), split, {dim, dim + 1}),
                              b.BroadcastInDim(g, split, map), Fill(d, 0, t, split));
  std::vector<int64_t> flat = shape, target = shape;
  flat[dim] = out * kmax;
  target[dim] = in;
  ir::ScatterDims sd;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i != dim) sd.update_window_dims.push_back(i);
  }
  sd.inserted_window_dims = {dim};
  sd.scatter_dims_to_operand_dims = {dim};
  sd.index_vector_dim = 1;
  return b.Scatter(Fill(d, 0, t, target), HostConstant(d, ir::DType::I64, {out * kmax, 1}, coord), b.Reshape(spread, flat),
                   sd, false);
}

at::Tensor AdaptiveAvgPoolBackward(const at::Tensor& grad, const at::Tensor& self, int64_t n) {
  TraceScope s;
  const int d = CommonDevice({&grad, &self});
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type(), ct = OpMath(t);
  const auto shape = self.sizes().vec(), gshape = grad.sizes().vec();
  TORCH_CHECK(gshape.size() == shape.size(), "adaptive_avg_pool backward: grad of shape ", grad.sizes(),
              " does not fit the input's ", self.sizes());
  std::vector<int64_t> in(shape.end() - n, shape.end()), out(gshape.end() - n, gshape.end());
  if (self.numel() == 0) return Wrap(Fill(d, 0, t, shape), d);
  ir::Value g = Batched(d, ValAs(grad, ct), gshape, n);
  const int64_t bsz = b.shape(g).dims[0];
  bool tiles = true;
  for (int64_t i = 0; i < n; ++i) tiles = tiles && out[i] > 0 && in[i] % out[i] == 0;
  if (tiles) {
    // windows tile the input: each input takes its window's gradient divided
    // by each window extent in turn (the CPU's order), so NaN stays inside
    std::vector<int64_t> spread{bsz}, map{0};
    for (int64_t i = 0; i < n; ++i) {
      g = b.Binary(Op::Div, g, Fill(d, static_cast<double>(in[i] / out[i]), ct, b.shape(g).dims));
      map.push_back(static_cast<int64_t>(spread.size()));
      spread.push_back(out[i]);
      spread.push_back(in[i] / out[i]);
    }
    return Wrap(b.Convert(b.Reshape(b.BroadcastInDim(g, spread, map), shape), ToIr(t)), d);
  }
  for (int64_t i = 0; i < n; ++i) g = AdaptiveSpreadAlong(d, g, i + 1, in[i], out[i], ct);
  return Wrap(b.Convert(b.Reshape(g, shape), ToIr(t)), d);
}

at::Tensor adaptive_avg_pool2d(const at::Tensor& self, at::IntArrayRef output_size) {
  return AdaptiveAvgPool(self, output_size, 2, "adaptive_avg_pool2d");
}
at::Tensor adaptive_avg_pool3d(const at::Tensor& self, at::IntArrayRef output_size) {
  return AdaptiveAvgPool(self, output_size, 3, "adaptive_avg_pool3d");
}
at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad, const at::Tensor& self) {
  return AdaptiveAvgPoolBackward(grad, self, 2);
}
at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad, const at::Tensor& self) {
  return AdaptiveAvgPoolBackward(grad, self, 3);
}

// Adaptive max: the windows of every spatial dim gathered side by side,
// [N, o1, k1, o2, k2, ...], moved to [N, o1, o2, ..., k1 * k2 * ...] and
// reduced to the first maximum (or the last NaN) in the CPU's row-major
// window order. The repeats that pad a short window copy its last element
// and its offset, so they never change the answer. The index is the input
// position's flat spatial offset.
std::tuple<at::Tensor, at::Tensor> AdaptiveMaxPool(const at::Tensor& self, at::IntArrayRef output_size, int64_t n,
                                                   const char* op) {
  CheckFloating(self.scalar_type(), n == 2 ? "adaptive_max_pool2d" : "adaptive_max_pool3d_cpu");
  const std::vector<int64_t> out = AdaptiveSize(self, output_size, n, op);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const auto shape = self.sizes().vec();
  const auto oshape = WithSpatial(shape, out);
  if (Numel(oshape) == 0) return {Wrap(Fill(d, 0, t, oshape), d), Wrap(Fill(d, 0, at::kLong, oshape), d)};
  const std::vector<int64_t> in(shape.end() - n, shape.end());
  ir::Value x = Batched(d, Val(self), shape, n);
  const int64_t bsz = b.shape(x).dims[0];
  std::vector<int64_t> in_stride(n, 1);
  for (int64_t i = n - 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * in[i + 1];
  ir::Value flat;  // flat input offsets, [o1, k1, o2, k2, ...]
  std::vector<int64_t> flat_dims;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> coord;
    x = Windows(d, x, 2 * i + 1, in[i], out[i], &coord, nullptr);
    for (int64_t& c : coord) c *= in_stride[i];
    const int64_t kmax = static_cast<int64_t>(coord.size()) / out[i];
    ir::Value part = HostConstant(d, ir::DType::I64, {out[i], kmax}, coord);
    std::vector<int64_t> dims = flat_dims;
    dims.push_back(out[i]);
    dims.push_back(kmax);
    std::vector<int64_t> keep(flat_dims.size());
    for (size_t j = 0; j < keep.size(); ++j) keep[j] = static_cast<int64_t>(j);
    const int64_t r = static_cast<int64_t>(flat_dims.size());
    part = b.BroadcastInDim(part, dims, {r, r + 1});
    flat = flat.valid() ? b.Binary(Op::Add, b.BroadcastInDim(flat, dims, keep), part) : part;
    flat_dims = dims;
  }
  // [N, o1, k1, o2, k2, ...] -> [N, o1, o2, ..., k1, k2, ...] -> [N * O, K]
  std::vector<int64_t> perm{0}, wperm;
  int64_t kcount = 1;
  for (int64_t i = 0; i < n; ++i) {
    perm.push_back(2 * i + 1);
    wperm.push_back(2 * i);
    kcount *= flat_dims[2 * i + 1];
  }
  for (int64_t i = 0; i < n; ++i) {
    perm.push_back(2 * i + 2);
    wperm.push_back(2 * i + 1);
  }
  const int64_t ocount = Numel(out);
  ir::Value v = b.Reshape(b.Transpose(x, perm), {bsz * ocount, kcount});
  ir::Value offsets = b.Reshape(b.Transpose(flat, wperm), {ocount, kcount});
  ir::Value best;
  const std::vector<int64_t> rows{bsz * ocount, kcount};
  ir::Value at = b.Reshape(ArgExtreme(d, v, rows, 1, /*is_max=*/true, t, &best), {bsz * ocount});
  if (at::isFloatingType(t)) {
    // the CPU's loop keeps the last NaN (ArgExtreme finds the first)
    ir::Value last_nan = b.Reduce(b.Select(IsNan(d, v), b.Iota({ir::DType::I64, rows}, 1), b.Full(ir::DType::I64, rows, -1)),
                                  b.ScalarConstant(ir::DType::I64, -1), {1}, ReduceKind::Max);
    at = b.Select(b.Compare(ir::CompareDir::GE, last_nan, b.Full(ir::DType::I64, {bsz * ocount}, 0)), last_nan, at);
  }
  // the offset at the winning place: one match per row
  ir::Value place = b.Iota({ir::DType::I64, {bsz, ocount, kcount}}, 2);
  ir::Value hit = b.Compare(ir::CompareDir::EQ, place, b.BroadcastInDim(b.Reshape(at, {bsz, ocount}), {bsz, ocount, kcount}, {0, 1}));
  ir::Value picked = b.Select(hit, b.BroadcastInDim(offsets, {bsz, ocount, kcount}, {1, 2}),
                              Fill(d, 0, at::kLong, {bsz, ocount, kcount}));
  ir::Value idx = b.Reduce(picked, b.ScalarConstant(ir::DType::I64, 0), {2}, ReduceKind::Sum);
  return {Wrap(b.Reshape(best, oshape), d), Wrap(b.Reshape(idx, oshape), d)};
}

std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& self, at::IntArrayRef output_size) {
  return AdaptiveMaxPool(self, output_size, 2, "adaptive_max_pool2d");
}
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool3d(const at::Tensor& self, at::IntArrayRef output_size) {
  return AdaptiveMaxPool(self, output_size, 3, "adaptive_max_pool3d");
}
at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices) {
  return ScatterByIndex(grad, self, indices, 2);
}
at::Tensor adaptive_max_pool3d_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices) {
  return ScatterByIndex(grad, self, indices, 3);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { K("max_pool1d", max_pool1d_autograd); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  TPJ_LAID(m, "max_pool2d_with_indices", kInput, max_pool2d_with_indices);
  TPJ_LAID(m, "max_pool2d_with_indices_backward", kInput, max_pool2d_with_indices_backward);
  TPJ_LAID(m, "max_pool3d_with_indices", kInput, max_pool3d_with_indices);
  TPJ_LAID(m, "max_pool3d_with_indices_backward", kInput, max_pool3d_with_indices_backward);
  TPJ_LAID(m, "avg_pool2d", kInput, avg_pool2d);
  TPJ_LAID(m, "avg_pool2d_backward", kInput, avg_pool2d_backward);
  K("avg_pool3d", avg_pool3d);
  K("avg_pool3d_backward", avg_pool3d_backward);
  TPJ_LAID(m, "_adaptive_avg_pool2d", kInput, adaptive_avg_pool2d);
  TPJ_LAID(m, "_adaptive_avg_pool2d_backward", kInput, adaptive_avg_pool2d_backward);
  K("_adaptive_avg_pool3d", adaptive_avg_pool3d);
  K("_adaptive_avg_pool3d_backward", adaptive_avg_pool3d_backward);
  TPJ_LAID(m, "adaptive_max_pool2d", kInput, adaptive_max_pool2d);
  TPJ_LAID(m, "adaptive_max_pool2d_backward", kInput, adaptive_max_pool2d_backward);
  K("adaptive_max_pool3d", adaptive_max_pool3d);
  K("adaptive_max_pool3d_backward", adaptive_max_pool3d_backward);
  K("max_unpool2d", max_unpool2d);
  K("max_unpool3d", max_unpool3d);
}
