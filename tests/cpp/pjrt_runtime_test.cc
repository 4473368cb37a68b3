// Buffers, compile, execute (1 and 4 devices), collectives, donation,
// serialization and bad input, against a real plugin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
using ir::Shape;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

std::unique_ptr<pjrt::Buffer> Upload(const std::vector<float>& v, const std::vector<int64_t>& dims,
                                     int device = 0) {
  auto c = testing::SharedClient();
  return c->BufferFromHost(v.data(), pjrt_abi::kF32, dims, c->addressable_device_ids()[device]);
}

std::vector<float> Download(const pjrt::Buffer& b) {
  std::vector<float> out(static_cast<size_t>(b.element_count()));
  b.ToHost(out.data(), out.size() * sizeof(float));
  return out;
}

// relu(x @ w + b), computed on the host as the oracle.
std::vector<float> MlpOracle(const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& b, int n, int k, int m) {
  std::vector<float> out(n * m);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < m; ++j) {
      double acc = b[j];
      for (int t = 0; t < k; ++t) acc += double(x[i * k + t]) * w[t * m + j];
      out[i * m + j] = std::max(0.f, float(acc));
    }
  }
  return out;
}

ir::Graph MlpGraph(int n, int k, int m, int replicas = 1, bool all_reduce = false) {
  ir::Builder b(replicas);
  auto x = b.Parameter({DType::F32, {n, k}});
  auto w = b.Parameter({DType::F32, {k, m}});
  auto bias = b.Parameter({DType::F32, {m}});
  ir::DotDims dd;
  dd.lhs_contract = {1};
  dd.rhs_contract = {0};
  auto y = b.DotGeneral(x, w, dd);
  y = b.Binary(ir::Op::Add, y, b.BroadcastInDim(bias, {n, m}, {1}));
  y = b.Binary(ir::Op::Max, y, b.Full(DType::F32, {n, m}, 0.0));
  if (all_reduce) y = b.AllReduce(y, ir::ReduceKind::Sum);
  return b.Build({y});
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

TEST(Runtime, MatmulBiasReluOnOneDevice) {
  auto c = testing::SharedClient();
  const int n = 8, k = 16, m = 4;
  auto prog = runtime::CompileGraph(*c, MlpGraph(n, k, m), {c->addressable_device_ids()[0]});
  auto x = Random(n * k, 1), w = Random(k * m, 2), bias = Random(m, 3);
  auto bx = Upload(x, {n, k}), bw = Upload(w, {k, m}), bb = Upload(bias, {m});
  auto out = prog.executable->Execute({bx.get(), bw.get(), bb.get()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->dims(), (std::vector<int64_t>{n, m}));
  ExpectNear(Download(*out[0]), MlpOracle(x, w, bias, n, k, m));
}

TEST(Runtime, ReplicatedOnEveryDeviceWithAllReduce) {
  auto c = testing::SharedClient();
  const auto& ids = c->addressable_device_ids();
  const int r = static_cast<int>(ids.size());
  const int n = 4, k = 8, m = 3;
  auto prog = runtime::CompileGraph(*c, MlpGraph(n, k, m, r, /*all_reduce=*/true), ids);
  std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> owned(r);
  std::vector<std::vector<pjrt::Buffer*>> args(r);
  std::vector<float> sum(n * m, 0.f);
  auto w = Random(k * m, 7), bias = Random(m, 8);
  for (int i = 0; i < r; ++i) {
    auto x = Random(n * k, 100 + i);
    auto local = MlpOracle(x, w, bias, n, k, m);
    for (size_t j = 0; j < sum.size(); ++j) sum[j] += local[j];
    owned[i].push_back(Upload(x, {n, k}, i));
    owned[i].push_back(Upload(w, {k, m}, i));
    owned[i].push_back(Upload(bias, {m}, i));
    for (auto& b : owned[i]) args[i].push_back(b.get());
  }
  auto out = prog.executable->ExecuteReplicated(args);
  ASSERT_EQ(out.size(), static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) {
    EXPECT_EQ(out[i][0]->device_id(), ids[i]);
    ExpectNear(Download(*out[i][0]), sum);
  }
}

TEST(Runtime, ManyReplicatedLaunchesInFlightComplete) {
  // Launch a collective program many times without reading results in
  // between: launches must not deadlock the plugin's thread pool.
  auto c = testing::SharedClient();
  const auto& ids = c->addressable_device_ids();
  const int r = static_cast<int>(ids.size());
  const int n = 64, k = 256, m = 512;
  auto prog = runtime::CompileGraph(*c, MlpGraph(n, k, m, r, /*all_reduce=*/true), ids);
  std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> owned(r);
  std::vector<std::vector<pjrt::Buffer*>> args(r);
  auto x = Random(n * k, 1), w = Random(k * m, 2), bias = Random(m, 3);
  for (int i = 0; i < r; ++i) {
    owned[i].push_back(Upload(x, {n, k}, i));
    owned[i].push_back(Upload(w, {k, m}, i));
    owned[i].push_back(Upload(bias, {m}, i));
    for (auto& b : owned[i]) args[i].push_back(b.get());
  }
  std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> out;
  for (int launch = 0; launch < 50; ++launch) out = prog.executable->ExecuteReplicated(args);
  auto want = MlpOracle(x, w, bias, n, k, m);
  for (auto& v : want) v *= float(r);
  ExpectNear(Download(*out[r - 1][0]), want, 1e-4f);
}

TEST(Runtime, AllGatherAndReduceScatterAcrossReplicas) {
  auto c = testing::SharedClient();
  const auto& ids = c->addressable_device_ids();
  const int r = static_cast<int>(ids.size());
  ir::Builder b(r);
  auto x = b.Parameter({DType::F32, {r}});
  auto gathered = b.AllGather(x, 0);
  auto scattered = b.ReduceScatter(x, 0, ir::ReduceKind::Sum);
  auto prog = runtime::CompileGraph(*c, b.Build({gathered, scattered}), ids);
  std::vector<std::unique_ptr<pjrt::Buffer>> owned;
  std::vector<std::vector<pjrt::Buffer*>> args(r);
  std::vector<std::vector<float>> host(r);
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < r; ++j) host[i].push_back(float(10 * i + j));
    owned.push_back(Upload(host[i], {r}, i));
    args[i].push_back(owned.back().get());
  }
  auto out = prog.executable->ExecuteReplicated(args);
  for (int i = 0; i < r; ++i) {
    std::vector<float> want_gather;
    for (int j = 0; j < r; ++j) want_gather.push_back(host[j][0]);
    // all_gather concatenates each replica's [r] vector: replica j's block.
    auto g = Download(*out[i][0]);
    ASSERT_EQ(g.size(), size_t(r * r));
    for (int j = 0; j < r; ++j) EXPECT_EQ(g[j * r], host[j][0]);
    // reduce_scatter: replica i gets the sum over replicas of element i.
    float s = 0;
    for (int j = 0; j < r; ++j) s += host[j][i];
    ExpectNear(Download(*out[i][1]), {s});
  }
}

// `values` holds 4 scalars of T; complex types use 2 T per element.
template <class T>
void RoundTrip(pjrt_abi::BufferType type, std::vector<T> values) {
  auto c = testing::SharedClient();
  const int64_t elements = static_cast<int64_t>(values.size() * sizeof(T) / pjrt::ByteWidth(type));
  const std::vector<int64_t> dims{2, elements / 2};
  auto b = c->BufferFromHost(values.data(), type, dims, c->addressable_device_ids()[0]);
  EXPECT_EQ(b->element_type(), type);
  EXPECT_EQ(b->dims(), dims);
  EXPECT_GE(b->on_device_size(), values.size() * sizeof(T));
  std::vector<T> back(values.size());
  b->ToHost(back.data(), back.size() * sizeof(T));
  EXPECT_EQ(0, std::memcmp(back.data(), values.data(), values.size() * sizeof(T)))
      << pjrt::TypeName(type);
}

TEST(Runtime, BuffersRoundTripEveryDtype) {
  RoundTrip<uint8_t>(pjrt_abi::kPred, {0, 1, 1, 0});
  RoundTrip<int8_t>(pjrt_abi::kS8, {-128, 0, 5, 127});
  RoundTrip<int16_t>(pjrt_abi::kS16, {-32768, 1, 2, 32767});
  RoundTrip<int32_t>(pjrt_abi::kS32, {-7, 0, 1 << 30, 3});
  RoundTrip<int64_t>(pjrt_abi::kS64, {-(int64_t(1) << 62), 0, int64_t(1) << 40, 9});
  RoundTrip<uint8_t>(pjrt_abi::kU8, {0, 255, 7, 9});
  RoundTrip<uint16_t>(pjrt_abi::kU16, {0, 65535, 7, 9});
  RoundTrip<uint32_t>(pjrt_abi::kU32, {0, 4000000000u, 7, 9});
  RoundTrip<uint64_t>(pjrt_abi::kU64, {0, ~uint64_t(0), 7, 9});
  RoundTrip<uint16_t>(pjrt_abi::kF16, {0x3C00, 0xC000, 0x7BFF, 0x0001});
  RoundTrip<uint16_t>(pjrt_abi::kBF16, {0x3F80, 0xC000, 0x7F7F, 0x0001});
  RoundTrip<float>(pjrt_abi::kF32, {1.5f, -2.25f, 3e38f, 1e-40f});
  RoundTrip<double>(pjrt_abi::kF64, {1.5, -2.25, 1e300, 5e-324});
  RoundTrip<float>(pjrt_abi::kC64, {1.f, 2.f, -3.f, 4.f});  // 2 complex numbers
  RoundTrip<double>(pjrt_abi::kC128, {1.0, 2.0, -3.0, 4.5});
}

TEST(Runtime, EmptyAndScalarBuffers) {
  auto c = testing::SharedClient();
  float one = 3.5f;
  auto s = c->BufferFromHost(&one, pjrt_abi::kF32, {}, c->addressable_device_ids()[0]);
  EXPECT_EQ(s->dims().size(), 0u);
  ExpectNear(Download(*s), {3.5f});
  auto e = c->BufferFromHost(nullptr, pjrt_abi::kF32, {0, 3}, c->addressable_device_ids()[0]);
  EXPECT_EQ(e->element_count(), 0);
  EXPECT_TRUE(Download(*e).empty());
}

TEST(Runtime, DonationConsumesTheInputAndKeepsTheResultCorrect) {
  auto c = testing::SharedClient();
  ir::Builder b;
  auto p = b.Parameter({DType::F32, {4}});
  auto y = b.Binary(ir::Op::Mul, p, b.Full(DType::F32, {4}, 2.0));
  auto prog = runtime::CompileGraph(*c, b.Build({y}, {{0, 0}}), {c->addressable_device_ids()[0]});
  EXPECT_NE(prog.stablehlo.find("tf.aliasing_output = 0 : i32"), std::string::npos);
  auto in = Upload({1, 2, 3, 4}, {4});
  auto out = prog.executable->Execute({in.get()});
  ExpectNear(Download(*out[0]), {2, 4, 6, 8});
  EXPECT_TRUE(in->is_deleted());
  EXPECT_THROW(Download(*in), pjrt::Error);
  // A deleted buffer is refused as an argument, with our message.
  try {
    prog.executable->Execute({in.get()});
    FAIL();
  } catch (const pjrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("deleted buffer"), std::string::npos) << e.what();
  }
}

TEST(Runtime, SerializeThenLoadInAFreshClient) {
  auto c = testing::SharedClient();
  const int n = 2, k = 3, m = 2;
  auto prog = runtime::CompileGraph(*c, MlpGraph(n, k, m), {c->addressable_device_ids()[0]});
  const std::string bytes = prog.executable->Serialize();
  ASSERT_FALSE(bytes.empty());

  auto fresh = pjrt::Client::Create(pjrt::Plugin::Load(testing::PluginPath()));
  auto loaded = fresh->Deserialize(bytes, prog.executable->options(), prog.executable->arg_specs());
  auto x = Random(n * k, 11), w = Random(k * m, 12), bias = Random(m, 13);
  const int dev = fresh->addressable_device_ids()[0];
  auto bx = fresh->BufferFromHost(x.data(), pjrt_abi::kF32, {n, k}, dev);
  auto bw = fresh->BufferFromHost(w.data(), pjrt_abi::kF32, {k, m}, dev);
  auto bb = fresh->BufferFromHost(bias.data(), pjrt_abi::kF32, {m}, dev);
  auto out = loaded->Execute({bx.get(), bw.get(), bb.get()});
  ExpectNear(Download(*out[0]), MlpOracle(x, w, bias, n, k, m));
}

TEST(Runtime, GarbageSerializedExecutableIsAnError) {
  auto c = testing::SharedClient();
  EXPECT_THROW(c->Deserialize("definitely not an executable", {}), pjrt::Error);
}

TEST(Runtime, ProgramThatDoesNotParseShowsPluginMessageAndLine) {
  auto c = testing::SharedClient();
  const std::string text =
      "module {\n  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
      "    %0 = \"stablehlo.no_such_op\"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>\n"
      "    \"func.return\"(%0) : (tensor<4xf32>) -> ()\n  }\n}\n";
  try {
    runtime::CompileText(*c, text, {});
    FAIL() << "expected a compile error";
  } catch (const pjrt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("PJRT_Client_Compile"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no_such_op"), std::string::npos) << msg;
    // The offending op, quoted from our program text.
    EXPECT_NE(msg.find("in StableHLO line 3: %0 = \"stablehlo.no_such_op\"(%arg0)"), std::string::npos)
        << msg;
  }
}

TEST(Runtime, WrongArgumentCountAndShapeAreOurErrors) {
  auto c = testing::SharedClient();
  auto prog = runtime::CompileGraph(*c, MlpGraph(2, 3, 2), {c->addressable_device_ids()[0]});
  auto x = Upload(Random(6, 1), {2, 3});
  auto w = Upload(Random(6, 2), {3, 2});
  auto bad = Upload(Random(6, 3), {6});
  try {
    prog.executable->Execute({x.get(), w.get()});
    FAIL();
  } catch (const pjrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes 3 argument(s), got 2"), std::string::npos) << e.what();
  }
  try {
    prog.executable->Execute({x.get(), w.get(), bad.get()});
    FAIL();
  } catch (const pjrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 2 has type f32[6] but the program expects f32[2]"),
              std::string::npos)
        << e.what();
  }
  // Wrong device for the replica.
  auto far = Upload({1, 2}, {2}, 1);
  try {
    prog.executable->Execute({x.get(), w.get(), far.get()});
    FAIL();
  } catch (const pjrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is on device"), std::string::npos) << e.what();
  }
}

TEST(Runtime, PluginCatchesWrongArgumentsWithoutSpecs) {
  // Without our specs the plugin itself must refuse, with an error, not a crash.
  auto c = testing::SharedClient();
  auto graph = MlpGraph(2, 3, 2);
  auto exe = c->Compile(ir::PrintStableHlo(graph), {});
  auto x = Upload(Random(6, 1), {2, 3});
  EXPECT_THROW(exe->Execute({x.get()}), pjrt::Error);
}

TEST(Runtime, CopyToAnotherDevice) {
  auto c = testing::SharedClient();
  if (c->addressable_device_ids().size() < 2) GTEST_SKIP() << "needs 2 devices";
  auto a = Upload({1, 2, 3}, {3}, 0);
  auto b = a->CopyToDevice(c->addressable_device_ids()[1]);
  EXPECT_EQ(b->device_id(), c->addressable_device_ids()[1]);
  ExpectNear(Download(*b), {1, 2, 3});
}

}  // namespace
}  // namespace tpj
