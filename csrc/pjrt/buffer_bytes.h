// Bytes of the live buffers this process holds on a device (global id),
// counted from PJRT_Buffer_OnDeviceSizeInBytes when each pjrt::Buffer is
// made, and the most it held since the last ResetPeakBufferBytes: memory
// statistics for plugins that report none (the XLA CPU plugins). A donated
// buffer counts until its handle is dropped.
#pragma once

#include <cstdint>

namespace tpj::pjrt {

struct BufferBytes {
  int64_t in_use = 0;
  int64_t peak = 0;
  int64_t buffers = 0;
};
BufferBytes LiveBufferBytes(int device_id);
void ResetPeakBufferBytes(int device_id);

}  // namespace tpj::pjrt
