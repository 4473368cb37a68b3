// Shape and dtype inference: the result shapes of an op from its operand
// shapes and attributes, or an Error that names the op, the operands'
// shapes and dtypes, and what is wrong.
#pragma once

#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"

namespace tpj::ir {

// Not for Parameter, Constant and Iota, whose result shape is given.
std::vector<Shape> InferResults(Op op, const std::vector<Shape>& operands, const Attrs& attrs);

}  // namespace tpj::ir
