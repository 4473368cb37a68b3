// StableHLO text for a Graph: one module with a public @main (and a private
// @callN for each graph its Call nodes call), in MLIR's
// generic op form ("stablehlo.add"(...) : (...) -> ...), the least fragile
// form across parser versions. Replica/partition counts go on the module as
// mhlo.num_replicas / mhlo.num_partitions, donation as tf.aliasing_output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace tpj::ir {

std::string PrintStableHlo(const Graph& graph);

// The dense<...> : tensor<...> literal of a constant (exposed for tests).
std::string DenseLiteralText(const Shape& shape, const std::vector<uint8_t>& bytes);

}  // namespace tpj::ir
