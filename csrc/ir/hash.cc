#include "ir/hash.h"

#include <cstring>
#include <type_traits>

namespace tpj::ir {
namespace {

// FNV-style multiply-xor over 64-bit words (bytes for the tail), with a
// final avalanche (splitmix64). Word-wise: hashing is on every sync's path.
class Hasher {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      Word(w);
    }
    for (; i < n; ++i) Word(b[i]);
  }
  void Word(uint64_t w) {
    h_ ^= w;
    h_ *= 0x100000001b3ull;
    h_ ^= h_ >> 29;
  }
  void Int(int64_t v) { Word(static_cast<uint64_t>(v)); }
  void Ints(const std::vector<int64_t>& v) {
    Int(static_cast<int64_t>(v.size()));
    if (!v.empty()) Bytes(v.data(), v.size() * sizeof(int64_t));
  }
  void Shape(const ::tpj::ir::Shape& s) {
    Int(static_cast<int64_t>(s.dtype));
    Ints(s.dims);
  }
  uint64_t Finish() const {
    uint64_t z = h_ + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// Hashes the fields an attribute struct lists in Fields: all of them when
// `everything`, else only the enum, bool and string ones (see ShapeBlindHash). A field
// of a type with no rule here fails to compile rather than go unhashed.
struct FieldHasher {
  Hasher& h;
  bool everything;

  template <class T>
  void operator()(const char*, const T& v) {
    if constexpr (std::is_enum_v<T> || std::is_same_v<T, bool>) {
      h.Int(static_cast<int64_t>(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
      h.Int(static_cast<int64_t>(v.size()));  // a choice, as enums are (custom call targets)
      h.Bytes(v.data(), v.size());
    } else if constexpr (HasFields<T>::value) {
      T::Fields(v, *this);
    } else if (everything) {
      Leaf(v);
    }
  }
  void Leaf(int64_t v) { h.Int(v); }
  void Leaf(const std::vector<int64_t>& v) { h.Ints(v); }
  void Leaf(const std::vector<std::vector<int64_t>>& v) {
    h.Int(static_cast<int64_t>(v.size()));
    for (const auto& x : v) h.Ints(x);
  }
  void Leaf(const std::shared_ptr<const std::vector<uint8_t>>& data) {
    h.Int(data ? static_cast<int64_t>(data->size()) : -1);
    if (data) h.Bytes(data->data(), data->size());
  }
  // A called graph: by its whole hash. Only graphs hashed node by node pay
  // it (a trace taken over whole keeps its Fingerprint).
  void Leaf(const std::shared_ptr<const Graph>& body) { h.Word(body ? ProgramHash(*body) : 0); }
};

uint64_t Hash(const Graph& g, bool values) {
  Hasher h;
  h.Int(g.num_replicas);
  h.Int(g.num_partitions);
  h.Int(static_cast<int64_t>(g.nodes.size()));
  for (const Node& n : g.nodes) {
    h.Int(static_cast<int64_t>(n.op));
    h.Int(static_cast<int64_t>(n.operands.size()));
    for (Value v : n.operands) {
      h.Int(v.node);
      h.Int(v.index);
    }
    h.Int(static_cast<int64_t>(n.results.size()));
    if (values) {
      for (const auto& s : n.results) h.Shape(s);
    } else if (n.op == Op::Parameter) {
      h.Int(ParamIndex(n));  // an integer, but numbering rather than shape
    }
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (HasFields<A>::value) A::Fields(a, FieldHasher{h, values});
        },
        n.attrs);
  }
  h.Int(static_cast<int64_t>(g.outputs.size()));
  for (Value v : g.outputs) {
    h.Int(v.node);
    h.Int(v.index);
  }
  if (!g.output_shardings.empty()) h.Int(static_cast<int64_t>(g.output_shardings.size()));  // SPMD only
  for (const std::string& s : g.output_shardings) {
    h.Int(static_cast<int64_t>(s.size()));
    h.Bytes(s.data(), s.size());
  }
  h.Int(static_cast<int64_t>(g.aliases.size()));
  for (const Alias& a : g.aliases) {
    h.Int(a.param);
    h.Int(a.output);
  }
  return h.Finish();
}

// Field-by-field equality of two structs of one type: Fields walks `a`;
// each member of `b` is the one at the same offset.
struct FieldEqual {
  const char* a;
  const char* b;
  bool same = true;

  template <class T>
  void operator()(const char*, const T& x) {
    if (same) same = Equal(x, *reinterpret_cast<const T*>(b + (reinterpret_cast<const char*>(&x) - a)));
  }
  template <class T>
  static bool Equal(const T& x, const T& y) {
    if constexpr (HasFields<T>::value) {
      FieldEqual e{reinterpret_cast<const char*>(&x), reinterpret_cast<const char*>(&y)};
      T::Fields(x, e);
      return e.same;
    } else if constexpr (std::is_same_v<T, std::shared_ptr<const std::vector<uint8_t>>>) {
      return x == y || (x && y && *x == *y);
    } else {
      return x == y;
    }
  }
};

}  // namespace

bool SameAttrs(const Attrs& a, const Attrs& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using A = std::decay_t<decltype(x)>;
        if constexpr (HasFields<A>::value) {
          return FieldEqual::Equal(x, std::get<A>(b));
        } else {
          static_assert(std::is_empty_v<A>, "an attribute struct with members lists them in Fields");
          return true;
        }
      },
      a);
}

uint64_t ProgramHash(const Graph& g) { return Hash(g, true); }
uint64_t ShapeBlindHash(const Graph& g) { return Hash(g, false); }

}  // namespace tpj::ir
