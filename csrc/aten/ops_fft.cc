// The discrete Fourier transforms torch.fft is built on: _fft_r2c,
// _fft_c2r and _fft_c2c, lowered to stablehlo.fft. Every torch.fft function
// (fft, ifft, rfft, irfft, hfft, fft2, fftn, ...) and their backward formulas
// reach PyTorch's composites over these three, so padding and truncation
// (n=), dim= and norm= arrive as plain slices, pads and these arguments.
//
// stablehlo.fft transforms the trailing 1 to 3 dimensions: the dims asked
// for are transposed to the end (in the order given), more than three are
// done in groups, and the result is transposed back. XLA's inverse
// transforms divide by the signal size; PyTorch's normalization argument
// says the scale instead (0: none, 1: 1/sqrt(n), 2: 1/n), so the inverse
// ones are rescaled by n first.
#include <algorithm>
#include <cmath>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::FftType;
using ir::Op;

constexpr int64_t kMaxFftDims = 3;  // stablehlo.fft's limit

std::vector<int64_t> FftDims(at::IntArrayRef dim, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t d : dim) {
    const int64_t w = WrapDim(d, rank);
    TORCH_CHECK(std::find(out.begin(), out.end(), w) == out.end(), "FFT dims must be unique");
    out.push_back(w);
  }
  return out;
}

// One stablehlo.fft over `dims` of x (1 to 3 of them), wherever they are.
// `last_size` is the signal size of dims.back() for IRFFT (the result's).
ir::Value FftAt(int d, ir::Value x, const std::vector<int64_t>& dims, FftType type, int64_t last_size) {
  ir::Builder& b = B(d);
  const std::vector<int64_t> shape = b.shape(x).dims;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i) {
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) perm.push_back(i);
  }
  perm.insert(perm.end(), dims.begin(), dims.end());
  std::vector<int64_t> lengths;
  for (int64_t dim : dims) lengths.push_back(shape[dim]);
  if (type == FftType::IRFFT) lengths.back() = last_size;
  bool identity = true;
  for (int64_t i = 0; i < rank; ++i) identity = identity && perm[i] == i;
  ir::Value y = b.Fft(identity ? x : b.Transpose(x, perm), type, lengths);
  if (identity) return y;
  std::vector<int64_t> inverse(rank);
  for (int64_t i = 0; i < rank; ++i) inverse[perm[i]] = i;
  return b.Transpose(y, inverse);
}

// The groups of at most three dims that `dims` is transformed in; the last
// group holds dims.back() (the real/halved one of r2c and c2r).
std::vector<std::vector<int64_t>> Groups(const std::vector<int64_t>& dims) {
  std::vector<std::vector<int64_t>> groups;
  int64_t end = static_cast<int64_t>(dims.size());
  while (end > 0) {
    const int64_t start = std::max<int64_t>(0, end - kMaxFftDims);
    groups.insert(groups.begin(), std::vector<int64_t>(dims.begin() + start, dims.begin() + end));
    end = start;
  }
  return groups;
}

// x times PyTorch's normalization for signal size n; inverse transforms also
// undo XLA's 1/n.
ir::Value Normalize(int d, ir::Value x, int64_t normalization, double n, bool inverse) {
  double scale = 1;
  if (normalization == 1) scale = 1 / std::sqrt(n);
  if (normalization == 2) scale = 1 / n;
  TORCH_CHECK(normalization >= 0 && normalization <= 2, "FFT normalization must be 0, 1 or 2, got ", normalization);
  if (inverse) scale *= n;
  if (scale == 1) return x;
  ir::Builder& b = B(d);
  const ir::Shape s = b.shape(x);
  return b.Binary(Op::Mul, x, b.Full(s.dtype, s.dims, scale));
}

double SignalSize(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t dim : dims) n *= static_cast<double>(shape[dim]);
  return n;
}

void CheckFloat(const at::Tensor& t, bool complex, const char* op) {
  const at::ScalarType s = t.scalar_type();
  const bool ok = complex ? (s == at::kComplexFloat || s == at::kComplexDouble) : (s == at::kFloat || s == at::kDouble);
  TORCH_CHECK(ok, op, " on pjrt takes ", complex ? "complex64 or complex128" : "float32 or float64",
              " input, got ", s, " (PJRT has no half-precision complex type)");
}

at::Tensor fft_c2c(const at::Tensor& self, c10::SymIntArrayRef sym_dim, int64_t normalization, bool forward) {
  CheckFloat(self, true, "_fft_c2c");
  TraceScope s;
  const int d = DeviceIndex(self);
  const std::vector<int64_t> dims = FftDims(C10_AS_INTARRAYREF_SLOW(sym_dim), self.dim());
  ir::Value x = Val(self);
  if (self.numel() > 0) {
    for (const auto& g : Groups(dims)) x = FftAt(d, x, g, forward ? FftType::FFT : FftType::IFFT, 0);
  }
  return Wrap(Normalize(d, x, normalization, SignalSize(self.sizes().vec(), dims), !forward), d);
}

at::Tensor fft_r2c(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, bool onesided) {
  CheckFloat(self, false, "_fft_r2c");
  TraceScope s;
  const int d = DeviceIndex(self);
  const std::vector<int64_t> dims = FftDims(dim, self.dim());
  TORCH_CHECK(!dims.empty(), "_fft_r2c needs at least one dim");
  ir::Builder& b = B(d);
  const at::ScalarType ct = c10::toComplexType(self.scalar_type());
  ir::Value x = Val(self);
  if (self.numel() == 0) {
    std::vector<int64_t> out = self.sizes().vec();
    if (onesided) out[dims.back()] = out[dims.back()] / 2 + 1;
    return Empty(out, ct, d);
  }
  if (!onesided) {
    // The full spectrum: the complex transform of the real signal.
    x = b.Convert(x, ToIr(ct));
    for (const auto& g : Groups(dims)) x = FftAt(d, x, g, FftType::FFT, 0);
  } else {
    const auto groups = Groups(dims);
    x = FftAt(d, x, groups.back(), FftType::RFFT, 0);
    for (size_t i = 0; i + 1 < groups.size(); ++i) x = FftAt(d, x, groups[i], FftType::FFT, 0);
  }
  return Wrap(Normalize(d, x, normalization, SignalSize(self.sizes().vec(), dims), false), d);
}

at::Tensor fft_c2r(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, c10::SymInt sym_last) {
  CheckFloat(self, true, "_fft_c2r");
  const int64_t last = sym_last.expect_int();
  TORCH_CHECK(last >= 1, "Invalid number of data points (", last, ") specified");
  TraceScope s;
  const int d = DeviceIndex(self);
  const std::vector<int64_t> dims = FftDims(dim, self.dim());
  TORCH_CHECK(!dims.empty(), "_fft_c2r needs at least one dim");
  ir::Builder& b = B(d);
  const int64_t half = last / 2 + 1;
  const int64_t have = self.size(dims.back());
  TORCH_CHECK(have >= half, "_fft_c2r: dim ", dims.back(), " has ", have, " entries, fewer than last_dim_size / 2 + 1 = ",
              half);
  ir::Value x = Val(self);
  std::vector<int64_t> out_shape = self.sizes().vec();
  out_shape[dims.back()] = last;
  const at::ScalarType rt = c10::toRealValueType(self.scalar_type());
  if (self.numel() == 0) return Empty(out_shape, rt, d);
  if (have > half) {
    // the signal's last dim is read up to last / 2 + 1 entries (as pocketfft)
    std::vector<int64_t> starts(self.dim(), 0), limits = self.sizes().vec(), strides(self.dim(), 1);
    limits[dims.back()] = half;
    x = b.Slice(x, starts, limits, strides);
  }
  const auto groups = Groups(dims);
  for (size_t i = 0; i + 1 < groups.size(); ++i) x = FftAt(d, x, groups[i], FftType::IFFT, 0);
  x = FftAt(d, x, groups.back(), FftType::IRFFT, last);
  return Wrap(Normalize(d, x, normalization, SignalSize(out_shape, dims), true), d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_fft_c2c", fft_c2c);
  K("_fft_r2c", fft_r2c);
  K("_fft_c2r", fft_c2r);
}
