#include "aten/derived.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "aten/lowering.h"
#include "aten/tensor.h"

namespace tpj::aten {
namespace {

using runtime::TraceScope;

// How one in-place/out= overload maps onto its functional overload.
struct Plan {
  std::optional<c10::OperatorHandle> functional;  // set once found (no default OperatorHandle)
  bool inplace = false;
  std::vector<size_t> inputs;  // positions of the functional's arguments in the derived op's arguments
  std::vector<size_t> outs;    // positions of the written arguments, in the order of the results
  // Position (in the functional's arguments) of a `ScalarType? dtype` that,
  // when None, takes the output's dtype: the reductions whose out= form
  // computes in the out tensor's dtype (at::native's infer_dtype_from_optional).
  std::optional<size_t> dtype_from_out;
  // out= overloads with a Meta kernel: that kernel checks the outputs'
  // dtypes by the op's own rule first (see MetaCheck).
  bool meta_check = false;
  // Position (in the functional's arguments) of a Tensor argument named
  // "value" (index_fill_.int_Tensor's): one number that the CPU reads
  // (item()) before writing, so it may lie in the memory written.
  std::optional<size_t> value_arg;
  // Positions (in the functional's arguments) of the inputs that may share
  // no element with the out tensor (NoOverlapWithOut).
  std::vector<size_t> no_overlap;
};

c10::IValue OnMeta(const c10::IValue& v) {
  auto meta = [](const at::Tensor& t) {
    return t.defined() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)) : t;
  };
  if (v.isTensor()) return meta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(meta(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList().vec()) {
      out.push_back(t ? std::optional<at::Tensor>(meta(*t)) : std::nullopt);
    }
    return out;
  }
  return v;
}

// The out= overload run on meta tensors shaped as the call's arguments, with
// outputs of the results' sizes and the outputs' dtypes: its Meta kernel
// raises the CPU's error where the op's own rule refuses an output's dtype
// (topk's indices that are not int64), which the general rule (the result
// castable to the output, checked first with the CPU's message) allows.
// Run only for results written to another dtype (not for complex inputs'
// real results). Rules that only the CPU kernels check (the unary ops'
// output of their input's dtype, sort's int64 indices) are not
// (docs/semantics.md).
void MetaCheck(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, const std::vector<size_t>& outs,
               const std::vector<at::Tensor>& results) {
  torch::jit::Stack meta;
  meta.reserve(args.size());
  for (const c10::IValue& v : args) meta.push_back(OnMeta(v));
  for (size_t k = 0; k < outs.size(); ++k) {
    const at::Tensor& o = args[outs[k]].toTensor();
    const at::Tensor& r = results[k].defined() ? results[k] : o;
    meta[outs[k]] = at::empty(r.sizes(), o.options().device(at::kMeta));
  }
  op.callBoxed(meta);
}

// Ops whose out= and in-place forms compute in the output's dtype when no
// dtype is given (sum(int, out=float) sums in float, cumsum_ keeps self's type).
const std::set<std::string>& DtypeFromOut() {
  static const std::set<std::string> names = {"aten::sum", "aten::mean", "aten::prod", "aten::nansum",
                                              "aten::cumsum", "aten::cumprod"};
  return names;
}

// out= forms whose CPU kernels refuse an out tensor sharing any element
// with these inputs (at::assert_no_overlap; torch.index_select(x, 0, i,
// out=x), torch.cat([x, x], out=x)), though a program, reading every input
// first, has an answer.
const std::map<std::string, std::set<std::string>>& NoOverlapWithOut() {
  static const std::map<std::string, std::set<std::string>> inputs = {
      {"aten::index_select", {"self", "index"}}, {"aten::gather", {"self"}},
      {"aten::take", {"self", "index"}},         {"aten::index", {"self", "indices"}},
      {"aten::index_add", {"source", "index"}},  {"aten::scatter", {"src", "index"}},
      {"aten::cat", {"tensors"}}};
  return inputs;
}

// Overloads never derived: copy plumbing whose "out" is the destination of a
// transfer, not a result.
const std::set<std::string>& Excluded() {
  static const std::set<std::string> names = {"aten::_copy_from", "aten::_copy_from_and_resize"};
  return names;
}

// A tensor result of a boxed call; an undefined tensor (a masked-out
// gradient of convolution_backward) may come back as None.
at::Tensor Result(const c10::IValue& v) { return v.isNone() ? at::Tensor() : v.toTensor(); }

class DerivedKernel final : public c10::OperatorKernel {
 public:
  explicit DerivedKernel(Plan plan) : plan_(std::move(plan)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto args = torch::jit::last(*stack, n);
    std::vector<at::Tensor> outs;
    outs.reserve(plan_.outs.size());
    for (size_t i : plan_.outs) outs.push_back(args[i].toTensor());
    torch::jit::Stack call;
    call.reserve(plan_.inputs.size());
    for (size_t i : plan_.inputs) call.push_back(args[i]);
    // An out tensor that is also an input is written in place: never
    // resized (TensorIterator's read-write operands; ldexp_ is mul(out=self)).
    std::vector<bool> inplace(outs.size(), plan_.inplace);
    for (size_t k = 0; k < outs.size() && !plan_.inplace; ++k) {
      for (const c10::IValue& v : call) inplace[k] = inplace[k] || (v.isTensor() && v.toTensor().is_same(outs[k]));
    }
    if (plan_.dtype_from_out && call[*plan_.dtype_from_out].isNone()) {
      // torch.mean(float, out=long): the CPU's mean.out checks the cast
      // (the other reductions compute in the out's dtype, as asked)
      const at::ScalarType in = call[0].isTensor() ? call[0].toTensor().scalar_type() : outs[0].scalar_type();
      TORCH_CHECK(op.schema().name() != "aten::mean" || at::canCast(in, outs[0].scalar_type()), "result type ", in,
                  " can't be cast to the desired output type ", outs[0].scalar_type());
      call[*plan_.dtype_from_out] = outs[0].scalar_type();
    }
    std::vector<c10::IValue> original;  // the call as the user made it, for MetaCheck
    if (plan_.meta_check) original.assign(args.begin(), args.end());
    torch::jit::drop(*stack, n);
    // An input that partly overlaps an output (torch.exp(x[:-1], out=x[1:]))
    // is refused with the CPU's error (TensorIterator's check): its answer
    // depends on the order memory is written in. The same memory (in place)
    // is fine.
    std::vector<at::Tensor> sharing;  // inputs in an output's storage (AssertNotResizedOverInput)
    for (const at::Tensor& o : outs) {
      AssertNoInternalOverlap(o);
      for (size_t i = 0; i < call.size(); ++i) {
        const c10::IValue& v = call[i];
        const bool whole = std::find(plan_.no_overlap.begin(), plan_.no_overlap.end(), i) != plan_.no_overlap.end();
        if (v.isTensor() && i != plan_.value_arg) {
          const at::Tensor& t = v.toTensor();
          if (whole && t.defined()) AssertNoOverlap(o, t, /*accumulate=*/false);
          AssertNoPartialOverlap(o, t);
          if (t.defined() && t.has_storage() && o.has_storage() && t.storage().is_alias_of(o.storage())) sharing.push_back(t);
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorList().vec()) {
            if (whole) AssertNoOverlap(o, t, /*accumulate=*/false);
            AssertNoPartialOverlap(o, t);
            if (t.defined() && t.has_storage() && o.has_storage() && t.storage().is_alias_of(o.storage())) {
              sharing.push_back(t);
            }
          }
        } else if (whole && v.isOptionalTensorList()) {
          for (const std::optional<at::Tensor>& t : v.toOptionalTensorList().vec()) {
            if (t && t->defined()) AssertNoOverlap(o, *t, /*accumulate=*/false);
          }
        }
      }
    }
    auto write = [&] {
      for (size_t k = 0; k < outs.size(); ++k) {
        const at::Tensor r = Result(call[k]);
        if (!r.defined()) continue;
        if (!inplace[k]) {
          for (const at::Tensor& t : sharing) AssertNotResizedOverInput(outs[k], r.sizes(), t);
          at::native::resize_output(outs[k], r.sizes());
        }
        if (r.numel() > 0) Assign(outs[k], Val(r));
      }
    };
    bool other_dtype = false;
    const bool complex_input = std::any_of(call.begin(), call.end(), [](const c10::IValue& v) {
      return v.isTensor() && v.toTensor().defined() && v.toTensor().is_complex();
    });
    {
      // One traced op: the functional's trace time and the write count once
      // (a Meta-checked call writes in a second scope, after the check).
      TraceScope scope;
      plan_.functional->callBoxed(call);
      TORCH_INTERNAL_ASSERT(call.size() == outs.size(), op.schema().name(), ": ", call.size(), " results for ",
                            outs.size(), " outputs");
      // Every check before any output changes, as the CPU's kernels do.
      for (size_t k = 0; k < outs.size(); ++k) {
        const at::Tensor r = Result(call[k]);
        const at::Tensor& o = outs[k];
        if (!r.defined()) continue;
        TORCH_CHECK(IsPjrt(o), op.schema().name(), ": expected the output on pjrt:", DeviceIndex(r), ", got one on ",
                    o.device());
        TORCH_CHECK(DeviceIndex(o) == DeviceIndex(r), op.schema().name(), ": expected the output on pjrt:",
                    DeviceIndex(r), ", got one on pjrt:", DeviceIndex(o));
        TORCH_CHECK(at::canCast(r.scalar_type(), o.scalar_type()), "result type ", r.scalar_type(),
                    " can't be cast to the desired output type ", o.scalar_type());
        TORCH_CHECK(!inplace[k] || o.sizes() == r.sizes(), "output with shape ", o.sizes(),
                    " doesn't match the broadcast shape ", r.sizes());
        // An output of another dtype than the result's: the op's Meta
        // kernel says whether the op's own rule allows it (mm, addmm,
        // log_softmax, gather, where, topk's values: not at all; index
        // outputs: int64 only). Not for the real values of complex inputs
        // (torch.abs(complex, out=float64)), which the CPU's kernels cast
        // and the Python Meta kernels (torch._refs) refuse.
        other_dtype = other_dtype || (r.scalar_type() != o.scalar_type() &&
                                      (r.scalar_type() == at::kLong || !complex_input || r.is_complex()));
      }
      if (!plan_.meta_check || !other_dtype) write();
    }
    if (plan_.meta_check && other_dtype) {
      // Outside the runtime's lock: a Meta kernel may be Python (the GIL).
      // Costs ~100 us, so only where an index output is not int64.
      std::vector<at::Tensor> results;
      for (const c10::IValue& r : call) results.push_back(Result(r));
      MetaCheck(op, original, plan_.outs, results);
      TraceScope scope;
      write();
    }
    for (at::Tensor& o : outs) torch::jit::push(*stack, std::move(o));
  }

 private:
  Plan plan_;
};

bool Writes(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

bool IsTensor(const c10::Argument& a) { return a.type()->kind() == c10::TypeKind::TensorType; }

bool Same(const c10::Argument& a, const c10::Argument& b) { return a.name() == b.name() && *a.type() == *b.type(); }

// The functional overload among `candidates` whose arguments are `wanted`,
// with a PrivateUse1 kernel and fresh (non-aliasing) tensor results.
std::optional<c10::OperatorHandle> FindFunctional(const std::vector<c10::OperatorHandle>& candidates,
                                                  const std::vector<const c10::Argument*>& wanted, size_t results) {
  for (const c10::OperatorHandle& f : candidates) {
    const c10::FunctionSchema& s = f.schema();
    const auto& args = s.arguments();
    if (args.size() != wanted.size() || s.returns().size() != results) continue;
    bool match = true;
    for (size_t i = 0; i < args.size() && match; ++i) match = !Writes(args[i]) && Same(args[i], *wanted[i]);
    for (const c10::Argument& r : s.returns()) match = match && IsTensor(r) && r.alias_info() == nullptr;
    if (match && f.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return f;
  }
  return std::nullopt;
}

// The plan for `op` if it is an in-place or out= overload we can derive.
std::optional<Plan> PlanFor(const c10::OperatorHandle& op,
                            const std::map<std::string, std::vector<c10::OperatorHandle>>& by_name) {
  const c10::FunctionSchema& s = op.schema();
  const auto& args = s.arguments();
  if (args.empty() || op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return std::nullopt;
  }
  Plan plan;
  std::vector<const c10::Argument*> wanted;
  std::string functional_name = s.name();
  const bool trailing_underscore = functional_name.size() > 1 && functional_name.back() == '_' &&
                                   functional_name[functional_name.size() - 2] != '_';
  // Python's in-place operators: aten::__ilshift__ writes aten::__lshift__
  const std::string dunder = "aten::__i";
  const bool inplace_dunder = functional_name.rfind(dunder, 0) == 0 && functional_name.size() > dunder.size() + 2 &&
                              functional_name.compare(functional_name.size() - 2, 2, "__") == 0;
  if ((trailing_underscore || inplace_dunder) && Writes(args[0]) && IsTensor(args[0]) && s.returns().size() == 1) {
    for (size_t i = 1; i < args.size(); ++i) {
      if (Writes(args[i])) return std::nullopt;
    }
    plan.inplace = true;
    plan.outs = {0};
    for (size_t i = 0; i < args.size(); ++i) {
      plan.inputs.push_back(i);
      wanted.push_back(&args[i]);
    }
    if (inplace_dunder) {
      functional_name.erase(dunder.size() - 1, 1);
    } else {
      functional_name.pop_back();
    }
  } else {
    for (size_t i = 0; i < args.size(); ++i) {
      if (Writes(args[i])) {
        if (!args[i].kwarg_only() || !IsTensor(args[i])) return std::nullopt;
        plan.outs.push_back(i);
      } else {
        plan.inputs.push_back(i);
        wanted.push_back(&args[i]);
      }
    }
    if (plan.outs.empty() || s.returns().size() != plan.outs.size()) return std::nullopt;
  }
  if (Excluded().count(functional_name)) return std::nullopt;
  auto it = by_name.find(functional_name);
  if (it == by_name.end()) return std::nullopt;
  std::optional<c10::OperatorHandle> f = FindFunctional(it->second, wanted, plan.outs.size());
  if (!f) return std::nullopt;
  plan.functional = *f;
  plan.meta_check = !plan.inplace && op.hasKernelForDispatchKey(c10::DispatchKey::Meta);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (args[plan.inputs[i]].name() == "value" && IsTensor(args[plan.inputs[i]])) plan.value_arg = i;
  }
  if (auto no = NoOverlapWithOut().find(functional_name); no != NoOverlapWithOut().end() && !plan.inplace) {
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      if (no->second.count(args[plan.inputs[i]].name())) plan.no_overlap.push_back(i);
    }
  }
  if (DtypeFromOut().count(functional_name) && plan.outs.size() == 1) {
    const auto& fargs = f->schema().arguments();
    for (size_t i = 0; i < fargs.size(); ++i) {
      if (fargs[i].name() == "dtype") plan.dtype_from_out = i;
    }
  }
  return plan;
}

std::mutex registered_mu;
std::vector<std::pair<std::string, std::string>> registered;

std::string FullName(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

}  // namespace

void RegisterDerivedKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& d = c10::Dispatcher::singleton();
    std::map<std::string, std::vector<c10::OperatorHandle>> by_name;
    std::vector<c10::OperatorHandle> ops;
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      std::optional<c10::OperatorHandle> op = d.findSchema(name);
      if (!op) continue;
      by_name[name.name].push_back(*op);
      ops.push_back(*op);
    }
    // Kept for the life of the process: the dispatcher holds our kernels
    // until the library is destroyed, and ops may run during shutdown.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    std::lock_guard<std::mutex> l(registered_mu);
    for (const c10::OperatorHandle& op : ops) {
      std::optional<Plan> plan = PlanFor(op, by_name);
      if (!plan) continue;
      const std::string functional = FullName(*plan->functional);
      const auto& n = op.operator_name();
      const std::string name = n.name.substr(6) + (n.overload_name.empty() ? "" : "." + n.overload_name);
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<DerivedKernel>(std::move(*plan))));
      registered.emplace_back(FullName(op), functional);
    }
  });
}

std::vector<std::pair<std::string, std::string>> DerivedKernels() {
  std::lock_guard<std::mutex> l(registered_mu);
  return registered;
}

}  // namespace tpj::aten
