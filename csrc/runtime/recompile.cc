// Explaining recompiles: a graph whose shape-blind hash was compiled before
// differs from that earlier graph in shapes, dtypes or constants; the first
// differences become the recompile reason (metrics.recompiles()).
#include <cstdio>
#include <sstream>
#include <type_traits>
#include <variant>

#include "runtime/runtime.h"
#include "runtime/warnings.h"

namespace tpj::runtime {
namespace {

std::string ShapeText(const ir::Shape& s) {
  std::ostringstream os;
  os << ir::Name(s.dtype) << "[";
  for (size_t i = 0; i < s.dims.size(); ++i) os << (i ? "," : "") << s.dims[i];
  os << "]";
  return os.str();
}

// The integer attributes of a node (slice starts, pads, window sizes...),
// which the shape-blind hash leaves out: a slice at a moving offset
// recompiled as "same structure, different details".
struct IntFieldsText {
  std::ostringstream& os;
  template <class T>
  void operator()(const char* name, const T& v) {
    if constexpr (std::is_same_v<T, int64_t>) {
      os << " " << name << "=" << v;
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      os << " " << name << "=[";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
      os << "]";
    } else if constexpr (ir::HasFields<T>::value) {
      T::Fields(v, *this);
    }
  }
};

// One line for the devices, then one per parameter, constant and other
// node: what ExplainRecompile compares.
std::vector<std::string> Signature(const ir::Graph& g, const std::vector<std::string>& param_desc,
                                   const std::vector<int>& device_ids) {
  std::vector<std::string> sig;
  std::string devices = "devices: ";
  for (size_t i = 0; i < device_ids.size(); ++i) devices += (i ? "," : "") + std::to_string(device_ids[i]);
  sig.push_back(devices);
  for (size_t i = 0; i < g.params.size(); ++i) {
    const std::string& desc = i < param_desc.size() ? param_desc[i] : std::string();
    sig.push_back("input " + std::to_string(i) + ": " +
                  (desc.empty() ? ShapeText(g.nodes[g.params[i]].results[0]) : desc));
  }
  int c = 0;
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::Constant) {
      std::ostringstream os;
      os << "constant " << c++ << ": " << ShapeText(n.results[0]);
      const std::vector<uint8_t>* bytes = ir::ConstantBytes(n);
      if (bytes && bytes->size() <= 16) {
        os << " bytes";
        for (uint8_t b : *bytes) os << " " << static_cast<int>(b);
      }
      sig.push_back(os.str());
    } else if (n.op != ir::Op::Parameter) {
      std::ostringstream os;
      os << ir::OpName(n.op);
      for (const auto& r : n.results) os << " " << ShapeText(r);
      std::visit(
          [&](const auto& a) {
            using A = std::decay_t<decltype(a)>;
            if constexpr (ir::HasFields<A>::value) A::Fields(a, IntFieldsText{os});
          },
          n.attrs);
      sig.push_back(os.str());
    }
  }
  return sig;
}

}  // namespace

void Runtime::ExplainRecompile(uint64_t shape_blind_hash, const ir::Graph& g, const std::vector<std::string>& param_desc,
                               const std::vector<int>& device_ids) {
  std::vector<std::string> sig = Signature(g, param_desc, device_ids);
  auto it = seen_structures_.find(shape_blind_hash);
  if (it != seen_structures_.end()) {
    const std::vector<std::string>& old = it->second;
    std::string why;
    for (size_t i = 0; i < std::min(old.size(), sig.size()); ++i) {
      if (old[i] == sig[i]) continue;
      const size_t colon = old[i].find(':');
      if (old[i].rfind("input", 0) == 0 || old[i].rfind("constant", 0) == 0 || old[i].rfind("devices", 0) == 0) {
        why += (why.empty() ? "" : "; ") + old[i].substr(0, colon) + " changed from" + old[i].substr(colon + 1) +
               " to" + sig[i].substr(sig[i].find(':') + 1);
      } else if (why.empty()) {
        why = "op " + old[i] + " became " + sig[i];
      }
      if (why.size() > 400) break;
    }
    if (why.empty()) why = "same structure, different details";
    unreported_.push_back(RecompileReason{shape_blind_hash, why, ""});
  } else {
    unreported_.push_back(RecompileReason{shape_blind_hash, "", ""});  // a new graph: counted where it compiled
    if (options_.debug) {
      debug_lines_.push_back("compiling a new graph (" + std::to_string(g.nodes.size()) + " nodes, " +
                             std::to_string(g.params.size()) + " parameters)");
    }
  }
  seen_structures_[shape_blind_hash] = std::move(sig);
}

void Runtime::ReportDeferred() {
  std::vector<RecompileReason> reasons;
  std::vector<std::string> lines;
  std::vector<UnlocatedCheck> checks;
  {
    std::lock_guard<std::recursive_mutex> l(mu_);
    if (unreported_.empty() && debug_lines_.empty() && unlocated_checks_.empty() && !WarningsQueued()) return;
    reasons.swap(unreported_);
    lines.swap(debug_lines_);
    checks.swap(unlocated_checks_);
  }
  const std::string where = Location();  // may take the GIL: not under mu_
  if (!checks.empty()) {
    std::lock_guard<std::recursive_mutex> l(mu_);
    for (const UnlocatedCheck& c : checks) {
      Trace& t = traces_.at(static_cast<size_t>(c.device));
      if (t.epoch == c.epoch) t.AddCheckSite(c.id, where);
    }
  }
  for (auto& r : reasons) {
    Metrics::Get().CompiledAt(where);
    if (r.why.empty()) continue;  // a new graph, not a recompile
    r.where = where;
    if (options_.debug) {
      std::fprintf(stderr, "torch_pjrt: recompiling a known graph (%s)%s%s\n", r.why.c_str(),
                   where.empty() ? "" : " at ", where.c_str());
    }
    Metrics::Get().Recompiled(std::move(r));
  }
  for (const auto& line : lines) {
    std::fprintf(stderr, "torch_pjrt: %s%s%s\n", line.c_str(), where.empty() ? "" : " at ", where.c_str());
  }
  try {
    FlushWarnings();  // an op's warnings (a trace grown long), as it returns
  } catch (const std::exception& e) {
    // The sink raised (Python's `-W error`), here inside the scope's
    // destructor, which must not throw: the message goes to stderr.
    std::fprintf(stderr, "torch_pjrt: warning: %s\n", e.what());
  }
}

}  // namespace tpj::runtime
