// Data movement lowerings: cat, index_select, gather/scatter, advanced
// indexing (index, index_put_), embedding backward and max_norm renorm,
// tril/triu, padding, sort/topk, flip, arange.
#include <algorithm>
#include <functional>
#include <cmath>
#include <numeric>

#include <ATen/AccumulateType.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/RangeUtils.h>
#include <ATen/native/ScatterGatherChecks.h>
#include <ATen/ops/one_hot_native.h>

#include "aten/layout.h"
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::Op;

at::Tensor cat(const at::ITensorListRef& list, int64_t dim) {
  std::vector<at::Tensor> ts(list.begin(), list.end());
  TORCH_CHECK(!ts.empty(), "torch.cat(): expected a non-empty list of Tensors");
  for (size_t i = 0; i < ts.size(); ++i) {
    TORCH_CHECK(ts[i].dim() > 0, "zero-dimensional tensor (at position ", i, ") cannot be concatenated");
  }
  TraceScope s;
  at::ScalarType t = ts[0].scalar_type();
  for (const auto& x : ts) t = at::promoteTypes(t, x.scalar_type());
  // Legacy rule: 1-D empty tensors are skipped.
  std::vector<const at::Tensor*> kept;
  for (const auto& x : ts) {
    if (!(x.dim() == 1 && x.numel() == 0)) kept.push_back(&x);
  }
  int d = -1;
  for (const auto& x : ts) {
    if (IsPjrt(x)) d = d < 0 ? DeviceIndex(x) : d;
  }
  TORCH_CHECK(d >= 0, "torch.cat(): no pjrt tensor among the inputs");
  if (kept.empty()) return Wrap(Fill(d, 0, t, {0}), d);
  const int64_t rank = kept[0]->dim();
  const int64_t w = WrapDim(dim, rank);
  std::vector<ir::Value> vals;
  for (const at::Tensor* x : kept) {
    TORCH_CHECK(x->dim() == rank, "Tensors must have same number of dimensions: got ", rank, " and ", x->dim());
    for (int64_t i = 0; i < rank; ++i) {
      TORCH_CHECK(i == w || x->size(i) == kept[0]->size(i), "Sizes of tensors must match except in dimension ", w,
                  ". Expected size ", kept[0]->size(i), " but got size ", x->size(i), " for tensor number ",
                  &*x - &ts[0], " in the list.");
    }
    vals.push_back(Operand(*x, d, t));
  }
  at::Tensor out = vals.size() == 1 ? Wrap(vals[0], d) : Wrap(B(d).Concatenate(vals, w), d);
  // PyTorch's layout: the inputs' memory format when they all suggest the same one
  const at::MemoryFormat f = kept[0]->suggest_memory_format();
  for (const at::Tensor* x : kept) {
    if (x->suggest_memory_format() != f) return out;
  }
  RelayoutTo(out, f);
  return out;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");  // (an IndexError, as the CPU's)
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32/int64 for index");
  TraceScope s;
  const int d = CommonDevice({&self, &index});
  ir::Builder& b = B(d);
  if (self.dim() == 0) {  // the one element, for the one index 0 (checked)
    TORCH_CHECK(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ", index.numel(),
                " value(s)");
    CheckedIndex(d, Operand(index, d, index.scalar_type()), 1, false, "index_select()");
    return Wrap(Val(self), d);
  }
  const int64_t w = WrapDim(dim, self.dim());
  const int64_t n = index.numel();
  // (a 1-d self: IndexError from CheckedIndex, as the CPU's)
  TORCH_CHECK(n == 0 || self.dim() == 1 || self.size(w) > 0, "index_select(): self indexing axis dim should be positive");
  if (n == 0) {
    std::vector<int64_t> out = self.sizes().vec();
    out[w] = 0;
    return Wrap(Fill(d, 0, self.scalar_type(), out), d);
  }
  ir::Value idx = b.Reshape(CheckedIndex(d, Operand(index, d, index.scalar_type()), self.size(w), false, "index_select()"), {n, 1});
  ir::GatherDims g;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i != w) g.offset_dims.push_back(i);
  }
  g.collapsed_slice_dims = {w};
  g.start_index_map = {w};
  g.index_vector_dim = 1;
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[w] = 1;
  return Wrap(b.Gather(Val(self), idx, g, sizes), d);
}

// Full coordinates for gather/scatter along `dim`: index values at `dim`,
// iota elsewhere; shape [*index.shape, rank].
ir::Value Coordinates(int d, ir::Value idx, const std::vector<int64_t>& ishape, int64_t dim) {
  ir::Builder& b = B(d);
  const int64_t r = static_cast<int64_t>(ishape.size());
  std::vector<int64_t> one = ishape;
  one.push_back(1);
  std::vector<ir::Value> parts;
  for (int64_t k = 0; k < r; ++k) {
    ir::Value c = k == dim ? idx : b.Iota({ir::DType::I64, ishape}, k);
    parts.push_back(b.Reshape(c, one));
  }
  return b.Concatenate(parts, r);
}

at::Tensor gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad) {
  // the CPU's own checks, for a non-empty index: its dtype, rank, and no
  // larger than self but along dim
  const int64_t w = WrapDim(dim, std::max<int64_t>(self.dim(), 1));
  TraceScope s;
  const int d = CommonDevice({&self, &index});
  if (index.numel() == 0) return Wrap(Fill(d, 0, self.scalar_type(), index.sizes().vec()), d);
  at::native::scatter_gather_dtype_check("gather", self, index);
  at::native::gather_shape_check(self, w, index);
  ir::Builder& b = B(d);
  if (self.dim() == 0 || index.dim() == 0) {  // a 0-d tensor is a 1-element vector for indexing purposes
    return Wrap(b.Reshape(Val(tpj::aten::gather(self.reshape({-1}), w, index.reshape({-1}), sparse_grad)), index.sizes().vec()), d);
  }
  const auto ishape = index.sizes().vec();
  ir::Value coords = Coordinates(d, CheckedIndex(d, Val(index), self.size(w), false, "gather()", runtime::ErrorKind::kValue), ishape, w);
  ir::GatherDims g;
  for (int64_t i = 0; i < self.dim(); ++i) {
    g.collapsed_slice_dims.push_back(i);
    g.start_index_map.push_back(i);
  }
  g.index_vector_dim = index.dim();
  return Wrap(b.Gather(Val(self), coords, g, std::vector<int64_t>(self.dim(), 1)), d);
}

// How an out-of-range index of a scatter is reported: the op's name and the
// CPU's exception for it.
struct IndexCheck {
  const char* what = "scatter()";
  runtime::ErrorKind kind = runtime::ErrorKind::kValue;
};

// `src` written into `operand` (of `shape`) where `index` points along dim:
// overwriting (replace) or combined by `kind`.
ir::Value ScatterInto(int d, ir::Value operand, const std::vector<int64_t>& shape, int64_t dim, const at::Tensor& index,
                      ir::Value src, bool replace, ir::ReduceKind kind = ir::ReduceKind::Sum,
                      const IndexCheck& check = {}) {
  ir::Builder& b = B(d);
  if (shape.empty()) {
    // 0-d self, index and src: one element, replaced or combined
    ir::Value one = b.Reshape(src, {});
    if (replace) return one;
    const Op op = kind == ir::ReduceKind::Prod ? Op::Mul
                  : kind == ir::ReduceKind::Max ? Op::Max
                  : kind == ir::ReduceKind::Min ? Op::Min
                                                : Op::Add;
    return b.Binary(op, operand, one);
  }
  if (index.dim() == 0) {  // into a 1-d operand: a 1-element index and source
    return ScatterInto(d, operand, shape, dim, index.reshape({1}), b.Reshape(src, {1}), replace, kind, check);
  }
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t w = WrapDim(dim, rank);
  const auto ishape = index.sizes().vec();
  ir::Value coords = Coordinates(d, CheckedIndex(d, Val(index), shape[w], false, check.what, check.kind), ishape, w);
  ir::ScatterDims sd;
  for (int64_t i = 0; i < rank; ++i) {
    sd.inserted_window_dims.push_back(i);
    sd.scatter_dims_to_operand_dims.push_back(i);
  }
  sd.index_vector_dim = index.dim();
  return b.Scatter(operand, coords, src, sd, replace, kind);
}
ir::Value ScatterInto(int d, const at::Tensor& self, int64_t dim, const at::Tensor& index, ir::Value src, bool replace) {
  return ScatterInto(d, Val(self), self.sizes().vec(), dim, index, src, replace);
}

ir::Value SrcRegion(int d, const at::Tensor& src, const at::Tensor& index, at::ScalarType t) {
  ir::Builder& b = B(d);
  ir::Value v = ValAs(src, t);
  if (src.sizes() == index.sizes()) return v;
  std::vector<int64_t> zeros(src.dim(), 0), ones(src.dim(), 1);
  // a 0-d index takes src's first element (ScatterInto reads it as [1])
  return b.Slice(v, zeros, index.dim() == 0 ? ones : index.sizes().vec(), ones);
}

// The CPU's own checks of scatter and scatter_add: dtypes, ranks, and an
// index no larger than src, nor than self but along dim.
void ScatterChecks(const char* what, const at::Tensor& self, int64_t dim, const at::Tensor& index,
                   const std::optional<at::Tensor>& src) {
  at::native::scatter_gather_dtype_check(what, self, index, src);
  at::native::scatter_shape_check(self, WrapDim(dim, std::max<int64_t>(self.dim(), 1)), index, src);
}

at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  ScatterChecks("scatter_add", self, dim, index, src);
  if (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16) {  // the CPU sums those in float
    return tpj::aten::scatter_add(self.to(at::kFloat), dim, index, src.to(at::kFloat)).to(self.scalar_type());
  }
  TraceScope s;
  const int d = CommonDevice({&self, &index, &src});
  if (index.numel() == 0) return Wrap(Val(self), d);
  return Wrap(ScatterInto(d, self, dim, index, SrcRegion(d, src, index, self.scalar_type()), false), d);
}

at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  ScatterChecks("scatter", self, dim, index, src);
  TraceScope s;
  const int d = CommonDevice({&self, &index, &src});
  if (index.numel() == 0) return Wrap(Val(self), d);
  return Wrap(ScatterInto(d, self, dim, index, SrcRegion(d, src, index, self.scalar_type()), true), d);
}

at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  ScatterChecks("scatter", self, dim, index, std::nullopt);
  TraceScope s;
  const int d = CommonDevice({&self, &index});
  if (index.numel() == 0) return Wrap(Val(self), d);
  return Wrap(ScatterInto(d, self, dim, index, Number(d, value, self.scalar_type(), index.sizes().vec()), true), d);
}

// scatter_reduce: the updates combined with self (include_self) or with
// the reduction's identity where any update lands; "mean" divides the sum
// by the number of values (floor division for integers, as the CPU), and
// positions no update reaches keep self. NaN wins amax and amin, as on the
// CPU (StableHLO's maximum and minimum propagate it).
at::Tensor ScatterReduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                         c10::string_view reduce, bool include_self, const IndexCheck& check) {
  const std::string r(reduce);
  TORCH_CHECK(r == "sum" || r == "prod" || r == "mean" || r == "amax" || r == "amin",
              "reduce argument must be either sum, prod, mean, amax or amin, got ", r);
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "scatter(): Expected dtype int32/int64 for index");
  TORCH_CHECK(self.scalar_type() == src.scalar_type(), "scatter(): Expected self.dtype to be equal to src.dtype");
  // the CPU's shape rules (a 0-d tensor counts as one element of one dim)
  const int64_t rank = std::max<int64_t>(self.dim(), 1);
  TORCH_CHECK(std::max<int64_t>(index.dim(), 1) == rank, "Index tensor must have the same number of dimensions as self tensor");
  TORCH_CHECK(std::max<int64_t>(src.dim(), 1) == rank, "Index tensor must have the same number of dimensions as src tensor");
  const int64_t wd = WrapDim(dim, rank);
  auto size = [](const at::Tensor& x, int64_t i) { return x.dim() ? x.size(i) : int64_t{1}; };
  for (int64_t i = 0; i < rank; ++i) {
    TORCH_CHECK(size(index, i) <= size(src, i) && (i == wd || size(index, i) <= size(self, i)), "Expected index ",
                index.sizes(), " to be no larger than self ", self.sizes(), " apart from dimension ", wd,
                " and to be no larger size than src ", src.sizes());
  }
  if (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16) {
    // the CPU sums those in float, rounded once; "mean" divides that
    // rounded sum by the count, rounded again
    const at::ScalarType t = self.scalar_type();
    if (r == "sum") return ScatterReduce(self.to(at::kFloat), dim, index, src.to(at::kFloat), reduce, include_self, check).to(t);
    if (r == "mean") {
      at::Tensor sum = ScatterReduce(self.to(at::kFloat), dim, index, src.to(at::kFloat), "sum", include_self, check).to(t);
      at::Tensor count = ScatterReduce(at::full_like(self, include_self ? 1 : 0, self.options().dtype(at::kFloat)), dim,
                                       index, at::ones_like(src, src.options().dtype(at::kFloat)), "sum", true, check);
      return at::where(count.gt(0), sum.to(at::kFloat).div(count.clamp_min(1)).to(t), self);
    }
  }
  if (self.dim() == 1 && index.dim() == 0) {
    return ScatterReduce(self, dim, index.reshape({1}), src.reshape({-1}), reduce, include_self, check);
  }
  if (self.dim() == 1 && src.dim() == 0) {
    return ScatterReduce(self, dim, index, src.reshape({1}), reduce, include_self, check);
  }
  TraceScope s;
  const int d = CommonDevice({&self, &index, &src});
  ir::Builder& b = B(d);
  const at::ScalarType t = self.scalar_type();
  const auto shape = self.sizes().vec();
  if (index.numel() == 0) return Wrap(Val(self), d);
  const ir::ReduceKind kind = r == "prod"   ? ir::ReduceKind::Prod
                              : r == "amax" ? ir::ReduceKind::Max
                              : r == "amin" ? ir::ReduceKind::Min
                                            : ir::ReduceKind::Sum;
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t) || kind == ir::ReduceKind::Sum || kind == ir::ReduceKind::Prod,
                              "\"scatter_gather_tensor_cpu_reduce_", r, "\" not implemented for '", t, "'");
  ir::Value upd = SrcRegion(d, src, index, t);
  // values per position (self included), for mean and include_self=False; real for complex self
  const at::ScalarType ct = at::isComplexType(t) ? c10::toRealValueType(t) : t;
  ir::Value count;
  if (r == "mean" || !include_self) {
    count = ScatterInto(d, Fill(d, include_self ? 1 : 0, ct, shape), shape, dim, index,
                        Fill(d, 1, ct, index.sizes().vec()), false, ir::ReduceKind::Sum, check);
  }
  ir::Value base = Val(self);
  if (!include_self) {
    ir::Value identity = kind == ir::ReduceKind::Max   ? BroadcastTo(d, ExtremeConst(d, t, true), shape)
                         : kind == ir::ReduceKind::Min ? BroadcastTo(d, ExtremeConst(d, t, false), shape)
                                                       : Fill(d, kind == ir::ReduceKind::Prod ? 1 : 0, t, shape);
    base = b.Select(b.Compare(ir::CompareDir::GT, count, Fill(d, 0, ct, shape)), identity, base);
  }
  ir::Value out = ScatterInto(d, base, shape, dim, index, upd, false, kind, check);
  if (at::isFloatingType(t) && (kind == ir::ReduceKind::Max || kind == ir::ReduceKind::Min)) {
    // XLA's scatter may drop a NaN update: mark where any lands (or self is)
    ir::Value nan = ScatterInto(d, IsNan(d, base), shape, dim, index, IsNan(d, upd), false, ir::ReduceKind::Sum, check);
    out = b.Select(nan, Fill(d, NAN, t, shape), out);
  }
  if (r == "mean") {
    ir::Value zero = b.Compare(ir::CompareDir::EQ, count, Fill(d, 0, ct, shape));
    ir::Value n = b.Convert(b.Select(zero, Fill(d, 1, ct, shape), count), ToIr(t));
    ir::Value q = b.Binary(Op::Div, out, n);
    if (at::isIntegralType(t, /*includeBool=*/false)) {
      // floor division (n > 0): truncation moved an inexact negative quotient up
      ir::Value inexact = b.Compare(ir::CompareDir::NE, b.Binary(Op::Rem, out, n), Fill(d, 0, t, shape));
      ir::Value adjust = b.Binary(Op::And, inexact, b.Compare(ir::CompareDir::LT, out, Fill(d, 0, t, shape)));
      q = b.Select(adjust, b.Binary(Op::Sub, q, Fill(d, 1, t, shape)), q);
    }
    out = q;
  }
  return Wrap(out, d);
}
at::Tensor scatter_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                          c10::string_view reduce, bool include_self) {
  return ScatterReduce(self, dim, index, src, reduce, include_self, {});
}

// scatter(..., reduce="add" | "multiply"), the older spelling of scatter_reduce.
const char* ScatterReduction(c10::string_view reduce) {
  TORCH_CHECK(reduce == "add" || reduce == "multiply", "reduce argument must be either add or multiply, got ", reduce);
  return reduce == "add" ? "sum" : "prod";
}
at::Tensor scatter_src_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                              c10::string_view reduce) {
  return tpj::aten::scatter_reduce(self, dim, index, src, ScatterReduction(reduce), true);
}
at::Tensor scatter_value_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value,
                                c10::string_view reduce) {
  return tpj::aten::scatter_reduce(self, dim, index, at::full(index.sizes(), value, self.options()), ScatterReduction(reduce),
                                   true);
}

// index_reduce: scatter_reduce with the index repeated across source's
// other dims.
at::Tensor index_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                        c10::string_view reduce, bool include_self) {
  TORCH_CHECK(reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  TORCH_CHECK(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_reduce_(): Expected dtype int32/int64 for index but got: ", index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  const int64_t w = WrapDim(dim, std::max<int64_t>(self.dim(), 1));
  TORCH_CHECK(source.dim() == 0 ? index.numel() == 1 : source.size(w) == index.numel(),
              "index_reduce_(): Number of indices (", index.numel(), ") should be equal to source.size(dim)");
  std::vector<int64_t> want = self.sizes().vec(), got = source.sizes().vec();
  if (!want.empty() && !got.empty()) {
    want.erase(want.begin() + w);
    got.erase(got.begin() + w);
  }
  TORCH_CHECK(want == got && (self.dim() == 0) == (source.dim() == 0),
              "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = ",
              self.sizes(), " source.shape = ", source.sizes());
  at::Tensor idx = index.to(at::kLong);
  if (source.dim() == 0) {
    idx = idx.reshape({});
  } else {
    std::vector<int64_t> view(static_cast<size_t>(source.dim()), 1);
    view[static_cast<size_t>(w)] = index.numel();
    idx = idx.reshape(view).expand(source.sizes());
  }
  return ScatterReduce(self, w, idx, source, reduce, include_self, {"index_reduce()", runtime::ErrorKind::kIndex});
}

// take: self read as a flat vector at `index` (negative indices count from
// the end; out-of-range ones raise when the result is read).
at::Tensor take(const at::Tensor& self, const at::Tensor& index) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "take(): Expected a long tensor for index, but got ", index.scalar_type());
  TraceScope s;
  const int d = CommonDevice({&self, &index});
  ir::Builder& b = B(d);
  const auto ishape = index.sizes().vec();
  if (index.numel() == 0) return Wrap(Fill(d, 0, self.scalar_type(), ishape), d);
  TORCH_CHECK_INDEX(self.numel() > 0, "take(): tried to take from an empty tensor");
  std::vector<int64_t> col = ishape;
  col.push_back(1);
  ir::Value idx = b.Reshape(CheckedIndex(d, Val(index), self.numel(), true, "take()"), col);
  ir::GatherDims g;
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = index.dim();
  return Wrap(b.Gather(b.Reshape(Val(self), {self.numel()}), idx, g, {1}), d);
}

// put_: `source` written (or, accumulate, added) into self read as a flat
// vector at `index`.
at::Tensor& put_(at::Tensor& self, const at::Tensor& index, const at::Tensor& source, bool accumulate) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, but got ", index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "put_(): self and source expected to have the same dtype, but got "
              "self.dtype = ", self.scalar_type(), " and source.dtype = ", source.scalar_type());
  TORCH_CHECK_INDEX(index.numel() == source.numel(), "put_(): Expected source and index to have the same number of elements, "
              "but got source.numel() = ", source.numel(), ", index.numel() = ", index.numel());
  AssertNoOverlap(self, source, accumulate);
  if (index.numel() == 0) return self;
  TORCH_CHECK_INDEX(self.numel() > 0, "put_(): Tried to put elements into an empty tensor");
  TraceScope s;
  const int d = CommonDevice({&self, &index, &source});
  ir::Builder& b = B(d);
  const int64_t k = index.numel();
  ir::Value idx = b.Reshape(CheckedIndex(d, Val(index), self.numel(), true, "put_()"), {k, 1});
  ir::ScatterDims sd;
  sd.inserted_window_dims = {0};
  sd.scatter_dims_to_operand_dims = {0};
  sd.index_vector_dim = 1;
  ir::Value flat = b.Scatter(b.Reshape(Val(self), {self.numel()}), idx, b.Reshape(Val(source), {k}), sd, !accumulate);
  Assign(self, b.Reshape(flat, self.sizes().vec()));
  return self;
}

// unfold_backward: each window's gradient added back onto the elements it
// read, one scatter-add (element j of window i came from i * step + j).
at::Tensor unfold_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes_, int64_t dim, int64_t size,
                           int64_t step) {
  std::vector<int64_t> input_sizes;
  for (const c10::SymInt& v : input_sizes_) input_sizes.push_back(v.guard_int(__FILE__, __LINE__));
  TraceScope s;
  const int d = DeviceIndex(grad);
  ir::Builder& b = B(d);
  const at::ScalarType t = grad.scalar_type();
  const int64_t r = static_cast<int64_t>(input_sizes.size());
  if (r == 0) return Wrap(b.Reshape(Val(grad), {}), d);
  const int64_t w = WrapDim(dim, r);
  const auto gshape = grad.sizes().vec();
  TORCH_CHECK(static_cast<int64_t>(gshape.size()) == r + 1 && gshape.back() == size, "unfold_backward: grad of shape ",
              grad.sizes(), " does not fit input sizes ", input_sizes, " and window size ", size);
  if (grad.numel() == 0) return Wrap(Fill(d, 0, t, input_sizes), d);
  std::vector<int64_t> one = gshape;
  one.push_back(1);
  std::vector<ir::Value> parts;
  for (int64_t k = 0; k < r; ++k) {
    ir::Value c = b.Iota({ir::DType::I64, gshape}, k);
    if (k == w) {
      c = b.Binary(Op::Add, b.Binary(Op::Mul, c, b.Full(ir::DType::I64, gshape, static_cast<double>(step))),
                   b.Iota({ir::DType::I64, gshape}, r));
    }
    parts.push_back(b.Reshape(c, one));
  }
  ir::ScatterDims sd;
  for (int64_t k = 0; k < r; ++k) {
    sd.inserted_window_dims.push_back(k);
    sd.scatter_dims_to_operand_dims.push_back(k);
  }
  sd.index_vector_dim = r + 1;
  return Wrap(b.Scatter(Fill(d, 0, t, input_sizes), b.Concatenate(parts, r + 1), Val(grad), sd, false), d);
}

// channel_shuffle: channels [g, c / g] read as [c / g, g].
at::Tensor channel_shuffle(const at::Tensor& self, c10::SymInt groups_) {
  const int64_t groups = groups_.guard_int(__FILE__, __LINE__);
  TORCH_CHECK(self.dim() > 2, "channel_shuffle expects input to have at least 3 dimensions, but got input with sizes ",
              self.sizes());
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  const int64_t c = self.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c, " channels and ", groups,
              " groups.");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  std::vector<int64_t> split{shape[0], groups, c / groups};
  split.insert(split.end(), shape.begin() + 2, shape.end());
  std::vector<int64_t> perm(split.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[1], perm[2]);
  return Wrap(b.Reshape(b.Transpose(b.Reshape(Val(self), split), perm), shape), d);
}

at::Tensor& scatter_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  AssertNoOverlap(self, src, /*accumulate=*/true);
  return WriteInto(self, [&] { return tpj::aten::scatter_add(self, dim, index, src); });
}
at::Tensor& scatter_src_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  AssertNoOverlap(self, src, /*accumulate=*/false);
  return WriteInto(self, [&] { return tpj::aten::scatter_src(self, dim, index, src); });
}
at::Tensor& scatter_value_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& v) {
  return WriteInto(self, [&] { return tpj::aten::scatter_value(self, dim, index, v); });
}

// index_add and index_copy: source's slices along `dim` added to (or
// written over) self's slices named by `index`.
at::Tensor IndexScatter(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                        const at::Scalar& alpha, bool replace, const char* what) {
  TORCH_CHECK_INDEX(index.dim() <= 1, what, "(): Index is supposed to be a vector");
  // index_add takes int32 or int64 indices; index_copy only int64, as on the CPU
  TORCH_CHECK(index.scalar_type() == at::kLong || (index.scalar_type() == at::kInt && !replace), what,
              replace ? "_(): Expected a long tensor for index, but got " : "(): Expected dtype int32/int64 for index",
              replace ? c10::toString(index.scalar_type()) : "");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), what, "(): self (", self.scalar_type(), ") and source (",
              source.scalar_type(), ") must have the same scalar type");
  const int64_t w = WrapDim(dim, std::max<int64_t>(self.dim(), 1));
  // (the CPU's index_copy also takes a 0-d self, and raises IndexError; index_add RuntimeError)
  const bool same_rank = source.dim() == 0 || source.dim() == self.dim() || (replace && self.dim() == 0);
  if (replace) {
    TORCH_CHECK_INDEX(same_rank, "index_copy_(): When source and destination are not scalars, their dimensionality must "
                      "match. Source dimensionality (", source.dim(), "), destination dimensionality (", self.dim(), ")");
  }
  TORCH_CHECK(same_rank, what, "(): When source and destination are not scalars, their dimensionality must match. Source "
              "dimensionality (", source.dim(), "), destination dimensionality (", self.dim(), ")");
  TORCH_CHECK(!(replace && self.dim() == 0 && source.dim() > 1), "index_copy_(): Source/destination tensor must have "
              "same slice shapes. Destination slice shape: [] at dimension 0 and source slice shape: ",
              source.sizes().slice(1), " at dimension 0.");
  for (int64_t i = 0; source.dim() > 0 && i < self.dim(); ++i) {
    if (i == w) continue;
    if (replace) {
      TORCH_CHECK(self.size(i) == source.size(i), "index_copy_(): Source/destination tensor must have same slice "
                  "shapes. Destination slice shape: ", self.size(i), " at dimension ", i < w ? i : i - 1,
                  " and source slice shape: ", source.size(i), " at dimension ", i < w ? i : i - 1, ".");
    } else {
      TORCH_CHECK(self.size(i) == source.size(i), "source tensor shape must match self tensor shape, excluding the "
                  "specified dimension. Got self.shape = ", self.sizes(), " source.shape = ", source.sizes());
    }
  }
  TORCH_CHECK_INDEX(index.numel() == (source.dim() == 0 ? 1 : source.size(w)), what,
                    "(): Number of indices (", index.numel(), ") should be equal to source.size(dim) (",
                    (source.dim() == 0 ? 1 : source.size(w)), ")");
  TraceScope s;
  const int d = CommonDevice({&self, &index, &source});
  ir::Builder& b = B(d);
  // the CPU's index_add writes nothing, and checks nothing, into an empty self of several dims
  if (index.numel() == 0 || (!replace && self.dim() > 1 && self.numel() == 0)) return Wrap(Val(self), d);
  if (self.dim() == 0) {
    // a 0-d self is a 1-element vector for indexing purposes
    at::Tensor r = IndexScatter(self.reshape({1}), 0, index.reshape({-1}), source.reshape({-1}), alpha, replace, what);
    return Wrap(b.Reshape(Val(r), {}), d);
  }
  // index (n) spread over source's shape along `dim`
  const auto sshape = source.dim() == 0 ? std::vector<int64_t>{1} : source.sizes().vec();
  ir::Value idx = b.BroadcastInDim(b.Reshape(Val(index), {index.numel()}), sshape, {w});
  ir::Value src = b.Reshape(ValAs(source, self.scalar_type()), sshape);
  if (!IsOne(alpha)) src = b.Binary(Op::Mul, src, Number(d, alpha, self.scalar_type(), sshape));
  // the CPU's exception: RuntimeError from index_add's kernel over rows, IndexError otherwise
  const runtime::ErrorKind kind = !replace && self.dim() > 1 ? runtime::ErrorKind::kValue : runtime::ErrorKind::kIndex;
  ir::Value coords = Coordinates(d, CheckedIndex(d, idx, self.size(w), false, what, kind), sshape, w);
  ir::ScatterDims sd;
  for (int64_t i = 0; i < self.dim(); ++i) {
    sd.inserted_window_dims.push_back(i);
    sd.scatter_dims_to_operand_dims.push_back(i);
  }
  sd.index_vector_dim = static_cast<int64_t>(sshape.size());
  return Wrap(b.Scatter(Val(self), coords, src, sd, replace), d);
}

at::Tensor index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                     const at::Scalar& alpha) {
  // The CPU's index_add of a tensor with dims hands dim 0 and the last dim
  // (int64 index, alpha 1) to scatter_add, which sums float16/bfloat16 in
  // float; its other cases add in the half type, as here.
  const at::ScalarType t = self.scalar_type();
  if ((t == at::kHalf || t == at::kBFloat16) && self.dim() > 1 && index.scalar_type() == at::kLong &&
      alpha.equal(1) && (WrapDim(dim, self.dim()) == 0 || WrapDim(dim, self.dim()) == self.dim() - 1) &&
      source.scalar_type() == t) {
    return IndexScatter(self.to(at::kFloat), dim, index, source.to(at::kFloat), alpha, false, "index_add").to(t);
  }
  return IndexScatter(self, dim, index, source, alpha, false, "index_add");
}

// With repeated indices the CPU keeps one of the writes, unspecified which.
at::Tensor index_copy(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  return IndexScatter(self, dim, index, source, 1, true, "index_copy");
}

at::Tensor& index_copy_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  AssertNoOverlap(self, source, /*accumulate=*/false);
  return WriteInto(self, [&] { return tpj::aten::index_copy(self, dim, index, source); });
}

// index_fill: the slices along `dim` named by `index` (negatives wrap, as
// on the CPU) set to `value`, through a mask over that dim: repeated
// indices are harmless.
at::Tensor IndexFill(const at::Tensor& self, int64_t dim, const at::Tensor& index, ir::Value value, int d) {
  TORCH_CHECK(index.dim() <= 1, "Index has to be a vector/scalar");  // (a RuntimeError, as the CPU's)
  TORCH_CHECK(index.scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.");
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  if (index.numel() == 0) return Wrap(Val(self), d);
  const int64_t w = WrapDim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() == 0 ? 1 : self.size(w), k = index.numel();
  ir::Value idx = CheckedIndex(d, b.Reshape(Val(index), {k}), n, true, "index_fill_()");
  ir::Value pos = b.Iota({ir::DType::I64, {n, k}}, 0);
  ir::Value hit = b.Compare(ir::CompareDir::EQ, pos, b.BroadcastInDim(idx, {n, k}, {1}));
  ir::Value rows = b.Reduce(hit, b.ScalarConstant(ir::DType::Bool, 0), {1}, ir::ReduceKind::Or);
  ir::Value mask = self.dim() == 0 ? b.Reshape(rows, {}) : b.BroadcastInDim(rows, shape, {w});
  return Wrap(b.Select(mask, BroadcastTo(d, value, shape), Val(self)), d);
}

at::Tensor index_fill_scalar(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  TraceScope s;
  const int d = CommonDevice({&self, &index});
  return IndexFill(self, dim, index, Number(d, value, self.scalar_type(), {}), d);
}

at::Tensor index_fill_tensor(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  TraceScope s;
  const int d = CommonDevice({&self, &index, &value});
  return IndexFill(self, dim, index, Operand(value, d, self.scalar_type()), d);
}

at::Tensor& index_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                       const at::Scalar& alpha) {
  AssertNoOverlap(self, source, /*accumulate=*/true);
  return WriteInto(self, [&] { return tpj::aten::index_add(self, dim, index, source, alpha); });
}

// --------------------------------------------------------- advanced indexing

struct IndexPlan {
  std::vector<int64_t> dims;       // indexed dims of self
  std::vector<at::Tensor> tensors;  // integer index tensors (one per dim)
  std::vector<int64_t> bshape;      // broadcast shape of the index tensors
  bool adjacent = true;
};

// The CPU's check of a mask against the dims of self it indexes from `pos` on.
void CheckMaskShape(const at::Tensor& mask, const at::Tensor& self, int64_t pos) {
  for (int64_t k = 0; k < mask.dim(); ++k) {
    TORCH_CHECK_INDEX(pos + k < self.dim() && mask.size(k) == self.size(pos + k), "The shape of the mask ",
                      mask.sizes(), " at index ", k, " does not match the shape of the indexed tensor ", self.sizes(),
                      " at index ", pos + k);
  }
}

IndexPlan PlanIndex(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  IndexPlan p;
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", indices.size(), ")");
  int64_t pos = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    std::optional<at::Tensor> t = indices.get(i);
    if (!t || !t->defined()) {
      ++pos;
      continue;
    }
    // Index tensors on the CPU are moved to the device, as CUDA's advanced
    // indexing does (x[torch.arange(n)], x[mask_from_numpy]); a CPU mask's
    // positions are found on the CPU, syncing nothing.
    const bool on_cpu = t->device().is_cpu();
    if (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte) {
      // A mask selects data-dependent positions: its nonzero() needs the values.
      at::Tensor nz = at::nonzero(*t);
      if (on_cpu) nz = nz.to(self.device());
      CheckMaskShape(*t, self, pos);
      for (int64_t k = 0; k < t->dim(); ++k) {
        p.dims.push_back(pos + k);
        p.tensors.push_back(nz.select(1, k));
      }
      pos += t->dim();
      continue;
    }
    TORCH_CHECK_INDEX(t->scalar_type() == at::kLong || t->scalar_type() == at::kInt,
                      "tensors used as indices must be long, int, byte or bool tensors");
    p.dims.push_back(pos++);
    p.tensors.push_back(on_cpu ? t->to(self.device()) : *t);
  }
  for (size_t i = 1; i < p.dims.size(); ++i) {
    if (p.dims[i] != p.dims[i - 1] + 1) p.adjacent = false;
  }
  try {
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      p.bshape = i == 0 ? p.tensors[0].sizes().vec() : at::infer_size(p.bshape, p.tensors[i].sizes());
    }
  } catch (const c10::Error&) {  // IndexError, with every index's shape, as on the CPU
    std::string shapes;
    for (const at::Tensor& t : p.tensors) shapes += (shapes.empty() ? "" : ", ") + c10::str(t.sizes());
    TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ", shapes);
  }
  return p;
}

// Coordinates [*bshape, k] for the indexed dims; gather/scatter dims.
ir::Value IndexCoords(int d, const at::Tensor& self, const IndexPlan& p) {
  ir::Builder& b = B(d);
  std::vector<int64_t> one = p.bshape;
  one.push_back(1);
  std::vector<ir::Value> parts;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    ir::Value v = BroadcastTo(d, CheckedIndex(d, Operand(p.tensors[i], d, p.tensors[i].scalar_type()), self.size(p.dims[i]), true, "index"), p.bshape);
    parts.push_back(b.Reshape(v, one));
  }
  return parts.size() == 1 ? parts[0] : b.Concatenate(parts, static_cast<int64_t>(p.bshape.size()));
}

// An empty result still raises the CPU's IndexError where indices (any)
// index a dimension of size 0; other indices of an empty result are not
// checked there either.
void RefuseIndexingEmptyDims(const at::Tensor& self, const IndexPlan& p) {
  if (c10::multiply_integers(p.bshape) == 0) return;
  for (int64_t dim : p.dims) {
    TORCH_CHECK_INDEX(self.size(dim) > 0, "index: index out of range: indexing a dimension of size 0");
  }
}

// Shape of self[indices] and where its dims come from.
std::vector<int64_t> IndexResultShape(const at::Tensor& self, const IndexPlan& p, std::vector<int64_t>* offset_dims) {
  std::vector<int64_t> rest_before, rest_after;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (std::find(p.dims.begin(), p.dims.end(), i) != p.dims.end()) continue;
    (p.adjacent && i < p.dims[0] ? rest_before : rest_after).push_back(i);
  }
  std::vector<int64_t> out;
  offset_dims->clear();
  for (int64_t i : rest_before) {
    offset_dims->push_back(static_cast<int64_t>(out.size()));
    out.push_back(self.size(i));
  }
  out.insert(out.end(), p.bshape.begin(), p.bshape.end());
  for (int64_t i : rest_after) {
    offset_dims->push_back(static_cast<int64_t>(out.size()));
    out.push_back(self.size(i));
  }
  return out;
}

at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  IndexPlan p = PlanIndex(self, indices);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  if (p.tensors.empty()) return Wrap(Val(self), d);
  std::vector<int64_t> offset_dims;
  const std::vector<int64_t> out = IndexResultShape(self, p, &offset_dims);
  int64_t numel = 1;
  for (int64_t x : out) numel *= x;
  if (numel == 0) {
    RefuseIndexingEmptyDims(self, p);
    return Wrap(Fill(d, 0, self.scalar_type(), out), d);
  }
  ir::GatherDims g;
  g.offset_dims = offset_dims;
  g.collapsed_slice_dims = p.dims;
  g.start_index_map = p.dims;
  g.index_vector_dim = static_cast<int64_t>(p.bshape.size());
  std::vector<int64_t> sizes = self.sizes().vec();
  for (int64_t dim : p.dims) sizes[dim] = 1;
  ir::Value r = b.Gather(Val(self), IndexCoords(d, self, p), g, sizes);
  return Wrap(b.Reshape(r, out), d);
}

// x[mask] = v with a bool mask over self's leading dims and a value without
// a dim per selected element (one number, or one row broadcast to every
// selected one: SpecAugment's hidden_states[mask] = embedding in wav2vec 2.0
// and HuBERT): a select, without reading the count of true elements, so no
// sync and one program for every mask. The mask on the device, reshaped to
// self's rank (its dims, then ones), and the row's dims.
struct MaskRow {
  at::Tensor mask;
  std::vector<int64_t> mask_dims;
  std::vector<int64_t> row;
};

std::optional<MaskRow> AsMaskRow(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                                 const at::Tensor& values) {
  if (indices.size() != 1 || !indices.get(0) || indices.get(0)->scalar_type() != at::kBool) return std::nullopt;
  const at::Tensor mask = *indices.get(0);
  if (mask.dim() > self.dim() || mask.sizes() != self.sizes().slice(0, mask.dim())) return std::nullopt;
  const at::IntArrayRef rest = self.sizes().slice(mask.dim());
  at::IntArrayRef row = values.sizes();
  if (row.size() == rest.size() + 1 && row[0] == 1) row = row.slice(1);
  if (row.size() > rest.size() || !at::is_expandable_to(row, rest)) return std::nullopt;
  MaskRow r{IsPjrt(mask) ? mask : mask.to(self.device()), mask.sizes().vec(), row.vec()};
  r.mask_dims.resize(static_cast<size_t>(self.dim()), 1);
  return r;
}

// The CPU's and CUDA's shortcut (canDispatchToMaskedFill): without
// accumulate, one bool or uint8 mask on self's device (after any leading
// full slices) and a one-element value on the CPU make x[mask] = v
// masked_fill_ with v's number: v's dtype is not checked (x[mask] =
// torch.tensor(0) into floats), and a uint8 mask is refused as masked_fill_
// refuses it. The mask, with trailing dims of one; undefined otherwise.
at::Tensor MaskedFillMask(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                          const at::Tensor& values, bool accumulate) {
  if (accumulate || values.numel() != 1 || !values.device().is_cpu()) return {};
  int64_t dims = 0;
  at::Tensor mask;
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::optional<at::Tensor> t = indices.get(i);
    if (!t || !t->defined()) {
      ++dims;
      continue;
    }
    if ((t->scalar_type() != at::kBool && t->scalar_type() != at::kByte) || t->device() != self.device() ||
        mask.defined()) {
      return {};
    }
    CheckMaskShape(*t, self, dims);
    mask = *t;
    dims += t->dim();
  }
  if (!mask.defined()) return {};
  std::vector<int64_t> shape = mask.sizes().vec();
  shape.resize(shape.size() + static_cast<size_t>(std::max<int64_t>(self.dim() - dims, 0)), 1);  // self's dims after
  return mask.reshape(shape);
}

at::Tensor& IndexPut(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices, const at::Tensor& values,
                     bool accumulate) {
  if (const at::Tensor mask = MaskedFillMask(self, indices, values, accumulate); mask.defined()) {
    return self.masked_fill_(mask, values.item());
  }
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), "Index put requires the source and destination dtypes match, "
              "got ", self.scalar_type(), " for the destination and ", values.scalar_type(), " for the source.");
  if (const std::optional<MaskRow> r = AsMaskRow(self, indices, values)) {
    TraceScope s;
    const int d = DeviceIndex(self);
    ir::Builder& b = B(d);
    const auto shape = self.sizes().vec();
    ir::Value m = BroadcastTo(d, b.Reshape(Operand(r->mask, d, at::kBool), r->mask_dims), shape);
    ir::Value v = BroadcastTo(d, b.Reshape(Operand(values, d, self.scalar_type()), r->row), shape);
    ir::Value old = Val(self);
    Assign(self, b.Select(m, accumulate ? b.Binary(ir::Op::Add, old, v) : v, old));
    return self;
  }
  IndexPlan p = PlanIndex(self, indices);
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  if (p.tensors.empty()) {
    Assign(self, BroadcastTo(d, Operand(values, d, self.scalar_type()), self.sizes().vec()));
    return self;
  }
  std::vector<int64_t> offset_dims;
  const std::vector<int64_t> out = IndexResultShape(self, p, &offset_dims);
  int64_t numel = 1;
  for (int64_t x : out) numel *= x;
  if (numel == 0) RefuseIndexingEmptyDims(self, p);  // before the value's shape, as the CPU
  TORCH_CHECK(at::is_expandable_to(values.sizes(), out), "shape mismatch: value tensor of shape ", values.sizes(),
              " cannot be broadcast to indexing result of shape ", c10::IntArrayRef(out));
  if (numel == 0) return self;
  ir::Value upd = BroadcastTo(d, Operand(values, d, self.scalar_type()), out);
  ir::ScatterDims sd;
  sd.update_window_dims = offset_dims;
  sd.inserted_window_dims = p.dims;
  sd.scatter_dims_to_operand_dims = p.dims;
  sd.index_vector_dim = static_cast<int64_t>(p.bshape.size());
  // Scatter wants the window dims last in the updates when not adjacent; the
  // gather-shaped `out` already matches the dimension numbers.
  Assign(self, b.Scatter(Val(self), IndexCoords(d, self, p), upd, sd, !accumulate));
  return self;
}

// The CPU's index_put_ writes one value under one boolean mask as
// masked_fill_ of that value, read first, before its overlap check
// (x[x > 5] = x[0]); a program reads it first too. Other index writes get
// AssertNoOverlap.
void IndexPutOverlapCheck(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                          const at::Tensor& values, bool accumulate) {
  if (!accumulate && values.numel() == 1 && indices.size() == 1) {
    const std::optional<at::Tensor> mask = indices.get(0);
    if (mask && (mask->scalar_type() == at::kBool || mask->scalar_type() == at::kByte)) {
      AssertNoInternalOverlap(self);
      return;
    }
  }
  AssertNoOverlap(self, values, accumulate);
}

at::Tensor& index_put_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices, const at::Tensor& values,
                       bool accumulate) {
  IndexPutOverlapCheck(self, indices, values, accumulate);
  return IndexPut(self, indices, values, accumulate);
}

at::Tensor& index_put_impl_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                            const at::Tensor& values, bool accumulate, bool unsafe) {
  IndexPutOverlapCheck(self, indices, values, accumulate);
  return IndexPut(self, indices, values, accumulate);
}

at::Tensor index_put(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices, const at::Tensor& values,
                     bool accumulate) {
  at::Tensor copy = self.clone();
  IndexPut(copy, indices, values, accumulate);
  return copy;
}

// Autograd of index_put_ on pjrt. PyTorch's formula takes a row's gradient
// as grad[mask] summed: a shape per count of true elements, so training with
// x[mask] = row (SpecAugment) compiled a program per count. A mask row is
// where(mask, row, x) copied into x here, whose gradients (where(mask, grad,
// 0) summed to the row, where(mask, 0, grad)) keep their shapes, and whose
// forward-mode tangents batch (jacfwd). Everything else goes to
// _index_put_impl_, whose autograd formula is index_put_'s.
at::Tensor& index_put_autograd(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                               const at::Tensor& values, bool accumulate) {
  bool symbolic = Symbolic(self) || Symbolic(values);
  for (const std::optional<at::Tensor>& i : indices) symbolic |= i && Symbolic(*i);
  const std::optional<MaskRow> r = values.scalar_type() == self.scalar_type() && !symbolic
                                       ? AsMaskRow(self, indices, values)
                                       : std::nullopt;
  if (!r) return at::_index_put_impl_(self, indices, values, accumulate, /*unsafe=*/false);
  IndexPutOverlapCheck(self, indices, values, accumulate);
  const at::Tensor m = r->mask.reshape(r->mask_dims);
  const at::Tensor v = values.reshape(r->row);
  self.copy_(at::where(m, accumulate ? self + v : v, self));
  return self;
}

// one_hot: ATen leaves the class range to scatter's index check on
// accelerators (PrivateUse1 included), whose error names scatter. The CPU's
// checks and messages go into the program instead (_assert_async, as
// torch.compile's decomposition does, which this kernel takes the place of
// for Dynamo's fake tensors too), and the scatter reads the classes clamped
// into range, so that its own check never fires first. With num_classes -1
// ATen counts the classes (max + 1).
at::Tensor one_hot_autograd(const at::Tensor& self, int64_t num_classes) {
  if (self.scalar_type() != at::kLong || num_classes == 0 || num_classes < -1 ||
      (!Symbolic(self) && self.numel() == 0)) {
    return at::native::one_hot(self, num_classes);
  }
  at::_assert_async(self.ge(0).all(), "Class values must be non-negative.");
  if (num_classes == -1) return at::native::one_hot(self, num_classes);
  at::_assert_async(self.lt(num_classes).all(), "Class values must be smaller than num_classes.");
  // (fake tensors take ATen's functional form, a comparison with arange)
  const bool fake = self.key_set().has(c10::DispatchKey::Python);
  return at::native::one_hot(fake ? self : self.clamp(0, num_classes - 1), num_classes);
}

// nn.Embedding(max_norm=...): each row that `indices` names and whose
// norm_type-norm exceeds max_norm is scaled to max_norm / (norm + 1e-7), in
// place, as the CPU kernel does; a row named twice is scaled once. An index
// out of range is the CPU's error (index_select checks it).
at::Tensor& embedding_renorm_(at::Tensor& self, const at::Tensor& indices, double max_norm, double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_: expected weight to be 2-D, got ", self.dim(), "-D");
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_renorm_: expected indices to be Long or Int, got ", indices.scalar_type());
  if (indices.numel() == 0) return self;
  const at::Tensor idx = indices.reshape({-1}).to(at::kLong);
  const at::Tensor rows = self.index_select(0, idx);
  const at::Tensor norm = at::linalg_vector_norm(rows, norm_type, {1}, true);
  const at::Tensor scale = at::where(norm.gt(max_norm), max_norm / (norm + 1e-7), at::ones_like(norm));
  return self.index_copy_(0, idx, rows * scale);
}

// nn.Embedding(sparse=True): pjrt has no sparse layout, so its weight's
// gradient is the dense one (the same values; SparseAdam, which wants sparse
// gradients, says so).
at::Tensor embedding_backward(const at::Tensor& grad, const at::Tensor& indices, c10::SymInt num_weights,
                              c10::SymInt padding_idx, bool scale_grad_by_freq, bool) {
  return at::embedding_dense_backward_symint(grad, indices, std::move(num_weights), std::move(padding_idx),
                                             scale_grad_by_freq);
}

// At the autograd key: a backend kernel alone leaves this
// CompositeImplicitAutograd op to autograd's not-implemented fallback, which
// warned "an autograd kernel was not registered" in a double backward. A
// gradient that requires grad (create_graph) takes the dense backward, which
// records its own; otherwise the op goes on whole below autograd (lazy mode,
// and AOTAutograd's graphs keep the backend's one-scatter kernel).
at::Tensor embedding_backward_autograd(const at::Tensor& grad, const at::Tensor& indices, c10::SymInt num_weights,
                                       c10::SymInt padding_idx, bool scale_grad_by_freq, bool sparse) {
  if (grad.requires_grad()) {
    return embedding_backward(grad, indices, std::move(num_weights), std::move(padding_idx), scale_grad_by_freq, sparse);
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return at::embedding_backward_symint(grad, indices, std::move(num_weights), std::move(padding_idx),
                                       scale_grad_by_freq, sparse);
}

at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                                    int64_t padding_idx, bool scale_grad_by_freq) {
  TraceScope s;
  const int d = CommonDevice({&grad, &indices});
  ir::Builder& b = B(d);
  const int64_t n = indices.numel();
  const int64_t dim = grad.size(-1);
  const at::ScalarType t = grad.scalar_type();
  ir::Value idx = b.Reshape(b.Convert(Val(indices), ir::DType::I64), {n});
  ir::Value g = b.Reshape(Val(grad), {n, dim});
  if (padding_idx >= 0) {
    ir::Value pad = b.Compare(ir::CompareDir::EQ, idx, Fill(d, static_cast<double>(padding_idx), at::kLong, {n}));
    g = b.Select(BroadcastTo(d, b.Reshape(pad, {n, 1}), {n, dim}), Fill(d, 0, t, {n, dim}), g);
  }
  ir::ScatterDims sd;
  sd.update_window_dims = {1};
  sd.inserted_window_dims = {0};
  sd.scatter_dims_to_operand_dims = {0};
  sd.index_vector_dim = 1;
  ir::Value idx2 = b.Reshape(idx, {n, 1});
  if (scale_grad_by_freq) {
    ir::ScatterDims cd;
    cd.inserted_window_dims = {0};
    cd.scatter_dims_to_operand_dims = {0};
    cd.index_vector_dim = 1;
    ir::Value counts = b.Scatter(Fill(d, 0, t, {num_weights}), idx2, Fill(d, 1, t, {n}), cd, false);
    ir::GatherDims gd;
    gd.collapsed_slice_dims = {0};
    gd.start_index_map = {0};
    gd.index_vector_dim = 1;
    ir::Value per = b.Gather(counts, idx2, gd, {1});
    g = b.Binary(Op::Div, g, BroadcastTo(d, b.Reshape(per, {n, 1}), {n, dim}));
  }
  return Wrap(b.Scatter(Fill(d, 0, t, {num_weights, dim}), idx2, g, sd, false), d);
}

at::Tensor TriMask(const at::Tensor& self, int64_t diagonal, bool lower) {
  TORCH_CHECK(self.dim() >= 2, lower ? "tril" : "triu", ": input tensor must have at least 2 dimensions");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  const int64_t r = self.dim();
  ir::Value row = b.Iota({ir::DType::I64, shape}, r - 2);
  ir::Value col = b.Iota({ir::DType::I64, shape}, r - 1);
  ir::Value diff = b.Binary(Op::Sub, col, row);
  ir::Value keep = b.Compare(lower ? ir::CompareDir::LE : ir::CompareDir::GE, diff,
                             Fill(d, static_cast<double>(diagonal), at::kLong, shape));
  return Wrap(b.Select(keep, Val(self), Fill(d, 0, self.scalar_type(), shape)), d);
}
at::Tensor tril(const at::Tensor& self, int64_t diagonal) { return TriMask(self, diagonal, true); }
at::Tensor triu(const at::Tensor& self, int64_t diagonal) { return TriMask(self, diagonal, false); }
at::Tensor& tril_(at::Tensor& self, int64_t diagonal) {
  return WriteInto(self, [&] { return tpj::aten::tril(self, diagonal); });
}
at::Tensor& triu_(at::Tensor& self, int64_t diagonal) {
  return WriteInto(self, [&] { return tpj::aten::triu(self, diagonal); });
}

at::Tensor constant_pad_nd(const at::Tensor& self, at::IntArrayRef pad, const at::Scalar& value) {
  TORCH_CHECK(pad.size() % 2 == 0, "Length of pad must be even but instead it equals ", pad.size());
  TORCH_CHECK(static_cast<int64_t>(pad.size() / 2) <= self.dim(), "Length of pad should be no more than twice the number of dimensions of the input.");
  TraceScope s;
  const int d = DeviceIndex(self);
  const int64_t r = self.dim();
  std::vector<int64_t> low(r, 0), high(r, 0), interior(r, 0);
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    low[r - 1 - i] = pad[2 * i];
    high[r - 1 - i] = pad[2 * i + 1];
    // (the CPU's message: it narrows for negative padding)
    TORCH_CHECK(self.size(r - 1 - static_cast<int64_t>(i)) + pad[2 * i] + pad[2 * i + 1] >= 0,
                "narrow(): length must be non-negative.");
  }
  ir::Value pv = B(d).Reshape(Number(d, value, self.scalar_type(), {}), {});
  return Wrap(B(d).Pad(Val(self), pv, low, high, interior), d);
}

// A float tensor read in float32 (exact for the half types) as a sort key
// in PyTorch's order: NaN as +NaN (above +inf), -0.0 as +0.0 (equal).
ir::Value FloatSortKey(const at::Tensor& self) {
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  const auto shape = self.sizes().vec();
  ir::Value x = ValAs(self, at::kFloat);
  x = b.Select(b.Compare(ir::CompareDir::EQ, x, Fill(d, 0, at::kFloat, shape)), Fill(d, 0, at::kFloat, shape), x);
  return b.Select(IsNan(d, x), Fill(d, NAN, at::kFloat, shape), x);
}

// A sort whose keys fit 32 bits sorts one int64 per element: the key, made
// order-preserving as a signed integer, above the element's position. All
// packed values differ, so their plain order is the stable sort's, and XLA's
// CPU sort of one integer operand with a plain comparison runs 4-5x faster
// than of two operands with PyTorch's comparator (50257 float32: 2.2 ms
// against 9.4-15). Float keys are FloatSortKey's; their bits, negative
// ones with all but the sign flipped, order as the floats do.
// Descending takes the keys' complement (~k orders reversed, no overflow),
// with positions still ascending. The values are gathered from self by
// the positions (their own bits: -0.0, NaN payloads).
std::optional<std::tuple<at::Tensor, at::Tensor>> PackedSort(const at::Tensor& self, int64_t w, bool descending) {
  const at::ScalarType t = self.scalar_type();
  const bool floats = t == at::kFloat || at::isReducedFloatingType(t);
  const bool ints = t == at::kInt || t == at::kShort || t == at::kChar || t == at::kByte || t == at::kBool ||
                    t == at::kUInt16;
  if ((!floats && !ints) || self.size(w) >= (int64_t{1} << 31)) return std::nullopt;
  at::Tensor positions;
  {
    TraceScope s;
    const int d = DeviceIndex(self);
    ir::Builder& b = B(d);
    const auto shape = self.sizes().vec();
    ir::Value key;
    if (floats) {
      ir::Value bits = b.Bitcast(FloatSortKey(self), ir::DType::I32);
      ir::Value negative = b.Compare(ir::CompareDir::LT, bits, Fill(d, 0, at::kInt, shape));
      key = b.Select(negative, b.Binary(Op::Xor, bits, Fill(d, 2147483647.0, at::kInt, shape)), bits);
    } else {
      key = ValAs(self, at::kInt);
    }
    if (descending) key = b.Unary(Op::Not, key);
    ir::Value high = b.Binary(Op::ShiftLeft, b.Convert(key, ir::DType::I64), Fill(d, 32, at::kLong, shape));
    ir::Value packed = b.Binary(Op::Or, high, b.Iota({ir::DType::I64, shape}, w));
    // one row (a [1, n] batch of logits) sorted as 1-d: XLA's CPU sort took
    // twice as long over [1, 50257] as over [50257]
    const int64_t n = shape[static_cast<size_t>(w)];
    ir::Value sorted = self.numel() == n ? b.Reshape(b.Sort({b.Reshape(packed, {n})}, 0, false)[0], shape)
                                         : b.Sort({packed}, w, false)[0];
    positions = Wrap(b.Binary(Op::And, sorted, Fill(d, 4294967295.0, at::kLong, shape)), d);
  }
  return std::make_tuple(self.gather(w, positions), positions);
}

std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                               bool descending) {
  TORCH_CHECK(!self.is_complex(), " Sort does not support complex dtypes on CPU");  // the CPU's message
  if (self.dim() > 0 && self.numel() > 0) {
    if (auto r = PackedSort(self, WrapDim(dim, self.dim()), descending)) return *r;
  }
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  if (self.dim() == 0) return {Wrap(Val(self), d), Wrap(Fill(d, 0, at::kLong, {}), d)};
  const int64_t w = WrapDim(dim, self.dim());
  const auto shape = self.sizes().vec();
  auto r = b.Sort({Val(self), b.Iota({ir::DType::I64, shape}, w)}, w, descending);
  return {Wrap(r[0], d), Wrap(r[1], d)};
}
std::tuple<at::Tensor, at::Tensor> sort(const at::Tensor& self, int64_t dim, bool descending) {
  return sort_stable(self, true, dim, descending);
}

// topk of float rows (and of integers of 16 bits or fewer, exact as
// float32 keys: a uint8 topk of 16M elements took 3.8 s in the full sort,
// against the CPU's 0.4) through XLA's TopK (ir::TopKAttrs): a partial sort,
// where stablehlo.sort sorts the whole row. k = 50 of 50257 float32 logits
// (sampling over GPT-2's vocabulary): 9.2 ms with the sort, against the CPU's
// 0.08. FloatSortKey gives the sort's order (XLA's total order would put
// -NaN lowest and -0.0 below +0.0), negated for the smallest; TopK takes
// equal keys lowest index first, as the stable sort. The values are
// then read from self at those indices (a NaN's own bits).
std::tuple<at::Tensor, at::Tensor> TopKRows(const at::Tensor& self, int64_t k, int64_t w, bool largest) {
  const int64_t last = self.dim() - 1;
  const at::Tensor rows = w == last ? self : self.movedim(w, last);
  at::Tensor idx;
  {
    TraceScope s;
    const int d = DeviceIndex(rows);
    ir::Builder& b = B(d);
    // integers of 16 bits or fewer are exact in float32
    ir::Value key = at::isIntegralType(rows.scalar_type(), false) ? b.Convert(Val(rows), ir::DType::F32)
                                                                  : FloatSortKey(rows);
    if (!largest) key = b.Unary(Op::Neg, key);
    idx = Wrap(b.Convert(b.TopK(key, k)[1], ir::DType::I64), d);
  }
  at::Tensor values = rows.gather(last, idx);
  if (w == last) return {values, idx};
  return {values.movedim(last, w).contiguous(), idx.movedim(last, w).contiguous()};  // row-major, as the CPU's
}

std::tuple<at::Tensor, at::Tensor> topk(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  const int64_t w = WrapDim(dim, self.dim());
  TORCH_CHECK(k >= 0 && k <= (self.dim() ? self.size(w) : 1), "selected index k out of range");  // first, as the CPU
  TORCH_CHECK(self.scalar_type() != at::kBool, "topk does not support bool dtypes on CPU");
  TORCH_CHECK(!self.is_complex(), " topk does not support complex dtypes on CPU");
  // TopK where it is the faster (k = n sorted slower than the sort: 25 ms
  // against 15 for 50257 elements; k = n / 2, 5 ms)
  const at::ScalarType t = self.scalar_type();
  const bool f32_keys = t == at::kFloat || at::isReducedFloatingType(t) || t == at::kByte || t == at::kChar ||
                        t == at::kShort || t == at::kUInt16;
  if (f32_keys && self.dim() > 0 && k > 0 && 2 * k <= self.size(w)) return TopKRows(self, k, w, largest);
  auto [v, i] = sort_stable(self, true, w, largest);
  if (self.dim() == 0) return {v, i};
  return {v.narrow(w, 0, k).clone(), i.narrow(w, 0, k).clone()};
}

// median, nanmedian and kthvalue: the element at one position of the
// stably sorted row (NaN sorts last). median: the lower middle, or the first
// NaN when there is one (as the CPU); nanmedian: the lower middle of the
// non-NaN values; kthvalue: position k - 1. Among equal values the CPU's
// selection may report another one's index (its quickselect leaves that
// open); the values agree.
std::tuple<at::Tensor, at::Tensor> SortedAt(const at::Tensor& self, int64_t dim, bool keepdim, const char* op,
                                            const std::function<at::Tensor(const at::Tensor& valid, int64_t n)>& position) {
  // the CPU's order: a 0-d input is its own answer, then the empty dim, then the dtype
  if (self.dim() == 0) return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  const int64_t w = WrapDim(dim, self.dim());
  TORCH_CHECK_INDEX(self.size(w) > 0, op, "(): Expected reduction dim ", w, " to have non-zero size.");
  CheckNotBool(self.scalar_type(), std::string(op) == "kthvalue" ? "kthvalue_cpu" : "median_out");
  CheckNotComplex(self.scalar_type(), std::string(op) == "kthvalue" ? "kthvalue_cpu" : "median_out");
  auto [v, i] = sort_stable(self, true, w, false);
  const int64_t n = self.size(w);
  at::Tensor valid = at::isFloatingType(self.scalar_type()) ? self.isnan().logical_not().sum(w, true)
                                                            : at::full_like(self.narrow(w, 0, 1), n, self.options().dtype(at::kLong));
  at::Tensor pos = position(valid, n);
  at::Tensor vals = v.gather(w, pos), idx = i.gather(w, pos);
  if (!keepdim) return {vals.squeeze(w), idx.squeeze(w)};
  return {vals, idx};
}
std::tuple<at::Tensor, at::Tensor> median_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  return SortedAt(self, dim, keepdim, "median", [](const at::Tensor& valid, int64_t n) {
    return at::where(valid < n, valid, at::full_like(valid, (n - 1) / 2));
  });
}
std::tuple<at::Tensor, at::Tensor> nanmedian_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  return SortedAt(self, dim, keepdim, "nanmedian", [](const at::Tensor& valid, int64_t) {
    return at::where(valid > 0, at::floor_divide(valid - 1, 2), at::zeros_like(valid));
  });
}
// The whole tensor's median: NaN when it is empty, as the CPU.
at::Tensor MedianAll(const at::Tensor& self, bool ignore_nan) {
  if (self.numel() == 0) return at::full({}, NAN, self.options().dtype(at::kFloat)).to(self.scalar_type());  // as the CPU: NaN, cast
  CheckNotBool(self.scalar_type(), "median_cpu");
  CheckNotComplex(self.scalar_type(), "median_cpu");
  at::Tensor flat = self.reshape({-1});
  return std::get<0>(ignore_nan ? nanmedian_dim(flat, 0, false) : median_dim(flat, 0, false));
}
at::Tensor median_all(const at::Tensor& self) { return MedianAll(self, false); }
at::Tensor nanmedian_all(const at::Tensor& self) { return MedianAll(self, true); }
std::tuple<at::Tensor, at::Tensor> kthvalue(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  const int64_t w = WrapDim(dim, std::max<int64_t>(self.dim(), 1));
  const int64_t n = self.dim() ? self.size(w) : 1;
  TORCH_CHECK_INDEX(n > 0, "kthvalue(): Expected reduction dim ", w, " to have non-zero size.");
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", w);
  return SortedAt(self, dim, keepdim, "kthvalue",
                  [k](const at::Tensor& valid, int64_t) { return at::full_like(valid, k - 1); });
}

// mode: in the stably sorted row, the longest run of equal values (NaN
// equals nothing), the first of the longest (the smallest value) on a tie,
// as the CPU; reported at the run's last element, which carries the largest
// index of that value. The CPU's index is the last of its unstable sort's
// run: the same for rows of up to 16 without NaN (insertion sort), any
// occurrence of the value beyond.
std::tuple<at::Tensor, at::Tensor> mode(const at::Tensor& self, int64_t dim, bool keepdim) {
  if (self.dim() == 0) return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  const int64_t w = WrapDim(dim, self.dim());
  TORCH_CHECK_INDEX(self.size(w) > 0, "mode(): Expected reduction dim ", w, " to have non-zero size.");
  CheckNotComplex(self.scalar_type(), "mode_cpu");
  auto [v, i] = sort_stable(self, true, w, false);
  const int64_t n = self.size(w);
  std::vector<int64_t> along(static_cast<size_t>(self.dim()), 1);
  along[static_cast<size_t>(w)] = n;
  at::Tensor pos = at::arange(n, self.options().dtype(at::kLong)).view(along);
  // Runs of equal values; each NaN is a run of its own (NaN != NaN, as in
  // the CPU's scan), sorted last (docs/semantics.md: where the CPU's
  // std::sort leaves NaNs decides its answer there).
  at::Tensor starts = at::cat({at::ones_like(v.narrow(w, 0, 1), self.options().dtype(at::kBool)),
                               v.narrow(w, 1, n - 1).ne(v.narrow(w, 0, n - 1))},
                              w);
  at::Tensor run_start = std::get<0>(at::where(starts, pos, 0).cummax(w));
  at::Tensor best = (pos - run_start).argmax(w, true);
  at::Tensor vals = v.gather(w, best), idx = i.gather(w, best);
  if (!keepdim) return {vals.squeeze(w), idx.squeeze(w)};
  return {vals, idx};
}

// arange: the CPU's size (at::native::compute_arange_size, which truncates
// an integer range's start, end and step first) and its arithmetic, start +
// step * i in the output's accumulate type (int64 for integers, double for
// float, float for half types). The CPU's vectorized body adds i * step to a
// block's first element, so a float or double result may differ from it in
// the last bit.
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  const at::ScalarType t = out.scalar_type();
  int64_t n = 0;
  at::Scalar lo, st;
  at::ScalarType ct = at::kDouble;
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t, "arange", [&] {
    using acc_t = at::acc_type<scalar_t, false>;
    n = at::native::compute_arange_size<scalar_t>(start, end, step);
    lo = at::Scalar(start.to<acc_t>());
    st = at::Scalar(step.to<acc_t>());
    ct = c10::CppTypeToScalarType<acc_t>::value;
  });
  if (out.numel() != n) {
    if (out.numel() > 0) {  // the CPU's warning
      TORCH_WARN("The number of elements in the out tensor of shape ", out.sizes(), " is ", out.numel(),
                 " which does not match the computed number of elements ", n,
                 ". Note that this may occur as a result of rounding error. The out tensor will be resized to a "
                 "tensor of shape (", n, ",).");
    }
    out.resize_({n});
  }
  if (n == 0) return out;
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  ir::Value iota = b.Iota({ToIr(ct), {n}}, 0);
  ir::Value v = b.Binary(Op::Add, Number(d, lo, ct, {n}), b.Binary(Op::Mul, Number(d, st, ct, {n}), iota));
  Assign(out, b.Reshape(v, out.sizes().vec()));  // an out of n elements keeps its shape, as on the CPU
  return out;
}

at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims) {
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  std::vector<int64_t> ds;
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(self.dim(), 1)));
  for (int64_t x : dims) {
    const int64_t w = WrapDim(x, self.dim());
    TORCH_CHECK(!seen[static_cast<size_t>(w)], "dim ", w, " appears multiple times in the list of dims");
    seen[static_cast<size_t>(w)] = true;
    if (self.dim() > 0 && self.size(w) > 1) ds.push_back(w);
  }
  std::sort(ds.begin(), ds.end());
  ir::Value v = b.Reverse(Val(self), ds);
  return Wrap(v, d);
}

// roll: per dimension, the last `shift` elements moved to the front (two
// slices concatenated); no dims rolls the flattened tensor.
at::Tensor roll(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "`shifts` required");
  TORCH_CHECK(dims.empty() ? shifts.size() == 1 : shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ",
              shifts.size(), ", dims:", dims.size());
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  if (dims.empty()) {
    at::Tensor flat = tpj::aten::roll(self.reshape({-1}), shifts, {0});
    return Wrap(b.Reshape(Val(flat), self.sizes().vec()), d);
  }
  ir::Value v = Val(self);
  const auto shape = self.sizes().vec();
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t w = WrapDim(dims[i], self.dim());
    const int64_t n = shape[w];
    if (n == 0) continue;
    const int64_t k = ((shifts[i] % n) + n) % n;
    if (k == 0) continue;
    std::vector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1), mid_lo(zeros), mid_hi(shape);
    mid_hi[w] = n - k;
    mid_lo[w] = n - k;
    ir::Value head = b.Slice(v, zeros, mid_hi, ones);
    ir::Value tail = b.Slice(v, mid_lo, shape, ones);
    v = b.Concatenate({tail, head}, w);
  }
  return Wrap(v, d);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  K("embedding_backward", embedding_backward_autograd);
  K("index_put_", index_put_autograd);
  K("one_hot", one_hot_autograd);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("cat", cat);
  K("index_select", index_select);
  K("gather", gather);
  K("scatter_add", scatter_add);
  K("scatter_reduce.two", scatter_reduce);
  K("median.dim", median_dim);
  K("median", median_all);
  K("nanmedian.dim", nanmedian_dim);
  K("nanmedian", nanmedian_all);
  K("mode", mode);
  K("kthvalue", kthvalue);
  K("take", take);
  K("put_", put_);
  K("unfold_backward", unfold_backward);
  K("channel_shuffle", channel_shuffle);
  K("native_channel_shuffle", channel_shuffle);
  K("scatter.reduce", scatter_src_reduce);
  K("scatter.value_reduce", scatter_value_reduce);
  K("index_reduce", index_reduce);
  K("index_copy", index_copy);
  K("index_fill.int_Scalar", index_fill_scalar);
  K("index_fill.int_Tensor", index_fill_tensor);
  K("index_copy_", index_copy_);
  K("roll", roll);
  K("scatter_add_", scatter_add_);
  K("scatter.src", scatter_src);
  K("scatter.value", scatter_value);
  K("scatter_.src", scatter_src_);
  K("scatter_.value", scatter_value_);
  K("index_add", index_add);
  K("index_add_", index_add_);
  K("index.Tensor", index_tensor);
  K("index_put_", index_put_);
  K("index_put", index_put);
  K("_index_put_impl_", index_put_impl_);
  K("embedding_dense_backward", embedding_dense_backward);
  K("embedding_backward", embedding_backward);
  K("embedding_renorm_", embedding_renorm_);
  K("tril", tril);
  K("triu", triu);
  K("tril_", tril_);
  K("triu_", triu_);
  TPJ_LAID(m, "constant_pad_nd", kInput, constant_pad_nd);
  K("sort.stable", sort_stable);
  K("sort", sort);
  K("topk", topk);
  K("arange.start_out", arange_out);
  K("flip", flip);
}
