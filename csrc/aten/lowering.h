// Shared helpers of the op lowerings (ops_*.cc): dtype promotion, operand
// preparation, and registration shorthands. Lowerings hold a TraceScope.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <vector>

#include "ir/graph.h"
#include "runtime/runtime.h"
#include "aten/tensor.h"

namespace tpj::aten {

using runtime::TraceScope;

// The boxed CPU fallback of ops without a lowering (aten/fallback.cc):
// counted in the metrics and governed by TORCH_PJRT_FALLBACK like any other.
void CpuFallback(const c10::OperatorHandle& op, c10::Stack* stack);

// aten::`name`.`overload` on `args`, run through CpuFallback: for inputs a
// lowering leaves to the CPU (complex numbers in the real-valued math).
template <typename... Args>
at::Tensor OnCpu(const char* name, const char* overload, const Args&... args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  c10::Stack stack;
  (stack.emplace_back(args), ...);
  CpuFallback(op, &stack);
  return stack.at(0).toTensor();
}

// The dtype float-valued ops compute in: floats stay, integers/bool promote
// to the default float dtype.
inline at::ScalarType FloatType(at::ScalarType t) {
  return at::isFloatingType(t) || at::isComplexType(t) ? t : at::typeMetaToScalarType(at::get_default_dtype());
}

// The precision of a product (dot_general, convolution) of operands of type
// `t` (ops_reduce.cc): for float32 and complex64, what torch's float32 matmul
// precision asks of CUDA (full precision by default); other types the
// plugin's default.
ir::Precision ProductPrecision(ir::DType t);

// The dtype a lowering of `t` computes in: float for float16 and bfloat16,
// rounded to `t` once at the end (WrapIn), as the CPU's kernels for them
// compute (at::opmath_type); `t` itself for every other dtype.
inline at::ScalarType OpMath(at::ScalarType t) {
  if (t == at::kHalf || t == at::kBFloat16) return at::kFloat;
  return t == at::kComplexHalf ? at::kComplexFloat : t;  // (at::toOpMathType asserts on the unsigned types)
}

// `v`, computed in OpMath(t), as a tensor of dtype `t` on `device`.
inline at::Tensor WrapIn(ir::Value v, at::ScalarType t, int device) {
  return Wrap(B(device).Convert(v, ToIr(t)), device);
}

// Two operands broadcast to one shape in one dtype.
struct Operands {
  int device;
  std::vector<int64_t> shape;
  ir::Value x, y;
};

inline Operands Prepare(const at::Tensor& a, const at::Tensor& b, at::ScalarType t) {
  Operands o;
  o.device = CommonDevice({&a, &b});
  o.shape = at::infer_size(a.sizes(), b.sizes());
  o.x = BroadcastTo(o.device, Operand(a, o.device, t), o.shape);
  o.y = BroadcastTo(o.device, Operand(b, o.device, t), o.shape);
  return o;
}

inline Operands PrepareScalar(const at::Tensor& a, const at::Scalar& s, at::ScalarType t) {
  Operands o;
  o.device = DeviceIndex(a);
  o.shape = a.sizes().vec();
  o.x = ValAs(a, t);
  o.y = BroadcastTo(o.device, ScalarParam(o.device, s, t), o.shape);
  return o;
}

// A scalar broadcast to `shape`: constants for 0/1/-1 (they let XLA fold),
// host-fed parameters for anything else. `wrapped`: a Python number taking
// a binary op's place of a tensor, cast as TensorIterator casts it (300 as
// int8 is 44), not refused out of range as an op's own parameter is.
inline ir::Value Number(int device, const at::Scalar& s, at::ScalarType t, const std::vector<int64_t>& shape,
                        bool wrapped = false) {
  bool special = false;
  double v = 0;
  if (!s.isComplex()) {
    v = s.isBoolean() ? (s.toBool() ? 1 : 0) : s.toDouble();
    special = v == 0 || v == 1 || (v == -1 && at::isSignedType(t));
  }
  ir::Value r = special ? Const(device, v, t) : ScalarParam(device, s, t, wrapped);
  return BroadcastTo(device, r, shape);
}

inline ir::Value Fill(int device, double v, at::ScalarType t, const std::vector<int64_t>& shape) {
  return B(device).Full(ToIr(t), shape, v);
}

// An int64 constant of shape `dims` (indices, counts, sizes).
inline ir::Value I64(ir::Builder& b, const std::vector<int64_t>& dims, int64_t v) {
  return b.Full(ir::DType::I64, dims, static_cast<double>(v));
}

// A sum with -0.0 made +0.0. The CPU's sums start from +0.0, so a sum of
// -0.0 over one element is +0.0, where XLA turns a sum over one element
// into that element (and drops the addition of a constant zero). A select,
// which XLA does not fold; used after the sums whose static count of
// elements is 1 (a reduction over size-1 dimensions) and after avg_pool's
// window sums (whose windows may hold one element). Complex: each part.
inline ir::Value PlusZero(int device, ir::Value sum) {
  ir::Builder& b = B(device);
  const ir::Shape& sh = b.shape(sum);
  if (ir::IsComplex(sh.dtype)) return b.Complex(PlusZero(device, b.Real(sum)), PlusZero(device, b.Imag(sum)));
  if (!ir::IsFloat(sh.dtype)) return sum;
  ir::Value zero = b.Full(sh.dtype, sh.dims, 0);
  return b.Select(b.Compare(ir::CompareDir::EQ, sum, zero), zero, sum);
}

// The mean of x over `dims` (each mean covers `n` elements), in x's dtype:
// half types sum and divide in float and round once, as the CPU does, so a
// float16 sum or count past 65504 does not overflow on the way.
inline ir::Value MeanOf(int device, ir::Value x, const std::vector<int64_t>& dims, double n) {
  ir::Builder& b = B(device);
  const ir::DType t = b.shape(x).dtype;
  const ir::DType ct = t == ir::DType::F16 || t == ir::DType::BF16 ? ir::DType::F32 : t;
  ir::Value sum = b.Reduce(b.Convert(x, ct), b.ScalarConstant(ct, 0), dims, ir::ReduceKind::Sum);
  if (n == 1) sum = PlusZero(device, sum);
  return b.Convert(b.Binary(ir::Op::Div, sum, b.Full(ct, b.shape(sum).dims, n)), t);
}

// x as it is, but computed into memory, never fused into its consumers: a
// scatter that writes x's first element over itself. Unrolled recurrences
// need it at each step's state (RNN cells, CTC's alpha/beta): XLA's fusion
// otherwise follows the elementwise chain from step to step and recomputes
// earlier steps inside later kernels, so compile time grows quadratically
// with the number of steps (an LSTM over 32 steps: 6.3 s, over 64: 69 s).
inline ir::Value InMemory(int device, ir::Value x) {
  ir::Builder& b = B(device);
  const ir::Shape shape = b.shape(x);
  const int64_t n = shape.numel();
  if (n == 0) return x;
  ir::ScatterDims s;
  s.update_window_dims = {1};
  s.inserted_window_dims = {0};
  s.scatter_dims_to_operand_dims = {0};
  s.index_vector_dim = 1;
  ir::Value flat = b.Reshape(x, {n, 1});
  ir::Value first = b.Slice(flat, {0, 0}, {1, 1}, {1, 1});
  ir::Value at0 = b.Full(ir::DType::I64, {1, 1}, 0);
  return b.Reshape(b.Scatter(flat, at0, first, s, true), shape.dims);
}

// True where x is NaN (x != x); all false for non-float dtypes. PyTorch's
// NaN rules are spelled with it: StableHLO's maximum/minimum leave NaN
// operands to the backend, and every comparison with NaN is false.
inline ir::Value IsNan(int device, ir::Value x) { return B(device).Compare(ir::CompareDir::NE, x, x); }

// maximum/minimum (op Max or Min) as PyTorch defines them: NaN in either
// operand gives NaN. StableHLO leaves that to the backend (the XLA CPU
// plugin returns the left operand when only the right one is NaN), so float
// types say it.
inline ir::Value MaxMinNan(int d, ir::Op op, ir::Value x, ir::Value y) {
  ir::Builder& b = B(d);
  ir::Value r = b.Binary(op, x, y);
  if (!ir::IsFloat(b.shape(x).dtype)) return r;
  return b.Select(b.Binary(ir::Op::Or, IsNan(d, x), IsNan(d, y)), b.Binary(ir::Op::Add, x, y), r);
}

// Index (i64) of the first extreme of x (of `shape`) along `dim`, kept as a
// size-1 dim; the first NaN when there is one (as PyTorch). `values`, when
// given, receives the element at that index, so its sign of zero is the
// CPU's too (ops_reduce.cc).
ir::Value ArgExtreme(int d, ir::Value x, const std::vector<int64_t>& shape, int64_t dim, bool is_max, at::ScalarType t,
                     ir::Value* values);

// A Python number as a CPU 0-d tensor marked "wrapped number", so that type
// promotion treats it as PyTorch does (float32 tensor * 0.5 stays float32).
inline at::Tensor WrappedScalar(const at::Scalar& s) {
  at::Tensor t = at::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// A tensor whose sizes are symbols (a fake tensor of a graph Dynamo traces
// with dynamic shapes): the autograd-key kernels hand it to ATen's composite,
// whose meta kernels take symbolic sizes.
inline bool Symbolic(const at::Tensor& t) { return t.defined() && t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

inline bool IsOne(const at::Scalar& s) { return !s.isComplex() && s.toDouble() == 1.0; }

// Where the CPU's kernel is not built for bool: its dispatch's error (a
// lowering would compute something the CPU refuses).
inline void CheckNotBool(at::ScalarType t, const char* cpu_kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(t != at::kBool, "\"", cpu_kernel, "\" not implemented for 'Bool'");
}
// The same for complex dtypes (losses, norms, pooling and resampling, whose
// CPU kernels are built for real types only).
inline void CheckNotComplex(at::ScalarType t, const char* cpu_kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t), "\"", cpu_kernel, "\" not implemented for '", t, "'");
}
// The same for a CPU kernel built for floating types only (float, double,
// half, bfloat16: activations, norms, losses): integers and bool would
// otherwise compute, or fail in the StableHLO verifier.
inline void CheckFloating(at::ScalarType t, const char* cpu_kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t), "\"", cpu_kernel, "\" not implemented for '", t, "'");
}

// An operand that partly overlaps the tensor written (x[1:] += x[:-1],
// x[1:].copy_(x[:-1])) is refused with the CPU's error: there the answer
// depends on the order in which memory is written, which a program does
// not have. The CPU's check (at::assert_no_partial_overlap) gives up on
// strided views and then writes element by element (buf[:, 1:] =
// buf[:, :-1] smears the first column); those are checked here
// (ops_memory.cc). The same memory (x.add_(x)) is fine, and so is a shift
// toward lower addresses (buf[:, :-1] = buf[:, 1:]), which the CPU reads
// ahead of its writes.
void AssertNoPartialOverlap(const at::Tensor& written, const at::Tensor& operand);
// A source sharing any element with the tensor an index write writes
// (index_put_, index_add_, scatter_, put_, ...) is refused with the CPU's
// error (at::assert_no_overlap), also through strided views the CPU's check
// calls too hard (it then writes element by element, the answer depending
// on that order; a program reads the whole source first). One value written
// without `accumulate` gives one answer in any order: only the CPU's check.
void AssertNoOverlap(const at::Tensor& written, const at::Tensor& source, bool accumulate);
// An out= tensor that must be resized (its sizes are not `sizes`) while it
// shares its storage with `input` (torch.add(x, y, out=x.view(1))): the CPU
// reads the input after writing part of it; refused.
void AssertNotResizedOverInput(const at::Tensor& out, at::IntArrayRef sizes, const at::Tensor& input);
// An in-place or out= result written through a view whose elements share
// memory: expanded views (the CPU's error) and overlapping windows
// (x.unfold(0, 4, 2).mul_(2), where the CPU applies the op to a shared
// element once per window, in order; a program computes each once).
void AssertNoInternalOverlap(const at::Tensor& written);

// The dtypes of a normalization's parameters (weight, bias, running
// statistics), by the CPU's rule: each defined one has the input's dtype, or
// the input is bfloat16/float16 and they are all float32 (mixed precision,
// decided by the first defined one). A float64 running_var under a float32
// input would otherwise be computed quietly where the CPU and CUDA refuse.
// Returns the dtype of the saved statistics (mean, rstd): float32 when
// mixed, as on the CPU (the backward reads them), else the input's.
at::ScalarType CheckNormParams(const at::Tensor& input, std::initializer_list<const std::optional<at::Tensor>*> params);

// Result dtype of an in-place op must be castable to self's dtype.
inline void CheckInplace(const at::Tensor& self, at::ScalarType result) {
  TORCH_CHECK(at::canCast(result, self.scalar_type()), "result type ", result,
              " can't be cast to the desired output type ", self.scalar_type());
}

// var/std over n elements with `correction`: the CPU's warning when
// n - correction <= 0 (the result is inf or NaN, as there).
inline void WarnIfNoDegreesOfFreedom(const char* op, double n, double correction) {
  if (n - correction <= 0) {
    TORCH_WARN(op, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor "
                   "(input numel divided by output numel).");
  }
}

// An in-place op through its functional twin: `compute()` (which reads
// self) and the write of its result into self under one hold of the
// runtime's lock, so another thread's op on self comes before the read or
// after the write, never in between (a lost update).
template <class F>
at::Tensor& WriteInto(at::Tensor& self, F compute) {
  TraceScope s;
  const at::Tensor r = compute();
  Assign(self, Val(r));
  return self;
}

}  // namespace tpj::aten
