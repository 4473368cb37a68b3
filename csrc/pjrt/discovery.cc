#include "pjrt/discovery.h"

#include <dlfcn.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cctype>
#include <map>
#include <mutex>

#include "pjrt/c_api.h"
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

struct Layout {
  std::string pattern;  // relative to a site-packages directory
  std::string package;  // pip package that installs it; "" = generic
};

// Layouts per device, in the order ties are broken.
std::vector<Layout> Layouts(const std::string& device) {
  if (device == "CPU") {
    return {{"xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so", "xla-cpu-pjrt"},
            {"lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so", "lammps-jax-pjrt-cpu"},
            {"fastatomstruct_xla_cpu/libpjrt_cpu.so", "fastatomstruct-xla-cpu"},
            {"xla_plugins/xla_cpu*/*.so", ""}};
  }
  if (device == "CUDA" || device == "GPU") {
    return {{"jax_plugins/xla_cuda13/xla_cuda_plugin.so", "jax-cuda13-pjrt"},
            {"jax_plugins/xla_cuda12/xla_cuda_plugin.so", "jax-cuda12-pjrt"},
            {"xla_plugins/xla_cuda*/*.so", ""},
            {"jax_plugins/xla_cuda*/*.so", ""}};
  }
  if (device == "ROCM") return {{"jax_plugins/xla_rocm*/*.so", ""}, {"xla_plugins/xla_rocm*/*.so", ""}};
  if (device == "TPU") return {{"libtpu/libtpu.so", "libtpu"}};
  const std::string l = Lower(device);
  return {{"xla_plugins/*" + l + "*/*.so", ""}, {"jax_plugins/*" + l + "*/*.so", ""}};
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// Version read from one library in a child process: {major, minor}, or a
// problem text. The child only dlopens and calls GetPjrtApi, then _exits.
struct Probe {
  int major = -1, minor = -1;
  std::string problem;
};

Probe ProbeInChild(const std::string& path) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, -1, "pipe() failed"};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {-1, -1, "fork() failed"};
  }
  if (pid == 0) {
    ::close(fds[0]);
    int out[2] = {-1, -1};
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      using GetApiFn = const pjrt_abi::Api* (*)();
      if (auto get = reinterpret_cast<GetApiFn>(::dlsym(h, "GetPjrtApi"))) {
        if (const pjrt_abi::Api* api = get()) {
          out[0] = api->pjrt_api_version.major_version;
          out[1] = api->pjrt_api_version.minor_version;
        }
      } else {
        out[0] = -2;  // loads, but is no PJRT plugin
      }
    }
    (void)!::write(fds[1], out, sizeof(out));
    ::_exit(0);
  }
  ::close(fds[1]);
  int got[2] = {-1, -1};
  size_t have = 0;
  pollfd pfd{fds[0], POLLIN, 0};
  // Loading a 270 MB plugin takes ~0.1 s; a minute covers a loaded machine.
  while (have < sizeof(got) && ::poll(&pfd, 1, 60000) > 0) {
    const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(got) + have, sizeof(got) - have);
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  if (have < sizeof(got)) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (have < sizeof(got)) return {-1, -1, "reading its PJRT API version failed (the child process did not answer)"};
  if (got[0] == -2) return {-1, -1, "not a PJRT plugin (no GetPjrtApi symbol)"};
  if (got[0] < 0) return {-1, -1, "cannot be loaded (dlopen failed)"};
  return {got[0], got[1], ""};
}

// The search directory `path` was found in.
std::string DirOf(const std::string& path, const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    if (path.compare(0, d.size() + 1, d + "/") == 0) return d;
  }
  return path;
}

std::mutex& ProbeMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, Probe>& ProbeCache() {
  static std::map<std::string, Probe> cache;
  return cache;
}

std::string VersionText(const PluginCandidate& c) {
  return std::to_string(c.api_major) + "." + std::to_string(c.api_minor);
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

std::vector<PluginCandidate> ListPlugins(const std::string& device_name, const std::vector<std::string>& dirs) {
  const std::string device = Upper(device_name.empty() ? "CPU" : device_name);
  std::vector<PluginCandidate> out;
  std::vector<std::string> seen;
  for (const Layout& layout : Layouts(device)) {
    for (const auto& dir : dirs) {
      for (const auto& hit : Glob(dir + "/" + layout.pattern)) {
        if (!IsFile(hit)) continue;
        const std::string real = RealPath(hit);
        if (std::find(seen.begin(), seen.end(), real) != seen.end()) continue;
        seen.push_back(real);
        PluginCandidate c;
        c.path = hit;
        c.package = layout.package;
        out.push_back(c);
      }
    }
  }
  return out;
}

void ProbeApiVersions(std::vector<PluginCandidate>& candidates) {
  for (PluginCandidate& c : candidates) {
    const std::string key = RealPath(c.path);
    Probe p;
    {
      std::lock_guard<std::mutex> lock(ProbeMutex());
      auto it = ProbeCache().find(key);
      if (it != ProbeCache().end()) {
        p = it->second;
      } else {
        p = ProbeInChild(c.path);
        ProbeCache()[key] = p;
      }
    }
    c.api_major = p.major;
    c.api_minor = p.minor;
    c.problem = p.problem;
    if (c.problem.empty() && (c.api_major != pjrt_abi::kMajor || c.api_minor < pjrt_abi::kMinorSupported)) {
      c.problem = "PJRT API " + VersionText(c) + " is older than torch-pjrt accepts (" +
                  std::to_string(pjrt_abi::kMajor) + "." + std::to_string(pjrt_abi::kMinorSupported) + ")";
    }
  }
}

int PickNewestApi(const std::vector<PluginCandidate>& candidates) {
  int best = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PluginCandidate& c = candidates[i];
    if (c.api_major != pjrt_abi::kMajor || c.api_minor < pjrt_abi::kMinorSupported) continue;
    if (best < 0 || c.api_minor > candidates[static_cast<size_t>(best)].api_minor) best = static_cast<int>(i);
  }
  return best;
}

std::string DeviceOfKnownLayout(const std::string& path) {
  for (const char* device : {"CPU", "CUDA", "TPU"}) {
    for (const Layout& layout : Layouts(device)) {
      const std::string& p = layout.pattern;
      if (p.find('*') != std::string::npos) continue;
      if (path.size() >= p.size() + 1 && path.compare(path.size() - p.size(), p.size(), p) == 0 &&
          path[path.size() - p.size() - 1] == '/') {
        return device;
      }
    }
  }
  return "";
}

PluginChoice FindPlugin(const std::string& device, const std::vector<std::string>& search_dirs) {
  return FindPlugin(PluginRequest{"", device, "argument", search_dirs});
}

PluginChoice FindPlugin(const PluginRequest& request) {
  if (!request.path.empty()) {
    // A file of a known layout is for its device: the CPU builds then get
    // CPU_NUM_DEVICES like a discovered CPU plugin.
    std::string device = Upper(request.device);
    if (device.empty()) device = DeviceOfKnownLayout(request.path);
    return {request.path, device.empty() ? "CUSTOM" : device, request.how};
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
  std::vector<PluginCandidate> found = ListPlugins(device, dirs);
  if (found.size() == 1) return {found[0].path, device, how + ", found in " + DirOf(found[0].path, dirs)};
  if (found.size() > 1) {
    ProbeApiVersions(found);
    const int best = PickNewestApi(found);
    if (best < 0) {  // none reads as usable: load the first, whose error then says why
      return {found[0].path, device, how + ", found in " + DirOf(found[0].path, dirs) +
                                         " (no installed plugin reported a usable PJRT API version)"};
    }
    const PluginCandidate& c = found[static_cast<size_t>(best)];
    return {c.path, device,
            how + ", newest PJRT API (" + VersionText(c) + ") of " + std::to_string(found.size()) +
                " installed " + device + " plugins, found in " + DirOf(c.path, dirs)};
  }
  std::string where;
  for (const auto& d : dirs) where += (where.empty() ? "" : ", ") + d;
  throw Error(Code::kNotFound,
              "no PJRT plugin for device '" + device + "' is installed (looked in: " +
              (where.empty() ? "no directories" : where) + "). " + PackageHint(device) +
              ", or set TORCH_PJRT_PLUGIN=/path/to/plugin.so.");
}

}  // namespace tpj::pjrt
