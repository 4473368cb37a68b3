// Memory formats of op results. PyTorch keeps a channels_last (or otherwise
// permuted) input's layout through its ops: an elementwise result is laid
// out as TensorIterator lays it out (its operands' common layout, or its
// dimensions ordered by the operands' strides), and convolutions, batch
// norm, pooling and upsampling lay their results out in the input's
// suggested memory format. The lowerings compute values and return
// row-major tensors; registering a kernel through Laid<> lays its fresh
// results out as PyTorch would (docs/semantics.md). Inputs that are all
// row-major, the common case, cost a flag test and a look at their size-1
// dimensions each.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <type_traits>

namespace tpj::aten {

// `r` (a fresh row-major result nobody else holds) laid out in format `f`,
// or with `like`'s strides (same sizes, non-overlapping and dense); its
// value is unchanged. Anything else is left as it is.
void RelayoutTo(const at::Tensor& r, at::MemoryFormat f);
// Whether contiguous `t` has strides other than the row-major ones in
// size-1 dimensions (x[:1].t(), a transpose with a size-1 dimension).
bool HasOtherUnitStrides(const at::Tensor& t);
// `r` (as for RelayoutTo) laid out as TensorIterator lays out an elementwise
// result of `operands` (`n` of them, broadcast to r's shape): the operands'
// layout when all have r's shape and one layout (contiguous, channels_last,
// or the same dense strides), else r's dimensions ordered by the operands'
// strides, the first operand that orders a pair of dimensions deciding.
// `number`: one more operand, a 0-d number (never of r's shape).
void RelayoutAsTensorIterator(const at::Tensor& r, const at::Tensor* const* operands, size_t n, bool number);

enum class LayoutRule {
  kOperands,  // elementwise: TensorIterator's rule over every tensor operand
  kOperandsAndNumber,  // the same, with a number operand (add.Scalar, gt.Scalar: a 0-d operand to TensorIterator)
  kInput,     // conv, norm, pool, upsample: the first two tensor arguments' suggested format
};

namespace layout_detail {

template <class T>
const at::Tensor* TensorArg(const T& a) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return a.defined() ? &a : nullptr;
  } else {
    return nullptr;
  }
}

template <class F>
void ForEachResult(const at::Tensor& r, F&& f) {
  f(r);
}
template <class... T, class F>
void ForEachResult(const std::tuple<T...>& r, F&& f) {
  std::apply([&](const auto&... x) { (ForEachResult(x, f), ...); }, r);
}
template <class T, class F>
void ForEachResult(const T&, F&&) {}

template <class... A>
void Apply(LayoutRule rule, const at::Tensor& out, const A&... args) {
  if (!out.defined()) return;
  bool alias = false;  // a kernel that hands back (a view of) an argument: not a fresh result
  auto check = [&](const at::Tensor* t) { alias = alias || (t && out.is_alias_of(*t)); };
  if (rule == LayoutRule::kOperands || rule == LayoutRule::kOperandsAndNumber) {
    const at::Tensor* operands[] = {TensorArg(args)..., nullptr};
    bool plain = true;  // every operand row-major: so is the result (the common case)
    for (const at::Tensor* t : operands) plain = plain && (!t || (t->is_contiguous() && !HasOtherUnitStrides(*t)));
    if (plain) return;
    (check(TensorArg(args)), ...);
    const bool number = rule == LayoutRule::kOperandsAndNumber && (std::is_same_v<std::decay_t<A>, at::Scalar> || ...);
    if (!alias) RelayoutAsTensorIterator(out, operands, sizeof...(A), number);
    return;
  }
  const at::Tensor* pick = nullptr;
  int seen = 0;
  auto consider = [&](const at::Tensor* t) {
    if (!t || pick) return;
    if (seen++ < 2 && t->dim() == out.dim() && !t->is_contiguous() &&
        t->suggest_memory_format() != at::MemoryFormat::Contiguous) {
      pick = t;
    }
  };
  (consider(TensorArg(args)), ...);
  if (!pick || pick->is_contiguous()) return;
  (check(TensorArg(args)), ...);
  if (!alias) RelayoutTo(out, pick->suggest_memory_format());
}

}  // namespace layout_detail

template <LayoutRule Rule, class Sig, Sig* F>
struct Laid;

template <LayoutRule Rule, class R, class... A, R (*F)(A...)>
struct Laid<Rule, R(A...), F> {
  static_assert(!std::is_reference_v<R>, "in-place and out= kernels keep their output's layout: register them plainly");
  static R Call(A... args) {
    R r = F(args...);
    layout_detail::ForEachResult(r, [&](const at::Tensor& out) { layout_detail::Apply(Rule, out, args...); });
    return r;
  }
};

}  // namespace tpj::aten

// Registers kernel `fn` (in tpj::aten) through Laid<rule>.
#define TPJ_LAID(m, name, rule, fn) \
  (m).impl(name, TORCH_FN((::tpj::aten::Laid<::tpj::aten::LayoutRule::rule, decltype(::tpj::aten::fn), ::tpj::aten::fn>::Call)))
