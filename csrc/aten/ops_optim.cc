// The fused optimizer steps (torch.optim.Adam/AdamW/SGD(fused=True)), composed
// from lowered ops with the math of PyTorch's fused kernels, so that they
// trace into the step's program like the foreach path instead of running on
// the CPU. The bias corrections take the step count as a tensor (the CPU
// kernel reads it to the host: a sync per step here). With a GradScaler's
// grad_scale the gradients are unscaled in place, as the fused kernels
// write them back; with found_inf every update is a select that keeps the
// old values when it is set, instead of a host-side skip.
#include <ATen/OpMathType.h>

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

// _fused_adam_ (kDecoupled false) and _fused_adamw_, each with lr a number
// (LR double) or a tensor (LR const at::Tensor&): one kernel per overload.
template <bool kDecoupled, typename LR>
void FusedAdam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               at::TensorList max_exp_avg_sqs, at::TensorList state_steps, LR lr, double beta1, double beta2,
               double weight_decay, double eps, bool amsgrad, bool maximize, const OptTensor& grad_scale,
               const OptTensor& found_inf) {
  const char* op = kDecoupled ? "_fused_adamw_" : "_fused_adam_";
  const size_t n = params.size();
  CheckLists(n, {grads.size(), exp_avgs.size(), exp_avg_sqs.size(), state_steps.size()}, op);
  if (amsgrad) CheckLists(n, {max_exp_avg_sqs.size()}, op);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    const at::ScalarType t = at::toOpMathType(p.scalar_type());  // half types update in float
    at::Tensor g = StepGrad(grads[i], maximize, grad_scale, found_inf).to(t);
    at::Tensor param = p.to(t);
    if (weight_decay != 0) {
      if (kDecoupled) param = param * (1 - lr * weight_decay);
      else g = g + param * weight_decay;
    }
    const at::Tensor m = exp_avgs[i].to(t) * beta1 + g * (1 - beta1);
    const at::Tensor v = exp_avg_sqs[i].to(t) * beta2 + g * g * (1 - beta2);
    const at::Tensor step = state_steps[i].to(t);
    const at::Tensor bias1 = 1 - at::pow(beta1, step);
    const at::Tensor bias2_sqrt = (1 - at::pow(beta2, step)).sqrt();
    at::Tensor second = v;
    if (amsgrad) {
      second = at::maximum(max_exp_avg_sqs[i].to(t), v);
      Update(max_exp_avg_sqs[i], second, found_inf);
    }
    const at::Tensor denom = second.sqrt() / bias2_sqrt + eps;
    Update(p, param - (lr / bias1) * m / denom, found_inf);
    Update(exp_avgs[i], m, found_inf);
    Update(exp_avg_sqs[i], v, found_inf);
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
    const at::ScalarType t = at::toOpMathType(p.scalar_type());
    at::Tensor g = StepGrad(grads[i], maximize, grad_scale, found_inf).to(t);
    const at::Tensor param = p.to(t);
    if (weight_decay != 0) g = g + param * weight_decay;
    if (momentum != 0) {
      const at::Tensor buf = is_first_step ? g : bufs[i].to(t) * momentum + g * (1 - dampening);
      Update(bufs[i], buf, found_inf);
      g = nesterov ? g + buf * momentum : buf;
    }
    Update(p, param - lr * g, found_inf);
  }
}

}  // namespace
}  // namespace tpj::aten

// (a template-id's comma would split a macro argument, so no K() here)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using tpj::aten::FusedAdam;
  using tpj::aten::FusedSgd;
  m.impl("_fused_adam_", TORCH_FN((FusedAdam<false, double>)));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN((FusedAdam<false, const at::Tensor&>)));
  m.impl("_fused_adamw_", TORCH_FN((FusedAdam<true, double>)));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN((FusedAdam<true, const at::Tensor&>)));
  m.impl("_fused_sgd_", TORCH_FN((FusedSgd<double>)));
  m.impl("_fused_sgd_.tensor_lr", TORCH_FN((FusedSgd<const at::Tensor&>)));
}
