#include "aten/generator.h"

#include <ATen/Utils.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include <array>
#include <cstring>
#include <mutex>

#include "aten/device.h"
#include "aten/tensor.h"
#include "runtime/runtime.h"

namespace tpj::aten {
namespace {

class PjrtGenerator final : public c10::GeneratorImpl {
 public:
  explicit PjrtGenerator(int device, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  // The state is 16 bytes, key then counter, little-endian: the layout of
  // the default stream's torch.pjrt.get_rng_state().
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    const std::array<uint64_t, 2> s{seed_, offset_};
    std::memcpy(t.data_ptr(), s.data(), sizeof(s));
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 16 &&
                         state.device().is_cpu() && state.is_contiguous(),
                     "a pjrt generator's state is the 16-byte uint8 CPU tensor its get_state() returns");
    std::array<uint64_t, 2> s{};
    std::memcpy(s.data(), state.data(), sizeof(s));
    seed_ = s[0];
    offset_ = s[1];
  }

  // The state the next draw of `bits` starts from; advances past it.
  std::array<uint64_t, 2> Take(const ir::Shape& bits) {
    std::lock_guard<std::mutex> l(mutex_);
    const std::array<uint64_t, 2> state{seed_, offset_};
    offset_ += runtime::Runtime::RngAdvance(bits);  // as the device's stream advances
    return state;
  }

 private:
  PjrtGenerator* clone_impl() const override {
    auto* g = new PjrtGenerator(device_.index(), seed_);
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

thread_local c10::GeneratorImpl* scope_generator = nullptr;

}  // namespace

at::Generator NewGenerator(int device) {
  const int d = device < 0 ? CurrentDevice() : device;
  CheckDeviceIndex(d);
  return at::make_generator<PjrtGenerator>(d);
}

GeneratorScope::GeneratorScope(const std::optional<at::Generator>& g, const at::Tensor& op_tensor)
    : GeneratorScope(g, op_tensor.defined() ? op_tensor.device().type() : c10::DeviceType::PrivateUse1) {}

GeneratorScope::GeneratorScope(const std::optional<at::Generator>& g, c10::DeviceType op_device)
    : previous_(scope_generator) {
  if (!g.has_value() || !g->defined()) return;
  TORCH_CHECK(g->device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'pjrt' device type for generator but found '", g->device().type(), "'");
  TORCH_CHECK(op_device == c10::DeviceType::PrivateUse1, "Expected a '", op_device,
              "' device type for generator but found '", g->device().type(),
              "' (a pjrt generator draws for ops on pjrt only)");
  scope_generator = g->unsafeGetGeneratorImpl();
}

GeneratorScope::~GeneratorScope() { scope_generator = previous_; }

ir::Value RandomBits(int d, const ir::Shape& bits) {
  auto& rt = runtime::Runtime::Get();
  if (scope_generator == nullptr) return rt.RandomBits(d, bits);
  const int gd = scope_generator->device().index();
  TORCH_CHECK(gd == d, "a generator of pjrt:", gd, " was given to an op on pjrt:", d);
  const std::array<uint64_t, 2> state = static_cast<PjrtGenerator*>(scope_generator)->Take(bits);
  ir::Value s = rt.UploadValue(d, state.data(), ir::DType::U64, 2);
  return B(d).RngBitGenerator(s, bits).at(1);
}

}  // namespace tpj::aten
