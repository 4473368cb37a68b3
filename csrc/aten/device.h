// The pjrt device as PyTorch sees it: PrivateUse1 guard (current device per
// thread), hooks, and the allocator registration.
#pragma once

namespace tpj::aten {

int CurrentDevice();
void SetCurrentDevice(int device);
// IndexError (Runtime::DeviceIndexError's message) for an index this process does not have.
void CheckDeviceIndex(int device);
int DeviceCount();  // addressable devices of the plugin (initializes the runtime)

}  // namespace tpj::aten
