#include "pjrt/buffer.h"
#include "pjrt/buffer_bytes.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "pjrt/client.h"
#include "pjrt/plugin.h"

namespace tpj::pjrt {

size_t ByteWidth(pjrt_abi::BufferType type) {
  switch (type) {
    case pjrt_abi::kPred: case pjrt_abi::kS8: case pjrt_abi::kU8: return 1;
    case pjrt_abi::kS16: case pjrt_abi::kU16: case pjrt_abi::kF16: case pjrt_abi::kBF16: return 2;
    case pjrt_abi::kS32: case pjrt_abi::kU32: case pjrt_abi::kF32: return 4;
    case pjrt_abi::kS64: case pjrt_abi::kU64: case pjrt_abi::kF64: case pjrt_abi::kC64: return 8;
    case pjrt_abi::kC128: return 16;
    default: return 0;
  }
}

const char* TypeName(pjrt_abi::BufferType type) {
  switch (type) {
    case pjrt_abi::kPred: return "pred";
    case pjrt_abi::kS8: return "s8";
    case pjrt_abi::kS16: return "s16";
    case pjrt_abi::kS32: return "s32";
    case pjrt_abi::kS64: return "s64";
    case pjrt_abi::kU8: return "u8";
    case pjrt_abi::kU16: return "u16";
    case pjrt_abi::kU32: return "u32";
    case pjrt_abi::kU64: return "u64";
    case pjrt_abi::kF16: return "f16";
    case pjrt_abi::kF32: return "f32";
    case pjrt_abi::kF64: return "f64";
    case pjrt_abi::kBF16: return "bf16";
    case pjrt_abi::kC64: return "c64";
    case pjrt_abi::kC128: return "c128";
    default: return "unsupported";
  }
}

// ----------------------------------------------------------------- Event

Event::Event(std::shared_ptr<const Plugin> plugin, pjrt_abi::Event* event)
    : plugin_(std::move(plugin)), event_(event) {}

Event::~Event() {
  if (event_ == nullptr) return;
  auto a = pjrt_abi::make<pjrt_abi::EventDestroyArgs>();
  a.event = event_;
  TPJ_CALL_NOTHROW(*plugin_, PJRT_Event_Destroy, &a);
}

void Event::Await() {
  if (event_ == nullptr) return;
  auto a = pjrt_abi::make<pjrt_abi::EventAwaitArgs>();
  a.event = event_;
  TPJ_CALL(*plugin_, PJRT_Event_Await, &a);
}

bool Event::IsReady() const {
  if (event_ == nullptr) return true;
  auto a = pjrt_abi::make<pjrt_abi::EventIsReadyArgs>();
  a.event = event_;
  TPJ_CALL(*plugin_, PJRT_Event_IsReady, &a);
  return a.is_ready;
}

namespace {

// One interruptible wait: the OnReady callback marks it done. Kept alive by
// the waiter, or by the graveyard when the waiter gave up, so that the
// callback never destroys the event it is called for.
struct PendingWait {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::unique_ptr<Event> event;
  const pjrt_abi::Api* api = nullptr;
};

std::mutex& GraveyardMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::shared_ptr<PendingWait>>& Graveyard() {
  static auto* g = new std::vector<std::shared_ptr<PendingWait>>();  // never destroyed: callbacks may outlive exit
  return *g;
}

void OnReady(pjrt_abi::Error* error, void* arg) {
  auto* holder = static_cast<std::shared_ptr<PendingWait>*>(arg);
  PendingWait* w = holder->get();
  DiscardError(w->api, error);  // the waiter reads the error through Await()
  delete holder;                // the waiter or the graveyard still holds `w`
  std::lock_guard<std::mutex> l(w->mu);
  w->done = true;
  w->cv.notify_all();
}

void BuryFinished() {
  std::vector<std::shared_ptr<PendingWait>> finished;
  {
    std::lock_guard<std::mutex> l(GraveyardMutex());
    auto& g = Graveyard();
    for (auto it = g.begin(); it != g.end();) {
      bool done;
      {
        std::lock_guard<std::mutex> wl((*it)->mu);
        done = (*it)->done;
      }
      if (done) {
        finished.push_back(std::move(*it));
        it = g.erase(it);
      } else {
        ++it;
      }
    }
  }
}  // `finished` destroys their events here, outside every lock

}  // namespace

void Event::AwaitInterruptible(std::unique_ptr<Event> event, const WaitCheck& check) {
  if (!check || event->event_ == nullptr || event->IsReady() || !TPJ_HAS(*event->plugin_, PJRT_Event_OnReady)) {
    event->Await();
    return;
  }
  BuryFinished();
  auto w = std::make_shared<PendingWait>();
  w->api = event->plugin_->api();
  Event* e = event.get();
  w->event = std::move(event);
  auto a = pjrt_abi::make<pjrt_abi::EventOnReadyArgs>();
  a.event = e->event_;
  a.callback = &OnReady;
  a.user_arg = new std::shared_ptr<PendingWait>(w);
  try {
    TPJ_CALL(*e->plugin_, PJRT_Event_OnReady, &a);
  } catch (...) {
    delete static_cast<std::shared_ptr<PendingWait>*>(a.user_arg);
    throw;
  }
  std::unique_lock<std::mutex> l(w->mu);
  while (!w->done) {
    if (w->cv.wait_for(l, std::chrono::milliseconds(50), [&] { return w->done; })) break;
    l.unlock();
    try {
      check();
    } catch (...) {
      std::lock_guard<std::mutex> g(GraveyardMutex());
      Graveyard().push_back(std::move(w));
      throw;
    }
    l.lock();
  }
  l.unlock();
  e->Await();  // ready: returns at once, throws the event's error
}

// ---------------------------------------------------------------- Buffer

namespace {

std::mutex& TallyMu() {
  static auto* mu = new std::mutex();  // never destroyed, as the maps below
  return *mu;
}

std::map<int, BufferBytes>& Tally() {
  static auto* t = new std::map<int, BufferBytes>();  // never destroyed: buffers may outlive statics
  return *t;
}

}  // namespace

BufferBytes LiveBufferBytes(int device_id) {
  std::lock_guard<std::mutex> l(TallyMu());
  auto it = Tally().find(device_id);
  return it == Tally().end() ? BufferBytes{} : it->second;
}

void ResetPeakBufferBytes(int device_id) {
  std::lock_guard<std::mutex> l(TallyMu());
  BufferBytes& b = Tally()[device_id];
  b.peak = b.in_use;
}

Buffer::Buffer(std::shared_ptr<Client> client, pjrt_abi::Buffer* buffer)
    : client_(std::move(client)), buffer_(buffer) {
  if (buffer_ == nullptr) return;
  try {
    const int device = device_id();
    const auto bytes = static_cast<int64_t>(on_device_size());
    std::lock_guard<std::mutex> l(TallyMu());
    BufferBytes& b = Tally()[device];
    b.in_use += bytes;
    b.buffers += 1;
    if (b.in_use > b.peak) b.peak = b.in_use;
    tally_device_ = device;
    tally_bytes_ = bytes;
  } catch (...) {  // a buffer the plugin cannot size (an error value) is not counted
  }
}

void Buffer::Untally() {
  std::lock_guard<std::mutex> l(TallyMu());
  if (tally_device_ < 0) return;
  BufferBytes& b = Tally()[tally_device_];
  b.in_use -= tally_bytes_;
  b.buffers -= 1;
  tally_device_ = -1;
}

Buffer::~Buffer() {
  Untally();
  if (buffer_ == nullptr) return;
  auto a = pjrt_abi::make<pjrt_abi::BufferArgs>();
  a.buffer = buffer_;
  TPJ_CALL_NOTHROW(client_->plugin(), PJRT_Buffer_Destroy, &a);
}

void Buffer::AskFacts() const {
  if (has_facts_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> l(facts_mu_);
  if (has_facts_.load(std::memory_order_relaxed)) return;
  auto t = pjrt_abi::make<pjrt_abi::BufferElementTypeArgs>();
  t.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_ElementType, &t);
  auto d = pjrt_abi::make<pjrt_abi::BufferDimensionsArgs>();
  d.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_Dimensions, &d);
  auto v = pjrt_abi::make<pjrt_abi::BufferDeviceArgs>();
  v.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_Device, &v);
  type_ = t.type;
  dims_.assign(d.dims, d.dims + d.num_dims);
  device_ = client_->DeviceFromHandle(v.device).id;
  has_facts_.store(true, std::memory_order_release);
}

pjrt_abi::BufferType Buffer::element_type() const {
  AskFacts();
  return type_;
}

const std::vector<int64_t>& Buffer::dims() const {
  AskFacts();
  return dims_;
}

int64_t Buffer::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims()) n *= d;
  return n;
}

size_t Buffer::on_device_size() const {
  auto a = pjrt_abi::make<pjrt_abi::BufferSizeArgs>();
  a.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_OnDeviceSizeInBytes, &a);
  return a.on_device_size_in_bytes;
}

int Buffer::device_id() const {
  AskFacts();
  return device_;
}

bool Buffer::is_deleted() const {
  auto a = pjrt_abi::make<pjrt_abi::BufferIsDeletedArgs>();
  a.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_IsDeleted, &a);
  return a.is_deleted;
}

void Buffer::Delete() {
  Untally();
  auto a = pjrt_abi::make<pjrt_abi::BufferArgs>();
  a.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_Delete, &a);
}

void Buffer::ToHost(void* dst, size_t dst_size) const {
  if (is_deleted()) {
    throw Error(Code::kFailedPrecondition,
                "cannot read a deleted PJRT buffer (it was donated to a program or deleted)");
  }
  const size_t want = static_cast<size_t>(element_count()) * ByteWidth(element_type());
  if (dst_size != want) {
    std::ostringstream os;
    os << "Buffer::ToHost: destination has " << dst_size << " bytes, buffer holds " << want;
    throw Error(Code::kInvalidArgument, os.str());
  }
  auto a = pjrt_abi::make<pjrt_abi::BufferToHostArgs>();
  a.src = buffer_;
  a.dst = dst;
  a.dst_size = dst_size;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_ToHostBuffer, &a);
  Event(client_->plugin_ptr(), a.event).Await();
}

std::vector<uint8_t> Buffer::ToHost() const {
  std::vector<uint8_t> out(static_cast<size_t>(element_count()) * ByteWidth(element_type()));
  ToHost(out.data(), out.size());
  return out;
}

std::unique_ptr<Event> Buffer::ReadyEvent() const {
  auto a = pjrt_abi::make<pjrt_abi::BufferReadyEventArgs>();
  a.buffer = buffer_;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_ReadyEvent, &a);
  return std::make_unique<Event>(client_->plugin_ptr(), a.event);
}

void Buffer::AwaitReady(const WaitCheck& check) const { Event::AwaitInterruptible(ReadyEvent(), check); }

bool Buffer::IsReady() const { return ReadyEvent()->IsReady(); }

std::unique_ptr<Buffer> Buffer::CopyToDevice(int device_id) const {
  auto a = pjrt_abi::make<pjrt_abi::BufferCopyToDeviceArgs>();
  a.buffer = buffer_;
  a.dst_device = client_->device(device_id).handle;
  TPJ_CALL(client_->plugin(), PJRT_Buffer_CopyToDevice, &a);
  return std::make_unique<Buffer>(client_, a.dst_buffer);
}

}  // namespace tpj::pjrt
