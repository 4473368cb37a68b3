// Structural hash of a graph: equal for graphs that print the same program,
// different (with overwhelming probability) when an op, an attribute, a
// shape, a dtype, a constant or the wiring differs. Locations are ignored.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace tpj::ir {

uint64_t StructuralHash(const Graph& graph);

// The same, blind to shapes, dtypes and constant values: graphs that differ
// only in those share it. Used to explain recompilations.
uint64_t StructureHash(const Graph& graph);

}  // namespace tpj::ir
