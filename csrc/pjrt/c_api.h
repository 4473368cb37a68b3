// Our declarations of the subset of the PJRT C ABI that torch-pjrt calls.
//
// Written from the public facts of the interface (field order, types, enum
// values). Layout targets PJRT API 0.81; plugins from 0.57 on share every
// offset we use (fields are only ever appended). We always pass the full size
// of each args struct declared here: plugins accept a larger struct_size than
// they know and reject a smaller one. Zero-initialised fields the plugin does
// not know are never read by it.
//
// Nothing here allocates; every pointer's lifetime is stated where it matters.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pjrt_abi {

inline constexpr int kMajor = 0;
inline constexpr int kMinorDeclared = 81;  // the header version we declare
inline constexpr int kMinorSupported = 57; // oldest plugin we accept

// Size of an args struct as PJRT defines it: up to the end of its last field.
#define TPJ_STRUCT_SIZE(type, last) (offsetof(type, last) + sizeof(((type*)nullptr)->last))

struct Error;
struct Event;
struct Client;
struct Device;
struct DeviceDescription;
struct Memory;
struct Executable;
struct LoadedExecutable;
struct Buffer;
struct SerializedExecutable;

struct ExtensionBase {
  size_t struct_size;
  int type;
  ExtensionBase* next;
};

struct ApiVersion {
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};

// --- errors -----------------------------------------------------------------

struct ErrorDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Error* error;
};
struct ErrorMessageArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  const char* message;  // out, lives as long as `error`
  size_t message_size;  // out
};
struct ErrorGetCodeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  int code;  // out, absl-style 1..16
};

// --- named values -----------------------------------------------------------

enum NamedValueType : int { kString = 0, kInt64 = 1, kInt64List = 2, kFloat = 3, kBool = 4 };

struct NamedValue {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* name;
  size_t name_size;
  NamedValueType type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;  // elements for lists and strings, 1 for scalars
};

// --- plugin -----------------------------------------------------------------

struct PluginInitializeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
};
struct PluginAttributesArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const NamedValue* attributes;  // out, lives as long as the process
  size_t num_attributes;         // out
};

// --- events -----------------------------------------------------------------

struct EventDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
};
struct EventIsReadyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
  bool is_ready;  // out
};
struct EventAwaitArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
};
// Called once the event is ready; owns `error` (null: success) and must
// destroy it.
using EventOnReadyCallback = void (*)(Error* error, void* user_arg);
struct EventOnReadyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
  EventOnReadyCallback callback;
  void* user_arg;
};

// --- client -----------------------------------------------------------------

using CallbackError = Error* (*)(int code, const char* message, size_t message_size);
using KeyValueValueDeleter = void (*)(char* value);

struct KeyValueGetArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* key;
  size_t key_size;
  int timeout_in_ms;
  CallbackError* callback_error;
  void* user_arg;
  char* value;                          // out
  size_t value_size;                    // out
  KeyValueValueDeleter value_deleter;   // out
};
struct KeyValuePutArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* key;
  size_t key_size;
  const char* value;
  size_t value_size;
  CallbackError* callback_error;
  void* user_arg;
};
using KeyValueGet = Error* (*)(KeyValueGetArgs*);
using KeyValuePut = Error* (*)(KeyValuePutArgs*);

struct ClientCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const NamedValue* create_options;
  size_t num_options;
  KeyValueGet kv_get_callback;
  void* kv_get_user_arg;
  KeyValuePut kv_put_callback;
  void* kv_put_user_arg;
  Client* client;  // out
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
};
struct ClientDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
};
struct ClientStringArgs {  // PlatformName and PlatformVersion share a layout
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const char* value;  // out, lives as long as the client
  size_t value_size;  // out
};
struct ClientProcessIndexArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  int process_index;  // out
};
struct ClientDevicesArgs {  // Devices and AddressableDevices share a layout
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  Device* const* devices;  // out, owned by the client
  size_t num_devices;      // out
};

struct Program {
  size_t struct_size;
  ExtensionBase* extension_start;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
};
struct ClientCompileArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const Program* program;
  const char* compile_options;  // serialized xla.CompileOptionsProto
  size_t compile_options_size;
  LoadedExecutable* executable;  // out
};

enum BufferType : int {
  kInvalid = 0, kPred = 1, kS8 = 2, kS16 = 3, kS32 = 4, kS64 = 5, kU8 = 6, kU16 = 7,
  kU32 = 8, kU64 = 9, kF16 = 10, kF32 = 11, kF64 = 12, kBF16 = 13, kC64 = 14, kC128 = 15,
};
enum HostBufferSemantics : int {
  kImmutableOnlyDuringCall = 0,
  kImmutableUntilTransferCompletes = 1,
  kImmutableZeroCopy = 2,
  kMutableZeroCopy = 3,
};

struct ClientBufferFromHostArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const void* data;
  BufferType type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;  // null: dense row-major
  size_t num_byte_strides;
  HostBufferSemantics host_buffer_semantics;
  Device* device;
  Memory* memory;
  void* device_layout;
  Event* done_with_host_buffer;  // out
  Buffer* buffer;                // out
};

// --- devices ----------------------------------------------------------------

struct DeviceGetDescriptionArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Device* device;
  DeviceDescription* description;  // out, owned by the device
};
struct DeviceLocalHardwareIdArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Device* device;
  int local_hardware_id;  // out
};
struct DeviceIsAddressableArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Device* device;
  bool is_addressable;  // out
};
struct DescriptionIntArgs {  // Id and ProcessIndex share a layout
  size_t struct_size;
  ExtensionBase* extension_start;
  DeviceDescription* description;
  int value;  // out
};
struct DescriptionStringArgs {  // Kind, DebugString, ToString share a layout
  size_t struct_size;
  ExtensionBase* extension_start;
  DeviceDescription* description;
  const char* value;  // out, lives as long as the device
  size_t value_size;  // out
};

// --- executables ------------------------------------------------------------

struct ExecutableDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Executable* executable;
};
struct LoadedExecutableDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* executable;
};
struct LoadedExecutableGetExecutableArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* loaded_executable;
  Executable* executable;  // out, caller destroys
};
struct ExecutableNumOutputsArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Executable* executable;
  size_t num_outputs;  // out
};
// PJRT_Executable_GetCompiledMemoryStats (every API we accept has the slot;
// a plugin may answer UNIMPLEMENTED). peak_memory_in_bytes came later than
// the other fields: an older plugin leaves it 0.
struct ExecutableCompiledMemoryStatsArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Executable* executable;
  int64_t generated_code_size_in_bytes;  // out
  int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes;
  int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes;
  int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes;
  int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes;
};
struct ExecutableSerializeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Executable* executable;
  const char* serialized_bytes;  // out, lives until the deleter runs
  size_t serialized_bytes_size;  // out
  SerializedExecutable* serialized_executable;                   // out
  void (*serialized_executable_deleter)(SerializedExecutable*);  // out
};
struct ExecutableDeserializeAndLoadArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  LoadedExecutable* loaded_executable;  // out
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
};

struct ExecuteOptions {
  size_t struct_size;
  ExtensionBase* extension_start;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  void* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
};
struct LoadedExecutableExecuteArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* executable;
  ExecuteOptions* options;
  Buffer* const* const* argument_lists;  // [num_devices][num_args]
  size_t num_devices;
  size_t num_args;
  Buffer** const* output_lists;          // [num_devices][num_outputs], filled
  Event** device_complete_events;        // [num_devices] or null
  Device* execute_device;
};

// --- buffers ----------------------------------------------------------------

struct BufferArgs {  // Destroy, Delete share a layout
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
};
struct BufferElementTypeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  BufferType type;  // out
};
struct BufferDimensionsArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  const int64_t* dims;  // out, lives as long as the buffer
  size_t num_dims;      // out
};
struct BufferSizeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  size_t on_device_size_in_bytes;  // out
};
struct BufferIsDeletedArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  bool is_deleted;  // out
};
struct BufferDeviceArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  Device* device;  // out
};
struct BufferToHostArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* src;
  void* host_layout;
  void* dst;        // null: query the size into dst_size
  size_t dst_size;
  Event* event;     // out
};
struct BufferReadyEventArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  Event* event;  // out
};
struct BufferCopyToDeviceArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  Device* dst_device;
  Buffer* dst_buffer;  // out
};

// --- device memory statistics (PJRT_Device_MemoryStats) ---------------------
// Every plugin from 0.57 on has the slot; whether it answers is the plugin's
// choice (a plugin may report UNIMPLEMENTED). Only bytes_in_use is always set.

struct DeviceMemoryStatsArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Device* device;
  int64_t bytes_in_use;  // out
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
};

// --- the function table -----------------------------------------------------

template <class A> using Fn = Error* (*)(A*);
using Unused = void*;

struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion pjrt_api_version;

  void (*PJRT_Error_Destroy)(ErrorDestroyArgs*);
  void (*PJRT_Error_Message)(ErrorMessageArgs*);
  Fn<ErrorGetCodeArgs> PJRT_Error_GetCode;

  Fn<PluginInitializeArgs> PJRT_Plugin_Initialize;
  Fn<PluginAttributesArgs> PJRT_Plugin_Attributes;

  Fn<EventDestroyArgs> PJRT_Event_Destroy;
  Fn<EventIsReadyArgs> PJRT_Event_IsReady;
  Unused PJRT_Event_Error;
  Fn<EventAwaitArgs> PJRT_Event_Await;
  Fn<EventOnReadyArgs> PJRT_Event_OnReady;

  Fn<ClientCreateArgs> PJRT_Client_Create;
  Fn<ClientDestroyArgs> PJRT_Client_Destroy;
  Fn<ClientStringArgs> PJRT_Client_PlatformName;
  Fn<ClientProcessIndexArgs> PJRT_Client_ProcessIndex;
  Fn<ClientStringArgs> PJRT_Client_PlatformVersion;
  Fn<ClientDevicesArgs> PJRT_Client_Devices;
  Fn<ClientDevicesArgs> PJRT_Client_AddressableDevices;
  Unused PJRT_Client_LookupDevice;
  Unused PJRT_Client_LookupAddressableDevice;
  Unused PJRT_Client_AddressableMemories;
  Fn<ClientCompileArgs> PJRT_Client_Compile;
  Unused PJRT_Client_DefaultDeviceAssignment;
  Fn<ClientBufferFromHostArgs> PJRT_Client_BufferFromHostBuffer;

  Fn<DescriptionIntArgs> PJRT_DeviceDescription_Id;
  Fn<DescriptionIntArgs> PJRT_DeviceDescription_ProcessIndex;
  Unused PJRT_DeviceDescription_Attributes;
  Fn<DescriptionStringArgs> PJRT_DeviceDescription_Kind;
  Fn<DescriptionStringArgs> PJRT_DeviceDescription_DebugString;
  Fn<DescriptionStringArgs> PJRT_DeviceDescription_ToString;

  Fn<DeviceGetDescriptionArgs> PJRT_Device_GetDescription;
  Fn<DeviceIsAddressableArgs> PJRT_Device_IsAddressable;
  Fn<DeviceLocalHardwareIdArgs> PJRT_Device_LocalHardwareId;
  Unused PJRT_Device_AddressableMemories;
  Unused PJRT_Device_DefaultMemory;
  Fn<DeviceMemoryStatsArgs> PJRT_Device_MemoryStats;

  Unused PJRT_Memory_Id;
  Unused PJRT_Memory_Kind;
  Unused PJRT_Memory_DebugString;
  Unused PJRT_Memory_ToString;
  Unused PJRT_Memory_AddressableByDevices;

  Fn<ExecutableDestroyArgs> PJRT_Executable_Destroy;
  Unused PJRT_Executable_Name;
  Unused PJRT_Executable_NumReplicas;
  Unused PJRT_Executable_NumPartitions;
  Fn<ExecutableNumOutputsArgs> PJRT_Executable_NumOutputs;
  Unused PJRT_Executable_SizeOfGeneratedCodeInBytes;
  Unused PJRT_Executable_GetCostAnalysis;
  Unused PJRT_Executable_OutputMemoryKinds;
  Unused PJRT_Executable_OptimizedProgram;
  Fn<ExecutableSerializeArgs> PJRT_Executable_Serialize;

  Fn<LoadedExecutableDestroyArgs> PJRT_LoadedExecutable_Destroy;
  Fn<LoadedExecutableGetExecutableArgs> PJRT_LoadedExecutable_GetExecutable;
  Unused PJRT_LoadedExecutable_AddressableDevices;
  Unused PJRT_LoadedExecutable_Delete;
  Unused PJRT_LoadedExecutable_IsDeleted;
  Fn<LoadedExecutableExecuteArgs> PJRT_LoadedExecutable_Execute;
  Fn<ExecutableDeserializeAndLoadArgs> PJRT_Executable_DeserializeAndLoad;
  Unused PJRT_LoadedExecutable_Fingerprint;

  Fn<BufferArgs> PJRT_Buffer_Destroy;
  Fn<BufferElementTypeArgs> PJRT_Buffer_ElementType;
  Fn<BufferDimensionsArgs> PJRT_Buffer_Dimensions;
  Unused PJRT_Buffer_UnpaddedDimensions;
  Unused PJRT_Buffer_DynamicDimensionIndices;
  Unused PJRT_Buffer_GetMemoryLayout;
  Fn<BufferSizeArgs> PJRT_Buffer_OnDeviceSizeInBytes;
  Fn<BufferDeviceArgs> PJRT_Buffer_Device;
  Unused PJRT_Buffer_Memory;
  Fn<BufferArgs> PJRT_Buffer_Delete;
  Fn<BufferIsDeletedArgs> PJRT_Buffer_IsDeleted;
  Fn<BufferCopyToDeviceArgs> PJRT_Buffer_CopyToDevice;
  Fn<BufferToHostArgs> PJRT_Buffer_ToHostBuffer;
  Unused PJRT_Buffer_IsOnCpu;
  Fn<BufferReadyEventArgs> PJRT_Buffer_ReadyEvent;
  // Slots 73-95 (buffer pointers, copy streams, topology, ...): not called.
  Unused slot_73;
  Unused slot_74;
  Unused slot_75;
  Unused slot_76;
  Unused slot_77;
  Unused slot_78;
  Unused slot_79;
  Unused slot_80;
  Unused slot_81;
  Unused slot_82;
  Unused slot_83;
  Unused slot_84;
  Unused slot_85;
  Unused slot_86;
  Unused slot_87;
  Unused slot_88;
  Unused slot_89;
  Unused slot_90;
  Unused slot_91;
  Unused slot_92;
  Unused slot_93;
  Unused slot_94;
  Unused slot_95;
  Fn<ExecutableCompiledMemoryStatsArgs> PJRT_Executable_GetCompiledMemoryStats;
  // Later entries are not called by torch-pjrt; the table is longer.
};

// Offsets in the function table: the first entry follows the version struct,
// then one pointer per entry in declaration order.
inline constexpr size_t kFirstFn = 40;
#define TPJ_CHECK_SLOT(name, index) \
  static_assert(offsetof(Api, name) == kFirstFn + 8 * (index), #name " offset")
TPJ_CHECK_SLOT(PJRT_Error_Destroy, 0);
TPJ_CHECK_SLOT(PJRT_Plugin_Initialize, 3);
TPJ_CHECK_SLOT(PJRT_Event_Destroy, 5);
TPJ_CHECK_SLOT(PJRT_Client_Create, 10);
TPJ_CHECK_SLOT(PJRT_Client_BufferFromHostBuffer, 22);
TPJ_CHECK_SLOT(PJRT_DeviceDescription_Id, 23);
TPJ_CHECK_SLOT(PJRT_Device_GetDescription, 29);
TPJ_CHECK_SLOT(PJRT_Executable_Destroy, 40);
TPJ_CHECK_SLOT(PJRT_LoadedExecutable_Destroy, 50);
TPJ_CHECK_SLOT(PJRT_LoadedExecutable_Execute, 55);
TPJ_CHECK_SLOT(PJRT_Buffer_Destroy, 58);
TPJ_CHECK_SLOT(PJRT_Buffer_ReadyEvent, 72);
TPJ_CHECK_SLOT(PJRT_Executable_GetCompiledMemoryStats, 96);
#undef TPJ_CHECK_SLOT

// The PJRT size of each args struct: offsetof(last) + sizeof(last), which may be
// smaller than sizeof() because of tail padding. make<T>() uses it.
template <class T> struct ArgsSize;
#define TPJ_ARGS_SIZE(type, last) \
  template <> struct ArgsSize<type> { static constexpr size_t value = TPJ_STRUCT_SIZE(type, last); }
TPJ_ARGS_SIZE(NamedValue, value_size);
TPJ_ARGS_SIZE(ErrorDestroyArgs, error);
TPJ_ARGS_SIZE(ErrorMessageArgs, message_size);
TPJ_ARGS_SIZE(ErrorGetCodeArgs, code);
TPJ_ARGS_SIZE(PluginInitializeArgs, extension_start);
TPJ_ARGS_SIZE(PluginAttributesArgs, num_attributes);
TPJ_ARGS_SIZE(EventDestroyArgs, event);
TPJ_ARGS_SIZE(EventIsReadyArgs, is_ready);
TPJ_ARGS_SIZE(EventAwaitArgs, event);
TPJ_ARGS_SIZE(EventOnReadyArgs, user_arg);
TPJ_ARGS_SIZE(KeyValueGetArgs, value_deleter);
TPJ_ARGS_SIZE(KeyValuePutArgs, user_arg);
TPJ_ARGS_SIZE(ClientCreateArgs, kv_try_get_user_arg);
TPJ_ARGS_SIZE(ClientDestroyArgs, client);
TPJ_ARGS_SIZE(ClientStringArgs, value_size);
TPJ_ARGS_SIZE(ClientProcessIndexArgs, process_index);
TPJ_ARGS_SIZE(ClientDevicesArgs, num_devices);
TPJ_ARGS_SIZE(Program, format_size);
TPJ_ARGS_SIZE(ClientCompileArgs, executable);
TPJ_ARGS_SIZE(ClientBufferFromHostArgs, buffer);
TPJ_ARGS_SIZE(DeviceGetDescriptionArgs, description);
TPJ_ARGS_SIZE(DeviceLocalHardwareIdArgs, local_hardware_id);
TPJ_ARGS_SIZE(DeviceIsAddressableArgs, is_addressable);
TPJ_ARGS_SIZE(DeviceMemoryStatsArgs, peak_pool_bytes_is_set);
TPJ_ARGS_SIZE(DescriptionIntArgs, value);
TPJ_ARGS_SIZE(DescriptionStringArgs, value_size);
TPJ_ARGS_SIZE(ExecutableDestroyArgs, executable);
TPJ_ARGS_SIZE(LoadedExecutableDestroyArgs, executable);
TPJ_ARGS_SIZE(LoadedExecutableGetExecutableArgs, executable);
TPJ_ARGS_SIZE(ExecutableNumOutputsArgs, num_outputs);
TPJ_ARGS_SIZE(ExecutableSerializeArgs, serialized_executable_deleter);
TPJ_ARGS_SIZE(ExecutableCompiledMemoryStatsArgs, peak_memory_in_bytes);
TPJ_ARGS_SIZE(ExecutableDeserializeAndLoadArgs, overridden_serialized_compile_options_size);
TPJ_ARGS_SIZE(ExecuteOptions, incarnation_ids);
TPJ_ARGS_SIZE(LoadedExecutableExecuteArgs, execute_device);
TPJ_ARGS_SIZE(BufferArgs, buffer);
TPJ_ARGS_SIZE(BufferElementTypeArgs, type);
TPJ_ARGS_SIZE(BufferDimensionsArgs, num_dims);
TPJ_ARGS_SIZE(BufferSizeArgs, on_device_size_in_bytes);
TPJ_ARGS_SIZE(BufferIsDeletedArgs, is_deleted);
TPJ_ARGS_SIZE(BufferDeviceArgs, device);
TPJ_ARGS_SIZE(BufferToHostArgs, event);
TPJ_ARGS_SIZE(BufferReadyEventArgs, event);
TPJ_ARGS_SIZE(BufferCopyToDeviceArgs, dst_buffer);
#undef TPJ_ARGS_SIZE

// A zeroed args struct with struct_size set: the one way we fill args.
template <class T> T make() {
  T t{};
  t.struct_size = ArgsSize<T>::value;
  return t;
}

// Layouts we rely on (LP64), checked against the published sizes.
static_assert(sizeof(ApiVersion) == 24);
static_assert(offsetof(NamedValue, type) == 32 && offsetof(NamedValue, int64_value) == 40);
static_assert(ArgsSize<NamedValue>::value == 56);
static_assert(ArgsSize<ClientCreateArgs>::value == 88 && offsetof(ClientCreateArgs, client) == 64);
static_assert(ArgsSize<Program>::value == 48);
static_assert(ArgsSize<ClientCompileArgs>::value == 56);
static_assert(offsetof(ClientBufferFromHostArgs, host_buffer_semantics) == 72);
static_assert(ArgsSize<ClientBufferFromHostArgs>::value == 120);
static_assert(ArgsSize<ExecuteOptions>::value == 112);
static_assert(ArgsSize<LoadedExecutableExecuteArgs>::value == 80);
static_assert(ArgsSize<ExecutableSerializeArgs>::value == 56);
static_assert(ArgsSize<ExecutableDeserializeAndLoadArgs>::value == 64);
static_assert(ArgsSize<BufferToHostArgs>::value == 56);
static_assert(ArgsSize<DeviceIsAddressableArgs>::value == 25);
static_assert(ArgsSize<DeviceMemoryStatsArgs>::value == 185);
static_assert(ArgsSize<EventIsReadyArgs>::value == 25);
static_assert(ArgsSize<ExecutableCompiledMemoryStatsArgs>::value == 112);

}  // namespace pjrt_abi
