// Which PJRT plugin to load.
//
// Order: an explicit plugin path wins; else the device name ("CPU" when
// empty) picks a plugin registered under that name, or one installed in a
// search directory (site-packages layouts xla_plugins/*, jax_plugins/*,
// libtpu). A missing plugin is an Error that names the package to install.
// This layer reads no environment: runtime/options.h maps PJRT_DEVICE,
// TORCH_PJRT_PLUGIN and TORCH_PJRT_SEARCH_PATH onto a PluginRequest.
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

struct PluginRequest {
  std::string path;                      // an explicit plugin file; wins when set
  std::string device;                    // device name, any case; "" = "CPU"
  std::string how = "argument";          // how `device` was named, for PluginChoice::reason
  std::vector<std::string> search_dirs;  // where installed plugins are looked for
};

PluginChoice FindPlugin(const PluginRequest& request);
PluginChoice FindPlugin(const std::string& device, const std::vector<std::string>& search_dirs);

// The pip package that provides the plugin for `device`, for error messages.
std::string PackageHint(const std::string& device);

}  // namespace tpj::pjrt
