// Which PJRT plugin to load.
//
// Order: an explicit plugin path wins; else the device name ("CPU" when
// empty) picks a plugin registered under that name, or one installed in a
// search directory (site-packages layouts xla_plugins/*, jax_plugins/*,
// libtpu, and the CPU builds of lammps-jax-pjrt-cpu and
// fastatomstruct-xla-cpu). When several plugins for the device are installed,
// the one with the newest PJRT API wins (ties: the earlier layout in
// KnownLayouts order); the API versions are read in a child process, so this
// process loads only the plugin it uses. A missing plugin is an Error that
// names the package to install.
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

// One installed plugin library found for a device.
struct PluginCandidate {
  std::string path;     // the .so
  std::string package;  // pip package of its layout ("xla-cpu-pjrt"); "" for a generic layout
  int api_major = -1;   // PJRT API version the library reports; -1 = not read
  int api_minor = -1;
  std::string problem;  // why the library cannot be used ("" = none known)
};

// Every plugin for `device` installed in `search_dirs`, in layout order
// (search_dirs order within a layout), each library once.
std::vector<PluginCandidate> ListPlugins(const std::string& device, const std::vector<std::string>& search_dirs);

// Reads each candidate's PJRT API version in a forked child (dlopen +
// GetPjrtApi, nothing else); results are remembered per path. A library that
// does not load gets `problem` set instead.
void ProbeApiVersions(std::vector<PluginCandidate>& candidates);

// The rule: the candidate with the newest PJRT API this build accepts (major
// 0, minor >= kMinorSupported); ties go to the earlier one. -1 when none
// qualifies. Pure: tests give it recorded versions.
int PickNewestApi(const std::vector<PluginCandidate>& candidates);

// The device a plugin file is for when its path ends in a known layout
// ("CPU" for the three CPU builds); "" when unknown.
std::string DeviceOfKnownLayout(const std::string& path);
PluginChoice FindPlugin(const std::string& device, const std::vector<std::string>& search_dirs);

// The pip package that provides the plugin for `device`, for error messages.
std::string PackageHint(const std::string& device);

}  // namespace tpj::pjrt
