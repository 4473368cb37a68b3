// grid_sampler_2d and its backward (F.grid_sample, spatial transformers):
// bilinear and nearest interpolation, zeros/border/reflection padding,
// align_corners both ways; gradients for the input and the grid.
//
// The grid is data, so the source positions are computed in the program:
// one gather reads the channel vectors of every corner from the input laid
// out [N*H*W, C], masked to zero outside the image as the CPU skips it; the
// input's gradient scatter-adds the same corners back in one scatter. Formulas follow the
// CPU kernel (ATen/native/GridSampler.h, cpu/GridSamplerKernel.cpp).
// Bicubic interpolation runs on the CPU (counted as a fallback; see
// docs/semantics.md).
#include <ATen/ops/grid_sampler_2d.h>
#include <ATen/ops/grid_sampler_2d_backward.h>

#include "aten/lowering.h"
#include "runtime/metrics.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

enum Interp : int64_t { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum Padding : int64_t { kZeros = 0, kBorder = 1, kReflection = 2 };

struct Ctx {
  int d;
  at::ScalarType t;                // compute type
  std::vector<int64_t> p;          // [N, Ho, Wo]
  ir::Builder& b() const { return B(d); }
  ir::Value F(double v) const { return Fill(d, v, t, p); }
  ir::Value Add(ir::Value x, ir::Value y) const { return b().Binary(Op::Add, x, y); }
  ir::Value Sub(ir::Value x, ir::Value y) const { return b().Binary(Op::Sub, x, y); }
  ir::Value Mul(ir::Value x, ir::Value y) const { return b().Binary(Op::Mul, x, y); }
  ir::Value Div(ir::Value x, ir::Value y) const { return b().Binary(Op::Div, x, y); }
  ir::Value Cmp(CompareDir dir, ir::Value x, ir::Value y) const { return b().Compare(dir, x, y); }
  ir::Value Sel(ir::Value c, ir::Value x, ir::Value y) const { return b().Select(c, x, y); }
};

// A source coordinate and d(coordinate)/d(grid value).
struct Coord {
  ir::Value v, grad;
};

// Reflects x into [low, high] (given doubled, as the CPU does), with the sign
// of the derivative.
Coord Reflect(const Ctx& c, ir::Value x, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return {c.F(0), c.F(0)};
  const double lo = twice_low / 2.0, span = (twice_high - twice_low) / 2.0;
  ir::Value in = c.Sub(x, c.F(lo));
  ir::Value neg = c.Cmp(CompareDir::LT, in, c.F(0));
  ir::Value sign = c.Sel(neg, c.F(-1), c.F(1));
  in = c.b().Unary(Op::Abs, in);
  ir::Value extra = c.b().Binary(Op::Rem, in, c.F(span));
  ir::Value flips = c.b().Unary(Op::Floor, c.Div(in, c.F(span)));
  ir::Value even = c.Cmp(CompareDir::EQ, c.b().Binary(Op::Rem, flips, c.F(2)), c.F(0));
  ir::Value v = c.Sel(even, c.Add(extra, c.F(lo)), c.Add(c.Sub(c.F(span), extra), c.F(lo)));
  return {v, c.Sel(even, sign, c.b().Unary(Op::Neg, sign))};
}

// Clamps x into [0, size - 1], NaN to 0 (the CPU's kernel: a NaN grid value,
// or an infinite one reflected, reads the first pixel); the derivative is 1
// strictly inside, else 0.
Coord Clip(const Ctx& c, ir::Value x, int64_t size) {
  ir::Value hi = c.F(static_cast<double>(size - 1));
  ir::Value positive = c.Cmp(CompareDir::GT, x, c.F(0));
  ir::Value inside = c.b().Binary(Op::And, positive, c.Cmp(CompareDir::LT, x, hi));
  ir::Value v = c.Sel(positive, c.b().Binary(Op::Min, x, hi), c.F(0));
  return {v, c.Sel(inside, c.F(1), c.F(0))};
}

// Grid values in [-1, 1] to pixel coordinates along a dimension of `size`.
Coord SourceCoord(const Ctx& c, ir::Value g, int64_t size, int64_t padding, bool align_corners) {
  const double sf = align_corners ? (size - 1) / 2.0 : size / 2.0;
  ir::Value x = c.Mul(c.Add(g, c.F(1)), c.F(sf));
  if (!align_corners) x = c.Sub(x, c.F(0.5));
  Coord r{x, c.F(sf)};
  if (padding == kBorder) {
    Coord k = Clip(c, x, size);
    r = {k.v, c.Mul(r.grad, k.grad)};
  } else if (padding == kReflection) {
    Coord f = align_corners ? Reflect(c, x, 0, 2 * (size - 1)) : Reflect(c, x, -1, 2 * size - 1);
    Coord k = Clip(c, f.v, size);
    r = {k.v, c.Mul(r.grad, c.Mul(f.grad, k.grad))};
  }
  return r;
}

// One corner: the flat row of the [N*H*W, C] input it reads ([N, Ho, Wo]
// i64) and whether it lies inside the image.
struct Corner {
  ir::Value row, inside;
};

Corner MakeCorner(const Ctx& c, ir::Value x, ir::Value y, int64_t h, int64_t w) {
  ir::Builder& b = c.b();
  ir::Value inside = b.Binary(
      Op::And,
      b.Binary(Op::And, c.Cmp(CompareDir::GE, x, c.F(0)), c.Cmp(CompareDir::LE, x, c.F(static_cast<double>(w - 1)))),
      b.Binary(Op::And, c.Cmp(CompareDir::GE, y, c.F(0)), c.Cmp(CompareDir::LE, y, c.F(static_cast<double>(h - 1)))));
  auto index = [&](ir::Value v, int64_t size) {
    ir::Value clamped = b.Clamp(b.ScalarConstant(ToIr(c.t), 0), v, b.ScalarConstant(ToIr(c.t), static_cast<double>(size - 1)));
    ir::Value i = b.Convert(clamped, ir::DType::I64);
    // NaN coordinates convert to anything: keep the index in range (the
    // corner is masked out anyway).
    return b.Clamp(b.ScalarConstant(ir::DType::I64, 0), i, b.ScalarConstant(ir::DType::I64, static_cast<double>(size - 1)));
  };
  ir::Value n = b.Iota({ir::DType::I64, c.p}, 0);
  ir::Value row = b.Binary(Op::Add, b.Binary(Op::Mul, n, Fill(c.d, static_cast<double>(h * w), at::kLong, c.p)),
                           b.Binary(Op::Add, b.Binary(Op::Mul, index(y, h), Fill(c.d, static_cast<double>(w), at::kLong, c.p)),
                                    index(x, w)));
  return {row, inside};
}

// The corners' rows stacked: [N, Ho, Wo, K] indices and insides.
ir::Value StackRows(const Ctx& c, const std::vector<Corner>& ks, bool inside) {
  ir::Builder& b = c.b();
  std::vector<int64_t> one = c.p;
  one.push_back(1);
  std::vector<ir::Value> parts;
  for (const Corner& k : ks) parts.push_back(b.Reshape(inside ? k.inside : k.row, one));
  return parts.size() == 1 ? parts[0] : b.Concatenate(parts, 3);
}

// Pixel values at every corner, [N, Ho, Wo, C] each, zero outside the
// image: one gather for all corners.
std::vector<ir::Value> ReadAll(const Ctx& c, ir::Value table, const std::vector<Corner>& ks, int64_t ch) {
  ir::Builder& b = c.b();
  const int64_t n = static_cast<int64_t>(ks.size());
  std::vector<int64_t> pkc = c.p;
  pkc.push_back(n);
  pkc.push_back(ch);
  ir::GatherDims g;
  g.offset_dims = {4};
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = 4;
  ir::Value v = b.Gather(table, StackRows(c, ks, false), g, {1, ch});
  v = b.Select(b.BroadcastInDim(StackRows(c, ks, true), pkc, {0, 1, 2, 3}), v, Fill(c.d, 0, c.t, pkc));
  std::vector<int64_t> pc = c.p;
  pc.push_back(ch);
  std::vector<ir::Value> out;
  for (int64_t k = 0; k < n; ++k) {
    ir::Value s = n == 1 ? v : b.Slice(v, {0, 0, 0, k, 0}, {pkc[0], pkc[1], pkc[2], k + 1, ch}, {1, 1, 1, 1, 1});
    out.push_back(b.Reshape(s, pc));
  }
  return out;
}

ir::Value PerPixel(const Ctx& c, ir::Value w, int64_t ch) {
  std::vector<int64_t> pc = c.p;
  pc.push_back(ch);
  return c.b().BroadcastInDim(w, pc, {0, 1, 2});
}

// acc ([N*H*W, C]) plus each corner's `upd` ([N, Ho, Wo, C]) added at its
// row where the corner is inside the image: one scatter for all corners.
ir::Value SpreadAll(const Ctx& c, ir::Value acc, const std::vector<Corner>& ks, const std::vector<ir::Value>& upd,
                    int64_t ch) {
  ir::Builder& b = c.b();
  const int64_t n = static_cast<int64_t>(ks.size());
  std::vector<int64_t> pkc = c.p;
  pkc.push_back(n);
  pkc.push_back(ch);
  std::vector<int64_t> p1c = c.p;
  p1c.push_back(1);
  p1c.push_back(ch);
  std::vector<ir::Value> parts;
  for (ir::Value u : upd) parts.push_back(b.Reshape(u, p1c));
  ir::Value u = n == 1 ? parts[0] : b.Concatenate(parts, 3);
  u = b.Select(b.BroadcastInDim(StackRows(c, ks, true), pkc, {0, 1, 2, 3}), u, Fill(c.d, 0, c.t, pkc));
  ir::ScatterDims s;
  s.update_window_dims = {4};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 4;
  return b.Scatter(acc, StackRows(c, ks, false), u, s, false);
}

void Check(const at::Tensor& input, const at::Tensor& grid) {
  TORCH_CHECK(input.dim() == 4 && grid.dim() == 4 && grid.size(3) == 2 && grid.size(0) == input.size(0),
              "grid_sampler_2d: expected a 4D input [N, C, H, W] and a grid [N, H_out, W_out, 2], got ", input.sizes(),
              " and ", grid.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()) && input.scalar_type() == grid.scalar_type(),
              "grid_sampler_2d: expected input and grid of one floating-point dtype, got ", input.scalar_type(), " and ",
              grid.scalar_type());
}

// Everything forward and backward share: the compute context, coordinates,
// corners and their bilinear weights, the input as a [N*H*W, C] table.
struct Sampling {
  Ctx c;
  int64_t n, ch, h, w, ho, wo;
  Coord x, y;
  ir::Value table;
  std::vector<Corner> corners;   // bilinear: nw, ne, sw, se; nearest: one
  std::vector<ir::Value> weights;
  ir::Value fx, fy;              // bilinear: x - floor(x), y - floor(y)
};

Sampling Prepare(const at::Tensor& input, const at::Tensor& grid, int64_t mode, int64_t padding, bool align_corners) {
  const int d = CommonDevice({&input, &grid});
  const at::ScalarType t = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Sampling s{Ctx{d, t, {grid.size(0), grid.size(1), grid.size(2)}}, input.size(0), input.size(1), input.size(2),
             input.size(3), grid.size(1), grid.size(2), {}, {}, {}, {}, {}, {}, {}};
  const Ctx& c = s.c;
  ir::Builder& b = c.b();
  ir::Value g = ValAs(grid, t);
  ir::Value gx = b.Reshape(b.Slice(g, {0, 0, 0, 0}, {s.n, s.ho, s.wo, 1}, {1, 1, 1, 1}), c.p);
  ir::Value gy = b.Reshape(b.Slice(g, {0, 0, 0, 1}, {s.n, s.ho, s.wo, 2}, {1, 1, 1, 1}), c.p);
  s.x = SourceCoord(c, gx, s.w, padding, align_corners);
  s.y = SourceCoord(c, gy, s.h, padding, align_corners);
  if (input.defined()) {
    s.table = b.Reshape(b.Transpose(ValAs(input, t), {0, 2, 3, 1}), {s.n * s.h * s.w, s.ch});
  }
  if (mode == kNearest) {
    s.corners.push_back(MakeCorner(c, b.Unary(Op::Round, s.x.v), b.Unary(Op::Round, s.y.v), s.h, s.w));
    return s;
  }
  ir::Value x0 = b.Unary(Op::Floor, s.x.v), y0 = b.Unary(Op::Floor, s.y.v);
  ir::Value x1 = c.Add(x0, c.F(1)), y1 = c.Add(y0, c.F(1));
  s.fx = c.Sub(s.x.v, x0);
  s.fy = c.Sub(s.y.v, y0);
  ir::Value ex = c.Sub(c.F(1), s.fx), sy = c.Sub(c.F(1), s.fy);
  s.corners = {MakeCorner(c, x0, y0, s.h, s.w), MakeCorner(c, x1, y0, s.h, s.w), MakeCorner(c, x0, y1, s.h, s.w),
               MakeCorner(c, x1, y1, s.h, s.w)};
  s.weights = {c.Mul(sy, ex), c.Mul(sy, s.fx), c.Mul(s.fy, ex), c.Mul(s.fy, s.fx)};
  return s;
}

// [N, Ho, Wo, C] -> [N, C, Ho, Wo]
ir::Value ToNchw(const Ctx& c, ir::Value v) { return c.b().Transpose(v, {0, 3, 1, 2}); }

void CountCpuRun(const char* op) { runtime::Metrics::Get().Fallback(op, runtime::Runtime::Location()); }

at::Tensor grid_sampler_2d(const at::Tensor& input, const at::Tensor& grid, int64_t mode, int64_t padding,
                           bool align_corners) {
  Check(input, grid);
  TORCH_CHECK(mode >= kBilinear && mode <= kBicubic && padding >= kZeros && padding <= kReflection,
              "grid_sampler_2d: unknown interpolation mode ", mode, " or padding mode ", padding);
  if (mode == kBicubic) {
    CountCpuRun("aten::grid_sampler_2d");
    return at::grid_sampler_2d(input.cpu(), grid.cpu(), mode, padding, align_corners).to(input.device());
  }
  // an empty batch (no boxes in a detector's crop): no row to read from
  if (input.size(0) == 0) return at::empty({0, input.size(1), grid.size(1), grid.size(2)}, input.options());
  TraceScope ts;
  Sampling s = Prepare(input, grid, mode, padding, align_corners);
  const Ctx& c = s.c;
  ir::Builder& b = c.b();
  std::vector<ir::Value> vals = ReadAll(c, s.table, s.corners, s.ch);
  ir::Value out;
  for (size_t k = 0; k < vals.size(); ++k) {
    ir::Value v = vals[k];
    if (!s.weights.empty()) v = c.Mul(v, PerPixel(c, s.weights[k], s.ch));
    out = k == 0 ? v : c.Add(out, v);
  }
  return Wrap(b.Convert(ToNchw(c, out), ToIr(input.scalar_type())), c.d);
}

std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                            const at::Tensor& grid, int64_t mode, int64_t padding,
                                                            bool align_corners, std::array<bool, 2> mask) {
  Check(input, grid);
  if (mode == kBicubic) {
    CountCpuRun("aten::grid_sampler_2d_backward");
    auto [gi, gg] = at::grid_sampler_2d_backward(grad_out.cpu(), input.cpu(), grid.cpu(), mode, padding, align_corners,
                                                 mask);
    return {gi.defined() ? gi.to(input.device()) : gi, gg.defined() ? gg.to(grid.device()) : gg};
  }
  if (input.size(0) == 0) {
    return {mask[0] ? at::zeros_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
            mask[1] ? at::zeros_like(grid, at::MemoryFormat::Contiguous) : at::Tensor()};
  }
  TraceScope ts;
  Sampling s = Prepare(input, grid, mode, padding, align_corners);
  const Ctx& c = s.c;
  ir::Builder& b = c.b();
  const at::ScalarType t = c.t;
  // [N, C, Ho, Wo] -> [N, Ho, Wo, C]
  ir::Value go = b.Transpose(ValAs(grad_out, t), {0, 2, 3, 1});
  at::Tensor grad_input, grad_grid;
  if (mask[0]) {
    std::vector<ir::Value> upd;
    for (size_t k = 0; k < s.corners.size(); ++k) {
      upd.push_back(s.weights.empty() ? go : c.Mul(go, PerPixel(c, s.weights[k], s.ch)));
    }
    ir::Value acc = SpreadAll(c, Fill(c.d, 0, t, {s.n * s.h * s.w, s.ch}), s.corners, upd, s.ch);
    ir::Value gi = b.Transpose(b.Reshape(acc, {s.n, s.h, s.w, s.ch}), {0, 3, 1, 2});
    grad_input = Wrap(b.Convert(gi, ToIr(input.scalar_type())), c.d);
  }
  if (mask[1]) {
    std::vector<int64_t> gshape = c.p;
    gshape.push_back(2);
    ir::Value gg;
    if (mode == kNearest) {
      gg = Fill(c.d, 0, t, gshape);
    } else {
      std::vector<ir::Value> v = ReadAll(c, s.table, s.corners, s.ch);
      ir::Value sy = PerPixel(c, c.Sub(c.F(1), s.fy), s.ch), ny = PerPixel(c, s.fy, s.ch);
      ir::Value ex = PerPixel(c, c.Sub(c.F(1), s.fx), s.ch), wx = PerPixel(c, s.fx, s.ch);
      // d out / d x and d out / d y per channel, times the incoming gradient
      ir::Value dx = c.Add(c.Mul(c.Sub(v[1], v[0]), sy), c.Mul(c.Sub(v[3], v[2]), ny));
      ir::Value dy = c.Add(c.Mul(c.Sub(v[2], v[0]), ex), c.Mul(c.Sub(v[3], v[1]), wx));
      ir::Value zero = b.ScalarConstant(ToIr(t), 0);
      ir::Value gx = b.Reduce(c.Mul(dx, go), zero, {3}, ir::ReduceKind::Sum);
      ir::Value gy = b.Reduce(c.Mul(dy, go), zero, {3}, ir::ReduceKind::Sum);
      gx = c.Mul(gx, s.x.grad);
      gy = c.Mul(gy, s.y.grad);
      std::vector<int64_t> one = c.p;
      one.push_back(1);
      gg = b.Concatenate({b.Reshape(gx, one), b.Reshape(gy, one)}, 3);
    }
    grad_grid = Wrap(b.Convert(gg, ToIr(grid.scalar_type())), c.d);
  }
  return {grad_input, grad_grid};
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("grid_sampler_2d", grid_sampler_2d);
  K("grid_sampler_2d_backward", grid_sampler_2d_backward);
}
