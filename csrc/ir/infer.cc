#include "ir/infer.h"

#include <algorithm>
#include <sstream>

namespace tpj::ir {
namespace {

std::string List(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

[[noreturn]] void Fail(Op op, const std::vector<Shape>& in, const std::string& why) {
  std::ostringstream os;
  os << OpName(op) << " (" << MlirOpName(op) << ") with operand";
  os << (in.size() == 1 ? " " : "s ");
  for (size_t i = 0; i < in.size(); ++i) os << (i ? ", " : "") << in[i].ToString();
  os << ": " << why;
  throw Error(os.str());
}

void Arity(Op op, const std::vector<Shape>& in, size_t n) {
  if (in.size() != n) {
    Fail(op, in, "takes " + std::to_string(n) + " operand(s), got " + std::to_string(in.size()));
  }
}

void SameType(Op op, const std::vector<Shape>& in, size_t a, size_t b) {
  if (in[a].dtype != in[b].dtype) {
    Fail(op, in, std::string("operands must have one dtype, got ") + Name(in[a].dtype) + " and " +
                     Name(in[b].dtype));
  }
}

void Scalar(Op op, const std::vector<Shape>& in, size_t i, const char* what) {
  if (in[i].rank() != 0) Fail(op, in, std::string(what) + " must be a 0-d tensor");
}

void Dim(Op op, const std::vector<Shape>& in, int64_t d, int64_t rank, const char* what) {
  if (d < 0 || d >= rank) {
    Fail(op, in, std::string(what) + " " + std::to_string(d) + " is out of range for rank " +
                     std::to_string(rank));
  }
}

void UniqueDims(Op op, const std::vector<Shape>& in, const std::vector<int64_t>& dims,
                int64_t rank, const char* what) {
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t d : dims) {
    Dim(op, in, d, rank, what);
    if (seen[d]) Fail(op, in, std::string(what) + " " + List(dims) + " repeats " + std::to_string(d));
    seen[d] = true;
  }
}

void Length(Op op, const std::vector<Shape>& in, const std::vector<int64_t>& v, int64_t n,
            const char* what) {
  if (static_cast<int64_t>(v.size()) != n) {
    Fail(op, in, std::string(what) + " " + List(v) + " needs " + std::to_string(n) + " entries");
  }
}

// The attributes of `op`, or a failure when they belong to another op.
template <class A>
const A& Get(Op op, const std::vector<Shape>& in, const Attrs& attrs) {
  const A* a = std::get_if<A>(&attrs);
  if (!a) Fail(op, in, "has the attributes of another op");
  return *a;
}

// Output size of one windowed dimension (reduce_window, convolution).
int64_t WindowOut(Op op, const std::vector<Shape>& in, int64_t size, int64_t base_dil,
                  int64_t low, int64_t high, int64_t window, int64_t win_dil, int64_t stride) {
  if (base_dil < 1 || win_dil < 1 || stride < 1 || window < 1) {
    Fail(op, in, "window sizes, strides and dilations must be >= 1");
  }
  const int64_t dilated = size == 0 ? 0 : (size - 1) * base_dil + 1;
  const int64_t padded = dilated + low + high;
  const int64_t dwin = (window - 1) * win_dil + 1;
  if (padded < dwin) return 0;
  return (padded - dwin) / stride + 1;
}

struct Windowed {
  const std::vector<int64_t>& window;
  const std::vector<int64_t>& strides;
  const std::vector<int64_t>& base;
  const std::vector<int64_t>& wdil;
  const std::vector<int64_t>& low;
  const std::vector<int64_t>& high;
};

std::vector<int64_t> WindowShape(Op op, const std::vector<Shape>& in, const Shape& x,
                                 const Windowed& w) {
  const int64_t r = x.rank();
  Length(op, in, w.window, r, "window dimensions");
  Length(op, in, w.strides, r, "window strides");
  Length(op, in, w.low, r, "padding low");
  Length(op, in, w.high, r, "padding high");
  if (!w.base.empty()) Length(op, in, w.base, r, "base dilations");
  if (!w.wdil.empty()) Length(op, in, w.wdil, r, "window dilations");
  std::vector<int64_t> out(r);
  for (int64_t i = 0; i < r; ++i) {
    out[i] = WindowOut(op, in, x.dims[i], w.base.empty() ? 1 : w.base[i], w.low[i], w.high[i],
                       w.window[i], w.wdil.empty() ? 1 : w.wdil[i], w.strides[i]);
  }
  return out;
}

void CheckForm(Op op, const std::vector<Shape>& in) {
  const OpForm form = Form(op);
  const bool binary = form == OpForm::kBinary || form == OpForm::kLogical;
  Arity(op, in, binary ? 2 : 1);
  if (binary) {
    SameType(op, in, 0, 1);
    if (in[0].dims != in[1].dims) {
      Fail(op, in, "operands must have one shape (broadcast explicitly with BroadcastInDim)");
    }
  }
  const DType t = in[0].dtype;
  switch (form) {
    case OpForm::kFloatUnary:
      if (!IsFloat(t) && !IsComplex(t)) Fail(op, in, "needs a floating-point or complex operand");
      break;
    case OpForm::kRealFloatUnary:
      if (!IsFloat(t)) Fail(op, in, "needs a floating-point operand");
      break;
    case OpForm::kLogical:
    case OpForm::kLogicalUnary:
      if (t != DType::Bool && !IsInteger(t)) Fail(op, in, "needs boolean or integer operands");
      break;
    case OpForm::kUnary:
      if (t == DType::Bool) Fail(op, in, "needs a numeric operand, not bool");
      if (op == Op::Abs && IsUnsignedInt(t)) Fail(op, in, "is not defined for unsigned integers");
      break;
    case OpForm::kBinary:
      if (t == DType::Bool && op != Op::Add && op != Op::Mul && op != Op::Max && op != Op::Min) {
        Fail(op, in, "needs numeric operands, not bool");
      }
      if ((op == Op::Atan2) && !IsFloat(t) && !IsComplex(t)) {
        Fail(op, in, "needs floating-point operands");
      }
      if (op == Op::Rem && IsComplex(t)) Fail(op, in, "has no complex form in XLA (its CPU compiler crashes on one)");
      break;
    case OpForm::kSpecial:
      break;
  }
}

// Size of each replica group; all groups must be non-empty and equal.
size_t GroupSize(const std::vector<std::vector<int64_t>>& groups, Op op, const std::vector<Shape>& in) {
  if (groups.empty()) Fail(op, in, "needs replica groups");
  const size_t n = groups[0].size();
  for (const auto& g : groups) {
    if (g.size() != n || g.empty()) Fail(op, in, "replica groups must be non-empty and equal in size");
  }
  return n;
}

std::vector<Shape> InferConvolution(Op op, const std::vector<Shape>& in, const ConvolutionAttrs& a) {
  Arity(op, in, 2);
  SameType(op, in, 0, 1);
  const Shape& x = in[0];
  const Shape& k = in[1];
  const ConvDims& c = a.dims;
  const int64_t r = x.rank();
  const int64_t ns = r - 2;
  if (k.rank() != r) Fail(op, in, "input and kernel must have one rank");
  if (static_cast<int64_t>(c.in_spatial.size()) != ns || static_cast<int64_t>(c.k_spatial.size()) != ns ||
      static_cast<int64_t>(c.out_spatial.size()) != ns) {
    Fail(op, in, "dimension numbers need " + std::to_string(ns) + " spatial dimensions");
  }
  std::vector<int64_t> in_dims = c.in_spatial;
  in_dims.push_back(c.in_batch);
  in_dims.push_back(c.in_feature);
  UniqueDims(op, in, in_dims, r, "input dimension");
  std::vector<int64_t> k_dims = c.k_spatial;
  k_dims.push_back(c.k_out);
  k_dims.push_back(c.k_in);
  UniqueDims(op, in, k_dims, r, "kernel dimension");
  std::vector<int64_t> o_dims = c.out_spatial;
  o_dims.push_back(c.out_batch);
  o_dims.push_back(c.out_feature);
  UniqueDims(op, in, o_dims, r, "output dimension");
  Length(op, in, a.window_strides, ns, "window strides");
  Length(op, in, a.padding_low, ns, "padding low");
  Length(op, in, a.padding_high, ns, "padding high");
  Length(op, in, a.lhs_dilation, ns, "lhs dilation");
  Length(op, in, a.rhs_dilation, ns, "rhs dilation");
  const int64_t fg = a.feature_group_count, bg = a.batch_group_count;
  if (fg < 1 || bg < 1) Fail(op, in, "group counts must be >= 1");
  const int64_t in_f = x.dims[c.in_feature];
  const int64_t k_in = k.dims[c.k_in];
  const int64_t k_out = k.dims[c.k_out];
  if (in_f != k_in * fg) {
    Fail(op, in, "input features (" + std::to_string(in_f) + ") must equal kernel input features (" +
                     std::to_string(k_in) + ") x feature_group_count (" + std::to_string(fg) + ")");
  }
  if (k_out % fg != 0 || k_out % bg != 0) Fail(op, in, "kernel output features must divide by the group counts");
  if (x.dims[c.in_batch] % bg != 0) Fail(op, in, "batch must divide by batch_group_count");
  std::vector<int64_t> out(r);
  out[c.out_batch] = x.dims[c.in_batch] / bg;
  out[c.out_feature] = k_out;
  for (int64_t i = 0; i < ns; ++i) {
    out[c.out_spatial[i]] =
        WindowOut(op, in, x.dims[c.in_spatial[i]], a.lhs_dilation[i], a.padding_low[i], a.padding_high[i],
                  k.dims[c.k_spatial[i]], a.rhs_dilation[i], a.window_strides[i]);
  }
  if (a.f32_result && x.dtype != DType::F16 && x.dtype != DType::BF16) {
    Fail(op, in, "a float32 result is for float16 or bfloat16 operands");
  }
  return {Shape{a.f32_result ? DType::F32 : x.dtype, out}};
}

std::vector<Shape> InferGather(Op op, const std::vector<Shape>& in, const GatherAttrs& a) {
  Arity(op, in, 2);
  const Shape& x = in[0];
  const Shape& idx = in[1];
  const GatherDims& g = a.dims;
  const std::vector<int64_t>& sizes = a.slice_sizes;
  if (!IsInteger(idx.dtype)) Fail(op, in, "indices must be integers");
  Length(op, in, sizes, x.rank(), "slice sizes");
  if (g.index_vector_dim < 0 || g.index_vector_dim > idx.rank()) Fail(op, in, "index_vector_dim out of range");
  const int64_t index_len = g.index_vector_dim == idx.rank() ? 1 : idx.dims[g.index_vector_dim];
  Length(op, in, g.start_index_map, index_len, "start_index_map");
  UniqueDims(op, in, g.start_index_map, x.rank(), "start_index_map entry");
  UniqueDims(op, in, g.collapsed_slice_dims, x.rank(), "collapsed slice dim");
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (sizes[i] < 0 || sizes[i] > x.dims[i]) Fail(op, in, "slice size " + List(sizes) + " exceeds the operand");
  }
  for (int64_t d : g.collapsed_slice_dims) {
    if (sizes[d] > 1) Fail(op, in, "collapsed slice dims must have slice size 1");
  }
  std::vector<int64_t> batch;
  for (int64_t i = 0; i < idx.rank(); ++i) {
    if (i != g.index_vector_dim) batch.push_back(idx.dims[i]);
  }
  std::vector<int64_t> offsets;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (std::find(g.collapsed_slice_dims.begin(), g.collapsed_slice_dims.end(), i) ==
        g.collapsed_slice_dims.end()) {
      offsets.push_back(sizes[i]);
    }
  }
  if (offsets.size() != g.offset_dims.size()) {
    Fail(op, in, "offset_dims " + List(g.offset_dims) + " must list " +
                     std::to_string(offsets.size()) + " dims (operand rank minus collapsed dims)");
  }
  const int64_t rank = static_cast<int64_t>(batch.size() + offsets.size());
  UniqueDims(op, in, g.offset_dims, rank, "offset dim");
  std::vector<int64_t> out(rank);
  size_t bi = 0, oi = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (std::find(g.offset_dims.begin(), g.offset_dims.end(), i) != g.offset_dims.end()) {
      out[i] = offsets[oi++];
    } else {
      out[i] = batch[bi++];
    }
  }
  return {Shape{x.dtype, out}};
}

std::vector<Shape> InferScatter(Op op, const std::vector<Shape>& in, const ScatterAttrs& a) {
  Arity(op, in, 3);
  const Shape& x = in[0];
  const Shape& idx = in[1];
  const Shape& upd = in[2];
  const ScatterDims& s = a.dims;
  if (!IsInteger(idx.dtype)) Fail(op, in, "indices must be integers");
  SameType(op, in, 0, 2);
  if (static_cast<int64_t>(s.update_window_dims.size() + s.inserted_window_dims.size()) != x.rank()) {
    Fail(op, in, "update_window_dims and inserted_window_dims must together cover the operand rank");
  }
  UniqueDims(op, in, s.inserted_window_dims, x.rank(), "inserted window dim");
  if (s.index_vector_dim < 0 || s.index_vector_dim > idx.rank()) Fail(op, in, "index_vector_dim out of range");
  const int64_t index_len = s.index_vector_dim == idx.rank() ? 1 : idx.dims[s.index_vector_dim];
  Length(op, in, s.scatter_dims_to_operand_dims, index_len, "scatter_dims_to_operand_dims");
  UniqueDims(op, in, s.scatter_dims_to_operand_dims, x.rank(), "scatter_dims_to_operand_dims entry");
  const int64_t scatter_rank = idx.rank() - (s.index_vector_dim < idx.rank() ? 1 : 0);
  if (upd.rank() != scatter_rank + static_cast<int64_t>(s.update_window_dims.size())) {
    Fail(op, in, "updates rank must be the index batch rank plus the window rank");
  }
  UniqueDims(op, in, s.update_window_dims, upd.rank(), "update window dim");
  return {x};
}

// The float type of a complex type's real and imaginary parts.
DType PartType(DType t) { return t == DType::C128 ? DType::F64 : DType::F32; }

std::vector<Shape> InferFft(Op op, const std::vector<Shape>& in, const FftAttrs& a) {
  Arity(op, in, 1);
  const Shape& x = in[0];
  const std::vector<int64_t>& len = a.fft_length;
  const int64_t n = static_cast<int64_t>(len.size());
  if (n < 1 || n > 3) Fail(op, in, "fft_length " + List(len) + " needs 1 to 3 entries");
  if (x.rank() < n) Fail(op, in, "fft_length " + List(len) + " has more entries than the operand has dims");
  for (int64_t l : len) {
    if (l < 1) Fail(op, in, "fft_length " + List(len) + " entries must be >= 1");
  }
  const bool real_in = a.type == FftType::RFFT;
  if (real_in ? !(x.dtype == DType::F32 || x.dtype == DType::F64) : !IsComplex(x.dtype)) {
    Fail(op, in, std::string(FftTypeName(a.type)) + " needs a " +
                     (real_in ? "float32 or float64" : "complex") + " operand");
  }
  Shape out = x;
  const int64_t first = x.rank() - n;
  for (int64_t i = 0; i < n; ++i) {
    const bool last = i == n - 1;
    const int64_t want = a.type == FftType::IRFFT && last ? len[i] / 2 + 1 : len[i];
    if (x.dims[first + i] != want) {
      Fail(op, in, "trailing dims must match fft_length " + List(len) + " (" + FftTypeName(a.type) +
                       (a.type == FftType::IRFFT ? ": the last one is fft_length.back() / 2 + 1)" : ")"));
    }
  }
  switch (a.type) {
    case FftType::FFT:
    case FftType::IFFT:
      break;
    case FftType::RFFT:
      out.dtype = x.dtype == DType::F64 ? DType::C128 : DType::C64;
      out.dims.back() = len.back() / 2 + 1;
      break;
    case FftType::IRFFT:
      out.dtype = PartType(x.dtype);
      out.dims.back() = len.back();
      break;
  }
  return {out};
}

}  // namespace

std::vector<Shape> InferResults(Op op, const std::vector<Shape>& in, const Attrs& attrs) {
  if (Form(op) != OpForm::kSpecial) {
    CheckForm(op, in);
    if (op == Op::Abs && IsComplex(in[0].dtype)) return {Shape{PartType(in[0].dtype), in[0].dims}};
    return {in[0]};
  }
  switch (op) {
    case Op::Convert:
    case Op::BitcastConvert:
      Arity(op, in, 1);
      return {in[0]};  // dtype set by the builder
    case Op::IsFinite:
      Arity(op, in, 1);
      if (!IsFloat(in[0].dtype)) Fail(op, in, "needs a floating-point operand");
      return {Shape{DType::Bool, in[0].dims}};
    case Op::Compare: {
      const CompareDir dir = Get<CompareAttrs>(op, in, attrs).direction;
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      if (in[0].dims != in[1].dims) Fail(op, in, "operands must have one shape");
      if (IsComplex(in[0].dtype) && dir != CompareDir::EQ && dir != CompareDir::NE) {
        Fail(op, in, "complex numbers only compare for (in)equality");
      }
      return {Shape{DType::Bool, in[0].dims}};
    }
    case Op::Select:
      Arity(op, in, 3);
      if (in[0].dtype != DType::Bool) Fail(op, in, "predicate must be bool");
      SameType(op, in, 1, 2);
      if (in[1].dims != in[2].dims) Fail(op, in, "branches must have one shape");
      if (in[0].rank() != 0 && in[0].dims != in[1].dims) Fail(op, in, "predicate must be 0-d or match the branches");
      return {in[1]};
    case Op::Clamp:
      Arity(op, in, 3);
      SameType(op, in, 0, 1);
      SameType(op, in, 1, 2);
      for (size_t i : {size_t{0}, size_t{2}}) {
        if (in[i].rank() != 0 && in[i].dims != in[1].dims) Fail(op, in, "bounds must be 0-d or match the operand");
      }
      return {in[1]};
    case Op::BroadcastInDim: {
      const auto& a = Get<BroadcastInDimAttrs>(op, in, attrs);
      Arity(op, in, 1);
      const Shape& x = in[0];
      const int64_t r = static_cast<int64_t>(a.result_dims.size());
      Length(op, in, a.broadcast_dimensions, x.rank(), "broadcast_dimensions");
      UniqueDims(op, in, a.broadcast_dimensions, r, "broadcast dimension");
      for (int64_t i = 0; i < x.rank(); ++i) {
        const int64_t to = a.result_dims[a.broadcast_dimensions[i]];
        if (x.dims[i] != 1 && x.dims[i] != to) {
          Fail(op, in, "cannot broadcast dim " + std::to_string(i) + " of size " +
                           std::to_string(x.dims[i]) + " to size " + std::to_string(to) +
                           " (result dims " + List(a.result_dims) + ")");
        }
      }
      for (int64_t d : a.result_dims) {
        if (d < 0) Fail(op, in, "result dims must be >= 0");
      }
      return {Shape{x.dtype, a.result_dims}};
    }
    case Op::Reshape: {
      const std::vector<int64_t>& dims = Get<ReshapeAttrs>(op, in, attrs).result_dims;
      Arity(op, in, 1);
      Shape out{in[0].dtype, dims};
      for (int64_t d : dims) {
        if (d < 0) Fail(op, in, "result dims " + List(dims) + " must be >= 0");
      }
      if (out.numel() != in[0].numel()) {
        Fail(op, in, "cannot reshape " + std::to_string(in[0].numel()) + " elements to " + List(dims));
      }
      return {out};
    }
    case Op::Transpose: {
      const std::vector<int64_t>& perm = Get<TransposeAttrs>(op, in, attrs).permutation;
      Arity(op, in, 1);
      Length(op, in, perm, in[0].rank(), "permutation");
      UniqueDims(op, in, perm, in[0].rank(), "permutation entry");
      std::vector<int64_t> out(perm.size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = in[0].dims[perm[i]];
      return {Shape{in[0].dtype, out}};
    }
    case Op::Reverse:
      Arity(op, in, 1);
      UniqueDims(op, in, Get<ReverseAttrs>(op, in, attrs).dimensions, in[0].rank(), "reverse dimension");
      return {in[0]};
    case Op::Slice: {
      const auto& a = Get<SliceAttrs>(op, in, attrs);
      Arity(op, in, 1);
      const Shape& x = in[0];
      Length(op, in, a.starts, x.rank(), "start indices");
      Length(op, in, a.limits, x.rank(), "limit indices");
      Length(op, in, a.strides, x.rank(), "strides");
      std::vector<int64_t> out(x.rank());
      for (int64_t i = 0; i < x.rank(); ++i) {
        if (a.starts[i] < 0 || a.starts[i] > a.limits[i] || a.limits[i] > x.dims[i] || a.strides[i] < 1) {
          Fail(op, in, "slice " + List(a.starts) + " to " + List(a.limits) + " step " +
                           List(a.strides) + " is out of bounds");
        }
        out[i] = (a.limits[i] - a.starts[i] + a.strides[i] - 1) / a.strides[i];
      }
      return {Shape{x.dtype, out}};
    }
    case Op::DynamicSlice: {
      const std::vector<int64_t>& sizes = Get<DynamicSliceAttrs>(op, in, attrs).slice_sizes;
      const Shape& x = in.at(0);
      Arity(op, in, 1 + x.rank());
      Length(op, in, sizes, x.rank(), "slice sizes");
      for (int64_t i = 0; i < x.rank(); ++i) {
        Scalar(op, in, 1 + i, "start index");
        if (!IsInteger(in[1 + i].dtype)) Fail(op, in, "start indices must be integers");
        if (sizes[i] < 0 || sizes[i] > x.dims[i]) Fail(op, in, "slice sizes " + List(sizes) + " exceed the operand");
      }
      return {Shape{x.dtype, sizes}};
    }
    case Op::DynamicUpdateSlice: {
      const Shape& x = in.at(0);
      Arity(op, in, 2 + x.rank());
      SameType(op, in, 0, 1);
      if (in[1].rank() != x.rank()) Fail(op, in, "update must have the operand's rank");
      for (int64_t i = 0; i < x.rank(); ++i) {
        if (in[1].dims[i] > x.dims[i]) Fail(op, in, "update is larger than the operand");
        Scalar(op, in, 2 + i, "start index");
        if (!IsInteger(in[2 + i].dtype)) Fail(op, in, "start indices must be integers");
      }
      return {x};
    }
    case Op::Concatenate: {
      const int64_t dim = Get<ConcatenateAttrs>(op, in, attrs).dimension;
      if (in.empty()) Fail(op, in, "needs at least one operand");
      const Shape& x = in[0];
      Dim(op, in, dim, x.rank(), "dimension");
      std::vector<int64_t> out = x.dims;
      for (size_t i = 1; i < in.size(); ++i) {
        SameType(op, in, 0, i);
        if (in[i].rank() != x.rank()) Fail(op, in, "operands must have one rank");
        for (int64_t d = 0; d < x.rank(); ++d) {
          if (d != dim && in[i].dims[d] != x.dims[d]) {
            Fail(op, in, "operands differ outside dimension " + std::to_string(dim));
          }
        }
        out[dim] += in[i].dims[dim];
      }
      return {Shape{x.dtype, out}};
    }
    case Op::Pad: {
      const auto& a = Get<PadAttrs>(op, in, attrs);
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      Scalar(op, in, 1, "padding value");
      const Shape& x = in[0];
      Length(op, in, a.low, x.rank(), "edge_padding_low");
      Length(op, in, a.high, x.rank(), "edge_padding_high");
      Length(op, in, a.interior, x.rank(), "interior_padding");
      std::vector<int64_t> out(x.rank());
      for (int64_t i = 0; i < x.rank(); ++i) {
        if (a.interior[i] < 0) Fail(op, in, "interior padding must be >= 0");
        const int64_t d = x.dims[i];
        out[i] = a.low[i] + a.high[i] + d + std::max<int64_t>(d - 1, 0) * a.interior[i];
        if (out[i] < 0) Fail(op, in, "padding makes a negative dimension");
      }
      return {Shape{x.dtype, out}};
    }
    case Op::DotGeneral: {
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      const Shape& l = in[0];
      const Shape& r = in[1];
      const DotGeneralAttrs& a = Get<DotGeneralAttrs>(op, in, attrs);
      const DotDims& d = a.dims;
      if (a.f32_result && l.dtype != DType::F16 && l.dtype != DType::BF16) {
        Fail(op, in, "a float32 result is for float16 or bfloat16 operands");
      }
      if (d.lhs_batch.size() != d.rhs_batch.size() || d.lhs_contract.size() != d.rhs_contract.size()) {
        Fail(op, in, "batch and contracting dimension lists must pair up");
      }
      std::vector<int64_t> lused = d.lhs_batch, rused = d.rhs_batch;
      lused.insert(lused.end(), d.lhs_contract.begin(), d.lhs_contract.end());
      rused.insert(rused.end(), d.rhs_contract.begin(), d.rhs_contract.end());
      UniqueDims(op, in, lused, l.rank(), "lhs dimension");
      UniqueDims(op, in, rused, r.rank(), "rhs dimension");
      std::vector<int64_t> out;
      for (size_t i = 0; i < d.lhs_batch.size(); ++i) {
        if (l.dims[d.lhs_batch[i]] != r.dims[d.rhs_batch[i]]) Fail(op, in, "batch dimensions differ in size");
        out.push_back(l.dims[d.lhs_batch[i]]);
      }
      for (size_t i = 0; i < d.lhs_contract.size(); ++i) {
        if (l.dims[d.lhs_contract[i]] != r.dims[d.rhs_contract[i]]) {
          Fail(op, in, "contracting dimensions differ in size (" +
                           std::to_string(l.dims[d.lhs_contract[i]]) + " vs " +
                           std::to_string(r.dims[d.rhs_contract[i]]) + ")");
        }
      }
      for (int64_t i = 0; i < l.rank(); ++i) {
        if (std::find(lused.begin(), lused.end(), i) == lused.end()) out.push_back(l.dims[i]);
      }
      for (int64_t i = 0; i < r.rank(); ++i) {
        if (std::find(rused.begin(), rused.end(), i) == rused.end()) out.push_back(r.dims[i]);
      }
      return {Shape{a.f32_result ? DType::F32 : l.dtype, out}};
    }
    case Op::Reduce: {
      const std::vector<int64_t>& dims = Get<ReduceAttrs>(op, in, attrs).dimensions;
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      Scalar(op, in, 1, "init value");
      UniqueDims(op, in, dims, in[0].rank(), "reduce dimension");
      std::vector<int64_t> out;
      for (int64_t i = 0; i < in[0].rank(); ++i) {
        if (std::find(dims.begin(), dims.end(), i) == dims.end()) out.push_back(in[0].dims[i]);
      }
      return {Shape{in[0].dtype, out}};
    }
    case Op::ReduceWindow: {
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      Scalar(op, in, 1, "init value");
      const auto& a = Get<ReduceWindowAttrs>(op, in, attrs);
      Windowed w{a.window_dimensions, a.window_strides, a.base_dilations, a.window_dilations,
                 a.padding_low, a.padding_high};
      return {Shape{in[0].dtype, WindowShape(op, in, in[0], w)}};
    }
    case Op::SelectAndScatter: {
      Arity(op, in, 3);
      SameType(op, in, 0, 1);
      SameType(op, in, 0, 2);
      Scalar(op, in, 2, "init value");
      const auto& a = Get<SelectAndScatterAttrs>(op, in, attrs);
      static const std::vector<int64_t> kNone;
      Windowed w{a.window_dimensions, a.window_strides, kNone, kNone, a.padding_low, a.padding_high};
      if (WindowShape(op, in, in[0], w) != in[1].dims) {
        Fail(op, in, "source must have the shape of the operand's windows " +
                         List(WindowShape(op, in, in[0], w)));
      }
      return {in[0]};
    }
    case Op::Convolution:
      return InferConvolution(op, in, Get<ConvolutionAttrs>(op, in, attrs));
    case Op::Gather:
      return InferGather(op, in, Get<GatherAttrs>(op, in, attrs));
    case Op::Scatter:
      return InferScatter(op, in, Get<ScatterAttrs>(op, in, attrs));
    case Op::Sort: {
      const int64_t dim = Get<SortAttrs>(op, in, attrs).dimension;
      if (in.empty()) Fail(op, in, "needs at least one operand");
      Dim(op, in, dim, in[0].rank(), "dimension");
      for (const auto& s : in) {
        if (s.dims != in[0].dims) Fail(op, in, "operands must have one shape");
      }
      if (IsComplex(in[0].dtype)) Fail(op, in, "cannot sort by complex keys");
      return in;
    }
    case Op::TopK: {
      Arity(op, in, 1);
      const int64_t k = Get<TopKAttrs>(op, in, attrs).k;
      if (in[0].dtype != DType::F32) Fail(op, in, "needs float32 keys");
      if (in[0].rank() < 1) Fail(op, in, "needs at least one dimension");
      if (k < 1 || k > in[0].dims.back()) Fail(op, in, "k = " + std::to_string(k) + " is out of range");
      Shape values = in[0];
      values.dims.back() = k;
      Shape indices = values;
      indices.dtype = DType::I32;
      return {values, indices};
    }
    case Op::RngBitGenerator: {
      Arity(op, in, 1);
      if (in[0].dtype != DType::U64 || in[0].dims != std::vector<int64_t>{2}) {
        Fail(op, in, "state must be tensor<2xui64> (Threefry key and counter)");
      }
      return {in[0]};  // the bits shape is appended by the builder
    }
    case Op::AllReduce: {
      Arity(op, in, 1);
      GroupSize(Get<AllReduceAttrs>(op, in, attrs).replica_groups, op, in);
      return {in[0]};
    }
    case Op::AllGather: {
      const auto& a = Get<AllGatherAttrs>(op, in, attrs);
      Arity(op, in, 1);
      const size_t n = GroupSize(a.replica_groups, op, in);
      Dim(op, in, a.dimension, in[0].rank(), "all_gather dimension");
      Shape out = in[0];
      out.dims[a.dimension] *= static_cast<int64_t>(n);
      return {out};
    }
    case Op::ReduceScatter: {
      const auto& a = Get<ReduceScatterAttrs>(op, in, attrs);
      Arity(op, in, 1);
      const size_t n = GroupSize(a.replica_groups, op, in);
      Dim(op, in, a.dimension, in[0].rank(), "scatter dimension");
      Shape out = in[0];
      if (out.dims[a.dimension] % static_cast<int64_t>(n) != 0) {
        Fail(op, in, "scatter dimension size must divide by the group size " + std::to_string(n));
      }
      out.dims[a.dimension] /= static_cast<int64_t>(n);
      return {out};
    }
    case Op::Real:
    case Op::Imag:
      Arity(op, in, 1);
      if (!IsComplex(in[0].dtype)) Fail(op, in, "needs a complex operand");
      return {Shape{PartType(in[0].dtype), in[0].dims}};
    case Op::Complex:
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      if (in[0].dims != in[1].dims) Fail(op, in, "operands must have one shape");
      if (in[0].dtype != DType::F32 && in[0].dtype != DType::F64) Fail(op, in, "needs float32 or float64 parts");
      return {Shape{in[0].dtype == DType::F64 ? DType::C128 : DType::C64, in[0].dims}};
    case Op::Fft:
      return InferFft(op, in, Get<FftAttrs>(op, in, attrs));
    case Op::Cholesky: {
      Get<CholeskyAttrs>(op, in, attrs);
      Arity(op, in, 1);
      const Shape& a = in[0];
      if (!IsFloat(a.dtype) && !IsComplex(a.dtype)) Fail(op, in, "needs a floating-point or complex operand");
      if (a.rank() < 2 || a.dims[a.rank() - 1] != a.dims[a.rank() - 2]) {
        Fail(op, in, "needs square matrices in the last two dimensions");
      }
      return {a};
    }
    case Op::TriangularSolve: {
      const auto& t = Get<TriangularSolveAttrs>(op, in, attrs);
      Arity(op, in, 2);
      SameType(op, in, 0, 1);
      const Shape& a = in[0];
      const Shape& b = in[1];
      if (!IsFloat(a.dtype) && !IsComplex(a.dtype)) Fail(op, in, "needs floating-point or complex operands");
      const int64_t r = a.rank();
      if (r < 2 || a.dims[r - 1] != a.dims[r - 2]) Fail(op, in, "a must hold square matrices in its last two dimensions");
      if (b.rank() != r) Fail(op, in, "a and b must have one rank");
      for (int64_t i = 0; i < r - 2; ++i) {
        if (a.dims[i] != b.dims[i]) Fail(op, in, "a and b must have one batch shape");
      }
      const int64_t shared = t.left_side ? b.dims[r - 2] : b.dims[r - 1];
      if (shared != a.dims[r - 1]) {
        Fail(op, in, std::string("b's ") + (t.left_side ? "rows" : "columns") + " must match the size of a");
      }
      return {b};
    }
    case Op::CustomCall:
      Get<CustomCallAttrs>(op, in, attrs);
      return {};  // the builder sets the results
    case Op::Call: {
      const auto& call = Get<CallAttrs>(op, in, attrs);
      if (!call.body) Fail(op, in, "has no graph to call");
      const Graph& body = *call.body;
      if (in.size() != body.params.size()) {
        Fail(op, in, "needs one operand per parameter of the called graph (" + std::to_string(body.params.size()) + ")");
      }
      for (size_t i = 0; i < in.size(); ++i) {
        if (in[i] != body.nodes[static_cast<size_t>(body.params[i])].results[0]) {
          Fail(op, in, "operand " + std::to_string(i) + " must have the shape of the called graph's parameter, " +
                           body.nodes[static_cast<size_t>(body.params[i])].results[0].ToString());
        }
      }
      std::vector<Shape> out;
      out.reserve(body.outputs.size());
      for (Value v : body.outputs) out.push_back(body.shape(v));
      return out;
    }
    default:
      Fail(op, in, "has no inference rule");
  }
}

}  // namespace tpj::ir
