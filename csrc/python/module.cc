// torch_pjrt._C: the extension module. Python is a thin shell over the C++
// layers; this file only registers the pieces.
#include <torch/csrc/utils/pybind.h>

#include "aten/derived.h"
#include "python/bind.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-pjrt native core: PJRT runtime, graph IR and StableHLO printer";
  tpj::python::BindErrors(m);
  tpj::python::BindPjrt(m);
  tpj::python::BindIr(m.def_submodule("ir", "Graph IR builder and StableHLO printer"));
  tpj::python::BindTorch(m);
  // After every static TORCH_LIBRARY_IMPL of ours: the in-place and out=
  // forms derived from their functional lowerings (aten/derived.h).
  tpj::aten::RegisterDerivedKernels();
}
