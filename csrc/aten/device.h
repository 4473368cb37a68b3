// The pjrt device as PyTorch sees it: PrivateUse1 guard (current device per
// thread), hooks, and the allocator registration.
#pragma once

namespace tpj::aten {

int CurrentDevice();
void SetCurrentDevice(int device);
// IndexError (Runtime::DeviceIndexError's message) for an index this process does not have.
void CheckDeviceIndex(int device);
int DeviceCount();  // addressable devices of the plugin (initializes the runtime)

// Run at interpreter exit, before finalization, with the GIL released. With
// TORCH_PJRT_AUTOGRAD_THREADS=1 (or multithreading enabled again on the
// exiting thread) autograd's per-device threads run pjrt backward passes,
// and such a thread drops its last reference to a finished
// pass after waking the caller: a reference to a Python object (the
// context torch stashes per backward), whose release needs the GIL. Past
// finalization's start that thread exits instead, inside a noexcept
// destructor: std::terminate, "terminate called without an active
// exception" (the same holds for CUDA's device threads). A C++-only backward
// of an empty tensor, queued behind on each device's thread, returns once
// that thread has finished everything before it. Does nothing otherwise
// (backward passes ran on their callers).
void DrainAutogradThreads();

}  // namespace tpj::aten
