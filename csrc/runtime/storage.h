// The contents of one PyTorch storage on one pjrt device, owned by the
// runtime. Other layers hold a Storage (the allocator makes one per
// at::StorageImpl) and read it through the accessors below; every change of
// its state goes through a Runtime method, under the runtime lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"
#include "pjrt/buffer.h"
#include "runtime/sharding.h"

namespace tpj::runtime {

using DeviceBuffer = std::shared_ptr<pjrt::Buffer>;

enum class ErrorKind {
  kIndex,    // an index out of range (Python IndexError)
  kValue,    // a value the op refuses, e.g. an integer division by zero (RuntimeError)
  kLinAlg,   // a singular or not positive-definite matrix (torch.linalg.LinAlgError)
  kFailure,  // the program failed to compile or run (RuntimeError)
  kOutOfMemory,  // ... for want of device memory (torch.OutOfMemoryError)
};

// Reading a tensor whose value was lost or is invalid.
class TensorError : public std::runtime_error {
 public:
  TensorError(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// What is known of the program that last wrote a storage, shared by every
// storage that program wrote: the checks compiled into it (`flag`) and the
// outcomes of the programs whose results it read (`inputs`), both read on
// the host when a value is read, or an error that every read of those
// storages raises. A null Outcome: nothing to check.
//
// The flags stay on the host side of the program boundary: a program never
// takes an earlier program's flag as an argument, so the programs of a step
// do not depend on which programs wrote their inputs (a step after one that
// ran as several programs, or after a read of the loss, runs the same
// executable as every other).
struct Outcome {
  // i32[]: 0 when every check passed, else the id of a failed one; null when
  // the program had no checks of its own. Dropped once verified.
  DeviceBuffer flag;
  // The unverified outcomes of what the program read: its results are as
  // invalid as those if one failed. Only outcomes with a flag (an outcome
  // without one lends its own inputs), emptied once verified.
  std::vector<std::shared_ptr<Outcome>> inputs;
  bool verified = false;  // flag and every input read, all 0
  std::string error;      // non-empty: the value is lost or invalid
  ErrorKind kind = ErrorKind::kFailure;
  bool reported = false;  // raised once already: sync(wait=True) does not raise it again
  // Where the program's checks were traced: (check id, Python file:line),
  // so a failure names the line of this program's op, not the first line
  // that ever traced the same message.
  std::vector<std::pair<int32_t, std::string>> check_sites;
};

// How Outcome::error ends: a failure taken over from a program read (its
// origin's message, then this), and a failed check's own message (what
// failed and where, then this).
inline constexpr std::string_view kInheritedClause =
    "; this value comes from a later program that read one of those tensors";
inline constexpr std::string_view kFailedCheckTail = "; every tensor computed by that program";

// The Outcome of a program that failed to `stage` ("compile", "run"): every
// storage it would have written raises this when read. Call it inside a
// catch block: the message names the exception being handled.
std::shared_ptr<Outcome> LostToCurrentException(const char* stage);

// `nbytes` bytes held flat (rank 1) as elements of one dtype, fixed by the
// first typed use. The contents are, in order of precedence: a pending value
// of the device's current trace; else the device buffer; else zeros (never
// written). The buffer is kept while a value is pending: the program that
// computes the value may read it, or reuse (donate) its memory.
class Storage {
 public:
  Storage(int device, size_t nbytes)
      : serial_(next_serial_.fetch_add(1, std::memory_order_relaxed)), device_(device), nbytes_(nbytes) {}
  ~Storage();  // leaves the runtime's pending set
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // The live storage whose address is `p`, or null. PyTorch sees a
  // storage's address as its data pointer; its legacy serialization (pickle,
  // torch.save without zip) wraps that pointer with at::from_blob, which
  // keeps no context, to copy the bytes to the host.
  static Storage* FromAddress(void* p) {
    auto* s = static_cast<Storage*>(p);
    return s != nullptr && s->tag_ == kTag ? s : nullptr;
  }

  // Local device index (0..device_count-1).
  int device() const { return device_; }
  size_t nbytes() const { return nbytes_; }
  std::optional<ir::DType> dtype() const { return dtype_; }
  // Whether a value is waiting for the next sync. Caller holds the runtime lock.
  bool pending() const { return pending_; }
  // Whether materialized contents exist on the device. Caller holds the runtime lock.
  bool has_buffer() const { return static_cast<bool>(buffer_); }
  // SPMD: how the buffers split the contents over a mesh (replicas_[p] holds
  // mesh position p's piece, buffer_ == replicas_[0]), and the sharding a
  // pending value takes; null for a storage of one device. Caller holds the runtime lock.
  const std::shared_ptr<const Sharding>& sharding() const { return sharding_; }

 private:
  friend class Runtime;
  static constexpr uint64_t kTag = 0x746f7263682d706aULL;

  // kTag while the storage lives; the destructor clears it, so a pointer to
  // a freed storage is refused unless its memory was reused for a new one
  uint64_t tag_ = kTag;
  // Distinct for each storage of the process (an address is reused by the
  // next storage): Runtime::MayJoinAgain tells a storage from its successor.
  static inline std::atomic<uint64_t> next_serial_{0};
  const uint64_t serial_;
  const int device_;
  size_t nbytes_;
  std::optional<ir::DType> dtype_;
  DeviceBuffer buffer_;
  // In a replicated region: one buffer per replica (replicas_[0] == buffer_).
  std::vector<DeviceBuffer> replicas_;
  ir::Value value_;     // the pending value, valid while pending_
  int64_t epoch_ = -1;  // the trace epoch value_ belongs to
  bool pending_ = false;
  std::shared_ptr<Outcome> outcome_;  // of the program that computed buffer_
  // outcome_ and dtype_ before the current trace wrote the storage, which an
  // out-of-memory failure before the launch restores (SyncDevice)
  std::shared_ptr<Outcome> outcome_before_;
  std::optional<ir::DType> dtype_before_;
  std::shared_ptr<const Sharding> sharding_;  // SPMD (see sharding())
};

}  // namespace tpj::runtime
