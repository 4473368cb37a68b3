// A PJRT client and the devices it sees.
//
// Devices are plain views owned by the client (no destroy call). A Client is
// always held in a shared_ptr: every Buffer and Executable keeps it alive, so
// the client is destroyed after the last object made from it.
//
// Thread model: creating buffers, compiling and executing may be called from
// several threads (the XLA plugins allow it); callers serialise calls on one
// Buffer or Executable object themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <string>
#include <variant>
#include <vector>

#include "pjrt/buffer.h"
#include "pjrt/c_api.h"
#include "pjrt/plugin.h"

namespace tpj::pjrt {

class Executable;
struct CompileOptions;

// One named option for PJRT_Client_Create (e.g. cpu_device_count = 4).
struct NamedOption {
  std::string name;
  std::variant<int64_t, std::string, bool, float, std::vector<int64_t>> value;
};

struct Device {
  pjrt_abi::Device* handle = nullptr;  // lives as long as the client
  int id = -1;                         // global id, unique across processes
  int process_index = 0;
  int local_hardware_id = -1;
  bool addressable = false;
  std::string kind;                    // e.g. "cpu"
  std::string debug_string;
};

// Shape and type of one program argument; used to check Execute() input.
struct ArgSpec {
  pjrt_abi::BufferType type = pjrt_abi::kInvalid;
  std::vector<int64_t> dims;
};

class Client : public std::enable_shared_from_this<Client> {
 public:
  static std::shared_ptr<Client> Create(std::shared_ptr<const Plugin> plugin,
                                        const std::vector<NamedOption>& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  const std::shared_ptr<const Plugin>& plugin_ptr() const { return plugin_; }
  pjrt_abi::Client* handle() const { return client_; }

  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  int process_index() const { return process_index_; }

  const std::vector<Device>& devices() const { return devices_; }
  // Global ids of the devices this process can use, in the plugin's order.
  const std::vector<int>& addressable_device_ids() const { return addressable_; }
  // Device by global id; throws Error naming the valid ids.
  const Device& device(int id) const;
  const Device& DeviceFromHandle(pjrt_abi::Device* handle) const;

  // The allocator statistics the plugin reports for `device_id` (name, value;
  // "bytes_in_use" first, then the optional ones it set), or nullopt when the
  // plugin has no PJRT_Device_MemoryStats or answers UNIMPLEMENTED (the XLA
  // CPU plugins do). Other errors throw.
  std::optional<std::vector<std::pair<std::string, int64_t>>> MemoryStats(int device_id) const;

  // Copies dense row-major host data to `device_id`. The host memory may be
  // reused as soon as this returns.
  std::unique_ptr<Buffer> BufferFromHost(const void* data, pjrt_abi::BufferType type,
                                         const std::vector<int64_t>& dims, int device_id);

  // Compiles MLIR text (StableHLO, entry @main). `args`, when given, lets
  // Execute() check its input before calling the plugin.
  std::unique_ptr<Executable> Compile(const std::string& mlir, const CompileOptions& options,
                                      std::vector<ArgSpec> args = {});
  // Loads an executable made by Executable::Serialize() with a plugin of the
  // same XLA version.
  std::unique_ptr<Executable> Deserialize(const std::string& bytes, const CompileOptions& options,
                                          std::vector<ArgSpec> args = {});

 private:
  friend class Executable;
  Client() = default;

  // Multi-replica launches are serialised: each waits until the previous one
  // has finished on every device. The XLA CPU plugin runs replicas on a small
  // thread pool and blocks a thread per replica at each collective; with two
  // launches in flight the pool fills with replicas of the later launch and
  // the earlier one never completes (a deadlock, then an abort).
  std::mutex replicated_mu_;
  std::vector<std::unique_ptr<Event>> replicated_inflight_;

  std::shared_ptr<const Plugin> plugin_;
  pjrt_abi::Client* client_ = nullptr;
  std::string platform_name_;
  std::string platform_version_;
  int process_index_ = 0;
  std::vector<Device> devices_;
  std::vector<int> addressable_;
};

}  // namespace tpj::pjrt
