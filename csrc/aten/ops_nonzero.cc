// Data-dependent shapes on the device: nonzero (and through it argwhere,
// torch.where(cond), boolean-mask indexing), masked_select and
// masked_scatter_ read one number from the device, the count of true
// elements, which syncs what the mask needs; the indices themselves are
// computed on the device: a prefix sum numbers the true elements, a scatter
// puts each one's flat index at its number, and division by the strides
// unravels it. nonzero_static reads nothing: its size is given, and the
// rows beyond the count are filled. unique and unique_consecutive (of
// elements or of slices along a dim) read the number of distinct values,
// bincount its length, repeat_interleave with tensor repeats its length.
//
// Each count gives the ops that follow new shapes, so a step that indexes
// with a mask compiles once per distinct count (as any lazy device does).
#include <ATen/MemoryOverlap.h>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

// Flat indices (int64, on the device) of the true elements of `flat` (a 1-d
// bool tensor), in order, as `rows` entries: where there are fewer, the
// entries beyond are 0.
at::Tensor TrueIndices(const at::Tensor& flat, int64_t rows) {
  const at::TensorOptions longs = flat.options().dtype(at::kLong);
  const int64_t n = flat.numel();
  at::Tensor number = at::cumsum(flat, 0, at::kLong).sub_(1);
  // False elements, and true ones numbered past `rows`, go to a spare slot.
  at::Tensor slot = at::where(flat.logical_and(number.lt(rows)), number, at::scalar_tensor(rows, longs));
  at::Tensor out = at::zeros({rows + 1}, longs).scatter_(0, slot, at::arange(n, longs));
  return out.narrow(0, 0, rows);
}

// [rows, ndim] coordinates of flat indices into `sizes`.
at::Tensor Unravel(const at::Tensor& flat_idx, at::IntArrayRef sizes) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  if (nd == 0) return flat_idx.new_empty({flat_idx.size(0), 0});
  std::vector<at::Tensor> cols;
  int64_t stride = 1;
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  for (int64_t k = nd - 1; k >= 0; --k) {
    strides[static_cast<size_t>(k)] = stride;
    stride *= sizes[static_cast<size_t>(k)];
  }
  for (int64_t k = 0; k < nd; ++k) {
    at::Tensor c = flat_idx.div(strides[static_cast<size_t>(k)], "floor");
    cols.push_back(k == 0 ? c : c.remainder(sizes[static_cast<size_t>(k)]));
  }
  return at::stack(cols, 1);
}

at::Tensor Flat(const at::Tensor& self) { return self.reshape({-1}).ne(0); }

int64_t Count(const at::Tensor& flat) { return flat.sum(at::kLong).item<int64_t>(); }

// nonzero's [count, ndim] result laid out column by column, strides (1,
// count), as the CPU's kernel writes it: nonzero(as_tuple=True) gives
// contiguous index vectors.
at::Tensor nonzero(const at::Tensor& self) {
  at::Tensor flat = Flat(self);
  const int64_t count = self.numel() == 0 ? 0 : Count(flat);
  const int64_t nd = self.dim();
  if (count == 0) return at::empty_strided({0, nd}, {1, 0}, self.options().dtype(at::kLong));
  at::Tensor rows = Unravel(TrueIndices(flat, count), self.sizes());  // fresh [count, ndim]
  at::Tensor columns = nd > 1 ? rows.t().contiguous() : rows;  // fresh, memory column by column
  columns.unsafeGetTensorImpl()->set_sizes_and_strides(at::IntArrayRef{count, nd}, at::IntArrayRef{1, count});
  return columns;
}

at::Tensor nonzero_static(const at::Tensor& self, int64_t size, int64_t fill_value) {
  TORCH_CHECK(size >= 0, "nonzero_static: 'size' must be an non-negative integer");
  at::Tensor flat = Flat(self);
  if (size == 0 || self.numel() == 0) {
    return at::full({size, self.dim()}, fill_value, self.options().dtype(at::kLong));
  }
  at::Tensor coords = Unravel(TrueIndices(flat, size), self.sizes());
  at::Tensor count = flat.sum(at::kLong);
  at::Tensor beyond = at::arange(size, coords.options()).ge(count).unsqueeze(1);
  return at::where(beyond, at::scalar_tensor(fill_value, coords.options()), coords);
}

// The elements of self where mask (both broadcast) is true, flattened.
at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  const auto shape = at::infer_size(mask.sizes(), self.sizes());  // (the CPU's order, so its message names them so)
  at::Tensor values = self.expand(shape).reshape({-1});
  at::Tensor flat = mask.expand(shape).reshape({-1});
  const int64_t count = values.numel() == 0 ? 0 : Count(flat);
  if (count == 0) return at::empty({0}, self.options());
  return values.index_select(0, TrueIndices(flat, count));
}

// self's elements where mask is true, in order, from source's first ones
// (LLaVA-style merging of image features into token embeddings).
at::Tensor& masked_scatter_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& source) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_scatter_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "masked_scatter: expected self and source to have same dtypes but got",
              self.scalar_type(), " and ", source.scalar_type());
  TORCH_CHECK(at::infer_size(self.sizes(), mask.sizes()) == self.sizes(), "masked_scatter_: the mask of shape ", mask.sizes(),
              " does not broadcast to self's shape ", self.sizes());
  // A source in self's memory: the CPU writes in order, each element read
  // after the writes before it (x.masked_scatter_(m, x) with m = [1, 0, 1, 1]
  // gives [0, 1, 1, 1] there), which a program cannot repeat; refused with
  // the CPU's own overlap error instead of another answer.
  AssertNoOverlap(self, source, /*accumulate=*/false);
  at::Tensor flat = mask.expand(self.sizes()).reshape({-1});
  const int64_t count = self.numel() == 0 ? 0 : Count(flat);
  if (count == 0) return self;
  TORCH_CHECK(source.numel() >= count, "masked_scatter: expected source to have at least ", count,
              " elements (the number of ones in mask), got ", source.numel());
  at::Tensor coords = Unravel(TrueIndices(flat, count), self.sizes());
  c10::List<std::optional<at::Tensor>> index;
  for (int64_t k = 0; k < self.dim(); ++k) index.push_back(coords.select(1, k));
  at::Tensor values = source.reshape({-1}).narrow(0, 0, count);
  if (self.dim() == 0) return self.copy_(values.reshape({}));
  return self.index_put_(index, values);
}

// unique and unique_consecutive, of elements or of slices along a dim: the
// slices are rows of [n, m] (m = 1 for elements), sorted lexicographically
// for unique (a stable sort per column, last column first); where a run of
// equal rows starts is marked, and the one number read is their count;
// values, inverse indices and counts follow on the device. As on the CPU,
// every NaN is a value of its own.
//
// A sort per column: unique of slices of more than kMaxSortedColumns
// elements runs on the CPU (counted) rather than as a program of that many
// chained sorts (unique(dim=0) of 1000 rows of 16 elements: 0.6-0.8 s to
// trace and compile once on a 2-core machine, measured).
constexpr int64_t kMaxSortedColumns = 16;

struct Runs {
  at::Tensor rows, inverse, counts;  // the distinct rows [count, m]; [n] and [count] int64
};

Runs RowRuns(const at::Tensor& rows, bool sort) {
  const at::TensorOptions longs = rows.options().dtype(at::kLong);
  const int64_t n = rows.size(0), m = rows.size(1);
  if (n == 0) return {rows, at::empty({0}, longs), at::empty({0}, longs)};
  at::Tensor sorted = rows, order;
  if (sort) {
    order = at::arange(n, longs);
    for (int64_t c = m; c-- > 0;) {
      at::Tensor by = std::get<1>(at::sort(rows.select(1, c).index_select(0, order), /*stable=*/true, 0, false));
      order = order.index_select(0, by);
    }
    sorted = rows.index_select(0, order);
  }
  at::Tensor differs = sorted.narrow(0, 1, n - 1).ne(sorted.narrow(0, 0, n - 1));
  at::Tensor starts = at::cat({at::ones({1}, rows.options().dtype(at::kBool)), m == 1 ? differs.squeeze(1) : differs.any(1)});
  const int64_t count = Count(starts);
  at::Tensor first = TrueIndices(starts, count);
  at::Tensor inverse = at::cumsum(starts, 0, at::kLong).sub_(1);
  if (sort) inverse = at::zeros({n}, longs).scatter_(0, order, inverse);
  at::Tensor counts = at::cat({first.narrow(0, 1, count - 1), at::full({1}, n, longs)}).sub_(first);
  return {sorted.index_select(0, first), inverse, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> Elements(const at::Tensor& self, bool sort, bool return_inverse,
                                                        bool return_counts) {
  CheckNotComplex(self.scalar_type(), "unique");
  const at::TensorOptions longs = self.options().dtype(at::kLong);
  Runs r = RowRuns(self.reshape({-1, 1}), sort);
  return {r.rows.reshape({-1}), return_inverse ? r.inverse.reshape(self.sizes()) : at::zeros({0}, longs),
          return_counts ? r.counts : at::empty({0}, longs)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> Slices(const at::Tensor& self, int64_t dim, bool sort,
                                                      bool return_inverse, bool return_counts) {
  CheckNotComplex(self.scalar_type(), "unique_dim");
  const int64_t w = WrapDim(dim, self.dim());
  const int64_t n = self.size(w);
  if (sort && self.numel() / std::max<int64_t>(n, 1) > kMaxSortedColumns) {
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::unique_dim", "");
    c10::Stack stack{self, dim, true, return_inverse, return_counts};
    CpuFallback(op, &stack);
    return {stack.at(0).toTensor(), stack.at(1).toTensor(), stack.at(2).toTensor()};
  }
  for (int64_t k = 0; k < self.dim(); ++k) {
    TORCH_CHECK(k == w || self.size(k) > 0 || n == 0,
                "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
  }
  at::Tensor moved = self.movedim(w, 0);
  Runs r = RowRuns(moved.reshape({n, n == 0 ? 0 : -1}), sort);
  std::vector<int64_t> sizes = moved.sizes().vec();
  sizes[0] = r.rows.size(0);
  return {r.rows.reshape(sizes).movedim(0, w), r.inverse, r.counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool, bool return_inverse,
                                                       bool return_counts) {
  return Elements(self, true, return_inverse, return_counts);
}
std::tuple<at::Tensor, at::Tensor> unique(const at::Tensor& self, bool, bool return_inverse) {
  auto [v, i, c] = Elements(self, true, return_inverse, false);
  return {v, i};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_dim(const at::Tensor& self, int64_t dim, bool, bool return_inverse,
                                                          bool return_counts) {
  return Slices(self, dim, true, return_inverse, return_counts);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_dim_consecutive(const at::Tensor& self, int64_t dim,
                                                                      bool return_inverse, bool return_counts) {
  return Slices(self, dim, false, return_inverse, return_counts);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_consecutive(const at::Tensor& self, bool return_inverse,
                                                                  bool return_counts, std::optional<int64_t> dim) {
  CheckNotComplex(self.scalar_type(), dim ? "unique_dim" : "unique");
  if (dim && self.dim() > 1) return Slices(self, *dim, false, return_inverse, return_counts);
  return Elements(self, false, return_inverse, return_counts);
}

// bincount: counts (or summed weights) per value of a 1-d non-negative
// integer input; the length, max(input) + 1 or minlength, is the one number
// read (with the input's least value, checked to be >= 0).
at::Tensor bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights, c10::SymInt minlength_) {
  const int64_t minlength = minlength_.guard_int(__FILE__, __LINE__);
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(self.scalar_type(), false), "\"bincount\" not implemented for '",
                              self.scalar_type(), "'");
  TORCH_CHECK(self.dim() == 1, "bincount only supports 1-d non-negative integral inputs.");
  const bool weighted = weights && weights->defined();
  TORCH_CHECK(!weighted || (weights->dim() == 1 && weights->size(0) == self.size(0)),
              "weights should be 1-d and have the same length as input");
  const at::ScalarType out_t = !weighted ? at::kLong : weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  int64_t length = minlength;
  if (self.numel() > 0) {
    auto [mn, mx] = at::aminmax(self.to(at::kLong));
    at::Tensor both = at::stack({mn, mx}).cpu();
    TORCH_CHECK(both[0].item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
    length = std::max(length, both[1].item<int64_t>() + 1);
  }
  // an empty input counts nothing, weighted or not (int64, as the CPU)
  if (self.numel() == 0) return at::zeros({length}, self.options().dtype(at::kLong));
  at::Tensor out = at::zeros({length}, self.options().dtype(out_t));
  at::Tensor add = weighted ? weights->to(out_t) : at::ones({self.numel()}, out.options());
  return out.scatter_add_(0, self.to(at::kLong), add);
}

// The indices repeat_interleave(repeats) lists: i repeated repeats[i] times.
// The length is read from the device (with the smallest repeat, for the
// CPU's check) unless output_size gives it: then the CPU's checks (no
// negative repeat, output_size the sum of the repeats) are compiled into the
// program, raised when the result is read. Each output position finds its
// input by a search in the running sum of the repeats.
at::Tensor repeat_interleave(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  if (repeats.size(0) == 0) return at::empty({0}, repeats.options());
  const at::Tensor cum = repeats.cumsum(0, at::kLong);
  int64_t total = 0;
  if (output_size) {
    total = output_size->expect_int();
    TORCH_CHECK(total >= 0, "repeat_interleave: output_size must be non-negative, got ", total);
    const at::Tensor negative = (repeats < 0).any();
    const at::Tensor mismatch = cum[-1] != total;
    TraceScope s;
    const int d = DeviceIndex(repeats);
    CheckNone(d, Val(negative), runtime::ErrorKind::kValue, "repeats can not be negative");
    CheckNone(d, Val(mismatch), runtime::ErrorKind::kValue,
              "repeat_interleave: allocated size does not match required size (output_size " + std::to_string(total) +
                  " is not the sum of the repeats)");
  } else {
    const at::Tensor read = at::stack({cum[-1], repeats.min().to(at::kLong)}).cpu();
    total = read[0].item<int64_t>();
    TORCH_CHECK(read[1].item<int64_t>() >= 0, "repeats can not be negative");
  }
  const at::Tensor positions = at::arange(total, repeats.options().dtype(at::kLong));
  return at::searchsorted(cum, positions, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("nonzero", nonzero);
  K("nonzero_static", nonzero_static);
  K("masked_select", masked_select);
  K("_unique2", unique2);
  K("_unique", unique);
  K("unique_consecutive", unique_consecutive);
  K("unique_dim", unique_dim);
  K("unique_dim_consecutive", unique_dim_consecutive);
  K("bincount", bincount);
  K("repeat_interleave.Tensor", repeat_interleave);
  m.impl("masked_scatter_", TORCH_FN(tpj::aten::masked_scatter_));
}
