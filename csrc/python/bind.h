// Registration functions of the _C extension, one per layer.
#pragma once

#include <pybind11/pybind11.h>

namespace tpj::python {

// pjrt::Error -> torch_pjrt._C.PjrtError (a RuntimeError with .code);
// ir::Error -> ValueError.
void BindErrors(pybind11::module_& m);
void BindPjrt(pybind11::module_& m);
void BindIr(pybind11::module_ m);
// The pjrt PyTorch device (only in builds with torch).
void BindTorch(pybind11::module_& m);

}  // namespace tpj::python
