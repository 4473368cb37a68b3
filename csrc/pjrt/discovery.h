// Which PJRT plugin to load.
//
// Order: TORCH_PJRT_PLUGIN=/path/to/plugin.so wins; else the device name
// (argument, or PJRT_DEVICE, else "CPU") picks a plugin registered under that
// name, or one installed in a search directory (site-packages layouts
// xla_plugins/*, jax_plugins/*, libtpu). A missing plugin is an Error that
// names the package to install.
#pragma once

#include <string>
#include <vector>

namespace tpj::pjrt {

struct PluginChoice {
  std::string path;    // the .so to load
  std::string device;  // upper-case device name it was chosen for ("CPU")
  std::string reason;  // how it was chosen, for `info` and debug logs
};

// Registers `path` as the plugin for device `name` (case-insensitive) in this
// process. Later registrations replace earlier ones.
void RegisterPlugin(const std::string& name, const std::string& path);

// `device` empty: read PJRT_DEVICE. `search_dirs` empty: read
// TORCH_PJRT_SEARCH_PATH (':'-separated).
PluginChoice FindPlugin(const std::string& device, const std::vector<std::string>& search_dirs);

// The pip package that provides the plugin for `device`, for error messages.
std::string PackageHint(const std::string& device);

}  // namespace tpj::pjrt
