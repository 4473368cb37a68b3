#include "ir/graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "ir/hash.h"
#include "ir/infer.h"

namespace tpj::ir {
namespace {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

template <class T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// One element of `dtype` holding `v` (cast as C++ would; bool: v != 0).
std::vector<uint8_t> EncodeScalar(DType dtype, double v) {
  std::vector<uint8_t> out;
  switch (dtype) {
    case DType::Bool: Put<uint8_t>(out, v != 0 ? 1 : 0); break;
    case DType::I8: Put<int8_t>(out, static_cast<int8_t>(v)); break;
    case DType::I16: Put<int16_t>(out, static_cast<int16_t>(v)); break;
    case DType::I32: Put<int32_t>(out, static_cast<int32_t>(v)); break;
    case DType::I64: Put<int64_t>(out, static_cast<int64_t>(v)); break;
    case DType::U8: Put<uint8_t>(out, static_cast<uint8_t>(v)); break;
    case DType::U16: Put<uint16_t>(out, static_cast<uint16_t>(v)); break;
    case DType::U32: Put<uint32_t>(out, static_cast<uint32_t>(v)); break;
    case DType::U64: Put<uint64_t>(out, static_cast<uint64_t>(v)); break;
    case DType::F16: Put<uint16_t>(out, FloatToHalf(static_cast<float>(v))); break;
    case DType::BF16: Put<uint16_t>(out, FloatToBf16(static_cast<float>(v))); break;
    case DType::F32: Put<float>(out, static_cast<float>(v)); break;
    case DType::F64: Put<double>(out, v); break;
    case DType::C64: Put<float>(out, static_cast<float>(v)); Put<float>(out, 0.f); break;
    case DType::C128: Put<double>(out, v); Put<double>(out, 0.0); break;
  }
  return out;
}

std::vector<std::vector<int64_t>> DefaultGroups(std::vector<std::vector<int64_t>> groups, int n) {
  if (!groups.empty()) return groups;
  std::vector<int64_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  return {all};
}

}  // namespace

const char* ReduceKindName(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Prod: return "prod";
    case ReduceKind::Max: return "max";
    case ReduceKind::Min: return "min";
    case ReduceKind::And: return "and";
    case ReduceKind::Or: return "or";
  }
  return "?";
}

const char* CompareDirName(CompareDir d) {
  switch (d) {
    case CompareDir::EQ: return "EQ";
    case CompareDir::NE: return "NE";
    case CompareDir::LT: return "LT";
    case CompareDir::LE: return "LE";
    case CompareDir::GT: return "GT";
    case CompareDir::GE: return "GE";
  }
  return "?";
}

const char* FftTypeName(FftType t) {
  switch (t) {
    case FftType::FFT: return "FFT";
    case FftType::IFFT: return "IFFT";
    case FftType::RFFT: return "RFFT";
    case FftType::IRFFT: return "IRFFT";
  }
  return "?";
}

int64_t ParamIndex(const Node& n) {
  const auto* a = std::get_if<ParameterAttrs>(&n.attrs);
  if (n.op != Op::Parameter || !a) {
    throw Error(std::string("ParamIndex of a ") + OpName(n.op) + " node: only Parameter nodes have one");
  }
  return a->index;
}

const std::vector<uint8_t>* ConstantBytes(const Node& n) {
  const auto* a = std::get_if<ConstantAttrs>(&n.attrs);
  return n.op == Op::Constant && a ? a->data.get() : nullptr;
}

Builder::Builder(int num_replicas, int num_partitions) {
  if (num_replicas < 1 || num_partitions < 1) throw Error("a graph needs >= 1 replica and partition");
  g_.num_replicas = num_replicas;
  g_.num_partitions = num_partitions;
}

const Shape& Builder::shape(Value v) const {
  CheckValue(v);
  return g_.shape(v);
}

void Builder::CheckValue(Value v) const {
  if (v.node < 0 || v.node >= static_cast<int32_t>(g_.nodes.size()) || v.index < 0 ||
      v.index >= static_cast<int32_t>(g_.nodes[v.node].results.size())) {
    throw Error("value %" + std::to_string(v.node) + "#" + std::to_string(v.index) +
                " does not belong to this graph");
  }
}

std::vector<Value> Builder::AddNode(Op op, Operands operands, Attrs attrs) {
  const int32_t id = AppendNode(op, operands, std::move(attrs));
  std::vector<Value> out;
  for (size_t i = 0; i < g_.nodes[id].results.size(); ++i) out.push_back(Value{id, static_cast<int32_t>(i)});
  return out;
}

int32_t Builder::Emit(Op op, Operands operands, Attrs attrs, const Shape* given, size_t num_given, bool infer) {
  const auto id = static_cast<int32_t>(g_.nodes.size());
  if (!repeats_.empty()) {
    // Every node before this one is the same as that earlier graph's, so the
    // same op on the same operands with the same attributes infers the same
    // results.
    Node* take = nullptr;
    size_t kept = 0;
    for (uint8_t e : repeats_) {
      Earlier& earlier = earlier_[e];
      earlier.matched = static_cast<size_t>(id);
      if (earlier.matched >= earlier.nodes.size()) continue;
      const Node& old = earlier.nodes[id];
      const size_t inferred = old.results.size() - std::min(old.results.size(), num_given);
      if (old.op == op && std::equal(old.operands.begin(), old.operands.end(), operands.begin(), operands.end()) &&
          (infer || inferred == 0) && old.results.size() == inferred + num_given &&
          std::equal(given, given + num_given, old.results.begin() + static_cast<std::ptrdiff_t>(inferred)) &&
          SameAttrs(old.attrs, attrs)) {
        repeats_[kept++] = e;
        if (!take) {
          take = &earlier.nodes[id];
          earlier.taken = true;
        }
      }
    }
    repeats_.resize(kept);
    if (take) {
      if (take->location != location_) take->location = location_;
      g_.nodes.push_back(std::move(*take));
      ++taken_over_;
      return id;
    }
  }
  std::vector<Shape> results;
  if (infer) {
    std::vector<Shape> in;
    in.reserve(operands.size());
    for (Value v : operands) {
      CheckValue(v);
      in.push_back(g_.shape(v));
    }
    try {
      results = InferResults(op, in, attrs);
    } catch (const Error& e) {
      if (location_.empty()) throw;
      throw Error(std::string(e.what()) + " (at " + location_ + ")");
    }
  } else {
    for (Value v : operands) CheckValue(v);
  }
  results.insert(results.end(), given, given + num_given);
  g_.nodes.push_back(
      Node{op, std::vector<Value>(operands.begin(), operands.end()), std::move(results), std::move(attrs), location_});
  return id;
}

void Builder::Restart() {
  fold_floor_ = 0;
  Earlier done;
  done.hashed = hashed_nodes_ == g_.nodes.size();
  done.hash = hash_;
  done.nodes = std::move(g_.nodes);
  const size_t size = done.nodes.size();
  hashed_nodes_ = SIZE_MAX;
  for (uint8_t e : repeats_) earlier_[e].matched = size;
  // The node array of a graph let go of is used again for the new one.
  std::vector<Node> room;
  auto let_go = [&room](Earlier& e) {
    if (room.capacity() < e.nodes.capacity()) room.swap(e.nodes);
  };
  for (size_t i = 0; i < earlier_.size();) {
    Earlier& e = earlier_[i];
    bool keep;
    if (!e.taken) {
      keep = ++e.idle <= kIdle;
    } else if (e.matched == size && e.nodes.size() == size) {
      keep = false;  // repeated whole: `done` is the same graph
    } else {
      std::copy(done.nodes.begin(), done.nodes.begin() + static_cast<std::ptrdiff_t>(e.matched), e.nodes.begin());
      e.taken = false;
      e.idle = 0;
      keep = true;
    }
    if (keep) {
      ++i;
    } else {
      let_go(e);
      earlier_.erase(earlier_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (size > 0) {
    if (earlier_.size() == kEarlier) {
      let_go(earlier_.front());
      earlier_.erase(earlier_.begin());
    }
    earlier_.push_back(std::move(done));
  } else {
    let_go(done);
  }
  room.clear();
  // The room of a far longer trace before is given back, not kept for good.
  if (room.capacity() > 2 * size + 1024) std::vector<Node>().swap(room);
  g_.nodes = std::move(room);
  g_.nodes.reserve(size);
  repeats_.clear();
  taken_over_ = 0;
  for (size_t e = earlier_.size(); e-- > 0;) repeats_.push_back(static_cast<uint8_t>(e));
  g_.params.clear();
  g_.outputs.clear();
  g_.aliases.clear();
  g_.output_shardings.clear();
  location_.clear();
}

uint64_t Builder::Fingerprint() {
  if (hashed_nodes_ != g_.nodes.size()) {
    const Earlier* same = nullptr;
    for (uint8_t e : repeats_) {
      if (earlier_[e].hashed && earlier_[e].nodes.size() == g_.nodes.size()) {
        same = &earlier_[e];
        break;
      }
    }
    hash_ = same ? same->hash : ProgramHash(g_);
    hashed_nodes_ = g_.nodes.size();
  }
  return hash_;
}

namespace {
void CheckShardingText(const std::string& sharding) {
  for (char c : sharding) {
    if (c == '"' || c == '\\' || c < 0x20) throw Error("a sharding must not hold quotes, backslashes or control characters");
  }
}
}  // namespace

Value Builder::Parameter(const Shape& shape, const std::string& sharding) {
  CheckShardingText(sharding);
  for (int64_t d : shape.dims) {
    if (d < 0) throw Error("Parameter " + shape.ToString() + ": dims must be >= 0");
  }
  const int32_t id =
      Emit(Op::Parameter, {}, ParameterAttrs{static_cast<int64_t>(g_.params.size()), sharding}, &shape, 1, false);
  g_.params.push_back(id);
  return Value{id, 0};
}

Value Builder::Constant(const Shape& shape, std::vector<uint8_t> bytes) {
  for (int64_t d : shape.dims) {
    if (d < 0) throw Error("Constant " + shape.ToString() + ": dims must be >= 0");
  }
  const size_t elem = ByteSize(shape.dtype);
  if (bytes.size() != shape.bytes() && bytes.size() != elem) {
    std::ostringstream os;
    os << "Constant " << shape.ToString() << ": got " << bytes.size() << " bytes, need "
       << shape.bytes() << " (or " << elem << " for a splat)";
    throw Error(os.str());
  }
  ConstantAttrs a{std::make_shared<const std::vector<uint8_t>>(std::move(bytes))};
  return Value{Emit(Op::Constant, {}, std::move(a), &shape, 1, false), 0};
}

Value Builder::ScalarConstant(DType dtype, double value) {
  return Constant(Shape{dtype, {}}, EncodeScalar(dtype, value));
}

Value Builder::Full(DType dtype, const std::vector<int64_t>& dims, double value) {
  return Constant(Shape{dtype, dims}, EncodeScalar(dtype, value));
}

Value Builder::Unary(Op op, Value x) {
  const OpForm f = Form(op);
  if (f != OpForm::kUnary && f != OpForm::kFloatUnary && f != OpForm::kRealFloatUnary &&
      f != OpForm::kLogicalUnary) {
    throw Error(std::string(OpName(op)) + " is not a unary elementwise op");
  }
  return Add(op, {x});
}

Value Builder::Binary(Op op, Value x, Value y) {
  const OpForm f = Form(op);
  if (f != OpForm::kBinary && f != OpForm::kLogical) {
    throw Error(std::string(OpName(op)) + " is not a binary elementwise op");
  }
  if (shape(x).dtype == DType::Bool && (op == Op::Add || op == Op::Mul)) {
    // StableHLO's add and multiply of booleans are or and and, but XLA's
    // constant folding added them as 1-bit integers (true + true = false)
    op = op == Op::Add ? Op::Or : Op::And;
  }
  return Add(op, {x, y});
}

Value Builder::Convert(Value x, DType to) {
  const DType from = shape(x).dtype;
  if (from == to) return x;
  if (IsComplex(from) && !IsComplex(to)) {
    throw Error(std::string("Convert from ") + Name(from) + " to " + Name(to) +
                ": take the real part first (complex to real is not defined)");
  }
  if (from == DType::Bool && IsFloat(to)) {
    // select(x, 1, 0), not convert: XLA rewrites multiply(a, convert(pred))
    // into select(pred, a, 0), which turns inf * 0 and NaN * 0 into 0
    // (PyTorch, and IEEE, give NaN: masked gradients depend on it).
    const std::vector<int64_t>& dims = shape(x).dims;
    return Select(x, Full(to, dims, 1), Full(to, dims, 0));
  }
  const Shape out{to, shape(x).dims};
  return Value{Emit(Op::Convert, {x}, std::monostate{}, &out, 1, false), 0};
}

Value Builder::Bitcast(Value x, DType to) {
  const Shape in = shape(x);
  const DType from = in.dtype;
  if (from == to) return x;
  const size_t have = ByteSize(from), want = ByteSize(to);
  auto fail = [&](const std::string& why) {
    return Error(std::string("Bitcast from ") + Name(from) + " to " + Name(to) + ": " + why);
  };
  if (IsComplex(from)) {
    // [..., n] complex -> [..., n, 2] (real, imag) -> [..., 2n] of the part
    // type, then on to `to` as plain bits.
    std::vector<int64_t> one = in.dims;
    one.push_back(1);
    Value pairs = Concatenate({Reshape(Real(x), one), Reshape(Imag(x), one)}, in.rank());
    std::vector<int64_t> flat = in.dims;
    if (flat.empty()) {
      flat.push_back(2);
    } else {
      flat.back() *= 2;
    }
    return Bitcast(Reshape(pairs, flat), to);
  }
  if (IsComplex(to)) {
    const DType part = to == DType::C64 ? DType::F32 : DType::F64;
    Value p = Bitcast(x, part);
    std::vector<int64_t> dims = shape(p).dims;
    if (dims.empty() || dims.back() % 2 != 0) {
      throw fail("the last dimension must hold whole (real, imaginary) pairs");
    }
    dims.back() /= 2;
    std::vector<int64_t> split = dims;
    split.push_back(2);
    Value pairs = Reshape(p, split);
    auto part_at = [&](int64_t i) {
      std::vector<int64_t> starts(split.size(), 0), limits = split, strides(split.size(), 1);
      starts.back() = i;
      limits.back() = i + 1;
      return Reshape(Slice(pairs, starts, limits, strides), dims);
    };
    Value re = part_at(0);
    Value im = part_at(1);
    return Complex(re, im);
  }
  // XLA's pred has no bits to reinterpret; torch's bool is one byte, 0 or 1,
  // so a conversion through uint8 reads and writes the same bytes.
  if (from == DType::Bool) return Bitcast(Convert(x, DType::U8), to);
  if (to == DType::Bool) return Convert(Bitcast(x, DType::U8), DType::Bool);
  // As torch's view(dtype): the last dimension scales by the size ratio.
  // StableHLO's bitcast_convert adds (wide to narrow) or removes (narrow to
  // wide) a minor dimension of the ratio; reshapes fold it into the last one.
  std::vector<int64_t> dims = in.dims;  // of the result
  if (have < want) {
    const int64_t k = static_cast<int64_t>(want / have);
    if (dims.empty() || dims.back() % k != 0) {
      throw fail("the last dimension must be a multiple of " + std::to_string(k));
    }
    dims.back() /= k;
  } else if (have > want) {
    const int64_t k = static_cast<int64_t>(have / want);
    if (dims.empty()) {
      dims.push_back(k);
    } else {
      dims.back() *= k;
    }
  }
  // A bitcast of a bitcast (a storage uploaded as bytes, typed by its first
  // read, then read through a view of a third type) is one bitcast of the
  // first one's operand, flat: XLA's simplifier folds the two into one
  // bitcast_convert of that operand as shaped, which its verifier may then
  // refuse (u8[2,4] to bf16[2,2]).
  Value src = x;
  if (g_.nodes[src.node].op == Op::Reshape && src.node >= fold_floor_) src = g_.nodes[src.node].operands[0];
  if (g_.nodes[src.node].op == Op::BitcastConvert && src.node >= fold_floor_) {
    const Value bytes = g_.nodes[src.node].operands[0];
    const Shape bs = shape(bytes);
    const Value flat = Reshape(bytes, {bs.numel()});
    return Reshape(bs.dtype == to ? flat : Bitcast(flat, to), dims);
  }
  if (have < want) {
    std::vector<int64_t> split = dims;
    split.push_back(static_cast<int64_t>(want / have));
    x = Reshape(x, split);
  }
  Shape out{to, have < want ? dims : in.dims};
  if (have > want) out.dims.push_back(static_cast<int64_t>(have / want));
  Value v{Emit(Op::BitcastConvert, {x}, std::monostate{}, &out, 1, false), 0};
  return have > want ? Reshape(v, dims) : v;
}

Value Builder::IsFinite(Value x) { return Add(Op::IsFinite, {x}); }

Value Builder::Compare(CompareDir dir, Value x, Value y) {
  return Add({x, y}, CompareAttrs{dir});
}

Value Builder::Select(Value pred, Value on_true, Value on_false) {
  return Add(Op::Select, {pred, on_true, on_false});
}

Value Builder::Clamp(Value lo, Value x, Value hi) { return Add(Op::Clamp, {lo, x, hi}); }

Value Builder::BroadcastInDim(Value x, const std::vector<int64_t>& dims,
                              const std::vector<int64_t>& broadcast_dims) {
  return Add({x}, BroadcastInDimAttrs{dims, broadcast_dims});
}

Value Builder::Reshape(Value x, const std::vector<int64_t>& dims) {
  if (shape(x).dims == dims) return x;
  const Node& n = g_.nodes[x.node];
  if (n.op == Op::Reshape && x.node >= fold_floor_) {
    Value src = n.operands[0];
    if (g_.shape(src).dims == dims) return src;
    x = src;
  }
  return Add({x}, ReshapeAttrs{dims});
}

Value Builder::Transpose(Value x, const std::vector<int64_t>& perm) {
  return Add({x}, TransposeAttrs{perm});
}

Value Builder::Reverse(Value x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  return Add({x}, ReverseAttrs{dims});
}

Value Builder::Slice(Value x, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& limits, const std::vector<int64_t>& strides) {
  return Add({x}, SliceAttrs{starts, limits, strides});
}

Value Builder::DynamicSlice(Value x, const std::vector<Value>& starts,
                            const std::vector<int64_t>& sizes) {
  std::vector<Value> ops{x};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return Add(std::move(ops), DynamicSliceAttrs{sizes});
}

Value Builder::DynamicUpdateSlice(Value x, Value update, const std::vector<Value>& starts) {
  std::vector<Value> ops{x, update};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return Add(Op::DynamicUpdateSlice, std::move(ops));
}

Value Builder::Concatenate(const std::vector<Value>& xs, int64_t dim) {
  return Add(xs, ConcatenateAttrs{dim});
}

Value Builder::Pad(Value x, Value pad_value, const std::vector<int64_t>& low,
                   const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  return Add({x, pad_value}, PadAttrs{low, high, interior});
}

Value Builder::Iota(const Shape& shape, int64_t dim) {
  if (dim < 0 || dim >= shape.rank()) {
    throw Error("Iota " + shape.ToString() + ": dimension " + std::to_string(dim) +
                " is out of range");
  }
  if (shape.dtype == DType::Bool || IsComplex(shape.dtype)) {
    throw Error("Iota " + shape.ToString() + ": needs an integer or floating-point dtype");
  }
  return Value{Emit(Op::Iota, {}, IotaAttrs{dim}, &shape, 1, false), 0};
}

Value Builder::DotGeneral(Value lhs, Value rhs, const DotDims& dims, Precision precision, bool f32_result) {
  return Add({lhs, rhs}, DotGeneralAttrs{dims, precision, f32_result});
}

namespace {
// Sums and products of float16/bfloat16 accumulate in float32 and round
// once, as PyTorch's kernels do (their "opmath" type): the XLA CPU plugin
// accumulates in the operand's type, and a bfloat16 mean of 2048 values near
// 1 came out as 0.65. Max and min are exact in any type.
bool WidensToF32(DType t, ReduceKind kind) {
  return (t == DType::BF16 || t == DType::F16) && (kind == ReduceKind::Sum || kind == ReduceKind::Prod);
}

// XLA's CPU backend adds up a reduction over several dims in a sequential
// loop per result (one long dim it splits itself): summing 1M float32
// values near 0.7 over [4, 256, 1024] was off by 2e-5 relative, the CPU's
// cascade sum by 2e-7, and a mean of 2048 values near ln 2 over [2, 1024]
// by 2.4e-6. A float sum of at least kStagedSumFrom values per result over
// two or more dims (of size > 1) is taken in two stages instead: windows of
// w consecutive elements along its longest run of adjacent reduced dims
// (merged by a reshape), then the window sums, w about the square root of
// the count, so that each stage adds up about that many values. (A reduce
// of a merging reshape, or of another reduce, XLA folds back into one
// reduce: a reduce_window it keeps.) Only where SetStagedSums turned it on.
constexpr int64_t kStagedSumFrom = 1024;

std::optional<Value> StagedSum(Builder& b, Value x, Value init, std::vector<int64_t> dims) {
  const std::vector<int64_t> in = b.shape(x).dims;
  std::sort(dims.begin(), dims.end());
  int64_t count = 1;
  int several = 0;
  for (int64_t d : dims) {
    count *= in[static_cast<size_t>(d)];
    several += in[static_cast<size_t>(d)] > 1;
  }
  if (count < kStagedSumFrom || several < 2) return std::nullopt;
  // the run of adjacent reduced dims [first, last] holding the most elements
  size_t first = 0, last = 0, start = 0;
  int64_t most = 0, n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0 && dims[i] != dims[i - 1] + 1) start = i, n = 1;
    n *= in[static_cast<size_t>(dims[i])];
    if (n > most) most = n, first = start, last = i;
  }
  const int64_t w = std::min(most, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(count)))));
  if (w < 2) return std::nullopt;
  const int64_t lo = dims[first], hi = dims[last];
  std::vector<int64_t> merged(in.begin(), in.begin() + lo);
  merged.push_back(most);
  merged.insert(merged.end(), in.begin() + hi + 1, in.end());
  const size_t rank = merged.size();
  std::vector<int64_t> window(rank, 1), ones(rank, 1), zeros(rank, 0), pad_high(rank, 0);
  window[static_cast<size_t>(lo)] = w;
  pad_high[static_cast<size_t>(lo)] = (w - most % w) % w;
  Value partial = b.ReduceWindow(b.Reshape(x, merged), init, ReduceKind::Sum, window, window, ones, ones, zeros, pad_high);
  std::vector<int64_t> rest;  // the reduced dims, numbered as in `merged`
  for (int64_t d : dims) {
    if (d < lo) rest.push_back(d);
    if (d > hi) rest.push_back(d - (hi - lo));
  }
  rest.push_back(lo);
  std::sort(rest.begin(), rest.end());
  return b.Reduce(partial, init, rest, ReduceKind::Sum);
}
}  // namespace

Value Builder::Reduce(Value x, Value init, const std::vector<int64_t>& dims, ReduceKind kind) {
  const DType t = shape(x).dtype;
  if (WidensToF32(t, kind)) return Convert(Reduce(Convert(x, DType::F32), Convert(init, DType::F32), dims, kind), t);
  if (staged_sums_ && kind == ReduceKind::Sum && (IsFloat(t) || IsComplex(t))) {
    if (auto staged = StagedSum(*this, x, init, dims)) return *staged;
  }
  return Add({x, init}, ReduceAttrs{dims, kind});
}

Value Builder::ReduceWindow(Value x, Value init, ReduceKind kind,
                            const std::vector<int64_t>& window,
                            const std::vector<int64_t>& strides,
                            const std::vector<int64_t>& base_dilation,
                            const std::vector<int64_t>& window_dilation,
                            const std::vector<int64_t>& pad_low,
                            const std::vector<int64_t>& pad_high) {
  const DType t = shape(x).dtype;
  if (WidensToF32(t, kind)) {
    return Convert(Add({Convert(x, DType::F32), Convert(init, DType::F32)},
                       ReduceWindowAttrs{kind, window, strides, base_dilation, window_dilation, pad_low, pad_high}),
                   t);
  }
  return Add({x, init},
             ReduceWindowAttrs{kind, window, strides, base_dilation, window_dilation, pad_low, pad_high});
}

Value Builder::SelectAndScatter(Value operand, Value source, Value init,
                                const std::vector<int64_t>& window,
                                const std::vector<int64_t>& strides,
                                const std::vector<int64_t>& pad_low,
                                const std::vector<int64_t>& pad_high) {
  return Add({operand, source, init}, SelectAndScatterAttrs{window, strides, pad_low, pad_high});
}

Value Builder::Convolution(Value lhs, Value rhs, const ConvDims& dims,
                           const std::vector<int64_t>& strides,
                           const std::vector<int64_t>& pad_low,
                           const std::vector<int64_t>& pad_high,
                           const std::vector<int64_t>& lhs_dilation,
                           const std::vector<int64_t>& rhs_dilation, int64_t feature_groups,
                           int64_t batch_groups, Precision precision, bool f32_result) {
  return Add({lhs, rhs}, ConvolutionAttrs{dims, strides, pad_low, pad_high, lhs_dilation, rhs_dilation,
                                          feature_groups, batch_groups, precision, f32_result});
}

Value Builder::Gather(Value operand, Value indices, const GatherDims& dims,
                      const std::vector<int64_t>& slice_sizes) {
  return Add({operand, indices}, GatherAttrs{dims, slice_sizes});
}

Value Builder::Scatter(Value operand, Value indices, Value updates, const ScatterDims& dims,
                       bool replace, ReduceKind kind) {
  return Add({operand, indices, updates}, ScatterAttrs{dims, replace, kind});
}

std::vector<Value> Builder::Sort(const std::vector<Value>& xs, int64_t dim, bool descending) {
  return AddNode(Op::Sort, xs, SortAttrs{dim, descending});
}

std::vector<Value> Builder::TopK(Value x, int64_t k) { return AddNode(Op::TopK, {x}, TopKAttrs{k}); }

std::vector<Value> Builder::RngBitGenerator(Value state, const Shape& bits) {
  if (!IsUnsignedInt(bits.dtype)) {
    throw Error("RngBitGenerator: bits must have an unsigned integer dtype, got " +
                bits.ToString());
  }
  // Drawn as a vector and reshaped: XLA's Threefry takes one counter per 64
  // bits of a vector (what Runtime::RngAdvance moves the state by), but for
  // a 32-bit shape of several odd dims it pads one of them to even and
  // takes more (a (3, 5) draw 9 counters, not 8), which would overlap the
  // next draw's numbers.
  const Shape flat{bits.dtype, {bits.numel()}};
  const int32_t id = Emit(Op::RngBitGenerator, {state}, RngBitGeneratorAttrs{}, &flat, 1, true);
  const Value drawn{id, 1};
  return {Value{id, 0}, bits.dims.size() == 1 ? drawn : Reshape(drawn, bits.dims)};
}

Value Builder::AllReduce(Value x, ReduceKind kind, std::vector<std::vector<int64_t>> groups) {
  return Add({x}, AllReduceAttrs{kind, DefaultGroups(std::move(groups), g_.num_replicas)});
}

Value Builder::AllGather(Value x, int64_t dim, std::vector<std::vector<int64_t>> groups) {
  return Add({x}, AllGatherAttrs{dim, DefaultGroups(std::move(groups), g_.num_replicas)});
}

Value Builder::ReduceScatter(Value x, int64_t dim, ReduceKind kind,
                             std::vector<std::vector<int64_t>> groups) {
  return Add({x}, ReduceScatterAttrs{dim, kind, DefaultGroups(std::move(groups), g_.num_replicas)});
}

Value Builder::Cholesky(Value a, bool lower) { return Add({a}, CholeskyAttrs{lower}); }

Value Builder::TriangularSolve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                               bool transpose_a) {
  return Add({a, b}, TriangularSolveAttrs{left_side, lower, unit_diagonal, transpose_a});
}

std::vector<Value> Builder::CustomCall(const std::string& target, const std::vector<Value>& operands,
                                       const std::vector<Shape>& results,
                                       const std::string& backend_config) {
  return CustomCallNode(target, operands, results, backend_config, "");
}

std::vector<Value> Builder::CustomCallNode(const std::string& target, const std::vector<Value>& operands,
                                           const std::vector<Shape>& results, const std::string& backend_config,
                                           const std::string& sharding) {
  if (target.empty()) throw Error("CustomCall needs a target name");
  if (results.empty()) throw Error("CustomCall @" + target + " needs at least one result");
  for (const Shape& s : results) {
    for (int64_t d : s.dims) {
      if (d < 0) throw Error("CustomCall @" + target + " result " + s.ToString() + ": dims must be >= 0");
    }
  }
  for (char c : target + backend_config) {
    if (c == '"' || c == '\\' || c < 0x20) {
      throw Error("CustomCall @" + target + ": target and backend_config must not hold quotes, backslashes or control characters");
    }
  }
  const int32_t id = Emit(Op::CustomCall, operands, CustomCallAttrs{target, backend_config, sharding}, results.data(),
                         results.size(), false);
  std::vector<Value> out;
  for (size_t i = 0; i < results.size(); ++i) out.push_back(Value{id, static_cast<int32_t>(i)});
  return out;
}

Value Builder::ShardingConstraint(Value x, const std::string& sharding) {
  CheckShardingText(sharding);
  const Shape s = shape(x);
  return CustomCallNode("Sharding", {x}, {s}, "", sharding)[0];
}

Graph Extract(const Graph& full, const std::vector<Value>& outputs, const std::vector<Alias>& aliases,
              std::vector<int64_t>* used_params) {
  const size_t n = full.nodes.size();
  std::vector<char> live(n, 0);
  std::vector<int32_t> stack;
  for (Value v : outputs) stack.push_back(v.node);
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    if (live[id]) continue;
    live[id] = 1;
    for (Value o : full.nodes[id].operands) {
      if (!live[o.node]) stack.push_back(o.node);
    }
  }
  Graph g;
  g.num_replicas = full.num_replicas;
  g.num_partitions = full.num_partitions;
  std::vector<int32_t> remap(n, -1);
  std::vector<int64_t> param_remap(full.params.size(), -1);
  if (used_params) used_params->clear();
  for (size_t id = 0; id < n; ++id) {
    if (!live[id]) continue;
    Node node = full.nodes[id];
    for (Value& o : node.operands) o.node = remap[o.node];
    if (node.op == Op::Parameter) {
      int64_t& index = std::get<ParameterAttrs>(node.attrs).index;
      const int64_t old = index;
      index = static_cast<int64_t>(g.params.size());
      param_remap[old] = index;
      g.params.push_back(static_cast<int32_t>(g.nodes.size()));
      if (used_params) used_params->push_back(old);
    }
    remap[id] = static_cast<int32_t>(g.nodes.size());
    g.nodes.push_back(std::move(node));
  }
  for (Value v : outputs) g.outputs.push_back(Value{remap[v.node], v.index});
  for (const Alias& a : aliases) {
    if (a.param >= 0 && a.param < static_cast<int64_t>(param_remap.size()) && param_remap[a.param] >= 0) {
      g.aliases.push_back(Alias{param_remap[a.param], a.output});
    }
  }
  return g;
}

Graph ExtractFrom(const Graph& full, const std::vector<Value>& outputs, int32_t first, std::vector<Value>* externals) {
  const size_t n = full.nodes.size();
  auto outside = [&](int32_t id) { return id < first || full.nodes[static_cast<size_t>(id)].op == Op::Parameter; };
  std::vector<char> live(n, 0);
  std::vector<Value> ext;
  std::vector<int32_t> stack;
  auto reach = [&](Value v) {
    if (outside(v.node)) {
      ext.push_back(v);
    } else if (!live[static_cast<size_t>(v.node)]) {
      stack.push_back(v.node);
    }
  };
  for (Value v : outputs) reach(v);
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    if (live[static_cast<size_t>(id)]) continue;
    live[static_cast<size_t>(id)] = 1;
    for (Value o : full.nodes[static_cast<size_t>(id)].operands) reach(o);
  }
  auto before = [](Value a, Value b) { return a.node != b.node ? a.node < b.node : a.index < b.index; };
  std::sort(ext.begin(), ext.end(), before);
  ext.erase(std::unique(ext.begin(), ext.end()), ext.end());
  Graph g;
  g.num_replicas = full.num_replicas;
  g.num_partitions = full.num_partitions;
  for (size_t k = 0; k < ext.size(); ++k) {
    Node p;
    p.op = Op::Parameter;
    p.results.push_back(full.shape(ext[k]));
    p.attrs = ParameterAttrs{static_cast<int64_t>(k), ""};
    g.params.push_back(static_cast<int32_t>(g.nodes.size()));
    g.nodes.push_back(std::move(p));
  }
  auto param_of = [&](Value v) {
    const auto at = std::lower_bound(ext.begin(), ext.end(), v, before);
    return Value{static_cast<int32_t>(at - ext.begin()), 0};
  };
  std::vector<int32_t> remap(n, -1);
  auto mapped = [&](Value v) { return outside(v.node) ? param_of(v) : Value{remap[static_cast<size_t>(v.node)], v.index}; };
  for (size_t id = static_cast<size_t>(std::max(first, 0)); id < n; ++id) {
    if (!live[id]) continue;
    Node node = full.nodes[id];
    for (Value& o : node.operands) o = mapped(o);
    remap[id] = static_cast<int32_t>(g.nodes.size());
    g.nodes.push_back(std::move(node));
  }
  for (Value v : outputs) g.outputs.push_back(mapped(v));
  if (externals) *externals = std::move(ext);
  return g;
}

Value Builder::Real(Value x) { return Add(Op::Real, {x}); }
Value Builder::Imag(Value x) { return Add(Op::Imag, {x}); }
Value Builder::Complex(Value re, Value im) { return Add(Op::Complex, {re, im}); }

Value Builder::Fft(Value x, FftType type, const std::vector<int64_t>& fft_length) {
  return Add({x}, FftAttrs{type, fft_length});
}

std::vector<Value> Builder::Call(std::shared_ptr<const Graph> body, const std::vector<Value>& args) {
  if (!body) throw Error("Call: no graph to call");
  if (!body->aliases.empty() || !body->output_shardings.empty()) {
    throw Error("Call: the called graph must have no aliases and no output shardings");
  }
  const int32_t id = AppendNode(Op::Call, args, CallAttrs{std::move(body)});
  const size_t n = g_.nodes[static_cast<size_t>(id)].results.size();
  std::vector<Value> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(Value{id, static_cast<int32_t>(i)});
  return out;
}

Graph Builder::Build(const std::vector<Value>& outputs, const std::vector<Alias>& aliases) {
  for (Value v : outputs) CheckValue(v);
  std::vector<bool> used(outputs.size(), false);
  for (const Alias& al : aliases) {
    if (al.param < 0 || al.param >= static_cast<int64_t>(g_.params.size()) || al.output < 0 ||
        al.output >= static_cast<int64_t>(outputs.size())) {
      throw Error("alias of parameter " + std::to_string(al.param) + " to output " +
                  std::to_string(al.output) + " is out of range");
    }
    const Shape& p = g_.nodes[g_.params[al.param]].results[0];
    const Shape& o = g_.shape(outputs[al.output]);
    if (p != o) {
      throw Error("alias of parameter " + std::to_string(al.param) + " " + p.ToString() +
                  " to output " + std::to_string(al.output) + " " + o.ToString() +
                  ": shapes differ");
    }
    if (used[al.output]) {
      throw Error("output " + std::to_string(al.output) + " is aliased to two parameters");
    }
    used[al.output] = true;
  }
  Graph g = std::move(g_);
  g.outputs = outputs;
  g.aliases = aliases;
  g_ = Graph{};
  g_.num_replicas = g.num_replicas;
  g_.num_partitions = g.num_partitions;
  earlier_.clear();
  repeats_.clear();
  taken_over_ = 0;
  hashed_nodes_ = SIZE_MAX;
  return g;
}

}  // namespace tpj::ir
