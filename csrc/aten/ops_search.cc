// Searching sorted sequences: bucketize and searchsorted, by the CPU's
// binary search run for every value at once (a fixed number of steps, no
// data-dependent control), and histc's equal-width bins.
#include <cmath>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

// For each value (shape [..., n], or any shape when seq is 1-d), its place
// in seq [..., m] by the CPU's binary search, step for step: start and end
// per value, mid = start + (end - start) / 2, right of mid when
// !(seq[mid] >= value) (right: !(seq[mid] > value)). bit_length(m) steps of
// one gather each; the same answer as the CPU's for any boundaries, NaN
// (sorted last, or anywhere) and unsorted ones included.
at::Tensor BinarySearch(const at::Tensor& seq, const at::Tensor& values, bool right, bool out_int32) {
  TORCH_CHECK(!at::isComplexType(seq.scalar_type()) && !at::isComplexType(values.scalar_type()),
              "searchsorted/bucketize: complex inputs are not supported");
  const at::ScalarType t = at::result_type(seq, values);
  const at::Tensor s = seq.to(t), v = values.to(t);
  const int64_t m = seq.size(-1);
  at::Tensor start = at::zeros(v.sizes(), v.options().dtype(at::kLong));
  at::Tensor end = at::full(v.sizes(), m, v.options().dtype(at::kLong));
  for (int64_t left = m; left > 0; left >>= 1) {
    const at::Tensor mid = start + at::floor_divide(end - start, 2);
    const at::Tensor at_mid = seq.dim() <= 1 ? s.reshape({-1}).take(mid.clamp_max(m - 1))
                                             : s.gather(-1, mid.clamp_max(m - 1));
    const at::Tensor active = start.lt(end);
    const at::Tensor after = (right ? at_mid.gt(v) : at_mid.ge(v)).logical_not();
    start = at::where(active.logical_and(after), mid + 1, start);
    end = at::where(active.logical_and(after.logical_not()), mid, end);
  }
  return out_int32 ? start.to(at::kInt) : start;
}

bool Right(bool right, std::optional<c10::string_view> side) {
  if (!side) return right;
  TORCH_CHECK(*side == "left" || *side == "right", "torch.searchsorted(): side can only be 'left' or 'right' but got ", *side);
  TORCH_CHECK(!right || *side == "right", "torch.searchsorted(): side and right can't be set to opposites, got side of ",
              *side, " while right was True");
  return *side == "right";
}

at::Tensor searchsorted(const at::Tensor& seq, const at::Tensor& values, bool out_int32, bool right,
                        std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(seq.dim() >= 1, "torch.searchsorted(): boundaries tensor should have positive dimension");
  if (seq.dim() > 1) {
    TORCH_CHECK(seq.dim() == values.dim() && seq.sizes().slice(0, seq.dim() - 1) == values.sizes().slice(0, values.dim() - 1),
                "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
                "tensor and input value tensor must match, but we got boundaries tensor ", seq.sizes(),
                " and input value tensor ", values.sizes());
  }
  at::Tensor sorted = seq;
  if (sorter && sorter->defined()) {
    TORCH_CHECK(sorter->scalar_type() == at::kLong,
                "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype ", sorter->scalar_type());
    TORCH_CHECK(sorter->sizes() == seq.sizes(), "torch.searchsorted(): boundary and sorter must have the same size, but got "
                "boundary tensor ", seq.sizes(), " and got sorter tensor ", sorter->sizes());
    if (sorter->is_privateuseone() && sorter->numel() > 0) {
      // The CPU's error for an index outside [0, m) (the gather would name itself).
      const int d = DeviceIndex(*sorter);
      ir::Builder& b = B(d);
      const ir::Value idx = Val(*sorter);
      const std::vector<int64_t> dims = sorter->sizes().vec();
      const ir::Value below = b.Compare(ir::CompareDir::LT, idx, b.Full(ir::DType::I64, dims, 0));
      const ir::Value above =
          b.Compare(ir::CompareDir::GE, idx, b.Full(ir::DType::I64, dims, static_cast<double>(seq.size(-1))));
      CheckNone(d, b.Binary(ir::Op::Or, below, above), runtime::ErrorKind::kValue,
                "torch.searchsorted(): sorter index out of range");
    }
    sorted = seq.gather(-1, *sorter);
  }
  return BinarySearch(sorted, values, Right(right, side), out_int32);
}

at::Tensor searchsorted_scalar(const at::Tensor& seq, const at::Scalar& value, bool out_int32, bool right,
                               std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(seq.dim() == 1, "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension "
              "is 1, but we got boundaries tensor dim(", seq.dim(), ")");
  // a Python number: promoted as one (searchsorted(int_seq, 2.5) compares in float)
  const at::ScalarType t = at::result_type(seq, value);
  return tpj::aten::searchsorted(seq, at::scalar_tensor(value, seq.options().dtype(t)), out_int32, right, side, sorter);
}

at::Tensor bucketize(const at::Tensor& values, const at::Tensor& boundaries, bool out_int32, bool right) {
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  return BinarySearch(boundaries, values, right, out_int32);
}

at::Tensor bucketize_scalar(const at::Scalar& value, const at::Tensor& boundaries, bool out_int32, bool right) {
  const at::ScalarType t = at::result_type(boundaries, value);
  return tpj::aten::bucketize(at::scalar_tensor(value, boundaries.options().dtype(t)), boundaries, out_int32, right);
}

// histc: counts of the elements in [min, max] by bins of equal width, the
// CPU's bin (elt - min) * bins / (max - min) truncated, max in the last bin;
// NaN and elements outside are not counted. min == max takes the data's
// range (on the device, checked to be finite when the result is read).
// Integer inputs are counted as CUDA counts them (the CPU kernel takes
// floating point only, and Hugging Face's mixture-of-experts layers count
// their int32 expert ids with histc on every device but the CPU): min and max
// truncated to the input's type, bins in exact integer arithmetic, counts in
// the input's type.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0, but got ", bins, " for dimension 0");
  const at::ScalarType t = self.scalar_type();
  const bool integral = at::isIntegralType(t, /*includeBool=*/false);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t) || integral, "\"histogram\" not implemented for '", t, "'");
  at::Tensor x = integral ? self.reshape({-1}).to(at::kLong) : self.reshape({-1});
  const at::Scalar lo_s = integral ? at::Scalar(min.toLong()) : at::Scalar(min.toDouble());
  const at::Scalar hi_s = integral ? at::Scalar(max.toLong()) : at::Scalar(max.toDouble());
  const double lo = lo_s.toDouble(), hi = hi_s.toDouble();
  at::Tensor left = at::scalar_tensor(lo_s, x.options()), right = at::scalar_tensor(hi_s, x.options());
  if ((integral ? lo_s.toLong() == hi_s.toLong() : lo == hi) && x.numel() > 0) {
    auto [mn, mx] = at::aminmax(x);
    left = mn;
    right = mx;
    if (!integral) {
      TraceScope s;
      const int d = DeviceIndex(self);
      ir::Builder& b = B(d);
      ir::Value bad = b.Unary(ir::Op::Not, b.Binary(ir::Op::And, b.IsFinite(Val(mn)), b.IsFinite(Val(mx))));
      CheckNone(d, bad, runtime::ErrorKind::kValue, "torch.histc: range of the data is not finite");
    }
  } else {
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi, "] is not finite");
    TORCH_CHECK(lo < hi || lo == hi, "torch.histc: max must be larger than min");
  }
  at::Tensor same = left == right;
  left = at::where(same, left - 1, left);
  right = at::where(same, right + 1, right);
  at::Tensor pos = integral ? ((x - left) * bins).div(right - left, "floor")
                            : ((x - left) * static_cast<double>(bins) / (right - left)).to(at::kLong);
  pos = at::where(pos == bins, at::scalar_tensor(bins - 1, pos.options()), pos);
  at::Tensor inside = (x >= left).logical_and(x <= right);
  // outside: a spare bin; clamped, as a non-finite data range (its own
  // check above) gives bins that are no numbers, and the scatter's check
  // would be the one reported
  pos = at::where(inside, pos, at::scalar_tensor(bins, pos.options())).clamp(0, bins);
  return at::zeros({bins + 1}, x.options()).scatter_add_(0, pos, at::ones_like(x)).narrow(0, 0, bins).to(t);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("searchsorted.Tensor", searchsorted);
  K("searchsorted.Scalar", searchsorted_scalar);
  K("bucketize.Tensor", bucketize);
  K("bucketize.Scalar", bucketize_scalar);
  K("histc", histc);
}
