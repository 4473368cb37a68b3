// The fused inference ops behind nn.MultiheadAttention's and
// nn.TransformerEncoderLayer's fast paths (eval mode, no grad, self-attention),
// which PyTorch takes on every PrivateUse1 device: _native_multi_head_attention
// and _transformer_encoder_layer_fwd, written with the ops they fuse, as the
// CPU kernels compute them. Masks reach them as float masks made from
// boolean ones (-inf where masked), so nonzero means masked; mask_type says
// their shape: 0 (T, S), 1 (B, S) key padding, 2 (B, H, T, S). A query
// whose every key is masked gives NaN, as on the CPU.
#include <cmath>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

std::tuple<at::Tensor, at::Tensor> native_multi_head_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim, int64_t num_head,
    const at::Tensor& qkv_weight, const at::Tensor& qkv_bias, const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& mask, bool need_weights, bool average_attn_weights,
    std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "_native_multi_head_attention expects batched 3-D query, key and value");
  TORCH_CHECK(num_head > 0 && embed_dim % num_head == 0, "embed_dim ", embed_dim, " must be divisible by num_head ",
              num_head);
  const int64_t b = query.size(0), t = query.size(1), s = key.size(1), dh = embed_dim / num_head;
  auto w = qkv_weight.chunk(3, 0);
  auto bias = qkv_bias.chunk(3, 0);
  auto heads = [&](const at::Tensor& x, int64_t len) { return x.view({b, len, num_head, dh}).transpose(1, 2); };
  at::Tensor q = heads(at::linear(query, w[0], bias[0]) / std::sqrt(static_cast<double>(dh)), t);
  at::Tensor k = heads(at::linear(key, w[1], bias[1]), s);
  at::Tensor v = heads(at::linear(value, w[2], bias[2]), s);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));  // [B, H, T, S]
  if (mask && mask->defined()) {
    at::Tensor m = mask->to(at::kBool);
    const int64_t type = mask_type.value_or(-1);
    // the CPU's checks (its masked softmax's)
    if (type == 0) {
      TORCH_CHECK(m.dim() == 2 && m.size(0) == t && m.size(1) == s, "For mask_type == 0 mask shape should be (L, L)");
      m = m.view({1, 1, t, s});
    } else if (type == 1) {
      TORCH_CHECK(m.dim() == 2 && m.size(0) == b && m.size(1) == s, "For mask_type == 1 mask shape should be (B, L)");
      m = m.view({b, 1, 1, s});
    } else if (type == 2) {
      TORCH_CHECK(m.sizes() == scores.sizes(), "For mask_type == 2 mask shape should match input shape");
    }
    scores = at::where(m, at::full({}, -INFINITY, scores.options()), scores);
  }
  at::Tensor p = at::softmax(scores, -1);
  at::Tensor ctx = at::matmul(p, v).transpose(1, 2).reshape({b, t, embed_dim});
  at::Tensor out = at::linear(ctx, proj_weight, proj_bias);
  if (!need_weights) return {out, at::Tensor()};
  return {out, average_attn_weights ? p.sum(1) / num_head : p};
}

at::Tensor transformer_encoder_layer_fwd(
    const at::Tensor& src, int64_t embed_dim, int64_t num_heads, const at::Tensor& qkv_weight,
    const at::Tensor& qkv_bias, const at::Tensor& proj_weight, const at::Tensor& proj_bias, bool use_gelu,
    bool norm_first, double eps, const at::Tensor& norm_weight_1, const at::Tensor& norm_bias_1,
    const at::Tensor& norm_weight_2, const at::Tensor& norm_bias_2, const at::Tensor& ffn_weight_1,
    const at::Tensor& ffn_bias_1, const at::Tensor& ffn_weight_2, const at::Tensor& ffn_bias_2,
    const std::optional<at::Tensor>& mask, std::optional<int64_t> mask_type) {
  auto norm = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
    return at::layer_norm(x, {embed_dim}, w, bias, eps);
  };
  at::Tensor x = norm_first ? norm(src, norm_weight_1, norm_bias_1) : src;
  x = std::get<0>(native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                              proj_bias, mask, false, true, mask_type)) +
      src;
  if (!norm_first) x = norm(x, norm_weight_1, norm_bias_1);
  at::Tensor y = norm_first ? norm(x, norm_weight_2, norm_bias_2) : x;
  y = at::linear(y, ffn_weight_1, ffn_bias_1);
  y = at::linear(use_gelu ? at::gelu(y) : at::relu(y), ffn_weight_2, ffn_bias_2) + x;
  return norm_first ? y : norm(y, norm_weight_2, norm_bias_2);
}

// nn.TransformerEncoder's inference fast path asks this before turning a
// padded batch into a nested tensor. pjrt has no nested tensors, so the answer
// is no: the encoder keeps the dense batch and its padding mask. Unpadded
// positions then agree with the CPU's fast path; padded ones hold computed
// values where that path writes zeros (docs/semantics.md).
bool nested_tensor_from_mask_left_aligned(const at::Tensor&, const at::Tensor&) { return false; }

// The encoder built with mask_check=False skips that question and makes the
// nested tensor at once: refused with what to do instead.
at::Tensor nested_tensor_from_mask(const at::Tensor&, const at::Tensor&, bool) {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "nested tensors are not supported on pjrt: nn.TransformerEncoder's inference fast path "
                              "with mask_check=False makes one from src_key_padding_mask "
                              "(torch._nested_tensor_from_mask). Build the encoder with enable_nested_tensor=False, "
                              "or keep mask_check=True: on pjrt it then runs on the padded batch (docs/semantics.md)");
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_native_multi_head_attention", native_multi_head_attention);
  K("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd);
  K("_nested_tensor_from_mask_left_aligned", nested_tensor_from_mask_left_aligned);
  K("_nested_tensor_from_mask", nested_tensor_from_mask);
}
