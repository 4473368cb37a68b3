#include "pjrt/client.h"

#include <sstream>

#include "pjrt/executable.h"

namespace tpj::pjrt {
namespace {

std::vector<pjrt_abi::NamedValue> ToNamedValues(const std::vector<NamedOption>& options) {
  std::vector<pjrt_abi::NamedValue> out;
  out.reserve(options.size());
  for (const auto& o : options) {
    auto v = pjrt_abi::make<pjrt_abi::NamedValue>();
    v.name = o.name.c_str();
    v.name_size = o.name.size();
    v.value_size = 1;
    if (auto* i = std::get_if<int64_t>(&o.value)) {
      v.type = pjrt_abi::kInt64;
      v.int64_value = *i;
    } else if (auto* s = std::get_if<std::string>(&o.value)) {
      v.type = pjrt_abi::kString;
      v.string_value = s->c_str();
      v.value_size = s->size();
    } else if (auto* b = std::get_if<bool>(&o.value)) {
      v.type = pjrt_abi::kBool;
      v.bool_value = *b;
    } else if (auto* f = std::get_if<float>(&o.value)) {
      v.type = pjrt_abi::kFloat;
      v.float_value = *f;
    } else {
      const auto& l = std::get<std::vector<int64_t>>(o.value);
      v.type = pjrt_abi::kInt64List;
      v.int64_array_value = l.data();
      v.value_size = l.size();
    }
    out.push_back(v);
  }
  return out;
}

std::string DescriptionString(const Plugin& p, pjrt_abi::DeviceDescription* d,
                              pjrt_abi::Fn<pjrt_abi::DescriptionStringArgs> pjrt_abi::Api::*member,
                              size_t offset, const char* name) {
  if (!p.Has(offset)) return "";
  auto a = pjrt_abi::make<pjrt_abi::DescriptionStringArgs>();
  a.description = d;
  p.Call(member, offset, name, &a);
  return a.value ? std::string(a.value, a.value_size) : "";
}

}  // namespace

std::shared_ptr<Client> Client::Create(std::shared_ptr<const Plugin> plugin,
                                       const std::vector<NamedOption>& options) {
  std::shared_ptr<Client> c(new Client());
  c->plugin_ = std::move(plugin);
  const Plugin& p = *c->plugin_;

  std::vector<pjrt_abi::NamedValue> values = ToNamedValues(options);
  auto create = pjrt_abi::make<pjrt_abi::ClientCreateArgs>();
  create.create_options = values.data();
  create.num_options = values.size();
  TPJ_CALL(p, PJRT_Client_Create, &create);
  c->client_ = create.client;

  auto name = pjrt_abi::make<pjrt_abi::ClientStringArgs>();
  name.client = c->client_;
  TPJ_CALL(p, PJRT_Client_PlatformName, &name);
  c->platform_name_.assign(name.value, name.value_size);

  auto version = pjrt_abi::make<pjrt_abi::ClientStringArgs>();
  version.client = c->client_;
  TPJ_CALL(p, PJRT_Client_PlatformVersion, &version);
  c->platform_version_.assign(version.value, version.value_size);

  auto process = pjrt_abi::make<pjrt_abi::ClientProcessIndexArgs>();
  process.client = c->client_;
  TPJ_CALL(p, PJRT_Client_ProcessIndex, &process);
  c->process_index_ = process.process_index;

  auto all = pjrt_abi::make<pjrt_abi::ClientDevicesArgs>();
  all.client = c->client_;
  TPJ_CALL(p, PJRT_Client_Devices, &all);
  for (size_t i = 0; i < all.num_devices; ++i) {
    Device d;
    d.handle = all.devices[i];
    auto desc = pjrt_abi::make<pjrt_abi::DeviceGetDescriptionArgs>();
    desc.device = d.handle;
    TPJ_CALL(p, PJRT_Device_GetDescription, &desc);
    auto id = pjrt_abi::make<pjrt_abi::DescriptionIntArgs>();
    id.description = desc.description;
    TPJ_CALL(p, PJRT_DeviceDescription_Id, &id);
    d.id = id.value;
    auto proc = pjrt_abi::make<pjrt_abi::DescriptionIntArgs>();
    proc.description = desc.description;
    TPJ_CALL(p, PJRT_DeviceDescription_ProcessIndex, &proc);
    d.process_index = proc.value;
    d.kind = DescriptionString(p, desc.description, &pjrt_abi::Api::PJRT_DeviceDescription_Kind,
                               offsetof(pjrt_abi::Api, PJRT_DeviceDescription_Kind),
                               "PJRT_DeviceDescription_Kind");
    d.debug_string = DescriptionString(
        p, desc.description, &pjrt_abi::Api::PJRT_DeviceDescription_DebugString,
        offsetof(pjrt_abi::Api, PJRT_DeviceDescription_DebugString),
        "PJRT_DeviceDescription_DebugString");
    auto addr = pjrt_abi::make<pjrt_abi::DeviceIsAddressableArgs>();
    addr.device = d.handle;
    TPJ_CALL(p, PJRT_Device_IsAddressable, &addr);
    d.addressable = addr.is_addressable;
    if (d.addressable) {
      auto hw = pjrt_abi::make<pjrt_abi::DeviceLocalHardwareIdArgs>();
      hw.device = d.handle;
      TPJ_CALL(p, PJRT_Device_LocalHardwareId, &hw);
      d.local_hardware_id = hw.local_hardware_id;
    }
    c->devices_.push_back(std::move(d));
  }

  auto local = pjrt_abi::make<pjrt_abi::ClientDevicesArgs>();
  local.client = c->client_;
  TPJ_CALL(p, PJRT_Client_AddressableDevices, &local);
  for (size_t i = 0; i < local.num_devices; ++i) {
    c->addressable_.push_back(c->DeviceFromHandle(local.devices[i]).id);
  }
  return c;
}

Client::~Client() {
  if (client_ == nullptr) return;
  auto a = pjrt_abi::make<pjrt_abi::ClientDestroyArgs>();
  a.client = client_;
  TPJ_CALL_NOTHROW(*plugin_, PJRT_Client_Destroy, &a);
}

std::optional<std::vector<std::pair<std::string, int64_t>>> Client::MemoryStats(int device_id) const {
  const Device& d = device(device_id);
  if (!TPJ_HAS(*plugin_, PJRT_Device_MemoryStats)) return std::nullopt;
  auto args = pjrt_abi::make<pjrt_abi::DeviceMemoryStatsArgs>();
  args.device = d.handle;
  try {
    TPJ_CALL(*plugin_, PJRT_Device_MemoryStats, &args);
  } catch (const Error& e) {
    if (e.code() == static_cast<int>(Code::kUnimplemented)) return std::nullopt;
    throw;
  }
  std::vector<std::pair<std::string, int64_t>> out{{"bytes_in_use", args.bytes_in_use}};
  auto add = [&](const char* name, int64_t v, bool set) {
    if (set) out.emplace_back(name, v);
  };
  add("peak_bytes_in_use", args.peak_bytes_in_use, args.peak_bytes_in_use_is_set);
  add("num_allocs", args.num_allocs, args.num_allocs_is_set);
  add("largest_alloc_size", args.largest_alloc_size, args.largest_alloc_size_is_set);
  add("bytes_limit", args.bytes_limit, args.bytes_limit_is_set);
  add("bytes_reserved", args.bytes_reserved, args.bytes_reserved_is_set);
  add("peak_bytes_reserved", args.peak_bytes_reserved, args.peak_bytes_reserved_is_set);
  add("bytes_reservable_limit", args.bytes_reservable_limit, args.bytes_reservable_limit_is_set);
  add("largest_free_block_bytes", args.largest_free_block_bytes, args.largest_free_block_bytes_is_set);
  add("pool_bytes", args.pool_bytes, args.pool_bytes_is_set);
  add("peak_pool_bytes", args.peak_pool_bytes, args.peak_pool_bytes_is_set);
  return out;
}

const Device& Client::device(int id) const {
  for (const auto& d : devices_) {
    if (d.id == id) return d;
  }
  std::ostringstream os;
  os << "no PJRT device with id " << id << " on platform '" << platform_name_ << "': it has "
     << devices_.size() << " device(s) with ids";
  for (const auto& d : devices_) os << " " << d.id;
  throw Error(Code::kOutOfRange, os.str());
}

const Device& Client::DeviceFromHandle(pjrt_abi::Device* handle) const {
  for (const auto& d : devices_) {
    if (d.handle == handle) return d;
  }
  throw Error(Code::kInternal, "PJRT plugin returned a device handle that is not in its device list");
}

std::unique_ptr<Buffer> Client::BufferFromHost(const void* data, pjrt_abi::BufferType type,
                                               const std::vector<int64_t>& dims, int device_id) {
  if (ByteWidth(type) == 0) {
    throw Error(Code::kInvalidArgument,
                std::string("cannot create a PJRT buffer of element type ") + TypeName(type));
  }
  for (int64_t d : dims) {
    if (d < 0) throw Error(Code::kInvalidArgument, "cannot create a PJRT buffer with a negative dimension");
  }
  const Device& dev = device(device_id);
  if (!dev.addressable) {
    throw Error(Code::kInvalidArgument,
                "device " + std::to_string(device_id) + " is not addressable from process " +
                std::to_string(process_index_));
  }
  auto a = pjrt_abi::make<pjrt_abi::ClientBufferFromHostArgs>();
  a.client = client_;
  a.data = data;
  a.type = type;
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = pjrt_abi::kImmutableOnlyDuringCall;
  a.device = dev.handle;
  TPJ_CALL(*plugin_, PJRT_Client_BufferFromHostBuffer, &a);
  auto buffer = std::make_unique<Buffer>(shared_from_this(), a.buffer);
  // With "only during call" semantics the host copy is done on return; the
  // event, if any, is complete and only needs freeing (after checking it).
  Event(plugin_, a.done_with_host_buffer).Await();
  return buffer;
}

std::unique_ptr<Executable> Client::Compile(const std::string& mlir, const CompileOptions& options,
                                            std::vector<ArgSpec> args) {
  const std::string encoded = EncodeCompileOptions(options);
  // PJRT requires null-terminated program text; std::string guarantees it.
  std::string code = mlir;
  auto program = pjrt_abi::make<pjrt_abi::Program>();
  program.code = code.data();
  program.code_size = code.size();
  static const char kFormat[] = "mlir";
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  auto a = pjrt_abi::make<pjrt_abi::ClientCompileArgs>();
  a.client = client_;
  a.program = &program;
  a.compile_options = encoded.data();
  a.compile_options_size = encoded.size();
  TPJ_CALL(*plugin_, PJRT_Client_Compile, &a);
  return std::unique_ptr<Executable>(
      new Executable(shared_from_this(), a.executable, options, std::move(args)));
}

std::unique_ptr<Executable> Client::Deserialize(const std::string& bytes,
                                                const CompileOptions& options,
                                                std::vector<ArgSpec> args) {
  auto a = pjrt_abi::make<pjrt_abi::ExecutableDeserializeAndLoadArgs>();
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  TPJ_CALL(*plugin_, PJRT_Executable_DeserializeAndLoad, &a);
  return std::unique_ptr<Executable>(
      new Executable(shared_from_this(), a.loaded_executable, options, std::move(args)));
}

}  // namespace tpj::pjrt
