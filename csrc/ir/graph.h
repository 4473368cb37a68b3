// The tensor-graph IR: nodes with static shapes, built through Builder, which
// checks every node as it is added (infer.cc) so that a Graph is always valid.
//
// A Graph is a plain value: single-threaded construction, then read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/op.h"

namespace tpj::ir {

// One result of one node.
struct Value {
  int32_t node = -1;
  int32_t index = 0;
  bool valid() const { return node >= 0; }
  bool operator==(const Value& o) const { return node == o.node && index == o.index; }
};

// The body of a region for reduce-like ops.
enum class ReduceKind : uint8_t { Sum, Prod, Max, Min, And, Or };
const char* ReduceKindName(ReduceKind k);

enum class CompareDir : uint8_t { EQ, NE, LT, LE, GT, GE };
const char* CompareDirName(CompareDir d);

struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

// Convolution layout: which dimension of each operand is batch/feature and
// which are spatial (in order).
struct ConvDims {
  int64_t in_batch = 0, in_feature = 1;
  std::vector<int64_t> in_spatial;
  int64_t k_out = 0, k_in = 1;
  std::vector<int64_t> k_spatial;
  int64_t out_batch = 0, out_feature = 1;
  std::vector<int64_t> out_spatial;
};

struct GatherDims {
  std::vector<int64_t> offset_dims, collapsed_slice_dims, start_index_map;
  int64_t index_vector_dim = 0;
};

struct ScatterDims {
  std::vector<int64_t> update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
};

// Attributes of a node. One struct for every op: each op reads the fields
// its comment names, the rest stay empty (and still hash, harmlessly).
struct Attrs {
  // broadcast_in_dim: broadcast dims; transpose: permutation; reduce: dims;
  // dynamic_slice / gather: slice sizes; reduce_window / select_and_scatter:
  // window dimensions.
  std::vector<int64_t> dims;
  // broadcast_in_dim and reshape: the result dims.
  std::vector<int64_t> out_dims;
  // slice: start/limit/strides; reduce_window, select_and_scatter and
  // convolution: window strides in `strides`.
  std::vector<int64_t> starts, limits, strides;
  // pad: edge low/high/interior; windowed ops: padding low/high.
  std::vector<int64_t> low, high, interior;
  // convolution: lhs/rhs dilation; reduce_window: base/window dilation.
  std::vector<int64_t> lhs_dilation, rhs_dilation;
  // parameter index; concatenate, iota, sort, all_gather and reduce_scatter
  // dimension.
  int64_t axis = 0;
  int64_t feature_groups = 1, batch_groups = 1;  // convolution
  ReduceKind reduce = ReduceKind::Sum;  // reduce-like bodies; scatter: Sum adds, else replaces
  CompareDir compare = CompareDir::EQ;  // compare
  bool flag = false;                    // sort: descending; scatter: replace instead of add
  DotDims dot;
  ConvDims conv;
  GatherDims gather;
  ScatterDims scatter;
  std::vector<std::vector<int64_t>> replica_groups;  // collectives; empty: all replicas
  std::shared_ptr<const std::vector<uint8_t>> data;  // constant: raw little-endian elements
};

struct Node {
  Op op;
  std::vector<Value> operands;
  std::vector<Shape> results;
  Attrs attrs;
  std::string location;  // where the node came from (e.g. Python file:line), for errors
};

// Output `output` of the program may reuse the memory of parameter `param`
// (buffer donation). Shapes must match.
struct Alias {
  int64_t param;
  int64_t output;
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<int32_t> params;  // node id of parameter i
  std::vector<Value> outputs;
  std::vector<Alias> aliases;
  int num_replicas = 1;
  int num_partitions = 1;

  const Shape& shape(Value v) const { return nodes[v.node].results[v.index]; }
};

// The part of `full` that `outputs` need: reachable nodes in their original
// order, parameters renumbered in order. `used_params` receives, for each
// parameter of the result, its index in `full`. Aliases name parameters of
// `full`; those of unused parameters are dropped.
Graph Extract(const Graph& full, const std::vector<Value>& outputs, const std::vector<Alias>& aliases,
              std::vector<int64_t>* used_params);

class Builder {
 public:
  // Collectives span `num_replicas` replicas unless given explicit groups.
  explicit Builder(int num_replicas = 1, int num_partitions = 1);

  // Location attached to the nodes added from now on ("" for none).
  void SetLocation(std::string loc) { location_ = std::move(loc); }

  const Shape& shape(Value v) const;
  const Graph& graph() const { return g_; }

  Value Parameter(const Shape& shape);
  // `bytes` holds shape.numel() elements (little-endian), or exactly one
  // element for a splat.
  Value Constant(const Shape& shape, std::vector<uint8_t> bytes);
  Value ScalarConstant(DType dtype, double value);  // a 0-d constant, cast from `value`
  Value Full(DType dtype, const std::vector<int64_t>& dims, double value);

  Value Unary(Op op, Value x);
  Value Binary(Op op, Value x, Value y);
  Value Convert(Value x, DType to);  // no node when x already has dtype `to`
  // Reinterprets the bits of x as `to`, of the same element size.
  Value Bitcast(Value x, DType to);
  Value IsFinite(Value x);
  Value Compare(CompareDir dir, Value x, Value y);
  Value Select(Value pred, Value on_true, Value on_false);
  Value Clamp(Value lo, Value x, Value hi);

  Value BroadcastInDim(Value x, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& broadcast_dims);
  // No node when x already has these dims; reshape of a reshape reads the
  // original value.
  Value Reshape(Value x, const std::vector<int64_t>& dims);
  Value Transpose(Value x, const std::vector<int64_t>& perm);
  Value Reverse(Value x, const std::vector<int64_t>& dims);
  Value Slice(Value x, const std::vector<int64_t>& starts, const std::vector<int64_t>& limits,
              const std::vector<int64_t>& strides);
  Value DynamicSlice(Value x, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
  Value DynamicUpdateSlice(Value x, Value update, const std::vector<Value>& starts);
  Value Concatenate(const std::vector<Value>& xs, int64_t dim);
  Value Pad(Value x, Value pad_value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
  Value Iota(const Shape& shape, int64_t dim);

  Value DotGeneral(Value lhs, Value rhs, const DotDims& dims);
  Value Reduce(Value x, Value init, const std::vector<int64_t>& dims, ReduceKind kind);
  Value ReduceWindow(Value x, Value init, ReduceKind kind, const std::vector<int64_t>& window,
                     const std::vector<int64_t>& strides,
                     const std::vector<int64_t>& base_dilation,
                     const std::vector<int64_t>& window_dilation,
                     const std::vector<int64_t>& pad_low, const std::vector<int64_t>& pad_high);
  // Gradient of max pooling: scatters `source` onto the max of each window of
  // `operand` (select: >=), adding where windows overlap.
  Value SelectAndScatter(Value operand, Value source, Value init,
                         const std::vector<int64_t>& window, const std::vector<int64_t>& strides,
                         const std::vector<int64_t>& pad_low, const std::vector<int64_t>& pad_high);
  Value Convolution(Value lhs, Value rhs, const ConvDims& dims,
                    const std::vector<int64_t>& strides, const std::vector<int64_t>& pad_low,
                    const std::vector<int64_t>& pad_high,
                    const std::vector<int64_t>& lhs_dilation,
                    const std::vector<int64_t>& rhs_dilation, int64_t feature_groups,
                    int64_t batch_groups);
  Value Gather(Value operand, Value indices, const GatherDims& dims,
               const std::vector<int64_t>& slice_sizes);
  // replace=false: updates are added (scatter_add); true: they overwrite.
  Value Scatter(Value operand, Value indices, Value updates, const ScatterDims& dims, bool replace);
  // Sorts all `xs` along `dim` by the first one; returns one value per input.
  std::vector<Value> Sort(const std::vector<Value>& xs, int64_t dim, bool descending);
  // Returns {new_state, bits}: `state` is a ui64[2] Threefry key/counter.
  std::vector<Value> RngBitGenerator(Value state, const Shape& bits);

  Value AllReduce(Value x, ReduceKind kind, std::vector<std::vector<int64_t>> groups = {});
  Value AllGather(Value x, int64_t dim, std::vector<std::vector<int64_t>> groups = {});
  Value ReduceScatter(Value x, int64_t dim, ReduceKind kind,
                      std::vector<std::vector<int64_t>> groups = {});

  // Finishes the graph. Aliases are checked (same shape, distinct outputs).
  Graph Build(const std::vector<Value>& outputs, const std::vector<Alias>& aliases = {});

 private:
  Value Add(Op op, std::vector<Value> operands, Attrs attrs);
  std::vector<Value> AddMulti(Op op, std::vector<Value> operands, Attrs attrs);
  void CheckValue(Value v) const;
  Graph g_;
  std::string location_;
};

}  // namespace tpj::ir
