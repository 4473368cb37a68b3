// Mixed precision on pjrt: the autocast policy (which ops run in the low
// precision dtype, which in float32) and the two kernels GradScaler calls.
//
// torch registers autocast kernels for CUDA, CPU, XPU, MPS and a few others,
// never for PrivateUse1: without this file the AutocastPrivateUse1 key has no
// kernel at all. We take CUDA's policy, through the op lists torch's
// autocast_mode.h exports for other backends to reuse, so the lists follow
// the installed torch; docs/autocast.md lists them and our few differences
// from CUDA. The casts are ordinary ATen calls on pjrt tensors: they trace
// like any other op, and the low precision dtype reaches StableHLO.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <vector>

#include "aten/lowering.h"

#if !defined(AT_FORALL_LOWER_PRECISION_FP) || !defined(AT_FORALL_FP32) || \
    !defined(AT_FORALL_FP32_SET_OPT_DTYPE) || !defined(AT_FORALL_PROMOTE)
#error "torch-pjrt's autocast policy uses the op lists of ATen/autocast_mode.h (AT_FORALL_*): this torch has none"
#endif

namespace tpj::aten {
namespace {

// --- GradScaler's kernels ---------------------------------------------------
// Lowered here rather than left to the CPU fallback, which would download
// every gradient each step. Semantics as CUDA's (ATen/native/cuda/AmpKernels.cu).

// Multiplies each gradient by inv_scale (in float32 for 16-bit gradients, as
// CUDA's opmath does) and sets found_inf to 1 when any element of any
// gradient is inf or NaN; found_inf is left as it was otherwise. An
// inv_scale of 0 counts as an overflow too: the reciprocal of a scale of
// 2^127 (an init_scale) is subnormal, which XLA flushes to 0, and every
// gradient would silently become 0; the step is skipped instead and the
// scale backs off (AmpUpdateScale keeps it at 2^126 or below).
void AmpNonFiniteCheckAndUnscale(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat, "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
  if (grads.empty()) return;
  TraceScope s;
  const int d = CommonDevice({&found_inf, &inv_scale});
  ir::Builder& b = B(d);
  ir::Value inv = b.Reshape(Val(inv_scale), {});
  ir::Value all_finite = b.Compare(ir::CompareDir::NE, inv, Const(d, 0, at::kFloat));
  for (const at::Tensor& g : grads) {
    TORCH_CHECK(IsPjrt(g) && DeviceIndex(g) == d,
                "_amp_foreach_non_finite_check_and_unscale_: every gradient must be on the device of found_inf (",
                found_inf.device(), "), got one on ", g.device());
    TORCH_CHECK(at::isFloatingType(g.scalar_type()), "_amp_foreach_non_finite_check_and_unscale_: gradients must be "
                "floating point, got ", g.scalar_type());
    if (g.numel() == 0) continue;
    const at::ScalarType t = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const std::vector<int64_t> shape = g.sizes().vec();
    ir::Value x = ValAs(g, t);
    std::vector<int64_t> dims(shape.size());
    for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
    ir::Value finite = b.Reduce(b.IsFinite(x), Const(d, 1, at::kBool), dims, ir::ReduceKind::And);
    all_finite = b.Binary(ir::Op::And, all_finite, finite);
    ir::Value scale = t == at::kFloat ? inv : b.Convert(inv, ToIr(t));
    Assign(g, b.Binary(ir::Op::Mul, x, BroadcastTo(d, scale, shape)));
  }
  ir::Value found = Val(found_inf);
  const std::vector<int64_t> fshape = found_inf.sizes().vec();
  ir::Value keep = BroadcastTo(d, all_finite, fshape);
  Assign(found_inf, b.Select(keep, found, Fill(d, 1, at::kFloat, fshape)));
}

// One step of GradScaler's scale schedule: after an overflow (found_inf != 0)
// the scale backs off and the count of good steps restarts; otherwise the
// count grows, and at growth_interval the scale grows and the count
// restarts. The CPU grows it while it stays finite (to 2^127); here to
// 2^126 at most, whose reciprocal, inv_scale, is still a normal float32
// (see AmpNonFiniteCheckAndUnscale). Gradients unscale to the same values.
at::Tensor& AmpUpdateScale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(growth_tracker.numel() == 1 && growth_tracker.scalar_type() == at::kInt,
              "growth_tracker must be a 1-element int tensor.");
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat, "current_scale must be a 1-element float tensor.");
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat,
              "found_inf must be a 1-element float tensor.");
  TraceScope s;
  const int d = CommonDevice({&scale, &growth_tracker, &found_inf});
  ir::Builder& b = B(d);
  ir::Value cur = b.Reshape(Val(scale), {});
  ir::Value count = b.Reshape(Val(growth_tracker), {});
  ir::Value inf = b.Compare(ir::CompareDir::NE, b.Reshape(Val(found_inf), {}), Const(d, 0, at::kFloat));
  ir::Value next = b.Binary(ir::Op::Add, count, Const(d, 1, at::kInt));
  ir::Value grow = b.Compare(ir::CompareDir::EQ, next, ScalarParam(d, growth_interval, at::kInt));
  ir::Value grown = b.Binary(ir::Op::Mul, cur, ScalarParam(d, growth_factor, at::kFloat));
  ir::Value backed = b.Binary(ir::Op::Mul, cur, ScalarParam(d, backoff_factor, at::kFloat));
  ir::Value normal = b.Compare(ir::CompareDir::LE, grown, Const(d, 0x1p126, at::kFloat));  // (false for inf and NaN)
  ir::Value ok = b.Select(grow, b.Select(normal, grown, cur), cur);
  ir::Value zero = Const(d, 0, at::kInt);
  Assign(scale, b.Reshape(b.Select(inf, backed, ok), scale.sizes().vec()));
  Assign(growth_tracker, b.Reshape(b.Select(inf, zero, b.Select(grow, zero, next)), growth_tracker.sizes().vec()));
  return scale;
}

// --- Precision guards --------------------------------------------------------
// CUDA's batch_norm takes a bfloat16/float16 input (a convolution's output
// under autocast) and accumulates its statistics in float32. Under autocast
// a half input with float32 parameters runs in float32 and returns the
// input's dtype, as CUDA's does (the lowering then computes in float32 too;
// a bfloat16 sum of a few thousand squares lost most of the variance when
// it computed in the input's dtype: max error ~0.9 against ~0.008 on the
// CPU for an 8x8x16x16 input).
at::Tensor BatchNormInFloat(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                            const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
                            bool cudnn_enabled) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  const at::ScalarType t = input.scalar_type();
  // parameters of the input's own dtype (a model.half() under autocast) take
  // no float32 input (mixed dtypes are refused, as the CPU refuses them); the
  // lowering computes a half input's statistics in float32 anyway
  bool half_params = false;
  for (const auto* p : {&weight, &bias, &running_mean, &running_var}) {
    half_params |= p->has_value() && (*p)->defined() && (*p)->scalar_type() == t;
  }
  if ((t != at::kBFloat16 && t != at::kHalf) || half_params) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
  }
  return at::batch_norm(input.to(at::kFloat), weight, bias, running_mean, running_var, training, momentum, eps,
                        cudnn_enabled)
      .to(t);
}

}  // namespace
}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(tpj::aten::AmpNonFiniteCheckAndUnscale));
  m.impl("_amp_update_scale_", TORCH_FN(tpj::aten::AmpUpdateScale));
}

// --- The autocast policy ----------------------------------------------------
// Ops not listed here pass through autocast unchanged (they run in the dtypes
// they are given), as on every other device.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

// The lists name ATen types unqualified (torch expands them inside
// namespace at::autocast): our registration sees them through using-declarations.
namespace tpj::aten::autocast_policy {
#if TPJ_TORCH_VERSION_NUM <= 212  // 2.11 and 2.12 list norm.names_ScalarOpt_dim; 2.13 declares no DimnameList
using at::DimnameList;
#endif
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define TPJ_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPJ_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPJ_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPJ_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define TPJ_AUTOCAST_APPEND_DTYPE(redispatch, name, reg_sig, redispatch_sig, policy) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(redispatch, name, reg_sig, redispatch_sig, policy)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // CUDA's lists, as torch exports them.
  AT_FORALL_LOWER_PRECISION_FP(TPJ_AUTOCAST_LOWER)
  AT_FORALL_FP32(TPJ_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPJ_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(TPJ_AUTOCAST_APPEND_DTYPE)
  AT_FORALL_PROMOTE(TPJ_AUTOCAST_PROMOTE)
  // CUDA registers these outside the shared lists.
  KERNEL_PRIVATEUSEONE(cat, promote)
  KERNEL_PRIVATEUSEONE(stack, promote)
  KERNEL_PRIVATEUSEONE(index_copy, promote)
  // CUDA refuses binary_cross_entropy under autocast (unsafe in float16);
  // in float32 it is safe, so it runs there.
  KERNEL_PRIVATEUSEONE(binary_cross_entropy, fp32)
  m.impl("batch_norm", TORCH_FN(tpj::aten::BatchNormInFloat));
}

}  // namespace tpj::aten::autocast_policy
