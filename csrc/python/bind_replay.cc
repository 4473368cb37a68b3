// Recording and replaying torch.compile graphs (aten/replay.h) for
// torch_pjrt.dynamo.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "aten/replay.h"
#include "python/bind.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tpj::python {
namespace {

// Tensors of a Python sequence; any other value is nullopt.
aten::MaybeTensors Tensors(const py::handle& seq) {
  aten::MaybeTensors out;
  PyObject* fast = PySequence_Fast(seq.ptr(), "expected a sequence");
  if (!fast) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (THPVariable_Check(items[i])) {
      out.emplace_back(THPVariable_Unpack(items[i]));
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  Py_DECREF(fast);
  return out;
}

// The `join` argument of _replay_begin and _replay_run.
runtime::Runtime::ReplayJoin Join(int join) {
  if (join < 0 || join > 2) throw py::value_error("join must be 0 (never), 1 (when work is pending) or 2 (always)");
  return static_cast<runtime::Runtime::ReplayJoin>(join);
}

}  // namespace

void BindReplay(py::module_& m) {
  py::class_<aten::Recording>(m, "_Recording");
  py::class_<aten::Replayable, std::shared_ptr<aten::Replayable>>(m, "_Replayable");
  m.def(
      "_replay_begin",
      [](const py::sequence& inputs, int join) {
        const runtime::Runtime::ReplayJoin how = Join(join);
        aten::MaybeTensors ts = Tensors(inputs);
        py::gil_scoped_release release;
        return aten::BeginRecording(ts, how);
      },
      py::arg("inputs"), py::arg("join"),
      "Before tracing a compiled graph's first call, which `join` (as _replay_run's) would join to the pending\n"
      "trace: recorded in that trace; otherwise pending inputs are synced first.");
  m.def(
      "_replay_end",
      [](aten::Recording& rec, const py::sequence& inputs, const py::sequence& outputs) {
        aten::MaybeTensors in = Tensors(inputs), out = Tensors(outputs);
        std::string why;
        std::shared_ptr<aten::Replayable> r;
        {
          py::gil_scoped_release release;
          r = aten::EndRecording(rec, in, out, &why);
        }
        py::object program = py::none();
        if (r) program = py::cast(r);
        return py::make_tuple(program, why);
      },
      "After tracing it: (replayable program or None, why not); syncs unless recorded in the pending trace.");
  m.def(
      "_replay_run",
      [](const aten::Replayable& r, const py::sequence& inputs, int join) -> py::object {
        const runtime::Runtime::ReplayJoin how = Join(join);
        aten::MaybeTensors in = Tensors(inputs);
        std::optional<aten::MaybeTensors> out;
        {
          py::gil_scoped_release release;
          out = r.Run(in, how);
        }
        if (!out) return py::none();
        py::list result(out->size());
        for (size_t i = 0; i < out->size(); ++i) {
          auto& t = (*out)[i];
          py::object o = py::none();
          if (t) o = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(*t)));
          result[i] = o;
        }
        return result;
      },
      py::arg("program"), py::arg("inputs"), py::arg("join"),
      "Runs the recorded program on new inputs (launched, or joining the pending trace: `join` 0 never, 1 when "
      "the device has pending work, 2 always): the outputs (None where not a tensor), or None when the inputs do "
      "not match the recording (nothing ran).");
  m.def("_start_launch_log", [] { runtime::Runtime::Get().StartLaunchLog(); },
        py::call_guard<py::gil_scoped_release>(), "bench: remember the programs launched from now on");
  m.def("_execute_logged_programs", [](int iterations) { return runtime::Runtime::Get().ExecuteLoggedPrograms(iterations); },
        py::call_guard<py::gil_scoped_release>(), py::arg("iterations"),
        "bench: seconds per run of the remembered programs alone, on zero-filled arguments");
}

}  // namespace tpj::python
