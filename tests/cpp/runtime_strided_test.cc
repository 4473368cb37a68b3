// Strided views over flat storages (runtime/strided.cc): reads and writes
// compiled and run on the plugin, compared with the same addressing done on
// the host; and which plan each view takes.
#include <gtest/gtest.h>

#include <numeric>

#include "ir/graph.h"
#include "pjrt/executable.h"
#include "runtime/program.h"
#include "runtime/strided.h"
#include "test_plugin.h"

namespace tpj::runtime {
namespace {

std::vector<float> RunF32(const ir::Graph& g, const std::vector<std::vector<float>>& inputs) {
  auto c = testing::SharedClient();
  const int dev = c->addressable_device_ids()[0];
  auto prog = CompileGraph(*c, g, {dev});
  std::vector<std::unique_ptr<pjrt::Buffer>> owned;
  std::vector<pjrt::Buffer*> args;
  for (const auto& v : inputs) {
    owned.push_back(c->BufferFromHost(v.data(), pjrt_abi::kF32, {static_cast<int64_t>(v.size())}, dev));
    args.push_back(owned.back().get());
  }
  auto out = prog.executable->Execute(args);
  std::vector<float> r(static_cast<size_t>(out[0]->element_count()));
  out[0]->ToHost(r.data(), r.size() * sizeof(float));
  return r;
}

// Host reference: the view's elements in row-major order.
std::vector<float> HostRead(const std::vector<float>& flat, const StridedView& v) {
  int64_t n = 1;
  for (int64_t s : v.sizes) n *= s;
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, addr = v.offset;
    for (size_t k = v.sizes.size(); k-- > 0;) {
      addr += (rem % v.sizes[k]) * v.strides[k];
      rem /= v.sizes[k];
    }
    out.push_back(flat[addr]);
  }
  return out;
}

std::vector<float> Iota(int64_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  return v;
}

struct Case {
  StridedView view;
  bool slice_plan;
};

const int64_t kN = 48;
const std::vector<Case> kCases = {
    {{{4, 12}, {12, 1}, 0}, true},        // whole storage
    {{{12, 4}, {1, 12}, 0}, true},        // transposed
    {{{3, 5}, {12, 2}, 1}, true},         // strided slice with offset
    {{{3, 5}, {12, 2}, 7}, false},        // rows that run past 12: would carry
    {{{2, 3, 4}, {1, 16, 4}, 0}, true},   // permuted
    {{{4, 3}, {0, 1}, 5}, true},          // expanded (stride 0)
    {{{1, 6}, {99, 1}, 40}, true},        // size-1 dim with any stride
    {{{5, 6}, {3, 1}, 0}, false},         // overlapping windows (unfold)
    {{{4, 4}, {11, 2}, 1}, false},        // strides that do not divide
    {{{}, {}, 17}, true},                 // one element
};

TEST(Strided, ReadsMatchHostAddressing) {
  const std::vector<float> flat = Iota(kN);
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::PrintToString(c.view.sizes) + " strides " + ::testing::PrintToString(c.view.strides));
    EXPECT_EQ(UsesSlicePlan(c.view, kN), c.slice_plan);
    ir::Builder b2;
    auto p2 = b2.Parameter({ir::DType::F32, {kN}});
    ir::Value v = ReadStrided(b2, p2, c.view);
    int64_t n = 1;
    for (int64_t s : c.view.sizes) n *= s;
    EXPECT_EQ(RunF32(b2.Build({b2.Reshape(v, {n})}), {flat}), HostRead(flat, c.view));
  }
}

TEST(Strided, WritesReplaceExactlyTheViewedElements) {
  const std::vector<float> flat = Iota(kN);
  for (const auto& c : kCases) {
    bool expanded = false;
    for (size_t k = 0; k < c.view.sizes.size(); ++k) expanded |= c.view.sizes[k] > 1 && c.view.strides[k] == 0;
    const bool overlapping = c.view.strides == std::vector<int64_t>{3, 1};
    if (expanded || overlapping) continue;  // several view elements share one storage element
    SCOPED_TRACE(::testing::PrintToString(c.view.sizes) + " strides " + ::testing::PrintToString(c.view.strides));
    int64_t n = 1;
    for (int64_t s : c.view.sizes) n *= s;
    std::vector<float> upd(n);
    for (int64_t i = 0; i < n; ++i) upd[i] = -1.f - static_cast<float>(i);
    ir::Builder b;
    auto p = b.Parameter({ir::DType::F32, {kN}});
    auto u = b.Parameter({ir::DType::F32, {n}});
    ir::Value w = WriteStrided(b, p, c.view, b.Reshape(u, c.view.sizes));
    std::vector<float> want = flat;
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, addr = c.view.offset;
      for (size_t k = c.view.sizes.size(); k-- > 0;) {
        addr += (rem % c.view.sizes[k]) * c.view.strides[k];
        rem /= c.view.sizes[k];
      }
      want[addr] = upd[i];
    }
    EXPECT_EQ(RunF32(b.Build({w}), {flat, upd}), want);
  }
}

TEST(Strided, APermutedCoverIsWrittenWithoutReadingTheStorage) {
  // channels_last (N, C, H, W) = (2, 3, 2, 4) and a transposed matrix cover
  // their storage; a slice, an expanded view or an offset does not.
  const std::vector<StridedView> covers = {{{2, 3, 2, 4}, {24, 1, 12, 3}, 0}, {{12, 4}, {1, 12}, 0},
                                           {{4, 1, 12}, {12, 99, 1}, 0}};
  for (const auto& v : covers) {
    SCOPED_TRACE(::testing::PrintToString(v.sizes) + " strides " + ::testing::PrintToString(v.strides));
    ASSERT_TRUE(CoversStoragePermuted(v, kN));
    std::vector<float> upd(kN);
    for (int64_t i = 0; i < kN; ++i) upd[i] = -1.f - static_cast<float>(i);
    ir::Builder b;
    auto u = b.Parameter({ir::DType::F32, {kN}});
    std::vector<float> want(kN, 0.f);
    for (int64_t i = 0; i < kN; ++i) {
      int64_t rem = i, addr = 0;
      for (size_t k = v.sizes.size(); k-- > 0;) {
        addr += (rem % v.sizes[k]) * v.strides[k];
        rem /= v.sizes[k];
      }
      want[addr] = upd[i];
    }
    EXPECT_EQ(RunF32(b.Build({FlatOfCover(b, v, b.Reshape(u, v.sizes))}), {upd}), want);
  }
  EXPECT_FALSE(CoversStoragePermuted({{3, 5}, {12, 2}, 1}, kN));
  EXPECT_FALSE(CoversStoragePermuted({{4, 12}, {0, 1}, 0}, kN));
  EXPECT_FALSE(CoversStoragePermuted({{4, 12}, {12, 1}, 1}, kN));
  EXPECT_FALSE(CoversStoragePermuted({{5, 6}, {3, 1}, 0}, 30));
}

TEST(Strided, WritingAnExpandedViewIsRefused) {
  ir::Builder b;
  auto p = b.Parameter({ir::DType::F32, {kN}});
  StridedView v{{4, 3}, {0, 1}, 0};
  auto u = b.Full(ir::DType::F32, {4, 3}, 1);
  EXPECT_THROW(WriteStrided(b, p, v, u), ir::Error);
}

TEST(Strided, WholeStorageIsAReshapeThatFolds) {
  // An op's result stored flat, then read back whole: the read is the
  // result itself, no view nodes.
  ir::Builder b;
  auto p = b.Parameter({ir::DType::F32, {3, 4}});
  auto y = b.Unary(ir::Op::Neg, p);
  ir::Value flat = b.Reshape(y, {12});
  const size_t before = b.graph().nodes.size();
  EXPECT_EQ(ReadStrided(b, flat, {{3, 4}, {4, 1}, 0}), y);
  EXPECT_EQ(b.Reshape(flat, {12}), flat);
  EXPECT_EQ(b.graph().nodes.size(), before);
}

}  // namespace
}  // namespace tpj::runtime
