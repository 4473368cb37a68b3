// Ops without a pjrt lowering run on the CPU: arguments are copied to the
// host, the CPU kernel runs, results (and mutated arguments) are copied back.
// Each fallback is counted per op and per Python location that triggered it
// (metrics "aten::<name>", torch_pjrt.metrics.fallback_sites()).
//
// TORCH_PJRT_FALLBACK=error turns a fallback into an error naming the op and
// the location; =warn, or TORCH_PJRT_DEBUG=1, warns once per op (a
// torch_pjrt.PjrtWarning) with the location of its first fallback.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <mutex>
#include <set>

#include "runtime/metrics.h"
#include "runtime/runtime.h"
#include "runtime/warnings.h"

namespace tpj::aten {

void CpuFallback(const c10::OperatorHandle& op, c10::Stack* stack) {
  const std::string name = op.schema().name();
  // The options the runtime read at start: no environment parsing per op.
  const runtime::Options& options = runtime::Runtime::Get().options();
  // file:line of the user's code (or the library's, e.g. a transformers
  // model) that called the op; takes the GIL, which kernels run without.
  const std::string where = runtime::Runtime::Location();
  const std::string at = where.empty() ? std::string() : " (at " + where + ")";
  TORCH_CHECK(options.fallback != runtime::FallbackMode::kError, "'", name, "'", at,
              " has no pjrt lowering and TORCH_PJRT_FALLBACK=error forbids running it on the CPU");
  runtime::Metrics::Get().Fallback(name, where);
  if (options.fallback == runtime::FallbackMode::kWarn || options.debug) {
    static std::mutex mu;
    static std::set<std::string> seen;
    bool first;
    {
      std::lock_guard<std::mutex> l(mu);
      first = seen.insert(name).second;
    }
    if (first) {
      runtime::Warn("'" + name + "'" + at +
                    " has no pjrt lowering and runs on the CPU (copies to and from the host, and splits the "
                    "program); torch_pjrt.metrics.report() counts every fallback and where it happened");
      runtime::FlushWarnings();
    }
  }
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

// Sparse, quantized and nested tensors have no pjrt layout: any op that
// would make or use one on pjrt raises this (PyTorch's own error names an
// internal op and a "Sparsepjrt" backend).
template <const char* kWhat>
void Unsupported(const c10::OperatorHandle& op, c10::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, kWhat, " tensors are not supported on pjrt (", op.schema().name(),
                              "); keep them on the CPU, or convert to a dense tensor (to_dense(), dequantize(), "
                              "to_padded_tensor()) before moving to pjrt");
}
constexpr char kSparse[] = "sparse";
constexpr char kQuantized[] = "quantized";
constexpr char kNested[] = "nested";

}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::CpuFallback>()); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::Unsupported<tpj::aten::kSparse>>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::Unsupported<tpj::aten::kSparse>>());
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::Unsupported<tpj::aten::kQuantized>>());
}
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::Unsupported<tpj::aten::kNested>>());
}

// The ops that make a strided-nested or compressed-sparse tensor from pjrt
// tensors build it without asking its backend: the tensor came out, and then
// failed later in torch's own code ("NestedTensorImpl doesn't support
// sizes", "col_indices expected sparse row compressed tensor layout but got
// SparseCsr"), or, given requires_grad, aborted the process in autograd's
// metadata. Refused where they are made. (Jagged nested tensors are Python
// tensors of strided pjrt tensors, and work.)
#define TPJ_REFUSE(op, what) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&tpj::aten::Unsupported<what>>())
#define TPJ_REFUSE_COMPRESSED(m)                                               \
  TPJ_REFUSE("sparse_compressed_tensor.comp_plain_value_size", tpj::aten::kSparse); \
  TPJ_REFUSE("sparse_compressed_tensor.comp_plain_value", tpj::aten::kSparse);      \
  TPJ_REFUSE("_sparse_compressed_tensor_unsafe", tpj::aten::kSparse)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  TPJ_REFUSE("_nested_tensor_from_tensor_list", tpj::aten::kNested);
  TPJ_REFUSE("_nested_from_padded", tpj::aten::kNested);
  TPJ_REFUSE("_nested_view_from_buffer", tpj::aten::kNested);
  TPJ_REFUSE("_nested_view_from_buffer_copy", tpj::aten::kNested);
  TPJ_REFUSE_COMPRESSED(m);
}
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) { TPJ_REFUSE_COMPRESSED(m); }
#undef TPJ_REFUSE_COMPRESSED
#undef TPJ_REFUSE

// Composite ops of fbgemm's quantization helpers read their input's memory
// through data_ptr themselves: on pjrt that pointer is a token, so they
// returned garbage (choose_qparams_optimized) or crashed the process
// (fbgemm_linear_quantize_weight, _saturate_weight_to_fp16). Kernels of our
// own keep them from the composite: those that compute plain tensors and
// numbers run on the CPU, counted as fallbacks; those that make or take
// fbgemm's packed weights (a C++ object in CPU memory, wrapped in a byte
// tensor that a copy would lose) are refused.
namespace tpj::aten {
void FbgemmPacked(const c10::OperatorHandle& op, c10::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(),
                              " makes or takes fbgemm's packed weights, a CPU object that has no pjrt form: call it, "
                              "and the ops that use its result, on CPU tensors");
}
}  // namespace tpj::aten
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* op : {"choose_qparams_optimized", "_saturate_weight_to_fp16", "fbgemm_linear_quantize_weight"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&tpj::aten::CpuFallback>());
  }
  for (const char* op : {"_wrapped_linear_prepack", "_wrapped_quantized_linear_prepacked", "fbgemm_linear_fp16_weight",
                         "fbgemm_linear_fp16_weight.out", "fbgemm_linear_fp16_weight_fp32_activation",
                         "fbgemm_linear_fp16_weight_fp32_activation.out", "fbgemm_linear_int8_weight",
                         "fbgemm_linear_int8_weight_fp32_activation", "fbgemm_pack_gemm_matrix_fp16",
                         "fbgemm_pack_quantized_matrix", "fbgemm_pack_quantized_matrix.KN"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&tpj::aten::FbgemmPacked>());
  }
}
