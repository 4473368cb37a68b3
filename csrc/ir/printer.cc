#include "ir/printer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>
#include <unordered_map>

namespace tpj::ir {
namespace {

std::string Ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s;
}

std::string Array(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : "array<i64: " + Ints(v) + ">";
}

std::string Bracket(const std::vector<int64_t>& v) { return "[" + Ints(v) + "]"; }

// dense<[[l0, h0], [l1, h1]]> : tensor<Nx2xi64>
std::string Padding(const std::vector<int64_t>& low, const std::vector<int64_t>& high) {
  std::string s = "dense<";
  if (low.empty()) {
    s += ">";
  } else {
    s += "[";
    for (size_t i = 0; i < low.size(); ++i) {
      s += (i ? ", [" : "[") + std::to_string(low[i]) + ", " + std::to_string(high[i]) + "]";
    }
    s += "]>";
  }
  return s + " : tensor<" + std::to_string(low.size()) + "x2xi64>";
}

std::string Groups(const std::vector<std::vector<int64_t>>& g) {
  std::string s = "dense<[";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + Bracket(g[i]);
  s += "]> : tensor<" + std::to_string(g.size()) + "x" + std::to_string(g.empty() ? 0 : g[0].size()) +
       "xi64>";
  return s;
}

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string Hex(uint64_t bits, int nibbles) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string s = "0x";
  for (int i = nibbles - 1; i >= 0; --i) s += kDigits[(bits >> (4 * i)) & 0xf];
  return s;
}

// MLIR float literals need a '.' (1.0, 1.5e-05); non-finite values are
// written as their bit pattern.
template <class F, class Bits>
std::string FloatText(F f) {
  if (!std::isfinite(f)) return Hex(Load<Bits>(reinterpret_cast<const uint8_t*>(&f)), sizeof(F) * 2);
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) {
    if (e == std::string::npos) {
      s += ".0";
    } else {
      s.insert(e, ".0");
    }
  }
  return s;
}

std::string Element(DType t, const uint8_t* p) {
  switch (t) {
    case DType::Bool: return *p ? "true" : "false";
    case DType::I8: return std::to_string(Load<int8_t>(p));
    case DType::I16: return std::to_string(Load<int16_t>(p));
    case DType::I32: return std::to_string(Load<int32_t>(p));
    case DType::I64: return std::to_string(Load<int64_t>(p));
    case DType::U8: return std::to_string(Load<uint8_t>(p));
    case DType::U16: return std::to_string(Load<uint16_t>(p));
    case DType::U32: return std::to_string(Load<uint32_t>(p));
    case DType::U64: return std::to_string(Load<uint64_t>(p));
    case DType::F16:
    case DType::BF16: return Hex(Load<uint16_t>(p), 4);
    case DType::F32: return FloatText<float, uint32_t>(Load<float>(p));
    case DType::F64: return FloatText<double, uint64_t>(Load<double>(p));
    case DType::C64:
      return "(" + FloatText<float, uint32_t>(Load<float>(p)) + "," +
             FloatText<float, uint32_t>(Load<float>(p + 4)) + ")";
    case DType::C128:
      return "(" + FloatText<double, uint64_t>(Load<double>(p)) + "," +
             FloatText<double, uint64_t>(Load<double>(p + 8)) + ")";
  }
  return "?";
}

// Elements of dimension `d` onwards, starting at element `offset`.
void Nested(std::string& s, const Shape& shape, const uint8_t* data, size_t d, int64_t& offset) {
  if (d == shape.dims.size()) {
    s += Element(shape.dtype, data + offset * ByteSize(shape.dtype));
    ++offset;
    return;
  }
  s += "[";
  for (int64_t i = 0; i < shape.dims[d]; ++i) {
    if (i) s += ", ";
    Nested(s, shape, data, d + 1, offset);
  }
  s += "]";
}

// Largest constant printed element by element; larger ones use hex bytes.
constexpr int64_t kMaxListedElements = 64;

std::string DenseLiteral(const Shape& shape, const std::vector<uint8_t>& bytes) {
  const size_t elem = ByteSize(shape.dtype);
  std::string s = "dense<";
  if (shape.numel() == 0) {
    // nothing between the brackets
  } else if (bytes.size() == elem && shape.numel() != 1) {
    s += Element(shape.dtype, bytes.data());  // splat
  } else if (shape.rank() == 0) {
    s += Element(shape.dtype, bytes.data());
  } else if (shape.numel() <= kMaxListedElements || shape.dtype == DType::Bool) {
    int64_t offset = 0;
    Nested(s, shape, bytes.data(), 0, offset);
  } else {
    static const char* kDigits = "0123456789ABCDEF";
    s += "\"0x";
    for (uint8_t b : bytes) {
      s += kDigits[b >> 4];
      s += kDigits[b & 0xf];
    }
    s += "\"";
  }
  return s + "> : " + shape.ToString();
}

const char* CompareType(DType t) {
  if (IsFloat(t) || IsComplex(t)) return "FLOAT";
  if (IsSignedInt(t)) return "SIGNED";
  return "UNSIGNED";
}

std::string CompareText(CompareDir dir, DType t) {
  return std::string("comparison_direction = #stablehlo<comparison_direction ") +
         CompareDirName(dir) + ">, compare_type = #stablehlo<comparison_type " + CompareType(t) +
         ">";
}

const char* ReduceOp(ReduceKind k, DType t) {
  const bool pred = t == DType::Bool;
  switch (k) {
    case ReduceKind::Sum: return pred ? "stablehlo.or" : "stablehlo.add";
    case ReduceKind::Prod: return pred ? "stablehlo.and" : "stablehlo.multiply";
    case ReduceKind::Max: return "stablehlo.maximum";
    case ReduceKind::Min: return "stablehlo.minimum";
    case ReduceKind::And: return "stablehlo.and";
    case ReduceKind::Or: return "stablehlo.or";
  }
  return "?";
}

std::string ConvLabels(int64_t rank, int64_t a, char la, int64_t b, char lb,
                       const std::vector<int64_t>& spatial) {
  std::vector<std::string> labels(static_cast<size_t>(rank), "?");
  labels[a] = std::string(1, la);
  labels[b] = std::string(1, lb);
  for (size_t i = 0; i < spatial.size(); ++i) labels[spatial[i]] = std::to_string(i);
  std::string s = "[";
  for (size_t i = 0; i < labels.size(); ++i) s += (i ? ", " : "") + labels[i];
  return s + "]";
}

// The graphs that Call nodes call, each printed once as a private function
// (@call0, @call1, ...), in the order they are first called.
struct Callees {
  std::vector<const Graph*> bodies;
  std::unordered_map<const Graph*, size_t> index;

  std::string Name(const Graph* body) {
    auto [it, added] = index.emplace(body, bodies.size());
    if (added) bodies.push_back(body);
    return "@call" + std::to_string(it->second);
  }
};

class Printer {
 public:
  Printer(const Graph& g, Callees& callees) : g_(g), callees_(callees) {}

  std::string Module() {
    os_ << "module @torch_pjrt attributes {mhlo.num_partitions = " << g_.num_partitions
        << " : i32, mhlo.num_replicas = " << g_.num_replicas << " : i32} {\n";
    Function("public @main");
    for (size_t k = 0; k < callees_.bodies.size(); ++k) {  // grows while called graphs call others
      Printer body(*callees_.bodies[k], callees_);
      body.Function("private @call" + std::to_string(k));
      os_ << body.os_.str();
    }
    os_ << "}\n";
    return os_.str();
  }

 private:
  void Function(const std::string& name) {
    os_ << "  func.func " << name << "(";
    for (size_t i = 0; i < g_.params.size(); ++i) {
      if (i) os_ << ", ";
      os_ << "%arg" << i << ": " << g_.nodes[g_.params[i]].results[0].ToString();
      std::vector<std::string> attrs;
      for (const Alias& a : g_.aliases) {
        if (a.param == static_cast<int64_t>(i)) attrs.push_back("tf.aliasing_output = " + std::to_string(a.output) + " : i32");
      }
      const std::string& sharding = std::get<ParameterAttrs>(g_.nodes[g_.params[i]].attrs).sharding;
      if (!sharding.empty()) attrs.push_back("mhlo.sharding = \"" + sharding + "\"");
      for (size_t k = 0; k < attrs.size(); ++k) os_ << (k ? ", " : " {") << attrs[k];
      if (!attrs.empty()) os_ << "}";
    }
    os_ << ") -> (";
    for (size_t i = 0; i < g_.outputs.size(); ++i) {
      os_ << (i ? ", " : "") << g_.shape(g_.outputs[i]).ToString();
      if (i < g_.output_shardings.size() && !g_.output_shardings[i].empty()) {
        os_ << " {mhlo.sharding = \"" << g_.output_shardings[i] << "\"}";
      }
    }
    os_ << ") {\n";
    constant_.assign(g_.nodes.size(), false);
    MarkRecomputed();
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const ::tpj::ir::Node& node = g_.nodes[n];
      bool c = Foldable(node.op);
      for (Value v : node.operands) c = c && constant_[static_cast<size_t>(v.node)];
      constant_[n] = c;
      if (node.op == Op::Parameter) continue;
      Node(static_cast<int32_t>(n));
      if (stored_[n]) Store(n);
    }
    os_ << "    \"func.return\"(";
    for (size_t i = 0; i < g_.outputs.size(); ++i) os_ << (i ? ", " : "") << Name(g_.outputs[i]);
    os_ << ") : (";
    for (size_t i = 0; i < g_.outputs.size(); ++i) {
      os_ << (i ? ", " : "") << g_.shape(g_.outputs[i]).ToString();
    }
    os_ << ") -> ()\n  }\n";
  }

  // How an op reads its operands when XLA fuses it into its consumers:
  // element for element (each output element reads the same element of each
  // operand), through another index (a reverse, slice, transpose, gather...),
  // or not fused (its operands are computed into memory first).
  enum class Reads { kSameIndex, kOtherIndex, kMemory };
  static Reads HowReads(Op op) {
    switch (Form(op)) {
      case OpForm::kSpecial:
        break;
      default:
        return Reads::kSameIndex;
    }
    switch (op) {
      // (a reshape or broadcast reads the same elements in the same order:
      // counted as element for element, as the residual stream read by a
      // block's three projections, or layer norm's statistics by its
      // backward, are stored anyway where XLA sees fit)
      case Op::Convert: case Op::IsFinite: case Op::Compare: case Op::Select: case Op::Clamp: case Op::Real:
      case Op::Imag: case Op::Complex: case Op::Reshape: case Op::BroadcastInDim:
        return Reads::kSameIndex;
      case Op::BitcastConvert: case Op::Transpose: case Op::Reverse: case Op::Slice: case Op::DynamicSlice:
      case Op::Concatenate: case Op::Pad: case Op::Gather:
        return Reads::kOtherIndex;
      default:
        return Reads::kMemory;
    }
  }

  // XLA's CPU fusion evaluates a fused value once per index it is read at:
  // a chain where each step reads the last one at two indices
  // (`x = 0.9 * x + 0.1 * x.flip(1)`, a stencil, a gather of x next to x)
  // fused whole evaluates step k 2^k times (44 steps of that flip chain ran
  // 2.75 s, 46 steps 14 s; a gather chain compiled for 15 s). Counted from
  // the outputs back (consumers come after their operands): a value's
  // evaluations are the most of its element-for-element consumers' plus the
  // sum of those that read it at another index. One evaluated more than
  // kMaxEvaluations times whose fused producers (counted with repeats, an
  // upper bound) times its evaluations exceed kMaxWork is stored (Store)
  // and counts as evaluated once; a value read a few times over its own
  // small producers (a padded input read by a convolution's 9 taps) is
  // left to XLA's fusion.
  static constexpr int64_t kMaxEvaluations = 8;
  static constexpr int64_t kMaxWork = 256;
  // A fused kernel's size: LLVM's instruction scheduler takes time
  // quadratic in a loop body's instructions, and elementwise work with no
  // value in memory between its steps (a sampler's state updated through
  // random draws, no sync) fuses whole: 80 steps of `acc + randn + rand`
  // compiled for 45 s, about 70 % of it in that scheduler. Each fusible op joins
  // the region of the fusible ops it reads (connected, since the last
  // stored values); one that would make its region weigh more than
  // kMaxFused is stored and starts a new one, so kernels stay bounded.
  // Weights: transcendental functions, which XLA expands to polynomials,
  // and random bits (Three-Fry rounds, expanded and fused) count for more.
  static constexpr int64_t kMaxFused = 2000;
  static constexpr int64_t kRngWork = 100;
  void CutLargeFusions() {
    const size_t n = g_.nodes.size();
    std::vector<int64_t> parent(n, -1), size(n, 0);  // region per fusible node (union-find), its weight at the root
    auto root = [&](int64_t x) {
      while (parent[static_cast<size_t>(x)] != x) {
        parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
        x = parent[static_cast<size_t>(x)];
      }
      return x;
    };
    std::vector<int64_t> roots;
    std::vector<bool> constant(n, false);  // made of constants (a broadcast number): copied into each kernel
    for (size_t k = 0; k < n; ++k) {
      const ::tpj::ir::Node& node = g_.nodes[k];
      const auto self = static_cast<int64_t>(k);
      if (node.op == Op::RngBitGenerator) {
        parent[k] = self;
        size[k] = kRngWork;
        continue;
      }
      if (node.op == Op::Constant || node.op == Op::Iota) {
        constant[k] = true;
        continue;
      }
      if (HowReads(node.op) == Reads::kMemory) continue;
      bool c = !node.operands.empty();
      for (Value v : node.operands) c = c && constant[static_cast<size_t>(v.node)];
      if (c) {
        constant[k] = true;
        continue;
      }
      roots.clear();
      int64_t total = Weight(node.op);
      for (Value v : node.operands) {
        if (parent[static_cast<size_t>(v.node)] < 0) continue;
        const int64_t r = root(v.node);
        if (std::find(roots.begin(), roots.end(), r) != roots.end()) continue;
        roots.push_back(r);
        total += size[static_cast<size_t>(r)];
      }
      parent[k] = self;
      if (total > kMaxFused && node.results.size() == 1 && node.results[0].numel() > 1) {
        stored_[k] = true;  // read from memory from here on: a region of its own, of weight 1
        size[k] = 1;
        continue;
      }
      for (int64_t r : roots) parent[static_cast<size_t>(r)] = self;
      size[k] = total;
    }
  }
  static int64_t Weight(Op op) {
    switch (op) {
      case Op::Log: case Op::Log1p: case Op::Exp: case Op::Expm1: case Op::Cos: case Op::Sin: case Op::Tan:
      case Op::Tanh: case Op::Logistic: case Op::Pow: case Op::Atan2: case Op::Erf: case Op::Erfc: case Op::Rsqrt: case Op::Sqrt:
      case Op::Cbrt: case Op::Lgamma: case Op::Digamma: case Op::Polygamma: case Op::Zeta:
        return 16;
      default:
        return 1;
    }
  }
  void MarkRecomputed() {
    const size_t n = g_.nodes.size();
    stored_.assign(n, false);
    constexpr int64_t kCap = int64_t{1} << 40;
    // an operand read twice by one op (x * x) is read at one index
    auto first_use = [](const ::tpj::ir::Node& node, size_t i) {
      for (size_t j = 0; j < i; ++j) {
        if (node.operands[j].node == node.operands[i].node) return false;
      }
      return true;
    };
    CutLargeFusions();
    std::vector<int64_t> work(n, 0);  // fused ops that computing one element evaluates
    for (size_t k = 0; k < n; ++k) {
      const ::tpj::ir::Node& node = g_.nodes[k];
      if (HowReads(node.op) == Reads::kMemory) continue;
      int64_t w = 1;
      for (size_t i = 0; i < node.operands.size(); ++i) {
        if (first_use(node, i)) w = std::min(kCap, w + work[static_cast<size_t>(node.operands[i].node)]);
      }
      work[k] = stored_[k] ? 1 : w;
    }
    std::vector<int64_t> same(n, 0), other(n, 0);
    for (Value v : g_.outputs) same[static_cast<size_t>(v.node)] = std::max<int64_t>(same[static_cast<size_t>(v.node)], 1);
    for (size_t k = n; k-- > 0;) {
      const ::tpj::ir::Node& node = g_.nodes[k];
      const Reads reads = HowReads(node.op);
      int64_t evals = stored_[k] ? 1 : std::min<int64_t>(same[k] + other[k], kCap);
      if (reads != Reads::kMemory && node.results.size() == 1 && evals > kMaxEvaluations &&
          evals > kMaxWork / std::max<int64_t>(work[k], 1) && node.results[0].numel() > 1) {
        stored_[k] = true;
        evals = 1;
      }
      if (reads == Reads::kMemory || evals == 0) evals = 1;  // read from memory once (or dead: printed, unused)
      for (size_t i = 0; i < node.operands.size(); ++i) {
        if (!first_use(node, i)) continue;
        const auto u = static_cast<size_t>(node.operands[i].node);
        if (reads == Reads::kOtherIndex) {
          other[u] += evals;
        } else {
          same[u] = std::max(same[u], evals);
        }
      }
    }
  }

  // %s<n>: node n computed into memory, never fused into its consumers: a
  // scatter of its first element over itself (XLA removes optimization
  // barriers before fusing; lowering.h's InMemory does the same in the IR).
  void Store(size_t n) {
    const Shape& shape = g_.nodes[n].results[0];
    const std::string p = "%s" + std::to_string(n) + "_";
    const Shape flat{shape.dtype, {shape.numel(), 1}}, one{shape.dtype, {1, 1}}, at{DType::I64, {1, 1}};
    os_ << "    " << p << "f = \"stablehlo.reshape\"(%" << n << ") : (" << shape.ToString() << ") -> "
        << flat.ToString() << "\n";
    os_ << "    " << p << "e = \"stablehlo.slice\"(" << p << "f) {limit_indices = array<i64: 1, 1>, "
        << "start_indices = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (" << flat.ToString() << ") -> "
        << one.ToString() << "\n";
    os_ << "    " << p << "i = \"stablehlo.constant\"() {value = dense<0> : " << at.ToString() << "} : () -> "
        << at.ToString() << "\n";
    os_ << "    " << p << "c = \"stablehlo.scatter\"(" << p << "f, " << p << "i, " << p << "e) ("
        << TakeUpdate(shape.dtype) << ") {indices_are_sorted = true, scatter_dimension_numbers = "
        << "#stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], "
        << "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = true} : ("
        << flat.ToString() << ", " << at.ToString() << ", " << one.ToString() << ") -> " << flat.ToString() << "\n";
    os_ << "    %s" << n << " = \"stablehlo.reshape\"(" << p << "c) : (" << flat.ToString() << ") -> "
        << shape.ToString() << "\n";
  }

  std::string Name(Value v) const {
    const ::tpj::ir::Node& n = g_.nodes[v.node];
    if (n.op == Op::Parameter) return "%arg" + std::to_string(ParamIndex(n));
    if (stored_[static_cast<size_t>(v.node)]) return "%s" + std::to_string(v.node);
    std::string s = "%" + std::to_string(v.node);
    if (n.results.size() > 1) s += "#" + std::to_string(v.index);
    return s;
  }

  // A region whose block takes `args` scalars of `t` and returns `body` of
  // them. `body` gets the argument names and returns the result name after
  // writing its ops.
  template <class Body>
  std::string Region(DType t, int args, Body body) {
    const std::string r = "%r" + std::to_string(regions_++) + "_";
    const std::string st = Shape{t, {}}.ToString();
    std::ostringstream rs;
    rs << "{\n    ^bb0(";
    std::vector<std::string> names;
    for (int i = 0; i < args; ++i) {
      names.push_back(r + std::to_string(i));
      rs << (i ? ", " : "") << names.back() << ": " << st;
    }
    rs << "):\n";
    std::string ret_type = st;
    const std::string result = body(rs, names, r, st, &ret_type);
    rs << "      \"stablehlo.return\"(" << result << ") : (" << ret_type << ") -> ()\n    }";
    return rs.str();
  }

  std::string Combine(ReduceKind k, DType t) {
    return Region(t, 2, [&](std::ostringstream& rs, const std::vector<std::string>& a,
                            const std::string& r, const std::string& st, std::string*) {
      const std::string out = r + "2";
      rs << "      " << out << " = \"" << ReduceOp(k, t) << "\"(" << a[0] << ", " << a[1]
         << ") : (" << st << ", " << st << ") -> " << st << "\n";
      return out;
    });
  }

  std::string SelectGe(DType t) {
    return Region(t, 2, [&](std::ostringstream& rs, const std::vector<std::string>& a,
                            const std::string& r, const std::string& st, std::string* ret) {
      const std::string out = r + "2";
      *ret = "tensor<i1>";
      rs << "      " << out << " = \"stablehlo.compare\"(" << a[0] << ", " << a[1] << ") {"
         << CompareText(CompareDir::GE, t) << "} : (" << st << ", " << st << ") -> tensor<i1>\n";
      return out;
    });
  }

  std::string TakeUpdate(DType t) {
    return Region(t, 2, [&](std::ostringstream&, const std::vector<std::string>& a,
                            const std::string&, const std::string&, std::string*) { return a[1]; });
  }

  std::string SortComparator(const std::vector<Shape>& in, bool descending) {
    // Block args: lhs_0, rhs_0, lhs_1, rhs_1, ...; orders by operand 0.
    const std::string r = "%r" + std::to_string(regions_++) + "_";
    std::ostringstream rs;
    rs << "{\n    ^bb0(";
    for (size_t i = 0; i < in.size() * 2; ++i) {
      rs << (i ? ", " : "") << r << i << ": " << Shape{in[i / 2].dtype, {}}.ToString();
    }
    const DType t = in[0].dtype;
    const std::string st = Shape{t, {}}.ToString();
    const std::string pred = "tensor<i1>";
    auto compare = [&](const std::string& out, CompareDir dir, const std::string& a, const std::string& b) {
      rs << "      " << out << " = \"stablehlo.compare\"(" << a << ", " << b << ") {" << CompareText(dir, t)
         << "} : (" << st << ", " << st << ") -> " << pred << "\n";
    };
    auto logic = [&](const std::string& out, const char* op, const std::string& a, const std::string& b) {
      rs << "      " << out << " = \"" << op << "\"(" << a << ", " << b << ") : (" << pred << ", " << pred
         << ") -> " << pred << "\n";
    };
    rs << "):\n";
    const std::string lhs = r + "0", rhs = r + "1";
    compare(r + "c", descending ? CompareDir::GT : CompareDir::LT, lhs, rhs);
    std::string result = r + "c";
    if (IsFloat(t)) {
      // NaN orders above +inf (PyTorch's order): ascending, lhs comes first
      // when only rhs is NaN; descending, when only lhs is. Equal keys,
      // +0.0/-0.0 and NaN/NaN among them, keep their order (stable).
      const std::string& nan_side = descending ? lhs : rhs;
      const std::string& num_side = descending ? rhs : lhs;
      compare(r + "n", CompareDir::NE, nan_side, nan_side);
      compare(r + "o", CompareDir::EQ, num_side, num_side);
      logic(r + "a", "stablehlo.and", r + "n", r + "o");
      logic(r + "r", "stablehlo.or", r + "c", r + "a");
      result = r + "r";
    }
    rs << "      \"stablehlo.return\"(" << result << ") : (" << pred << ") -> ()\n    }";
    return rs.str();
  }

  // The region and attribute text of a node, chosen by its attribute type
  // (no catch-all: a new attribute type fails to compile until it has one).
  // `in` are the operand shapes, `out` the first result's.
  struct Parts {
    std::string region, attrs;
  };
  using Shapes = std::vector<Shape>;

  Parts Text(std::monostate, const Shapes&, const Shape&) { return {}; }
  Parts Text(const ParameterAttrs&, const Shapes&, const Shape&) { return {}; }  // only ever %argN
  Parts Text(const ConstantAttrs& a, const Shapes&, const Shape& out) {
    return {"", "value = " + DenseLiteral(out, *a.data)};
  }
  Parts Text(const CompareAttrs& a, const Shapes& in, const Shape&) {
    return {"", CompareText(a.direction, in[0].dtype)};
  }
  Parts Text(const BroadcastInDimAttrs& a, const Shapes&, const Shape&) {
    return {"", "broadcast_dimensions = " + Array(a.broadcast_dimensions)};
  }
  Parts Text(const ReshapeAttrs&, const Shapes&, const Shape&) { return {}; }  // dims are in the type
  Parts Text(const TransposeAttrs& a, const Shapes&, const Shape&) {
    return {"", "permutation = " + Array(a.permutation)};
  }
  Parts Text(const ReverseAttrs& a, const Shapes&, const Shape&) {
    return {"", "dimensions = " + Array(a.dimensions)};
  }
  Parts Text(const SliceAttrs& a, const Shapes&, const Shape&) {
    return {"", "start_indices = " + Array(a.starts) + ", limit_indices = " + Array(a.limits) +
                    ", strides = " + Array(a.strides)};
  }
  Parts Text(const DynamicSliceAttrs& a, const Shapes&, const Shape&) {
    return {"", "slice_sizes = " + Array(a.slice_sizes)};
  }
  Parts Text(const ConcatenateAttrs& a, const Shapes&, const Shape&) {
    return {"", "dimension = " + std::to_string(a.dimension) + " : i64"};
  }
  Parts Text(const PadAttrs& a, const Shapes&, const Shape&) {
    return {"", "edge_padding_low = " + Array(a.low) + ", edge_padding_high = " + Array(a.high) +
                    ", interior_padding = " + Array(a.interior)};
  }
  Parts Text(const IotaAttrs& a, const Shapes&, const Shape&) {
    return {"", "iota_dimension = " + std::to_string(a.dimension) + " : i64"};
  }
  // Both operands' precision_config, when not the plugin's default.
  static std::string PrecisionConfig(Precision p) {
    if (p == Precision::Default) return "";
    const std::string one = p == Precision::High ? "#stablehlo<precision HIGH>" : "#stablehlo<precision HIGHEST>";
    return ", precision_config = [" + one + ", " + one + "]";
  }
  Parts Text(const DotGeneralAttrs& a, const Shapes&, const Shape&) {
    const DotDims& d = a.dims;
    std::vector<std::string> parts;
    if (!d.lhs_batch.empty()) parts.push_back("lhs_batching_dimensions = " + Bracket(d.lhs_batch));
    if (!d.rhs_batch.empty()) parts.push_back("rhs_batching_dimensions = " + Bracket(d.rhs_batch));
    if (!d.lhs_contract.empty()) parts.push_back("lhs_contracting_dimensions = " + Bracket(d.lhs_contract));
    if (!d.rhs_contract.empty()) parts.push_back("rhs_contracting_dimensions = " + Bracket(d.rhs_contract));
    std::string attrs = "dot_dimension_numbers = #stablehlo.dot<";
    for (size_t i = 0; i < parts.size(); ++i) attrs += (i ? ", " : "") + parts[i];
    return {"", attrs + ">" + PrecisionConfig(a.precision)};
  }
  Parts Text(const ReduceAttrs& a, const Shapes& in, const Shape&) {
    return {Combine(a.kind, in[0].dtype), "dimensions = " + Array(a.dimensions)};
  }
  Parts Text(const ReduceWindowAttrs& a, const Shapes& in, const Shape&) {
    const std::vector<int64_t> ones(in[0].dims.size(), 1);
    return {Combine(a.kind, in[0].dtype),
            "window_dimensions = " + Array(a.window_dimensions) + ", window_strides = " +
                Array(a.window_strides) + ", base_dilations = " +
                Array(a.base_dilations.empty() ? ones : a.base_dilations) + ", window_dilations = " +
                Array(a.window_dilations.empty() ? ones : a.window_dilations) +
                ", padding = " + Padding(a.padding_low, a.padding_high)};
  }
  Parts Text(const SelectAndScatterAttrs& a, const Shapes& in, const Shape&) {
    std::string region = SelectGe(in[0].dtype);  // regions are numbered in print order
    region += ", " + Combine(ReduceKind::Sum, in[0].dtype);
    return {region, "window_dimensions = " + Array(a.window_dimensions) + ", window_strides = " +
                        Array(a.window_strides) + ", padding = " + Padding(a.padding_low, a.padding_high)};
  }
  Parts Text(const ConvolutionAttrs& a, const Shapes& in, const Shape&) {
    const int64_t r = in[0].rank();
    const ConvDims& c = a.dims;
    return {"", "batch_group_count = " + std::to_string(a.batch_group_count) +
                    " : i64, dimension_numbers = #stablehlo.conv<" +
                    ConvLabels(r, c.in_batch, 'b', c.in_feature, 'f', c.in_spatial) + "x" +
                    ConvLabels(r, c.k_out, 'o', c.k_in, 'i', c.k_spatial) + "->" +
                    ConvLabels(r, c.out_batch, 'b', c.out_feature, 'f', c.out_spatial) +
                    ">, feature_group_count = " + std::to_string(a.feature_group_count) +
                    " : i64, lhs_dilation = " + Array(a.lhs_dilation) + ", padding = " +
                    Padding(a.padding_low, a.padding_high) + ", rhs_dilation = " + Array(a.rhs_dilation) +
                    ", window_strides = " + Array(a.window_strides) + PrecisionConfig(a.precision)};
  }
  Parts Text(const GatherAttrs& a, const Shapes&, const Shape&) {
    const GatherDims& gd = a.dims;
    std::vector<std::string> parts;
    if (!gd.offset_dims.empty()) parts.push_back("offset_dims = " + Bracket(gd.offset_dims));
    if (!gd.collapsed_slice_dims.empty()) parts.push_back("collapsed_slice_dims = " + Bracket(gd.collapsed_slice_dims));
    if (!gd.start_index_map.empty()) parts.push_back("start_index_map = " + Bracket(gd.start_index_map));
    parts.push_back("index_vector_dim = " + std::to_string(gd.index_vector_dim));
    std::string attrs = "dimension_numbers = #stablehlo.gather<";
    for (size_t i = 0; i < parts.size(); ++i) attrs += (i ? ", " : "") + parts[i];
    return {"", attrs + ">, indices_are_sorted = false, slice_sizes = " + Array(a.slice_sizes)};
  }
  Parts Text(const ScatterAttrs& a, const Shapes& in, const Shape&) {
    const ScatterDims& sd = a.dims;
    std::string region = a.replace ? TakeUpdate(in[0].dtype) : Combine(a.kind, in[0].dtype);
    std::vector<std::string> parts;
    if (!sd.update_window_dims.empty()) parts.push_back("update_window_dims = " + Bracket(sd.update_window_dims));
    if (!sd.inserted_window_dims.empty()) parts.push_back("inserted_window_dims = " + Bracket(sd.inserted_window_dims));
    if (!sd.scatter_dims_to_operand_dims.empty()) parts.push_back("scatter_dims_to_operand_dims = " + Bracket(sd.scatter_dims_to_operand_dims));
    parts.push_back("index_vector_dim = " + std::to_string(sd.index_vector_dim));
    std::string attrs = "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<";
    for (size_t i = 0; i < parts.size(); ++i) attrs += (i ? ", " : "") + parts[i];
    return {std::move(region), attrs + ">, unique_indices = false"};
  }
  Parts Text(const SortAttrs& a, const Shapes& in, const Shape&) {
    return {SortComparator(in, a.descending), "dimension = " + std::to_string(a.dimension) + " : i64, is_stable = true"};
  }
  Parts Text(const TopKAttrs& a, const Shapes&, const Shape&) { return {"", "k = " + std::to_string(a.k) + " : i64"}; }
  Parts Text(const RngBitGeneratorAttrs&, const Shapes&, const Shape&) {
    return {"", "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>"};
  }
  Parts Text(const AllReduceAttrs& a, const Shapes& in, const Shape&) {
    return {Combine(a.kind, in[0].dtype), "replica_groups = " + Groups(a.replica_groups)};
  }
  Parts Text(const AllGatherAttrs& a, const Shapes&, const Shape&) {
    return {"", "all_gather_dim = " + std::to_string(a.dimension) +
                    " : i64, replica_groups = " + Groups(a.replica_groups)};
  }
  Parts Text(const ReduceScatterAttrs& a, const Shapes& in, const Shape&) {
    return {Combine(a.kind, in[0].dtype), "replica_groups = " + Groups(a.replica_groups) +
                                               ", scatter_dimension = " + std::to_string(a.dimension) + " : i64"};
  }

  Parts Text(const FftAttrs& a, const Shapes&, const Shape&) {
    return {"", std::string("fft_type = #stablehlo<fft_type ") + FftTypeName(a.type) +
                    ">, fft_length = " + Array(a.fft_length)};
  }
  Parts Text(const CholeskyAttrs& a, const Shapes&, const Shape&) {
    return {"", std::string("lower = ") + (a.lower ? "true" : "false")};
  }
  Parts Text(const TriangularSolveAttrs& a, const Shapes&, const Shape&) {
    auto flag = [](bool v) { return v ? "true" : "false"; };
    return {"", std::string("left_side = ") + flag(a.left_side) + ", lower = " + flag(a.lower) +
                    ", transpose_a = #stablehlo<transpose " + (a.transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") +
                    ">, unit_diagonal = " + flag(a.unit_diagonal)};
  }
  Parts Text(const CustomCallAttrs& a, const Shapes&, const Shape&) {
    std::string attrs = "call_target_name = \"" + a.target + "\"";
    if (!a.backend_config.empty()) attrs += ", backend_config = \"" + a.backend_config + "\"";
    if (!a.sharding.empty()) attrs += ", mhlo.sharding = \"" + a.sharding + "\"";
    return {"", attrs};
  }

  Parts Text(const CallAttrs& a, const Shapes&, const Shape&) { return {"", "callee = " + callees_.Name(a.body.get())}; }

  // Ops XLA may evaluate at compile time when every operand is known.
  static bool Foldable(Op op) {
    switch (op) {
      case Op::Parameter:
      case Op::RngBitGenerator:
      case Op::AllReduce:
      case Op::AllGather:
      case Op::ReduceScatter:
      case Op::CustomCall:
      case Op::Call:
        return false;
      default:
        return true;
    }
  }

  // A large reduction of a value known at compile time (torch.zeros(10000,
  // 1000).sum()) took XLA's constant folding 6-20 s to evaluate, element by
  // element (the CPU plugin's tree rewrite turns it into a reduce_window
  // first); behind an optimization barrier it runs with the program, in
  // milliseconds. Smaller ones still fold.
  static constexpr int64_t kFoldLimit = 1 << 16;
  std::string Operand(const ::tpj::ir::Node& n, size_t i) {
    const Value v = n.operands[i];
    const bool reduction = n.op == Op::Reduce || n.op == Op::ReduceWindow;
    if (!reduction || i >= n.operands.size() / 2 || !constant_[static_cast<size_t>(v.node)] ||
        g_.shape(v).numel() < kFoldLimit) {
      return Name(v);
    }
    const std::string name = "%barrier" + std::to_string(barriers_++);
    const std::string type = g_.shape(v).ToString();
    os_ << "    " << name << " = \"stablehlo.optimization_barrier\"(" << Name(v) << ") : (" << type << ") -> " << type
        << "\n";
    return name;
  }

  void Node(int32_t id) {
    const ::tpj::ir::Node& n = g_.nodes[id];
    Shapes in;
    std::vector<std::string> names;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      in.push_back(g_.shape(n.operands[i]));
      names.push_back(Operand(n, i));
    }
    const Parts p = std::visit([&](const auto& a) { return Text(a, in, n.results[0]); }, n.attrs);
    os_ << "    %" << id;
    if (n.results.size() > 1) os_ << ":" << n.results.size();
    os_ << " = \"" << MlirOpName(n.op) << "\"(";
    for (size_t i = 0; i < names.size(); ++i) os_ << (i ? ", " : "") << names[i];
    os_ << ")";
    if (!p.region.empty()) os_ << " (" << p.region << ")";
    if (!p.attrs.empty()) os_ << " {" << p.attrs << "}";
    os_ << " : (";
    for (size_t i = 0; i < in.size(); ++i) os_ << (i ? ", " : "") << in[i].ToString();
    os_ << ") -> ";
    if (n.results.size() == 1) {
      os_ << n.results[0].ToString();
    } else {
      os_ << "(";
      for (size_t i = 0; i < n.results.size(); ++i) os_ << (i ? ", " : "") << n.results[i].ToString();
      os_ << ")";
    }
    os_ << "\n";
  }

  const Graph& g_;
  Callees& callees_;
  std::ostringstream os_;
  int regions_ = 0;
  int barriers_ = 0;
  std::vector<bool> constant_;  // per node: computed from constants only (Foldable ops)
  std::vector<bool> stored_;    // per node: computed into memory (MarkRecomputed, Store)
};

}  // namespace

std::string PrintStableHlo(const Graph& g) {
  Callees callees;
  return Printer(g, callees).Module();
}

std::string DenseLiteralText(const Shape& shape, const std::vector<uint8_t>& bytes) {
  return DenseLiteral(shape, bytes);
}

}  // namespace tpj::ir
