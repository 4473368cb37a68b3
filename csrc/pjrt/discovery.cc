#include "pjrt/discovery.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "pjrt/error.h"

namespace tpj::pjrt {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::string>& Registry() {
  static std::map<std::string, std::string> r;
  return r;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

// Patterns relative to a site-packages directory, best first.
std::vector<std::string> Patterns(const std::string& device) {
  if (device == "CPU") return {"xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so", "xla_plugins/xla_cpu*/*.so"};
  if (device == "CUDA" || device == "GPU") {
    return {"jax_plugins/xla_cuda13/xla_cuda_plugin.so", "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "xla_plugins/xla_cuda*/*.so", "jax_plugins/xla_cuda*/*.so"};
  }
  if (device == "ROCM") return {"jax_plugins/xla_rocm*/*.so", "xla_plugins/xla_rocm*/*.so"};
  if (device == "TPU") return {"libtpu/libtpu.so"};
  const std::string l = Lower(device);
  return {"xla_plugins/*" + l + "*/*.so", "jax_plugins/*" + l + "*/*.so"};
}

}  // namespace

void RegisterPlugin(const std::string& name, const std::string& path) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[Upper(name)] = path;
}

std::string PackageHint(const std::string& device) {
  const std::string d = Upper(device);
  if (d == "CPU") return "pip install xla-cpu-pjrt";
  if (d == "CUDA" || d == "GPU") return "pip install jax-cuda13-pjrt (or jax-cuda12-pjrt)";
  if (d == "ROCM") return "pip install jax-rocm-pjrt";
  if (d == "TPU") return "pip install libtpu";
  return "install the vendor's PJRT plugin, or call torch_pjrt.register_plugin('" + device +
         "', path)";
}

PluginChoice FindPlugin(const std::string& device, const std::vector<std::string>& search_dirs) {
  return FindPlugin(PluginRequest{"", device, "argument", search_dirs});
}

PluginChoice FindPlugin(const PluginRequest& request) {
  if (!request.path.empty()) {
    return {request.path, Upper(request.device.empty() ? "CUSTOM" : request.device), request.how};
  }
  std::string device = request.device.empty() ? "CPU" : request.device;
  const std::string how = request.device.empty() ? "default" : request.how;
  device = Upper(device);
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    if (auto it = Registry().find(device); it != Registry().end()) {
      return {it->second, device, "registered"};
    }
  }
  const std::vector<std::string>& dirs = request.search_dirs;
  for (const auto& pattern : Patterns(device)) {
    for (const auto& dir : dirs) {
      for (const auto& hit : Glob(dir + "/" + pattern)) {
        if (IsFile(hit)) return {hit, device, how + ", found in " + dir};
      }
    }
  }
  std::string where;
  for (const auto& d : dirs) where += (where.empty() ? "" : ", ") + d;
  throw Error(Code::kNotFound,
              "no PJRT plugin for device '" + device + "' is installed (looked in: " +
              (where.empty() ? "no directories" : where) + "). " + PackageHint(device) +
              ", or set TORCH_PJRT_PLUGIN=/path/to/plugin.so.");
}

}  // namespace tpj::pjrt
