// Device buffers and completion events.
//
// Thread model: a Buffer or Event object is used by one thread at a time; the
// plugin may complete work on its own threads, which we only observe through
// Event::Await. Every Buffer keeps its Client (and so the plugin) alive.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt/c_api.h"

namespace tpj::pjrt {

class Client;
class Plugin;

// Bytes per element of a PJRT buffer type; 0 for types we do not move.
size_t ByteWidth(pjrt_abi::BufferType type);
// "f32", "bf16", "pred", ... for messages.
const char* TypeName(pjrt_abi::BufferType type);

// Called about every 50 ms while an interruptible wait blocks; it throws to
// abandon the wait (e.g. when the user pressed Ctrl-C).
using WaitCheck = std::function<void()>;

// An owned PJRT_Event. Await() blocks and throws the event's error, if any.
class Event {
 public:
  Event(std::shared_ptr<const Plugin> plugin, pjrt_abi::Event* event);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void Await();
  bool IsReady() const;
  // Await() that calls `check` while the event is not ready. If `check`
  // throws, the wait is abandoned and the exception propagates; the event
  // is kept until the plugin signals it, then destroyed by a later wait.
  // Without PJRT_Event_OnReady in the plugin (or without `check`), a plain Await().
  static void AwaitInterruptible(std::unique_ptr<Event> event, const WaitCheck& check);

 private:
  std::shared_ptr<const Plugin> plugin_;
  pjrt_abi::Event* event_;
};

// An owned PJRT_Buffer on one device.
class Buffer {
 public:
  Buffer(std::shared_ptr<Client> client, pjrt_abi::Buffer* buffer);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  pjrt_abi::Buffer* handle() const { return buffer_; }
  // Type, dims and device never change: the plugin is asked once, by the
  // constructor (safe from any thread; after an error, asked again).
  pjrt_abi::BufferType element_type() const;
  const std::vector<int64_t>& dims() const;
  int64_t element_count() const;
  size_t on_device_size() const;
  int device_id() const;       // global id of the device holding it
  bool is_deleted() const;

  // Frees the device memory now; the object stays, as a deleted buffer.
  void Delete();

  // Copies to host memory of exactly element_count() * ByteWidth() bytes,
  // dense row-major, and waits for the copy.
  void ToHost(void* dst, size_t dst_size) const;
  std::vector<uint8_t> ToHost() const;

  // Waits until the buffer's contents are computed; throws the producer's
  // error. With `check`, the wait is interruptible (Event::AwaitInterruptible).
  void AwaitReady(const WaitCheck& check = nullptr) const;
  // An event that becomes ready with the buffer's contents.
  std::unique_ptr<Event> ReadyEvent() const;
  // Whether the contents are computed (or failed), without waiting.
  bool IsReady() const;

  // Copies this buffer to another device of the same client.
  std::unique_ptr<Buffer> CopyToDevice(int device_id) const;

  const std::shared_ptr<Client>& client() const { return client_; }

  // Takes back what the constructor counted in LiveBufferBytes, once: the
  // destructor does, or an owner that keeps a buffer it no longer uses.
  void Untally();

 private:
  void AskFacts() const;  // type, dims and device, once

  std::shared_ptr<Client> client_;
  pjrt_abi::Buffer* buffer_;
  // What this buffer adds to its device's LiveBufferBytes while counted.
  int tally_device_ = -1;  // -1: not counted
  int64_t tally_bytes_ = 0;
  // Not std::call_once: with libstdc++ on glibc, a call_once whose function
  // threw can hang the next call (GCC bug 66146).
  mutable std::atomic<bool> has_facts_{false};
  mutable std::mutex facts_mu_;
  mutable pjrt_abi::BufferType type_{};
  mutable std::vector<int64_t> dims_;
  mutable int device_ = -1;
};

}  // namespace tpj::pjrt
