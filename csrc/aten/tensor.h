// Bridges between ATen tensors on the pjrt device and the lazy runtime.
//
// A pjrt tensor is a plain c10::TensorImpl with real sizes, strides and
// storage offset over a storage made by our allocator; the storage's
// DataPtr context is a runtime::Storage that holds the flat contents (device
// buffer or pending IR value). PyTorch's own view machinery therefore works
// unchanged; reads and writes through views become IR (runtime/strided.h).
//
// Every function here expects the caller to hold a runtime::TraceScope.
// Storages are the runtime's: this layer reads them through runtime methods.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/runtime.h"

namespace tpj::aten {

// Runs `f`, turning a runtime::TensorError (reading a tensor whose value was
// lost, or whose program failed a check) into the c10 error PyTorch maps to
// the right Python exception (IndexError for indices).
template <class F>
auto RaisingTensorErrors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const runtime::TensorError& e) {
    TORCH_CHECK_INDEX(e.kind() != runtime::ErrorKind::kIndex, e.what());
    TORCH_CHECK_WITH(OutOfMemoryError, e.kind() != runtime::ErrorKind::kOutOfMemory, e.what());
    TORCH_CHECK_LINALG(e.kind() != runtime::ErrorKind::kLinAlg, e.what());
    TORCH_CHECK(false, e.what());
  }
}

ir::DType ToIr(at::ScalarType t);  // NotImplementedError for dtypes torch-pjrt does not carry
at::ScalarType ToAten(ir::DType t);

c10::Allocator* PjrtAllocator();
bool IsPjrt(const at::Tensor& t);
int DeviceIndex(const at::Tensor& t);  // local device index
runtime::Storage& StorageOf(const at::Tensor& t);
// The runtime storage behind a pjrt storage's data pointer; null when
// torch-pjrt did not allocate it (a DLPack import, from_blob with a deleter).
runtime::Storage* PjrtStorage(const c10::DataPtr& p);
// Resizes a pjrt storage to `nbytes` with the CPU's semantics (its first
// bytes kept, a grown tail of zeros, 0 frees its memory); `type` types a
// storage never written. Sets the StorageImpl's size.
void ResizeStorage(const c10::Storage& storage, size_t nbytes, at::ScalarType type = at::kByte);
runtime::StridedView ViewOf(const at::Tensor& t);
ir::Builder& B(int device);

// The tensor's value in the current trace (any strides), with its dtype;
// lazy conjugate and negative bits applied.
ir::Value Val(const at::Tensor& t);
// The complex conjugate of `x` (x itself when real).
ir::Value Conjugate(ir::Builder& b, ir::Value x);
// The elements in memory, ignoring lazy conjugate/negative bits (Val
// applies them to it).
ir::Value ValMemory(const at::Tensor& t);
// The same, converted to `dtype`.
ir::Value ValAs(const at::Tensor& t, at::ScalarType dtype);
// A value of `t` for use with pjrt device `device`: pjrt tensors must be on
// that device; CPU 0-d tensors (Python numbers) become scalar parameters.
ir::Value Operand(const at::Tensor& t, int device, at::ScalarType dtype);

// A new contiguous pjrt tensor holding `v`; its dtype is v's.
at::Tensor Wrap(ir::Value v, int device);
// An uninitialized pjrt tensor (contents read as zeros until written).
at::Tensor Empty(at::IntArrayRef sizes, at::ScalarType dtype, int device);
// An uninitialized pjrt tensor of `like`'s sizes, laid out as PyTorch lays
// out clone() and to() results: in `format`, or for Preserve (the default)
// with `like`'s strides when they are non-overlapping and dense, else dense
// in the order of `like`'s strides (empty_like's rule).
at::Tensor EmptyLike(const at::Tensor& like, at::ScalarType dtype, int device, std::optional<at::MemoryFormat> format);
// A new pjrt tensor holding `v` (shape like.sizes()), laid out as EmptyLike.
at::Tensor WrapLike(ir::Value v, int device, const at::Tensor& like, std::optional<at::MemoryFormat> format);
// A new pjrt tensor holding `v` (shape like.sizes()) with like's strides, at
// offset 0 of a storage just large enough; for a `like` that overlaps
// itself (expanded), laid out as EmptyLike. Only the storage offset (and
// size) can differ from PyTorch's clone_preserve_strides, the layout of
// copy, slice_scatter and select_scatter results on the CPU and in
// AOTAutograd's fake tensors: a program never depends on the offset.
at::Tensor WrapStrided(ir::Value v, int device, const at::Tensor& like);
// In-place write: `dst` (any strides) now holds `v` (converted to dst's dtype).
void Assign(const at::Tensor& dst, ir::Value v);
// The functional form of an in-place write into `part`, a view of `base`'s
// storage (slice_scatter, select_scatter): base's value with part's elements
// replaced by `v`, laid out with base's strides (WrapStrided; a base that is
// its whole storage keeps it all), with the offsets parameters where Assign
// makes them ones. Empty for conjugate or negative views, storages of
// another dtype and bases that overlap themselves (expanded).
std::optional<at::Tensor> Scattered(const at::Tensor& base, const at::Tensor& part, ir::Value v);

// A 0-d value holding `s` as `dtype`, fed from the host (no recompile when
// the number changes). Values are cached on device. A number the dtype
// cannot hold is refused, as the CPU's kernels refuse fill values, alphas
// and bounds; `wrapped` casts it as TensorIterator casts a Python number
// operand of a binary op instead (300 as uint8 is 44, 1e40 as float32 inf).
ir::Value ScalarParam(int device, const at::Scalar& s, at::ScalarType dtype, bool wrapped = false);
// An op's own number (clamp's bounds, fill_'s value) out of float16's or
// bfloat16's range is refused with the CPU's error, as its Scalar::to
// refuses it; ScalarParam does it unless `wrapped` (a Python number in a
// tensor's place, which TensorIterator casts: inf). Integers are refused by
// the conversion itself.
void RefuseOutOfRange(const at::Scalar& s, at::ScalarType dtype);
// A 0-d constant (for numbers that shape the program, e.g. 0, 1, eps). `v`
// must fit `dtype`: a double outside an integer type's range is undefined.
ir::Value Const(int device, double v, at::ScalarType dtype);
// A 0-d constant holding the least (`lowest`) or greatest value of `dtype`:
// -inf or +inf for floating types, false or true for bool, the exact limits
// for integers (a double holds neither int64 limit). The start of a max or
// min reduction, the padding of a max pool.
ir::Value ExtremeConst(int device, at::ScalarType dtype, bool lowest);

// Broadcast `v` (of shape `from`) to `to`, numpy-style (trailing alignment).
ir::Value BroadcastTo(int device, ir::Value v, const std::vector<int64_t>& to);

// A check compiled into the program (runtime::Runtime::AddCheck): when any
// element of `bad` (bool, any shape) is true, every tensor the program writes
// raises `what` when read, as the CPU op would have raised at once.
void CheckNone(int device, ir::Value bad, runtime::ErrorKind kind, const std::string& what);
// Index values (any integer dtype) as i64, negative entries wrapped by
// `size` when `negative_ok` (advanced indexing), with a check that every one
// is in range: [-size, size) or [0, size). `op` names the op in the error;
// `kind` is the CPU's exception for it (IndexError for indexing, index_select
// and embedding; RuntimeError, kValue, for gather, scatter, embedding_bag).
ir::Value CheckedIndex(int device, ir::Value idx, int64_t size, bool negative_ok, const char* op,
                       runtime::ErrorKind kind = runtime::ErrorKind::kIndex);

// The device all pjrt tensors among `ts` are on; checks they agree.
int CommonDevice(std::initializer_list<const at::Tensor*> ts);

std::vector<int64_t> Dims(const ir::Builder& b, ir::Value v);

// --- introspection and replicated regions (take the runtime lock themselves) ---
bool IsPending(const at::Tensor& t);  // a value waits for the next sync
bool HasBuffer(const at::Tensor& t);  // materialized contents exist on the device
// Raises what reading each pjrt tensor would (a lost value, a failed
// program or check), without copying them: torch.save settles its tensors
// before it truncates its file.
void Settle(const std::vector<at::Tensor>& ts);
// The StableHLO program that would compute these tensors now.
std::string StableHloOf(const std::vector<at::Tensor>& ts);
// One pjrt tensor on device 0 whose replica r (torch_pjrt.replicated) holds parts[r].
at::Tensor ReplicatedFromParts(const std::vector<at::Tensor>& parts);
// The tensor's value on every replica, as CPU tensors.
std::vector<at::Tensor> ReplicaValues(const at::Tensor& t);
// A host copy of a whole storage (1-d) viewed as `type`, as torch's
// view(dtype), without the bytes past its last whole element of a wider type.
at::Tensor FlatAs(const at::Tensor& flat, at::ScalarType type);
int64_t WrapDim(int64_t dim, int64_t rank);

}  // namespace tpj::aten
