// nn.EmbeddingBag (_embedding_bag and its backwards). Bags have variable
// length but every shape is static: each index position gets its bag id on
// the device (a scan over marks scattered at the offsets), sums and means are
// scatter-adds by bag id, and max is a segmented log-step scan whose value at
// the last position of each bag is that bag's max (with the position that
// held it, for max_indices). Everything is linear in indices * dim (times
// log(indices) for max).
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;

constexpr int64_t kSum = 0, kMean = 1, kMax = 2;

// x shifted by k along dim 0 (x[i - k] at i), `fill` where i < k.
ir::Value ShiftDown(ir::Builder& b, ir::Value x, int64_t k, ir::Value fill) {
  const auto dims = b.shape(x).dims;
  const size_t r = dims.size();
  std::vector<int64_t> low(r, 0), high(r, 0), zero(r, 0), start(r, 0), one(r, 1);
  low[0] = k;
  return b.Slice(b.Pad(x, fill, low, high, zero), start, dims, one);
}

// Inclusive prefix sum of a 1-D i64 value (log-step scan: no quadratic window).
ir::Value PrefixSum(ir::Builder& b, ir::Value x) {
  const int64_t n = b.shape(x).dims[0];
  ir::Value zero = b.ScalarConstant(ir::DType::I64, 0);
  for (int64_t k = 1; k < n; k *= 2) x = b.Binary(Op::Add, x, ShiftDown(b, x, k, zero));
  return x;
}

// rows[i] = x[idx[i]] for x [R, D] and idx [K] (i64, in range).
ir::Value GatherRows(ir::Builder& b, ir::Value x, ir::Value idx) {
  const auto xd = b.shape(x).dims;
  const int64_t k = b.shape(idx).dims[0];
  // no rows to take (a 0-row weight; any index is out of range, which the
  // index check raises): zeros, as the CPU's empty bags
  if (xd[0] == 0) return b.Full(b.shape(x).dtype, {k, xd[1]}, 0);
  ir::GatherDims g;
  g.offset_dims = {1};
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = 1;
  return b.Gather(x, b.Reshape(idx, {k, 1}), g, {1, xd[1]});
}

// into[idx[i]] += rows[i] for into [R, D], idx [K], rows [K, D].
ir::Value ScatterAddRows(ir::Builder& b, ir::Value into, ir::Value idx, ir::Value rows) {
  const int64_t k = b.shape(idx).dims[0];
  ir::ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  return b.Scatter(into, b.Reshape(idx, {k, 1}), rows, s, false);
}

// A 1-D index tensor as checked i64 values.
ir::Value Indices(int d, const at::Tensor& t, int64_t size, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, "embedding_bag: expected ", what,
              " to be int32 or int64, got ", t.scalar_type());
  return CheckedIndex(d, Operand(t, d, t.scalar_type()), size, false, "embedding_bag", runtime::ErrorKind::kValue);
}

// The bag of each of the n index positions: the number of the first `bags`
// offsets at or before it, minus one. Checks what the CPU checks: offsets
// start at 0, never decrease, and stay within the indices.
ir::Value BagIds(int d, const at::Tensor& offsets, int64_t bags, int64_t n) {
  ir::Builder& b = B(d);
  TORCH_CHECK(offsets.dim() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension ", offsets.dim());
  TORCH_CHECK(offsets.scalar_type() == at::kLong || offsets.scalar_type() == at::kInt,
              "embedding_bag: expected offsets to be int32 or int64, got ", offsets.scalar_type());
  ir::Value off = b.Convert(Operand(offsets, d, offsets.scalar_type()), ir::DType::I64);
  const int64_t m = offsets.size(0);
  if (m > 0) {
    ir::Value first = b.Slice(off, {0}, {1}, {1});
    CheckNone(d, b.Compare(CompareDir::NE, first, I64(b, {1}, 0)), runtime::ErrorKind::kValue,
              "embedding_bag: offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
              "position 0. However, got a nonzero offsets[0]");
    if (m > 1) {
      ir::Value lo = b.Slice(off, {0}, {m - 1}, {1}), hi = b.Slice(off, {1}, {m}, {1});
      CheckNone(d, b.Compare(CompareDir::GT, lo, hi), runtime::ErrorKind::kValue,
                "embedding_bag: offsets must be non-decreasing");
    }
    CheckNone(d, b.Compare(CompareDir::GT, off, I64(b, {m}, n)), runtime::ErrorKind::kValue,
              "embedding_bag: an offset is larger than the number of indices " + std::to_string(n));
  }
  if (n == 0) return b.Full(ir::DType::I64, {0}, 0);
  ir::Value starts = b.Clamp(I64(b, {}, 0), b.Slice(off, {0}, {bags}, {1}), I64(b, {}, n));
  ir::Value marks = ScatterAddRows(b, I64(b, {n + 1, 1}, 0), starts, I64(b, {bags, 1}, 1));
  ir::Value cum = PrefixSum(b, b.Reshape(b.Slice(marks, {0, 0}, {n, 1}, {1, 1}), {n}));
  return b.Binary(Op::Sub, cum, I64(b, {n}, 1));
}

// True where the index is not padding_idx.
ir::Value Kept(ir::Builder& b, ir::Value idx, int64_t padding_idx) {
  const auto dims = b.shape(idx).dims;
  if (padding_idx < 0) return b.Full(ir::DType::Bool, dims, 1);
  return b.Compare(CompareDir::NE, idx, I64(b, dims, padding_idx));
}

// Non-padding entries per bag, i64 [bags].
ir::Value BagSizes(ir::Builder& b, ir::Value bag, ir::Value kept, int64_t bags) {
  const int64_t n = b.shape(bag).dims[0];
  ir::Value ones = b.Reshape(b.Convert(kept, ir::DType::I64), {n, 1});
  return b.Reshape(ScatterAddRows(b, I64(b, {bags, 1}, 0), bag, ones), {bags});
}

// [n] -> [n, dim] along rows.
ir::Value Rows(ir::Builder& b, ir::Value v, int64_t dim) {
  const int64_t n = b.shape(v).dims[0];
  return b.BroadcastInDim(v, {n, dim}, {0});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  TORCH_CHECK(weight.dim() == 2, "weight has to be a 2D Tensor, but got Tensor of dimension ", weight.dim());
  TORCH_CHECK(indices.dim() == 1, "input has to be a 1D or 2D Tensor, but got Tensor of dimension ", indices.dim());
  TORCH_CHECK(mode == kSum || mode == kMean || mode == kMax, "embedding_bag: unknown mode ", mode);
  TORCH_CHECK(at::isFloatingType(weight.scalar_type()), "embedding_bag on pjrt expects a floating weight, got ",
              weight.scalar_type());
  const bool psw = per_sample_weights && per_sample_weights->defined();
  TORCH_CHECK(!psw || mode == kSum, "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
              "supported for mode='sum' (got mode='", mode == kMean ? "mean" : "max", "'). Please open a feature "
              "request on GitHub.");
  TORCH_CHECK(!psw || per_sample_weights->sizes() == indices.sizes(), "embedding_bag: expected per_sample_weights to "
              "be 1D with the same number of elements as input, got ", per_sample_weights->sizes());
  TORCH_CHECK(!psw || per_sample_weights->scalar_type() == weight.scalar_type(), "embedding_bag: expected "
              "per_sample_weights to have the weight's dtype ", weight.scalar_type(), ", got ",
              per_sample_weights->scalar_type());
  const int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  TORCH_CHECK(bags >= 0, "include_last_offset: number of offsets should be at least 1");
  (void)sparse;
  (void)scale_grad_by_freq;
  TraceScope s;
  const int d = CommonDevice({&weight, &indices, &offsets});
  ir::Builder& b = B(d);
  const at::ScalarType t = weight.scalar_type();
  const ir::DType it = ToIr(indices.scalar_type());
  const int64_t n = indices.size(0), dim = weight.size(1);
  ir::Value idx = Indices(d, indices, weight.size(0), "indices");
  ir::Value bag = BagIds(d, offsets, bags, n);
  ir::Value kept = Kept(b, idx, padding_idx);
  ir::Value sizes = BagSizes(b, bag, kept, bags);
  ir::Value rows = GatherRows(b, Val(weight), idx);
  ir::Value zero_rows = Fill(d, 0, t, {n, dim});
  rows = b.Select(Rows(b, kept, dim), rows, zero_rows);
  ir::Value out, max_idx;
  if (mode != kMax) {
    const at::ScalarType acc = OpMath(t);  // the CPU sums float16/bfloat16 bags in float, rounded once
    ir::Value r = b.Convert(rows, ToIr(acc));
    if (psw) r = b.Binary(Op::Mul, r, Rows(b, ValAs(*per_sample_weights, acc), dim));
    out = ScatterAddRows(b, Fill(d, 0, acc, {bags, dim}), bag, r);
    if (mode == kMean) {
      ir::Value denom = b.Convert(b.Binary(Op::Max, sizes, I64(b, {bags}, 1)), ToIr(acc));
      out = b.Binary(Op::Div, out, Rows(b, denom, dim));
    }
    out = b.Convert(out, ToIr(t));
  } else if (n == 0) {
    out = Fill(d, 0, t, {bags, dim});
    max_idx = b.Full(it, {bags, dim}, 0);
  } else {
    // Segmented scan of (value, position): ties keep the earlier position,
    // as the CPU's strict > does; padding never wins over a kept entry.
    ir::Value val = b.Select(Rows(b, kept, dim), rows, BroadcastTo(d, ExtremeConst(d, t, true), {n, dim}));
    ir::Value pos = b.Iota({ir::DType::I64, {n, dim}}, 0);
    ir::Value bag2 = Rows(b, bag, dim);
    ir::Value neg_inf = ExtremeConst(d, t, true);
    ir::Value minus_one = b.ScalarConstant(ir::DType::I64, -1);
    for (int64_t k = 1; k < n; k *= 2) {
      ir::Value pv = ShiftDown(b, val, k, neg_inf), pp = ShiftDown(b, pos, k, minus_one);
      ir::Value same = b.Compare(CompareDir::EQ, ShiftDown(b, bag2, k, minus_one), bag2);
      ir::Value take = b.Binary(Op::And, same, b.Binary(Op::Or, b.Compare(CompareDir::GE, pv, val),
                                                        b.Binary(Op::And, IsNan(d, pv), b.Unary(Op::Not, IsNan(d, val)))));
      val = b.Select(take, pv, val);
      pos = b.Select(take, pp, pos);
    }
    // The last position of bag j is the start of bag j+1 minus one (the
    // indices' end for the last bag, as the CPU ignores a final offset).
    ir::Value off = b.Convert(Operand(offsets, d, offsets.scalar_type()), ir::DType::I64);
    ir::Value ends = b.Concatenate({b.Slice(off, {1}, {std::max<int64_t>(bags, 1)}, {1}), I64(b, {1}, n)}, 0);
    ends = b.Slice(ends, {0}, {bags}, {1});
    ir::Value last = b.Clamp(I64(b, {}, 0), b.Binary(Op::Sub, ends, I64(b, {bags}, 1)), I64(b, {}, n - 1));
    ir::Value filled = b.Compare(CompareDir::GT, Rows(b, sizes, dim), I64(b, {bags, dim}, 0));
    out = b.Select(filled, GatherRows(b, val, last), Fill(d, 0, t, {bags, dim}));
    ir::Value at_pos = GatherRows(b, pos, last);  // [bags, dim] positions
    ir::GatherDims g;
    g.collapsed_slice_dims = {0};
    g.start_index_map = {0};
    g.index_vector_dim = 2;
    ir::Value safe = b.Clamp(I64(b, {}, 0), at_pos, I64(b, {}, n - 1));
    ir::Value which = b.Gather(idx, b.Reshape(safe, {bags, dim, 1}), g, {1});
    max_idx = b.Convert(b.Select(filled, which, I64(b, {bags, dim}, 0)), it);
  }
  // The auxiliary outputs in the shapes of torch's meta kernel for any
  // device but the CPU (CUDA's): offset2bag per index, bag_size per offset
  // (0 for a last offset that ends the final bag), max_indices [bags, dim]
  // in max mode, empty otherwise. A compiled graph is traced with those
  // shapes and runs these kernels: with the CPU's shapes (offset2bag empty
  // for plain sums, max_indices = bag_size), vmap's per-sample gradients
  // through a bag failed under torch.compile.
  ir::Value bag_size = b.Convert(sizes, it);
  if (include_last_offset) bag_size = b.Concatenate({bag_size, b.Full(it, {1}, 0)}, 0);
  ir::Value offset2bag = b.Convert(bag, it);
  if (mode != kMax) max_idx = b.Full(it, {0}, 0);
  return {Wrap(out, d), Wrap(offset2bag, d), Wrap(bag_size, d), Wrap(max_idx, d)};
}

// The weight gradient given each position's bag.
at::Tensor DenseBackward(int d, const at::Tensor& grad, const at::Tensor& indices, ir::Value bag,
                         const at::Tensor& bag_size, const at::Tensor& max_indices, int64_t num_weights,
                         bool scale_grad_by_freq, int64_t mode, const std::optional<at::Tensor>& per_sample_weights,
                         int64_t padding_idx) {
  ir::Builder& b = B(d);
  const at::ScalarType t = grad.scalar_type();
  const int64_t bags = grad.size(0), dim = grad.size(1), n = indices.size(0);
  ir::Value zero = Fill(d, 0, t, {num_weights, dim});
  if (mode == kMax) {
    TORCH_CHECK(max_indices.dim() == 2 && max_indices.size(0) == bags,
                "embedding_bag backward: max_indices must be [bags, dim] in max mode, got ", max_indices.sizes());
    ir::Value which = CheckedIndex(d, b.Reshape(Val(max_indices), {bags * dim}), num_weights, false, "embedding_bag", runtime::ErrorKind::kValue);
    which = b.Reshape(which, {bags, dim, 1});
    ir::Value col = b.Iota({ir::DType::I64, {bags, dim, 1}}, 1);
    ir::Value per_bag = b.Slice(b.Convert(Val(bag_size), ir::DType::I64), {0}, {bags}, {1});  // (one per offset)
    ir::Value filled = b.Compare(CompareDir::GT, Rows(b, per_bag, dim), I64(b, {bags, dim}, 0));
    ir::Value g = b.Select(filled, Val(grad), Fill(d, 0, t, {bags, dim}));
    ir::ScatterDims s;
    s.inserted_window_dims = {0, 1};
    s.scatter_dims_to_operand_dims = {0, 1};
    s.index_vector_dim = 2;
    return Wrap(b.Scatter(zero, b.Concatenate({which, col}, 2), g, s, false), d);
  }
  if (n == 0) return Wrap(zero, d);
  ir::Value idx = Indices(d, indices, num_weights, "indices");
  ir::Value g = GatherRows(b, Val(grad), b.Clamp(I64(b, {}, 0), bag, I64(b, {}, bags - 1)));
  ir::Value scale = b.Convert(Kept(b, idx, padding_idx), ToIr(t));
  if (per_sample_weights && per_sample_weights->defined()) {
    scale = b.Binary(Op::Mul, scale, ValAs(*per_sample_weights, t));
  }
  if (mode == kMean) {
    ir::Value sizes = b.Convert(Val(bag_size), ir::DType::I64);
    ir::Value per = b.Gather(sizes, b.Reshape(b.Clamp(I64(b, {}, 0), bag, I64(b, {}, bags - 1)), {n, 1}),
                             ir::GatherDims{{}, {0}, {0}, 1}, {1});
    per = b.Convert(b.Binary(Op::Max, per, I64(b, {n}, 1)), ToIr(t));
    scale = b.Binary(Op::Div, scale, per);
  }
  if (scale_grad_by_freq) {
    ir::Value counts = ScatterAddRows(b, I64(b, {num_weights, 1}, 0), idx, I64(b, {n, 1}, 1));
    ir::Value per = b.Reshape(GatherRows(b, counts, idx), {n});
    scale = b.Binary(Op::Div, scale, b.Convert(per, ToIr(t)));
  }
  g = b.Binary(Op::Mul, g, Rows(b, scale, dim));
  return Wrap(ScatterAddRows(b, zero, idx, g), d);
}

at::Tensor embedding_bag_backward(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offsets,
                                  const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                  const at::Tensor& maximum_indices, c10::SymInt num_weights, bool scale_grad_by_freq,
                                  int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights,
                                  int64_t padding_idx) {
  TORCH_CHECK(!sparse, "embedding_bag with sparse=True has no sparse gradients on pjrt; use sparse=False (dense "
              "gradients) or run the bag on the CPU");
  (void)offset2bag;
  TraceScope s;
  const int d = CommonDevice({&grad, &indices, &offsets});
  ir::Value bag = mode == kMax ? ir::Value{} : BagIds(d, offsets, grad.size(0), indices.size(0));
  return DenseBackward(d, grad, indices, bag, bag_size, maximum_indices, num_weights.guard_int(__FILE__, __LINE__),
                       scale_grad_by_freq, mode, per_sample_weights, padding_idx);
}

at::Tensor embedding_bag_dense_backward(const at::Tensor& grad, const at::Tensor& indices,
                                        const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                        const at::Tensor& maximum_indices, c10::SymInt num_weights,
                                        bool scale_grad_by_freq, int64_t mode,
                                        const std::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  TraceScope s;
  const int d = CommonDevice({&grad, &indices});
  ir::Value bag;
  if (mode != kMax) {
    TORCH_CHECK(offset2bag.numel() == indices.numel(), "_embedding_bag_dense_backward on pjrt needs offset2bag for "
                "every index (got ", offset2bag.numel(), " for ", indices.numel(), "); call _embedding_bag_backward "
                "with the offsets instead");
    bag = B(d).Convert(Val(offset2bag), ir::DType::I64);
  }
  return DenseBackward(d, grad, indices, bag, bag_size, maximum_indices, num_weights.guard_int(__FILE__, __LINE__),
                       scale_grad_by_freq, mode, per_sample_weights, padding_idx);
}

at::Tensor embedding_bag_per_sample_weights_backward(const at::Tensor& grad, const at::Tensor& weight,
                                                     const at::Tensor& indices, const at::Tensor& offsets,
                                                     const at::Tensor& offset2bag, int64_t mode, int64_t padding_idx) {
  TORCH_CHECK(mode == kSum, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  (void)offset2bag;
  TraceScope s;
  const int d = CommonDevice({&grad, &weight, &indices, &offsets});
  ir::Builder& b = B(d);
  const at::ScalarType t = grad.scalar_type();
  const int64_t bags = grad.size(0), n = indices.size(0);
  if (n == 0) return Wrap(Fill(d, 0, t, {0}), d);
  ir::Value idx = Indices(d, indices, weight.size(0), "indices");
  ir::Value bag = BagIds(d, offsets, bags, n);
  ir::Value g = GatherRows(b, Val(grad), b.Clamp(I64(b, {}, 0), bag, I64(b, {}, bags - 1)));
  ir::Value w = GatherRows(b, ValAs(weight, t), idx);
  ir::Value dot = b.Reduce(b.Binary(Op::Mul, g, w), b.ScalarConstant(ToIr(t), 0), {1}, ir::ReduceKind::Sum);
  return Wrap(b.Select(Kept(b, idx, padding_idx), dot, Fill(d, 0, t, {n})), d);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_forward_only(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  return embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                       include_last_offset, padding_idx);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("_embedding_bag", embedding_bag);
  K("_embedding_bag_forward_only", embedding_bag_forward_only);
  K("_embedding_bag_backward", embedding_bag_backward);
  K("_embedding_bag_dense_backward", embedding_bag_dense_backward);
  K("_embedding_bag_per_sample_weights_backward", embedding_bag_per_sample_weights_backward);
}
