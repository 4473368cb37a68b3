// Registration functions of the _C extension, one per layer.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "pjrt/client.h"

namespace tpj::python {

// pjrt::Error -> torch_pjrt._C.PjrtError (a RuntimeError with .code);
// ir::Error -> ValueError.
// A Python dict of client options (bool, int, float, str, list of int) as
// PJRT named values.
std::vector<pjrt::NamedOption> NamedOptions(const pybind11::dict& d);

void BindErrors(pybind11::module_& m);
void BindPjrt(pybind11::module_& m);
void BindIr(pybind11::module_ m);
// The pjrt PyTorch device (only in builds with torch).
void BindTorch(pybind11::module_& m);
// Recording and replaying torch.compile graphs (called by BindTorch).
void BindReplay(pybind11::module_& m);

}  // namespace tpj::python
