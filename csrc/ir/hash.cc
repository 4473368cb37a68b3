#include "ir/hash.h"

#include <cstring>

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

void HashAttrs(Hasher& h, const Attrs& a, bool values) {
  h.Ints(a.dims);
  h.Ints(a.out_dims);
  h.Ints(a.starts);
  h.Ints(a.limits);
  h.Ints(a.strides);
  h.Ints(a.low);
  h.Ints(a.high);
  h.Ints(a.interior);
  h.Ints(a.lhs_dilation);
  h.Ints(a.rhs_dilation);
  h.Int(a.axis);
  h.Int(a.feature_groups);
  h.Int(a.batch_groups);
  h.Int(static_cast<int64_t>(a.reduce));
  h.Int(static_cast<int64_t>(a.compare));
  h.Int(a.flag);
  h.Ints(a.dot.lhs_batch);
  h.Ints(a.dot.rhs_batch);
  h.Ints(a.dot.lhs_contract);
  h.Ints(a.dot.rhs_contract);
  const ConvDims& c = a.conv;
  h.Int(c.in_batch);
  h.Int(c.in_feature);
  h.Ints(c.in_spatial);
  h.Int(c.k_out);
  h.Int(c.k_in);
  h.Ints(c.k_spatial);
  h.Int(c.out_batch);
  h.Int(c.out_feature);
  h.Ints(c.out_spatial);
  h.Ints(a.gather.offset_dims);
  h.Ints(a.gather.collapsed_slice_dims);
  h.Ints(a.gather.start_index_map);
  h.Int(a.gather.index_vector_dim);
  h.Ints(a.scatter.update_window_dims);
  h.Ints(a.scatter.inserted_window_dims);
  h.Ints(a.scatter.scatter_dims_to_operand_dims);
  h.Int(a.scatter.index_vector_dim);
  h.Int(static_cast<int64_t>(a.replica_groups.size()));
  for (const auto& g : a.replica_groups) h.Ints(g);
  if (a.data && values) {
    h.Int(static_cast<int64_t>(a.data->size()));
    h.Bytes(a.data->data(), a.data->size());
  } else {
    h.Int(-1);
  }
}

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
      HashAttrs(h, n.attrs, true);
    } else {
      h.Int(n.op == Op::Parameter ? n.attrs.axis : 0);
      h.Int(static_cast<int64_t>(n.attrs.reduce));
      h.Int(static_cast<int64_t>(n.attrs.compare));
    }
  }
  h.Int(static_cast<int64_t>(g.outputs.size()));
  for (Value v : g.outputs) {
    h.Int(v.node);
    h.Int(v.index);
  }
  h.Int(static_cast<int64_t>(g.aliases.size()));
  for (const Alias& a : g.aliases) {
    h.Int(a.param);
    h.Int(a.output);
  }
  return h.Finish();
}

}  // namespace

uint64_t StructuralHash(const Graph& g) { return Hash(g, true); }
uint64_t StructureHash(const Graph& g) { return Hash(g, false); }

}  // namespace tpj::ir
