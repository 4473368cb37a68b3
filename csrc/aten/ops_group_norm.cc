// Group normalization, forward and backward (nn.GroupNorm, diffusion UNets).
//
// The input [N, C, *] is viewed as [N, G, C/G, HxW]; statistics reduce the
// last two dims. Half and bfloat16 inputs compute in float, as the CPU's
// opmath does, and round once at the end.
#include <optional>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

struct Groups {
  int d;
  at::ScalarType t, ct;  // input dtype, compute dtype
  std::vector<int64_t> shape, grouped;  // input dims; [N, G, D, HxW]
  double count;                          // elements per group
};

Groups MakeGroups(const at::Tensor& x, int64_t n, int64_t c, int64_t hxw, int64_t group) {
  TORCH_CHECK(group > 0 && c % group == 0, "group_norm: expected the number of channels (", c,
              ") to be divisible by num_groups (", group, ")");
  TORCH_CHECK(x.numel() == n * c * hxw, "group_norm: expected an input of N*C*HxW = ", n * c * hxw,
              " elements, got ", x.sizes());
  CheckFloating(x.scalar_type(), "GroupNormKernelImpl");
  Groups g;
  g.d = DeviceIndex(x);
  g.t = x.scalar_type();
  g.ct = g.t == at::kDouble ? at::kDouble : at::kFloat;
  g.shape = x.sizes().vec();
  g.grouped = {n, group, c / group, hxw};
  g.count = static_cast<double>(c / group) * static_cast<double>(hxw);
  return g;
}

// A per-channel vector [C] broadcast over [N, G, D, HxW].
ir::Value PerChannel(const Groups& g, const at::Tensor& v) {
  ir::Builder& b = B(g.d);
  ir::Value r = b.Reshape(Operand(v, g.d, g.ct), {g.grouped[1], g.grouped[2]});
  return b.BroadcastInDim(r, g.grouped, {1, 2});
}

// A per-group statistic [N, G] broadcast over [N, G, D, HxW].
ir::Value PerGroup(const Groups& g, ir::Value s) { return B(g.d).BroadcastInDim(s, g.grouped, {0, 1}); }

ir::Value SumOver(const Groups& g, ir::Value x, const std::vector<int64_t>& dims) {
  ir::Builder& b = B(g.d);
  return b.Reduce(x, b.ScalarConstant(ToIr(g.ct), 0), dims, ir::ReduceKind::Sum);
}

bool Has(const std::optional<at::Tensor>& t) { return t && t->defined(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, int64_t n,
                                                                 int64_t c, int64_t hxw, int64_t group, double eps) {
  const ir::DType stats = ToIr(CheckNormParams(input, {&weight, &bias}));
  Groups g = MakeGroups(input, n, c, hxw, group);
  TraceScope s;
  ir::Builder& b = B(g.d);
  const int d = g.d;
  ir::Value x = b.Reshape(ValAs(input, g.ct), g.grouped);
  const std::vector<int64_t> stat = {n, group};
  ir::Value mean = b.Binary(Op::Div, SumOver(g, x, {2, 3}), Fill(d, g.count, g.ct, stat));
  ir::Value xc = b.Binary(Op::Sub, x, PerGroup(g, mean));
  ir::Value var = b.Binary(Op::Div, SumOver(g, b.Binary(Op::Mul, xc, xc), {2, 3}), Fill(d, g.count, g.ct, stat));
  ir::Value rstd = b.Unary(Op::Rsqrt, b.Binary(Op::Add, var, Fill(d, eps, g.ct, stat)));
  ir::Value y = b.Binary(Op::Mul, xc, PerGroup(g, rstd));
  if (Has(weight)) y = b.Binary(Op::Mul, y, PerChannel(g, *weight));
  if (Has(bias)) y = b.Binary(Op::Add, y, PerChannel(g, *bias));
  y = b.Convert(b.Reshape(y, g.shape), ToIr(g.t));
  return {Wrap(y, d), Wrap(b.Convert(mean, stats), d), Wrap(b.Convert(rstd, stats), d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, int64_t n, int64_t c, int64_t hxw, int64_t group,
    std::array<bool, 3> mask) {
  Groups g = MakeGroups(input, n, c, hxw, group);
  TraceScope s;
  ir::Builder& b = B(g.d);
  const int d = g.d;
  const std::vector<int64_t> stat = {n, group};
  ir::Value x = b.Reshape(ValAs(input, g.ct), g.grouped);
  ir::Value dy = b.Reshape(ValAs(grad_out, g.ct), g.grouped);
  ir::Value r = PerGroup(g, b.Reshape(ValAs(rstd, g.ct), stat));
  ir::Value xhat = b.Binary(Op::Mul, b.Binary(Op::Sub, x, PerGroup(g, b.Reshape(ValAs(mean, g.ct), stat))), r);
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    ir::Value gy = Has(weight) ? b.Binary(Op::Mul, dy, PerChannel(g, *weight)) : dy;
    ir::Value cnt = Fill(d, g.count, g.ct, stat);
    ir::Value mg = PerGroup(g, b.Binary(Op::Div, SumOver(g, gy, {2, 3}), cnt));
    ir::Value mgx = PerGroup(g, b.Binary(Op::Div, SumOver(g, b.Binary(Op::Mul, gy, xhat), {2, 3}), cnt));
    ir::Value dx = b.Binary(Op::Mul, r, b.Binary(Op::Sub, b.Binary(Op::Sub, gy, mg), b.Binary(Op::Mul, xhat, mgx)));
    gi = Wrap(b.Convert(b.Reshape(dx, g.shape), ToIr(g.t)), d);
  }
  // Per-channel sums over the batch and the spatial positions.
  auto per_channel = [&](ir::Value v, const at::Tensor& like) {
    ir::Value sum = b.Reshape(SumOver(g, v, {0, 3}), {c});
    return Wrap(b.Convert(sum, ToIr(like.scalar_type())), d);
  };
  if (mask[1] && Has(weight)) gw = per_channel(b.Binary(Op::Mul, dy, xhat), *weight);
  if (mask[2]) gb = per_channel(dy, Has(weight) ? *weight : input);
  return {gi, gw, gb};
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  TPJ_LAID(m, "native_group_norm", kInput, native_group_norm);
  TPJ_LAID(m, "native_group_norm_backward", kInput, native_group_norm_backward);
}
