#include "runtime/dtype_map.h"

#include <string>

namespace tpj::runtime {

pjrt_abi::BufferType ToPjrt(ir::DType t) {
  switch (t) {
    case ir::DType::Bool: return pjrt_abi::kPred;
    case ir::DType::I8: return pjrt_abi::kS8;
    case ir::DType::I16: return pjrt_abi::kS16;
    case ir::DType::I32: return pjrt_abi::kS32;
    case ir::DType::I64: return pjrt_abi::kS64;
    case ir::DType::U8: return pjrt_abi::kU8;
    case ir::DType::U16: return pjrt_abi::kU16;
    case ir::DType::U32: return pjrt_abi::kU32;
    case ir::DType::U64: return pjrt_abi::kU64;
    case ir::DType::F16: return pjrt_abi::kF16;
    case ir::DType::BF16: return pjrt_abi::kBF16;
    case ir::DType::F32: return pjrt_abi::kF32;
    case ir::DType::F64: return pjrt_abi::kF64;
    case ir::DType::C64: return pjrt_abi::kC64;
    case ir::DType::C128: return pjrt_abi::kC128;
  }
  return pjrt_abi::kInvalid;
}

ir::DType FromPjrt(pjrt_abi::BufferType t) {
  for (int i = 0; i < ir::kNumDTypes; ++i) {
    const auto d = static_cast<ir::DType>(i);
    if (ToPjrt(d) == t) return d;
  }
  throw ir::Error("PJRT buffer type " + std::to_string(static_cast<int>(t)) +
                  " has no torch-pjrt dtype");
}

}  // namespace tpj::runtime
