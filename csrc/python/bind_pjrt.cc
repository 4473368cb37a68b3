// Python view of the PJRT layer: plugins, clients, buffers (numpy in and
// out), executables. The GIL is released around plugin calls that can block.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "ir/graph.h"
#include "pjrt/buffer_bytes.h"
#include "pjrt/discovery.h"
#include "pjrt/executable.h"
#include "python/bind.h"
#include "runtime/options.h"
#include "runtime/runtime.h"
#include "runtime/program.h"

namespace py = pybind11;

namespace tpj::python {
namespace {

pjrt_abi::BufferType NumpyType(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'b') return pjrt_abi::kPred;
  if (kind == 'i') return size == 1 ? pjrt_abi::kS8 : size == 2 ? pjrt_abi::kS16 : size == 4 ? pjrt_abi::kS32 : pjrt_abi::kS64;
  if (kind == 'u') return size == 1 ? pjrt_abi::kU8 : size == 2 ? pjrt_abi::kU16 : size == 4 ? pjrt_abi::kU32 : pjrt_abi::kU64;
  if (kind == 'f') {
    if (size == 2) return pjrt_abi::kF16;
    if (size == 4) return pjrt_abi::kF32;
    if (size == 8) return pjrt_abi::kF64;
  }
  if (kind == 'c') {
    if (size == 8) return pjrt_abi::kC64;
    if (size == 16) return pjrt_abi::kC128;
  }
  throw py::type_error("numpy dtype " + std::string(py::str(static_cast<const py::object&>(dt))) + " has no PJRT buffer type");
}

py::dtype NumpyDtype(pjrt_abi::BufferType t) {
  switch (t) {
    case pjrt_abi::kPred: return py::dtype("bool");
    case pjrt_abi::kS8: return py::dtype("int8");
    case pjrt_abi::kS16: return py::dtype("int16");
    case pjrt_abi::kS32: return py::dtype("int32");
    case pjrt_abi::kS64: return py::dtype("int64");
    case pjrt_abi::kU8: return py::dtype("uint8");
    case pjrt_abi::kU16: return py::dtype("uint16");
    case pjrt_abi::kU32: return py::dtype("uint32");
    case pjrt_abi::kU64: return py::dtype("uint64");
    case pjrt_abi::kF16: return py::dtype("float16");
    case pjrt_abi::kF32: return py::dtype("float32");
    case pjrt_abi::kF64: return py::dtype("float64");
    case pjrt_abi::kC64: return py::dtype("complex64");
    case pjrt_abi::kC128: return py::dtype("complex128");
    default:
      throw py::type_error(std::string("PJRT buffer type ") + pjrt::TypeName(t) +
                           " has no numpy dtype (bfloat16 included); convert it on device first");
  }
}

}  // namespace

std::vector<pjrt::NamedOption> NamedOptions(const py::dict& d) {
  std::vector<pjrt::NamedOption> out;
  for (auto item : d) {
    pjrt::NamedOption o;
    o.name = py::cast<std::string>(item.first);
    py::handle v = item.second;
    if (py::isinstance<py::bool_>(v)) {
      o.value = v.cast<bool>();
    } else if (py::isinstance<py::int_>(v)) {
      o.value = v.cast<int64_t>();
    } else if (py::isinstance<py::float_>(v)) {
      o.value = v.cast<float>();
    } else if (py::isinstance<py::str>(v)) {
      o.value = v.cast<std::string>();
    } else {
      o.value = v.cast<std::vector<int64_t>>();
    }
    out.push_back(std::move(o));
  }
  return out;
}

namespace {

// The global id of this process's pjrt device `index`, or IndexError.
int AddressableId(const pjrt::Client& c, int index) {
  const auto& ids = c.addressable_device_ids();
  if (index < 0 || static_cast<size_t>(index) >= ids.size()) {
    throw py::index_error("pjrt device index " + std::to_string(index) + " is out of range: this process has " +
                          std::to_string(ids.size()) + " pjrt device(s)");
  }
  return ids[static_cast<size_t>(index)];
}

py::dict DeviceDict(const pjrt::Device& d) {
  py::dict out;
  out["id"] = d.id;
  out["process_index"] = d.process_index;
  out["local_hardware_id"] = d.local_hardware_id;
  out["addressable"] = d.addressable;
  out["kind"] = d.kind;
  out["debug_string"] = d.debug_string;
  return out;
}

// torch_pjrt._C.PjrtOutOfMemoryError, a PjrtError that is also a
// torch.OutOfMemoryError (pjrt::Error::out_of_memory), so that device-agnostic
// `except torch.OutOfMemoryError` catches it; plain PjrtError while torch is
// not imported (the runtime without PyTorch).
// `module`.`name` (a new reference) when `module` is imported, else null
// with no Python error set: torch's exception types, without importing torch.
PyObject* ImportedAttr(const char* module, const char* name) {
  PyObject* mod = PyImport_GetModule(py::str(module).ptr());
  PyObject* attr = mod != nullptr ? PyObject_GetAttrString(mod, name) : nullptr;
  Py_XDECREF(mod);
  if (attr == nullptr) PyErr_Clear();
  return attr;
}

PyObject* OutOfMemoryType(PyObject* pjrt_error) {
  static PyObject* type = nullptr;
  if (type != nullptr) return type;
  PyObject* base = ImportedAttr("torch", "OutOfMemoryError");
  if (base == nullptr) return pjrt_error;
  PyObject* bases = PyTuple_Pack(2, pjrt_error, base);
  Py_DECREF(base);
  type = PyErr_NewExceptionWithDoc("torch_pjrt._C.PjrtOutOfMemoryError",
                                   "A PJRT plugin ran out of device memory (RESOURCE_EXHAUSTED).", bases, nullptr);
  Py_DECREF(bases);
  if (type == nullptr) PyErr_Clear();
  return type != nullptr ? type : pjrt_error;
}

// torch.linalg.LinAlgError while torch is imported, else RuntimeError.
PyObject* LinAlgErrorType() {
  PyObject* type = ImportedAttr("torch.linalg", "LinAlgError");
  if (type == nullptr) return PyExc_RuntimeError;
  Py_DECREF(type);  // the module keeps it alive
  return type;
}

}  // namespace

void BindErrors(py::module_& m) {
  // The exception type lives as long as the interpreter (module attribute,
  // plus this reference), so the translator can use the raw pointer.
  static PyObject* pjrt_error =
      PyErr_NewExceptionWithDoc("torch_pjrt._C.PjrtError",
                                "An error from a PJRT plugin, or bad input caught before calling it. "
                                "Attributes: code (absl status code), code_name.",
                                PyExc_RuntimeError, nullptr);
  m.attr("PjrtError") = py::handle(pjrt_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pjrt::Error& e) {
      PyObject* type = e.out_of_memory() ? OutOfMemoryType(pjrt_error) : pjrt_error;
      py::object err = py::handle(type)(e.what());
      err.attr("code") = e.code();
      err.attr("code_name") = pjrt::CodeName(e.code());
      PyErr_SetObject(type, err.ptr());
    } catch (const ir::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const runtime::TensorError& e) {
      PyObject* type = e.kind() == runtime::ErrorKind::kIndex         ? PyExc_IndexError
                       : e.kind() == runtime::ErrorKind::kOutOfMemory ? OutOfMemoryType(pjrt_error)
                       : e.kind() == runtime::ErrorKind::kLinAlg      ? LinAlgErrorType()
                                                                      : PyExc_RuntimeError;
      PyErr_SetString(type, e.what());
    }
  });
}

void BindPjrt(py::module_& m) {
  m.def(
      "find_plugin",
      [](const std::string& device, const std::vector<std::string>& dirs) {
        auto c = runtime::ChoosePlugin(runtime::Options::FromEnvironment(), device, dirs);
        return py::make_tuple(c.path, c.device, c.reason);
      },
      py::arg("device") = "", py::arg("search_dirs") = std::vector<std::string>{},
      "Returns (path, device, reason) of the plugin to load; raises PjrtError when none is installed.");
  m.def(
      "default_client_options",
      [](const std::string& device, const std::vector<std::string>& dirs) {
        const runtime::Options o = runtime::Options::FromEnvironment();
        py::dict d;
        for (const auto& opt : runtime::ClientOptions(o, runtime::ChoosePlugin(o, device, dirs))) {
          d[py::str(opt.name)] = std::visit([](const auto& v) { return py::cast(v); }, opt.value);
        }
        return d;
      },
      py::arg("device") = "", py::arg("search_dirs") = std::vector<std::string>{},
      "Client options the environment implies for the plugin of `device` (CPU_NUM_DEVICES, ...).");
  m.def(
      "plugin_candidates",
      [](const std::string& device, const std::vector<std::string>& dirs, bool probe) {
        const runtime::Options o = runtime::Options::FromEnvironment();
        std::vector<pjrt::PluginCandidate> found =
            pjrt::ListPlugins(device.empty() ? o.device : device, o.search_path.empty() ? dirs : o.search_path);
        if (probe) {
          py::gil_scoped_release release;
          pjrt::ProbeApiVersions(found);
        }
        py::list out;
        for (const auto& c : found) {
          py::dict d;
          d["path"] = c.path;
          d["package"] = c.package;
          d["pjrt_api_version"] =
              c.api_major < 0 ? std::string() : std::to_string(c.api_major) + "." + std::to_string(c.api_minor);
          d["problem"] = c.problem;
          out.append(d);
        }
        return out;
      },
      py::arg("device") = "", py::arg("search_dirs") = std::vector<std::string>{}, py::arg("probe") = true,
      "Every installed plugin for `device` (default PJRT_DEVICE, else CPU), in layout order, with the PJRT API "
      "version each reports (read in a child process when `probe`).");
  m.def(
      "_pick_newest_api",
      [](const std::vector<std::pair<int, int>>& versions) {
        std::vector<pjrt::PluginCandidate> c(versions.size());
        for (size_t i = 0; i < versions.size(); ++i) std::tie(c[i].api_major, c[i].api_minor) = versions[i];
        return pjrt::PickNewestApi(c);
      },
      py::arg("versions"), "The discovery rule on recorded (major, minor) versions: the index it picks, or -1.");
  m.def(
      "_await_launched",
      []() -> std::vector<std::string> {
        if (!runtime::Runtime::Initialized() || pjrt::InForkedChild()) return {};
        return runtime::Runtime::Get().AwaitLaunched();
      },
      py::call_guard<py::gil_scoped_release>(),
      "Waits for every launched program (launches nothing, raises nothing); run at interpreter exit. Returns the "
      "failures nothing read: programs that failed to run, failed checks.");
  m.def(
      "_pending_checks",
      [] { return runtime::Runtime::Initialized() && !pjrt::InForkedChild() && runtime::Runtime::Get().PendingChecks(); },
      "Whether pending work holds a check (index, divisor, ...) that a sync would run.");
  m.def(
      "_launches_done",
      [] {
        if (pjrt::InForkedChild()) return true;
        if (runtime::CompilesRunning() > 0) return false;  // interrupted ones too
        if (!runtime::Runtime::Initialized()) return true;
        runtime::Runtime& r = runtime::Runtime::Get();
        for (int d = 0; d < r.device_count(); ++d) {
          if (!r.LaunchesDone(d)) return false;
        }
        return true;
      },
      py::call_guard<py::gil_scoped_release>(),
      "Whether every launched program and every compile has finished (waits for nothing).");
  m.def(
      "_memory_stats",
      [](int index) -> py::object {
        pjrt::Client& c = runtime::Runtime::Get().client();
        auto stats = c.MemoryStats(AddressableId(c, index));
        if (!stats) return py::none();
        py::dict d;
        for (const auto& [name, value] : *stats) d[py::str(name)] = value;
        return d;
      },
      py::arg("index"));
  m.def(
      "_mem_get_info", [](int index) { return runtime::DeviceMemoryInfo(runtime::Runtime::Get().client(), index); },
      py::arg("index"), "(free, total) bytes of pjrt device `index` (torch.pjrt.mem_get_info).");
  m.def(
      "_device_info",
      [](int index) {
        pjrt::Client& c = runtime::Runtime::Get().client();
        return DeviceDict(c.device(AddressableId(c, index)));
      },
      py::arg("index"), "id, kind, debug_string, ... of this process's pjrt device `index`.");
  m.def(
      "_buffer_bytes",
      [](int index) {
        const pjrt::BufferBytes b = runtime::Runtime::Get().LiveBytes(index);
        return std::make_tuple(b.in_use, b.peak, b.buffers);
      },
      py::arg("index"), "(bytes in use, peak bytes, buffer count) of our live buffers on pjrt device `index`.");
  m.def(
      "_reset_peak_buffer_bytes",
      [](int index) { runtime::Runtime::Get().ResetPeakBytes(index); }, py::arg("index"));
  m.def("register_plugin", &pjrt::RegisterPlugin, py::arg("name"), py::arg("path"));
  m.def("package_hint", &pjrt::PackageHint, py::arg("device"));

  py::class_<pjrt::Plugin, std::shared_ptr<pjrt::Plugin>>(m, "Plugin")
      .def_static(
          "load",
          [](const std::string& path) {
            runtime::ApplyPluginLogLevel();  // the plugin's informational lines stay quiet (TORCH_PJRT_LOG_LEVEL)
            return std::const_pointer_cast<pjrt::Plugin>(pjrt::Plugin::Load(path));
          },
          py::arg("path"))
      .def_property_readonly("path", &pjrt::Plugin::path)
      .def_property_readonly("api_version",
                             [](const pjrt::Plugin& p) { return py::make_tuple(p.major_version(), p.minor_version()); })
      .def_property_readonly("attributes", &pjrt::Plugin::attributes);

  py::class_<pjrt::Buffer>(m, "Buffer")
      .def_property_readonly("dims", &pjrt::Buffer::dims)
      .def_property_readonly("dtype", [](const pjrt::Buffer& b) { return std::string(pjrt::TypeName(b.element_type())); })
      .def_property_readonly("device_id", &pjrt::Buffer::device_id)
      .def_property_readonly("is_deleted", &pjrt::Buffer::is_deleted)
      .def_property_readonly("on_device_size", &pjrt::Buffer::on_device_size)
      .def("delete", &pjrt::Buffer::Delete)
      .def("block_until_ready", &pjrt::Buffer::AwaitReady, py::call_guard<py::gil_scoped_release>())
      .def("to_numpy", [](const pjrt::Buffer& b) {
        py::array out(NumpyDtype(b.element_type()), b.dims());
        const size_t n = static_cast<size_t>(out.nbytes());
        void* dst = out.mutable_data();
        {
          py::gil_scoped_release release;
          b.ToHost(dst, n);
        }
        return out;
      });

  py::class_<pjrt::Executable>(m, "Executable")
      .def_property_readonly("num_outputs", &pjrt::Executable::num_outputs)
      .def(
          "execute",
          [](pjrt::Executable& e, const std::vector<std::vector<pjrt::Buffer*>>& args) {
            std::vector<std::vector<std::unique_ptr<pjrt::Buffer>>> out;
            {
              py::gil_scoped_release release;
              out = e.ExecuteReplicated(args);
            }
            py::list result;
            for (auto& replica : out) {
              py::list l;
              for (auto& b : replica) l.append(py::cast(std::move(b)));
              result.append(l);
            }
            return result;
          },
          py::arg("args"), "args[r] are the buffers of replica r; returns outputs[r][i].")
      .def("serialize", [](const pjrt::Executable& e) { return py::bytes(e.Serialize()); });

  py::class_<pjrt::Client, std::shared_ptr<pjrt::Client>>(m, "Client")
      .def(py::init([](const std::shared_ptr<pjrt::Plugin>& p, const py::dict& options) {
             return pjrt::Client::Create(p, NamedOptions(options));
           }),
           py::arg("plugin"), py::arg("options") = py::dict())
      .def_property_readonly("platform_name", &pjrt::Client::platform_name)
      .def_property_readonly("platform_version", &pjrt::Client::platform_version)
      .def_property_readonly("process_index", &pjrt::Client::process_index)
      .def_property_readonly("addressable_device_ids", &pjrt::Client::addressable_device_ids)
      .def("devices",
           [](const pjrt::Client& c) {
             py::list l;
             for (const auto& d : c.devices()) l.append(DeviceDict(d));
             return l;
           })
      .def(
          "memory_stats",
          [](const pjrt::Client& c, int device_id) -> py::object {
            auto stats = c.MemoryStats(device_id);
            if (!stats) return py::none();
            py::dict d;
            for (const auto& [name, value] : *stats) d[py::str(name)] = value;
            return d;
          },
          py::arg("device_id"),
          "The plugin's allocator statistics for a device (PJRT_Device_MemoryStats), or None when the plugin "
          "does not report them.")
      .def(
          "buffer_from_numpy",
          [](pjrt::Client& c, const py::array& a, int device_id) {
            py::array dense = py::array::ensure(a, py::array::c_style);
            if (!dense) throw py::type_error("expected an array-like value");
            std::vector<int64_t> dims(dense.shape(), dense.shape() + dense.ndim());
            const auto type = NumpyType(dense.dtype());
            const void* data = dense.data();
            py::gil_scoped_release release;
            return c.BufferFromHost(data, type, dims, device_id);
          },
          py::arg("array"), py::arg("device_id"))
      .def(
          "compile",
          [](pjrt::Client& c, const std::string& text, int num_replicas, const std::vector<int>& device_ids) {
            pjrt::CompileOptions o;
            o.num_replicas = num_replicas;
            o.device_ids = device_ids;
            py::gil_scoped_release release;
            return runtime::CompileText(c, text, o);
          },
          py::arg("stablehlo"), py::arg("num_replicas") = 1, py::arg("device_ids") = std::vector<int>{})
      .def(
          "compile_graph",
          [](pjrt::Client& c, const ir::Graph& g, const std::vector<int>& device_ids) {
            py::gil_scoped_release release;
            return std::move(runtime::CompileGraph(c, g, device_ids).executable);
          },
          py::arg("graph"), py::arg("device_ids") = std::vector<int>{})
      .def(
          "deserialize",
          [](pjrt::Client& c, const py::bytes& b, int num_replicas, const std::vector<int>& device_ids) {
            pjrt::CompileOptions o;
            o.num_replicas = num_replicas;
            o.device_ids = device_ids;
            std::string bytes = b;
            py::gil_scoped_release release;
            return c.Deserialize(bytes, o);
          },
          py::arg("data"), py::arg("num_replicas") = 1, py::arg("device_ids") = std::vector<int>{});
}

}  // namespace tpj::python
