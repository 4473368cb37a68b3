// Reflection and replication padding (F.pad modes "reflect" and "replicate",
// nn.ReflectionPad*d, Conv*d(padding_mode=...)), 1d to 3d, forward and
// backward, from slices, reversals and concatenation: no gather.
//
// Per padded dim of size n with pads (lo, hi): reflect adds x[lo..1] before
// and x[n-2..n-1-hi] after (mirrored without the edge, so a pad must be < n;
// a negative pad then crops), replicate takes x[clamp(o - lo, 0, n - 1)] at
// each output position o (x[0] and x[n-1] repeated; negative pads crop). The
// backward adds each copied element's gradient back to its source.
#include <array>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

ir::Value SliceDim(ir::Builder& b, ir::Value x, int64_t dim, int64_t start, int64_t limit) {
  std::vector<int64_t> dims = b.shape(x).dims;
  std::vector<int64_t> lo(dims.size(), 0), step(dims.size(), 1);
  lo[static_cast<size_t>(dim)] = start;
  dims[static_cast<size_t>(dim)] = limit;
  return b.Slice(x, lo, dims, step);
}

// Zeros before and after x along dim.
ir::Value ZeroPad(ir::Builder& b, ir::Value x, int64_t dim, int64_t before, int64_t after) {
  const ir::Shape s = b.shape(x);
  std::vector<int64_t> low(s.dims.size(), 0), high(s.dims.size(), 0), interior(s.dims.size(), 0);
  low[static_cast<size_t>(dim)] = before;
  high[static_cast<size_t>(dim)] = after;
  return b.Pad(x, b.ScalarConstant(s.dtype, 0), low, high, interior);
}

// x (size 1 along dim) repeated `count` times along dim.
ir::Value Repeat(ir::Builder& b, ir::Value x, int64_t dim, int64_t count) {
  std::vector<int64_t> to = b.shape(x).dims, ident(to.size());
  to[static_cast<size_t>(dim)] = count;
  for (size_t i = 0; i < ident.size(); ++i) ident[i] = static_cast<int64_t>(i);
  return b.BroadcastInDim(x, to, ident);
}

// Sum along dim, kept as a size-1 dim.
ir::Value SumKeep(ir::Builder& b, ir::Value x, int64_t dim) {
  const ir::Shape s = b.shape(x);
  std::vector<int64_t> kept = s.dims;
  kept[static_cast<size_t>(dim)] = 1;
  return b.Reshape(b.Reduce(x, b.ScalarConstant(s.dtype, 0), {dim}, ir::ReduceKind::Sum), kept);
}

// Replication as the CPU indexes it: out[o] = x[clamp(o - lo, 0, n - 1)]
// for o in [0, n + lo + hi): a copies of x[0], x[s, s + mid), c copies of
// x[n - 1] (negative pads crop, down to nothing but edge copies).
struct Replicated {
  int64_t a, s, mid, c;
};
Replicated Replication(int64_t n, int64_t lo, int64_t hi) {
  const int64_t len = n + lo + hi;
  Replicated r;
  r.a = std::min(std::max<int64_t>(lo, 0), len);
  r.c = std::min(std::max<int64_t>(hi, 0), len - r.a);
  r.mid = len - r.a - r.c;
  r.s = std::max<int64_t>(-lo, 0);
  return r;
}

ir::Value PadDim(ir::Builder& b, ir::Value x, int64_t dim, int64_t lo, int64_t hi, bool reflect) {
  const int64_t n = b.shape(x).dims[static_cast<size_t>(dim)];
  std::vector<ir::Value> parts;
  if (!reflect) {
    const Replicated r = Replication(n, lo, hi);
    if (r.a > 0) parts.push_back(Repeat(b, SliceDim(b, x, dim, 0, 1), dim, r.a));
    if (r.mid > 0) parts.push_back(SliceDim(b, x, dim, r.s, r.s + r.mid));
    if (r.c > 0) parts.push_back(Repeat(b, SliceDim(b, x, dim, n - 1, n), dim, r.c));
    return parts.size() == 1 ? parts[0] : b.Concatenate(parts, dim);
  }
  // reflection against x's own edges, then a negative pad crops:
  // out[o] = x[reflect(o - lo)]
  const int64_t plo = std::max<int64_t>(lo, 0), phi = std::max<int64_t>(hi, 0);
  if (plo > 0) parts.push_back(b.Reverse(SliceDim(b, x, dim, 1, plo + 1), {dim}));
  parts.push_back(x);
  if (phi > 0) parts.push_back(b.Reverse(SliceDim(b, x, dim, n - 1 - phi, n - 1), {dim}));
  ir::Value r = parts.size() == 1 ? x : b.Concatenate(parts, dim);
  if (lo >= 0 && hi >= 0) return r;
  const int64_t len = n + plo + phi;
  return SliceDim(b, r, dim, lo < 0 ? -lo : 0, hi < 0 ? len + hi : len);
}

// The gradient of PadDim: g has the padded size along dim; n is the input's.
ir::Value PadDimBackward(ir::Builder& b, ir::Value g, int64_t dim, int64_t n, int64_t lo, int64_t hi, bool reflect) {
  if (!reflect) {
    const Replicated r = Replication(n, lo, hi);
    std::vector<int64_t> zeros = b.shape(g).dims;
    zeros[static_cast<size_t>(dim)] = n;
    ir::Value grad = b.Full(b.shape(g).dtype, zeros, 0);
    if (r.a > 0) grad = b.Binary(Op::Add, grad, ZeroPad(b, SumKeep(b, SliceDim(b, g, dim, 0, r.a), dim), dim, 0, n - 1));
    if (r.mid > 0) {
      grad = b.Binary(Op::Add, grad, ZeroPad(b, SliceDim(b, g, dim, r.a, r.a + r.mid), dim, r.s, n - r.s - r.mid));
    }
    if (r.c > 0) {
      ir::Value right = SumKeep(b, SliceDim(b, g, dim, r.a + r.mid, r.a + r.mid + r.c), dim);
      grad = b.Binary(Op::Add, grad, ZeroPad(b, right, dim, n - 1, 0));
    }
    return grad;
  }
  // undo the crop (zeros where the reflection was cut off), then the reflection
  if (lo < 0 || hi < 0) g = ZeroPad(b, g, dim, lo < 0 ? -lo : 0, hi < 0 ? -hi : 0);
  lo = std::max<int64_t>(lo, 0);
  hi = std::max<int64_t>(hi, 0);
  ir::Value grad = SliceDim(b, g, dim, lo, lo + n);
  if (lo > 0) grad = b.Binary(Op::Add, grad, ZeroPad(b, b.Reverse(SliceDim(b, g, dim, 0, lo), {dim}), dim, 1, n - 1 - lo));
  if (hi > 0) {
    ir::Value right = b.Reverse(SliceDim(b, g, dim, lo + n, lo + n + hi), {dim});
    grad = b.Binary(Op::Add, grad, ZeroPad(b, right, dim, n - 1 - hi, 1));
  }
  return grad;
}

// Checks the input's rank and the pads; returns the padded dims, innermost
// first, with their (lo, hi).
std::vector<std::array<int64_t, 3>> Plan(const at::Tensor& x, c10::SymIntArrayRef padding, int64_t k, bool reflect,
                                         const char* op) {
  TORCH_CHECK(static_cast<int64_t>(padding.size()) == 2 * k, op, ": expected ", 2 * k, " pads, got ", padding.size());
  TORCH_CHECK(x.dim() == k + 1 || x.dim() == k + 2, op, ": expected a ", k + 1, "D or ", k + 2, "D input, got ", x.dim(),
              "D of shape ", x.sizes());
  std::vector<std::array<int64_t, 3>> plan;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t dim = x.dim() - 1 - i;
    const int64_t lo = padding[static_cast<size_t>(2 * i)].expect_int();
    const int64_t hi = padding[static_cast<size_t>(2 * i + 1)].expect_int();
    const int64_t n = x.size(dim);
    if (reflect) {
      TORCH_CHECK(lo < n && hi < n, op, ": padding size should be less than the corresponding input dimension, but got: "
                  "padding (", lo, ", ", hi, ") at dimension ", dim, " of input ", x.sizes());
    } else {
      TORCH_CHECK(n > 0, op, ": input tensor must be non-empty along the padded dimension ", dim);
    }
    TORCH_CHECK(n + lo + hi > 0, op, ": input size ", n, " at dimension ", dim, " is too small for the padding (", lo, ", ",
                hi, ")");
    plan.push_back({dim, lo, hi});
  }
  return plan;
}

at::Tensor Padded(const at::Tensor& x, c10::SymIntArrayRef padding, int64_t k, bool reflect, const char* op) {
  auto plan = Plan(x, padding, k, reflect, op);
  TraceScope s;
  const int d = DeviceIndex(x);
  ir::Builder& b = B(d);
  ir::Value v = Val(x);
  for (const auto& [dim, lo, hi] : plan) v = PadDim(b, v, dim, lo, hi, reflect);
  return Wrap(v, d);
}

at::Tensor PaddedBackward(const at::Tensor& grad, const at::Tensor& x, c10::SymIntArrayRef padding, int64_t k, bool reflect,
                          const char* op) {
  auto plan = Plan(x, padding, k, reflect, op);
  std::vector<int64_t> padded = x.sizes().vec();
  for (const auto& [dim, lo, hi] : plan) padded[static_cast<size_t>(dim)] += lo + hi;
  TORCH_CHECK(grad.sizes().vec() == padded, op, ": grad_output of shape ", grad.sizes(), " does not match the padded input's ",
              at::IntArrayRef(padded));
  TraceScope s;
  const int d = CommonDevice({&grad, &x});
  ir::Builder& b = B(d);
  ir::Value g = Operand(grad, d, grad.scalar_type());
  // outermost padded dim first: the reverse of the forward's order
  for (auto it = plan.rbegin(); it != plan.rend(); ++it) {
    const auto& [dim, lo, hi] = *it;
    g = PadDimBackward(b, g, dim, x.size(dim), lo, hi, reflect);
  }
  return Wrap(g, d);
}

#define TPJ_PAD(name, k, reflect)                                                                           \
  at::Tensor name(const at::Tensor& x, c10::SymIntArrayRef p) { return Padded(x, p, k, reflect, #name); } \
  at::Tensor name##_backward(const at::Tensor& g, const at::Tensor& x, c10::SymIntArrayRef p) {           \
    return PaddedBackward(g, x, p, k, reflect, #name "_backward");                                         \
  }
TPJ_PAD(reflection_pad1d, 1, true)
TPJ_PAD(reflection_pad2d, 2, true)
TPJ_PAD(reflection_pad3d, 3, true)
TPJ_PAD(replication_pad1d, 1, false)
TPJ_PAD(replication_pad2d, 2, false)
TPJ_PAD(replication_pad3d, 3, false)
#undef TPJ_PAD

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("reflection_pad1d", reflection_pad1d);
  K("reflection_pad1d_backward", reflection_pad1d_backward);
  TPJ_LAID(m, "reflection_pad2d", kInput, reflection_pad2d);
  TPJ_LAID(m, "reflection_pad2d_backward", kInput, reflection_pad2d_backward);
  TPJ_LAID(m, "reflection_pad3d", kInput, reflection_pad3d);
  TPJ_LAID(m, "reflection_pad3d_backward", kInput, reflection_pad3d_backward);
  K("replication_pad1d", replication_pad1d);
  K("replication_pad1d_backward", replication_pad1d_backward);
  TPJ_LAID(m, "replication_pad2d", kInput, replication_pad2d);
  TPJ_LAID(m, "replication_pad2d_backward", kInput, replication_pad2d_backward);
  TPJ_LAID(m, "replication_pad3d", kInput, replication_pad3d);
  TPJ_LAID(m, "replication_pad3d_backward", kInput, replication_pad3d_backward);
}
