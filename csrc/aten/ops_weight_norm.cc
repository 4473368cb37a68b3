// Weight normalization (torch.nn.utils.weight_norm and its parametrization,
// e.g. wav2vec2's positional convolution): w = g * v / ||v||, the norm over
// every dim of v but `dim`, which is the first or the last as in PyTorch's
// fused kernel (its _weight_norm takes the composite path otherwise).
//
// Half and bfloat16 compute in float and round once, as the CPU's kernel;
// the norms it returns are float for a bfloat16 g, as the CPU keeps them.
#include <tuple>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

struct Norm {
  int d;
  int64_t dim;                    // the kept dim of v
  at::ScalarType ct;              // compute dtype
  std::vector<int64_t> shape;     // v's dims
  std::vector<int64_t> reduced;   // every dim but `dim`
};

Norm MakeNorm(const at::Tensor& v, const at::Tensor& g, int64_t dim) {
  TORCH_CHECK(v.dim() > 0, "weight_norm: expected v with at least one dim, got a scalar");
  dim = at::maybe_wrap_dim(dim, v.dim());
  TORCH_CHECK(dim == 0 || dim == v.dim() - 1, "weight_norm: the fused kernel normalizes over the first or the last dim, "
              "got dim ", dim, " of a ", v.dim(), "-d v");
  TORCH_CHECK(g.numel() == v.size(dim), "weight_norm: expected g with ", v.size(dim), " elements (v's size at dim ", dim,
              "), got shape ", g.sizes());
  TORCH_CHECK(at::isFloatingType(v.scalar_type()) && at::isFloatingType(g.scalar_type()),
              "weight_norm on pjrt expects floating-point v and g, got ", v.scalar_type(), " and ", g.scalar_type());
  Norm n;
  n.d = CommonDevice({&v, &g});
  n.dim = dim;
  n.ct = v.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  n.shape = v.sizes().vec();
  for (int64_t i = 0; i < v.dim(); ++i) {
    if (i != dim) n.reduced.push_back(i);
  }
  return n;
}

// A per-slice vector (g, the norms) as [v.size(dim)] in the compute dtype.
ir::Value PerSlice(const Norm& n, const at::Tensor& t) {
  return B(n.d).Reshape(Operand(t, n.d, n.ct), {n.shape[n.dim]});
}

ir::Value Spread(const Norm& n, ir::Value per_slice) { return B(n.d).BroadcastInDim(per_slice, n.shape, {n.dim}); }

ir::Value SumOthers(const Norm& n, ir::Value x) {
  ir::Builder& b = B(n.d);
  return b.Reduce(x, b.ScalarConstant(ToIr(n.ct), 0), n.reduced, ir::ReduceKind::Sum);
}

at::ScalarType NormType(const at::Tensor& g) { return g.scalar_type() == at::kBFloat16 ? at::kFloat : g.scalar_type(); }

std::tuple<at::Tensor, at::Tensor> weight_norm_interface(const at::Tensor& v, const at::Tensor& g, int64_t dim) {
  Norm n = MakeNorm(v, g, dim);
  TraceScope s;
  ir::Builder& b = B(n.d);
  ir::Value x = Operand(v, n.d, n.ct);
  ir::Value norm = b.Unary(Op::Sqrt, SumOthers(n, b.Binary(Op::Mul, x, x)));
  ir::Value w = b.Binary(Op::Mul, x, Spread(n, b.Binary(Op::Div, PerSlice(n, g), norm)));
  ir::Value norms = b.Convert(b.Reshape(norm, g.sizes().vec()), ToIr(NormType(g)));
  return {Wrap(b.Convert(w, ToIr(v.scalar_type())), n.d), Wrap(norms, n.d)};
}

// grad_g = sum(grad_w v) / norm; grad_v = g / norm (grad_w - v grad_g / norm)
std::tuple<at::Tensor, at::Tensor> weight_norm_interface_backward(const at::Tensor& grad_w, const at::Tensor& v,
                                                                  const at::Tensor& g, const at::Tensor& norms,
                                                                  int64_t dim) {
  Norm n = MakeNorm(v, g, dim);
  TORCH_CHECK(grad_w.sizes() == v.sizes(), "weight_norm backward: grad_w of shape ", grad_w.sizes(),
              " does not match v's ", v.sizes());
  TORCH_CHECK(norms.numel() == g.numel(), "weight_norm backward: expected ", g.numel(), " norms, got ", norms.sizes());
  TORCH_CHECK(CommonDevice({&grad_w, &v, &g, &norms}) == n.d, "weight_norm backward: tensors on different devices");
  TraceScope s;
  ir::Builder& b = B(n.d);
  ir::Value x = Operand(v, n.d, n.ct), gw = Operand(grad_w, n.d, n.ct);
  ir::Value norm = PerSlice(n, norms);
  ir::Value gg = b.Binary(Op::Div, SumOthers(n, b.Binary(Op::Mul, gw, x)), norm);
  ir::Value scale = Spread(n, b.Binary(Op::Div, PerSlice(n, g), norm));
  ir::Value gv = b.Binary(Op::Mul, scale, b.Binary(Op::Sub, gw, b.Binary(Op::Mul, x, Spread(n, b.Binary(Op::Div, gg, norm)))));
  return {Wrap(b.Convert(gv, ToIr(v.scalar_type())), n.d),
          Wrap(b.Convert(b.Reshape(gg, g.sizes().vec()), ToIr(g.scalar_type())), n.d)};
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_weight_norm_interface", weight_norm_interface);
  K("_weight_norm_interface_backward", weight_norm_interface_backward);
}
