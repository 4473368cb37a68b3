// Shape and dtype inference, and the errors a bad graph gets before any
// compile. No plugin needed.
#include <gtest/gtest.h>

#include <algorithm>

#include "ir/graph.h"
#include "ir/infer.h"

namespace tpj::ir {
namespace {

// Runs `f` and returns the ir::Error message, or "" if nothing was thrown.
template <class F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Infer, ElementwiseNeedsOneShapeAndDtype) {
  Builder b;
  auto x = b.Parameter({DType::F32, {2, 3}});
  auto y = b.Parameter({DType::F32, {3}});
  auto z = b.Parameter({DType::I32, {2, 3}});
  EXPECT_EQ(ErrorOf([&] { b.Binary(Op::Add, x, y); }),
            "Add (stablehlo.add) with operands tensor<2x3xf32>, tensor<3xf32>: operands must have one shape "
            "(broadcast explicitly with BroadcastInDim)");
  EXPECT_EQ(ErrorOf([&] { b.Binary(Op::Mul, x, z); }),
            "Mul (stablehlo.multiply) with operands tensor<2x3xf32>, tensor<2x3xi32>: operands must have one "
            "dtype, got float32 and int32");
  EXPECT_EQ(b.shape(b.Binary(Op::Add, x, x)), (Shape{DType::F32, {2, 3}}));
}

TEST(Infer, DtypeClassesOfUnaryAndLogicalOps) {
  Builder b;
  auto i = b.Parameter({DType::I32, {2}});
  auto f = b.Parameter({DType::F32, {2}});
  auto p = b.Parameter({DType::Bool, {2}});
  EXPECT_NE(ErrorOf([&] { b.Unary(Op::Exp, i); }).find("needs a floating-point or complex operand"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Unary(Op::Floor, i); }).find("needs a floating-point operand"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Binary(Op::Xor, f, f); }).find("needs boolean or integer operands"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Unary(Op::Neg, p); }).find("not bool"), std::string::npos);
  EXPECT_EQ(ErrorOf([&] { b.Binary(Op::And, p, p); }), "");
  EXPECT_NE(ErrorOf([&] { b.Unary(Op::Add, f); }).find("not a unary"), std::string::npos);
  EXPECT_EQ(b.shape(b.IsFinite(f)).dtype, DType::Bool);
  EXPECT_EQ(b.shape(b.Compare(CompareDir::LT, f, f)).dtype, DType::Bool);
  EXPECT_EQ(b.shape(b.Convert(f, DType::BF16)).dtype, DType::BF16);
}

TEST(Infer, BroadcastReshapeTranspose) {
  Builder b;
  auto x = b.Parameter({DType::F32, {3, 1}});
  EXPECT_EQ(b.shape(b.BroadcastInDim(x, {2, 3, 4}, {1, 2})), (Shape{DType::F32, {2, 3, 4}}));
  EXPECT_NE(ErrorOf([&] { b.BroadcastInDim(x, {2, 4, 4}, {1, 2}); }).find("cannot broadcast dim 0 of size 3 to size 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.BroadcastInDim(x, {3, 4}, {0}); }).find("broadcast_dimensions [0] needs 2 entries"),
            std::string::npos);
  EXPECT_EQ(b.shape(b.Reshape(x, {1, 3})), (Shape{DType::F32, {1, 3}}));
  EXPECT_NE(ErrorOf([&] { b.Reshape(x, {2, 2}); }).find("cannot reshape 3 elements to [2, 2]"), std::string::npos);
  EXPECT_EQ(b.shape(b.Transpose(x, {1, 0})), (Shape{DType::F32, {1, 3}}));
  EXPECT_NE(ErrorOf([&] { b.Transpose(x, {0, 0}); }).find("repeats 0"), std::string::npos);
}

TEST(Infer, SlicePadConcatDynamicSlice) {
  Builder b;
  auto x = b.Parameter({DType::F32, {5, 4}});
  EXPECT_EQ(b.shape(b.Slice(x, {1, 0}, {5, 4}, {2, 3})).dims, (std::vector<int64_t>{2, 2}));
  EXPECT_NE(ErrorOf([&] { b.Slice(x, {0, 0}, {6, 4}, {1, 1}); }).find("out of bounds"), std::string::npos);
  auto pv = b.ScalarConstant(DType::F32, 0);
  EXPECT_EQ(b.shape(b.Pad(x, pv, {1, -1}, {0, 2}, {1, 0})).dims, (std::vector<int64_t>{10, 5}));
  EXPECT_EQ(b.shape(b.Concatenate({x, x, x}, 1)).dims, (std::vector<int64_t>{5, 12}));
  auto y = b.Parameter({DType::F32, {4, 4}});
  EXPECT_NE(ErrorOf([&] { b.Concatenate({x, y}, 1); }).find("differ outside dimension 1"), std::string::npos);
  auto i = b.Parameter({DType::I32, {}});
  EXPECT_EQ(b.shape(b.DynamicSlice(x, {i, i}, {2, 2})).dims, (std::vector<int64_t>{2, 2}));
  EXPECT_NE(ErrorOf([&] { b.DynamicSlice(x, {i}, {2, 2}); }).find("takes 3 operand(s), got 2"), std::string::npos);
  auto f = b.ScalarConstant(DType::F32, 1);
  EXPECT_NE(ErrorOf([&] { b.DynamicSlice(x, {f, f}, {2, 2}); }).find("start indices must be integers"),
            std::string::npos);
}

TEST(Infer, DotGeneralAndConvolution) {
  Builder b;
  auto l = b.Parameter({DType::F32, {8, 2, 3}});
  auto r = b.Parameter({DType::F32, {8, 3, 5}});
  DotDims d;
  d.lhs_batch = {0};
  d.rhs_batch = {0};
  d.lhs_contract = {2};
  d.rhs_contract = {1};
  EXPECT_EQ(b.shape(b.DotGeneral(l, r, d)).dims, (std::vector<int64_t>{8, 2, 5}));
  d.rhs_contract = {2};
  EXPECT_NE(ErrorOf([&] { b.DotGeneral(l, r, d); }).find("contracting dimensions differ in size (3 vs 5)"),
            std::string::npos);
  // a float32 result, for float16/bfloat16 operands only
  d.rhs_contract = {1};
  auto lh = b.Parameter({DType::BF16, {8, 2, 3}});
  auto rh = b.Parameter({DType::BF16, {8, 3, 5}});
  EXPECT_EQ(b.shape(b.DotGeneral(lh, rh, d)).dtype, DType::BF16);
  EXPECT_EQ(b.shape(b.DotGeneral(lh, rh, d, Precision::Default, true)).dtype, DType::F32);
  EXPECT_NE(ErrorOf([&] { b.DotGeneral(l, r, d, Precision::Default, true); }).find("float16 or bfloat16 operands"),
            std::string::npos);

  auto x = b.Parameter({DType::F32, {2, 6, 9, 9}});
  auto k = b.Parameter({DType::F32, {4, 3, 3, 3}});
  ConvDims c;
  c.in_spatial = {2, 3};
  c.k_spatial = {2, 3};
  c.out_spatial = {2, 3};
  EXPECT_EQ(b.shape(b.Convolution(x, k, c, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 2, 1)).dims,
            (std::vector<int64_t>{2, 4, 5, 5}));
  EXPECT_NE(ErrorOf([&] { b.Convolution(x, k, c, {1, 1}, {0, 0}, {0, 0}, {1, 1}, {1, 1}, 1, 1); })
                .find("input features (6) must equal kernel input features (3) x feature_group_count (1)"),
            std::string::npos);
}

TEST(Infer, ReduceWindowedGatherScatterSort) {
  Builder b;
  auto x = b.Parameter({DType::F32, {2, 3, 4}});
  auto z = b.ScalarConstant(DType::F32, 0);
  EXPECT_EQ(b.shape(b.Reduce(x, z, {0, 2}, ReduceKind::Sum)).dims, (std::vector<int64_t>{3}));
  EXPECT_NE(ErrorOf([&] { b.Reduce(x, z, {3}, ReduceKind::Sum); }).find("out of range for rank 3"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Reduce(x, x, {0}, ReduceKind::Sum); }).find("init value must be a 0-d tensor"),
            std::string::npos);
  EXPECT_EQ(b.shape(b.ReduceWindow(x, z, ReduceKind::Max, {1, 2, 2}, {1, 1, 2}, {}, {}, {0, 0, 0}, {0, 0, 0})).dims,
            (std::vector<int64_t>{2, 2, 2}));
  auto src = b.Parameter({DType::F32, {2, 2, 3}});
  EXPECT_NE(ErrorOf([&] { b.SelectAndScatter(x, src, z, {1, 2, 2}, {1, 1, 2}, {0, 0, 0}, {0, 0, 0}); })
                .find("source must have the shape of the operand's windows [2, 2, 2]"),
            std::string::npos);
  auto idx = b.Parameter({DType::I64, {5}});
  GatherDims g;
  g.offset_dims = {1, 2};
  g.collapsed_slice_dims = {0};
  g.start_index_map = {0};
  g.index_vector_dim = 1;
  EXPECT_EQ(b.shape(b.Gather(x, idx, g, {1, 3, 4})).dims, (std::vector<int64_t>{5, 3, 4}));
  EXPECT_NE(ErrorOf([&] { b.Gather(x, idx, g, {2, 3, 4}); }).find("collapsed slice dims must have slice size 1"),
            std::string::npos);
  auto ys = b.Sort({x, x}, 2, false);
  EXPECT_EQ(ys.size(), 2u);
  EXPECT_NE(ErrorOf([&] { b.Sort({x, src}, 0, false); }).find("operands must have one shape"), std::string::npos);
  auto top = b.TopK(x, 2);
  EXPECT_EQ(b.shape(top[0]).dims.back(), 2);
  EXPECT_EQ(b.shape(top[1]).dtype, DType::I32);
  EXPECT_NE(ErrorOf([&] { b.TopK(x, 1000); }).find("out of range"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.TopK(b.Parameter({DType::F64, {4}}), 2); }).find("needs float32 keys"), std::string::npos);
}

TEST(Infer, CollectivesUseReplicaGroups) {
  Builder b(4);
  auto x = b.Parameter({DType::F32, {8, 2}});
  EXPECT_EQ(b.shape(b.AllGather(x, 0)).dims, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(b.shape(b.AllGather(x, 1, {{0, 1}, {2, 3}})).dims, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(b.shape(b.ReduceScatter(x, 0, ReduceKind::Sum)).dims, (std::vector<int64_t>{2, 2}));
  EXPECT_NE(ErrorOf([&] { b.ReduceScatter(x, 1, ReduceKind::Sum); }).find("must divide by the group size 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.AllReduce(x, ReduceKind::Sum, {{0, 1}, {2}}); }).find("equal in size"), std::string::npos);
}

TEST(Infer, ConstantsParametersAliasesAndLocations) {
  Builder b;
  EXPECT_NE(ErrorOf([&] { b.Constant({DType::F32, {3}}, {1, 2, 3}); }).find("got 3 bytes, need 12 (or 4 for a splat)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Parameter({DType::F32, {-1}}); }).find("dims must be >= 0"), std::string::npos);
  auto p = b.Parameter({DType::F32, {2}});
  auto q = b.Parameter({DType::F32, {3}});
  EXPECT_NE(ErrorOf([&] { b.Build({q}, {{0, 0}}); }).find("shapes differ"), std::string::npos);
  Builder c;
  c.SetLocation("model.py:12");
  auto u = c.Parameter({DType::F32, {2}});
  auto v = c.Parameter({DType::F32, {3}});
  EXPECT_NE(ErrorOf([&] { c.Binary(Op::Add, u, v); }).find("(at model.py:12)"), std::string::npos);
  Builder other;
  EXPECT_NE(ErrorOf([&] { other.Unary(Op::Neg, p); }).find("does not belong to this graph"), std::string::npos);
}


TEST(Infer, ComplexPartsAbsAndFft) {
  Builder b;
  auto z = b.Parameter({DType::C64, {4, 8}});
  auto w = b.Parameter({DType::C128, {3}});
  auto f = b.Parameter({DType::F32, {4, 8}});
  auto i = b.Parameter({DType::I32, {4, 8}});
  EXPECT_EQ(b.shape(b.Real(z)), (Shape{DType::F32, {4, 8}}));
  EXPECT_EQ(b.shape(b.Imag(w)), (Shape{DType::F64, {3}}));
  EXPECT_EQ(b.shape(b.Unary(Op::Abs, z)), (Shape{DType::F32, {4, 8}}));  // abs of complex is real
  EXPECT_EQ(b.shape(b.Unary(Op::Abs, w)).dtype, DType::F64);
  EXPECT_EQ(b.shape(b.Unary(Op::Abs, f)).dtype, DType::F32);
  EXPECT_EQ(b.shape(b.Complex(f, f)), (Shape{DType::C64, {4, 8}}));
  EXPECT_NE(ErrorOf([&] { b.Real(f); }).find("needs a complex operand"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Complex(i, i); }).find("needs float32 or float64 parts"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Complex(f, b.Real(b.Parameter({DType::C128, {4, 8}}))); }).find("one dtype"),
            std::string::npos);
  // FFT/IFFT keep the shape; RFFT halves the last dim (n / 2 + 1); IRFFT
  // takes the halved one and gives fft_length back.
  EXPECT_EQ(b.shape(b.Fft(z, FftType::FFT, {4, 8})), (Shape{DType::C64, {4, 8}}));
  EXPECT_EQ(b.shape(b.Fft(z, FftType::IFFT, {8})), (Shape{DType::C64, {4, 8}}));
  EXPECT_EQ(b.shape(b.Fft(f, FftType::RFFT, {8})), (Shape{DType::C64, {4, 5}}));
  auto half = b.Parameter({DType::C128, {2, 5}});
  EXPECT_EQ(b.shape(b.Fft(half, FftType::IRFFT, {2, 9})), (Shape{DType::F64, {2, 9}}));
  EXPECT_EQ(b.shape(b.Fft(half, FftType::IRFFT, {8})), (Shape{DType::F64, {2, 8}}));
  EXPECT_EQ(ErrorOf([&] { b.Fft(half, FftType::IRFFT, {10}); }),
            "Fft (stablehlo.fft) with operand tensor<2x5xcomplex<f64>>: trailing dims must match fft_length [10] "
            "(IRFFT: the last one is fft_length.back() / 2 + 1)");
  EXPECT_NE(ErrorOf([&] { b.Fft(f, FftType::FFT, {8}); }).find("FFT needs a complex operand"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Fft(z, FftType::RFFT, {8}); }).find("RFFT needs a float32 or float64 operand"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Fft(z, FftType::FFT, {1, 4, 8, 8}); }).find("needs 1 to 3 entries"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Fft(z, FftType::FFT, {4}); }).find("trailing dims must match"), std::string::npos);
}

TEST(Infer, LinearAlgebraShapes) {
  Builder b;
  auto a = b.Parameter({DType::F32, {2, 3, 3}});
  auto rect = b.Parameter({DType::F32, {2, 3, 4}});
  auto ints = b.Parameter({DType::I32, {3, 3}});
  EXPECT_EQ(b.shape(b.Cholesky(a, false)), (Shape{DType::F32, {2, 3, 3}}));
  EXPECT_NE(ErrorOf([&] { b.Cholesky(rect, true); }).find("square matrices"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.Cholesky(ints, true); }).find("floating-point"), std::string::npos);
  EXPECT_EQ(b.shape(b.TriangularSolve(a, rect, true, true, false, false)), (Shape{DType::F32, {2, 3, 4}}));
  EXPECT_NE(ErrorOf([&] { b.TriangularSolve(a, rect, false, true, false, false); }).find("b's columns must match"),
            std::string::npos);
  auto other_batch = b.Parameter({DType::F32, {5, 3, 4}});
  EXPECT_NE(ErrorOf([&] { b.TriangularSolve(a, other_batch, true, true, false, false); }).find("one batch shape"),
            std::string::npos);
  auto r = b.CustomCall("Qr", {a}, {{DType::F32, {2, 3, 3}}, {DType::F32, {2, 3}}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(b.shape(r[1]), (Shape{DType::F32, {2, 3}}));
  EXPECT_NE(ErrorOf([&] { b.CustomCall("", {a}, {{DType::F32, {1}}}); }).find("needs a target"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.CustomCall("Qr", {a}, {}); }).find("at least one result"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { b.CustomCall("Eigh", {a}, {{DType::F32, {1}}}, "a\"b"); }).find("must not hold quotes"),
            std::string::npos);
}


// Long sums over several dims in two stages (Builder::SetStagedSums): a
// reduce_window over the longest run of reduced dims, then the window sums;
// the result shape as one reduce's, whatever the order of the dims.
TEST(Infer, StagedSums) {
  auto ops = [](const Builder& b) {
    std::vector<Op> out;
    for (const Node& n : b.graph().nodes) out.push_back(n.op);
    return out;
  };
  auto count = [&](const Builder& b, Op op) {
    const auto o = ops(b);
    return std::count(o.begin(), o.end(), op);
  };
  Builder plain;
  auto x0 = plain.Parameter({DType::F32, {4, 256, 1024}});
  plain.Reduce(x0, plain.ScalarConstant(DType::F32, 0), {0, 1, 2}, ReduceKind::Sum);
  EXPECT_EQ(count(plain, Op::ReduceWindow), 0);  // off by default

  Builder b;
  b.SetStagedSums(true);
  auto z = b.ScalarConstant(DType::F32, 0);
  auto x = b.Parameter({DType::F32, {4, 256, 1024}});
  EXPECT_EQ(b.shape(b.Reduce(x, z, {2, 0, 1}, ReduceKind::Sum)).dims, (std::vector<int64_t>{}));
  EXPECT_EQ(count(b, Op::ReduceWindow), 1);
  EXPECT_EQ(b.shape(b.Reduce(x, z, {2, 1}, ReduceKind::Sum)).dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(count(b, Op::ReduceWindow), 2);
  // batch statistics: dims 0, 2, 3 of [16, 64, 32, 32], the run (2, 3) windowed
  auto y = b.Parameter({DType::F32, {16, 64, 33, 31}});
  EXPECT_EQ(b.shape(b.Reduce(y, z, {3, 0, 2}, ReduceKind::Sum)).dims, (std::vector<int64_t>{64}));
  EXPECT_EQ(count(b, Op::ReduceWindow), 3);
  // not staged: one dim (XLA splits it), under 1024 values, max, integers
  b.Reduce(b.Parameter({DType::F32, {1 << 20}}), z, {0}, ReduceKind::Sum);
  b.Reduce(b.Parameter({DType::F32, {16, 32, 1}}), z, {1, 2}, ReduceKind::Sum);
  b.Reduce(x, z, {0, 1, 2}, ReduceKind::Max);
  b.Reduce(b.Parameter({DType::I64, {64, 64}}), b.ScalarConstant(DType::I64, 0), {0, 1}, ReduceKind::Sum);
  EXPECT_EQ(count(b, Op::ReduceWindow), 3);
}

}  // namespace
}  // namespace tpj::ir
