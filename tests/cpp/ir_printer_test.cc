// The StableHLO printer on exact strings. No plugin needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ir/graph.h"
#include "ir/printer.h"

namespace tpj::ir {
namespace {

template <class T>
std::vector<uint8_t> Bytes(std::vector<T> v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Printer, AddModuleWithDonation) {
  Builder b;
  auto x = b.Parameter({DType::F32, {4}});
  auto y = b.Parameter({DType::F32, {4}});
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<4xf32>) {
    %2 = "stablehlo.add"(%arg0, %arg1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%2) : (tensor<4xf32>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({b.Binary(Op::Add, x, y)}, {{1, 0}})), want);
}

TEST(Printer, BitcastOfAnotherElementSizeScalesTheLastDimension) {
  Builder b;
  auto bytes = b.Parameter({DType::U8, {8}});
  auto words = b.Parameter({DType::F32, {2}});
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xui8>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<4xui16>) {
    %2 = "stablehlo.reshape"(%arg0) : (tensor<8xui8>) -> tensor<2x4xui8>
    %3 = "stablehlo.bitcast_convert"(%2) : (tensor<2x4xui8>) -> tensor<2xf32>
    %4 = "stablehlo.bitcast_convert"(%arg1) : (tensor<2xf32>) -> tensor<2x2xui16>
    %5 = "stablehlo.reshape"(%4) : (tensor<2x2xui16>) -> tensor<4xui16>
    "func.return"(%3, %5) : (tensor<2xf32>, tensor<4xui16>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({b.Bitcast(bytes, DType::F32), b.Bitcast(words, DType::U16)})), want);
  EXPECT_THROW(b.Bitcast(b.Parameter({DType::U8, {6}}), DType::F32), Error);  // 6 bytes are not float32s
  EXPECT_THROW(b.Bitcast(b.Parameter({DType::U8, {4}}), DType::C64), Error);  // half a complex64
}

TEST(Printer, ComplexBitcastGoesThroughRealAndImagParts) {
  Builder b;
  auto z = b.Parameter({DType::C64, {2}});
  auto f = b.Parameter({DType::F32, {4}});
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xcomplex<f32>>, %arg1: tensor<4xf32>) -> (tensor<4xf32>, tensor<2xcomplex<f32>>) {
    %2 = "stablehlo.real"(%arg0) : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
    %3 = "stablehlo.reshape"(%2) : (tensor<2xf32>) -> tensor<2x1xf32>
    %4 = "stablehlo.imag"(%arg0) : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
    %5 = "stablehlo.reshape"(%4) : (tensor<2xf32>) -> tensor<2x1xf32>
    %6 = "stablehlo.concatenate"(%3, %5) {dimension = 1 : i64} : (tensor<2x1xf32>, tensor<2x1xf32>) -> tensor<2x2xf32>
    %7 = "stablehlo.reshape"(%6) : (tensor<2x2xf32>) -> tensor<4xf32>
    %8 = "stablehlo.reshape"(%arg1) : (tensor<4xf32>) -> tensor<2x2xf32>
    %9 = "stablehlo.slice"(%8) {start_indices = array<i64: 0, 0>, limit_indices = array<i64: 2, 1>, strides = array<i64: 1, 1>} : (tensor<2x2xf32>) -> tensor<2x1xf32>
    %10 = "stablehlo.reshape"(%9) : (tensor<2x1xf32>) -> tensor<2xf32>
    %11 = "stablehlo.slice"(%8) {start_indices = array<i64: 0, 1>, limit_indices = array<i64: 2, 2>, strides = array<i64: 1, 1>} : (tensor<2x2xf32>) -> tensor<2x1xf32>
    %12 = "stablehlo.reshape"(%11) : (tensor<2x1xf32>) -> tensor<2xf32>
    %13 = "stablehlo.complex"(%10, %12) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xcomplex<f32>>
    "func.return"(%7, %13) : (tensor<4xf32>, tensor<2xcomplex<f32>>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({b.Bitcast(z, DType::F32), b.Bitcast(f, DType::C64)})), want);
}

TEST(Printer, FftTypeAndLength) {
  Builder b;
  auto x = b.Parameter({DType::F32, {3, 8}});
  auto r = b.Fft(x, FftType::RFFT, {8});
  auto back = b.Fft(r, FftType::IRFFT, {8});
  auto full = b.Fft(b.Fft(r, FftType::FFT, {3, 5}), FftType::IFFT, {5});
  const std::string text = PrintStableHlo(b.Build({back, full}));
  for (const char* line : {
           R"(%1 = "stablehlo.fft"(%arg0) {fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 8>} : (tensor<3x8xf32>) -> tensor<3x5xcomplex<f32>>)",
           R"(%2 = "stablehlo.fft"(%1) {fft_type = #stablehlo<fft_type IRFFT>, fft_length = array<i64: 8>} : (tensor<3x5xcomplex<f32>>) -> tensor<3x8xf32>)",
           R"(%3 = "stablehlo.fft"(%1) {fft_type = #stablehlo<fft_type FFT>, fft_length = array<i64: 3, 5>} : (tensor<3x5xcomplex<f32>>) -> tensor<3x5xcomplex<f32>>)",
           R"(%4 = "stablehlo.fft"(%3) {fft_type = #stablehlo<fft_type IFFT>, fft_length = array<i64: 5>} : (tensor<3x5xcomplex<f32>>) -> tensor<3x5xcomplex<f32>>)",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

TEST(Printer, SixteenBitSumsAccumulateInFloat32) {
  Builder b;
  auto x = b.Parameter({DType::BF16, {2, 3}});
  auto sum = b.Reduce(x, b.ScalarConstant(DType::BF16, 0), {1}, ReduceKind::Sum);
  auto max = b.Reduce(x, b.ScalarConstant(DType::BF16, 0), {1}, ReduceKind::Max);
  EXPECT_EQ(b.shape(sum).dtype, DType::BF16);
  const std::string text = PrintStableHlo(b.Build({sum, max}));
  EXPECT_NE(text.find("\"stablehlo.convert\"(%arg0) : (tensor<2x3xbf16>) -> tensor<2x3xf32>"), std::string::npos) << text;
  EXPECT_NE(text.find("(tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>"), std::string::npos) << text;
  EXPECT_NE(text.find("(tensor<2xf32>) -> tensor<2xbf16>"), std::string::npos) << text;
  // max is exact in any type: it stays in bfloat16
  EXPECT_NE(text.find("(tensor<2x3xbf16>, tensor<bf16>) -> tensor<2xbf16>"), std::string::npos) << text;
}

TEST(Printer, ReduceRegionAndSortComparator) {
  Builder b;
  auto x = b.Parameter({DType::I32, {2, 3}});
  auto r = b.Reduce(x, b.ScalarConstant(DType::I32, 0), {1}, ReduceKind::Max);
  auto s = b.Sort({r}, 0, false);
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xi32>) -> (tensor<2xi32>) {
    %1 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %2 = "stablehlo.reduce"(%arg0, %1) ({
    ^bb0(%r0_0: tensor<i32>, %r0_1: tensor<i32>):
      %r0_2 = "stablehlo.maximum"(%r0_0, %r0_1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%r0_2) : (tensor<i32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x3xi32>, tensor<i32>) -> tensor<2xi32>
    %3 = "stablehlo.sort"(%2) ({
    ^bb0(%r1_0: tensor<i32>, %r1_1: tensor<i32>):
      %r1_c = "stablehlo.compare"(%r1_0, %r1_1) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type SIGNED>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
      "stablehlo.return"(%r1_c) : (tensor<i1>) -> ()
    }) {dimension = 0 : i64, is_stable = true} : (tensor<2xi32>) -> tensor<2xi32>
    "func.return"(%3) : (tensor<2xi32>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({s[0]})), want);
}

TEST(Printer, SortComparatorOfFloatKeysOrdersNanAboveInf) {
  Builder b;
  auto x = b.Parameter({DType::F32, {3}});
  auto s = b.Sort({x}, 0, true);
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
    %1 = "stablehlo.sort"(%arg0) ({
    ^bb0(%r0_0: tensor<f32>, %r0_1: tensor<f32>):
      %r0_c = "stablehlo.compare"(%r0_0, %r0_1) {comparison_direction = #stablehlo<comparison_direction GT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r0_n = "stablehlo.compare"(%r0_0, %r0_0) {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r0_o = "stablehlo.compare"(%r0_1, %r0_1) {comparison_direction = #stablehlo<comparison_direction EQ>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r0_a = "stablehlo.and"(%r0_n, %r0_o) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r0_r = "stablehlo.or"(%r0_c, %r0_a) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      "stablehlo.return"(%r0_r) : (tensor<i1>) -> ()
    }) {dimension = 0 : i64, is_stable = true} : (tensor<3xf32>) -> tensor<3xf32>
    "func.return"(%1) : (tensor<3xf32>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({s[0]})), want);
}

TEST(Printer, CollectivesAndMultiResultNames) {
  Builder b(4);
  auto x = b.Parameter({DType::F32, {4}});
  auto s = b.AllReduce(x, ReduceKind::Sum);
  auto g = b.AllGather(x, 0, {{0, 1}, {2, 3}});
  auto st = b.Parameter({DType::U64, {2}});
  auto r = b.RngBitGenerator(st, {DType::U32, {3}});
  const std::string want = R"(module @torch_pjrt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 4 : i32} {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<2xui64>) -> (tensor<4xf32>, tensor<8xf32>, tensor<2xui64>, tensor<3xui32>) {
    %1 = "stablehlo.all_reduce"(%arg0) ({
    ^bb0(%r0_0: tensor<f32>, %r0_1: tensor<f32>):
      %r0_2 = "stablehlo.add"(%r0_0, %r0_1) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r0_2) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    %2 = "stablehlo.all_gather"(%arg0) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<4xf32>) -> tensor<8xf32>
    %4:2 = "stablehlo.rng_bit_generator"(%arg1) {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (tensor<2xui64>) -> (tensor<2xui64>, tensor<3xui32>)
    "func.return"(%1, %2, %4#0, %4#1) : (tensor<4xf32>, tensor<8xf32>, tensor<2xui64>, tensor<3xui32>) -> ()
  }
}
)";
  EXPECT_EQ(PrintStableHlo(b.Build({s, g, r[0], r[1]})), want);
}

// One op line of a printed module (the line that contains `op`).
std::string Line(const std::string& text, const std::string& op) {
  const size_t at = text.find(op);
  if (at == std::string::npos) return "";
  const size_t start = text.rfind('\n', at) + 1;
  const size_t first = text.find_first_not_of(' ', start);
  return text.substr(first, text.find('\n', at) - first);
}

TEST(Printer, WindowedConvGatherScatterLines) {
  Builder b;
  auto x = b.Parameter({DType::F32, {1, 1, 4, 4}});
  auto k = b.Parameter({DType::F32, {2, 1, 3, 3}});
  ConvDims d;
  d.in_spatial = {2, 3};
  d.k_spatial = {2, 3};
  d.out_spatial = {2, 3};
  auto y = b.Convolution(x, k, d, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, 1);
  auto rw = b.ReduceWindow(x, b.ScalarConstant(DType::F32, 0), ReduceKind::Sum, {1, 1, 2, 2}, {1, 1, 2, 2}, {},
                           {}, {0, 0, 0, 0}, {0, 0, 1, 1});
  auto idx = b.Parameter({DType::I64, {3, 1}});
  auto t = b.Parameter({DType::BF16, {5, 2}});
  GatherDims gd;
  gd.offset_dims = {1};
  gd.collapsed_slice_dims = {0};
  gd.start_index_map = {0};
  gd.index_vector_dim = 1;
  auto gg = b.Gather(t, idx, gd, {1, 2});
  ScatterDims sd;
  sd.update_window_dims = {1};
  sd.inserted_window_dims = {0};
  sd.scatter_dims_to_operand_dims = {0};
  sd.index_vector_dim = 1;
  auto sc = b.Scatter(t, idx, gg, sd, true);
  const std::string text = PrintStableHlo(b.Build({y, rw, gg, sc}));
  EXPECT_EQ(Line(text, "stablehlo.convolution"),
            R"(%2 = "stablehlo.convolution"(%arg0, %arg1) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[1, 1], [1, 1]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 2, 2>} : (tensor<1x1x4x4xf32>, tensor<2x1x3x3xf32>) -> tensor<1x2x2x2xf32>)");
  EXPECT_EQ(Line(text, "window_dimensions"),
            R"(}) {window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>, base_dilations = array<i64: 1, 1, 1, 1>, window_dilations = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [0, 0], [0, 1], [0, 1]]> : tensor<4x2xi64>} : (tensor<1x1x4x4xf32>, tensor<f32>) -> tensor<1x1x2x2xf32>)");
  EXPECT_EQ(Line(text, "stablehlo.gather"),
            R"(%7 = "stablehlo.gather"(%arg3, %arg2) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>} : (tensor<5x2xbf16>, tensor<3x1xi64>) -> tensor<3x2xbf16>)");
  EXPECT_EQ(Line(text, "scatter_dimension_numbers"),
            R"(}) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : (tensor<5x2xbf16>, tensor<3x1xi64>, tensor<3x2xbf16>) -> tensor<5x2xbf16>)");
  // Replacing scatter returns the update (second block argument) unchanged.
  EXPECT_NE(text.find(R"("stablehlo.return"(%r1_1) : (tensor<bf16>) -> ())"), std::string::npos) << text;
}

TEST(Printer, SelectAndScatterHasSelectThenScatterRegions) {
  Builder b;
  auto x = b.Parameter({DType::F32, {2, 2}});
  auto src = b.Parameter({DType::F32, {1, 1}});
  auto z = b.SelectAndScatter(x, src, b.ScalarConstant(DType::F32, 0), {2, 2}, {2, 2}, {0, 0}, {0, 0});
  const std::string text = PrintStableHlo(b.Build({z}));
  const size_t ge = text.find("comparison_direction GE");
  const size_t add = text.find("stablehlo.add");
  ASSERT_NE(ge, std::string::npos);
  ASSERT_NE(add, std::string::npos);
  EXPECT_LT(ge, add);
  EXPECT_NE(text.find("}, {\n"), std::string::npos);
}

TEST(Printer, DenseLiteralsForEveryDtype) {
  EXPECT_EQ(DenseLiteralText({DType::Bool, {3}}, {1, 0, 1}), "dense<[true, false, true]> : tensor<3xi1>");
  EXPECT_EQ(DenseLiteralText({DType::I8, {2}}, Bytes<int8_t>({-128, 127})), "dense<[-128, 127]> : tensor<2xi8>");
  EXPECT_EQ(DenseLiteralText({DType::I64, {}}, Bytes<int64_t>({-(int64_t(1) << 40)})),
            "dense<-1099511627776> : tensor<i64>");
  EXPECT_EQ(DenseLiteralText({DType::U32, {2}}, Bytes<uint32_t>({4000000000u, 1})),
            "dense<[4000000000, 1]> : tensor<2xui32>");
  EXPECT_EQ(DenseLiteralText({DType::F16, {2}}, Bytes<uint16_t>({0x3C00, 0xFC00})),
            "dense<[0x3C00, 0xFC00]> : tensor<2xf16>");
  EXPECT_EQ(DenseLiteralText({DType::BF16, {}}, Bytes<uint16_t>({0x3F80})), "dense<0x3F80> : tensor<bf16>");
  EXPECT_EQ(DenseLiteralText({DType::F32, {2, 2}}, Bytes<float>({1.f, 2.5f, INFINITY, 1e-5f})),
            "dense<[[1.0, 2.5], [0x7F800000, 1.0e-05]]> : tensor<2x2xf32>");
  EXPECT_EQ(DenseLiteralText({DType::F32, {}}, Bytes<float>({NAN})), "dense<0x7FC00000> : tensor<f32>");
  EXPECT_EQ(DenseLiteralText({DType::F64, {}}, Bytes<double>({0.1})), "dense<0.1> : tensor<f64>");
  EXPECT_EQ(DenseLiteralText({DType::C64, {}}, Bytes<float>({1.f, -2.f})), "dense<(1.0,-2.0)> : tensor<complex<f32>>");
  EXPECT_EQ(DenseLiteralText({DType::F32, {3, 2}}, Bytes<float>({7.f})), "dense<7.0> : tensor<3x2xf32>");  // splat
  EXPECT_EQ(DenseLiteralText({DType::F32, {0, 2}}, {}), "dense<> : tensor<0x2xf32>");
  std::vector<float> big(65, 0.f);
  big[0] = 1.f;
  const std::string hex = DenseLiteralText({DType::F32, {65}}, Bytes<float>(big));
  EXPECT_EQ(hex.substr(0, 18), "dense<\"0x0000803F0");
  const std::string tail = "0000\"> : tensor<65xf32>";
  EXPECT_EQ(hex.substr(hex.size() - tail.size()), tail);
  EXPECT_EQ(hex.size(), std::string("dense<\"0x\"> : tensor<65xf32>").size() + 65 * 8);
}

TEST(Printer, LinearAlgebraAndCustomCallLines) {
  Builder b;
  auto a = b.Parameter({DType::F32, {2, 3, 3}});
  auto rhs = b.Parameter({DType::F32, {2, 3, 4}});
  auto l = b.Cholesky(a, true);
  auto x = b.TriangularSolve(l, rhs, true, true, false, true);
  auto qr = b.CustomCall("Qr", {a}, {{DType::F32, {2, 3, 3}}, {DType::F32, {2, 3}}});
  auto e = b.CustomCall("Eigh", {a}, {{DType::F32, {2, 3, 3}}, {DType::F32, {2, 3}}}, "1,1,100,1e-06");
  const std::string text = PrintStableHlo(b.Build({x, qr[1], e[0]}));
  EXPECT_NE(text.find(R"(%2 = "stablehlo.cholesky"(%arg0) {lower = true} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>)"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(%3 = "stablehlo.triangular_solve"(%2, %arg1) {left_side = true, lower = true, transpose_a = #stablehlo<transpose TRANSPOSE>, unit_diagonal = false} : (tensor<2x3x3xf32>, tensor<2x3x4xf32>) -> tensor<2x3x4xf32>)"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(%4:2 = "stablehlo.custom_call"(%arg0) {call_target_name = "Qr"} : (tensor<2x3x3xf32>) -> (tensor<2x3x3xf32>, tensor<2x3xf32>))"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(%5:2 = "stablehlo.custom_call"(%arg0) {call_target_name = "Eigh", backend_config = "1,1,100,1e-06"} : (tensor<2x3x3xf32>) -> (tensor<2x3x3xf32>, tensor<2x3xf32>))"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"("func.return"(%3, %4#1, %5#0))"), std::string::npos) << text;
}

TEST(Printer, LongElementwiseChainsAreCutIntoStoredValues) {
  // 300 steps of x = exp(x) * 0.5 + x: fused whole, one kernel of every
  // step (weight 18 each: exp 16). Cut where a region would pass 2000,
  // about every 111 steps: the value that passes it and the next step's
  // sum, which reads the last region too, are stored.
  Builder b;
  auto x = b.Parameter({DType::F32, {8}});
  auto half = b.Full(DType::F32, {8}, 0.5);
  Value v = x;
  for (int i = 0; i < 300; ++i) v = b.Binary(Op::Add, b.Binary(Op::Mul, b.Unary(Op::Exp, v), half), v);
  const std::string text = PrintStableHlo(b.Build({v}, {}));
  size_t stores = 0;
  const std::string scatter = "\"stablehlo.scatter\"(";
  for (size_t at = text.find(scatter); at != std::string::npos; at = text.find(scatter, at + 1)) {
    ++stores;
  }
  EXPECT_GE(stores, 2u) << text;
  EXPECT_LE(stores, 6u) << text;
  // a short chain is left whole
  Builder s;
  auto y = s.Parameter({DType::F32, {8}});
  Value w = y;
  for (int i = 0; i < 20; ++i) w = s.Binary(Op::Add, s.Unary(Op::Exp, w), w);
  EXPECT_EQ(PrintStableHlo(s.Build({w}, {})).find("stablehlo.scatter"), std::string::npos);
}

}  // namespace
}  // namespace tpj::ir
