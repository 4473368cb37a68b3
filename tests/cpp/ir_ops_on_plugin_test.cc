// Every IR op, printed, compiled by the plugin and run once; results compared
// with values computed here on the host, independently of XLA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "ir/graph.h"
#include "ir/printer.h"
#include "pjrt/executable.h"
#include "runtime/dtype_map.h"
#include "runtime/program.h"
#include "test_plugin.h"

namespace tpj {
namespace {

using ir::DType;
using ir::Op;
using ir::Shape;
using ir::Value;

struct Host {
  Shape shape;
  std::vector<uint8_t> bytes;

  template <class T>
  static Host Of(DType t, std::vector<int64_t> dims, const std::vector<T>& v) {
    Host h{{t, std::move(dims)}, {}};
    h.bytes.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
    return h;
  }
  template <class T>
  std::vector<T> As() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
};

Host F32(std::vector<int64_t> dims, const std::vector<float>& v) { return Host::Of(DType::F32, dims, v); }
Host I32(std::vector<int64_t> dims, const std::vector<int32_t>& v) { return Host::Of(DType::I32, dims, v); }

// Compiles `g` for device 0, runs it on `inputs`, returns every output.
std::vector<Host> RunGraph(const ir::Graph& g, const std::vector<Host>& inputs) {
  auto c = testing::SharedClient();
  const int dev = c->addressable_device_ids()[0];
  auto prog = runtime::CompileGraph(*c, g, {dev});
  std::vector<std::unique_ptr<pjrt::Buffer>> owned;
  std::vector<pjrt::Buffer*> args;
  for (const Host& h : inputs) {
    owned.push_back(c->BufferFromHost(h.bytes.data(), runtime::ToPjrt(h.shape.dtype), h.shape.dims, dev));
    args.push_back(owned.back().get());
  }
  auto out = prog.executable->Execute(args);
  std::vector<Host> result;
  for (auto& b : out) {
    Host h{{runtime::FromPjrt(b->element_type()), b->dims()}, b->ToHost()};
    result.push_back(std::move(h));
  }
  return result;
}

void ExpectFloats(const std::vector<float>& got, const std::vector<float>& want, float tol = 2e-6f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

const std::vector<float> kPositive = {0.25f, 0.5f, 1.f, 1.5f, 2.f, 3.75f, 10.f, 0.01f};
const std::vector<float> kMixed = {-3.5f, -1.f, -0.5f, -0.f, 0.25f, 0.5f, 2.5f, 7.f};

struct UnaryCase {
  Op op;
  std::function<float(float)> f;
  const std::vector<float>* input;
  float tol;
};

TEST(OpsOnPlugin, UnaryElementwise) {
  const std::vector<UnaryCase> cases = {
      {Op::Neg, [](float x) { return -x; }, &kMixed, 0},
      {Op::Abs, [](float x) { return std::fabs(x); }, &kMixed, 0},
      {Op::Sign, [](float x) { return float((x > 0) - (x < 0)); }, &kMixed, 0},
      {Op::Exp, [](float x) { return std::exp(x); }, &kMixed, 1e-6f},
      {Op::Expm1, [](float x) { return std::expm1(x); }, &kMixed, 1e-6f},
      {Op::Log, [](float x) { return std::log(x); }, &kPositive, 1e-6f},
      {Op::Log1p, [](float x) { return std::log1p(x); }, &kPositive, 1e-6f},
      {Op::Tanh, [](float x) { return std::tanh(x); }, &kMixed, 1e-6f},
      {Op::Logistic, [](float x) { return 1.f / (1.f + std::exp(-x)); }, &kMixed, 1e-6f},
      {Op::Sqrt, [](float x) { return std::sqrt(x); }, &kPositive, 1e-6f},
      {Op::Rsqrt, [](float x) { return 1.f / std::sqrt(x); }, &kPositive, 1e-6f},
      {Op::Cbrt, [](float x) { return std::cbrt(x); }, &kMixed, 1e-6f},
      {Op::Sin, [](float x) { return std::sin(x); }, &kMixed, 1e-6f},
      {Op::Cos, [](float x) { return std::cos(x); }, &kMixed, 1e-6f},
      {Op::Tan, [](float x) { return std::tan(x); }, &kMixed, 1e-5f},
      {Op::Floor, [](float x) { return std::floor(x); }, &kMixed, 0},
      {Op::Ceil, [](float x) { return std::ceil(x); }, &kMixed, 0},
      {Op::Round, [](float x) { return std::nearbyint(x); }, &kMixed, 0},  // half to even
      {Op::RoundAwayFromZero, [](float x) { return std::round(x); }, &kMixed, 0},
      {Op::Erf, [](float x) { return std::erf(x); }, &kMixed, 1e-6f},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(ir::OpName(c.op));
    ir::Builder b;
    auto x = b.Parameter({DType::F32, {8}});
    auto g = b.Build({b.Unary(c.op, x)});
    std::vector<float> want;
    for (float v : *c.input) want.push_back(c.f(v));
    ExpectFloats(RunGraph(g, {F32({8}, *c.input)})[0].As<float>(), want, c.tol + 1e-7f);
  }
}

struct BinaryCase {
  Op op;
  std::function<float(float, float)> f;
};

TEST(OpsOnPlugin, BinaryElementwiseFloat) {
  const std::vector<float> x = {-3.5f, -1.f, 0.5f, 2.f, 7.f, 1.5f, -2.f, 4.f};
  const std::vector<float> y = {2.f, 3.f, -0.25f, 2.f, -3.f, 0.5f, 4.f, 3.f};
  const std::vector<BinaryCase> cases = {
      {Op::Add, [](float a, float b) { return a + b; }},
      {Op::Sub, [](float a, float b) { return a - b; }},
      {Op::Mul, [](float a, float b) { return a * b; }},
      {Op::Div, [](float a, float b) { return a / b; }},
      {Op::Rem, [](float a, float b) { return std::fmod(a, b); }},
      {Op::Max, [](float a, float b) { return std::max(a, b); }},
      {Op::Min, [](float a, float b) { return std::min(a, b); }},
      {Op::Atan2, [](float a, float b) { return std::atan2(a, b); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(ir::OpName(c.op));
    ir::Builder b;
    auto px = b.Parameter({DType::F32, {8}});
    auto py = b.Parameter({DType::F32, {8}});
    auto g = b.Build({b.Binary(c.op, px, py)});
    std::vector<float> want;
    for (size_t i = 0; i < x.size(); ++i) want.push_back(c.f(x[i], y[i]));
    ExpectFloats(RunGraph(g, {F32({8}, x), F32({8}, y)})[0].As<float>(), want, 1e-6f);
  }
  // pow on positive bases
  ir::Builder b;
  auto px = b.Parameter({DType::F32, {4}});
  auto py = b.Parameter({DType::F32, {4}});
  auto g = b.Build({b.Binary(Op::Pow, px, py)});
  ExpectFloats(RunGraph(g, {F32({4}, {2.f, 9.f, 0.5f, 10.f}), F32({4}, {3.f, 0.5f, -1.f, 0.f})})[0].As<float>(),
               {8.f, 3.f, 2.f, 1.f}, 1e-6f);
}

TEST(OpsOnPlugin, IntegerAndLogicalOps) {
  const std::vector<int32_t> x = {12, -7, 5, 0, 255, -1};
  const std::vector<int32_t> y = {10, 3, -2, 9, 15, 4};
  const std::vector<std::pair<Op, std::function<int32_t(int32_t, int32_t)>>> cases = {
      {Op::And, [](int32_t a, int32_t b) { return a & b; }},
      {Op::Or, [](int32_t a, int32_t b) { return a | b; }},
      {Op::Xor, [](int32_t a, int32_t b) { return a ^ b; }},
      {Op::Rem, [](int32_t a, int32_t b) { return a % b; }},
      {Op::Div, [](int32_t a, int32_t b) { return a / b; }},
      {Op::ShiftLeft, [](int32_t a, int32_t b) { return int32_t(uint32_t(a) << (b & 31)); }},
  };
  for (const auto& [op, f] : cases) {
    SCOPED_TRACE(ir::OpName(op));
    ir::Builder b;
    auto px = b.Parameter({DType::I32, {6}});
    auto py = b.Parameter({DType::I32, {6}});
    auto g = b.Build({b.Binary(op, px, py)});
    auto got = RunGraph(g, {I32({6}, x), I32({6}, op == Op::ShiftLeft ? std::vector<int32_t>{1, 2, 3, 0, 4, 5} : y)})[0]
                   .As<int32_t>();
    for (size_t i = 0; i < x.size(); ++i) {
      const int32_t yi = op == Op::ShiftLeft ? std::vector<int32_t>{1, 2, 3, 0, 4, 5}[i] : y[i];
      EXPECT_EQ(got[i], f(x[i], yi)) << i;
    }
  }
  // not on bool and on int
  ir::Builder b;
  auto pb = b.Parameter({DType::Bool, {3}});
  auto pi = b.Parameter({DType::I32, {3}});
  auto g = b.Build({b.Unary(Op::Not, pb), b.Unary(Op::Not, pi)});
  auto out = RunGraph(g, {Host::Of<uint8_t>(DType::Bool, {3}, {1, 0, 1}), I32({3}, {0, -1, 5})});
  EXPECT_EQ(out[0].As<uint8_t>(), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(out[1].As<int32_t>(), (std::vector<int32_t>{-1, 0, -6}));
}

TEST(OpsOnPlugin, ConvertCompareSelectClampIsFinite) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {5}});
  auto y = b.Parameter({DType::F32, {5}});
  auto as_int = b.Convert(x, DType::I32);
  auto lt = b.Compare(ir::CompareDir::LT, x, y);
  auto sel = b.Select(lt, x, y);
  auto clamped = b.Clamp(b.ScalarConstant(DType::F32, -1.0), x, b.ScalarConstant(DType::F32, 1.0));
  auto finite = b.IsFinite(b.Binary(Op::Div, x, y));
  auto g = b.Build({as_int, lt, sel, clamped, finite});
  const std::vector<float> xv = {-2.7f, 0.5f, 3.9f, 1.f, 0.f};
  const std::vector<float> yv = {1.f, 0.25f, 5.f, 1.f, 0.f};
  auto out = RunGraph(g, {F32({5}, xv), F32({5}, yv)});
  EXPECT_EQ(out[0].As<int32_t>(), (std::vector<int32_t>{-2, 0, 3, 1, 0}));
  EXPECT_EQ(out[1].As<uint8_t>(), (std::vector<uint8_t>{1, 0, 1, 0, 0}));
  ExpectFloats(out[2].As<float>(), {-2.7f, 0.25f, 3.9f, 1.f, 0.f});
  ExpectFloats(out[3].As<float>(), {-1.f, 0.5f, 1.f, 1.f, 0.f});
  EXPECT_EQ(out[4].As<uint8_t>(), (std::vector<uint8_t>{1, 1, 1, 1, 0}));  // 0/0 is NaN
}

TEST(OpsOnPlugin, MultiplyByConvertedBoolKeepsInfTimesZeroNan) {
  // XLA folds multiply(a, convert(pred)) into select(pred, a, 0); the
  // builder's bool-to-float Convert must not let it (inf * 0 is NaN).
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {3}});
  auto mask = b.Compare(ir::CompareDir::GT, x, b.Full(DType::F32, {3}, 0));
  auto y = b.Parameter({DType::F32, {3}});
  auto g = b.Build({b.Binary(Op::Mul, y, b.Convert(mask, DType::F32))});
  auto out = RunGraph(g, {F32({3}, {-1.f, 2.f, -3.f}), F32({3}, {INFINITY, 5.f, std::nanf("")})})[0].As<float>();
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 5.f);
  EXPECT_TRUE(std::isnan(out[2]));
}

TEST(OpsOnPlugin, ConstantsScalarSplatDenseAndOtherDtypes) {
  ir::Builder b;
  auto dense = b.Constant({DType::F32, {2, 2}}, Host::Of<float>(DType::F32, {}, {1.f, -2.5f, 1e-8f, 3e20f}).bytes);
  auto splat = b.Full(DType::I64, {3}, 7);
  auto scalar = b.ScalarConstant(DType::F64, 0.1);
  auto half = b.Full(DType::F16, {2}, 1.5);
  auto bf = b.Full(DType::BF16, {2}, -2.0);
  auto flags = b.Constant({DType::Bool, {3}}, {1, 0, 1});
  auto u8 = b.Constant({DType::U8, {2}}, {200, 3});
  auto g = b.Build({dense, splat, scalar, b.Convert(half, DType::F32), b.Convert(bf, DType::F32), flags, u8});
  auto out = RunGraph(g, {});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{1.f, -2.5f, 1e-8f, 3e20f}));
  EXPECT_EQ(out[1].As<int64_t>(), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(out[2].As<double>(), (std::vector<double>{0.1}));
  EXPECT_EQ(out[3].As<float>(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(out[4].As<float>(), (std::vector<float>{-2.f, -2.f}));
  EXPECT_EQ(out[5].As<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(out[6].As<uint8_t>(), (std::vector<uint8_t>{200, 3}));
}

TEST(OpsOnPlugin, LargeConstantUsesHexAndIsExact) {
  std::vector<float> v(100);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i)) * 1e3f;
  v[7] = INFINITY;
  ir::Builder b;
  auto c = b.Constant({DType::F32, {10, 10}}, Host::Of<float>(DType::F32, {}, v).bytes);
  auto out = RunGraph(b.Build({c}), {});
  EXPECT_EQ(out[0].As<float>(), v);
}

std::vector<float> Iota(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  return v;
}

TEST(OpsOnPlugin, ShapeOps) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2, 3}});
  auto bcast = b.BroadcastInDim(x, {4, 2, 3}, {1, 2});
  auto reshaped = b.Reshape(x, {3, 2});
  auto transposed = b.Transpose(x, {1, 0});
  auto sliced = b.Slice(x, {0, 1}, {2, 3}, {1, 2});
  auto cat = b.Concatenate({x, x}, 0);
  auto padded = b.Pad(x, b.ScalarConstant(DType::F32, -1), {1, 0}, {0, 1}, {0, 1});
  auto iota = b.Iota({DType::I32, {2, 3}}, 1);
  auto reversed = b.Reverse(x, {1});
  auto g = b.Build({bcast, reshaped, transposed, sliced, cat, padded, iota, reversed});
  const auto xv = Iota(6);  // [[0,1,2],[3,4,5]]
  auto out = RunGraph(g, {F32({2, 3}, xv)});
  auto bc = out[0].As<float>();
  ASSERT_EQ(bc.size(), 24u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::vector<float>(bc.begin() + 6 * i, bc.begin() + 6 * i + 6), xv);
  EXPECT_EQ(out[1].shape.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(out[1].As<float>(), xv);
  EXPECT_EQ(out[2].As<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(out[3].As<float>(), (std::vector<float>{1, 4}));
  EXPECT_EQ(out[4].shape.dims, (std::vector<int64_t>{4, 3}));
  // pad: low row of -1, interior -1 between columns, one -1 column at the end.
  EXPECT_EQ(out[5].shape.dims, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(out[5].As<float>(), (std::vector<float>{-1, -1, -1, -1, -1, -1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1}));
  EXPECT_EQ(out[6].As<int32_t>(), (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(out[7].As<float>(), (std::vector<float>{2, 1, 0, 5, 4, 3}));
}

TEST(OpsOnPlugin, DynamicSliceAndUpdate) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {3, 4}});
  auto i = b.Parameter({DType::I32, {}});
  auto j = b.Parameter({DType::I32, {}});
  auto ds = b.DynamicSlice(x, {i, j}, {2, 2});
  auto upd = b.DynamicUpdateSlice(x, b.Full(DType::F32, {1, 2}, -5), {i, j});
  auto g = b.Build({ds, upd});
  auto out = RunGraph(g, {F32({3, 4}, Iota(12)), I32({}, {1}), I32({}, {2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{6, 7, 10, 11}));
  auto u = Iota(12);
  u[6] = u[7] = -5;
  EXPECT_EQ(out[1].As<float>(), u);
}

TEST(OpsOnPlugin, DotGeneralBatched) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2, 2, 3}});
  auto y = b.Parameter({DType::F32, {2, 3, 2}});
  ir::DotDims d;
  d.lhs_batch = {0};
  d.rhs_batch = {0};
  d.lhs_contract = {2};
  d.rhs_contract = {1};
  auto g = b.Build({b.DotGeneral(x, y, d)});
  const auto xv = Iota(12), yv = Iota(12);
  std::vector<float> want(8, 0);
  for (int bt = 0; bt < 2; ++bt)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int k = 0; k < 3; ++k) want[bt * 4 + i * 2 + j] += xv[bt * 6 + i * 3 + k] * yv[bt * 6 + k * 2 + j];
  ExpectFloats(RunGraph(g, {F32({2, 2, 3}, xv), F32({2, 3, 2}, yv)})[0].As<float>(), want);
}

// bfloat16 operands with a float32 result: the sum unrounded. 1 + 2^-9 * 3
// needs 10 significant bits; in bfloat16 (8) it would round to 1.
TEST(OpsOnPlugin, DotGeneralBfloat16WithFloat32Result) {
  ir::Builder b;
  auto x = b.Convert(b.Parameter({DType::F32, {1, 4}}), DType::BF16);
  auto y = b.Convert(b.Parameter({DType::F32, {4, 1}}), DType::BF16);
  ir::DotDims d;
  d.lhs_contract = {1};
  d.rhs_contract = {0};
  auto g = b.Build({b.DotGeneral(x, y, d, ir::Precision::Default, true)});
  const float e = 1.0f / 512;
  ExpectFloats(RunGraph(g, {F32({1, 4}, {1, e, e, e}), F32({4, 1}, {1, 1, 1, 1})})[0].As<float>(), {1 + 3 * e}, 0);
}

TEST(OpsOnPlugin, ReduceEveryKind) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2, 3}});
  auto m = b.Parameter({DType::Bool, {2, 3}});
  auto zero = b.ScalarConstant(DType::F32, 0), one = b.ScalarConstant(DType::F32, 1);
  auto ninf = b.ScalarConstant(DType::F32, -INFINITY), pinf = b.ScalarConstant(DType::F32, INFINITY);
  auto g = b.Build({b.Reduce(x, zero, {1}, ir::ReduceKind::Sum), b.Reduce(x, one, {0}, ir::ReduceKind::Prod),
                    b.Reduce(x, ninf, {0, 1}, ir::ReduceKind::Max), b.Reduce(x, pinf, {1}, ir::ReduceKind::Min),
                    b.Reduce(m, b.ScalarConstant(DType::Bool, 1), {1}, ir::ReduceKind::And),
                    b.Reduce(m, b.ScalarConstant(DType::Bool, 0), {1}, ir::ReduceKind::Or)});
  auto out = RunGraph(g, {F32({2, 3}, {1, -2, 3, 4, 5, -6}), Host::Of<uint8_t>(DType::Bool, {2, 3}, {1, 1, 1, 0, 1, 0})});
  ExpectFloats(out[0].As<float>(), {2, 3});
  ExpectFloats(out[1].As<float>(), {4, -10, -18});
  ExpectFloats(out[2].As<float>(), {5});
  ExpectFloats(out[3].As<float>(), {-2, -6});
  EXPECT_EQ(out[4].As<uint8_t>(), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(out[5].As<uint8_t>(), (std::vector<uint8_t>{1, 1}));
}

TEST(OpsOnPlugin, MaxPoolForwardAndSelectAndScatterBackward) {
  // 1x1x4x4 image, 2x2 windows, stride 2.
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {1, 1, 4, 4}});
  auto grad = b.Parameter({DType::F32, {1, 1, 2, 2}});
  auto pooled = b.ReduceWindow(x, b.ScalarConstant(DType::F32, -INFINITY), ir::ReduceKind::Max, {1, 1, 2, 2},
                               {1, 1, 2, 2}, {}, {}, {0, 0, 0, 0}, {0, 0, 0, 0});
  auto avg_sum = b.ReduceWindow(x, b.ScalarConstant(DType::F32, 0), ir::ReduceKind::Sum, {1, 1, 3, 3},
                                {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {0, 0, 1, 1}, {0, 0, 1, 1});
  auto back = b.SelectAndScatter(x, grad, b.ScalarConstant(DType::F32, 0), {1, 1, 2, 2}, {1, 1, 2, 2},
                                 {0, 0, 0, 0}, {0, 0, 0, 0});
  auto g = b.Build({pooled, avg_sum, back});
  const std::vector<float> xv = {1, 5, 2, 0, 3, 4, 8, 1, 0, 0, 1, 1, 9, 2, 1, 7};
  auto out = RunGraph(g, {F32({1, 1, 4, 4}, xv), F32({1, 1, 2, 2}, {10, 20, 30, 40})});
  ExpectFloats(out[0].As<float>(), {5, 8, 9, 7});
  // 3x3 sums with zero padding, computed directly.
  std::vector<float> sums(16, 0);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      for (int di = -1; di <= 1; ++di)
        for (int dj = -1; dj <= 1; ++dj)
          if (i + di >= 0 && i + di < 4 && j + dj >= 0 && j + dj < 4) sums[i * 4 + j] += xv[(i + di) * 4 + j + dj];
  ExpectFloats(out[1].As<float>(), sums);
  std::vector<float> want(16, 0);
  want[1] = 10;   // max of top-left window is 5 at (0,1)
  want[6] = 20;   // 8 at (1,2)
  want[12] = 30;  // 9 at (3,0)
  want[15] = 40;  // 7 at (3,3)
  ExpectFloats(out[2].As<float>(), want);
}

TEST(OpsOnPlugin, Convolution2dMatchesDirectLoop) {
  const int n = 1, ci = 2, h = 4, w = 4, co = 3, kh = 3, kw = 3;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> xv(n * ci * h * w), kv(co * ci * kh * kw);
  for (auto& v : xv) v = u(gen);
  for (auto& v : kv) v = u(gen);
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {n, ci, h, w}});
  auto k = b.Parameter({DType::F32, {co, ci, kh, kw}});
  ir::ConvDims d;
  d.in_spatial = {2, 3};
  d.k_spatial = {2, 3};
  d.out_spatial = {2, 3};
  auto y = b.Convolution(x, k, d, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 1);
  auto out = RunGraph(b.Build({y}), {F32({n, ci, h, w}, xv), F32({co, ci, kh, kw}, kv)});
  std::vector<float> want(co * h * w, 0);
  for (int o = 0; o < co; ++o)
    for (int i = 0; i < h; ++i)
      for (int j = 0; j < w; ++j)
        for (int c = 0; c < ci; ++c)
          for (int a = 0; a < kh; ++a)
            for (int e = 0; e < kw; ++e) {
              const int yi = i + a - 1, xj = j + e - 1;
              if (yi < 0 || yi >= h || xj < 0 || xj >= w) continue;
              want[(o * h + i) * w + j] += xv[(c * h + yi) * w + xj] * kv[((o * ci + c) * kh + a) * kw + e];
            }
  EXPECT_EQ(out[0].shape.dims, (std::vector<int64_t>{n, co, h, w}));
  ExpectFloats(out[0].As<float>(), want, 1e-5f);
}

TEST(OpsOnPlugin, GatherRowsAndScatterAdd) {
  // Embedding-style gather of rows, and its gradient (scatter-add of rows).
  ir::Builder b;
  auto table = b.Parameter({DType::F32, {4, 2}});
  auto idx = b.Parameter({DType::I64, {3, 1}});
  ir::GatherDims gd;
  gd.offset_dims = {1};
  gd.collapsed_slice_dims = {0};
  gd.start_index_map = {0};
  gd.index_vector_dim = 1;
  auto rows = b.Gather(table, idx, gd, {1, 2});
  ir::ScatterDims sd;
  sd.update_window_dims = {1};
  sd.inserted_window_dims = {0};
  sd.scatter_dims_to_operand_dims = {0};
  sd.index_vector_dim = 1;
  auto upd = b.Parameter({DType::F32, {3, 2}});
  auto added = b.Scatter(b.Full(DType::F32, {4, 2}, 0), idx, upd, sd, false);
  auto replaced = b.Scatter(table, idx, upd, sd, true);
  auto g = b.Build({rows, added, replaced});
  auto out = RunGraph(g, {F32({4, 2}, Iota(8)), Host::Of<int64_t>(DType::I64, {3, 1}, {2, 0, 2}),
                     F32({3, 2}, {1, 2, 3, 4, 5, 6})});
  ExpectFloats(out[0].As<float>(), {4, 5, 0, 1, 4, 5});
  ExpectFloats(out[1].As<float>(), {3, 4, 0, 0, 6, 8, 0, 0});
  auto r = out[2].As<float>();
  EXPECT_EQ(r[0], 3);
  EXPECT_EQ(r[2], 2);  // row 1 untouched
  EXPECT_TRUE((r[4] == 1 && r[5] == 2) || (r[4] == 5 && r[5] == 6));  // duplicate index: one wins
}

TEST(OpsOnPlugin, SortValuesWithIndicesBothDirections) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2, 4}});
  auto ids = b.Iota({DType::I32, {2, 4}}, 1);
  auto asc = b.Sort({x, ids}, 1, false);
  auto desc = b.Sort({x}, 1, true);
  auto g = b.Build({asc[0], asc[1], desc[0]});
  auto out = RunGraph(g, {F32({2, 4}, {3, 1, 2, 1, -1, 5, 0, 4})});
  ExpectFloats(out[0].As<float>(), {1, 1, 2, 3, -1, 0, 4, 5});
  EXPECT_EQ(out[1].As<int32_t>(), (std::vector<int32_t>{1, 3, 2, 0, 0, 2, 3, 1}));  // stable
  ExpectFloats(out[2].As<float>(), {3, 2, 1, 1, 5, 4, 0, -1});
}

TEST(OpsOnPlugin, TopKTakesTheLargestInTotalOrderTiesLowestIndexFirst) {
  const float nan = std::nanf("");
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2, 6}});
  auto top = b.TopK(x, 3);
  auto g = b.Build({top[0], top[1]});
  auto out = RunGraph(g, {F32({2, 6}, {1, 7, 3, 7, 0, 2, -0.0f, -nan, 0.0f, nan, -1, INFINITY})});
  auto v = out[0].As<float>();
  EXPECT_EQ(out[1].As<int32_t>(), (std::vector<int32_t>{1, 3, 2, 3, 5, 2}));  // +NaN, then inf, +0.0 over -0.0
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v[2], 3);
  EXPECT_TRUE(std::isnan(v[3]));
}

TEST(OpsOnPlugin, SortPutsNanAboveInfAndKeepsTiesInOrder) {
  const float nan = std::nanf("");
  const float inf = INFINITY;
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {6}});
  auto ids = b.Iota({DType::I32, {6}}, 0);
  auto asc = b.Sort({x, ids}, 0, false);
  auto desc = b.Sort({x, ids}, 0, true);
  auto g = b.Build({asc[1], desc[1]});
  auto out = RunGraph(g, {F32({6}, {1, nan, 0.0f, -inf, -0.0f, inf})});
  // ascending: -inf, 0, -0 (a tie: input order), 1, inf, nan
  EXPECT_EQ(out[0].As<int32_t>(), (std::vector<int32_t>{3, 2, 4, 0, 5, 1}));
  EXPECT_EQ(out[1].As<int32_t>(), (std::vector<int32_t>{1, 5, 0, 2, 4, 3}));
}

TEST(OpsOnPlugin, RngBitGeneratorIsDeterministicAndAdvances) {
  ir::Builder b;
  auto state = b.Parameter({DType::U64, {2}});
  auto r = b.RngBitGenerator(state, {DType::U32, {1000}});
  auto g = b.Build({r[0], r[1]});
  auto key = Host::Of<uint64_t>(DType::U64, {2}, {42, 0});
  auto a = RunGraph(g, {key});
  auto again = RunGraph(g, {key});
  EXPECT_EQ(a[1].bytes, again[1].bytes);
  EXPECT_NE(a[0].As<uint64_t>(), key.As<uint64_t>());
  auto next = RunGraph(g, {a[0]});
  EXPECT_NE(next[1].bytes, a[1].bytes);
  // Roughly uniform: the mean of 1000 u32 draws is near 2^31.
  double mean = 0;
  for (uint32_t v : a[1].As<uint32_t>()) mean += v / 1000.0;
  EXPECT_NEAR(mean / 4294967296.0, 0.5, 0.05);
}

TEST(OpsOnPlugin, MultipleResultsAndPassThroughParameter) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {2}});
  auto y = b.Parameter({DType::I64, {}});
  auto g = b.Build({y, x, b.Binary(Op::Add, x, x)});
  auto out = RunGraph(g, {F32({2}, {1, 2}), Host::Of<int64_t>(DType::I64, {}, {9})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].As<int64_t>(), (std::vector<int64_t>{9}));
  ExpectFloats(out[1].As<float>(), {1, 2});
  ExpectFloats(out[2].As<float>(), {2, 4});
}

TEST(OpsOnPlugin, CallsOfGraphsRunAsTheirBodies) {
  // f(a, b) = (a * b, a + b); g(a) = f(a, a)[1] + 1 calls f: a call inside a called graph.
  ir::Builder fb;
  auto fa = fb.Parameter({DType::F32, {3}});
  auto fbv = fb.Parameter({DType::F32, {3}});
  auto f = std::make_shared<const ir::Graph>(fb.Build({fb.Binary(Op::Mul, fa, fbv), fb.Binary(Op::Add, fa, fbv)}));
  ir::Builder gb;
  auto ga = gb.Parameter({DType::F32, {3}});
  auto g = std::make_shared<const ir::Graph>(
      gb.Build({gb.Binary(Op::Add, gb.Call(f, {ga, ga})[1], gb.Full(DType::F32, {3}, 1))}));
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {3}});
  auto y = b.Parameter({DType::F32, {3}});
  auto first = b.Call(f, {x, y});
  auto second = b.Call(f, {first[0], x});  // the same graph twice: one function
  auto third = b.Call(g, {y});
  const ir::Graph main = b.Build({first[1], second[0], third[0]});
  const std::string text = ir::PrintStableHlo(main);
  EXPECT_NE(text.find("func.func private @call0("), std::string::npos) << text;
  EXPECT_NE(text.find("func.func private @call1("), std::string::npos) << text;
  EXPECT_EQ(text.find("@call2"), std::string::npos) << text;  // f and g, once each (g calls the same f)
  auto out = RunGraph(main, {F32({3}, {1, 2, 3}), F32({3}, {4, 5, 6})});
  ASSERT_EQ(out.size(), 3u);
  ExpectFloats(out[0].As<float>(), {5, 7, 9});          // x + y
  ExpectFloats(out[1].As<float>(), {4, 20, 54});        // (x * y) * x
  ExpectFloats(out[2].As<float>(), {9, 11, 13});        // y + y + 1
}

TEST(OpsOnPlugin, EmptyTensors) {
  ir::Builder b;
  auto x = b.Parameter({DType::F32, {0, 3}});
  auto s = b.Reduce(x, b.ScalarConstant(DType::F32, 0), {0}, ir::ReduceKind::Sum);
  auto g = b.Build({b.Binary(Op::Add, x, x), s});
  auto out = RunGraph(g, {F32({0, 3}, {})});
  EXPECT_EQ(out[0].shape.dims, (std::vector<int64_t>{0, 3}));
  ExpectFloats(out[1].As<float>(), {0, 0, 0});
}


// Complex parts and a DFT against a direct sum on the host: RFFT, then
// IRFFT back (XLA's inverse divides by n), FFT of the complex spectrum, and
// the complex64 <-> float32 reinterpretation (exact, NaN and -0.0 included).
TEST(OpsOnPlugin, ComplexPartsAndFftMatchADirectDft) {
  const int64_t n = 6;
  const std::vector<float> x = {1.f, -2.f, 0.5f, 3.f, -1.5f, 2.25f};
  ir::Builder b;
  auto p = b.Parameter({DType::F32, {n}});
  auto spec = b.Fft(p, ir::FftType::RFFT, {n});
  auto back = b.Fft(spec, ir::FftType::IRFFT, {n});
  auto z = b.Complex(p, b.Unary(Op::Neg, p));
  auto full = b.Fft(z, ir::FftType::FFT, {n});
  auto g = b.Build({b.Real(spec), b.Imag(spec), back, b.Real(full), b.Imag(full), b.Unary(Op::Abs, z)});
  auto out = RunGraph(g, {F32({n}, x)});
  std::vector<float> re, im, fre, fim, mag;
  for (int64_t k = 0; k < n; ++k) {
    double sr = 0, si = 0, tr = 0, ti = 0;
    for (int64_t t = 0; t < n; ++t) {
      const double a = -2 * M_PI * double(k * t) / double(n);
      sr += x[t] * std::cos(a);
      si += x[t] * std::sin(a);
      // (x - ix) e^{ia} = x (cos a + sin a) + i x (sin a - cos a)
      tr += x[t] * (std::cos(a) + std::sin(a));
      ti += x[t] * (std::sin(a) - std::cos(a));
    }
    if (k <= n / 2) {
      re.push_back(float(sr));
      im.push_back(float(si));
    }
    fre.push_back(float(tr));
    fim.push_back(float(ti));
    mag.push_back(float(std::sqrt(2.0) * std::fabs(x[k])));
  }
  EXPECT_EQ(out[0].shape, (Shape{DType::F32, {n / 2 + 1}}));
  ExpectFloats(out[0].As<float>(), re, 1e-5f);
  ExpectFloats(out[1].As<float>(), im, 1e-5f);
  ExpectFloats(out[2].As<float>(), x, 1e-5f);
  ExpectFloats(out[3].As<float>(), fre, 1e-5f);
  ExpectFloats(out[4].As<float>(), fim, 1e-5f);
  ExpectFloats(out[5].As<float>(), mag, 1e-6f);

  ir::Builder c;
  const std::vector<float> bits = {1.5f, -0.f, NAN, -INFINITY, 1e-40f, 3.f};
  auto q = c.Parameter({DType::F32, {6}});
  auto as_complex = c.Bitcast(q, DType::C64);
  auto h = c.Build({c.Bitcast(as_complex, DType::F32), c.Bitcast(as_complex, DType::U32)});
  auto round = RunGraph(h, {F32({6}, bits)});
  EXPECT_EQ(round[0].bytes, F32({6}, bits).bytes);
  EXPECT_EQ(round[1].bytes, F32({6}, bits).bytes);
}

// Cholesky, a triangular solve and the custom calls XLA's CPU compiler
// expands (Qr, ProductOfElementaryHouseholderReflectors, Eigh), on a 3x3
// symmetric positive-definite matrix checked against identities computed here.
TEST(OpsOnPlugin, LinearAlgebraOpsAndCustomCalls) {
  const std::vector<float> spd = {4, 2, 0.4f, 2, 5, 1, 0.4f, 1, 3};
  auto matmul = [](const std::vector<float>& x, const std::vector<float>& y, bool tx) {
    std::vector<float> z(9, 0);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 3; ++k) z[i * 3 + j] += (tx ? x[k * 3 + i] : x[i * 3 + k]) * y[k * 3 + j];
    return z;
  };
  ir::Builder b;
  auto a = b.Parameter({DType::F32, {3, 3}});
  auto l = b.Cholesky(a, true);
  auto inv_l = b.TriangularSolve(l, b.Iota({DType::F32, {3, 3}}, 0), true, true, false, false);
  auto qr = b.CustomCall("Qr", {a}, {{DType::F32, {3, 3}}, {DType::F32, {3}}});
  auto q = b.CustomCall("ProductOfElementaryHouseholderReflectors", {qr[0], qr[1]}, {{DType::F32, {3, 3}}});
  auto eig = b.CustomCall("Eigh", {a}, {{DType::F32, {3, 3}}, {DType::F32, {3}}}, "1,1,100,1e-06");
  auto out = RunGraph(b.Build({l, inv_l, qr[0], q[0], eig[0], eig[1]}), {F32({3, 3}, spd)});
  std::vector<float> lower = out[0].As<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j) lower[i * 3 + j] = 0;
  std::vector<float> lt(9);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) lt[i * 3 + j] = lower[j * 3 + i];
  ExpectFloats(matmul(lower, lt, false), spd, 1e-5f);  // L L^T = A
  // L X = iota (row index in every column): L times the solution gives it back.
  ExpectFloats(matmul(lower, out[1].As<float>(), false), {0, 0, 0, 1, 1, 1, 2, 2, 2}, 1e-5f);
  std::vector<float> r = out[2].As<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < i; ++j) r[i * 3 + j] = 0;
  ExpectFloats(matmul(out[3].As<float>(), r, false), spd, 1e-5f);                         // Q R = A
  ExpectFloats(matmul(out[3].As<float>(), out[3].As<float>(), true), {1, 0, 0, 0, 1, 0, 0, 0, 1}, 1e-5f);  // Q^T Q = I
  // A V = V diag(w), eigenvalues ascending.
  const std::vector<float> v = out[4].As<float>(), w = out[5].As<float>();
  std::vector<float> vw(9);
  for (int i = 0; i < 9; ++i) vw[i] = v[i] * w[i % 3];
  ExpectFloats(matmul(spd, v, false), vw, 1e-5f);
  EXPECT_LT(w[0], w[1]);
  EXPECT_LT(w[1], w[2]);
}

}  // namespace
}  // namespace tpj
