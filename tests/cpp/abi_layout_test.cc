// Our own PJRT ABI declarations (csrc/pjrt/c_api.h) against the header the
// installed plugin wheel publishes: every offset and size we rely on must
// agree. Built only when the wheel ships its header.
#include <gtest/gtest.h>

#include TPJ_REFERENCE_HEADER
#include "pjrt/c_api.h"

namespace {

#define SAME_OFFSET(ours, theirs, field_ours, field_theirs) \
  EXPECT_EQ(offsetof(pjrt_abi::ours, field_ours), offsetof(theirs, field_theirs)) << #ours "." #field_ours
#define SAME_SIZE(ours, theirs) \
  EXPECT_EQ(pjrt_abi::ArgsSize<pjrt_abi::ours>::value, size_t{theirs##_STRUCT_SIZE}) << #ours

TEST(AbiLayout, ApiTableSlots) {
#define SLOT(name) EXPECT_EQ(offsetof(pjrt_abi::Api, name), offsetof(PJRT_Api, name)) << #name
  SLOT(PJRT_Error_Destroy);
  SLOT(PJRT_Error_Message);
  SLOT(PJRT_Error_GetCode);
  SLOT(PJRT_Plugin_Initialize);
  SLOT(PJRT_Plugin_Attributes);
  SLOT(PJRT_Event_Destroy);
  SLOT(PJRT_Event_IsReady);
  SLOT(PJRT_Event_Await);
  SLOT(PJRT_Event_OnReady);
  SLOT(PJRT_Client_Create);
  SLOT(PJRT_Client_Destroy);
  SLOT(PJRT_Client_PlatformName);
  SLOT(PJRT_Client_ProcessIndex);
  SLOT(PJRT_Client_PlatformVersion);
  SLOT(PJRT_Client_Devices);
  SLOT(PJRT_Client_AddressableDevices);
  SLOT(PJRT_Client_Compile);
  SLOT(PJRT_Client_BufferFromHostBuffer);
  SLOT(PJRT_DeviceDescription_Id);
  SLOT(PJRT_DeviceDescription_ProcessIndex);
  SLOT(PJRT_DeviceDescription_Kind);
  SLOT(PJRT_DeviceDescription_DebugString);
  SLOT(PJRT_Device_GetDescription);
  SLOT(PJRT_Device_IsAddressable);
  SLOT(PJRT_Device_LocalHardwareId);
  SLOT(PJRT_Device_MemoryStats);
  SLOT(PJRT_Executable_Destroy);
  SLOT(PJRT_Executable_NumOutputs);
  SLOT(PJRT_Executable_Serialize);
  SLOT(PJRT_LoadedExecutable_Destroy);
  SLOT(PJRT_LoadedExecutable_GetExecutable);
  SLOT(PJRT_LoadedExecutable_Execute);
  SLOT(PJRT_Executable_DeserializeAndLoad);
  SLOT(PJRT_Buffer_Destroy);
  SLOT(PJRT_Buffer_ElementType);
  SLOT(PJRT_Buffer_Dimensions);
  SLOT(PJRT_Buffer_OnDeviceSizeInBytes);
  SLOT(PJRT_Buffer_Device);
  SLOT(PJRT_Buffer_Delete);
  SLOT(PJRT_Buffer_IsDeleted);
  SLOT(PJRT_Buffer_CopyToDevice);
  SLOT(PJRT_Buffer_ToHostBuffer);
  SLOT(PJRT_Buffer_ReadyEvent);
  SLOT(PJRT_Executable_GetCompiledMemoryStats);
#undef SLOT
}

TEST(AbiLayout, ArgsStructSizesAndKeyOffsets) {
  SAME_SIZE(NamedValue, PJRT_NamedValue);
  SAME_SIZE(ErrorMessageArgs, PJRT_Error_Message_Args);
  SAME_SIZE(PluginAttributesArgs, PJRT_Plugin_Attributes_Args);
  SAME_SIZE(EventAwaitArgs, PJRT_Event_Await_Args);
  SAME_SIZE(EventOnReadyArgs, PJRT_Event_OnReady_Args);
  SAME_SIZE(ClientCreateArgs, PJRT_Client_Create_Args);
  SAME_SIZE(ClientStringArgs, PJRT_Client_PlatformName_Args);
  SAME_SIZE(ClientDevicesArgs, PJRT_Client_Devices_Args);
  SAME_SIZE(Program, PJRT_Program);
  SAME_SIZE(ClientCompileArgs, PJRT_Client_Compile_Args);
  SAME_SIZE(ClientBufferFromHostArgs, PJRT_Client_BufferFromHostBuffer_Args);
  SAME_SIZE(DeviceGetDescriptionArgs, PJRT_Device_GetDescription_Args);
  SAME_SIZE(DeviceIsAddressableArgs, PJRT_Device_IsAddressable_Args);
  SAME_SIZE(DeviceLocalHardwareIdArgs, PJRT_Device_LocalHardwareId_Args);
  SAME_SIZE(DeviceMemoryStatsArgs, PJRT_Device_MemoryStats_Args);
  SAME_OFFSET(DeviceMemoryStatsArgs, PJRT_Device_MemoryStats_Args, bytes_in_use, bytes_in_use);
  SAME_OFFSET(DeviceMemoryStatsArgs, PJRT_Device_MemoryStats_Args, bytes_limit, bytes_limit);
  SAME_OFFSET(DeviceMemoryStatsArgs, PJRT_Device_MemoryStats_Args, peak_pool_bytes, peak_pool_bytes);
  SAME_SIZE(ExecutableCompiledMemoryStatsArgs, PJRT_Executable_GetCompiledMemoryStats_Args);
  SAME_OFFSET(ExecutableCompiledMemoryStatsArgs, PJRT_Executable_GetCompiledMemoryStats_Args, temp_size_in_bytes,
              temp_size_in_bytes);
  SAME_OFFSET(ExecutableCompiledMemoryStatsArgs, PJRT_Executable_GetCompiledMemoryStats_Args,
              host_temp_size_in_bytes, host_temp_size_in_bytes);
  SAME_SIZE(DescriptionIntArgs, PJRT_DeviceDescription_Id_Args);
  SAME_SIZE(DescriptionStringArgs, PJRT_DeviceDescription_Kind_Args);
  SAME_SIZE(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args);
  SAME_SIZE(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args);
  SAME_SIZE(ExecuteOptions, PJRT_ExecuteOptions);
  SAME_SIZE(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args);
  SAME_SIZE(BufferToHostArgs, PJRT_Buffer_ToHostBuffer_Args);
  SAME_SIZE(BufferCopyToDeviceArgs, PJRT_Buffer_CopyToDevice_Args);
  SAME_OFFSET(ClientCreateArgs, PJRT_Client_Create_Args, client, client);
  SAME_OFFSET(ClientBufferFromHostArgs, PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics,
              host_buffer_semantics);
  SAME_OFFSET(ClientBufferFromHostArgs, PJRT_Client_BufferFromHostBuffer_Args, done_with_host_buffer,
              done_with_host_buffer);
  SAME_OFFSET(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, device_complete_events,
              device_complete_events);
  SAME_OFFSET(ExecuteOptions, PJRT_ExecuteOptions, launch_id, launch_id);
  SAME_OFFSET(NamedValue, PJRT_NamedValue, value_size, value_size);
}

}  // namespace
