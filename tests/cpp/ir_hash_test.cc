// ProgramHash sees every attribute field, shape, dtype, constant byte and
// wire; ShapeBlindHash sees ops and wiring, parameter numbering and the enum
// and bool attributes, but no shapes, dtypes, constant values or other
// integer attributes. SameAttrs sees every attribute field, and a Builder
// restarted on a graph builds exactly what a fresh one builds (Restart). No
// plugin needed.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "ir/graph.h"
#include "ir/hash.h"

namespace tpj::ir {
namespace {

// Adds a node of every attribute type (std::monostate included) to `b`
// (of 4 replicas); returns values to output.
std::vector<Value> AddEveryAttribute(Builder& b) {
  auto x = b.Parameter({DType::F32, {2, 3}});
  auto y = b.Parameter({DType::F32, {2, 3}});
  auto c = b.Constant({DType::F32, {2}}, {0, 0, 128, 63, 0, 0, 0, 64});
  auto zero = b.ScalarConstant(DType::F32, 0);
  auto i0 = b.ScalarConstant(DType::I32, 0);
  std::vector<Value> out;
  out.push_back(b.Binary(Op::Add, x, y));
  out.push_back(b.Compare(CompareDir::LT, x, y));
  out.push_back(b.BroadcastInDim(c, {3, 2}, {1}));
  out.push_back(b.Reshape(x, {3, 2}));
  out.push_back(b.Transpose(x, {1, 0}));
  out.push_back(b.Reverse(x, {1}));
  out.push_back(b.Slice(x, {0, 1}, {2, 3}, {1, 2}));
  out.push_back(b.DynamicSlice(x, {i0, i0}, {1, 2}));
  out.push_back(b.Concatenate({x, y}, 1));
  out.push_back(b.Pad(x, zero, {1, 0}, {0, 1}, {1, 1}));
  out.push_back(b.Iota({DType::I32, {2, 3}}, 1));
  out.push_back(b.DotGeneral(x, y, DotDims{{}, {}, {1}, {1}}));
  out.push_back(b.Reduce(x, zero, {1}, ReduceKind::Max));
  out.push_back(b.ReduceWindow(x, zero, ReduceKind::Sum, {2, 2}, {1, 1}, {1, 2}, {2, 1}, {0, 1}, {1, 0}));
  out.push_back(b.SelectAndScatter(x, b.Parameter({DType::F32, {1, 1}}), zero, {2, 3}, {2, 3}, {0, 0}, {0, 0}));
  ConvDims cd;
  cd.in_spatial = {2, 3};
  cd.k_spatial = {2, 3};
  cd.out_spatial = {2, 3};
  out.push_back(b.Convolution(b.Parameter({DType::F32, {2, 4, 5, 5}}), b.Parameter({DType::F32, {6, 2, 3, 3}}), cd,
                              {1, 2}, {1, 0}, {0, 1}, {1, 1}, {2, 1}, 2, 1));
  auto idx = b.Parameter({DType::I64, {3, 1}});
  GatherDims gd;
  gd.offset_dims = {1};
  gd.collapsed_slice_dims = {0};
  gd.start_index_map = {0};
  gd.index_vector_dim = 1;
  auto gathered = b.Gather(x, idx, gd, {1, 3});
  out.push_back(gathered);
  ScatterDims sd;
  sd.update_window_dims = {1};
  sd.inserted_window_dims = {0};
  sd.scatter_dims_to_operand_dims = {0};
  sd.index_vector_dim = 1;
  out.push_back(b.Scatter(x, idx, gathered, sd, false));
  out.push_back(b.Sort({x, y}, 1, true)[1]);
  out.push_back(b.TopK(x, 2)[0]);
  out.push_back(b.RngBitGenerator(b.Parameter({DType::U64, {2}}), {DType::U32, {4}})[1]);
  out.push_back(b.AllReduce(x, ReduceKind::Sum, {{0, 1}, {2, 3}}));
  out.push_back(b.AllGather(x, 0));
  out.push_back(b.ReduceScatter(b.Parameter({DType::F32, {8}}), 0, ReduceKind::Min));
  out.push_back(b.Fft(x, FftType::RFFT, {2, 3}));
  auto sq = b.Parameter({DType::F32, {3, 3}});
  out.push_back(b.TriangularSolve(b.Cholesky(sq, true), sq, true, true, false, false));
  out.push_back(b.CustomCall("Eigh", {sq}, {{DType::F32, {3, 3}}, {DType::F32, {3}}}, "1,1,100,1e-06")[1]);
  out.push_back(b.ShardingConstraint(x, "{replicated}"));
  // One called graph for every call of this function: a call is the same
  // node (taken over by Restart) only when it calls the same graph object.
  static const auto callee = [] {
    Builder c;
    Value p = c.Parameter({DType::F32, {2, 3}});
    return std::make_shared<const Graph>(c.Build({c.Unary(Op::Neg, p)}));
  }();
  out.push_back(b.Call(callee, {x})[0]);
  return out;
}

// A valid graph with a node of every attribute type (std::monostate included).
Graph EveryAttributeGraph() {
  Builder b(4);
  const std::vector<Value> out = AddEveryAttribute(b);
  return b.Build(out);
}

template <class A>
std::string AlternativeName() {
  if constexpr (std::is_same_v<A, std::monostate>) {
    return "std::monostate";
  } else {
    return std::string(OpName(A::kOp)) + "Attrs";
  }
}

template <size_t... I>
std::vector<std::string> AlternativeNames(std::index_sequence<I...>) {
  return {AlternativeName<std::variant_alternative_t<I, Attrs>>()...};
}

// Converts to anything; only for the unevaluated `T{...}` below.
struct AnyValue {
  template <class T>
  operator T() const;
};

template <class T, class Indices, class = void>
struct BracesTake : std::false_type {};
template <class T, size_t... I>
struct BracesTake<T, std::index_sequence<I...>, std::void_t<decltype(T{(void(I), AnyValue{})...})>>
    : std::true_type {};

// The data members of aggregate T: the most initializers T{...} takes.
template <class T, size_t N = 0>
constexpr size_t MemberCount() {
  if constexpr (BracesTake<T, std::make_index_sequence<N + 1>>::value) {
    return MemberCount<T, N + 1>();
  } else {
    return N;
  }
}

// Fields of T lists every data member of T once (and so does each nested
// struct's): a member left out of Fields would go unhashed.
template <class T>
void ExpectFieldsListsEveryMember(const std::string& what) {
  T value{};
  std::set<const void*> listed;
  T::Fields(value, [&](const char* name, const auto& field) {
    using F = std::decay_t<decltype(field)>;
    EXPECT_TRUE(listed.insert(&field).second) << what << "." << name << " is listed twice";
    if constexpr (HasFields<F>::value) ExpectFieldsListsEveryMember<F>(what + "." + name);
  });
  EXPECT_EQ(listed.size(), MemberCount<T>()) << what << ": Fields must list every data member";
}

template <size_t... I>
void ExpectEveryAlternativeListsEveryMember(std::index_sequence<I...>) {
  auto one = [](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    if constexpr (HasFields<A>::value) ExpectFieldsListsEveryMember<A>(AlternativeName<A>());
  };
  (one(static_cast<std::variant_alternative_t<I, Attrs>*>(nullptr)), ...);
}

TEST(Hash, FieldsListsEveryDataMember) {
  static_assert(MemberCount<SliceAttrs>() == 3 && MemberCount<ConvolutionAttrs>() == 10);
  ExpectEveryAlternativeListsEveryMember(std::make_index_sequence<std::variant_size_v<Attrs>>());
}

TEST(Hash, TheTestGraphHasEveryAttributeTypeEachWithItsOp) {
  const std::vector<std::string> names = AlternativeNames(std::make_index_sequence<std::variant_size_v<Attrs>>());
  const Graph g = EveryAttributeGraph();
  std::set<size_t> seen;
  for (const Node& n : g.nodes) {
    seen.insert(n.attrs.index());
    std::visit(
        [&](const auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (!std::is_same_v<A, std::monostate>) {
            EXPECT_EQ(A::kOp, n.op) << OpName(n.op);
          }
        },
        n.attrs);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(seen.count(i)) << "EveryAttributeGraph has no node with " << names[i] << ": add one";
  }
}

// Changes one leaf field (the `target`-th met) of the attributes it visits,
// walking nested dimension structs through their own Fields; counts leaves.
struct ChangeOneField {
  explicit ChangeOneField(int target) : target(target) {}
  int target;
  int seen = 0;
  std::string path, changed;
  bool choice = false;  // the changed field is an enum or bool

  template <class T>
  void operator()(const char* name, T& v) {
    if constexpr (HasFields<T>::value) {
      const std::string outer = path;
      path += std::string(name) + ".";
      T::Fields(v, *this);
      path = outer;
    } else if (seen++ == target) {
      changed = path + name;
      choice = std::is_enum_v<T> || std::is_same_v<T, bool> || std::is_same_v<T, std::string>;
      Change(v);
    }
  }

  template <class E>
  static void Change(E& v) {
    static_assert(std::is_enum_v<E>, "a field type ChangeOneField does not know");
    v = static_cast<E>(v == E{} ? 1 : 0);
  }
  static void Change(bool& v) { v = !v; }
  static void Change(int64_t& v) { v += 1; }
  static void Change(std::string& v) { v += "x"; }
  // Non-empty lists keep their length, so the hash must see the contents.
  static void Change(std::vector<int64_t>& v) {
    if (v.empty()) {
      v.push_back(0);
    } else {
      v.back() += 1;
    }
  }
  static void Change(std::vector<std::vector<int64_t>>& v) {
    if (v.empty() || v.back().empty()) {
      v.push_back({0});
    } else {
      v.back().back() += 1;
    }
  }
  static void Change(std::shared_ptr<const Graph>& body) {
    auto other = std::make_shared<Graph>(*body);
    other->num_replicas += 1;
    body = std::move(other);
  }
  static void Change(std::shared_ptr<const std::vector<uint8_t>>& data) {
    auto bytes = data ? *data : std::vector<uint8_t>{};
    if (bytes.empty()) {
      bytes.push_back(0);
    } else {
      bytes.back() ^= 1;
    }
    data = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  }
};

// Visits the attributes of `n` with `f`.
void VisitAttrs(Node& n, ChangeOneField& f) {
  std::visit(
      [&](auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (HasFields<A>::value) A::Fields(a, f);
      },
      n.attrs);
}

TEST(Hash, ProgramHashSeesEveryAttributeFieldAndShapeBlindHashOnlyChoices) {
  const Graph base = EveryAttributeGraph();
  std::map<uint64_t, std::string> program{{ProgramHash(base), "the unchanged graph"}};
  const uint64_t blind = ShapeBlindHash(base);
  size_t variants = 0;
  for (size_t id = 0; id < base.nodes.size(); ++id) {
    Node scratch = base.nodes[id];
    ChangeOneField count(-1);
    VisitAttrs(scratch, count);
    for (int leaf = 0; leaf < count.seen; ++leaf) {
      Graph g = base;
      ChangeOneField change(leaf);
      VisitAttrs(g.nodes[id], change);
      const std::string what = "node " + std::to_string(id) + " " + OpName(g.nodes[id].op) + " " + change.changed;
      ++variants;
      auto [it, fresh] = program.emplace(ProgramHash(g), what);
      EXPECT_TRUE(fresh) << what << " hashes like " << it->second;
      // ShapeBlindHash: choices and parameter numbering only.
      const bool blind_sees = change.choice || g.nodes[id].op == Op::Parameter;
      EXPECT_EQ(ShapeBlindHash(g) != blind, blind_sees) << what;
    }
  }
  EXPECT_GE(variants, 60u);  // 78 leaves today, nested dimension structs included
}

TEST(Hash, SameAttrsSeesEveryField) {
  const Graph base = EveryAttributeGraph();
  size_t variants = 0;
  for (size_t id = 0; id < base.nodes.size(); ++id) {
    const Node copy = base.nodes[id];
    EXPECT_TRUE(SameAttrs(base.nodes[id].attrs, copy.attrs)) << OpName(copy.op);
    Node scratch = base.nodes[id];
    ChangeOneField count(-1);
    VisitAttrs(scratch, count);
    for (int leaf = 0; leaf < count.seen; ++leaf) {
      Node changed = base.nodes[id];
      ChangeOneField change(leaf);
      VisitAttrs(changed, change);
      ++variants;
      EXPECT_FALSE(SameAttrs(base.nodes[id].attrs, changed.attrs)) << OpName(changed.op) << " " << change.changed;
    }
  }
  EXPECT_GE(variants, 60u);
  EXPECT_FALSE(SameAttrs(Attrs{std::monostate{}}, Attrs{IotaAttrs{0}}));
}

// Builds `first`, then after Restart `second`, in one builder: the graph
// must be node for node what a fresh builder makes of `second`, and its
// Fingerprint that graph's ProgramHash.
void ExpectRestartBuilds(const std::function<void(Builder&)>& first, const std::function<void(Builder&)>& second) {
  Builder b(4), fresh(4);
  first(b);
  b.Fingerprint();
  b.Restart();
  second(b);
  second(fresh);
  const Graph& g = b.graph();
  const Graph& f = fresh.graph();
  ASSERT_EQ(g.nodes.size(), f.nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    EXPECT_EQ(g.nodes[i].op, f.nodes[i].op) << "node " << i;
    EXPECT_EQ(g.nodes[i].operands, f.nodes[i].operands) << "node " << i;
    EXPECT_EQ(g.nodes[i].results, f.nodes[i].results) << "node " << i << " " << OpName(f.nodes[i].op);
    EXPECT_TRUE(SameAttrs(g.nodes[i].attrs, f.nodes[i].attrs)) << "node " << i << " " << OpName(f.nodes[i].op);
  }
  EXPECT_EQ(g.params, f.params);
  EXPECT_EQ(b.Fingerprint(), ProgramHash(f));
  EXPECT_EQ(b.Fingerprint(), ProgramHash(g));
}

TEST(Restart, ARepeatedGraphIsTakenOverWithItsFingerprint) {
  auto every = [](Builder& b) { AddEveryAttribute(b); };
  ExpectRestartBuilds(every, every);
  // Twice over: the nodes taken over are taken over again.
  Builder b(4);
  AddEveryAttribute(b);
  const uint64_t fp = b.Fingerprint();
  for (int i = 0; i < 2; ++i) {
    b.Restart();
    AddEveryAttribute(b);
    EXPECT_EQ(b.Fingerprint(), fp);
    EXPECT_EQ(ProgramHash(b.graph()), fp);
  }
}

TEST(Restart, WhatDiffersIsBuiltAgainFromThereOn) {
  auto every = [](Builder& b) { AddEveryAttribute(b); };
  // Shorter, longer, empty.
  auto head = [](Builder& b) { b.Unary(Op::Neg, b.Parameter({DType::F32, {2, 3}})); };
  ExpectRestartBuilds(every, head);
  ExpectRestartBuilds(head, every);
  ExpectRestartBuilds(every, [](Builder&) {});
  // Results that are given, not inferred: each builder call below makes a
  // node whose op, operands and attributes are the same for both variants.
  auto convert = [](DType to) {
    return [to](Builder& b) { b.Unary(Op::Neg, b.Convert(b.Parameter({DType::F32, {4}}), to)); };
  };
  ExpectRestartBuilds(convert(DType::F64), convert(DType::I32));
  auto bitcast = [](DType to) {
    return [to](Builder& b) {
      auto v = b.Bitcast(b.Parameter({DType::F32, {4}}), to);
      b.Binary(Op::Add, v, v);
    };
  };
  ExpectRestartBuilds(bitcast(DType::I32), bitcast(DType::U8));
  ExpectRestartBuilds(bitcast(DType::U8), bitcast(DType::I32));
  auto rng = [](int64_t n) {
    return [n](Builder& b) { b.RngBitGenerator(b.Parameter({DType::U64, {2}}), {DType::U32, {n}}); };
  };
  ExpectRestartBuilds(rng(4), rng(5));
  auto custom = [](int64_t n) {
    return [n](Builder& b) {
      auto sq = b.Parameter({DType::F32, {3, 3}});
      b.CustomCall("Eigh", {sq}, {{DType::F32, {3, 3}}, {DType::F32, {n}}}, "");
    };
  };
  ExpectRestartBuilds(custom(3), custom(4));
  auto sharded = [](const char* s) {
    return [s](Builder& b) { b.Unary(Op::Neg, b.ShardingConstraint(b.Parameter({DType::F32, {4}}), s)); };
  };
  ExpectRestartBuilds(sharded("{replicated}"), sharded("{maximal device=0}"));
  auto param = [](int64_t n) { return [n](Builder& b) { b.Unary(Op::Neg, b.Parameter({DType::F32, {n}})); }; };
  ExpectRestartBuilds(param(2), param(3));
  auto constant = [](double v) { return [v](Builder& b) { b.Unary(Op::Neg, b.Full(DType::F32, {2}, v)); }; };
  ExpectRestartBuilds(constant(1), constant(2));
  auto iota = [](int64_t n) { return [n](Builder& b) { b.Unary(Op::Neg, b.Iota({DType::F32, {n}}, 0)); }; };
  ExpectRestartBuilds(iota(2), iota(3));
}

TEST(Restart, GraphsThatAlternateAreEachTakenOver) {
  // As the traces of a compiled step: the loss, then the optimizer, again
  // and again. Each is taken over whole from its own earlier graph and is
  // node for node what a fresh builder makes.
  auto loss = [](Builder& b) {
    Value x = b.Parameter({DType::F32, {4, 3}});
    b.Unary(Op::Exp, b.Binary(Op::Add, x, x));
  };
  auto optimizer = [](Builder& b) {
    Value p = b.Parameter({DType::F32, {4, 3}});
    Value g = b.Parameter({DType::F32, {4, 3}});
    b.Binary(Op::Sub, p, b.Binary(Op::Mul, g, b.Full(DType::F32, {4, 3}, 0.1)));
  };
  auto every = [](Builder& b) { AddEveryAttribute(b); };
  const std::vector<std::function<void(Builder&)>> kinds = {loss, optimizer, every};
  std::vector<uint64_t> fresh_fp;
  std::vector<size_t> sizes;
  for (const auto& k : kinds) {
    Builder fresh(4);
    k(fresh);
    fresh_fp.push_back(ProgramHash(fresh.graph()));
    sizes.push_back(fresh.graph().nodes.size());
  }
  Builder b(4);
  for (int round = 0; round < 3; ++round) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      b.Restart();
      kinds[k](b);
      if (round > 0) EXPECT_EQ(b.taken_over(), sizes[k]) << "round " << round << " graph " << k;
      EXPECT_EQ(b.graph().nodes.size(), sizes[k]);
      EXPECT_EQ(b.Fingerprint(), fresh_fp[k]);
      EXPECT_EQ(ProgramHash(b.graph()), fresh_fp[k]);
    }
  }
  // More kinds than are kept: the oldest is built again.
  for (int i = 0; i < static_cast<int>(Builder::kEarlier); ++i) {
    b.Restart();
    b.Unary(Op::Neg, b.Parameter({DType::F32, {i + 7}}));
  }
  b.Restart();
  loss(b);
  EXPECT_EQ(b.taken_over(), 0u);
  EXPECT_EQ(b.Fingerprint(), fresh_fp[0]);
}

TEST(Restart, AGraphThatLeavesOneEarlierGraphGoesOnWithAnother) {
  // Two earlier graphs share a head; the new one follows the newer one for
  // the head, then only the older one: every node is taken over.
  auto head = [](Builder& b) { return b.Unary(Op::Neg, b.Parameter({DType::F32, {5}})); };
  auto tail_a = [&](Builder& b) { b.Unary(Op::Exp, head(b)); };
  auto tail_b = [&](Builder& b) { b.Unary(Op::Log, head(b)); };
  Builder b, fresh;
  tail_a(b);
  b.Fingerprint();
  b.Restart();
  tail_b(b);
  b.Fingerprint();
  b.Restart();
  tail_a(b);
  tail_a(fresh);
  EXPECT_EQ(b.taken_over(), 3u);
  EXPECT_EQ(b.Fingerprint(), ProgramHash(fresh.graph()));
  EXPECT_EQ(ProgramHash(b.graph()), ProgramHash(fresh.graph()));
  // The graph whose head was taken got it back: repeated whole again.
  b.Restart();
  tail_b(b);
  Builder fresh_b;
  tail_b(fresh_b);
  EXPECT_EQ(b.taken_over(), 3u);
  EXPECT_EQ(b.Fingerprint(), ProgramHash(fresh_b.graph()));
  EXPECT_EQ(ProgramHash(b.graph()), ProgramHash(fresh_b.graph()));
  const Graph& g = b.graph();
  const Graph& f = fresh_b.graph();
  ASSERT_EQ(g.nodes.size(), f.nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    EXPECT_EQ(g.nodes[i].op, f.nodes[i].op);
    EXPECT_EQ(g.nodes[i].operands, f.nodes[i].operands);
    EXPECT_EQ(g.nodes[i].results, f.nodes[i].results);
  }
}

TEST(Restart, AGraphNotRepeatedForLongIsLetGo) {
  Builder b;
  auto neg = [&b](int64_t n) { b.Unary(Op::Neg, b.Parameter({DType::F32, {n}})); };
  neg(1);
  for (int i = 0; i <= Builder::kIdle; ++i) {
    b.Restart();
    neg(2);  // takes over from the graph before, never from the first
  }
  b.Restart();
  neg(1);
  EXPECT_EQ(b.taken_over(), 0u);
  b.Restart();
  neg(1);
  EXPECT_EQ(b.taken_over(), 2u);
}

TEST(Restart, TheRoomOfALongTraceIsGivenBack) {
  Builder b;
  auto chain = [&b](int n) {
    Value v = b.Parameter({DType::F32, {2}});
    for (int i = 0; i < n; ++i) v = b.Unary(Op::Neg, v);
  };
  chain(20000);
  for (int i = 0; i < 3; ++i) {
    b.Restart();
    chain(10);
  }
  EXPECT_EQ(b.graph().nodes.size(), 11u);
  EXPECT_LT(b.graph().nodes.capacity(), 5000u);
}

// Builder::Call: a compiled graph joining a lazy trace.
std::shared_ptr<const Graph> NegAndPassThrough(const Shape& shape) {
  Builder inner;
  Value p = inner.Parameter(shape);
  return std::make_shared<const Graph>(inner.Build({inner.Unary(Op::Neg, p), p}));
}

TEST(Call, OneNodeWhoseResultsAreTheCalledGraphsOutputs) {
  auto body = NegAndPassThrough({DType::F32, {2, 3}});
  Builder b;
  Value x = b.Parameter({DType::F32, {2, 3}});
  const std::vector<Value> sorted = b.Sort({x, x}, 1, false);
  const std::vector<Value> out = b.Call(body, {sorted[1]});  // any result of a node is an argument
  ASSERT_EQ(out.size(), 2u);
  const Node& call = b.graph().nodes[static_cast<size_t>(out[0].node)];
  EXPECT_EQ(call.op, Op::Call);
  EXPECT_EQ(out[1], (Value{out[0].node, 1}));
  EXPECT_EQ(call.operands, std::vector<Value>{sorted[1]});
  EXPECT_EQ(call.results, (std::vector<Shape>{{DType::F32, {2, 3}}, {DType::F32, {2, 3}}}));
  EXPECT_THROW(b.Call(body, {b.Parameter({DType::F32, {3, 2}})}), Error);  // not the parameter's shape
  EXPECT_THROW(b.Call(body, {x, x}), Error);                              // one operand per parameter
  EXPECT_THROW(b.Call(nullptr, {x}), Error);
  Builder aliased;
  Value p = aliased.Parameter({DType::F32, {2}});
  auto with_alias = std::make_shared<const Graph>(aliased.Build({aliased.Unary(Op::Neg, p)}, {{0, 0}}));
  EXPECT_THROW(b.Call(with_alias, {b.Parameter({DType::F32, {2}})}), Error);
}

TEST(Call, HashedByTheCalledGraphAndTakenOverWhenTheSameGraphIsCalled) {
  auto body = NegAndPassThrough({DType::F32, {4}});
  auto twin = NegAndPassThrough({DType::F32, {4}});  // equal, another object
  auto trace = [](Builder& b, const std::shared_ptr<const Graph>& callee) {
    b.Unary(Op::Exp, b.Call(callee, {b.Parameter({DType::F32, {4}})})[0]);
  };
  Builder one, two;
  trace(one, body);
  trace(two, twin);
  EXPECT_EQ(ProgramHash(one.graph()), ProgramHash(two.graph()));  // by content: the disk cache key
  Builder other;
  Builder abs;
  Value p = abs.Parameter({DType::F32, {4}});
  trace(other, std::make_shared<const Graph>(abs.Build({abs.Unary(Op::Abs, p), p})));
  EXPECT_NE(ProgramHash(one.graph()), ProgramHash(other.graph()));
  Builder b;
  trace(b, body);
  b.Restart();
  trace(b, body);
  EXPECT_EQ(b.taken_over(), b.graph().nodes.size());
  EXPECT_EQ(b.Fingerprint(), ProgramHash(one.graph()));
  b.Restart();
  trace(b, twin);  // not the same object: built again, same hash
  EXPECT_EQ(b.taken_over(), 1u);  // the parameter
  EXPECT_EQ(b.Fingerprint(), ProgramHash(one.graph()));
}

TEST(Hash, EqualGraphsHashEqualLocationsAside) {
  EXPECT_EQ(ProgramHash(EveryAttributeGraph()), ProgramHash(EveryAttributeGraph()));
  EXPECT_EQ(ShapeBlindHash(EveryAttributeGraph()), ShapeBlindHash(EveryAttributeGraph()));
  Builder b3, b4;
  b3.SetLocation("a.py:1");
  b4.SetLocation("b.py:2");
  auto p3 = b3.Parameter({DType::F32, {2}});
  auto p4 = b4.Parameter({DType::F32, {2}});
  EXPECT_EQ(ProgramHash(b3.Build({b3.Unary(Op::Neg, p3)})), ProgramHash(b4.Build({b4.Unary(Op::Neg, p4)})));
}

Graph AddConstant(DType t, int64_t n, double c, Op op) {
  Builder b;
  auto x = b.Parameter({t, {n}});
  return b.Build({b.Binary(op, x, b.Full(t, {n}, c))});
}

TEST(Hash, ProgramHashSeesShapesDtypesConstantsOpsAndWiring) {
  const uint64_t base = ProgramHash(AddConstant(DType::F32, 4, 1.0, Op::Add));
  EXPECT_NE(base, ProgramHash(AddConstant(DType::F32, 4, 2.0, Op::Add)));  // constant
  EXPECT_NE(base, ProgramHash(AddConstant(DType::F32, 5, 1.0, Op::Add)));  // shape
  EXPECT_NE(base, ProgramHash(AddConstant(DType::F64, 4, 1.0, Op::Add)));  // dtype
  EXPECT_NE(base, ProgramHash(AddConstant(DType::F32, 4, 1.0, Op::Mul)));  // op
  // Wiring: sub(x, y) vs sub(y, x).
  Builder b1, b2;
  auto x1 = b1.Parameter({DType::F32, {2}}), y1 = b1.Parameter({DType::F32, {2}});
  auto x2 = b2.Parameter({DType::F32, {2}}), y2 = b2.Parameter({DType::F32, {2}});
  const Graph g1 = b1.Build({b1.Binary(Op::Sub, x1, y1)});
  const Graph g2 = b2.Build({b2.Binary(Op::Sub, y2, x2)});
  EXPECT_NE(ProgramHash(g1), ProgramHash(g2));
  EXPECT_NE(ShapeBlindHash(g1), ShapeBlindHash(g2));
}

TEST(Hash, ShapeBlindHashIgnoresShapesDtypesAndConstantValuesOnly) {
  const uint64_t base = ShapeBlindHash(AddConstant(DType::F32, 4, 1.0, Op::Add));
  EXPECT_EQ(base, ShapeBlindHash(AddConstant(DType::F32, 4, 2.0, Op::Add)));  // constant
  EXPECT_EQ(base, ShapeBlindHash(AddConstant(DType::F32, 5, 1.0, Op::Add)));  // shape
  EXPECT_EQ(base, ShapeBlindHash(AddConstant(DType::I64, 4, 1.0, Op::Add)));  // dtype
  EXPECT_NE(base, ShapeBlindHash(AddConstant(DType::F32, 4, 1.0, Op::Mul)));  // op
  // A whole model at two batch sizes: the integer attributes follow the shapes.
  auto model = [](int64_t batch) {
    Builder b;
    auto x = b.Parameter({DType::F32, {batch, 8}});
    auto w = b.Parameter({DType::F32, {8, 4}});
    auto h = b.DotGeneral(x, w, DotDims{{}, {}, {1}, {0}});
    auto r = b.Binary(Op::Max, h, b.BroadcastInDim(b.ScalarConstant(DType::F32, 0), {batch, 4}, {}));
    auto s = b.Slice(r, {0, 0}, {batch, 2}, {1, 1});
    return b.Build({b.Reduce(b.Reshape(s, {batch * 2}), b.ScalarConstant(DType::F32, 0), {0}, ReduceKind::Sum)});
  };
  EXPECT_EQ(ShapeBlindHash(model(2)), ShapeBlindHash(model(16)));
  EXPECT_NE(ProgramHash(model(2)), ProgramHash(model(16)));
}

}  // namespace
}  // namespace tpj::ir
