// Element types and static shapes of IR values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpj::ir {

enum class DType : uint8_t { Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64, C64, C128 };
inline constexpr int kNumDTypes = 15;

size_t ByteSize(DType t);
const char* MlirName(DType t);  // i1, i8, ui8, bf16, f32, complex<f32>, ...
const char* Name(DType t);      // bool, int8, uint8, bfloat16, float32, complex64, ...
bool IsFloat(DType t);          // f16, bf16, f32, f64
bool IsComplex(DType t);
bool IsSignedInt(DType t);
bool IsUnsignedInt(DType t);    // u8..u64 (not bool)
inline bool IsInteger(DType t) { return IsSignedInt(t) || IsUnsignedInt(t); }

// Errors of IR construction: bad shapes, dtypes or attributes. The message
// names the op and its operands.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Shape {
  DType dtype = DType::F32;
  std::vector<int64_t> dims;

  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * ByteSize(dtype); }
  std::string ToString() const;  // tensor<2x3xf32>
  bool operator==(const Shape& o) const { return dtype == o.dtype && dims == o.dims; }
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

}  // namespace tpj::ir
