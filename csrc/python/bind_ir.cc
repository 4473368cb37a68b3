// Python view of the graph IR: a builder for programs written by hand (the
// demo, tests, experiments). Op and dtype names are the lower-case IR names.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cstring>
#include <map>

#include "ir/graph.h"
#include "ir/hash.h"
#include "ir/printer.h"
#include "python/bind.h"

namespace py = pybind11;

namespace tpj::python {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

ir::Op OpByName(const std::string& name) {
  static const std::map<std::string, ir::Op> ops = [] {
    std::map<std::string, ir::Op> m;
#define TPJ_NAME(n, mlir, form) m[Lower(#n)] = ir::Op::n;
    TPJ_IR_OPS(TPJ_NAME)
#undef TPJ_NAME
    return m;
  }();
  auto it = ops.find(Lower(name));
  if (it == ops.end()) throw py::value_error("unknown IR op '" + name + "'");
  return it->second;
}

ir::DType DTypeByName(const std::string& name) {
  const std::string n = Lower(name);
  for (int i = 0; i < ir::kNumDTypes; ++i) {
    const auto t = static_cast<ir::DType>(i);
    if (n == ir::Name(t) || n == ir::MlirName(t)) return t;
  }
  throw py::value_error("unknown dtype '" + name + "' (use e.g. float32, int64, bool, bfloat16)");
}

ir::ReduceKind KindByName(const std::string& name) {
  for (auto k : {ir::ReduceKind::Sum, ir::ReduceKind::Prod, ir::ReduceKind::Max, ir::ReduceKind::Min,
                 ir::ReduceKind::And, ir::ReduceKind::Or}) {
    if (Lower(name) == ir::ReduceKindName(k)) return k;
  }
  throw py::value_error("unknown reduction '" + name + "' (sum, prod, max, min, and, or)");
}

ir::CompareDir DirByName(const std::string& name) {
  for (auto d : {ir::CompareDir::EQ, ir::CompareDir::NE, ir::CompareDir::LT, ir::CompareDir::LE,
                 ir::CompareDir::GT, ir::CompareDir::GE}) {
    if (Lower(name) == Lower(ir::CompareDirName(d))) return d;
  }
  throw py::value_error("unknown comparison '" + name + "' (eq, ne, lt, le, gt, ge)");
}

ir::DType FromNumpy(const py::dtype& dt) {
  const std::string s = py::str(static_cast<const py::object&>(dt));  // a plain py::str(dt) is ambiguous in pybind11 3
  if (s == "bool") return ir::DType::Bool;
  return DTypeByName(s);
}

}  // namespace

void BindIr(py::module_ m) {
  py::class_<ir::Value>(m, "Value")
      .def_readonly("node", &ir::Value::node)
      .def_readonly("index", &ir::Value::index);

  py::class_<ir::Graph>(m, "Graph")
      .def("stablehlo", &ir::PrintStableHlo)
      .def("hash", &ir::ProgramHash)
      .def_property_readonly("num_params", [](const ir::Graph& g) { return g.params.size(); })
      .def_property_readonly("num_outputs", [](const ir::Graph& g) { return g.outputs.size(); })
      .def_readonly("num_replicas", &ir::Graph::num_replicas);

  py::class_<ir::Builder>(m, "Builder")
      .def(py::init<int, int>(), py::arg("num_replicas") = 1, py::arg("num_partitions") = 1)
      .def("shape",
           [](const ir::Builder& b, ir::Value v) {
             const auto& s = b.shape(v);
             return py::make_tuple(std::string(ir::Name(s.dtype)), s.dims);
           })
      .def("parameter",
           [](ir::Builder& b, const std::string& dtype, const std::vector<int64_t>& dims) {
             return b.Parameter({DTypeByName(dtype), dims});
           })
      .def("constant",
           [](ir::Builder& b, const py::array& a) {
             py::array dense = py::array::ensure(a, py::array::c_style);
             std::vector<uint8_t> bytes(static_cast<size_t>(dense.nbytes()));
             if (!bytes.empty()) std::memcpy(bytes.data(), dense.data(), bytes.size());
             std::vector<int64_t> dims(dense.shape(), dense.shape() + dense.ndim());
             return b.Constant({FromNumpy(dense.dtype()), dims}, std::move(bytes));
           })
      .def("full",
           [](ir::Builder& b, const std::string& dtype, const std::vector<int64_t>& dims, double v) {
             return b.Full(DTypeByName(dtype), dims, v);
           })
      .def("unary", [](ir::Builder& b, const std::string& op, ir::Value x) { return b.Unary(OpByName(op), x); })
      .def("binary", [](ir::Builder& b, const std::string& op, ir::Value x, ir::Value y) {
        return b.Binary(OpByName(op), x, y);
      })
      .def("convert", [](ir::Builder& b, ir::Value x, const std::string& dtype) { return b.Convert(x, DTypeByName(dtype)); })
      .def("compare", [](ir::Builder& b, const std::string& dir, ir::Value x, ir::Value y) {
        return b.Compare(DirByName(dir), x, y);
      })
      .def("select", &ir::Builder::Select)
      .def("broadcast_in_dim", &ir::Builder::BroadcastInDim, py::arg("x"), py::arg("dims"), py::arg("broadcast_dims"))
      .def("reshape", &ir::Builder::Reshape)
      .def("transpose", &ir::Builder::Transpose)
      .def(
          "dot",
          [](ir::Builder& b, ir::Value l, ir::Value r, std::vector<int64_t> lc, std::vector<int64_t> rc,
             std::vector<int64_t> lb, std::vector<int64_t> rb) {
            ir::DotDims d{std::move(lb), std::move(rb), std::move(lc), std::move(rc)};
            return b.DotGeneral(l, r, d);
          },
          py::arg("lhs"), py::arg("rhs"), py::arg("lhs_contract"), py::arg("rhs_contract"),
          py::arg("lhs_batch") = std::vector<int64_t>{}, py::arg("rhs_batch") = std::vector<int64_t>{})
      .def("reduce",
           [](ir::Builder& b, ir::Value x, ir::Value init, const std::vector<int64_t>& dims, const std::string& kind) {
             return b.Reduce(x, init, dims, KindByName(kind));
           })
      .def("all_reduce", [](ir::Builder& b, ir::Value x, const std::string& kind) { return b.AllReduce(x, KindByName(kind)); })
      .def(
          "build",
          [](ir::Builder& b, const std::vector<ir::Value>& outputs, const std::vector<std::pair<int64_t, int64_t>>& aliases) {
            std::vector<ir::Alias> al;
            for (auto [p, o] : aliases) al.push_back({p, o});
            return b.Build(outputs, al);
          },
          py::arg("outputs"), py::arg("aliases") = std::vector<std::pair<int64_t, int64_t>>{},
          "aliases: (parameter, output) pairs whose memory the output may reuse (donation).");
}

}  // namespace tpj::python
