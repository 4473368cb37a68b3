// Searching sorted sequences: bucketize and searchsorted, by comparing each
// value with every boundary and counting (exact, O(values x boundaries)
// work, which suits the bucket tables models use; no data-dependent control).
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

// For each value (shape [..., n], or any shape when seq is 1-d), the number
// of boundaries below it (right: at or below it) in seq [..., m]; NaN
// values count every boundary. (NaN boundaries are not sorted input, and
// their count need not match the CPU's binary search.)
at::Tensor CountBelow(const at::Tensor& seq, const at::Tensor& values, bool right, bool out_int32) {
  TORCH_CHECK(!at::isComplexType(seq.scalar_type()) && !at::isComplexType(values.scalar_type()),
              "searchsorted/bucketize: complex inputs are not supported");
  const at::ScalarType t = at::result_type(seq, values);
  at::Tensor s = seq.to(t), v = values.to(t);
  // not (b >= v), not (b > v): the CPU's binary search, which puts NaN last
  at::Tensor b = seq.dim() <= 1 ? s.reshape({-1}) : s.unsqueeze(-2);
  at::Tensor col = v.unsqueeze(-1);
  at::Tensor cmp = (right ? b.gt(col) : b.ge(col)).logical_not();
  return cmp.sum(-1, false, out_int32 ? at::kInt : at::kLong);
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
    TORCH_CHECK(sorter->sizes() == seq.sizes(), "torch.searchsorted(): boundary and sorter must have the same size, but got "
                "boundary tensor ", seq.sizes(), " and got sorter tensor ", sorter->sizes());
    sorted = seq.gather(-1, *sorter);
  }
  return CountBelow(sorted, values, Right(right, side), out_int32);
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
  return CountBelow(boundaries, values, right, out_int32);
}

at::Tensor bucketize_scalar(const at::Scalar& value, const at::Tensor& boundaries, bool out_int32, bool right) {
  const at::ScalarType t = at::result_type(boundaries, value);
  return tpj::aten::bucketize(at::scalar_tensor(value, boundaries.options().dtype(t)), boundaries, out_int32, right);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("searchsorted.Tensor", searchsorted);
  K("searchsorted.Scalar", searchsorted_scalar);
  K("bucketize.Tensor", bucketize);
  K("bucketize.Scalar", bucketize_scalar);
}
