// torch.eye: the identity matrix built on the device from two iotas.
#include "aten/lowering.h"

namespace tpj::aten {
namespace {

// Ones where row == column, in `out`'s dtype; `out` is resized to [n, m].
at::Tensor& EyeInto(int64_t n, int64_t m, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "n must be greater or equal to 0, got ", n);
  TORCH_CHECK(m >= 0, "m must be greater or equal to 0, got ", m);
  if (out.sizes() != at::IntArrayRef({n, m})) out.resize_({n, m});
  TraceScope s;
  const int d = DeviceIndex(out);
  ir::Builder& b = B(d);
  const ir::Shape shape{ir::DType::I64, {n, m}};
  ir::Value diag = b.Compare(ir::CompareDir::EQ, b.Iota(shape, 0), b.Iota(shape, 1));
  Assign(out, b.Convert(diag, ToIr(out.scalar_type())));
  return out;
}

at::Tensor eye_m(c10::SymInt n, c10::SymInt m, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                 std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "torch.eye on pjrt makes strided tensors only, got layout ", *layout);
  at::Tensor out = at::empty({0}, at::TensorOptions()
                                      .dtype(dtype.value_or(at::get_default_dtype_as_scalartype()))
                                      .device(device.value_or(at::Device(c10::DeviceType::PrivateUse1))));
  (void)pin_memory;
  return EyeInto(n.guard_int(__FILE__, __LINE__), m.guard_int(__FILE__, __LINE__), out);
}

at::Tensor eye(c10::SymInt n, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
               std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return eye_m(n, n, dtype, layout, device, pin_memory);
}

at::Tensor& eye_m_out(c10::SymInt n, c10::SymInt m, at::Tensor& out) {
  return EyeInto(n.guard_int(__FILE__, __LINE__), m.guard_int(__FILE__, __LINE__), out);
}

at::Tensor& eye_out(c10::SymInt n, at::Tensor& out) {
  const int64_t k = n.guard_int(__FILE__, __LINE__);
  return EyeInto(k, k, out);
}

// tril_indices / triu_indices: the indices depend on the sizes alone; the
// CPU's kernel computes them and they are copied to the device as data.
at::Tensor TriIndices(bool lower, int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                      std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin) {
  const at::TensorOptions cpu = at::TensorOptions().dtype(dtype).layout(layout);
  at::Tensor r = lower ? at::tril_indices(row, col, offset, cpu) : at::triu_indices(row, col, offset, cpu);
  return r.to(at::TensorOptions().device(device).pinned_memory(pin));
}
at::Tensor tril_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin) {
  return TriIndices(true, row, col, offset, dtype, layout, device, pin);
}
at::Tensor triu_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool> pin) {
  return TriIndices(false, row, col, offset, dtype, layout, device, pin);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) m.impl(name, TORCH_FN(tpj::aten::fn))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("eye", eye);
  K("tril_indices", tril_indices);
  K("triu_indices", triu_indices);
  K("eye.m", eye_m);
  K("eye.out", eye_out);
  K("eye.m_out", eye_m_out);
}
