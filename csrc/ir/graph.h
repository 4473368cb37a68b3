// The tensor-graph IR: nodes with static shapes, built through Builder, which
// checks every node as it is added (infer.cc) so that a Graph is always valid.
//
// A Graph is a plain value: single-threaded construction, then read-only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
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

// StableHLO's fft_type. XLA's inverse transforms (IFFT, IRFFT) divide by the
// product of fft_length; the forward ones do not scale.
enum class FftType : uint8_t { FFT, IFFT, RFFT, IRFFT };
const char* FftTypeName(FftType t);  // "FFT", ...

// The operand precision of a dot_general or convolution (StableHLO's
// precision_config). Default lets the plugin choose (XLA GPU uses TF32 for
// float32, TPU one bfloat16 pass); High asks for more (TPU: three bfloat16
// passes; XLA GPU still TF32); Highest for the operands' full precision,
// which PyTorch's default float32 matmul precision means.
enum class Precision : uint8_t { Default, High, Highest };

// Attributes: one struct per op that has any; ops without use std::monostate.
// Each struct names its op in kOp (the Builder takes the op from it, so no
// node carries another op's attributes) and lists every data member once in
// Fields(self, f), which calls f("name", member): the hashes walk that list,
// and tests/cpp/ir_hash_test.cc checks that it names every member. `self` is
// a template parameter so that one list serves const and mutable visits. The
// dimension-number structs nested in them list their members the same way.

struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("lhs_batch", s.lhs_batch);
    f("rhs_batch", s.rhs_batch);
    f("lhs_contract", s.lhs_contract);
    f("rhs_contract", s.rhs_contract);
  }
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
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("in_batch", s.in_batch);
    f("in_feature", s.in_feature);
    f("in_spatial", s.in_spatial);
    f("k_out", s.k_out);
    f("k_in", s.k_in);
    f("k_spatial", s.k_spatial);
    f("out_batch", s.out_batch);
    f("out_feature", s.out_feature);
    f("out_spatial", s.out_spatial);
  }
};

struct GatherDims {
  std::vector<int64_t> offset_dims, collapsed_slice_dims, start_index_map;
  int64_t index_vector_dim = 0;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("offset_dims", s.offset_dims);
    f("collapsed_slice_dims", s.collapsed_slice_dims);
    f("start_index_map", s.start_index_map);
    f("index_vector_dim", s.index_vector_dim);
  }
};

struct ScatterDims {
  std::vector<int64_t> update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("update_window_dims", s.update_window_dims);
    f("inserted_window_dims", s.inserted_window_dims);
    f("scatter_dims_to_operand_dims", s.scatter_dims_to_operand_dims);
    f("index_vector_dim", s.index_vector_dim);
  }
};

struct ParameterAttrs {
  static constexpr Op kOp = Op::Parameter;
  int64_t index = 0;  // position among the graph's parameters (%argN)
  // SPMD programs: the HLO sharding of the argument ("{devices=[4,1]0,1,2,3}",
  // "{replicated}"), printed as its mhlo.sharding; "" for none.
  std::string sharding;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("index", s.index);
    f("sharding", s.sharding);
  }
};

struct ConstantAttrs {
  static constexpr Op kOp = Op::Constant;
  // Raw little-endian elements: numel() of them, or one for a splat. Shared:
  // copying a graph does not copy its constants.
  std::shared_ptr<const std::vector<uint8_t>> data;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("data", s.data); }
};

struct CompareAttrs {
  static constexpr Op kOp = Op::Compare;
  CompareDir direction = CompareDir::EQ;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("direction", s.direction); }
};

struct BroadcastInDimAttrs {
  static constexpr Op kOp = Op::BroadcastInDim;
  std::vector<int64_t> result_dims;
  std::vector<int64_t> broadcast_dimensions;  // result dim of each operand dim
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("result_dims", s.result_dims);
    f("broadcast_dimensions", s.broadcast_dimensions);
  }
};

struct ReshapeAttrs {
  static constexpr Op kOp = Op::Reshape;
  std::vector<int64_t> result_dims;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("result_dims", s.result_dims); }
};

struct TransposeAttrs {
  static constexpr Op kOp = Op::Transpose;
  std::vector<int64_t> permutation;  // result dim i is operand dim permutation[i]
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("permutation", s.permutation); }
};

struct ReverseAttrs {
  static constexpr Op kOp = Op::Reverse;
  std::vector<int64_t> dimensions;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("dimensions", s.dimensions); }
};

struct SliceAttrs {
  static constexpr Op kOp = Op::Slice;
  std::vector<int64_t> starts, limits, strides;  // one each per dimension; limits exclusive
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("starts", s.starts);
    f("limits", s.limits);
    f("strides", s.strides);
  }
};

struct DynamicSliceAttrs {
  static constexpr Op kOp = Op::DynamicSlice;
  std::vector<int64_t> slice_sizes;  // the starts are operands
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("slice_sizes", s.slice_sizes); }
};

struct ConcatenateAttrs {
  static constexpr Op kOp = Op::Concatenate;
  int64_t dimension = 0;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("dimension", s.dimension); }
};

struct PadAttrs {
  static constexpr Op kOp = Op::Pad;
  std::vector<int64_t> low, high, interior;  // edge padding may be negative (crops)
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("low", s.low);
    f("high", s.high);
    f("interior", s.interior);
  }
};

struct IotaAttrs {
  static constexpr Op kOp = Op::Iota;
  int64_t dimension = 0;  // the dimension that counts up
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("dimension", s.dimension); }
};

struct DotGeneralAttrs {
  static constexpr Op kOp = Op::DotGeneral;
  DotDims dims;
  Precision precision = Precision::Default;
  // A float32 result of float16/bfloat16 operands: the sum as accumulated,
  // not yet rounded to the operands' type.
  bool f32_result = false;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dims", s.dims);
    f("precision", s.precision);
    f("f32_result", s.f32_result);
  }
};

struct ReduceAttrs {
  static constexpr Op kOp = Op::Reduce;
  std::vector<int64_t> dimensions;  // reduced away
  ReduceKind kind = ReduceKind::Sum;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dimensions", s.dimensions);
    f("kind", s.kind);
  }
};

// Each list has one entry per operand dimension; empty dilations mean ones.
struct ReduceWindowAttrs {
  static constexpr Op kOp = Op::ReduceWindow;
  ReduceKind kind = ReduceKind::Sum;
  std::vector<int64_t> window_dimensions, window_strides;
  std::vector<int64_t> base_dilations, window_dilations;
  std::vector<int64_t> padding_low, padding_high;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("kind", s.kind);
    f("window_dimensions", s.window_dimensions);
    f("window_strides", s.window_strides);
    f("base_dilations", s.base_dilations);
    f("window_dilations", s.window_dilations);
    f("padding_low", s.padding_low);
    f("padding_high", s.padding_high);
  }
};

// Each list has one entry per operand dimension. The select (>=) and scatter
// (add) bodies are fixed: this op is max pooling's gradient.
struct SelectAndScatterAttrs {
  static constexpr Op kOp = Op::SelectAndScatter;
  std::vector<int64_t> window_dimensions, window_strides;
  std::vector<int64_t> padding_low, padding_high;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("window_dimensions", s.window_dimensions);
    f("window_strides", s.window_strides);
    f("padding_low", s.padding_low);
    f("padding_high", s.padding_high);
  }
};

// Every per-dimension list has one entry per spatial dimension.
struct ConvolutionAttrs {
  static constexpr Op kOp = Op::Convolution;
  ConvDims dims;
  std::vector<int64_t> window_strides;
  std::vector<int64_t> padding_low, padding_high;
  std::vector<int64_t> lhs_dilation, rhs_dilation;
  int64_t feature_group_count = 1, batch_group_count = 1;
  Precision precision = Precision::Default;
  bool f32_result = false;  // as DotGeneralAttrs'
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dims", s.dims);
    f("precision", s.precision);
    f("f32_result", s.f32_result);
    f("window_strides", s.window_strides);
    f("padding_low", s.padding_low);
    f("padding_high", s.padding_high);
    f("lhs_dilation", s.lhs_dilation);
    f("rhs_dilation", s.rhs_dilation);
    f("feature_group_count", s.feature_group_count);
    f("batch_group_count", s.batch_group_count);
  }
};

struct GatherAttrs {
  static constexpr Op kOp = Op::Gather;
  GatherDims dims;
  std::vector<int64_t> slice_sizes;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dims", s.dims);
    f("slice_sizes", s.slice_sizes);
  }
};

struct ScatterAttrs {
  static constexpr Op kOp = Op::Scatter;
  ScatterDims dims;
  bool replace = false;  // updates overwrite; false: they are combined by `kind`
  ReduceKind kind = ReduceKind::Sum;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dims", s.dims);
    f("replace", s.replace);
    f("kind", s.kind);
  }
};

// A stable sort of all operands by the first one, in PyTorch's order: for
// float keys NaN sorts above +inf (last ascending, first descending) and
// +0.0 equals -0.0; equal keys keep their order.
struct SortAttrs {
  static constexpr Op kOp = Op::Sort;
  int64_t dimension = 0;
  bool descending = false;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dimension", s.dimension);
    f("descending", s.descending);
  }
};

// No fields: the algorithm is always Threefry (a ui64[2] key/counter state).
struct RngBitGeneratorAttrs {
  static constexpr Op kOp = Op::RngBitGenerator;
  template <class S, class F>
  static void Fields(S&, F&&) {}
};

// Collectives: replica_groups lists the replica ids of each group; groups are
// non-empty and of one size (the Builder fills in all replicas when none are
// given).
struct AllReduceAttrs {
  static constexpr Op kOp = Op::AllReduce;
  ReduceKind kind = ReduceKind::Sum;
  std::vector<std::vector<int64_t>> replica_groups;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("kind", s.kind);
    f("replica_groups", s.replica_groups);
  }
};

struct AllGatherAttrs {
  static constexpr Op kOp = Op::AllGather;
  int64_t dimension = 0;  // the one that grows by the group size
  std::vector<std::vector<int64_t>> replica_groups;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dimension", s.dimension);
    f("replica_groups", s.replica_groups);
  }
};

struct ReduceScatterAttrs {
  static constexpr Op kOp = Op::ReduceScatter;
  int64_t dimension = 0;  // the one that shrinks by the group size
  ReduceKind kind = ReduceKind::Sum;
  std::vector<std::vector<int64_t>> replica_groups;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("dimension", s.dimension);
    f("kind", s.kind);
    f("replica_groups", s.replica_groups);
  }
};

// A discrete Fourier transform over the trailing fft_length.size() (1 to 3)
// dimensions. fft_length is the signal's size there: the operand's trailing
// dims for FFT, IFFT and RFFT; the result's for IRFFT (whose operand's last
// dim is fft_length.back() / 2 + 1).
struct FftAttrs {
  static constexpr Op kOp = Op::Fft;
  FftType type = FftType::FFT;
  std::vector<int64_t> fft_length;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("type", s.type);
    f("fft_length", s.fft_length);
  }
};

// Linear algebra on the last two dimensions (any leading dimensions are a
// batch). Cholesky: the factor of a symmetric positive-definite matrix read
// from its `lower` (or upper) triangle; the other triangle of the result is
// unspecified by StableHLO.
struct CholeskyAttrs {
  static constexpr Op kOp = Op::Cholesky;
  bool lower = true;
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("lower", s.lower); }
};

// Solves op(a) x = b (left_side) or x op(a) = b, a triangular; op transposes
// a when transpose_a. Only a's `lower` (or upper) triangle is read, and its
// diagonal is taken as ones when unit_diagonal.
struct TriangularSolveAttrs {
  static constexpr Op kOp = Op::TriangularSolve;
  bool left_side = true, lower = true, unit_diagonal = false, transpose_a = false;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("left_side", s.left_side);
    f("lower", s.lower);
    f("unit_diagonal", s.unit_diagonal);
    f("transpose_a", s.transpose_a);
  }
};

// A call the plugin's compiler expands itself (XLA: "Qr",
// "ProductOfElementaryHouseholderReflectors", "Eigh"). The result shapes are
// the builder's argument; what the call computes is the target's contract.
struct CustomCallAttrs {
  static constexpr Op kOp = Op::CustomCall;
  std::string target;
  std::string backend_config;  // "" for none
  std::string sharding;        // mhlo.sharding of the call ("" for none): @Sharding constraints
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("target", s.target);
    f("backend_config", s.backend_config);
    f("sharding", s.sharding);
  }
};

struct Graph;

// A call of a finished graph: operand i is its parameter i, result o its
// output o. Printed as a private function of the module (XLA inlines it
// before fusing). A compiled torch.compile graph joins a lazy trace this
// way (runtime/replay.h): one node per call, whatever the graph's size.
struct CallAttrs {
  static constexpr Op kOp = Op::Call;
  std::shared_ptr<const Graph> body;  // hashed by its ProgramHash, compared by identity
  template <class S, class F>
  static void Fields(S& s, F&& f) { f("body", s.body); }
};
// The k largest float32 elements along the last dimension, largest first,
// and their int32 indices: XLA's TopK (a partial sort on the CPU plugin,
// 0.1 ms where a stablehlo.sort of 50257 elements takes 9-15 ms). Keys in
// IEEE total order (-NaN lowest, +NaN highest, -0.0 below +0.0); equal keys
// lowest index first.
struct TopKAttrs {
  static constexpr Op kOp = Op::TopK;
  int64_t k = 0;
  template <class S, class F>
  static void Fields(S& s, F&& f) {
    f("k", s.k);
  }
};

using Attrs =
    std::variant<std::monostate, ParameterAttrs, ConstantAttrs, CompareAttrs, BroadcastInDimAttrs,
                 ReshapeAttrs, TransposeAttrs, ReverseAttrs, SliceAttrs, DynamicSliceAttrs,
                 ConcatenateAttrs, PadAttrs, IotaAttrs, DotGeneralAttrs, ReduceAttrs,
                 ReduceWindowAttrs, SelectAndScatterAttrs, ConvolutionAttrs, GatherAttrs,
                 ScatterAttrs, SortAttrs, TopKAttrs, RngBitGeneratorAttrs, AllReduceAttrs, AllGatherAttrs,
                 ReduceScatterAttrs, FftAttrs, CholeskyAttrs, TriangularSolveAttrs, CustomCallAttrs,
                 CallAttrs>;

// True for the structs above that list their fields with Fields(self, f).
template <class T, class = void>
struct HasFields : std::false_type {};
template <class T>
struct HasFields<T, std::void_t<decltype(T::Fields(std::declval<const T&>(), 0))>>
    : std::true_type {};

struct Node {
  Op op;
  std::vector<Value> operands;
  std::vector<Shape> results;
  Attrs attrs;  // the alternative whose kOp is `op`; std::monostate for ops without attributes
  std::string location;  // where the node came from (e.g. Python file:line), for errors
};

// The position of Parameter node `n` among its graph's parameters. Throws
// Error for any other op.
int64_t ParamIndex(const Node& n);

// The raw little-endian elements of Constant node `n` (numel() of them, or
// one for a splat), alive as long as the node; nullptr for any other op.
const std::vector<uint8_t>* ConstantBytes(const Node& n);

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
  // SPMD programs: the HLO sharding pinned on each output (mhlo.sharding of
  // the result); empty, or one per output ("" for none).
  std::vector<std::string> output_shardings;

  const Shape& shape(Value v) const { return nodes[v.node].results[v.index]; }
};

// The part of `full` that `outputs` need: reachable nodes in their original
// order, parameters renumbered in order. `used_params` receives, for each
// parameter of the result, its index in `full`. Aliases name parameters of
// `full`; those of unused parameters are dropped.
Graph Extract(const Graph& full, const std::vector<Value>& outputs, const std::vector<Alias>& aliases,
              std::vector<int64_t>* used_params);

// The part of `full` from node `first` on that `outputs` need, as a graph
// of its own: each value it reads from before `first`, and each parameter
// of `full` it reads, becomes one of its parameters, in the order of those
// values in `full` (node, then result). `externals` receives them: the
// values in `full` that a call of the result takes as arguments (a
// torch.compile graph traced into a pending trace, runtime/replay.cc).
Graph ExtractFrom(const Graph& full, const std::vector<Value>& outputs, int32_t first, std::vector<Value>* externals);

class Builder {
 public:
  // Collectives span `num_replicas` replicas unless given explicit groups.
  explicit Builder(int num_replicas = 1, int num_partitions = 1);

  // Starts a new graph (same replica and partition counts, room for as many
  // nodes as the last one), keeping the nodes of the one so far aside with
  // those of the few graphs before it (kEarlier): while the new graph
  // repeats one of them node for node (same op, operands, attributes and
  // given result shapes), each node is taken over instead of built again (no
  // shape inference, no allocation), and a graph that repeats one entirely
  // keeps its Fingerprint without hashing. A training step traced again is
  // such a graph, and so are the traces that alternate within a step (with
  // torch.compile and replays launched rather than joined: the loss between
  // the replayed forward and backward, then the optimizer). Once the graph
  // differs from all of them, the rest of it is built.
  void Restart();
  // How many earlier graphs are kept, and for how many graphs one that
  // nothing took over from is kept.
  static constexpr size_t kEarlier = 4;
  static constexpr int kIdle = 16;

  // How many nodes of the graph so far were taken over (see Restart).
  size_t taken_over() const { return taken_over_; }

  // Nodes before `first` are not folded into new ones (Reshape of a
  // reshape reads its operand): what is built from now on reads them only
  // as they are (a graph recorded as a call of its own, ExtractFrom).
  // Restart sets it back to 0.
  void SetFoldFloor(int32_t first) { fold_floor_ = first; }

  // ProgramHash of the graph so far (no outputs, no aliases).
  uint64_t Fingerprint();

  // Location attached to the nodes added from now on ("" for none).
  void SetLocation(std::string loc) { location_ = std::move(loc); }

  // Whether Reduce takes long float sums over several dims in two stages
  // (graph.cc, StagedSum): for XLA's CPU backend, which adds them up in one
  // sequential loop. Off by default; the runtime turns it on for the CPU
  // plugin outside SPMD, where the windows would cross shards.
  void SetStagedSums(bool on) { staged_sums_ = on; }
  bool staged_sums() const { return staged_sums_; }
  // Whether the program is for XLA's CPU backend, for lowerings that choose
  // another form there: depthwise convolutions as sums of taps and a grouped
  // convolution's weight gradient per group (ops_nn.cc), float32 special
  // functions computed in float64 (ops_math.cc), staged sums (trace.cc).
  void SetCpuBackend(bool on) { cpu_backend_ = on; }
  bool cpu_backend() const { return cpu_backend_; }

  const Shape& shape(Value v) const;
  const Graph& graph() const { return g_; }

  // `sharding`: an HLO sharding string for SPMD programs ("" for none).
  Value Parameter(const Shape& shape, const std::string& sharding = "");
  // `bytes` holds shape.numel() elements (little-endian), or exactly one
  // element for a splat.
  Value Constant(const Shape& shape, std::vector<uint8_t> bytes);
  Value ScalarConstant(DType dtype, double value);  // a 0-d constant, cast from `value`
  Value Full(DType dtype, const std::vector<int64_t>& dims, double value);

  Value Unary(Op op, Value x);
  Value Binary(Op op, Value x, Value y);
  // No node when x already has dtype `to`; bool to float is built as
  // select(x, 1, 0) (see graph.cc: XLA folds a multiply by convert(bool)).
  Value Convert(Value x, DType to);
  // Reinterprets the bits of x as `to`. Of another element size, as torch's
  // view(dtype): the last dimension scales by the ratio. Complex values are
  // (real, imag) pairs of their float type: XLA has no complex bitcast, so
  // they are taken apart and built with Real/Imag/Complex, which keep the
  // values exactly.
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

  Value DotGeneral(Value lhs, Value rhs, const DotDims& dims, Precision precision = Precision::Default,
                   bool f32_result = false);
  // Sum and Prod of float16/bfloat16 accumulate in float32 (converts around
  // the reduction) and return the operand's type, as PyTorch computes them.
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
                    int64_t batch_groups,
                    Precision precision = Precision::Default, bool f32_result = false);
  Value Gather(Value operand, Value indices, const GatherDims& dims,
               const std::vector<int64_t>& slice_sizes);
  // replace=false: updates are combined with the operand by `kind` (Sum:
  // scatter_add; Prod, Max, Min: scatter_reduce); true: they overwrite.
  Value Scatter(Value operand, Value indices, Value updates, const ScatterDims& dims, bool replace,
                ReduceKind kind = ReduceKind::Sum);
  // Stable-sorts all `xs` along `dim` by the first one (NaN above +inf, see
  // SortAttrs); returns one value per input.
  std::vector<Value> Sort(const std::vector<Value>& xs, int64_t dim, bool descending);
  // {values, int32 indices} of x's k largest along its last dimension (TopKAttrs).
  std::vector<Value> TopK(Value x, int64_t k);
  // Returns {new_state, bits}: `state` is a ui64[2] Threefry key/counter.
  std::vector<Value> RngBitGenerator(Value state, const Shape& bits);

  Value AllReduce(Value x, ReduceKind kind, std::vector<std::vector<int64_t>> groups = {});
  Value AllGather(Value x, int64_t dim, std::vector<std::vector<int64_t>> groups = {});
  Value ReduceScatter(Value x, int64_t dim, ReduceKind kind,
                      std::vector<std::vector<int64_t>> groups = {});

  // Complex numbers: the real and imaginary parts (complex64 -> float32,
  // complex128 -> float64), and a complex number from two parts of one
  // float32 or float64 type and shape.
  Value Real(Value x);
  Value Imag(Value x);
  Value Complex(Value re, Value im);
  // A DFT over the trailing fft_length.size() dimensions (see FftAttrs).
  Value Fft(Value x, FftType type, const std::vector<int64_t>& fft_length);
  // Linear algebra over the last two dimensions (see CholeskyAttrs,
  // TriangularSolveAttrs); leading dimensions are a batch and must match.
  Value Cholesky(Value a, bool lower);
  Value TriangularSolve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                        bool transpose_a);
  // One node with the given results; the plugin must know `target`.
  std::vector<Value> CustomCall(const std::string& target, const std::vector<Value>& operands,
                                const std::vector<Shape>& results,
                                const std::string& backend_config = "");

  // SPMD: x constrained to the HLO sharding `sharding` (custom_call @Sharding).
  Value ShardingConstraint(Value x, const std::string& sharding);

  // A call of `body` (a finished graph without aliases or shardings) on
  // `args` (one per parameter, of its shape): one node whose results are
  // the body's outputs (see CallAttrs).
  std::vector<Value> Call(std::shared_ptr<const Graph> body, const std::vector<Value>& args);

  // Finishes the graph. Aliases are checked (same shape, distinct outputs).
  Graph Build(const std::vector<Value>& outputs, const std::vector<Alias>& aliases = {});

 private:
  // The operands of a node being made, read during the call only: a node
  // taken over from the previous graph (Restart) copies none of them.
  class Operands {
   public:
    // The list's array lives to the end of the full expression of the call.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
    Operands(std::initializer_list<Value> l) : p_(l.begin()), n_(l.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    Operands(const std::vector<Value>& v) : p_(v.data()), n_(v.size()) {}
    const Value* begin() const { return p_; }
    const Value* end() const { return p_ + n_; }
    size_t size() const { return n_; }

   private:
    const Value* p_;
    size_t n_;
  };
  // Checks and appends one node; returns its results.
  std::vector<Value> AddNode(Op op, Operands operands, Attrs attrs);
  // The same, returning the node's id (no vector of results).
  int32_t AppendNode(Op op, Operands operands, Attrs attrs) {
    return Emit(op, operands, std::move(attrs), nullptr, 0, true);
  }
  // The one place nodes are made. Results: the inferred ones (`infer`)
  // followed by the `num_given` shapes at `given`. Takes over the previous
  // graph's node at this position when it is the same (see Restart).
  int32_t Emit(Op op, Operands operands, Attrs attrs, const Shape* given, size_t num_given, bool infer);
  std::vector<Value> CustomCallNode(const std::string& target, const std::vector<Value>& operands,
                                    const std::vector<Shape>& results, const std::string& backend_config,
                                    const std::string& sharding);
  // A node of an op without attributes.
  Value Add(Op op, Operands operands) {
    return Value{AppendNode(op, operands, std::monostate{}), 0};
  }
  // A node of op A::kOp.
  template <class A>
  Value Add(Operands operands, A attrs) {
    return Value{AppendNode(A::kOp, operands, std::move(attrs)), 0};
  }
  void CheckValue(Value v) const;
  Graph g_;
  bool staged_sums_ = false;
  bool cpu_backend_ = false;
  std::string location_;
  // Restart: the graphs before this one, oldest first, with their
  // fingerprints where they were hashed whole. Nodes taken over are left
  // moved from; at the next Restart a graph repeated whole is dropped (the
  // new one holds the same nodes), one repeated in part gets its head back
  // as a copy of the new graph's.
  struct Earlier {
    std::vector<Node> nodes;
    bool hashed = false;
    uint64_t hash = 0;
    bool taken = false;  // some nodes were taken over
    size_t matched = 0;  // how many nodes the new graph repeated (set as it leaves repeats_)
    int idle = 0;        // graphs since one took over its nodes (dropped after kIdle)
  };
  std::vector<Earlier> earlier_;
  // Which of earlier_ the graph so far repeats node for node, newest first.
  std::vector<uint8_t> repeats_;
  size_t taken_over_ = 0;
  int32_t fold_floor_ = 0;
  // Fingerprint of the first hashed_nodes_ nodes (the graph grows only by appending).
  size_t hashed_nodes_ = SIZE_MAX;
  uint64_t hash_ = 0;
};

}  // namespace tpj::ir
