// Ops without a pjrt lowering run on the CPU: arguments are copied to the
// host, the CPU kernel runs, results (and mutated arguments) are copied back.
// Each fallback is counted per op (metrics "aten::<name>").
//
// TORCH_PJRT_FALLBACK=error turns a fallback into an error naming the op;
// =warn, or TORCH_PJRT_DEBUG=1, logs each op's first fallback.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <cstdio>
#include <mutex>
#include <set>

#include "runtime/metrics.h"
#include "runtime/runtime.h"

namespace tpj::aten {
namespace {

void CpuFallback(const c10::OperatorHandle& op, c10::Stack* stack) {
  const std::string name = op.schema().name();
  // The options the runtime read at start: no environment parsing per op.
  const runtime::Options& options = runtime::Runtime::Get().options();
  TORCH_CHECK(options.fallback != runtime::FallbackMode::kError, "'", name,
              "' has no pjrt lowering and TORCH_PJRT_FALLBACK=error forbids running it on the CPU");
  runtime::Metrics::Get().Fallback(name);
  if (options.fallback == runtime::FallbackMode::kWarn || options.debug) {
    static std::mutex mu;
    static std::set<std::string> seen;
    std::lock_guard<std::mutex> l(mu);
    if (seen.insert(name).second) std::fprintf(stderr, "torch_pjrt: '%s' falls back to the CPU\n", name.c_str());
  }
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

}  // namespace

}  // namespace tpj::aten

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpj::aten::CpuFallback>()); }
