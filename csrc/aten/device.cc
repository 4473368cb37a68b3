#include "aten/device.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>

#include "runtime/runtime.h"
#include "aten/generator.h"
#include "aten/tensor.h"

namespace tpj::aten {
namespace {

thread_local int current_device = 0;

// Pinned host memory for pjrt: tensor.pin_memory() and
// DataLoader(pin_memory=True) ask the current accelerator (pjrt once
// torch_pjrt is installed) for it, in every program, whether it uses pjrt
// or not. PJRT copies from any host memory, so pinned memory is plain host
// memory here; the allocator records its blocks so that is_pinned() is true
// for them (and their views) and false for other CPU tensors.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> l(Mu());
      Blocks()[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return {p, p, &Free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static bool Holds(const void* ptr) {
    const auto a = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> l(Mu());
    auto it = Blocks().upper_bound(a);
    if (it == Blocks().begin()) return false;
    --it;
    return a < it->first + it->second;
  }

 private:
  static void Free(void* p) {
    if (!p) return;
    {
      std::lock_guard<std::mutex> l(Mu());
      Blocks().erase(reinterpret_cast<uintptr_t>(p));
    }
    c10::free_cpu(p);
  }
  // Never destroyed: tensors freed during interpreter exit still find them.
  static std::mutex& Mu() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::map<uintptr_t, size_t>& Blocks() {  // start -> size of each live block
    static auto* b = new std::map<uintptr_t, size_t>;
    return *b;
  }
};

// Device and stream bookkeeping for PrivateUse1. PJRT orders work per device
// itself, so there is one (default) stream per device; a new stream is that
// one. Querying a stream or recording an event launches the device's pending
// work (lazily traced work would otherwise never finish), then looks at what
// was launched; synchronizing waits for the device. An event is done once
// all launched before its record() is.
//
// A timing event (torch.Event(enable_timing=True), EventFlag::BACKEND_DEFAULT)
// waits at record() for the work launched so far and keeps the time it
// finished: elapsed_time is the wall time between the two points where the
// device had done everything launched before each record(), the host's
// tracing in between included (docs/device.md, "Streams and events").
struct EventState {
  int device = 0;
  bool timing = false;
  std::chrono::steady_clock::time_point done;
};
struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, static_cast<c10::DeviceIndex>(current_device)); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a pjrt device, got ", d);
    // torch.accelerator.set_device_index(99) raises here, as on CUDA
    if (d.has_index() && d.index() != current_device) SetCurrentDevice(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  // torch.Stream(device="pjrt:9") past this process's devices raises here;
  // torch.Stream(device="pjrt") is the current device's, as on CUDA.
  static c10::Stream Checked(c10::Device d) {
    if (!d.has_index()) d = c10::Device(kType, static_cast<c10::DeviceIndex>(CurrentDevice()));
    CheckDeviceIndex(d.index());
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return Checked(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return Checked(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return Checked(d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  bool queryStream(const c10::Stream& s) const override {
    runtime::Runtime::Get().Sync({s.device_index()});
    return runtime::Runtime::Get().LaunchesDone(s.device_index());
  }
  void synchronizeStream(const c10::Stream& s) const override {
    runtime::Runtime::Get().Sync({s.device_index()}, {/*wait=*/true});
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(DeviceCount());
    } catch (...) {
      return 0;
    }
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag flag) const override {
    const bool timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    runtime::Runtime::Get().Sync({s.device_index()}, {/*wait=*/timing});
    if (!*event) *event = new EventState;
    auto* e = static_cast<EventState*>(*event);
    e->device = s.device_index();
    e->timing = timing;
    e->done = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // one stream per device: already in order
  bool queryEvent(void* event) const override {
    return !event || runtime::Runtime::Get().LaunchesDone(static_cast<EventState*>(event)->device);
  }
  void synchronizeEvent(void* event) const override {
    if (event) runtime::Runtime::Get().Sync({static_cast<EventState*>(event)->device}, {/*wait=*/true});
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventState*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    const auto* a = static_cast<EventState*>(start);
    const auto* b = static_cast<EventState*>(end);
    TORCH_CHECK(a->timing && b->timing, "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(b->done - a->done).count();
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    runtime::Runtime::Get().Sync({d}, {/*wait=*/true});
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return DeviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(DeviceCount()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { SetCurrentDevice(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(CurrentDevice()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const int old = CurrentDevice();
    SetCurrentDevice(d);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // A CPU generator per device holds the seed; on-device random numbers come
  // from the runtime's Threefry state, reseeded through manual_seed.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    // A static's initializer that throws (no plugin) runs again next time;
    // std::call_once after a throw can hang with libstdc++ (GCC bug 66146).
    static const std::vector<at::Generator> gens = [] {
      std::vector<at::Generator> g;
      for (int i = 0; i < std::max(DeviceCount(), 1); ++i) g.push_back(at::detail::createCPUGenerator());
      return g;
    }();
    const int idx = d < 0 ? CurrentDevice() : d;
    TORCH_CHECK(idx >= 0 && idx < static_cast<int>(gens.size()), "pjrt device index ", idx, " out of range");
    return gens[idx];
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return NewGenerator(d); }
  at::Device getDeviceFromPtr(void*) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(CurrentDevice()));
  }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::Holds(data); }
  at::Allocator* getPinnedMemoryAllocator() const override {
    static auto* a = new PinnedAllocator;
    return a;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    ResizeStorage(storage, newsize);  // untyped_storage().resize_(n)
  }
};

struct Register {
  Register() {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    c10::SetAllocator(c10::DeviceType::PrivateUse1, PjrtAllocator());
  }
} registered;

}  // namespace

int CurrentDevice() { return current_device; }

void CheckDeviceIndex(int device) {
  TORCH_CHECK_INDEX(device >= 0 && device < DeviceCount(), runtime::Runtime::Get().DeviceIndexError(device));
}

void SetCurrentDevice(int device) {
  CheckDeviceIndex(device);
  current_device = device;
}

int DeviceCount() { return runtime::Runtime::Get().device_count(); }

void DrainAutogradThreads() {
  if (!runtime::Runtime::Initialized()) return;
  c10::AutogradState& state = c10::AutogradState::get_tls_state();
  const bool threads = state.get_multithreading_enabled();
  if (!threads && !runtime::Runtime::Get().options().autograd_threads) return;
  state.set_multithreading_enabled(true);  // queued to the device threads, not run inline here
  try {
    c10::InferenceMode no_inference(false);  // (an exit from inside torch.inference_mode())
    at::AutoGradMode grad(true);
    for (int d = 0; d < DeviceCount(); ++d) {
      at::Tensor x = at::empty({0}, at::TensorOptions().device(c10::DeviceType::PrivateUse1, d)).requires_grad_();
      // Kept for good: the device thread may drop its references to these
      // nodes after this returns, and the last reference must not be its.
      auto* y = new at::Tensor(x.sum());
      torch::autograd::backward({*y});
    }
  } catch (const std::exception&) {
    // Best effort: a runtime that cannot make a tensor any more (a lost
    // device) must not keep the exit handler from reporting what failed.
  }
  state.set_multithreading_enabled(threads);
}

}  // namespace tpj::aten
