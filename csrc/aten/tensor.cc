#include "aten/tensor.h"

#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/AutogradState.h>
#include <c10/util/TypeCast.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include "aten/device.h"
#include "aten/layout.h"
#include "runtime/program.h"

namespace tpj::aten {
namespace {

void DeleteStorage(void* p) { delete static_cast<runtime::Storage*>(p); }

// A c10::DeviceAllocator, so that torch.accelerator's memory calls work
// when pjrt is the current accelerator (it is in every process where
// torch_pjrt is installed, through torch's backend autoload): statistics
// are our live-buffer counts, and there is no cache to empty (buffers are
// freed with their tensors). None of them starts the runtime.
class Allocator final : public c10::DeviceAllocator {
 public:
  bool initialized() override { return runtime::Runtime::Initialized(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    if (!runtime::Runtime::Initialized()) return stats;
    const pjrt::BufferBytes b = runtime::Runtime::Get().LiveBytes(device);
    const auto all = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    for (auto* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      (*bytes)[all].current = b.in_use;
      (*bytes)[all].peak = b.peak;
    }
    stats.allocation[all].current = stats.active[all].current = stats.segment[all].current = b.buffers;
    return stats;
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {  // torch.accelerator.get_memory_info
    const auto [free, total] = runtime::DeviceMemoryInfo(runtime::Runtime::Get().client(), device);
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override {
    if (runtime::Runtime::Initialized()) runtime::Runtime::Get().ResetPeakBytes(device);
  }

  c10::DataPtr allocate(size_t nbytes) override { return Make(CurrentDevice(), nbytes); }

  static c10::DataPtr Make(int device, size_t nbytes) {
    // A thread that creates pjrt tensors runs their backward passes itself
    // (docs/performance.md): autograd would otherwise queue each pjrt node to
    // its per-device thread and wake the caller at the end, two hand-offs
    // that cost 15 % of a small training step on 2 cores; the nodes only
    // trace, so that thread buys no overlap. TORCH_PJRT_AUTOGRAD_THREADS=1
    // keeps autograd's default. Set once per thread, so a user's own
    // torch.autograd.set_multithreading_enabled afterwards still wins.
    static thread_local const bool inline_backward = [] {
      if (runtime::Runtime::Get().options().autograd_threads) return false;
      c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
      return true;
    }();
    (void)inline_backward;
    auto* s = new runtime::Storage(device, nbytes);
    // The data pointer is a token, never dereferenced: pjrt memory is only
    // reached through the runtime. It is unique per storage and non-null so
    // that PyTorch's aliasing checks behave.
    return {s, s, &DeleteStorage, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "pjrt storages have no host-addressable data; use tensor.cpu()");
  }
};

Allocator& TheAllocator() {
  static Allocator a;
  return a;
}

}  // namespace

c10::Allocator* PjrtAllocator() { return &TheAllocator(); }

ir::DType ToIr(at::ScalarType t) {
  switch (t) {
    case at::kBool: return ir::DType::Bool;
    case at::kChar: return ir::DType::I8;
    case at::kShort: return ir::DType::I16;
    case at::kInt: return ir::DType::I32;
    case at::kLong: return ir::DType::I64;
    case at::kByte: return ir::DType::U8;
    case at::kUInt16: return ir::DType::U16;
    case at::kUInt32: return ir::DType::U32;
    case at::kUInt64: return ir::DType::U64;
    case at::kHalf: return ir::DType::F16;
    case at::kBFloat16: return ir::DType::BF16;
    case at::kFloat: return ir::DType::F32;
    case at::kDouble: return ir::DType::F64;
    case at::kComplexFloat: return ir::DType::C64;
    case at::kComplexDouble: return ir::DType::C128;
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2:
    case at::kFloat8_e4m3fnuz:
    case at::kFloat8_e5m2fnuz:
    case at::kFloat8_e8m0fnu:
      // PJRT has these types; torch-pjrt does not carry them (yet): its
      // lowerings, conversions and host transfers are written for the others
      // (NotImplementedError, as PyTorch's kernels refuse a dtype: a TypeError
      // would become NotImplemented in an operator, `h + 1j`, losing this message)
      TORCH_CHECK_NOT_IMPLEMENTED(false, "dtype ", t, " is not supported on the pjrt device: torch-pjrt does not handle 8-bit "
                       "floats yet; keep the tensor in bfloat16 (or on the CPU) and convert where needed");
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "dtype ", t, " is not supported on the pjrt device (PJRT has no buffer type for it)");
  }
}

at::ScalarType ToAten(ir::DType t) {
  switch (t) {
    case ir::DType::Bool: return at::kBool;
    case ir::DType::I8: return at::kChar;
    case ir::DType::I16: return at::kShort;
    case ir::DType::I32: return at::kInt;
    case ir::DType::I64: return at::kLong;
    case ir::DType::U8: return at::kByte;
    case ir::DType::U16: return at::kUInt16;
    case ir::DType::U32: return at::kUInt32;
    case ir::DType::U64: return at::kUInt64;
    case ir::DType::F16: return at::kHalf;
    case ir::DType::BF16: return at::kBFloat16;
    case ir::DType::F32: return at::kFloat;
    case ir::DType::F64: return at::kDouble;
    case ir::DType::C64: return at::kComplexFloat;
    case ir::DType::C128: return at::kComplexDouble;
  }
  return at::kFloat;
}

bool IsPjrt(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

int DeviceIndex(const at::Tensor& t) { return t.device().has_index() ? t.device().index() : 0; }

runtime::Storage& StorageOf(const at::Tensor& t) {
  TORCH_CHECK(IsPjrt(t), "expected all tensors to be on the pjrt device, but an op got a tensor on ", t.device(),
              " among pjrt tensors (as on CUDA, one op does not mix devices, e.g. a CPU tensor updated in place "
              "with a pjrt operand); move one side: t.to('pjrt') or t.cpu()");
  runtime::Storage* s = PjrtStorage(t.storage().data_ptr());
  TORCH_CHECK(s != nullptr, "a pjrt tensor whose memory torch-pjrt did not allocate (imported through DLPack, made "
              "by from_blob, or a slice of a pjrt storage, untyped_storage()[a:b], which points inside it): pjrt "
              "memory is reached only through the tensors torch-pjrt makes; slice the tensor instead, and move "
              "data with .to('pjrt') and .cpu()");
  return *s;
}

runtime::Storage* PjrtStorage(const c10::DataPtr& p) {
  if (p.get_deleter() == &DeleteStorage) return static_cast<runtime::Storage*>(p.get_context());
  // at::from_blob of a pjrt storage's data pointer, which keeps no context
  // (PyTorch's legacy serialization does this to copy a storage to the host)
  if (p.get_context() == nullptr) return runtime::Storage::FromAddress(p.get());
  return nullptr;  // another deleter's memory, e.g. a DLPack capsule's
}

void ResizeStorage(const c10::Storage& storage, size_t nbytes, at::ScalarType type) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  runtime::Storage* s = PjrtStorage(storage.data_ptr());
  TORCH_CHECK(s != nullptr, "a pjrt storage that torch-pjrt did not allocate cannot be resized");
  runtime::TraceScope scope;
  runtime::Runtime::Get().Resize(*s, nbytes, ToIr(type));
  impl->set_nbytes(nbytes);
}

runtime::StridedView ViewOf(const at::Tensor& t) {
  return {t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

ir::Builder& B(int device) { return runtime::Runtime::Get().builder(device); }

std::vector<int64_t> Dims(const ir::Builder& b, ir::Value v) { return b.shape(v).dims; }

int64_t WrapDim(int64_t dim, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  TORCH_CHECK_INDEX(dim >= -r && dim < r, "Dimension out of range (expected to be in range of [", -r, ", ", r - 1,
                    "], but got ", dim, ")");
  return dim < 0 ? dim + r : dim;
}

// conj(x) = real(x) - i imag(x): a lazy conjugate view's memory holds the
// conjugate of its value (and the other way round).
ir::Value Conjugate(ir::Builder& b, ir::Value x) {
  if (!ir::IsComplex(b.shape(x).dtype)) return x;
  return b.Complex(b.Real(x), b.Unary(ir::Op::Neg, b.Imag(x)));
}

ir::Value Val(const at::Tensor& t) {
  ir::Value v = ValMemory(t);
  ir::Builder& b = B(DeviceIndex(t));
  if (t.is_conj()) v = Conjugate(b, v);
  return t.is_neg() ? b.Unary(ir::Op::Neg, v) : v;
}

namespace {

// A view into device memory that outlives the step (a data set sliced into
// mini-batches, a replay buffer or a queue written at a moving position, a
// KV cache), including memory this trace has already written, reads and
// writes at an offset fed as a parameter, so the next position's program is
// this one. Views of values born in this trace (a chunk of an activation)
// keep constant offsets, which XLA folds into its fusions.
std::optional<ir::Value> OffsetParam(const runtime::Storage& s, const runtime::StridedView& view) {
  auto& rt = runtime::Runtime::Get();
  if (!s.has_buffer() || s.sharding() || rt.SpmdInUse()) return std::nullopt;
  const int64_t offset = view.offset;
  return rt.ScalarValue(s.device(), ir::DType::I64, &offset);
}

// A tensor must lie within its storage: untyped_storage().resize_ shrinks
// or frees (FSDP, offloading) the memory under live tensors, where the CPU
// would read freed memory. Refused, with PyTorch's message for the freed case.
void CheckWithinStorage(const at::Tensor& t, const runtime::Storage& s) {
  if (t.numel() == 0) return;
  const size_t need = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(), t.storage_offset());
  if (need <= s.nbytes()) return;
  TORCH_CHECK(s.nbytes() != 0, "The tensor has a non-zero number of elements, but its data is not allocated yet: its "
              "storage was resized to 0 bytes (untyped_storage().resize_); resize it again before using the tensor");
  TORCH_CHECK(false, "a pjrt tensor of ", need, " bytes (with its offset) reaches past the end of its storage of ",
              s.nbytes(), " bytes (shrunk by untyped_storage().resize_)");
}

}  // namespace

ir::Value ValMemory(const at::Tensor& t) {
  auto& rt = runtime::Runtime::Get();
  runtime::Storage& s = StorageOf(t);
  const ir::DType dt = ToIr(t.scalar_type());
  ir::Value flat = RaisingTensorErrors([&] { return rt.ReadFlat(s, dt); });
  rt.DescribeRead(s, flat, [&] {
    std::string desc = std::string(ir::Name(dt)) + "[";
    for (int64_t i = 0; i < t.dim(); ++i) desc += (i ? "," : "") + std::to_string(t.size(i));
    return desc + "]";
  });
  ir::Builder& b = rt.builder(s.device());
  // The common case, the whole storage in order, without a strided view.
  if (t.is_contiguous() && t.storage_offset() == 0 && t.numel() > 0 && t.numel() == b.shape(flat).dims.at(0)) {
    return b.Reshape(flat, t.sizes().vec());
  }
  CheckWithinStorage(t, s);
  const runtime::StridedView view = ViewOf(t);
  const std::optional<ir::Value> o = OffsetParam(s, view);
  return runtime::ReadStrided(b, flat, view, o ? &*o : nullptr);
}

namespace {

// A float converted to an integer type as PyTorch's CPU cast does on x86-64
// (c10::convert: through int64 for int64 and the unsigned types, through
// int32 for the others): NaN and values outside that intermediate type give
// its lowest value, and narrower types keep the low bits (-1.0 as uint8 is
// 255, 300.5 is 44). XLA's convert saturates instead (NaN gives 0).
ir::Value FloatToInt(ir::Builder& b, ir::Value x, ir::DType to) {
  using ir::DType;
  if (to == DType::U64) {
    // [2^63, 2^64) is in range for uint64 (the CPU converts it exactly):
    // converted less 2^63, which is added back as an integer.
    const std::vector<int64_t>& dims = b.shape(x).dims;
    const DType from = b.shape(x).dtype;
    const double half = 9223372036854775808.0;
    ir::Value high = b.Compare(ir::CompareDir::GE, x, b.Full(from, dims, half));
    ir::Value low = b.Convert(FloatToInt(b, b.Select(high, b.Binary(ir::Op::Sub, x, b.Full(from, dims, half)), x), DType::I64),
                              DType::U64);
    return b.Select(high, b.Binary(ir::Op::Add, low, b.Full(DType::U64, dims, half)), low);
  }
  const DType via = to == DType::I64 || to == DType::U8 || to == DType::U32 || to == DType::U64 ? DType::I64 : DType::I32;
  const double limit = via == DType::I64 ? 9223372036854775808.0 : 2147483648.0;
  const std::vector<int64_t> dims = b.shape(x).dims;
  const DType from = b.shape(x).dtype;
  ir::Value bad = b.Binary(ir::Op::Or, b.Compare(ir::CompareDir::NE, x, x),
                           b.Binary(ir::Op::Or, b.Compare(ir::CompareDir::GE, x, b.Full(from, dims, limit)),
                                    b.Compare(ir::CompareDir::LT, x, b.Full(from, dims, -limit))));
  ir::Value r = b.Select(bad, b.Full(via, dims, -limit), b.Convert(x, via));
  return b.Convert(r, to);
}

}  // namespace

ir::Value ValAs(const at::Tensor& t, at::ScalarType dtype) {
  ir::Value v = Val(t);
  ir::Builder& b = B(DeviceIndex(t));
  const ir::DType to = ToIr(dtype);
  at::ScalarType from = t.scalar_type();
  if (at::isComplexType(from) && !at::isComplexType(dtype)) {
    if (dtype == at::kBool) {  // z != 0, as the CPU's cast: either part nonzero (NaN included)
      auto nonzero = [&](ir::Value x) { return b.Compare(ir::CompareDir::NE, x, b.Full(b.shape(x).dtype, b.shape(x).dims, 0)); };
      return b.Binary(ir::Op::Or, nonzero(b.Real(v)), nonzero(b.Imag(v)));
    }
    v = b.Real(v);  // to a real type: the real part, then as from its real type
    from = c10::toRealValueType(from);
  }
  if (at::isFloatingType(from) && at::isIntegralType(dtype, /*includeBool=*/false)) return FloatToInt(b, v, to);
  return b.Convert(v, to);
}

ir::Value Operand(const at::Tensor& t, int device, at::ScalarType dtype) {
  if (IsPjrt(t)) {
    TORCH_CHECK(DeviceIndex(t) == device, "expected all tensors to be on the same pjrt device, found pjrt:", device,
                " and pjrt:", DeviceIndex(t));
    return ValAs(t, dtype);
  }
  TORCH_CHECK(t.dim() == 0, "expected all tensors to be on the pjrt device; got a ", t.dim(),
              "-d tensor on ", t.device(), " (only 0-d CPU tensors, i.e. numbers, mix with pjrt tensors)");
  return ScalarParam(device, t.item(), dtype, /*wrapped=*/true);  // a Python number of a binary op
}

at::Tensor Empty(at::IntArrayRef sizes, at::ScalarType dtype, int device) {
  ToIr(dtype);  // refuse unsupported dtypes early
  for (int64_t d : sizes) TORCH_CHECK(d >= 0, "negative dimension ", d, " in size ", sizes);
  // ATen's own count, which refuses sizes whose byte count overflows
  const size_t nbytes = at::detail::computeStorageNbytesContiguous(sizes, c10::elementSize(dtype));
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       Allocator::Make(device, nbytes), PjrtAllocator(), true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    caffe2::TypeMeta::fromScalarType(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

at::Tensor Wrap(ir::Value v, int device) {
  ir::Builder& b = B(device);
  const ir::Shape& shape = b.shape(v);  // read before the reshape below adds a node
  at::Tensor t = Empty(shape.dims, ToAten(shape.dtype), device);
  const int64_t numel = shape.numel();
  runtime::Runtime::Get().AssignFlat(StorageOf(t), b.Reshape(v, {numel}));
  return t;
}

at::Tensor EmptyLike(const at::Tensor& like, at::ScalarType dtype, int device, std::optional<at::MemoryFormat> format) {
  at::Tensor t = Empty(like.sizes(), dtype, device);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const at::MemoryFormat f = format.value_or(at::MemoryFormat::Preserve);
  if (f != at::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(f);  // PyTorch's checks: channels_last needs rank 4, ...
  } else if (like.is_non_overlapping_and_dense()) {
    impl->set_sizes_and_strides(like.sizes(), like.strides());
  } else {  // a gap or an overlap: dense, in like's order of strides (empty_like's rule)
    impl->set_sizes_and_strides(like.sizes(), at::infer_dense_strides(like.sizes(), like.strides()));
  }
  return t;
}

namespace {

// A fresh row-major result, held by nobody else: its storage can be laid out anew.
bool Relayoutable(const at::Tensor& r) {
  return r.defined() && IsPjrt(r) && r.numel() > 1 && r.is_contiguous() && r.storage_offset() == 0 &&
         r.storage().use_count() == 1 && !r.is_conj() && !r.is_neg();
}

// The same value, stored with `strides` (non-overlapping and dense).
void Relayout(const at::Tensor& r, at::IntArrayRef strides) {
  runtime::TraceScope s;
  runtime::Metrics::Get().Add("relayouts");
  ir::Value v = Val(r);
  r.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes().vec(), strides);
  Assign(r, v);
}

}  // namespace

bool HasOtherUnitStrides(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t i = t.dim() - 1; i >= 0; --i) {
    if (t.size(i) == 1 && t.stride(i) != expected) return true;
    expected *= std::max<int64_t>(t.size(i), 1);
  }
  return false;
}

namespace {

// `r` with `strides` (dense), moving data only where a dimension of more
// than one element changes its stride.
void Restride(const at::Tensor& r, const std::vector<int64_t>& strides) {
  if (r.strides() == at::IntArrayRef(strides)) return;
  for (int64_t i = 0; i < r.dim(); ++i) {
    if (r.size(i) > 1 && r.stride(i) != strides[static_cast<size_t>(i)]) return Relayout(r, strides);
  }
  r.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), strides);
}

}  // namespace

void RelayoutAsTensorIterator(const at::Tensor& r, const at::Tensor* const* operands, size_t n, bool number) {
  if (!Relayoutable(r)) return;
  const int64_t nd = r.dim();
  const at::IntArrayRef shape = r.sizes();
  // TensorIterator's fast setup: every operand of the result's shape and of one layout.
  bool same_shape = !number, all_contiguous = true, all_cl = true, all_cl3d = true, same_dense = true;
  const at::Tensor* first = nullptr;
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor* t = operands[k];
    if (!t) continue;
    same_shape = same_shape && t->sizes() == shape;
    all_contiguous = all_contiguous && t->is_contiguous();
    all_cl = all_cl && t->is_contiguous(at::MemoryFormat::ChannelsLast);
    all_cl3d = all_cl3d && t->is_contiguous(at::MemoryFormat::ChannelsLast3d);
    if (!first) first = t;
    same_dense = same_dense && t->is_non_overlapping_and_dense() && t->strides() == first->strides();
  }
  if (!first) return;
  if (same_shape) {
    if (all_contiguous) return;
    if (all_cl || all_cl3d) return RelayoutTo(r, all_cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d);
    if (same_dense) return Restride(r, first->strides().vec());
  }
  // TensorIterator::reorder_dimensions: perm[0] the fastest-moving dimension.
  auto stride = [&](const at::Tensor& t, int64_t d) -> int64_t {  // broadcast dimensions read as 0
    const int64_t td = d - (nd - t.dim());
    return td < 0 || (t.size(td) == 1 && shape[d] != 1) ? 0 : t.stride(td);
  };
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (size_t k = 0; k < n; ++k) {
      const at::Tensor* t = operands[k];
      if (!t) continue;
      const int64_t s0 = stride(*t, d0), s1 = stride(*t, d1);
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  std::vector<int64_t> perm(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) perm[static_cast<size_t>(i)] = nd - 1 - i;
  for (int64_t i = 1; i < nd; ++i) {
    int64_t d1 = i;
    for (int64_t d0 = i - 1; d0 >= 0; --d0) {
      const int c = should_swap(perm[static_cast<size_t>(d0)], perm[static_cast<size_t>(d1)]);
      if (c > 0) {
        std::swap(perm[static_cast<size_t>(d0)], perm[static_cast<size_t>(d1)]);
        d1 = d0;
      } else if (c < 0) {
        break;
      }
    }
  }
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  int64_t next = 1;
  for (int64_t d : perm) {
    strides[static_cast<size_t>(d)] = next;
    next *= shape[d];
  }
  Restride(r, strides);
}

void RelayoutTo(const at::Tensor& r, at::MemoryFormat f) {
  if (!Relayoutable(r) || r.is_contiguous(f)) return;
  if (f == at::MemoryFormat::ChannelsLast && r.dim() == 4) Relayout(r, c10::get_channels_last_strides_2d(r.sizes()));
  if (f == at::MemoryFormat::ChannelsLast3d && r.dim() == 5) Relayout(r, c10::get_channels_last_strides_3d(r.sizes()));
}

at::Tensor WrapLike(ir::Value v, int device, const at::Tensor& like, std::optional<at::MemoryFormat> format) {
  const bool keep = !format || *format == at::MemoryFormat::Preserve || *format == at::MemoryFormat::Contiguous;
  if (keep && like.is_contiguous()) {  // the common case
    at::Tensor t = Wrap(v, device);
    // Preserved strides are like's own, also in size-1 dims (which address
    // nothing), as the CPU's empty_like gives them: AOTAutograd plans views
    // of the result by those strides.
    if ((!format || *format == at::MemoryFormat::Preserve) && t.numel() > 0 && HasOtherUnitStrides(like)) {
      Restride(t, like.strides().vec());
    }
    return t;
  }
  at::Tensor t = EmptyLike(like, ToAten(B(device).shape(v).dtype), device, format);
  Assign(t, v);
  return t;
}

namespace {

// Storage s's flat value (as dt) with the elements `view` selects replaced by
// v (in view's shape); the view's offset is a parameter when s has a buffer.
// The one write path of Assign and Scattered.
ir::Value WrittenFlat(runtime::Storage& s, ir::DType dt, const runtime::StridedView& view, ir::Value v) {
  auto& rt = runtime::Runtime::Get();
  ir::Value flat = RaisingTensorErrors([&] { return rt.ReadFlat(s, dt); });
  const std::optional<ir::Value> o = OffsetParam(s, view);
  try {
    return runtime::WriteStrided(rt.builder(s.device()), flat, view, v, o ? &*o : nullptr);
  } catch (const ir::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

void Assign(const at::Tensor& dst, ir::Value v) {
  auto& rt = runtime::Runtime::Get();
  runtime::Storage& s = StorageOf(dst);
  ir::Builder& b = rt.builder(s.device());
  const ir::DType dt = ToIr(dst.scalar_type());
  v = b.Convert(v, dt);
  const std::vector<int64_t> want = dst.sizes().vec();
  if (b.shape(v).dims != want) v = BroadcastTo(s.device(), v, want);
  if (dst.is_neg()) v = b.Unary(ir::Op::Neg, v);  // memory holds -value
  if (dst.is_conj()) v = Conjugate(b, v);           // memory holds conj(value)
  const runtime::StridedView view = ViewOf(dst);
  const int64_t numel = static_cast<int64_t>(s.nbytes() / c10::elementSize(dst.scalar_type()));
  if (!s.dtype() || *s.dtype() == dt) {
    if (runtime::CoversStorage(view, numel)) {
      rt.AssignFlat(s, b.Reshape(v, {numel}));
      return;
    }
    if (runtime::CoversStoragePermuted(view, numel)) {  // channels_last, a transposed layout
      rt.AssignFlat(s, runtime::FlatOfCover(b, view, v));
      return;
    }
  }
  CheckWithinStorage(dst, s);
  rt.AssignFlat(s, WrittenFlat(s, dt, view, v));
}

at::Tensor WrapStrided(ir::Value v, int device, const at::Tensor& like) {
  if (at::has_internal_overlap(like) == at::MemOverlap::Yes) return WrapLike(v, device, like, std::nullopt);
  int64_t extent = 0;  // the storage the strides reach: none when empty
  if (like.numel() > 0) {
    extent = 1;
    for (int64_t d = 0; d < like.dim(); ++d) extent += (like.size(d) - 1) * like.stride(d);
  }
  const at::ScalarType dtype = ToAten(B(device).shape(v).dtype);
  at::Tensor t = Empty({extent}, dtype, device);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides());
  Assign(t, v);
  return t;
}

std::optional<at::Tensor> Scattered(const at::Tensor& base, const at::Tensor& part, ir::Value v) {
  auto& rt = runtime::Runtime::Get();
  runtime::Storage& s = StorageOf(base);
  const ir::DType dt = ToIr(base.scalar_type());
  if (base.is_conj() || base.is_neg() || part.is_conj() || part.is_neg() || (s.dtype() && *s.dtype() != dt) ||
      at::has_internal_overlap(base) == at::MemOverlap::Yes) {
    return std::nullopt;
  }
  ir::Builder& b = rt.builder(s.device());
  v = b.Convert(v, dt);
  if (b.shape(v).dims != part.sizes().vec()) v = BroadcastTo(s.device(), v, part.sizes().vec());
  const ir::Value written = WrittenFlat(s, dt, ViewOf(part), v);
  const runtime::StridedView whole = ViewOf(base);
  const int64_t numel = static_cast<int64_t>(s.nbytes() / c10::elementSize(base.scalar_type()));
  if (runtime::CoversStoragePermuted(whole, numel)) {  // the storage's new value, seen as base (the common case)
    at::Tensor t = Wrap(written, s.device());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(base.sizes(), base.strides());
    return t;
  }
  const std::optional<ir::Value> ob = OffsetParam(s, whole);  // base is a part of its storage: read it back
  try {
    return WrapStrided(runtime::ReadStrided(b, written, whole, ob ? &*ob : nullptr), s.device(), base);
  } catch (const ir::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

namespace {

// s as T: checked by Scalar::to, or (wrapped) by c10::convert, TensorIterator's cast.
template <typename T>
T ScalarAs(const at::Scalar& s, bool wrapped) {
  if (!wrapped) return s.to<T>();
  if (s.isFloatingPoint()) return c10::convert<T>(s.toDouble());
  if (s.isBoolean()) return static_cast<T>(s.toBool());
  if (s.type() == at::kUInt64) return c10::convert<T>(s.toUInt64());
  if (s.isIntegral(false)) return c10::convert<T>(s.toLong());
  return s.to<T>();  // complex: Scalar's own rule
}

}  // namespace

void RefuseOutOfRange(const at::Scalar& s, at::ScalarType dtype) {
  if (dtype == at::kHalf) (void)s.to<at::Half>();
  if (dtype == at::kBFloat16) (void)s.to<at::BFloat16>();
}

ir::Value ScalarParam(int device, const at::Scalar& s, at::ScalarType dtype, bool wrapped) {
  // The common dtypes convert on the stack; a CPU tensor per number cost an
  // allocation and a dispatch.
  auto& rt = runtime::Runtime::Get();
  switch (dtype) {
    case at::kFloat: { const float v = ScalarAs<float>(s, wrapped); return rt.ScalarValue(device, ir::DType::F32, &v); }
    case at::kDouble: { const double v = ScalarAs<double>(s, wrapped); return rt.ScalarValue(device, ir::DType::F64, &v); }
    case at::kLong: { const int64_t v = ScalarAs<int64_t>(s, wrapped); return rt.ScalarValue(device, ir::DType::I64, &v); }
    case at::kInt: { const int32_t v = ScalarAs<int32_t>(s, wrapped); return rt.ScalarValue(device, ir::DType::I32, &v); }
    case at::kBool: { const uint8_t v = s.to<bool>() ? 1 : 0; return rt.ScalarValue(device, ir::DType::Bool, &v); }
    default: break;
  }
  if (!wrapped) RefuseOutOfRange(s, dtype);
  // scalar_tensor fills (checked); .to casts as TensorIterator does
  at::Tensor host = wrapped ? at::scalar_tensor(s, at::TensorOptions().dtype(s.type())).to(dtype)
                            : at::scalar_tensor(s, at::TensorOptions().dtype(dtype));
  return runtime::Runtime::Get().ScalarValue(device, ToIr(dtype), host.const_data_ptr());
}

ir::Value Const(int device, double v, at::ScalarType dtype) { return B(device).ScalarConstant(ToIr(dtype), v); }

ir::Value ExtremeConst(int device, at::ScalarType dtype, bool lowest) {
  // max, min, argmax, cummax, max pooling, ...: as their CPU kernels, which
  // are not built for complex types
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(dtype), "maximum and minimum (max, min, amax, argmax, cummax, "
                              "max pooling, ...) are not implemented for '", dtype, "': complex numbers have no order");
  // Straight from the type's limits: a host tensor here cost a trip through
  // the dispatcher on every max/min reduction traced.
  std::vector<uint8_t> bytes;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "extreme_const", [&] {
    using limits = std::numeric_limits<scalar_t>;
    scalar_t v;
    if constexpr (limits::has_infinity) {
      v = lowest ? -limits::infinity() : limits::infinity();
    } else {
      v = lowest ? limits::lowest() : limits::max();
    }
    bytes.resize(sizeof(scalar_t));
    std::memcpy(bytes.data(), &v, sizeof(scalar_t));
  });
  return B(device).Constant({ToIr(dtype), {}}, std::move(bytes));
}

ir::Value BroadcastTo(int device, ir::Value v, const std::vector<int64_t>& to) {
  ir::Builder& b = B(device);
  const std::vector<int64_t> from = b.shape(v).dims;
  if (from == to) return v;
  TORCH_CHECK(from.size() <= to.size(), "cannot broadcast shape ", at::IntArrayRef(from), " to ", at::IntArrayRef(to));
  const size_t lead = to.size() - from.size();
  std::vector<int64_t> dims;
  std::vector<int64_t> kept;
  std::vector<int64_t> kept_sizes;
  for (size_t i = 0; i < from.size(); ++i) {
    TORCH_CHECK(from[i] == to[lead + i] || from[i] == 1, "cannot broadcast shape ", at::IntArrayRef(from), " to ",
                at::IntArrayRef(to));
    if (from[i] == to[lead + i]) {
      kept.push_back(static_cast<int64_t>(lead + i));
      kept_sizes.push_back(from[i]);
    }
  }
  // Drop the size-1 dims that broadcast, then broadcast into place.
  ir::Value r = b.Reshape(v, kept_sizes);
  return b.BroadcastInDim(r, to, kept);
}

void CheckNone(int device, ir::Value bad, runtime::ErrorKind kind, const std::string& what) {
  auto& rt = runtime::Runtime::Get();
  if (!rt.checks_enabled()) return;
  ir::Builder& b = B(device);
  const int64_t rank = b.shape(bad).rank();
  if (rank > 0) {
    std::vector<int64_t> all(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) all[static_cast<size_t>(i)] = i;
    bad = b.Reduce(bad, b.ScalarConstant(ir::DType::Bool, 0), all, ir::ReduceKind::Or);
  }
  rt.AddCheck(device, bad, kind, what);
}

ir::Value CheckedIndex(int device, ir::Value idx, int64_t size, bool negative_ok, const char* op,
                       runtime::ErrorKind kind) {
  ir::Builder& b = B(device);
  idx = b.Convert(idx, ir::DType::I64);
  const auto shape = b.shape(idx).dims;
  if (size == 0 && b.shape(idx).numel() > 0) {
    // every index is out of range, known while tracing: raise at once, as the CPU
    const std::string what = std::string(op) + ": index out of range: indexing a dimension of size 0";
    if (kind == runtime::ErrorKind::kIndex) TORCH_CHECK_INDEX(false, what);
    TORCH_CHECK(false, what);
  }
  auto full = [&](int64_t v) { return b.Full(ir::DType::I64, shape, static_cast<double>(v)); };
  const int64_t lo = negative_ok ? -size : 0;
  ir::Value bad = b.Binary(ir::Op::Or, b.Compare(ir::CompareDir::LT, idx, full(lo)),
                           b.Compare(ir::CompareDir::GE, idx, full(size)));
  CheckNone(device, bad, kind,
            std::string(op) + ": index out of range: an index is outside [" + std::to_string(lo) + ", " +
                std::to_string(size) + ") for a dimension of size " + std::to_string(size));
  if (!negative_ok) return idx;
  ir::Value neg = b.Compare(ir::CompareDir::LT, idx, full(0));
  return b.Select(neg, b.Binary(ir::Op::Add, idx, full(size)), idx);
}

int CommonDevice(std::initializer_list<const at::Tensor*> ts) {
  int device = -1;
  for (const at::Tensor* t : ts) {
    if (t == nullptr || !IsPjrt(*t)) continue;
    const int d = DeviceIndex(*t);
    TORCH_CHECK(device < 0 || device == d, "expected all tensors to be on the same pjrt device, found pjrt:", device,
                " and pjrt:", d);
    device = d;
  }
  TORCH_CHECK(device >= 0, "no pjrt tensor among the arguments");
  return device;
}

bool IsPending(const at::Tensor& t) {
  runtime::TraceScope scope;
  return StorageOf(t).pending();
}

bool HasBuffer(const at::Tensor& t) {
  runtime::TraceScope scope;
  return StorageOf(t).has_buffer();
}

void Settle(const std::vector<at::Tensor>& ts) {
  std::unordered_set<const runtime::Storage*> done;
  for (const auto& t : ts) {
    if (!t.defined() || !IsPjrt(t) || !t.has_storage()) continue;
    runtime::Storage& s = StorageOf(t);
    if (done.insert(&s).second) RaisingTensorErrors([&] { runtime::Runtime::Get().Settle(s); });
  }
}

std::string StableHloOf(const std::vector<at::Tensor>& ts) {
  runtime::TraceScope scope;
  TORCH_CHECK(!ts.empty(), "give at least one pjrt tensor");
  const int d = DeviceIndex(ts[0]);
  std::vector<ir::Value> values;
  for (const auto& t : ts) {
    TORCH_CHECK(IsPjrt(t) && DeviceIndex(t) == d, "all tensors must be on pjrt:", d);
    values.push_back(Val(t));
  }
  return runtime::Runtime::Get().ProgramText(d, values);
}

at::Tensor ReplicatedFromParts(const std::vector<at::Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "need one part per replica, got none");
  std::vector<at::Tensor> dense;
  std::vector<const void*> data;
  for (const at::Tensor& p : parts) {
    TORCH_CHECK(p.sizes() == parts[0].sizes() && p.scalar_type() == parts[0].scalar_type(),
                "replica parts must share shape and dtype");
    dense.push_back(p.contiguous());
    data.push_back(dense.back().const_data_ptr());
  }
  at::Tensor out = Empty(parts[0].sizes(), parts[0].scalar_type(), 0);
  RaisingTensorErrors([&] { runtime::Runtime::Get().UploadReplicas(StorageOf(out), data, ToIr(parts[0].scalar_type())); });
  return out;
}

at::Tensor FlatAs(const at::Tensor& flat, at::ScalarType type) {
  const int64_t width = static_cast<int64_t>(c10::elementSize(type));
  const int64_t bytes = flat.numel() * static_cast<int64_t>(flat.element_size());
  if (bytes % width == 0) return flat.view(type);
  return flat.narrow(0, 0, bytes / width * width / static_cast<int64_t>(flat.element_size())).view(type);
}

std::vector<at::Tensor> ReplicaValues(const at::Tensor& t) {
  auto& rt = runtime::Runtime::Get();
  runtime::Storage& s = StorageOf(t);
  const at::ScalarType storage_type = ToAten(rt.TypeOf(s, ToIr(t.scalar_type())));
  const int64_t numel = static_cast<int64_t>(s.nbytes() / c10::elementSize(storage_type));
  std::vector<at::Tensor> flats;
  std::vector<void*> dsts;
  for (size_t r = 0; r < rt.ReplicaCount(s); ++r) {
    flats.push_back(at::empty({numel}, at::TensorOptions().dtype(storage_type)));
    dsts.push_back(flats.back().data_ptr());
  }
  RaisingTensorErrors([&] { rt.DownloadReplicas(s, dsts); });
  std::vector<at::Tensor> out;
  for (at::Tensor& flat : flats) {
    if (storage_type != t.scalar_type()) flat = FlatAs(flat, t.scalar_type());
    out.push_back(flat.as_strided(t.sizes(), t.strides(), t.storage_offset()).clone());
  }
  return out;
}

}  // namespace tpj::aten
