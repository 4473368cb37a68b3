// F.ctc_loss: _ctc_loss (the alpha recursion) and _ctc_loss_backward (the
// beta recursion and the gradient formula of ATen's LossCTC.cpp), both
// vectorized over the batch and the extended target and unrolled over time,
// so one program holds all T steps. Lengths become device data (uploaded
// once per call): new lengths of the same shapes reuse the compiled program.
#include <algorithm>
#include <numeric>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

// The static problem: sizes, and the per-sample data on the device.
struct Problem {
  int d = 0;
  at::ScalarType t;
  int64_t T = 0, N = 0, C = 0, S = 0, E = 0;  // E = 2S + 1 extended-target states
  ir::Value lengths;       // i64 [N] input lengths
  ir::Value tlengths;      // i64 [N] target lengths
  ir::Value ext;           // i64 [N, E] extended target: blank, l1, blank, l2, ..., blank
  ir::Value lp_ext;        // [T, N, E] log_probs[t, n, ext[n, s]]
  ir::Value coords;        // i64 [T, N, E, 3] the (t, n, ext) coordinates of lp_ext
  ir::Value state_ok;      // bool [N, E]: s <= 2 * target_length
  ir::Value skip_ok;       // bool [N, E]: s >= 2 and ext[s] != ext[s - 2]
};

at::Tensor Upload(const std::vector<int64_t>& v, const at::Tensor& like) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(like.device());
}

Problem Prepare(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef il, at::IntArrayRef tl,
                int64_t blank) {
  TORCH_CHECK(log_probs.dim() == 3, "ctc_loss: expected log_probs of shape [T, N, C], got ", log_probs.sizes());
  TORCH_CHECK(log_probs.numel() > 0, "log_probs tensor must not be empty");  // the CPU's check
  TORCH_CHECK(at::isFloatingType(log_probs.scalar_type()) && log_probs.scalar_type() != at::kHalf &&
                  log_probs.scalar_type() != at::kBFloat16,
              "ctc_loss on pjrt supports float32 and float64 log_probs, got ", log_probs.scalar_type());
  TORCH_CHECK(targets.scalar_type() == at::kLong || targets.scalar_type() == at::kInt,
              "ctc_loss: expected targets of type int64 or int32, got ", targets.scalar_type());
  Problem p;
  p.t = log_probs.scalar_type();
  p.T = log_probs.size(0);
  p.N = log_probs.size(1);
  p.C = log_probs.size(2);
  TORCH_CHECK(blank >= 0 && blank < p.C, "blank must be in label range");
  TORCH_CHECK(static_cast<int64_t>(il.size()) == p.N, "input_lengths must be of size batch_size");
  TORCH_CHECK(static_cast<int64_t>(tl.size()) == p.N, "target_lengths must be of size batch_size");
  for (int64_t n = 0; n < p.N; ++n) {
    TORCH_CHECK(il[n] >= 0 && il[n] <= p.T, "Expected input_lengths to have value at most ", p.T, ", but got value ",
                il[n], " (while checking arguments for ctc_loss_cpu)");
    TORCH_CHECK(tl[n] >= 0, "ctc_loss: target lengths must be non-negative, got ", tl[n]);
  }
  std::vector<int64_t> gather_at;  // concatenated targets: the flat position of target j of sample n
  if (targets.dim() == 1) {
    const int64_t total = std::accumulate(tl.begin(), tl.end(), int64_t{0});
    TORCH_CHECK(targets.size(0) == total, "Expected tensor to have size ", total,
                " at dimension 0, but got size ", targets.size(0), " for argument #2 'targets'");
    p.S = p.N ? *std::max_element(tl.begin(), tl.end()) : 0;
    int64_t off = 0;
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t j = 0; j < p.S; ++j) gather_at.push_back(std::min(off + j, std::max<int64_t>(total - 1, 0)));
      off += tl[n];
    }
  } else {
    TORCH_CHECK(targets.dim() == 2 && targets.size(0) == p.N, "ctc_loss: expected targets of shape [N, S] or "
                "concatenated 1-D targets, got ", targets.sizes());
    p.S = targets.size(1);
    for (int64_t n = 0; n < p.N; ++n) {
      TORCH_CHECK(tl[n] <= p.S, "Expected tensor to have size at least ", tl[n], " at dimension 1, but got size ",
                  p.S, " for argument #2 'targets' (while checking arguments for ctc_loss_cpu)");
    }
  }
  p.E = 2 * p.S + 1;
  at::Tensor il_dev = Upload(il.vec(), log_probs), tl_dev = Upload(tl.vec(), log_probs);
  const at::Tensor tg = IsPjrt(targets) ? targets : targets.to(log_probs.device());
  at::Tensor at_dev = gather_at.empty() ? at::Tensor() : Upload(gather_at, log_probs);

  p.d = CommonDevice({&log_probs, &tg});
  ir::Builder& b = B(p.d);
  p.lengths = Val(il_dev);
  p.tlengths = Val(tl_dev);
  const int64_t N = p.N, S = p.S, E = p.E, T = p.T;
  ir::Value blanks = I64(b, {N, E}, blank);
  if (S > 0 && N > 0) {
    ir::Value tgt = b.Convert(Val(tg), ir::DType::I64);
    if (targets.dim() == 1) {
      ir::GatherDims g;
      g.collapsed_slice_dims = {0};
      g.start_index_map = {0};
      g.index_vector_dim = 2;
      tgt = b.Gather(tgt, b.Reshape(Val(at_dev), {N, S, 1}), g, {1});
    }
    // Labels of real positions must be classes; padding may hold anything.
    ir::Value j = b.Iota({ir::DType::I64, {N, S}}, 1);
    ir::Value real = b.Compare(CompareDir::LT, j, b.BroadcastInDim(p.tlengths, {N, S}, {0}));
    ir::Value bad = b.Binary(Op::Or, b.Compare(CompareDir::LT, tgt, I64(b, {N, S}, 0)),
                             b.Compare(CompareDir::GE, tgt, I64(b, {N, S}, p.C)));
    CheckNone(p.d, b.Binary(Op::And, real, bad), runtime::ErrorKind::kIndex,
              "ctc_loss: a target label is outside [0, " + std::to_string(p.C) + ")");
    tgt = b.Clamp(I64(b, {}, 0), tgt, I64(b, {}, p.C - 1));
    ir::Value pairs = b.Concatenate({b.Reshape(I64(b, {N, S}, blank), {N, S, 1}), b.Reshape(tgt, {N, S, 1})}, 2);
    p.ext = b.Concatenate({b.Reshape(pairs, {N, 2 * S}), I64(b, {N, 1}, blank)}, 1);
  } else {
    p.ext = blanks;
  }
  ir::Value s = b.Iota({ir::DType::I64, {N, E}}, 1);
  ir::Value two_tl1 = b.Binary(Op::Add, b.Binary(Op::Mul, b.BroadcastInDim(p.tlengths, {N, E}, {0}), I64(b, {N, E}, 2)),
                               I64(b, {N, E}, 1));
  p.state_ok = b.Compare(CompareDir::LT, s, two_tl1);
  if (E > 2) {
    ir::Value prev2 = b.Slice(b.Pad(p.ext, b.ScalarConstant(ir::DType::I64, -1), {0, 2}, {0, 0}, {0, 0}), {0, 0},
                              {N, E}, {1, 1});
    p.skip_ok = b.Compare(CompareDir::NE, p.ext, prev2);
    p.skip_ok = b.Binary(Op::And, p.skip_ok, b.Compare(CompareDir::GE, s, I64(b, {N, E}, 2)));
  } else {
    p.skip_ok = b.Full(ir::DType::Bool, {N, E}, 0);
  }
  std::vector<int64_t> one{T, N, E, 1};
  p.coords = b.Concatenate({b.Iota({ir::DType::I64, one}, 0), b.Iota({ir::DType::I64, one}, 1),
                            b.BroadcastInDim(p.ext, one, {1, 2})},
                           3);
  ir::GatherDims g;
  g.collapsed_slice_dims = {0, 1, 2};
  g.start_index_map = {0, 1, 2};
  g.index_vector_dim = 3;
  p.lp_ext = b.Gather(ValAs(log_probs, p.t), p.coords, g, {1, 1, 1});
  return p;
}

// log(exp(a) + exp(b) + exp(c)) as LossCTC.cpp computes it: shifted by the
// max, or by 0 when all are -inf.
ir::Value LogSumExp3(const Problem& p, ir::Value a, ir::Value b2, ir::Value c) {
  ir::Builder& b = B(p.d);
  const auto dims = b.shape(a).dims;
  ir::Value m = b.Binary(Op::Max, b.Binary(Op::Max, a, b2), c);
  ir::Value neg_inf = BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), dims);
  m = b.Select(b.Compare(CompareDir::EQ, m, neg_inf), Fill(p.d, 0, p.t, dims), m);
  auto e = [&](ir::Value x) { return b.Unary(Op::Exp, b.Binary(Op::Sub, x, m)); };
  return b.Binary(Op::Add, b.Unary(Op::Log, b.Binary(Op::Add, b.Binary(Op::Add, e(a), e(b2)), e(c))), m);
}

// x [N, E] moved k states along s: toward higher s (k > 0) or lower (k < 0),
// -inf coming in.
ir::Value ShiftStates(const Problem& p, ir::Value x, int64_t k) {
  ir::Builder& b = B(p.d);
  ir::Value neg_inf = ExtremeConst(p.d, p.t, true);
  if (k > 0) return b.Slice(b.Pad(x, neg_inf, {0, k}, {0, 0}, {0, 0}), {0, 0}, {p.N, p.E}, {1, 1});
  return b.Slice(b.Pad(x, neg_inf, {0, 0}, {0, -k}, {0, 0}), {0, -k}, {p.N, p.E - k}, {1, 1});
}

ir::Value AtTime(const Problem& p, ir::Value x_tne, int64_t t) {
  ir::Builder& b = B(p.d);
  return b.Reshape(b.Slice(x_tne, {t, 0, 0}, {t + 1, p.N, p.E}, {1, 1, 1}), {p.N, p.E});
}

// The element of `v` where `mask` (at most one along `dim`) holds, or -inf
// where none does; a NaN stays NaN (XLA's max reduction on the CPU drops
// it: a NaN log-probability gave an infinite loss where the CPU's is NaN).
ir::Value PickOne(const Problem& p, ir::Value v, ir::Value mask, int64_t dim) {
  ir::Builder& b = B(p.d);
  const auto dims = b.shape(v).dims;
  ir::Value sum = b.Reduce(b.Select(mask, v, Fill(p.d, 0, p.t, dims)), b.ScalarConstant(ToIr(p.t), 0), {dim},
                           ir::ReduceKind::Sum);
  ir::Value any = b.Reduce(mask, b.ScalarConstant(ir::DType::Bool, 0), {dim}, ir::ReduceKind::Or);
  return b.Select(any, sum, BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), b.shape(sum).dims));
}

// Broadcast of an [N] value to [N, E].
ir::Value PerSample(const Problem& p, ir::Value v) { return B(p.d).BroadcastInDim(v, {p.N, p.E}, {0}); }

std::tuple<at::Tensor, at::Tensor> CtcForward(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef il,
                                              at::IntArrayRef tl, int64_t blank) {
  TraceScope scope;
  Problem p = Prepare(log_probs, targets, il, tl, blank);
  ir::Builder& b = B(p.d);
  const int64_t N = p.N, E = p.E, T = p.T;
  const std::vector<int64_t> ne{N, E};
  ir::Value neg_inf = BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), ne);
  ir::Value s = b.Iota({ir::DType::I64, ne}, 1);
  ir::Value tl_pos = b.Compare(CompareDir::GT, PerSample(p, p.tlengths), I64(b, ne, 0));
  ir::Value start = b.Binary(Op::Or, b.Compare(CompareDir::EQ, s, I64(b, ne, 0)),
                             b.Binary(Op::And, b.Compare(CompareDir::EQ, s, I64(b, ne, 1)), tl_pos));
  ir::Value last_t = b.Binary(Op::Sub, PerSample(p, p.lengths), I64(b, ne, 1));
  std::vector<ir::Value> rows;
  ir::Value alpha;
  for (int64_t t = 0; t < T; ++t) {
    ir::Value lp = AtTime(p, p.lp_ext, t);
    if (t == 0) {
      alpha = b.Select(start, lp, neg_inf);
    } else {
      ir::Value skip = b.Select(p.skip_ok, ShiftStates(p, alpha, 2), neg_inf);
      alpha = b.Binary(Op::Add, LogSumExp3(p, alpha, ShiftStates(p, alpha, 1), skip), lp);
    }
    alpha = InMemory(p.d, b.Select(p.state_ok, alpha, neg_inf));
    ir::Value live = b.Compare(CompareDir::GT, last_t, I64(b, ne, t - 1));  // t < length
    rows.push_back(b.Reshape(b.Select(live, alpha, neg_inf), {N, 1, E}));
  }
  ir::Value log_alpha = T == 0 ? Fill(p.d, 0, p.t, {N, 0, E}) : (T == 1 ? rows[0] : b.Concatenate(rows, 1));
  // alpha at each sample's last frame (all -inf without frames).
  const std::vector<int64_t> nte{N, T, E};
  ir::Value at_last = b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, nte}, 1),
                                b.BroadcastInDim(b.Binary(Op::Sub, p.lengths, I64(b, {N}, 1)), nte, {0}));
  ir::Value final_alpha = PickOne(p, log_alpha, at_last, 1);
  // The likelihood: the last blank plus (for non-empty targets) the last label.
  ir::Value two_tl = b.Binary(Op::Mul, PerSample(p, p.tlengths), I64(b, ne, 2));
  auto pick = [&](ir::Value state) { return PickOne(p, final_alpha, b.Compare(CompareDir::EQ, s, state), 1); };
  ir::Value l1 = pick(two_tl), l2 = pick(b.Binary(Op::Sub, two_tl, I64(b, ne, 1)));
  ir::Value ninf1 = BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), {N});
  ir::Value ll = LogSumExp3(p, l1, l2, ninf1);
  ir::Value nll = b.Unary(Op::Neg, ll);
  // No input frames: the empty target has likelihood 1, any other 0.
  ir::Value no_input = b.Compare(CompareDir::EQ, p.lengths, I64(b, {N}, 0));
  ir::Value empty_nll = b.Select(b.Compare(CompareDir::EQ, p.tlengths, I64(b, {N}, 0)), Fill(p.d, 0, p.t, {N}),
                                 BroadcastTo(p.d, ExtremeConst(p.d, p.t, false), {N}));
  nll = b.Select(no_input, empty_nll, nll);
  return {Wrap(nll, p.d), Wrap(log_alpha, p.d)};
}

at::Tensor CtcBackward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                       at::IntArrayRef il, at::IntArrayRef tl, const at::Tensor& neg_log_likelihood,
                       const at::Tensor& log_alpha, int64_t blank, bool zero_infinity) {
  TraceScope scope;
  Problem p = Prepare(log_probs, targets, il, tl, blank);
  ir::Builder& b = B(p.d);
  const int64_t N = p.N, E = p.E, T = p.T, C = p.C;
  TORCH_CHECK(log_alpha.dim() == 3 && log_alpha.size(0) == N && log_alpha.size(1) == T && log_alpha.size(2) == E,
              "ctc_loss backward: log_alpha of shape ", log_alpha.sizes(), " does not match [", N, ", ", T, ", ", E,
              "]");
  const std::vector<int64_t> ne{N, E};
  ir::Value neg_inf = BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), ne);
  ir::Value s = b.Iota({ir::DType::I64, ne}, 1);
  ir::Value two_tl = b.Binary(Op::Mul, PerSample(p, p.tlengths), I64(b, ne, 2));
  ir::Value tl_pos = b.Compare(CompareDir::GT, PerSample(p, p.tlengths), I64(b, ne, 0));
  ir::Value finish = b.Binary(Op::Or, b.Compare(CompareDir::EQ, s, two_tl),
                              b.Binary(Op::And, b.Compare(CompareDir::EQ, s, b.Binary(Op::Sub, two_tl, I64(b, ne, 1))),
                                       tl_pos));
  // skip_up_ok[s] = skip_ok[s + 2]: state s may jump to s + 2.
  ir::Value skip_up = E > 2 ? b.Slice(b.Pad(p.skip_ok, b.ScalarConstant(ir::DType::Bool, 0), {0, 0}, {0, 2}, {0, 0}),
                                      {0, 2}, {N, E + 2}, {1, 1})
                            : b.Full(ir::DType::Bool, ne, 0);
  ir::Value last_t = b.Binary(Op::Sub, PerSample(p, p.lengths), I64(b, ne, 1));
  std::vector<ir::Value> rows(static_cast<size_t>(T));
  ir::Value beta = neg_inf;
  for (int64_t t = T - 1; t >= 0; --t) {
    ir::Value lp = AtTime(p, p.lp_ext, t);
    ir::Value skip = b.Select(skip_up, ShiftStates(p, beta, -2), neg_inf);
    ir::Value next = b.Binary(Op::Add, LogSumExp3(p, beta, ShiftStates(p, beta, -1), skip), lp);
    ir::Value init = b.Select(finish, lp, neg_inf);
    ir::Value tt = I64(b, ne, t);
    beta = b.Select(b.Compare(CompareDir::EQ, last_t, tt), init,
                    b.Select(b.Compare(CompareDir::GT, last_t, tt), next, neg_inf));
    beta = InMemory(p.d, b.Select(p.state_ok, beta, neg_inf));
    rows[static_cast<size_t>(t)] = b.Reshape(beta, {1, N, E});
  }
  ir::Value betas = T == 1 ? rows[0] : b.Concatenate(rows, 0);  // [T, N, E]
  ir::Value alphas = b.Transpose(ValAs(log_alpha, p.t), {1, 0, 2});
  const std::vector<int64_t> tne{T, N, E};
  // The CPU's formula: exp(lp) - exp(lcab + nll - lp), lcab the log of the
  // sum over the class's states of exp(alpha + beta) (-inf for a class with
  // none), so that a -inf log-probability or an infinite loss gives NaN
  // where the CPU's does. Each class's sum is shifted by its own largest
  // state (a frame's largest would underflow a class far below it).
  ir::Value ab = b.Binary(Op::Add, alphas, betas);
  ir::ScatterDims sd;
  sd.inserted_window_dims = {0, 1, 2};
  sd.scatter_dims_to_operand_dims = {0, 1, 2};
  sd.index_vector_dim = 3;
  const std::vector<int64_t> tnc{T, N, C};
  ir::Value lowest = BroadcastTo(p.d, ExtremeConst(p.d, p.t, true), tnc);
  ir::Value m = b.Scatter(lowest, p.coords, ab, sd, false, ir::ReduceKind::Max);  // [T, N, C]
  m = b.Select(b.Compare(CompareDir::EQ, m, lowest), Fill(p.d, 0, p.t, tnc), m);
  ir::GatherDims per_state;
  per_state.collapsed_slice_dims = {0, 1, 2};
  per_state.start_index_map = {0, 1, 2};
  per_state.index_vector_dim = 3;
  ir::Value share = b.Unary(Op::Exp, b.Binary(Op::Sub, ab, b.Gather(m, p.coords, per_state, {1, 1, 1})));
  ir::Value lcab = b.Binary(Op::Add, b.Unary(Op::Log, b.Scatter(Fill(p.d, 0, p.t, tnc), p.coords, share, sd, false)), m);
  ir::Value lp_all = ValAs(log_probs, p.t);
  ir::Value nll = b.BroadcastInDim(ValAs(neg_log_likelihood, p.t), tnc, {1});
  ir::Value g = b.Binary(Op::Sub, b.Unary(Op::Exp, lp_all),
                         b.Unary(Op::Exp, b.Binary(Op::Sub, b.Binary(Op::Add, lcab, nll), lp_all)));
  g = b.Binary(Op::Mul, g, b.BroadcastInDim(ValAs(grad, p.t), tnc, {1}));
  // Frames past a sample's input length get no gradient; with zero_infinity,
  // neither does a sample whose loss is infinite.
  ir::Value live = b.Compare(CompareDir::LT, b.Iota({ir::DType::I64, tnc}, 0), b.BroadcastInDim(p.lengths, tnc, {1}));
  if (zero_infinity) {
    ir::Value finite = b.Compare(CompareDir::NE, ValAs(neg_log_likelihood, p.t),
                                 BroadcastTo(p.d, ExtremeConst(p.d, p.t, false), {N}));
    live = b.Binary(Op::And, live, b.BroadcastInDim(finite, tnc, {1}));
  }
  return Wrap(b.Select(live, g, Fill(p.d, 0, p.t, tnc)), p.d);
}

std::vector<int64_t> HostLengths(const at::Tensor& t, const char* what) {
  TORCH_CHECK(at::isIntegralType(t.scalar_type(), false), "ctc_loss: ", what, " must be integral");
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& log_probs, const at::Tensor& targets,
                                            at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                                            int64_t blank, bool zero_infinity) {
  (void)zero_infinity;  // applied by ctc_loss around this op, and by the backward
  return CtcForward(log_probs, targets, input_lengths, target_lengths, blank);
}

// The lengths shape the program's data only, but the CPU's op reads them on
// the host too (max target length): so do we, one transfer per call.
std::tuple<at::Tensor, at::Tensor> ctc_loss_tensor(const at::Tensor& log_probs, const at::Tensor& targets,
                                                   const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                                   int64_t blank, bool zero_infinity) {
  (void)zero_infinity;
  return CtcForward(log_probs, targets, HostLengths(input_lengths, "input_lengths"),
                    HostLengths(target_lengths, "target_lengths"), blank);
}

at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                             at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                             const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                             bool zero_infinity) {
  return CtcBackward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
                     zero_infinity);
}

at::Tensor ctc_loss_backward_tensor(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                                    const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                    const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                                    bool zero_infinity) {
  return CtcBackward(grad, log_probs, targets, HostLengths(input_lengths, "input_lengths"),
                     HostLengths(target_lengths, "target_lengths"), neg_log_likelihood, log_alpha, blank,
                     zero_infinity);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_ctc_loss", ctc_loss);
  K("_ctc_loss.Tensor", ctc_loss_tensor);
  K("_ctc_loss_backward", ctc_loss_backward);
  K("_ctc_loss_backward.Tensor", ctc_loss_backward_tensor);
}
