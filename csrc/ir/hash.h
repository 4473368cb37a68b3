// Hashes of a graph, both over the ops, the wiring (operands and outputs),
// aliases and the replica and partition counts, and never over locations.
// Equal graphs hash equal; "differ" below means: differ with overwhelming
// probability.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace tpj::ir {

// Identifies the program: differs when anything above or any attribute field
// (every field each attribute struct lists in Fields), result shape, dtype or
// constant byte differs. The compile caches key on it.
uint64_t ProgramHash(const Graph& graph);

// Blind to shapes, dtypes and constant values: graphs that differ only in
// those share it, so it finds the earlier compile a recompile resembles. Of
// the attributes it covers the parameter numbering and the enum, bool and
// string fields, which choose what is computed (compare direction, reduction
// kind, scatter replace, sort order, custom call target); integer fields are left out, as they follow
// the shapes (sizes, slice bounds, padding, dimension numbers).
uint64_t ShapeBlindHash(const Graph& graph);

// Whether two attribute values are the same alternative with equal fields
// (every field Fields lists; constant bytes compared by value).
bool SameAttrs(const Attrs& a, const Attrs& b);

}  // namespace tpj::ir
