// The op table: every IR op, its StableHLO name and its operand form.
#pragma once

#include <cstdint>

namespace tpj::ir {

// X(enum, stablehlo name, form)
#define TPJ_IR_OPS(X)                                            \
  X(Parameter, "", kSpecial)                                     \
  X(Constant, "stablehlo.constant", kSpecial)                    \
  X(Convert, "stablehlo.convert", kSpecial)                      \
  X(BitcastConvert, "stablehlo.bitcast_convert", kSpecial)       \
  X(Add, "stablehlo.add", kBinary)                               \
  X(Sub, "stablehlo.subtract", kBinary)                          \
  X(Mul, "stablehlo.multiply", kBinary)                          \
  X(Div, "stablehlo.divide", kBinary)                            \
  X(Rem, "stablehlo.remainder", kBinary)                         \
  X(Pow, "stablehlo.power", kBinary)                             \
  X(Max, "stablehlo.maximum", kBinary)                           \
  X(Min, "stablehlo.minimum", kBinary)                           \
  X(Atan2, "stablehlo.atan2", kBinary)                           \
  X(And, "stablehlo.and", kLogical)                              \
  X(Or, "stablehlo.or", kLogical)                                \
  X(Xor, "stablehlo.xor", kLogical)                              \
  X(ShiftLeft, "stablehlo.shift_left", kLogical)                 \
  X(ShiftRightArithmetic, "stablehlo.shift_right_arithmetic", kLogical) \
  X(ShiftRightLogical, "stablehlo.shift_right_logical", kLogical) \
  X(Not, "stablehlo.not", kLogicalUnary)                         \
  X(Neg, "stablehlo.negate", kUnary)                             \
  X(Abs, "stablehlo.abs", kUnary)                                \
  X(Sign, "stablehlo.sign", kUnary)                              \
  X(Exp, "stablehlo.exponential", kFloatUnary)                   \
  X(Expm1, "stablehlo.exponential_minus_one", kFloatUnary)       \
  X(Log, "stablehlo.log", kFloatUnary)                           \
  X(Log1p, "stablehlo.log_plus_one", kFloatUnary)                \
  X(Tanh, "stablehlo.tanh", kFloatUnary)                         \
  X(Logistic, "stablehlo.logistic", kFloatUnary)                 \
  X(Sqrt, "stablehlo.sqrt", kFloatUnary)                         \
  X(Rsqrt, "stablehlo.rsqrt", kFloatUnary)                       \
  X(Cbrt, "stablehlo.cbrt", kFloatUnary)                         \
  X(Sin, "stablehlo.sine", kFloatUnary)                          \
  X(Cos, "stablehlo.cosine", kFloatUnary)                        \
  X(Tan, "stablehlo.tan", kFloatUnary)                           \
  X(Floor, "stablehlo.floor", kRealFloatUnary)                   \
  X(Ceil, "stablehlo.ceil", kRealFloatUnary)                     \
  X(Round, "stablehlo.round_nearest_even", kRealFloatUnary)      \
  X(RoundAwayFromZero, "stablehlo.round_nearest_afz", kRealFloatUnary) \
  X(IsFinite, "stablehlo.is_finite", kSpecial)                   \
  X(Erf, "chlo.erf", kRealFloatUnary)                            \
  X(Erfc, "chlo.erfc", kRealFloatUnary)                          \
  X(Lgamma, "chlo.lgamma", kRealFloatUnary)                      \
  X(Digamma, "chlo.digamma", kRealFloatUnary)                    \
  X(Polygamma, "chlo.polygamma", kBinary)                        \
  X(Zeta, "chlo.zeta", kBinary)                                  \
  X(Compare, "stablehlo.compare", kSpecial)                      \
  X(Select, "stablehlo.select", kSpecial)                        \
  X(Clamp, "stablehlo.clamp", kSpecial)                          \
  X(BroadcastInDim, "stablehlo.broadcast_in_dim", kSpecial)      \
  X(Reshape, "stablehlo.reshape", kSpecial)                      \
  X(Transpose, "stablehlo.transpose", kSpecial)                  \
  X(Reverse, "stablehlo.reverse", kSpecial)                      \
  X(Slice, "stablehlo.slice", kSpecial)                          \
  X(DynamicSlice, "stablehlo.dynamic_slice", kSpecial)           \
  X(DynamicUpdateSlice, "stablehlo.dynamic_update_slice", kSpecial) \
  X(Concatenate, "stablehlo.concatenate", kSpecial)              \
  X(Pad, "stablehlo.pad", kSpecial)                              \
  X(Iota, "stablehlo.iota", kSpecial)                            \
  X(DotGeneral, "stablehlo.dot_general", kSpecial)               \
  X(Reduce, "stablehlo.reduce", kSpecial)                        \
  X(ReduceWindow, "stablehlo.reduce_window", kSpecial)           \
  X(SelectAndScatter, "stablehlo.select_and_scatter", kSpecial)  \
  X(Convolution, "stablehlo.convolution", kSpecial)              \
  X(Gather, "stablehlo.gather", kSpecial)                        \
  X(Scatter, "stablehlo.scatter", kSpecial)                      \
  X(Sort, "stablehlo.sort", kSpecial)                            \
  X(TopK, "chlo.top_k", kSpecial)                                \
  X(RngBitGenerator, "stablehlo.rng_bit_generator", kSpecial)    \
  X(AllReduce, "stablehlo.all_reduce", kSpecial)                 \
  X(AllGather, "stablehlo.all_gather", kSpecial)                 \
  X(ReduceScatter, "stablehlo.reduce_scatter", kSpecial)         \
  X(Real, "stablehlo.real", kSpecial)                            \
  X(Imag, "stablehlo.imag", kSpecial)                            \
  X(Complex, "stablehlo.complex", kSpecial)                      \
  X(Fft, "stablehlo.fft", kSpecial)                              \
  X(Cholesky, "stablehlo.cholesky", kSpecial)                    \
  X(TriangularSolve, "stablehlo.triangular_solve", kSpecial)     \
  X(CustomCall, "stablehlo.custom_call", kSpecial)              \
  X(Call, "func.call", kSpecial)

enum class Op : uint8_t {
#define TPJ_ENUM(name, mlir, form) name,
  TPJ_IR_OPS(TPJ_ENUM)
#undef TPJ_ENUM
};

// How an op's operands and result relate, for the generic checks in infer.cc.
enum class OpForm : uint8_t {
  kUnary,           // numeric x -> same type
  kFloatUnary,      // float or complex x -> same type
  kRealFloatUnary,  // float x -> same type
  kLogicalUnary,    // bool or integer x -> same type
  kBinary,          // numeric x, y of one shape and type -> same
  kLogical,         // bool or integer x, y -> same
  kSpecial,         // its own rule
};

const char* OpName(Op op);       // "Add"
const char* MlirOpName(Op op);   // "stablehlo.add"
OpForm Form(Op op);

}  // namespace tpj::ir
