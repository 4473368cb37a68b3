// F.unfold / F.fold (im2col / col2im), each the other's backward. Both are
// written as kernel_h * kernel_w strided slices (unfold) or strided pads that
// are summed (fold), so the work is linear in the number of columns.
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

// The geometry of one im2col/col2im call over an image of h x w.
struct Geometry {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  int64_t h, w;    // the image
  int64_t oh, ow;  // blocks per column and per row
};

Geometry Make(at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding, at::IntArrayRef stride,
              int64_t h, int64_t w, const char* op) {
  TORCH_CHECK(kernel.size() == 2 && dilation.size() == 2 && padding.size() == 2 && stride.size() == 2, op,
              ": kernel_size, dilation, padding and stride must have two elements each");
  Geometry g{kernel[0], kernel[1], dilation[0], dilation[1], padding[0], padding[1], stride[0], stride[1], h, w, 0, 0};
  TORCH_CHECK(g.kh > 0 && g.kw > 0, op, ": kernel size should be greater than zero, got (", g.kh, ", ", g.kw, ")");
  TORCH_CHECK(g.dh > 0 && g.dw > 0, op, ": dilation should be greater than zero, got (", g.dh, ", ", g.dw, ")");
  TORCH_CHECK(g.ph >= 0 && g.pw >= 0, op, ": padding should be non-negative, got (", g.ph, ", ", g.pw, ")");
  TORCH_CHECK(g.sh > 0 && g.sw > 0, op, ": stride should be greater than zero, got (", g.sh, ", ", g.sw, ")");
  g.oh = (h + 2 * g.ph - (g.dh * (g.kh - 1) + 1)) / g.sh + 1;
  g.ow = (w + 2 * g.pw - (g.dw * (g.kw - 1) + 1)) / g.sw + 1;
  TORCH_CHECK(g.oh >= 1 && g.ow >= 1, op, ": given input with spatial size (", h, ", ", w, "), kernel_size=(", g.kh,
              ", ", g.kw, "), dilation=(", g.dh, ", ", g.dw, "), padding=(", g.ph, ", ", g.pw,
              "), calculated shape of the array of sliding blocks as (", g.oh, ", ", g.ow,
              "), but its components must be at least one.");
  return g;
}

// x: [n, c, h, w] -> [n, c * kh * kw, oh * ow]; column c*kh*kw + i*kw + j
// holds tap (i, j) of channel c.
ir::Value Im2Col(int d, ir::Value x, int64_t n, int64_t c, const Geometry& g) {
  ir::Builder& b = B(d);
  const ir::DType t = b.shape(x).dtype;
  ir::Value padded = b.Pad(x, b.ScalarConstant(t, 0), {0, 0, g.ph, g.pw}, {0, 0, g.ph, g.pw}, {0, 0, 0, 0});
  std::vector<ir::Value> taps;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t r0 = i * g.dh, c0 = j * g.dw;
      ir::Value tap = b.Slice(padded, {0, 0, r0, c0}, {n, c, r0 + (g.oh - 1) * g.sh + 1, c0 + (g.ow - 1) * g.sw + 1},
                              {1, 1, g.sh, g.sw});
      taps.push_back(b.Reshape(tap, {n, c, 1, g.oh * g.ow}));
    }
  }
  ir::Value all = taps.size() == 1 ? taps[0] : b.Concatenate(taps, 2);
  return b.Reshape(all, {n, c * g.kh * g.kw, g.oh * g.ow});
}

// cols: [n, c * kh * kw, oh * ow] -> [n, c, h, w], overlapping taps summed.
ir::Value Col2Im(int d, ir::Value cols, int64_t n, int64_t c, const Geometry& g) {
  ir::Builder& b = B(d);
  const ir::DType t = b.shape(cols).dtype;
  const int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw;
  ir::Value x = b.Reshape(cols, {n, c, g.kh * g.kw, g.oh, g.ow});
  ir::Value zero = b.ScalarConstant(t, 0);
  ir::Value sum;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t k = i * g.kw + j;
      ir::Value tap = b.Reshape(b.Slice(x, {0, 0, k, 0, 0}, {n, c, k + 1, g.oh, g.ow}, {1, 1, 1, 1, 1}),
                                {n, c, g.oh, g.ow});
      const int64_t r0 = i * g.dh, c0 = j * g.dw;
      const int64_t rows = (g.oh - 1) * g.sh + 1, colsw = (g.ow - 1) * g.sw + 1;
      ir::Value placed = b.Pad(tap, zero, {0, 0, r0, c0}, {0, 0, hp - r0 - rows, wp - c0 - colsw},
                               {0, 0, g.sh - 1, g.sw - 1});
      sum = sum.valid() ? b.Binary(Op::Add, sum, placed) : placed;
    }
  }
  return b.Slice(sum, {0, 0, g.ph, g.pw}, {n, c, g.ph + g.h, g.pw + g.w}, {1, 1, 1, 1});
}

at::Tensor im2col(const at::Tensor& self, at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
                  at::IntArrayRef stride) {
  // as the CPU: a batch may be empty, no other dim
  TORCH_CHECK((self.dim() == 3 || self.dim() == 4) && self.size(-1) > 0 && self.size(-2) > 0 && self.size(-3) > 0,
              "im2col: expected a non-empty 3D or 4D input tensor, got sizes ", self.sizes());
  TraceScope s;
  const int d = DeviceIndex(self);
  const bool batched = self.dim() == 4;
  const int64_t n = batched ? self.size(0) : 1, c = self.size(-3);
  const Geometry g = Make(kernel, dilation, padding, stride, self.size(-2), self.size(-1), "im2col");
  if (n == 0) return Wrap(Fill(d, 0, self.scalar_type(), {0, c * g.kh * g.kw, g.oh * g.ow}), d);
  ir::Value x = B(d).Reshape(Val(self), {n, c, g.h, g.w});
  ir::Value r = Im2Col(d, x, n, c, g);
  if (!batched) r = B(d).Reshape(r, {c * g.kh * g.kw, g.oh * g.ow});
  return Wrap(r, d);
}

at::Tensor col2im(const at::Tensor& self, c10::SymIntArrayRef output_size, at::IntArrayRef kernel,
                  at::IntArrayRef dilation, at::IntArrayRef padding, at::IntArrayRef stride) {
  TORCH_CHECK((self.dim() == 2 || self.dim() == 3) && self.size(-1) > 0 && self.size(-2) > 0,
              "col2im: expected a non-empty 2D or 3D input tensor, got sizes ", self.sizes());
  TORCH_CHECK(output_size.size() == 2, "col2im: output_size must have two elements, got ", output_size.size());
  TraceScope s;
  const int d = DeviceIndex(self);
  const bool batched = self.dim() == 3;
  const int64_t n = batched ? self.size(0) : 1;
  const Geometry g = Make(kernel, dilation, padding, stride, output_size[0].guard_int(__FILE__, __LINE__),
                          output_size[1].guard_int(__FILE__, __LINE__), "col2im");
  const int64_t kk = g.kh * g.kw;
  TORCH_CHECK(self.size(-2) % kk == 0, "col2im: expected size of input's dimension 1 to be divisible by the product of "
              "kernel_size, but got input.size(1)=", self.size(-2), " and kernel_size=(", g.kh, ", ", g.kw, ")");
  TORCH_CHECK(self.size(-1) == g.oh * g.ow, "col2im: given output_size=(", g.h, ", ", g.w, "), kernel_size=(", g.kh,
              ", ", g.kw, "), dilation=(", g.dh, ", ", g.dw, "), padding=(", g.ph, ", ", g.pw, "), stride=(", g.sh,
              ", ", g.sw, "), expected size of input's dimension 2 to match the calculated number of sliding blocks ",
              g.oh, " * ", g.ow, " = ", g.oh * g.ow, ", but got input.size(2)=", self.size(-1), ".");
  const int64_t c = self.size(-2) / kk;
  if (n == 0) return Wrap(Fill(d, 0, self.scalar_type(), {0, c, g.h, g.w}), d);
  ir::Value cols = B(d).Reshape(Val(self), {n, c * kk, g.oh * g.ow});
  ir::Value r = Col2Im(d, cols, n, c, g);
  if (!batched) r = B(d).Reshape(r, {c, g.h, g.w});
  return Wrap(r, d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("im2col", im2col);
  K("col2im", col2im);
}
