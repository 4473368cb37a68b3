// In-place and out= kernels derived from the functional lowerings.
//
// A lowering is written once, as the functional op (`add.Tensor`). Its
// in-place form (`add_.Tensor`) and out= forms (`add.out`) are found in the
// dispatcher by their schemas and get one boxed kernel that calls the
// functional op and writes its results, with PyTorch's rules for outputs:
// the result dtype must be castable to the output's, in-place never
// broadcasts self, a wrong-shaped out is resized (at::native::resize_output,
// with its warning), and out may alias an input or be any view.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tpj::aten {

// Registers the derived kernels for every aten in-place/out= overload that
// has no PrivateUse1 kernel and no CompositeImplicitAutograd kernel, and whose
// functional twin has a PrivateUse1 kernel. Call once every static
// TORCH_LIBRARY_IMPL of ours has run (the extension's init does); later calls
// do nothing.
void RegisterDerivedKernels();

// (derived overload, functional overload) pairs registered, e.g.
// ("aten::add.out", "aten::add.Tensor"); empty before RegisterDerivedKernels.
std::vector<std::pair<std::string, std::string>> DerivedKernels();

}  // namespace tpj::aten
