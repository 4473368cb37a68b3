// Memory, transfer and view-plumbing kernels: empty, views over storages,
// copies between the host and pjrt, item(), clone, fill.
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

#include "aten/device.h"
#include "aten/lowering.h"
#include "aten/tensor.h"

namespace tpj::aten {
namespace {

// A view's geometry without its size-1 dims (their strides address nothing).
struct Geometry {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  bool operator==(const Geometry& o) const { return sizes == o.sizes && strides == o.strides && offset == o.offset; }
};

Geometry GeometryOf(const at::Tensor& t) {
  Geometry g;
  g.offset = t.storage_offset();
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) == 1) continue;
    g.sizes.push_back(t.size(i));
    g.strides.push_back(t.stride(i));
  }
  return g;
}

// [first, last] element offsets a view reads (strides are not negative).
std::pair<int64_t, int64_t> Extent(const Geometry& g) {
  int64_t last = g.offset;
  for (size_t i = 0; i < g.sizes.size(); ++i) last += (g.sizes[i] - 1) * g.strides[i];
  return {g.offset, last};
}

// (stride, size) of the dims that move, by decreasing stride.
using Dims = std::vector<std::pair<int64_t, int64_t>>;
Dims SortedDims(const Geometry& g) {
  Dims dims;
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (g.strides[i] != 0) dims.emplace_back(g.strides[i], g.sizes[i]);
  }
  std::sort(dims.begin(), dims.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  return dims;
}

// Whether each stride exceeds the span of the smaller ones: the view's
// offsets are then distinct and each has one index, found greedily.
bool Nested(const Dims& dims) {
  int64_t span = 0;
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i].first <= span) return false;
    span += (dims[i].second - 1) * dims[i].first;
  }
  return true;
}

// Whether delta = sum k_i stride_i with |k_i| < size_i, from dim i on:
// each dim tries the two multiples around delta / stride, exact for nested
// dims; any answer found is a real solution.
bool Reaches(int64_t delta, const Dims& dims, size_t i) {
  if (delta == 0) return true;
  if (i == dims.size()) return false;
  const auto [stride, size] = dims[i];
  const int64_t q = delta / stride;
  for (int64_t k : {q, q + (delta > 0 ? 1 : -1)}) {
    if (std::abs(k) < size && Reaches(delta - k * stride, dims, i + 1)) return true;
  }
  return false;
}

// Whether element offset t is one of a nested view's.
bool Contains(const Dims& nested, int64_t offset, int64_t t) {
  int64_t r = t - offset;
  if (r < 0) return false;
  for (const auto& [stride, size] : nested) {
    const int64_t k = r / stride;
    if (k >= size) return false;
    r -= k * stride;
  }
  return r == 0;
}

// Calls f(a, b) for each index of `sizes`, a and b the offsets that the
// strides sa and sb (from a0 and b0) give it, until f returns true.
template <class F>
bool AnyIndex(const std::vector<int64_t>& sizes, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb,
              size_t dim, int64_t a, int64_t b, const F& f) {
  if (dim == sizes.size()) return f(a, b);
  for (int64_t k = 0; k < sizes[dim]; ++k) {
    if (AnyIndex(sizes, sa, sb, dim + 1, a + k * sa[dim], b + k * sb[dim], f)) return true;
  }
  return false;
}

// Calls f on each element offset of a view until it returns true.
template <class F>
bool AnyOffset(const Geometry& g, const F& f) {
  return AnyIndex(g.sizes, g.strides, g.strides, 0, g.offset, 0, [&](int64_t t, int64_t) { return f(t); });
}

std::vector<int64_t> SortedOffsets(const Geometry& g) {
  std::vector<int64_t> out;
  AnyOffset(g, [&](int64_t t) {
    out.push_back(t);
    return false;
  });
  std::sort(out.begin(), out.end());
  return out;
}

// Views are walked element by element up to this many elements (the one
// walked: the other answers by arithmetic where it is nested), and sorted
// offsets compared up to kMaxSortedElements; beyond both, left unchecked.
constexpr int64_t kMaxWalkedElements = int64_t{1} << 22;
constexpr int64_t kMaxSortedElements = int64_t{1} << 20;

// Whether some two elements of a view are one storage element (the CPU's
// check answers "too hard" for such views).
bool OverlapsItself(const Geometry& g, int64_t numel) {
  if (Nested(SortedDims(g)) || numel > kMaxSortedElements) return false;
  const std::vector<int64_t> offsets = SortedOffsets(g);
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
}

// Whether two views of one storage (elements of one size) share an element:
// the elements of one looked up in the other where that one is nested, else
// their sorted offsets compared; beyond the walk limits, false.
bool AnyCommonElement(const Geometry& a, int64_t a_numel, const Geometry& b, int64_t b_numel) {
  const Dims da = SortedDims(a), db = SortedDims(b);
  if (Nested(da) && b_numel <= kMaxWalkedElements) {
    return AnyOffset(b, [&](int64_t t) { return Contains(da, a.offset, t); });
  }
  if (Nested(db) && a_numel <= kMaxWalkedElements) {
    return AnyOffset(a, [&](int64_t t) { return Contains(db, b.offset, t); });
  }
  if (a_numel > kMaxSortedElements || b_numel > kMaxSortedElements) return false;
  const std::vector<int64_t> x = SortedOffsets(a), y = SortedOffsets(b);
  std::vector<int64_t> common;
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
  return !common.empty();
}

// The operand's strides broadcast to `written`'s shape, for the dims of
// its Geometry (size-1 dims left out); empty where the operand's shape does
// not broadcast to it.
std::vector<int64_t> BroadcastStrides(const at::Tensor& written, const at::Tensor& operand) {
  const int64_t n = written.dim(), lead = n - operand.dim();
  if (lead < 0) return {};
  std::vector<int64_t> out;
  for (int64_t d = 0; d < n; ++d) {
    const int64_t size = d < lead ? 1 : operand.size(d - lead);
    if (size != 1 && size != written.size(d)) return {};
    if (written.size(d) != 1) out.push_back(size == 1 ? 0 : operand.stride(d - lead));
  }
  return out;
}

// Whether an operand's elements would be read after the op wrote some of
// them on the CPU, for the views the CPU's check calls too hard: views of
// one storage that share an element without being the same view. The CPU
// walks the written view upward in memory, so an operand element is read
// after it was written where it lies in the written view below the element
// it serves (buf[:, 1:] = buf[:, :-1], x.mul_(x[:, :1])); a shift toward
// lower addresses (buf[:, :-1] = buf[:, 1:], x.div_(x[:, -1:])) reads each
// element before it is written: that computes as in a program.
bool PartlyOverlaps(const at::Tensor& written, const at::Tensor& operand) {
  // (views of one storage as types of other sizes, x.view(torch.int16) and
  // x, count offsets in other units: left to the CPU's check)
  if (written.numel() == 0 || operand.numel() == 0 || !written.has_storage() || !operand.has_storage() ||
      !written.storage().is_alias_of(operand.storage()) || written.element_size() != operand.element_size()) {
    return false;
  }
  const Geometry w = GeometryOf(written), o = GeometryOf(operand);
  if (w == o) return false;
  const auto [w0, w1] = Extent(w);
  const auto [o0, o1] = Extent(o);
  if (w1 < o0 || o1 < w0) return false;
  if (w.sizes == o.sizes && w.strides == o.strides) {
    return o.offset < w.offset && Reaches(w.offset - o.offset, SortedDims(w), 0);
  }
  const Dims wd = SortedDims(w);
  const std::vector<int64_t> o_strides = BroadcastStrides(written, operand);
  if (Nested(wd) && (w.sizes.empty() || !o_strides.empty()) && written.numel() <= kMaxWalkedElements) {
    return AnyIndex(w.sizes, w.strides, o_strides, 0, w.offset, o.offset,
                    [&](int64_t dst, int64_t src) { return src < dst && Contains(wd, w.offset, src); });
  }
  return AnyCommonElement(w, written.numel(), o, operand.numel());
}

// Whether two views of one storage share an element (the same view
// included). Views of types of other sizes share one where their byte
// ranges meet; beyond the walk limits, left unchecked (false).
bool SharesElement(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage() ||
      !a.storage().is_alias_of(b.storage())) {
    return false;
  }
  const Geometry ga = GeometryOf(a), gb = GeometryOf(b);
  const auto [a0, a1] = Extent(ga);
  const auto [b0, b1] = Extent(gb);
  if (a.element_size() != b.element_size()) {
    return a0 * a.element_size() < (b1 + 1) * b.element_size() && b0 * b.element_size() < (a1 + 1) * a.element_size();
  }
  if (a1 < b0 || b1 < a0) return false;
  return ga == gb || AnyCommonElement(ga, a.numel(), gb, b.numel());
}

constexpr const char* kSharedMemory =
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation.";

using runtime::Runtime;
using runtime::TraceScope;

int TargetDevice(std::optional<at::Device> device) {
  if (device && device->has_index()) {
    CheckDeviceIndex(device->index());
    return device->index();
  }
  return CurrentDevice();
}

// Under torch.use_deterministic_algorithms(True) (with
// torch.utils.deterministic.fill_uninitialized_memory, its default) a new
// empty tensor holds NaN (integers: their largest value), as on the CPU.
bool FillsUninitialized() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor FilledIfDeterministic(at::Tensor t) {
  if (FillsUninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "pjrt tensors are strided; layout ", *layout, " is not supported");
  at::Tensor t = Empty(size, dtype.value_or(at::get_default_dtype_as_scalartype()), TargetDevice(device));
  if (memory_format && *memory_format != at::MemoryFormat::Contiguous) {
    t.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);  // channels_last strides, PyTorch's checks
  }
  return FilledIfDeterministic(t);
}

// Forward-mode AD (the tangent of every input without one) and some
// backward formulas (sgn's) ask for a zero tensor that ops may skip. As on
// the CPU, it carries the ZeroTensor dispatch key: PyTorch's kernels for that
// key let it absorb what it meets (0 * inf, 0 / 0 and 0 * NaN are 0, a
// product with it is another), and its fallback hands other ops plain
// zeros. Its storage here is a real one (a broadcast constant in the trace),
// so the view ops that pass it through to pjrt's kernels work as on any
// tensor; in-place ops on it are refused by PyTorch, as on the CPU.
at::Tensor efficientzerotensor(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "pjrt tensors are strided; layout ", *layout, " is not supported");
  const int d = TargetDevice(device);
  TraceScope scope;
  at::Tensor zeros = Wrap(B(d).Full(ToIr(dtype.value_or(at::get_default_dtype_as_scalartype())), size.vec(), 0), d);
  const c10::DispatchKeySet keys =
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(zeros.storage()), keys, zeros.dtype());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  return t;
}

// A number made a 0-d tensor (torch.scalar_tensor, and what `x[i] = v`
// writes): a host-fed parameter whatever its value. As a constant, 0, 1 and
// -1 made programs of their own, so writing rewards and done flags into a
// replay buffer (`reward[i] = r`, `done[i] = d`) compiled one program per
// combination of values.
at::Tensor scalar_tensor(const at::Scalar& s, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "pjrt tensors are strided; layout ", *layout, " is not supported");
  const at::ScalarType t = dtype.value_or(at::get_default_dtype_as_scalartype());
  const int d = TargetDevice(device);
  TraceScope scope;
  at::Tensor out = Empty({}, t, d);
  // as the CPU's: an integer out of range refused, a half type's cast (inf)
  Assign(out, ScalarParam(d, s, t, /*wrapped=*/t == at::kHalf || t == at::kBFloat16));
  return out;
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const at::ScalarType t = dtype.value_or(at::get_default_dtype_as_scalartype());
  const size_t nbytes = at::detail::computeStorageNbytes(size, stride, c10::elementSize(t));
  const int64_t numel = static_cast<int64_t>(nbytes / c10::elementSize(t));
  at::Tensor flat = Empty({numel}, t, TargetDevice(device));
  flat.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride);
  return FilledIfDeterministic(flat);
}

at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, at::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  // The same shape keeps its strides, as on the CPU: zeros(out=view) resizes
  // its out before writing, and must keep writing through the view.
  if (self.sizes() == size && !format) return self;
  TraceScope scope;
  StorageOf(self);  // a pjrt tensor of ours
  int64_t numel = 1;
  for (int64_t d : size) numel *= d;
  const size_t need = static_cast<size_t>(numel + self.storage_offset()) * c10::elementSize(self.scalar_type());
  const size_t old_nbytes = self.storage().nbytes();
  // Grow in place: old contents first, then zeros (undefined in PyTorch).
  if (need > old_nbytes) ResizeStorage(self.storage(), need, self.scalar_type());
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  if (format) self.unsafeGetTensorImpl()->empty_tensor_restride(*format);
  // use_deterministic_algorithms: the grown tail NaN (integers: their
  // largest value), as on the CPU
  if (FillsUninitialized()) at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old_nbytes));
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {
  // A view past the storage's end grows the storage, as on the CPU: here in
  // the runtime, before ATen's CPU resize (a memcpy of host bytes) sees it.
  if (c10::multiply_integers(size) > 0 && PjrtStorage(source.data_ptr()) != nullptr) {
    const size_t item = self.dtype().itemsize();
    const size_t need = stride.data() != nullptr ? at::detail::computeStorageNbytes(size, stride, item, offset)
                                                 : at::detail::computeStorageNbytesContiguous(size, item, offset);
    if (need > source.nbytes()) ResizeStorage(source, need, self.scalar_type());
  }
  at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
  // torch.load sets typed tensors on the byte storages it uploaded
  TraceScope scope;
  if (self.storage().nbytes() > 0) Runtime::Get().TypeBytes(StorageOf(self), ToIr(self.scalar_type()));
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

// set_() without a source: a new empty storage of the device, as on the CPU
// (views of the old storage keep it).
at::Tensor& set_empty(at::Tensor& self) {
  return set_storage(self, at::empty({0}, self.options()).storage(), 0, {0}, {});
}

// The CPU's is_set_to: the same storage, offset, sizes and strides (the CPU
// fallback compared copies, always False).
bool is_set_to(const at::Tensor& self, const at::Tensor& other) {
  return self.storage().is_alias_of(other.storage()) && self.storage_offset() == other.storage_offset() &&
         self.sizes().equals(other.sizes()) && self.strides().equals(other.strides());
}

// Host copy of a pjrt tensor: downloads the flat storage once, then lets the
// CPU apply the view.
at::Tensor ToCpu(const at::Tensor& self) {
  auto& rt = Runtime::Get();
  runtime::Storage& s = StorageOf(self);
  RaisingTensorErrors([&] { rt.CheckReadable(s); });  // before allocating the host copy
  // A small part of a large storage (x[i].item() in a loop, print(x[3])):
  // that part alone comes to the host, copied out on the device first,
  // rather than the whole storage each time. The copy does not join pending
  // work (it would cut a step's program where the read happens): that is
  // synced first, as the read would sync it anyway (reading two elements of
  // a pending 512 MiB value took 1 GiB of host memory, the whole storage).
  constexpr size_t kLargeStorage = size_t{1} << 20;
  const size_t part = static_cast<size_t>(self.numel()) * self.element_size();
  if (s.nbytes() >= kLargeStorage && part > 0 && part * 8 <= s.nbytes()) {
    if (s.pending()) {
      try {
        rt.Sync({s.device()});
      } catch (...) {
        RaisingTensorErrors([&] { rt.CheckReadable(s); });  // its value lost: why (OutOfMemoryError after an OOM)
        throw;
      }
    }
    // (A fourth partial read in a row of the same value downloads it whole
    // and keeps the copy, up to 64 MiB: Runtime::ReadWhole.)
    if (rt.Idle(s.device()) && !rt.ReadWhole(s)) return ToCpu(self.clone(at::MemoryFormat::Contiguous));
  }
  const at::ScalarType storage_type = ToAten(rt.TypeOf(s, ToIr(self.scalar_type())));
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  RaisingTensorErrors([&] { bytes = rt.Download(s); });
  // The host bytes (shared with the runtime's host copy of a small or
  // often read buffer): only the view is copied out of them.
  const int64_t numel = static_cast<int64_t>(bytes->size() / c10::elementSize(storage_type));
  at::Tensor flat = at::from_blob(const_cast<uint8_t*>(bytes->data()), {numel}, [bytes](void*) {},
                                  at::TensorOptions().dtype(storage_type));
  if (storage_type != self.scalar_type()) flat = FlatAs(flat, self.scalar_type());
  at::Tensor view = flat.as_strided(self.sizes(), self.strides(), self.storage_offset());
  // Lazy conjugate / negative views keep their bit: the values they mean
  // are conj(memory) / -memory.
  if (self.is_conj()) view = view.conj();
  if (self.is_neg()) view = view._neg_view();
  return view.clone().resolve_conj().resolve_neg();
}

// dst (pjrt, any view) <- src (host tensor, broadcastable to dst).
void CopyHostToPjrt(const at::Tensor& dst, const at::Tensor& src) {
  const ir::DType dt = ToIr(dst.scalar_type());
  auto& rt = Runtime::Get();
  runtime::Storage& s = StorageOf(dst);
  const int64_t numel = static_cast<int64_t>(s.nbytes() / dst.element_size());
  const runtime::StridedView view = ViewOf(dst);
  TraceScope scope;
  // Raw uploads only where memory holds the values themselves: a conjugate or
  // negative view's memory holds conj(value) / -value (Assign writes that).
  const bool raw = (!s.dtype() || *s.dtype() == dt) && !dst.is_conj() && !dst.is_neg();
  if (raw && runtime::CoversStoragePermuted(view, numel)) {
    // the whole storage (row-major, channels_last, ...): the host data laid
    // out as the storage is, unless it already is, then uploaded as it is
    at::Tensor host = src.expand(dst.sizes());
    if (host.scalar_type() != dst.scalar_type() || host.strides() != dst.strides() || host.is_conj() || host.is_neg()) {
      host = at::empty_strided(dst.sizes(), dst.strides(), at::TensorOptions().dtype(dst.scalar_type()));
      host.copy_(src.expand(dst.sizes()));  // (copy_ applies a conjugate or negative source's bits)
    }
    RaisingTensorErrors([&] { rt.UploadTo(s, host.const_data_ptr(), dt); });
    return;
  }
  // (a conjugate or negative host view's bits resolved: its memory is not its value)
  at::Tensor dense = src.expand(dst.sizes()).to(dst.scalar_type()).contiguous().resolve_conj().resolve_neg();
  ir::Value v = RaisingTensorErrors([&] { return rt.UploadValue(s.device(), dense.const_data_ptr(), dt, dense.numel()); });
  Assign(dst, B(s.device()).Reshape(v, dst.sizes().vec()));
}

// src's value as dtype t, for a copy between pjrt tensors: complex to real
// keeps the real part, with PyTorch's warning, as on the CPU.
ir::Value CastForCopy(const at::Tensor& src, at::ScalarType t) {
  if (src.is_complex() && !at::isComplexType(t) && t != at::kBool) {  // to bool: whether either part is non-zero
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  }
  return ValAs(src, t);
}

// Before `src` is written into part of `dst`: a value computed in this
// trace is computed once into memory and src's storage rebound to it. XLA
// fuses the elementwise work computing a written value into the write
// (dynamic_update_slice) and into its other users alike, so a recurrence
// that stores each step's state into a buffer (GAE's advantages, adv[t] =
// last = delta + g * last, or a hand-written RNN's outputs) recomputed every
// earlier step inside each write: compile time cubic in the steps (GAE over
// 64 steps: 10 s, over 128: 199 s; now 1.3 s and 2.7 s).
void StoreOnce(const at::Tensor& dst, const at::Tensor& src) {
  runtime::Storage& s = StorageOf(src);
  if (!s.pending() || src.is_conj() || src.is_neg() || !src.is_contiguous() || src.storage_offset() != 0 ||
      src.numel() * static_cast<int64_t>(src.element_size()) != static_cast<int64_t>(s.nbytes()) ||
      (s.dtype() && *s.dtype() != ToIr(src.scalar_type()))) {
    return;  // not a whole value of this trace
  }
  const int64_t dst_numel = static_cast<int64_t>(dst.storage().nbytes() / dst.element_size());
  if (runtime::CoversStoragePermuted(ViewOf(dst), dst_numel)) return;  // a whole-storage write: no update slice
  Assign(src, InMemory(DeviceIndex(src), Val(src)));
}

// slice_scatter, select_scatter and copy are what AOTAutograd makes of
// `x[a:b] = v`, `x[i] = v` and `x.copy_(v)`. PyTorch's kernels clone all of
// self's storage (clone_preserve_strides), write into the clone and return
// it with self's strides; AOTAutograd's fake tensors have those strides, and
// the graphs it traces view these results accordingly: the results here have
// them too (WrapStrided). The write goes into self's value directly, at an
// offset that is a parameter (a compiled decode step writing its KV cache
// at a position Dynamo made symbolic keeps one program).
template <typename PartOf>
at::Tensor ScatterInto(const at::Tensor& self, const at::Tensor& src, PartOf part_of, const char* op) {
  const at::Tensor part = part_of(self);
  TORCH_CHECK(part.sizes() == src.sizes(), op, ": expected src to have a size equal to the slice of self. src size = ",
              src.sizes(), ", slice size = ", part.sizes());
  if (IsPjrt(self) && IsPjrt(src) && DeviceIndex(src) == DeviceIndex(self)) {
    TraceScope scope;
    if (auto t = Scattered(self, part, CastForCopy(src, self.scalar_type()))) return *t;
  }
  at::Tensor out = self.clone();  // (across devices, copy_ moves src)
  part_of(out).copy_(src);
  return out;
}

// src's values in self's shape and dtype, with self's strides: self's old
// values are not read (only a view of the whole storage could see them).
at::Tensor copy(const at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (!IsPjrt(self) || !IsPjrt(src) || DeviceIndex(src) != DeviceIndex(self)) {  // across devices: copy_'s paths
    at::Tensor r = self.clone();
    r.copy_(src, non_blocking);
    return r;
  }
  TraceScope scope;
  const int d = DeviceIndex(self);
  const ir::Value v = BroadcastTo(d, CastForCopy(src, self.scalar_type()), self.sizes().vec());
  return self.is_contiguous() ? Wrap(v, d) : WrapStrided(v, d, self);
}

at::Tensor slice_scatter(const at::Tensor& self, const at::Tensor& src, int64_t dim, std::optional<int64_t> start,
                         std::optional<int64_t> end, int64_t step) {
  return ScatterInto(self, src, [&](const at::Tensor& t) { return t.slice(dim, start, end, step); }, "slice_scatter");
}

at::Tensor select_scatter(const at::Tensor& self, const at::Tensor& src, int64_t dim, int64_t index) {
  return ScatterInto(self, src, [&](const at::Tensor& t) { return t.select(dim, index); }, "select_scatter");
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (!at::is_expandable_to(src.sizes(), self.sizes())) {  // the CPU's shape check and messages
    const auto shape = at::infer_size(self.sizes(), src.sizes());  // raises its message where they do not broadcast
    TORCH_CHECK(false, "output with shape ", self.sizes(), " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (self.numel() == 0) return self;  // nothing to write
  if (IsPjrt(self) && !IsPjrt(src)) {
    TORCH_CHECK(src.device().is_cpu(), "copy from ", src.device(), " to pjrt is not supported; go through the CPU");
    CopyHostToPjrt(self, src);
    return self;
  }
  if (!IsPjrt(self)) {
    self.copy_(ToCpu(src));
    return self;
  }
  if (DeviceIndex(self) != DeviceIndex(src)) {
    CopyHostToPjrt(self, ToCpu(src));
    return self;
  }
  TraceScope scope;
  if (self.is_same(src)) return self;
  AssertNoPartialOverlap(self, src);  // x[1:].copy_(x[:-1])
  StoreOnce(self, src);
  Assign(self, BroadcastTo(DeviceIndex(self), CastForCopy(src, self.scalar_type()), self.sizes().vec()));
  return self;
}

at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                   std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  const at::ScalarType t = dtype.value_or(self.scalar_type());
  const at::Device target = device.value_or(self.device());
  if (IsPjrt(self) && target.type() == c10::DeviceType::PrivateUse1) {
    const int dst = target.has_index() ? TargetDevice(target) : DeviceIndex(self);
    if (dst == DeviceIndex(self)) {
      TraceScope scope;
      return WrapLike(CastForCopy(self, t), dst, self, memory_format);
    }
    at::Tensor out = EmptyLike(self, t, dst, memory_format);
    CopyHostToPjrt(out, ToCpu(self));
    return out;
  }
  if (IsPjrt(self)) {
    TORCH_CHECK(target.is_cpu(), "copy from pjrt to ", target, " is not supported; go through the CPU");
    at::Tensor cpu = ToCpu(self);  // the pjrt tensor's layout (clone's Preserve)
    if (memory_format && *memory_format != at::MemoryFormat::Preserve) cpu = cpu.contiguous(*memory_format);
    return cpu.scalar_type() == t ? cpu : cpu.to(t);
  }
  // host -> pjrt, laid out as PyTorch's _to_copy lays out its result
  at::Tensor out = EmptyLike(self, t, TargetDevice(target), memory_format);
  if (out.numel() > 0) CopyHostToPjrt(out, self);
  return out;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (IsPjrt(dst)) {
      resize_(dst, self.sizes(), std::nullopt);
    } else {
      const_cast<at::Tensor&>(dst).resize_(self.sizes());
    }
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return ToCpu(self).item(); }

at::Tensor clone(const at::Tensor& self, std::optional<at::MemoryFormat> format) {
  TraceScope scope;
  // The conjugate and negative bits applied, as the CPU's clone (through
  // copy_) does: resolve_conj() and resolve_neg() are clones.
  return WrapLike(Val(self), DeviceIndex(self), self, format);
}

bool IsSpecial(const at::Scalar& s) {
  if (s.isBoolean()) return true;
  if (s.isComplex()) return false;  // (a host-fed parameter; toDouble refuses an imaginary part)
  const double v = s.toDouble();
  return v == 0.0 || v == 1.0;
}

// `v` (0-d) written to every element of self. Through an expanded view
// (stride 0), as on the CPU: one value, so each storage element is written
// once, through the view with those dims of size 1.
void FillWith(at::Tensor& self, ir::Value v) {
  const int d = DeviceIndex(self);
  std::vector<int64_t> sizes = self.sizes().vec();
  bool expanded = false;
  for (int64_t k = 0; k < self.dim(); ++k) {
    if (sizes[k] > 1 && self.stride(k) == 0) {
      sizes[k] = 1;
      expanded = true;
    }
  }
  if (!expanded) {
    Assign(self, BroadcastTo(d, v, sizes));
    return;
  }
  at::Tensor once = self.as_strided(sizes, self.strides(), self.storage_offset());
  Assign(once, BroadcastTo(d, v, sizes));
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  TraceScope scope;
  const int d = DeviceIndex(self);
  FillWith(self, IsSpecial(value) ? Const(d, value.toDouble(), self.scalar_type()) : ScalarParam(d, value, self.scalar_type()));
  return self;
}

at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", value.dim(),
              " dimensions.");
  TraceScope scope;
  const int d = DeviceIndex(self);
  // not through an expanded view: the CPU refuses that for a tensor value
  Assign(self, BroadcastTo(d, Operand(value, d, self.scalar_type()), self.sizes().vec()));
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  TraceScope scope;
  FillWith(self, Const(DeviceIndex(self), 0, self.scalar_type()));
  return self;
}

// pjrt tensors are plain strided TensorImpls, so `param.data = pjrt_tensor`
// may swap a CPU parameter's contents in place (Module.to keeps tied
// parameters tied that way, as for CUDA).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) { return t.layout() == at::kStrided && (t.is_cpu() || IsPjrt(t)); };
  return dense(self) && dense(from);
}

// Tensor.record_stream (FSDP, side-stream copies): marks a tensor as used on
// another stream so that a caching allocator does not reuse its memory
// early. Each pjrt device has one stream (device.cc) and the runtime frees a
// buffer only after the programs using it: nothing to record.
void record_stream(at::Tensor& self, at::Stream s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1, "record_stream: expected a pjrt stream for a pjrt tensor, got ",
              s);
}

// _assert_async (what torch.compile's decompositions emit, e.g. one_hot's
// class range): the CPU reads the one value at once and raises when it is
// zero; here it is a check compiled into the program (CheckNone), raised
// when a tensor the program wrote is read, as an out-of-range index is, or
// by sync(wait=True) (a program that writes nothing else runs for it).
void AssertAsync(const at::Tensor& self, const std::string& what) {
  TORCH_CHECK(self.numel() == 1, "Boolean value of Tensor with ",
              self.numel() == 0 ? "no values is ambiguous" : "more than one value is ambiguous");
  TraceScope s;
  const int d = DeviceIndex(self);
  ir::Builder& b = B(d);
  ir::Value v = Val(self);
  CheckNone(d, b.Compare(ir::CompareDir::EQ, v, Fill(d, 0, self.scalar_type(), b.shape(v).dims)), runtime::ErrorKind::kValue,
            what);
}
void assert_async(const at::Tensor& self) { AssertAsync(self, "Expected Tensor with single nonzero value, but got zero"); }
void assert_async_msg(const at::Tensor& self, c10::string_view msg) {
  AssertAsync(self, msg.empty() ? std::string("Assertion is failed") : std::string(msg));
}

}  // namespace

void AssertNoPartialOverlap(const at::Tensor& written, const at::Tensor& operand) {
  const at::MemOverlapStatus status = at::get_overlap_status(written, operand);
  TORCH_CHECK(status != at::MemOverlapStatus::Partial && !(status == at::MemOverlapStatus::TooHard &&
                                                           PartlyOverlaps(written, operand)),
              kSharedMemory,
              status == at::MemOverlapStatus::TooHard
                  ? " (pjrt computes every element from the values before the write; the CPU would write these "
                    "strided views element by element, its answer depending on that order)"
                  : "");
}

void AssertNoOverlap(const at::Tensor& written, const at::Tensor& source, bool accumulate) {
  AssertNoInternalOverlap(written);  // (x.unfold(0, 2, 1).index_add_(...): a shared element written twice)
  at::assert_no_overlap(written, source);  // the CPU's check and message
  TORCH_CHECK((source.numel() == 1 && !accumulate) ||
                  at::get_overlap_status(written, source) != at::MemOverlapStatus::TooHard ||
                  !SharesElement(written, source),
              kSharedMemory,
              " (pjrt reads the whole source before writing; the CPU would write these strided views element by "
              "element, its answer depending on that order)");
}

void AssertNotResizedOverInput(const at::Tensor& out, at::IntArrayRef sizes, const at::Tensor& input) {
  if (out.sizes().equals(sizes) || !input.defined() || !input.has_storage() || !out.has_storage() ||
      !input.storage().is_alias_of(out.storage())) {
    return;
  }
  // resize_ makes out contiguous at its offset: where that is the input
  // itself (an empty out, torch.clamp(y, out=y[:0])), the write is in place
  // and computed, as on the CPU
  if (input.storage_offset() == out.storage_offset() && input.sizes().equals(sizes) && input.is_contiguous()) return;
  TORCH_CHECK(false, kSharedMemory,
              " (an out= tensor resized over the storage of an input: the CPU would read that input's elements "
              "after writing some of them, its answer depending on that order)");
}

void AssertNoInternalOverlap(const at::Tensor& written) {
  const at::MemOverlap status = at::has_internal_overlap(written);
  if (status == at::MemOverlap::No) return;
  TORCH_CHECK(status != at::MemOverlap::Yes && !OverlapsItself(GeometryOf(written), written.numel()),
              "unsupported operation: more than one element of the written-to tensor refers to a single memory "
              "location. Please clone() the tensor before performing the operation.",
              status == at::MemOverlap::TooHard
                  ? " (pjrt computes each element once; the CPU would apply the op to a shared element once per "
                    "view element, in order)"
                  : "");
}

}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_assert_async", TORCH_FN(tpj::aten::assert_async));
  m.impl("_assert_async.msg", TORCH_FN(tpj::aten::assert_async_msg));
  m.impl("empty.memory_format", TORCH_FN(tpj::aten::empty_memory_format));
  m.impl("record_stream", TORCH_FN(tpj::aten::record_stream));
  m.impl("scalar_tensor", TORCH_FN(tpj::aten::scalar_tensor));
  m.impl("slice_scatter", TORCH_FN(tpj::aten::slice_scatter));
  m.impl("copy", TORCH_FN(tpj::aten::copy));
  m.impl("select_scatter", TORCH_FN(tpj::aten::select_scatter));
  m.impl("empty_strided", TORCH_FN(tpj::aten::empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(tpj::aten::efficientzerotensor));
  m.impl("as_strided", TORCH_FN(tpj::aten::as_strided));
  m.impl("view", TORCH_FN(tpj::aten::view));
  m.impl("_reshape_alias", TORCH_FN(tpj::aten::reshape_alias));
  m.impl("resize_", TORCH_FN(tpj::aten::resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(tpj::aten::set_storage));
  m.impl("set_.source_Storage", TORCH_FN(tpj::aten::set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(tpj::aten::set_source_tensor));
  m.impl("set_", TORCH_FN(tpj::aten::set_empty));
  m.impl("is_set_to", TORCH_FN(tpj::aten::is_set_to));
  m.impl("copy_", TORCH_FN(tpj::aten::copy_));
  m.impl("_to_copy", TORCH_FN(tpj::aten::to_copy));
  m.impl("_copy_from", TORCH_FN(tpj::aten::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(tpj::aten::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(tpj::aten::local_scalar_dense));
  m.impl("clone", TORCH_FN(tpj::aten::clone));
  m.impl("fill_.Scalar", TORCH_FN(tpj::aten::fill_scalar));
  m.impl("fill_.Tensor", TORCH_FN(tpj::aten::fill_tensor));
  m.impl("zero_", TORCH_FN(tpj::aten::zero_));
  m.impl("unfold", TORCH_FN(at::native::unfold));  // a CPU/CUDA-registered view op; generic over strides
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(tpj::aten::has_compatible_shallow_copy_type));
}

