// Recurrent-cell lowerings: the fused LSTM and GRU cell kernels of ATen and
// their backwards.
//
// Why lower these rather than route pjrt to another path: ATen's lstm/gru
// and lstm_cell/gru_cell (RNN.cpp) send every non-CPU tensor, PrivateUse1
// included, to _thnn_fused_lstm_cell / _thnn_fused_gru_cell, kernels only
// CUDA and XPU implement; the CPU's cell (the same math as separate ops) is
// picked by is_cpu() alone. Reaching it from pjrt would mean re-registering
// the CompositeImplicitAutograd lstm/gru/lstm_cell/gru_cell ops and
// re-implementing their layer, direction, packed-sequence, dropout and
// projection loops. The fused ops instead are four small elementwise
// kernels with a fixed workspace layout and autograd formulas in
// derivatives.yaml: lowering them keeps all of PyTorch's RNN code running
// unchanged on pjrt, and each time step of a sequence traces to a few
// elementwise IR ops (plus the two matmuls ATen issues) that XLA fuses.
//
// Semantics follow the CUDA kernels (aten/src/ATen/native/cuda/RNN.cu):
//   LSTM gates [B, 4H] in order input, forget, cell, output; workspace
//   [B, 4H] holds the activated gates in that order.
//   GRU gates [B, 3H] in order reset, update (called input), new; workspace
//   [B, 5H] holds r, z, n, hx and (hidden new-gate + its bias).
//   Absent biases count as zero; the bias gradients are the gate gradients
//   summed over the batch (undefined when has_bias is false).
// float16/bfloat16 compute in float32 and round the results, as CUDA's
// accscalar_t does.
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

// Elementwise helpers on one device, in one compute dtype.
struct Cell {
  int d;
  at::ScalarType out;      // the tensors' dtype
  at::ScalarType compute;  // float32 for float16/bfloat16, else `out`
  std::vector<int64_t> shape;  // [B, H]

  ir::Builder& b() const { return B(d); }
  ir::Value In(const at::Tensor& t) const { return ValAs(t, compute); }
  ir::Value Out(ir::Value v) const { return compute == out ? v : b().Convert(v, ToIr(out)); }
  ir::Value Add(ir::Value x, ir::Value y) const { return b().Binary(Op::Add, x, y); }
  ir::Value Sub(ir::Value x, ir::Value y) const { return b().Binary(Op::Sub, x, y); }
  ir::Value Mul(ir::Value x, ir::Value y) const { return b().Binary(Op::Mul, x, y); }
  ir::Value One() const { return Fill(d, 1, compute, shape); }
  ir::Value Sigmoid(ir::Value x) const { return b().Unary(Op::Logistic, x); }
  ir::Value Tanh(ir::Value x) const { return b().Unary(Op::Tanh, x); }
  // x * (1 - x): the derivative of the sigmoid, from its output.
  ir::Value SigmoidGrad(ir::Value s) const { return Mul(s, Sub(One(), s)); }
  // 1 - x * x: the derivative of tanh, from its output.
  ir::Value TanhGrad(ir::Value t) const { return Sub(One(), Mul(t, t)); }
  // Gate k of a [B, n*H] value.
  ir::Value Gate(ir::Value v, int64_t k) const {
    const int64_t h = shape[1];
    return b().Slice(v, {0, k * h}, {shape[0], (k + 1) * h}, {1, 1});
  }
  // The summed gate pre-activations: input + hidden (+ both biases, [n*H]).
  ir::Value Gates(const at::Tensor& ig, const at::Tensor& hg, const std::optional<at::Tensor>& ib,
                  const std::optional<at::Tensor>& hb) const {
    ir::Value g = Add(In(ig), In(hg));
    const std::vector<int64_t> gshape = ig.sizes().vec();
    if (ib && ib->defined()) g = Add(g, b().BroadcastInDim(In(*ib), gshape, {1}));
    if (hb && hb->defined()) g = Add(g, b().BroadcastInDim(In(*hb), gshape, {1}));
    return g;
  }
  // Sum over the batch: a bias gradient [n*H].
  ir::Value BatchSum(ir::Value v) const {
    return b().Reduce(v, b().ScalarConstant(ToIr(compute), 0), {0}, ir::ReduceKind::Sum);
  }
};

Cell MakeCell(int d, const at::Tensor& like, std::vector<int64_t> shape) {
  const at::ScalarType t = like.scalar_type();
  TORCH_CHECK(at::isFloatingType(t), "fused RNN cells on pjrt take floating-point tensors, got ", t);
  const bool half = t == at::kHalf || t == at::kBFloat16;
  return Cell{d, t, half ? at::kFloat : t, std::move(shape)};
}

void CheckGates(const char* op, const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& state, int64_t factor,
                const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb) {
  TORCH_CHECK(ig.dim() == 2 && ig.sizes() == hg.sizes(), op, ": input_gates and hidden_gates must be 2-D of one shape, got ",
              ig.sizes(), " and ", hg.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == ig.size(0) && state.size(1) * factor == ig.size(1), op,
              ": the state must be [batch, gates/", factor, "], got ", state.sizes(), " for gates ", ig.sizes());
  const bool has_ib = ib && ib->defined(), has_hb = hb && hb->defined();
  TORCH_CHECK(has_ib == has_hb, op, ": give both biases or neither");
  if (has_ib) {
    TORCH_CHECK(ib->dim() == 1 && ib->size(0) == ig.size(1) && ib->sizes() == hb->sizes(), op,
                ": biases must be 1-D with one entry per gate element, got ", ib->sizes(), " and ", hb->sizes());
  }
}

// ------------------------------------------------------------------ LSTM

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                         const at::Tensor& cx, const std::optional<at::Tensor>& input_bias,
                                                         const std::optional<at::Tensor>& hidden_bias) {
  CheckGates("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4, input_bias, hidden_bias);
  TraceScope s;
  const int d = CommonDevice({&input_gates, &hidden_gates, &cx});
  const Cell c = MakeCell(d, input_gates, cx.sizes().vec());
  ir::Value g = c.Gates(input_gates, hidden_gates, input_bias, hidden_bias);
  ir::Value i = c.Sigmoid(c.Gate(g, 0));
  ir::Value f = c.Sigmoid(c.Gate(g, 1));
  ir::Value z = c.Tanh(c.Gate(g, 2));
  ir::Value o = c.Sigmoid(c.Gate(g, 3));
  // The cell state chains elementwise from step to step: kept in memory
  // (InMemory), or compile time grows quadratically with the steps.
  ir::Value cy = InMemory(d, c.Add(c.Mul(f, c.In(cx)), c.Mul(i, z)));
  ir::Value hy = c.Mul(o, c.Tanh(cy));
  ir::Value workspace = c.b().Concatenate({i, f, z, o}, 1);
  return {Wrap(c.Out(hy), d), Wrap(c.Out(cy), d), Wrap(c.Out(workspace), d)};
}

// (grad_gates [B, 4H], grad_cx [B, H], grad_bias [4H] or undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  const bool has_gh = grad_hy && grad_hy->defined(), has_gc = grad_cy && grad_cy->defined();
  if (!has_gh && !has_gc) return {};
  TORCH_CHECK(cx.dim() == 2 && cy.sizes() == cx.sizes() && workspace.dim() == 2 &&
                  workspace.size(0) == cx.size(0) && workspace.size(1) == 4 * cx.size(1),
              "_thnn_fused_lstm_cell_backward: expected cx, cy [B, H] and workspace [B, 4H], got ", cx.sizes(), ", ",
              cy.sizes(), ", ", workspace.sizes());
  TraceScope s;
  const int d = CommonDevice({&cx, &cy, &workspace});
  const Cell c = MakeCell(d, workspace, cx.sizes().vec());
  ir::Value zero = Fill(d, 0, c.compute, c.shape);
  ir::Value gh = has_gh ? c.In(*grad_hy) : zero;
  ir::Value gc = has_gc ? c.In(*grad_cy) : zero;
  ir::Value w = c.In(workspace);
  ir::Value i = c.Gate(w, 0), f = c.Gate(w, 1), z = c.Gate(w, 2), o = c.Gate(w, 3);
  ir::Value tcy = c.Tanh(c.In(cy));
  // Gradient reaching the cell state: through hy = o * tanh(cy), plus grad_cy.
  ir::Value gcell = c.Add(c.Mul(c.Mul(gh, o), c.TanhGrad(tcy)), gc);
  ir::Value gi = c.Mul(c.Mul(gcell, z), c.SigmoidGrad(i));
  ir::Value gf = c.Mul(c.Mul(gcell, c.In(cx)), c.SigmoidGrad(f));
  ir::Value gz = c.Mul(c.Mul(gcell, i), c.TanhGrad(z));
  ir::Value go = c.Mul(c.Mul(gh, tcy), c.SigmoidGrad(o));
  ir::Value grad_gates = c.b().Concatenate({gi, gf, gz, go}, 1);
  at::Tensor grad_bias = has_bias ? Wrap(c.Out(c.BatchSum(grad_gates)), d) : at::Tensor();
  return {Wrap(c.Out(grad_gates), d), Wrap(c.Out(InMemory(d, c.Mul(gcell, f))), d), grad_bias};
}

// ------------------------------------------------------------------ GRU

std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  CheckGates("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3, input_bias, hidden_bias);
  TraceScope s;
  const int d = CommonDevice({&input_gates, &hidden_gates, &hx});
  const Cell c = MakeCell(d, input_gates, hx.sizes().vec());
  const bool has_bias = input_bias && input_bias->defined();
  // The new gate adds the hidden bias before the reset gate scales it, so
  // the two sides are summed per gate, not as one pre-activation.
  ir::Value ig = c.In(input_gates), hg = c.In(hidden_gates);
  if (has_bias) {
    const std::vector<int64_t> gshape = input_gates.sizes().vec();
    ig = c.Add(ig, c.b().BroadcastInDim(c.In(*input_bias), gshape, {1}));
    hg = c.Add(hg, c.b().BroadcastInDim(c.In(*hidden_bias), gshape, {1}));
  }
  ir::Value r = c.Sigmoid(c.Add(c.Gate(ig, 0), c.Gate(hg, 0)));
  ir::Value z = c.Sigmoid(c.Add(c.Gate(ig, 1), c.Gate(hg, 1)));
  ir::Value hn = c.Gate(hg, 2);
  ir::Value n = c.Tanh(c.Add(c.Gate(ig, 2), c.Mul(r, hn)));
  ir::Value h = c.In(hx);
  ir::Value hy = InMemory(d, c.Add(n, c.Mul(z, c.Sub(h, n))));  // chains step to step
  ir::Value workspace = c.b().Concatenate({r, z, n, h, hn}, 1);
  return {Wrap(c.Out(hy), d), Wrap(c.Out(workspace), d)};
}

// (grad_input_gates, grad_hidden_gates [B, 3H], grad_hx [B, H], grad_input_bias,
// grad_hidden_bias [3H] or undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                         const at::Tensor& workspace,
                                                                                         bool has_bias) {
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) &&
                  workspace.size(1) == 5 * grad_hy.size(1),
              "_thnn_fused_gru_cell_backward: expected grad_hy [B, H] and workspace [B, 5H], got ", grad_hy.sizes(),
              " and ", workspace.sizes());
  TraceScope s;
  const int d = CommonDevice({&grad_hy, &workspace});
  const Cell c = MakeCell(d, workspace, grad_hy.sizes().vec());
  ir::Value w = c.In(workspace);
  ir::Value r = c.Gate(w, 0), z = c.Gate(w, 1), n = c.Gate(w, 2), h = c.Gate(w, 3), hn = c.Gate(w, 4);
  ir::Value go = c.In(grad_hy);
  ir::Value gz = c.Mul(c.Mul(go, c.Sub(h, n)), c.SigmoidGrad(z));
  ir::Value ghx = InMemory(d, c.Mul(go, z));
  ir::Value gn = c.Mul(c.Mul(go, c.Sub(c.One(), z)), c.TanhGrad(n));
  ir::Value ghn = c.Mul(gn, r);
  ir::Value gr = c.Mul(c.Mul(gn, hn), c.SigmoidGrad(r));
  ir::Value gi = c.b().Concatenate({gr, gz, gn}, 1);
  ir::Value gh = c.b().Concatenate({gr, gz, ghn}, 1);
  at::Tensor gib, ghb;
  if (has_bias) {
    gib = Wrap(c.Out(c.BatchSum(gi)), d);
    ghb = Wrap(c.Out(c.BatchSum(gh)), d);
  }
  return {Wrap(c.Out(gi), d), Wrap(c.Out(gh), d), Wrap(c.Out(ghx), d), gib, ghb};
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_thnn_fused_lstm_cell", lstm_cell);
  K("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward);
  K("_thnn_fused_gru_cell", gru_cell);
  K("_thnn_fused_gru_cell_backward", gru_cell_backward);
}
