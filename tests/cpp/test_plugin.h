// Shared fixtures for tests that run against a real PJRT plugin.
#pragma once

#include <memory>
#include <string>

#include "pjrt/client.h"
#include "pjrt/plugin.h"

namespace tpj::testing {

// The plugin under test: TORCH_PJRT_PLUGIN, else discovery over the build's
// site-packages (PJRT_DEVICE picks the kind; CPU by default).
std::string PluginPath();

// One client per test binary, with 4 devices on the CPU plugin.
std::shared_ptr<pjrt::Client> SharedClient();

}  // namespace tpj::testing
