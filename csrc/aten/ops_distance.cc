// Pairwise p-norm distances: torch.cdist (_cdist_forward, _cdist_backward)
// and F.pdist (_pdist_forward, _pdist_backward), composed from lowered ops
// with the CPU kernels' formulas. For p = 2 over more than 25 rows,
// torch.cdist itself takes the matrix-product form (_euclidean_dist, which
// needs nothing of ours); _cdist_forward does the same when asked to.
#include <cmath>
#include <limits>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

// The p-norm of `diff` (the differences, any sign) over its last dim, as the
// CPU's distance kernels: p = 0 counts non-zero differences, p = inf takes
// the largest; an empty last dim gives 0.
at::Tensor NormOfDiff(const at::Tensor& diff, double p) {
  const at::Tensor a = diff.abs();
  if (diff.size(-1) == 0) return a.sum(-1);
  if (p == 0) return a.ne(0).to(diff.scalar_type()).sum(-1);
  if (p == 1) return a.sum(-1);
  if (p == 2) return a.square().sum(-1).sqrt();
  if (std::isinf(p)) return a.amax(-1);
  return a.pow(p).sum(-1).pow(1.0 / p);
}

// d dist / d diff for each difference, times the incoming gradient `g`
// (broadcast against diff's last dim), as the CPU's backward kernels.
at::Tensor DistanceGrad(const at::Tensor& diff, const at::Tensor& dist, const at::Tensor& g, double p) {
  if (p == 0) return at::zeros_like(diff);
  if (p == 1) return g * diff.sign();
  const at::Tensor zero = at::zeros({}, diff.options());
  if (std::isinf(p)) return g * diff.sign() * diff.abs().eq(dist).to(diff.scalar_type());
  if (p == 2) return at::where(dist.eq(0), zero, g * diff / dist);
  const at::Tensor a = diff.abs();
  at::Tensor term = p < 2 ? diff.sign() * a.pow(p - 1) : diff * a.pow(p - 2);
  at::Tensor skip = dist.eq(0);
  if (p < 1) skip = skip.logical_or(diff.eq(0));  // |0|^(p-1) is infinite there
  return at::where(skip, zero, term * g / dist.pow(p - 1));
}

void CheckDistanceInputs(const at::Tensor& x1, const at::Tensor& x2, double p) {
  TORCH_CHECK(at::isFloatingType(x1.scalar_type()), "cdist only supports floating-point dtypes, X1 got: ",
              x1.scalar_type());
  TORCH_CHECK(at::isFloatingType(x2.scalar_type()), "cdist only supports floating-point dtypes, X2 got: ",
              x2.scalar_type());
  TORCH_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  TORCH_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  TORCH_CHECK(x1.size(-1) == x2.size(-1), "X1 and X2 must have the same number of columns. X1: ", x1.size(-1),
              " X2: ", x2.size(-1));
  TORCH_CHECK(p >= 0, "cdist only supports non-negative p values");
}

// x1 [..., P, M] and x2 [..., R, M] -> x1_i - x2_j as [..., P, R, M]
at::Tensor PairDiff(const at::Tensor& x1, const at::Tensor& x2) { return x1.unsqueeze(-2) - x2.unsqueeze(-3); }

at::Tensor cdist_forward(const at::Tensor& x1, const at::Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  CheckDistanceInputs(x1, x2, p);
  const int64_t mode = compute_mode.value_or(0);
  TORCH_CHECK(mode >= 0 && mode <= 2, "possible modes: 0, 1, 2, but was: ", mode);
  if (p == 2 && (mode == 1 || (mode == 0 && (x1.size(-2) > 25 || x2.size(-2) > 25)))) {
    return at::_euclidean_dist(x1, x2);
  }
  // the CPU kernel's check, where it runs (not for empty inputs): a float32
  // x1 and a float64 x2 are refused, not promoted
  TORCH_CHECK(x1.numel() == 0 || x2.numel() == 0 || x1.scalar_type() == x2.scalar_type(), "expected scalar type ",
              x1.scalar_type(), " but found ", x2.scalar_type());
  return NormOfDiff(PairDiff(x1, x2), p);
}

// The gradient for x1 only (autograd asks again with the operands swapped
// for x2), shaped like x1 broadcast to the batch dims; autograd reduces it.
at::Tensor cdist_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p,
                          const at::Tensor& cdist) {
  std::vector<int64_t> batch = at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  // torch.func.jacrev / vmap over the cotangents: PyTorch's batching rule
  // passes the batch of gradients with unbatched x1 and x2 and takes the
  // result as unbatched, so any answer is wrong (the CPU reads the first
  // gradient only: a Jacobian up to 2.0 off for p = 1). Refused.
  TORCH_CHECK_NOT_IMPLEMENTED(grad.dim() <= static_cast<int64_t>(batch.size()) + 2,
                              "cdist backward with a batch of gradients (torch.func.jacrev or vmap of a vjp through "
                              "torch.cdist) gives a wrong Jacobian in PyTorch on every device; use "
                              "torch.autograd.functional.jacobian, or vmap(grad(...)) over the inputs");
  at::Tensor g = DistanceGrad(PairDiff(x1, x2), cdist.unsqueeze(-1), grad.unsqueeze(-1), p).sum(-2);
  batch.push_back(x1.size(-2));
  batch.push_back(x1.size(-1));
  return g.expand(batch).contiguous();
}

// The pairs (i, j), i < j, of n rows in pdist's order.
at::Tensor PairIndex(int64_t n, const at::Tensor& like) {
  return at::triu_indices(n, n, 1, like.options().dtype(at::kLong));
}

at::Tensor pdist_forward(const at::Tensor& self, double p) {
  TORCH_CHECK(self.is_contiguous(), "_pdist_forward requires contiguous input");
  TORCH_CHECK(self.dim() == 2, "pdist only supports 2D tensors, got: ", self.dim(), "D");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "pdist only supports floating-point dtypes");
  TORCH_CHECK(p >= 0, "pdist only supports non-negative p values");
  const at::Tensor ij = PairIndex(self.size(0), self);
  return NormOfDiff(self.index_select(0, ij[0]) - self.index_select(0, ij[1]), p);
}

at::Tensor pdist_backward(const at::Tensor& grad, const at::Tensor& self, double p, const at::Tensor& pdist) {
  TORCH_CHECK(self.is_contiguous(), "_pdist_backward requires self to be contiguous");
  TORCH_CHECK(pdist.is_contiguous(), "_pdist_backward requires pdist to be contiguous");
  const at::Tensor ij = PairIndex(self.size(0), self);
  const at::Tensor diff = self.index_select(0, ij[0]) - self.index_select(0, ij[1]);
  const at::Tensor term = DistanceGrad(diff, pdist.unsqueeze(-1), grad.unsqueeze(-1), p);
  return at::zeros_like(self).index_add_(0, ij[0], term).index_add_(0, ij[1], term.neg());
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_cdist_forward", cdist_forward);
  K("_cdist_backward", cdist_backward);
  K("_pdist_forward", pdist_forward);
  K("_pdist_backward", pdist_backward);
}
