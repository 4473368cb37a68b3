// The fused optimizer steps (torch.optim.Adam/AdamW/SGD/Adagrad(fused=True)), composed
// from lowered ops with the math of PyTorch's fused kernels, so that they
// trace into the step's program like the foreach path instead of running on
// the CPU. The bias corrections take the step count as a tensor (the CPU
// kernel reads it to the host: a sync per step here). With a GradScaler's
// grad_scale the gradients are unscaled in place, as the fused kernels
// write them back; with found_inf every update is a select that keeps the
// old values when it is set, instead of a host-side skip.

#include <map>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using OptTensor = std::optional<at::Tensor>;

void CheckLists(size_t n, std::initializer_list<size_t> sizes, const char* op) {
  for (size_t s : sizes) TORCH_CHECK(s == n, op, ": every tensor list must have one entry per parameter");
}

// dst = new, or, when found_inf is set to a non-zero value, dst unchanged.
void Update(const at::Tensor& dst, const at::Tensor& value, const OptTensor& found_inf) {
  if (found_inf.has_value() && found_inf->defined()) {
    dst.copy_(at::where(found_inf->ne(0), dst, value));
  } else {
    dst.copy_(value);
  }
}

// The gradient the step uses: unscaled (written back) and negated for maximize.
at::Tensor StepGrad(const at::Tensor& grad, bool maximize, const OptTensor& grad_scale, const OptTensor& found_inf) {
  if (grad_scale.has_value() && grad_scale->defined()) Update(grad, grad / *grad_scale, found_inf);
  return maximize ? grad.neg() : grad;
}

// StepGrad in `param`'s (op-math) dtype, plus L2 weight decay: the
// gradient SGD and Adagrad step with.
at::Tensor DecayedGrad(const at::Tensor& grad, const at::Tensor& param, double weight_decay, bool maximize,
                       const OptTensor& grad_scale, const OptTensor& found_inf) {
  at::Tensor g = StepGrad(grad, maximize, grad_scale, found_inf).to(param.scalar_type());
  return weight_decay != 0 ? g + param * weight_decay : g;
}

// A 0-d or one-element tensor (grad_scale, found_inf, a tensor lr) as a
// value of dtype t broadcast to `shape`.
ir::Value Broadcast1(int d, const at::Tensor& x, at::ScalarType t, const std::vector<int64_t>& shape, const char* op) {
  TORCH_CHECK(x.numel() == 1, op, ": expected a one-element tensor, got shape ", x.sizes());
  return BroadcastTo(d, B(d).Reshape(Operand(x, d, t), {}), shape);
}

double LrValue(double lr) { return lr; }
double LrValue(const at::Tensor&) { return 0; }

// _fused_adam_ (kDecoupled false) and _fused_adamw_, each with lr a number
// (LR double) or a tensor (LR const at::Tensor&): one kernel per overload.
// Built in IR directly, a few nodes per parameter: composed of ATen ops
// (about 30 dispatched ops per parameter at 2.8 us each) the fused step of
// a small MLP cost more than its forward and backward.
template <bool kDecoupled, typename LR>
void FusedAdam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               at::TensorList max_exp_avg_sqs, at::TensorList state_steps, LR lr, double beta1, double beta2,
               double weight_decay, double eps, bool amsgrad, bool maximize, const OptTensor& grad_scale,
               const OptTensor& found_inf) {
  const char* op = kDecoupled ? "_fused_adamw_" : "_fused_adam_";
  const size_t n = params.size();
  CheckLists(n, {grads.size(), exp_avgs.size(), exp_avg_sqs.size(), state_steps.size()}, op);
  if (amsgrad) CheckLists(n, {max_exp_avg_sqs.size()}, op);
  constexpr bool kTensorLr = std::is_same_v<LR, const at::Tensor&>;
  const bool scaled = grad_scale.has_value() && grad_scale->defined();
  const bool skippable = found_inf.has_value() && found_inf->defined();
  // One traced op, the runtime lock held throughout: the numbers, 0-d
  // values shared by every parameter of the call (one program argument
  // each, not one per parameter and use), stay in one trace.
  TraceScope scope;
  // Keyed by role, not value: keyed by value, a learning rate equal to the
  // weight decay (a schedule passing 0.01) shared its argument, a program of
  // another structure compiled for that one step.
  std::map<std::tuple<int, at::ScalarType, std::string_view>, ir::Value> numbers;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    const int d = CommonDevice({&p, &grads[i], &exp_avgs[i], &exp_avg_sqs[i], &state_steps[i]});
    ir::Builder& b = B(d);
    const at::ScalarType t = OpMath(p.scalar_type());  // half types update in float
    const std::vector<int64_t> shape = p.sizes().vec();
    for (const at::Tensor* x : {&grads[i], &exp_avgs[i], &exp_avg_sqs[i]}) {
      TORCH_CHECK(x->sizes() == p.sizes(), op, ": every state tensor must have its parameter's shape ", p.sizes(),
                  ", got ", x->sizes());
    }
    auto scalar = [&](std::string_view role, double v, at::ScalarType type) {
      auto [it, fresh] = numbers.try_emplace({d, type, role});
      if (fresh) it->second = Number(d, v, type, {});
      return it->second;
    };
    auto num = [&](std::string_view role, double v) { return BroadcastTo(d, scalar(role, v, t), shape); };
    auto bin = [&](ir::Op o, ir::Value x, ir::Value y) { return b.Binary(o, x, y); };
    // dst = value, or dst unchanged where found_inf is set
    ir::Value skip = skippable ? b.Compare(ir::CompareDir::NE, Broadcast1(d, *found_inf, t, shape, op), num("0", 0))
                               : ir::Value{};
    auto update = [&](const at::Tensor& dst, ir::Value value) {
      Assign(dst, skippable ? b.Select(skip, ValAs(dst, t), value) : value);
    };
    // the gradient: unscaled (written back, in its own dtype) and negated for maximize
    ir::Value g = ValAs(grads[i], t);
    if (scaled) {
      ir::Value unscaled = b.Convert(bin(ir::Op::Div, g, Broadcast1(d, *grad_scale, t, shape, op)),
                                     ToIr(grads[i].scalar_type()));
      if (skippable) unscaled = b.Select(skip, Val(grads[i]), unscaled);
      Assign(grads[i], unscaled);
      g = b.Convert(unscaled, ToIr(t));
    }
    if (maximize) g = b.Unary(ir::Op::Neg, g);
    // The learning rate's products (the decoupled decay's factor 1 - lr *
    // weight_decay, and below the step size) in double, as the CPU's kernel
    // computes them from its double arguments; in float32 where the device
    // has float64 slow or not at all (GPUs, TPUs), as ops_math.cc's Compute.
    const auto f64 = b.cpu_backend() ? at::kDouble : at::kFloat;
    ir::Value lr64;
    if constexpr (kTensorLr) {
      lr64 = Broadcast1(d, lr, f64, {}, op);
    } else {
      lr64 = scalar("lr", LrValue(lr), f64);
    }
    ir::Value param = ValAs(p, t);
    if (weight_decay != 0) {
      if (kDecoupled) {
        ir::Value decay = bin(ir::Op::Sub, scalar("1", 1, f64), bin(ir::Op::Mul, lr64, scalar("weight_decay", weight_decay, f64)));
        param = bin(ir::Op::Mul, param, BroadcastTo(d, b.Convert(decay, ToIr(t)), shape));
      } else {
        g = bin(ir::Op::Add, g, bin(ir::Op::Mul, param, num("weight_decay", weight_decay)));
      }
    }
    // m as the CPU's kernel: exp_avg.lerp(g, 1 - beta1), the form picked by
    // the weight (bit-equal there; after an infinite gradient the next finite
    // one makes it NaN, as there, where m * beta1 + g * (1 - beta1) stayed inf)
    const double w1 = 1 - beta1;
    ir::Value m0 = ValAs(exp_avgs[i], t), w = num("1 - beta1", w1), diff = bin(ir::Op::Sub, g, m0);
    ir::Value m = std::abs(w1) < 0.5 ? bin(ir::Op::Add, m0, bin(ir::Op::Mul, w, diff))
                                     : bin(ir::Op::Sub, g, bin(ir::Op::Mul, diff, bin(ir::Op::Sub, num("1", 1), w)));
    ir::Value v = bin(ir::Op::Add, bin(ir::Op::Mul, ValAs(exp_avg_sqs[i], t), num("beta2", beta2)),
                      bin(ir::Op::Mul, bin(ir::Op::Mul, g, g), num("1 - beta2", 1 - beta2)));
    // The bias corrections and the step size in double, from the step's
    // value, as the CPU's fused kernel (and the unfused step) computes them:
    // in float32, 1 - 0.9999f ** step was off by up to 8e-4 of the update.
    ir::Value step = Broadcast1(d, state_steps[i], f64, {}, op);
    ir::Value bias1 = bin(ir::Op::Sub, scalar("1", 1, f64), bin(ir::Op::Pow, scalar("beta1", beta1, f64), step));
    ir::Value bias2_sqrt = b.Unary(
        ir::Op::Sqrt, bin(ir::Op::Sub, scalar("1", 1, f64), bin(ir::Op::Pow, scalar("beta2", beta2, f64), step)));
    ir::Value step_size = BroadcastTo(d, b.Convert(bin(ir::Op::Div, lr64, bias1), ToIr(t)), shape);
    bias2_sqrt = BroadcastTo(d, b.Convert(bias2_sqrt, ToIr(t)), shape);
    ir::Value second = v;
    if (amsgrad) {
      TORCH_CHECK(max_exp_avg_sqs[i].sizes() == p.sizes(), op, ": every state tensor must have its parameter's shape");
      second = MaxMinNan(d, ir::Op::Max, ValAs(max_exp_avg_sqs[i], t), v);
      update(max_exp_avg_sqs[i], second);
    }
    ir::Value denom = bin(ir::Op::Add, bin(ir::Op::Div, b.Unary(ir::Op::Sqrt, second), bias2_sqrt), num("eps", eps));
    ir::Value delta = bin(ir::Op::Div, bin(ir::Op::Mul, step_size, m), denom);
    update(p, bin(ir::Op::Sub, param, delta));
    update(exp_avgs[i], m);
    update(exp_avg_sqs[i], v);
  }
}

// SGD: weight decay, then momentum (the first step's buffer is the gradient
// itself), Nesterov's look-ahead, then p -= lr * update.
template <typename LR>
void FusedSgd(at::TensorList params, at::TensorList grads, at::TensorList bufs, double weight_decay, double momentum,
              LR lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
              const OptTensor& grad_scale, const OptTensor& found_inf) {
  const size_t n = params.size();
  CheckLists(n, {grads.size()}, "_fused_sgd_");
  if (momentum != 0) CheckLists(n, {bufs.size()}, "_fused_sgd_");
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    const at::ScalarType t = OpMath(p.scalar_type());
    const at::Tensor param = p.to(t);
    at::Tensor g = DecayedGrad(grads[i], param, weight_decay, maximize, grad_scale, found_inf);
    if (momentum != 0) {
      const at::Tensor buf = is_first_step ? g : bufs[i].to(t) * momentum + g * (1 - dampening);
      Update(bufs[i], buf, found_inf);
      g = nesterov ? g + buf * momentum : buf;
    }
    Update(p, param - lr * g, found_inf);
  }
}

// _fused_adagrad_ with the math of PyTorch's fused kernel: the gradient
// unscaled, negated for maximize, with weight decay; state_sum += g^2 and
// p -= clr * g / (sqrt(state_sum) + eps), clr = lr / (1 + (step - 1) *
// lr_decay), the step (already counted by the caller) read on the device.
template <typename LR>
void FusedAdagrad(at::TensorList params, at::TensorList grads, at::TensorList state_sums, at::TensorList state_steps,
                  LR lr, double lr_decay, double weight_decay, double eps, bool maximize, const OptTensor& grad_scale,
                  const OptTensor& found_inf) {
  const size_t n = params.size();
  CheckLists(n, {grads.size(), state_sums.size(), state_steps.size()}, "_fused_adagrad_");
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    const at::ScalarType t = OpMath(p.scalar_type());
    const at::Tensor param = p.to(t);
    const at::Tensor g = DecayedGrad(grads[i], param, weight_decay, maximize, grad_scale, found_inf);
    const at::Tensor clr = lr / ((state_steps[i].to(t) - 1) * lr_decay + 1);
    const at::Tensor sum = state_sums[i].to(t) + g * g;
    Update(state_sums[i], sum, found_inf);
    Update(p, param - clr * g / (sum.sqrt() + eps), found_inf);
  }
}

}  // namespace
}  // namespace tpj::aten

// (a template-id's comma would split a macro argument, so no K() here)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using tpj::aten::FusedAdagrad;
  using tpj::aten::FusedAdam;
  using tpj::aten::FusedSgd;
  m.impl("_fused_adam_", TORCH_FN((FusedAdam<false, double>)));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN((FusedAdam<false, const at::Tensor&>)));
  m.impl("_fused_adamw_", TORCH_FN((FusedAdam<true, double>)));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN((FusedAdam<true, const at::Tensor&>)));
  m.impl("_fused_sgd_", TORCH_FN((FusedSgd<double>)));
  m.impl("_fused_sgd_.tensor_lr", TORCH_FN((FusedSgd<const at::Tensor&>)));
  m.impl("_fused_adagrad_", TORCH_FN((FusedAdagrad<double>)));
  m.impl("_fused_adagrad_.tensor_lr", TORCH_FN((FusedAdagrad<const at::Tensor&>)));
}
