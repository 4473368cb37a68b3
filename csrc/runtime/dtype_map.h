// IR dtypes <-> PJRT buffer types.
#pragma once

#include "ir/dtype.h"
#include "pjrt/c_api.h"

namespace tpj::runtime {

pjrt_abi::BufferType ToPjrt(ir::DType t);
// Throws ir::Error for PJRT types the IR has no dtype for.
ir::DType FromPjrt(pjrt_abi::BufferType t);

}  // namespace tpj::runtime
