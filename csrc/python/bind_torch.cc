// Python view of the pjrt PyTorch device: sync, seeds, metrics, cache, and
// a few introspection helpers for tests and debugging.
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <csignal>
#include <thread>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include "aten/collectives.h"
#include "aten/derived.h"
#include "aten/device.h"
#include "aten/spmd.h"
#include "aten/tensor.h"
#include "python/bind.h"
#include "runtime/metrics.h"
#include "pjrt/plugin.h"
#include "runtime/options.h"
#include "runtime/program.h"
#include "runtime/runtime.h"
#include "runtime/warnings.h"

namespace py = pybind11;

namespace tpj::python {
namespace {

py::dict OptionsDict(const runtime::Options& o) {
  py::dict d;
  d["device"] = o.device;
  d["plugin"] = o.plugin;
  d["search_path"] = o.search_path;
  d["cpu_device_count"] = o.cpu_device_count ? py::cast(*o.cpu_device_count) : py::none();
  d["cache_dir"] = o.cache_dir;
  d["dump_dir"] = o.dump_dir;
  d["debug"] = o.debug;
  d["checks"] = o.checks;
  d["fallback"] = o.fallback == runtime::FallbackMode::kError  ? "error"
                  : o.fallback == runtime::FallbackMode::kWarn ? "warn"
                                                               : "allow";
  d["dist_timeout_s"] = o.dist_timeout_s;
  d["compile_progress_s"] = o.compile_progress_s;
  d["rank"] = o.rank;
  d["world_size"] = o.world_size;
  d["local_rank"] = o.local_rank;
  d["local_world_size"] = o.local_world_size;
  d["group_rank"] = o.group_rank;
  d["master_addr"] = o.master_addr;
  d["master_port"] = o.master_port;
  d["torchrun"] = o.torchrun;
  d["plugin_log_level"] = o.plugin_log_level;
  return d;
}

}  // namespace

// The GIL released for a wait. A daemon thread whose wait ends while the
// interpreter finalizes is not given it back: Python would end the thread
// inside PyEval_RestoreThread (pthread_exit unwinding through this
// destructor: "terminate called without an active exception", SIGABRT at
// exit); it waits for the process to end instead, as Python's own daemon
// threads do. (A finalizing main thread never gets here: waits it starts
// then keep the GIL.) One whose wait ends just before finalization, blocked
// on the GIL when it begins, can still be ended there: docs/device.md.
namespace {
struct ReleasedGil {
  PyThreadState* state = PyEval_SaveThread();
  ReleasedGil() = default;
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;
  ~ReleasedGil() {
    while (_Py_IsFinalizing()) std::this_thread::sleep_for(std::chrono::seconds(1));
    PyEval_RestoreThread(state);
  }
};
}  // namespace

void BindTorch(py::module_& m) {
  // Waits on the device (sync(wait=True), .cpu(), .item(), printing) check
  // for Ctrl-C about every 50 ms: the runtime calls this outside its lock,
  // with the GIL released (torch releases it around kernels, our bindings
  // around every call that can wait, and the wait scope below where a
  // caller kept it: PyTorch's storage copy, which torch.save and pickle use).
  runtime::Runtime::SetWaitCheck([] {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });
  // A compile's wait calls this once SIGINT came, under the runtime lock in
  // the middle of a sync: only Python's own handler is run there (it raises
  // KeyboardInterrupt). A handler of the program's (one that saves a
  // checkpoint on Ctrl-C) may use pjrt, which would enter that sync again:
  // it runs once the compile is done, as Python runs handlers between
  // bytecodes.
  runtime::Runtime::SetCompileInterruptCheck([] {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    py::gil_scoped_acquire gil;
    // (_signal's builtins: the `signal` module's Python wrappers would run
    // bytecode, and the pending handler with it)
    py::module_ signal = py::module_::import("_signal");
    if (!signal.attr("getsignal")(SIGINT).is(signal.attr("default_int_handler"))) return;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });
  runtime::Runtime::SetWaitScope([]() -> std::shared_ptr<void> {
    if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_Check() == 0) return nullptr;
    return std::make_shared<ReleasedGil>();
  });
  m.def("_set_checks", [](bool on) { runtime::Runtime::Get().SetChecks(on); }, py::call_guard<py::gil_scoped_release>(),
        "Turns the checks compiled into programs on or off for ops traced from now on (TORCH_PJRT_CHECKS).");
  m.def("_in_bad_fork", &pjrt::InForkedChild,
        "True in a process forked after the PJRT plugin was loaded: pjrt cannot be used there.");
  m.def(
      "_configure",
      [](const std::vector<std::string>& dirs, const py::dict& options) {
        runtime::Runtime::Configure(dirs, NamedOptions(options));
      },
      py::arg("search_dirs"), py::arg("options"));
  m.def("_initialized", &runtime::Runtime::Initialized);
  m.def("_options", [] { return OptionsDict(runtime::Options::FromEnvironment()); },
        "The environment, read now, as the runtime reads it (torch_pjrt.runtime and docs/environment.md).");
  m.def("_environment_variables", [] {
    py::list out;
    for (const auto& v : runtime::EnvironmentVariables()) out.append(py::make_tuple(v.name, v.meaning, v.default_value));
    return out;
  });
  m.def("_environment_values", &runtime::EnvironmentValues,
        "(name, value) of every variable torch-pjrt reads that is set now (python -m torch_pjrt doctor).");
  m.def("_derived_kernels", &aten::DerivedKernels,
        "(in-place or out= overload, functional overload) pairs whose kernel is derived (aten/derived.h).");
  m.def("_device_count", &aten::DeviceCount, py::call_guard<py::gil_scoped_release>());
  m.def("_drain_autograd_threads", [] { if (!pjrt::InForkedChild()) aten::DrainAutogradThreads(); },
        py::call_guard<py::gil_scoped_release>());
  BindReplay(m);
  m.def("_current_device", &aten::CurrentDevice);
  m.def(
      "_device_index_error", [](int device) { return runtime::Runtime::Get().DeviceIndexError(device); },
      "The IndexError message for a pjrt device index past this process's devices.");
  m.def("_set_device", &aten::SetCurrentDevice);
  m.def(
      "_sync",
      [](std::vector<int> devices, bool wait) {
        auto& rt = runtime::Runtime::Get();
        if (devices.empty()) {
          rt.SyncAll({wait});
        } else {
          rt.Sync(devices, {wait});
        }
      },
      py::arg("devices"), py::arg("wait"), py::call_guard<py::gil_scoped_release>());
  m.def("_manual_seed", [](int device, uint64_t seed) { runtime::Runtime::Get().ManualSeed(device, seed); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_initial_seed", [](int device) { return runtime::Runtime::Get().InitialSeed(device); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_rng_state", [](int device) { return runtime::Runtime::Get().RngState(device); },
        py::call_guard<py::gil_scoped_release>(), "The device's Threefry key and counter.");
  m.def(
      "_set_rng_state",
      [](int device, const std::array<uint64_t, 2>& state) { runtime::Runtime::Get().SetRngState(device, state); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_initialize_cache",
      [](const std::string& dir, bool readonly) { runtime::Runtime::Get().InitializeDiskCache(dir, readonly); },
      py::call_guard<py::gil_scoped_release>());
  m.def("_cache_dir", [] { return runtime::Runtime::Get().cache().disk_dir(); });
  m.def("_clear_memory_cache", [] { runtime::Runtime::Get().cache().Clear(); });
  m.def("_plugin_path", [] { return runtime::Runtime::Get().plugin_path(); });
  m.def("_platform_name", [] { return runtime::Runtime::Get().client().platform_name(); });

  m.def("_metrics_counters", [] { return runtime::Metrics::Get().Counters(); });
  m.def("_metrics_timers", [] { return runtime::Metrics::Get().Timers(); });
  m.def("_metrics_fallbacks", [] { return runtime::Metrics::Get().Fallbacks(); });
  m.def("_metrics_fallback_sites", [] { return runtime::Metrics::Get().FallbackSites(); });
  m.def("_metrics_recompiles", [] {
    py::list out;
    for (const auto& r : runtime::Metrics::Get().Recompiles()) {
      py::dict d;
      d["why"] = r.why;
      d["where"] = r.where;
      d["structure"] = r.structure;
      out.append(d);
    }
    return out;
  });
  m.def("_metrics_compile_sites", [] { return runtime::Metrics::Get().CompileSites(); });
  m.def("_metrics_reset", [] { runtime::Metrics::Get().Reset(); });
  m.def("_metrics_add", [](const std::string& name, int64_t n) { runtime::Metrics::Get().Add(name, n); });
  m.def("_set_location_provider", [](py::function f) {
    // Kept for the life of the process (never decref'd: the provider may be
    // called, or destroyed, after the interpreter started finalizing).
    PyObject* fn = f.release().ptr();
    runtime::Runtime::SetLocationProvider([fn]() -> std::string {
      // Kernels run with the GIL released (PyTorch drops it before
      // dispatch); every binding of ours that takes the runtime lock drops
      // it too, so taking it here cannot deadlock.
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return "";
      py::gil_scoped_acquire gil;
      try {
        return py::cast<std::string>(py::handle(fn)());
      } catch (const py::error_already_set& e) {
        // A Ctrl-C that arrived meanwhile (during a compile) surfaces here:
        // raised again at Python's next check, not lost with the location.
        if (e.matches(PyExc_KeyboardInterrupt)) PyErr_SetInterrupt();
        return "";
      } catch (...) {
        return "";
      }
    });
  });

  m.def("_set_warning_sink", [](py::function f) {
    // Kept for the life of the process, as the location provider.
    PyObject* fn = f.release().ptr();
    runtime::SetWarningSink([fn](const std::string& message) {
      // Called holding no runtime lock (FlushWarnings' promise).
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
      py::gil_scoped_acquire gil;
      try {
        py::handle sink(fn);
        sink(message);
      } catch (py::error_already_set& e) {  // `-W error`: the warning became an exception
        const std::string what = py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                                 py::str(e.value()).cast<std::string>();
        throw pjrt::Error(pjrt::Code::kFailedPrecondition, what);
      }
    });
  });

  // --- replicated data parallelism in one process -------------------------
  m.def("_set_replicas", [](int n) { runtime::Runtime::Get().SetReplicas(n); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_replicas", [] { return runtime::Runtime::Get().replicas(); });
  m.def(
      "_shard",
      [](const std::vector<at::Tensor>& parts) { return aten::ReplicatedFromParts(parts); },
      py::call_guard<py::gil_scoped_release>(), "One pjrt tensor on device 0 whose replica r holds parts[r].");
  m.def("_replica_values", &aten::ReplicaValues, py::call_guard<py::gil_scoped_release>(),
        "The tensor's value on every replica, as CPU tensors.");
  m.def("_all_reduce_", &aten::AllReduce_, py::call_guard<py::gil_scoped_release>());
  m.def("_all_gather", &aten::AllGather, py::call_guard<py::gil_scoped_release>());
  m.def("_reduce_scatter", &aten::ReduceScatter, py::call_guard<py::gil_scoped_release>());
  m.def("_broadcast_", &aten::Broadcast_, py::call_guard<py::gil_scoped_release>());
  // With the GIL: letting go of a held tensor may drop its Python object's reference.
  m.def("_hold_for_collective", &aten::HoldForCollective);
  // A gloo backend whose collective's wait was abandoned (Ctrl-C): its
  // destructor waits for that collective to end, which may take the group's
  // whole timeout, so it is never destroyed (exit goes on without it).
  m.def("_keep_until_exit", [](py::object backend) {
    static auto* kept = new std::vector<py::object>;
    kept->push_back(std::move(backend));
  });

  // --- SPMD sharding over a mesh (torch_pjrt.spmd) -------------------------
  auto sharding_args = [](std::vector<int> devices, std::vector<int64_t> tiles, int64_t replicate,
                          std::vector<int> tile_devices) {
    return aten::ShardingArgs{std::move(devices), std::move(tiles), replicate, std::move(tile_devices)};
  };
  m.def(
      "_spmd_distribute",
      [=](const at::Tensor& cpu, std::vector<int> devices, std::vector<int64_t> tiles, int64_t replicate,
          std::vector<int> tile_devices) {
        return aten::Distribute(cpu, sharding_args(devices, tiles, replicate, tile_devices));
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_spmd_mark_sharding",
      [=](const at::Tensor& t, std::vector<int> devices, std::vector<int64_t> tiles, int64_t replicate,
          std::vector<int> tile_devices) {
        aten::MarkSharding(t, sharding_args(devices, tiles, replicate, tile_devices));
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_sharding_of", &aten::ShardingOf, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_shard_bytes", &aten::ShardBytes, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_set_mesh", [](int device, std::vector<int> devices) { runtime::Runtime::Get().SetMesh(device, devices); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_mesh", [](int device) { return runtime::Runtime::Get().Mesh(device); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_in_use", [] { return runtime::Runtime::Initialized() && runtime::Runtime::Get().SpmdInUse(); },
        py::call_guard<py::gil_scoped_release>());

  m.def("_is_pending", &aten::IsPending, py::call_guard<py::gil_scoped_release>());
  m.def("_has_buffer", &aten::HasBuffer, py::call_guard<py::gil_scoped_release>());
  m.def("_settle", &aten::Settle, py::call_guard<py::gil_scoped_release>(),
        "Raises what reading these tensors would (a failed program or check), copying nothing.");
  m.def("_trace_nodes", [](int device) { return runtime::Runtime::Get().trace_nodes(device); },
        py::call_guard<py::gil_scoped_release>(), "IR nodes in the device's trace (tests)");
  m.def("_pending_count", [](int device) { return runtime::Runtime::Get().pending_count(device); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_trace_epoch", [](int device) { return runtime::Runtime::Get().trace_epoch(device); },
        py::call_guard<py::gil_scoped_release>(), "Moves when the device's pending work launches.");
  m.def("_stablehlo", &aten::StableHloOf, py::call_guard<py::gil_scoped_release>(),
        "The StableHLO program that would compute these pjrt tensors now (no compile, no run).");
}

}  // namespace tpj::python
