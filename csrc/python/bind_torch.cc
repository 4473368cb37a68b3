// Python view of the pjrt PyTorch device: sync, seeds, metrics, cache, and
// a few introspection helpers for tests and debugging.
#include <pybind11/stl.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include "ir/printer.h"
#include "runtime/dtype_map.h"
#include "python/bind.h"
#include "runtime/lazy.h"
#include "runtime/metrics.h"
#include "torch/device.h"
#include "torch/tensor.h"

namespace py = pybind11;

namespace tpj::python {

void BindTorch(py::module_& m) {
  m.def(
      "_configure",
      [](const std::vector<std::string>& dirs, const py::dict& options) {
        runtime::Runtime::Configure(dirs, NamedOptions(options));
      },
      py::arg("search_dirs"), py::arg("options"));
  m.def("_initialized", &runtime::Runtime::Initialized);
  m.def("_device_count", &aten::DeviceCount, py::call_guard<py::gil_scoped_release>());
  m.def("_current_device", &aten::CurrentDevice);
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
      } catch (...) {
        return "";
      }
    });
  });

  // --- replicated data parallelism in one process -------------------------
  m.def("_set_replicas", [](int n) { runtime::Runtime::Get().SetReplicas(n); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_replicas", [] { return runtime::Runtime::Get().replicas(); });
  m.def(
      "_shard",
      [](const std::vector<at::Tensor>& parts) {
        // One pjrt tensor on device 0 whose replica r holds parts[r].
        auto& rt = runtime::Runtime::Get();
        TORCH_CHECK(static_cast<int>(parts.size()) == rt.replicas(), "need one part per replica (",
                    rt.replicas(), "), got ", parts.size());
        std::vector<runtime::DeviceBuffer> bufs;
        for (size_t r = 0; r < parts.size(); ++r) {
          TORCH_CHECK(parts[r].sizes() == parts[0].sizes() && parts[r].scalar_type() == parts[0].scalar_type(),
                      "replica parts must share shape and dtype");
          at::Tensor dense = parts[r].contiguous();
          bufs.emplace_back(rt.client().BufferFromHost(dense.const_data_ptr(),
                                                       runtime::ToPjrt(aten::ToIr(dense.scalar_type())),
                                                       {dense.numel()}, rt.global_id(static_cast<int>(r))));
        }
        runtime::TraceScope scope;
        at::Tensor out = aten::Empty(parts[0].sizes(), parts[0].scalar_type(), 0);
        auto& st = aten::StorageOf(out);
        rt.SetBuffer(st, bufs[0], aten::ToIr(parts[0].scalar_type()));
        st.replicas = bufs;
        return out;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_replica_values",
      [](const at::Tensor& t) {
        // The tensor's value on every replica (after a sync), as CPU tensors.
        std::vector<runtime::DeviceBuffer> bufs;
        {
          runtime::TraceScope scope;
          auto& st = aten::StorageOf(t);
          auto& rt = runtime::Runtime::Get();
          rt.Materialize(st);
          bufs = st.replicas.empty() ? std::vector<runtime::DeviceBuffer>{st.buffer} : st.replicas;
        }
        std::vector<at::Tensor> out;
        for (auto& b : bufs) {
          at::Tensor flat = at::empty({b->element_count()}, at::TensorOptions().dtype(t.scalar_type()));
          b->ToHost(flat.data_ptr(), static_cast<size_t>(flat.nbytes()));
          out.push_back(flat.as_strided(t.sizes(), t.strides(), t.storage_offset()).clone());
        }
        return out;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_all_reduce_",
      [](at::Tensor& t, const std::string& kind, double scale) {
        runtime::TraceScope scope;
        ir::Builder& b = aten::B(aten::DeviceIndex(t));
        const ir::ReduceKind k =
            kind == "max" ? ir::ReduceKind::Max : kind == "min" ? ir::ReduceKind::Min : ir::ReduceKind::Sum;
        ir::Value v = b.AllReduce(aten::Val(t), k);
        if (scale != 1.0) v = b.Binary(ir::Op::Mul, v, b.Full(b.shape(v).dtype, b.shape(v).dims, scale));
        aten::Assign(t, v);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_all_gather",
      [](const at::Tensor& t, int64_t dim) {
        runtime::TraceScope scope;
        const int d = aten::DeviceIndex(t);
        return aten::Wrap(aten::B(d).AllGather(aten::Val(t), aten::WrapDim(dim, t.dim())), d);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_reduce_scatter",
      [](const at::Tensor& t, int64_t dim, double scale) {
        runtime::TraceScope scope;
        const int d = aten::DeviceIndex(t);
        ir::Builder& b = aten::B(d);
        ir::Value v = b.ReduceScatter(aten::Val(t), aten::WrapDim(dim, t.dim()), ir::ReduceKind::Sum);
        if (scale != 1.0) v = b.Binary(ir::Op::Mul, v, b.Full(b.shape(v).dtype, b.shape(v).dims, scale));
        return aten::Wrap(v, d);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_broadcast_",
      [](at::Tensor& t, int64_t root) {
        runtime::TraceScope scope;
        const int d = aten::DeviceIndex(t);
        ir::Builder& b = aten::B(d);
        std::vector<int64_t> one{1};
        for (int64_t s : t.sizes()) one.push_back(s);
        ir::Value all = b.AllGather(b.Reshape(aten::Val(t), one), 0);
        std::vector<int64_t> start(one.size(), 0), limit = one, stride(one.size(), 1);
        start[0] = root;
        limit[0] = root + 1;
        aten::Assign(t, b.Reshape(b.Slice(all, start, limit, stride), t.sizes().vec()));
      },
      py::call_guard<py::gil_scoped_release>());

  m.def(
      "_is_pending",
      [](const at::Tensor& t) {
        runtime::TraceScope scope;
        return aten::StorageOf(t).pending;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_has_buffer",
      [](const at::Tensor& t) {
        runtime::TraceScope scope;
        return static_cast<bool>(aten::StorageOf(t).buffer);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("_pending_count", [](int device) { return runtime::Runtime::Get().pending_count(device); },
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "_stablehlo",
      [](const std::vector<at::Tensor>& ts) {
        runtime::TraceScope scope;
        TORCH_CHECK(!ts.empty(), "give at least one pjrt tensor");
        const int d = aten::DeviceIndex(ts[0]);
        std::vector<ir::Value> outs;
        for (const auto& t : ts) outs.push_back(aten::Val(t));
        ir::Graph g = ir::Extract(aten::B(d).graph(), outs, {}, nullptr);
        return ir::PrintStableHlo(g);
      },
      py::call_guard<py::gil_scoped_release>(),
      "The StableHLO program that would compute these pjrt tensors now (no compile, no run).");
}

}  // namespace tpj::python
