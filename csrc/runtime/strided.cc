#include "runtime/strided.h"

#include <algorithm>
#include <numeric>

namespace tpj::runtime {
namespace {

int64_t Numel(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

struct SlicePlan {
  bool ok = false;
  std::vector<int64_t> real;        // view dims with size > 1 and stride != 0, by stride desc
  std::vector<int64_t> base_dims;   // the flat value (padded) reshaped to these
  std::vector<int64_t> starts;      // slice start per base dim
  std::vector<int64_t> limits;      // slice limit per base dim
  std::vector<int64_t> radix;       // flat-index stride of each base dim
  int64_t padded = 0;               // flat length after padding
};

SlicePlan Plan(const StridedView& v, int64_t n) {
  SlicePlan p;
  for (size_t k = 0; k < v.sizes.size(); ++k) {
    if (v.sizes[k] > 1 && v.strides[k] != 0) p.real.push_back(static_cast<int64_t>(k));
    if (v.strides[k] < 0) return p;
  }
  std::stable_sort(p.real.begin(), p.real.end(),
                   [&](int64_t a, int64_t b) { return v.strides[a] > v.strides[b]; });
  const size_t m = p.real.size();
  std::vector<int64_t> t(m);
  for (size_t j = 0; j < m; ++j) t[j] = v.strides[p.real[j]];
  for (size_t j = 0; j + 1 < m; ++j) {
    if (t[j] == t[j + 1] || t[j] % t[j + 1] != 0) return p;  // overlap or odd strides
  }
  const int64_t inner = m ? t[m - 1] : 1;
  // Base dims: [outer, t0/t1, ..., t(m-2)/t(m-1), inner]; with m == 0 the view is
  // one element: base [outer, 1] with stride 1 is just the flat value.
  std::vector<int64_t> radix;  // base strides
  if (m) {
    radix = t;
  }
  if (inner > 1 || m == 0) radix.push_back(1);
  // Outer dim's stride: radix[0]. Offsets in mixed radix.
  std::vector<int64_t> coord(radix.size());
  int64_t o = v.offset;
  for (size_t j = 0; j < radix.size(); ++j) {
    coord[j] = o / radix[j];
    o %= radix[j];
  }
  std::vector<int64_t> extent(radix.size(), 1);
  for (size_t j = 0; j < m; ++j) extent[j] = v.sizes[p.real[j]];
  p.base_dims.resize(radix.size());
  for (size_t j = 1; j < radix.size(); ++j) {
    p.base_dims[j] = radix[j - 1] / radix[j];
    if (coord[j] + extent[j] > p.base_dims[j]) return p;  // index would carry
  }
  const int64_t outer_needed = coord[0] + extent[0];
  p.base_dims[0] = std::max<int64_t>(outer_needed, (n + radix[0] - 1) / radix[0]);
  p.padded = p.base_dims[0] * radix[0];
  p.starts = coord;
  p.radix = radix;
  p.limits.resize(coord.size());
  for (size_t j = 0; j < coord.size(); ++j) p.limits[j] = coord[j] + extent[j];
  p.ok = true;
  return p;
}

// Positions of p.real (sorted by stride) in view-dim order.
std::vector<int64_t> ToViewOrder(const std::vector<int64_t>& real) {
  std::vector<int64_t> order(real.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return real[a] < real[b]; });
  return order;  // order[k] = index in `real` of the k-th view dim among them
}

bool IsIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

ir::Value PadTo(ir::Builder& b, ir::Value flat, int64_t n, int64_t padded) {
  if (padded == n) return flat;
  const ir::DType t = b.shape(flat).dtype;
  return b.Pad(flat, b.ScalarConstant(t, 0), {0}, {padded - n}, {0});
}

// The plan's slice starts: constants, or with `offset` (an i64 scalar) the
// offset's digits in the base dims' mixed radix, the same divisions done in
// the program. The plan was made for the current offset, so its starts are
// in range and dynamic_slice / dynamic_update_slice do not clamp; another
// offset whose plan differs builds a different program.
std::vector<ir::Value> Starts(ir::Builder& b, const SlicePlan& p, const ir::Value* offset) {
  std::vector<ir::Value> starts;
  if (offset == nullptr) {
    for (int64_t s : p.starts) starts.push_back(b.ScalarConstant(ir::DType::I64, static_cast<double>(s)));
    return starts;
  }
  ir::Value rest = *offset;
  for (int64_t r : p.radix) {
    ir::Value radix = b.ScalarConstant(ir::DType::I64, static_cast<double>(r));
    starts.push_back(b.Binary(ir::Op::Div, rest, radix));
    rest = b.Binary(ir::Op::Rem, rest, radix);
  }
  return starts;
}

// i64 addresses of every view element, shape v.sizes; the offset from
// `offset` (an i64 scalar) when given.
ir::Value Addresses(ir::Builder& b, const StridedView& v, const ir::Value* offset) {
  ir::Value acc = offset != nullptr ? b.BroadcastInDim(*offset, v.sizes, {})
                                    : b.Full(ir::DType::I64, v.sizes, static_cast<double>(v.offset));
  for (size_t k = 0; k < v.sizes.size(); ++k) {
    if (v.sizes[k] <= 1 || v.strides[k] == 0) continue;
    ir::Value i = b.Iota({ir::DType::I64, v.sizes}, static_cast<int64_t>(k));
    ir::Value s = b.Full(ir::DType::I64, v.sizes, static_cast<double>(v.strides[k]));
    acc = b.Binary(ir::Op::Add, acc, b.Binary(ir::Op::Mul, i, s));
  }
  return acc;
}

}  // namespace

bool CoversStorage(const StridedView& v, int64_t storage_numel) {
  if (v.offset != 0 || Numel(v.sizes) != storage_numel) return false;
  int64_t expected = 1;
  for (size_t k = v.sizes.size(); k-- > 0;) {
    if (v.sizes[k] != 1 && v.strides[k] != expected) return false;
    expected *= v.sizes[k];
  }
  return true;
}

bool CoversStoragePermuted(const StridedView& v, int64_t storage_numel) {
  if (v.offset != 0 || Numel(v.sizes) != storage_numel) return false;
  std::vector<size_t> dims;
  for (size_t k = 0; k < v.sizes.size(); ++k) {
    if (v.sizes[k] != 1) dims.push_back(k);
  }
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return v.strides[a] < v.strides[b]; });
  int64_t expected = 1;
  for (size_t k : dims) {
    if (v.strides[k] != expected) return false;
    expected *= v.sizes[k];
  }
  return true;
}

ir::Value FlatOfCover(ir::Builder& b, const StridedView& v, ir::Value update) {
  // memory order: dims by decreasing stride (size-1 dims anywhere)
  std::vector<int64_t> perm(v.sizes.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t c) {
    const int64_t sa = v.sizes[a] == 1 ? 0 : v.strides[a], sc = v.sizes[c] == 1 ? 0 : v.strides[c];
    return sa > sc;
  });
  if (!IsIdentity(perm)) update = b.Transpose(update, perm);
  return b.Reshape(update, {Numel(v.sizes)});
}

bool UsesSlicePlan(const StridedView& v, int64_t storage_numel) {
  return Plan(v, storage_numel).ok;
}

ir::Value ReadStrided(ir::Builder& b, ir::Value flat, const StridedView& v, const ir::Value* offset) {
  const ir::Shape& fs = b.shape(flat);
  const int64_t n = fs.dims.at(0);
  if (Numel(v.sizes) == 0) return b.Full(fs.dtype, v.sizes, 0);
  if (CoversStorage(v, n)) return b.Reshape(flat, v.sizes);
  SlicePlan p = Plan(v, n);
  if (!p.ok) {
    ir::GatherDims g;
    g.collapsed_slice_dims = {0};
    g.start_index_map = {0};
    g.index_vector_dim = static_cast<int64_t>(v.sizes.size());
    return b.Gather(flat, Addresses(b, v, offset), g, {1});
  }
  ir::Value x = b.Reshape(PadTo(b, flat, n, p.padded), p.base_dims);
  if (offset != nullptr) {
    std::vector<int64_t> extents(p.starts.size());
    for (size_t j = 0; j < extents.size(); ++j) extents[j] = p.limits[j] - p.starts[j];
    x = b.DynamicSlice(x, Starts(b, p, offset), extents);
  } else {
    x = b.Slice(x, p.starts, p.limits, std::vector<int64_t>(p.starts.size(), 1));
  }
  std::vector<int64_t> sorted_sizes;
  for (int64_t d : p.real) sorted_sizes.push_back(v.sizes[d]);
  x = b.Reshape(x, sorted_sizes);
  const std::vector<int64_t> perm = ToViewOrder(p.real);
  if (!IsIdentity(perm)) x = b.Transpose(x, perm);
  std::vector<int64_t> real_sorted_by_dim = p.real;
  std::sort(real_sorted_by_dim.begin(), real_sorted_by_dim.end());
  return b.BroadcastInDim(x, v.sizes, real_sorted_by_dim);
}

ir::Value WriteStrided(ir::Builder& b, ir::Value flat, const StridedView& v, ir::Value update,
                       const ir::Value* offset) {
  const ir::Shape& fs = b.shape(flat);
  const int64_t n = fs.dims.at(0);
  for (size_t k = 0; k < v.sizes.size(); ++k) {
    if (v.sizes[k] > 1 && v.strides[k] == 0) {
      throw ir::Error(
          "cannot write through an expanded view: several of its elements are one storage element "
          "(clone() the tensor before writing to it)");
    }
  }
  if (Numel(v.sizes) == 0) return flat;
  if (CoversStorage(v, n)) return b.Reshape(update, {n});
  SlicePlan p = Plan(v, n);
  if (!p.ok) {
    ir::Value idx = b.Reshape(Addresses(b, v, offset), {Numel(v.sizes), 1});
    ir::ScatterDims s;
    s.inserted_window_dims = {0};
    s.scatter_dims_to_operand_dims = {0};
    s.index_vector_dim = 1;
    return b.Scatter(flat, idx, b.Reshape(update, {Numel(v.sizes)}), s, /*replace=*/true);
  }
  // update (view order) -> stride order -> slice shape
  std::vector<int64_t> sorted_sizes;
  for (int64_t d : p.real) sorted_sizes.push_back(v.sizes[d]);
  std::vector<int64_t> view_dims = p.real;
  std::sort(view_dims.begin(), view_dims.end());
  std::vector<int64_t> view_sizes;
  for (int64_t d : view_dims) view_sizes.push_back(v.sizes[d]);
  ir::Value u = b.Reshape(update, view_sizes);
  // view_dims[i] is the i-th real dim by index; bring them to stride order.
  std::vector<int64_t> perm(p.real.size());
  for (size_t j = 0; j < p.real.size(); ++j) {
    perm[j] = std::find(view_dims.begin(), view_dims.end(), p.real[j]) - view_dims.begin();
  }
  if (!IsIdentity(perm)) u = b.Transpose(u, perm);
  std::vector<int64_t> slice_dims(p.starts.size());
  for (size_t j = 0; j < slice_dims.size(); ++j) slice_dims[j] = p.limits[j] - p.starts[j];
  u = b.Reshape(u, slice_dims);
  ir::Value base = b.Reshape(PadTo(b, flat, n, p.padded), p.base_dims);
  ir::Value out = b.Reshape(b.DynamicUpdateSlice(base, u, Starts(b, p, offset)), {p.padded});
  if (p.padded != n) out = b.Slice(out, {0}, {n}, {1});
  return out;
}

}  // namespace tpj::runtime
