// The one place that turns the environment into options. Every variable the
// project reads is in EnvironmentVariables() (docs/environment.md is checked
// against it by a test); C++ reads them through Options::FromEnvironment(),
// Python through torch_pjrt._C._options(). Nothing else calls getenv.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pjrt/client.h"
#include "pjrt/discovery.h"

namespace tpj::runtime {

enum class FallbackMode { kAllow, kWarn, kError };

struct Options {
  // Plugin choice.
  std::string device;                    // PJRT_DEVICE, upper case; "" = not set (CPU)
  std::string plugin;                    // TORCH_PJRT_PLUGIN; "" = discover
  std::vector<std::string> search_path;  // TORCH_PJRT_SEARCH_PATH (':'-separated)
  std::optional<int64_t> cpu_device_count;  // CPU_NUM_DEVICES; unset = the plugin's default
  // Caches and diagnostics.
  std::string cache_dir;  // TORCH_PJRT_CACHE_DIR; "" = memory cache only
  std::string dump_dir;   // TORCH_PJRT_DUMP_DIR; "" = no program dumps
  bool debug = false;     // TORCH_PJRT_DEBUG (anything but "" and "0")
  FallbackMode fallback = FallbackMode::kAllow;  // TORCH_PJRT_FALLBACK
  bool checks = true;                            // TORCH_PJRT_CHECKS ("0" turns index/divisor checks off)
  bool autograd_threads = false;                 // TORCH_PJRT_AUTOGRAD_THREADS ("1" keeps autograd's device threads)
  double dist_timeout_s = 60;                    // TORCH_PJRT_DIST_TIMEOUT
  bool gpu_preallocate = false;                  // TORCH_PJRT_GPU_PREALLOCATE ("1": the GPU plugin's preallocation)
  // A compile still running after this many seconds is reported on stderr,
  // and again when it ends (TORCH_PJRT_COMPILE_PROGRESS, default 5); only
  // when TORCH_PJRT_DEBUG is on or TORCH_PJRT_LOG_LEVEL is info: else < 0, never.
  double compile_progress_s = -1;
  // Topology, as torchrun and torch_pjrt.launch set it.
  int64_t rank = 0;              // RANK
  int64_t world_size = 1;        // WORLD_SIZE: processes in the job
  int64_t local_rank = 0;        // LOCAL_RANK
  int64_t local_world_size = 1;  // LOCAL_WORLD_SIZE
  int64_t group_rank = 0;        // GROUP_RANK: index of this host
  std::string master_addr;       // MASTER_ADDR
  std::string master_port;       // MASTER_PORT
  bool torchrun = false;         // TORCHELASTIC_RUN_ID is set: torchrun started this process
  // The PJRT plugin's own log lines: 0 info, 1 warning, 2 error, 3 fatal only
  // (TORCH_PJRT_LOG_LEVEL; default warning, so its informational lines are hidden).
  int plugin_log_level = 1;
  // XLA_FLAGS: the plugin parses it itself (once per process); we only key
  // the disk compile cache on it.
  std::string xla_flags;

  // Reads every variable now. A malformed value throws pjrt::Error
  // (kInvalidArgument) naming the variable, the value and the fix.
  static Options FromEnvironment();
};

struct EnvironmentVariable {
  const char* name;
  const char* meaning;
  const char* default_value;  // as the user would read it
};

// Every environment variable the project reads, Python included.
const std::vector<EnvironmentVariable>& EnvironmentVariables();

// The plugin the options ask for (`device` overrides PJRT_DEVICE when given;
// `search_dirs` are searched when TORCH_PJRT_SEARCH_PATH is unset).
pjrt::PluginChoice ChoosePlugin(const Options& o, const std::string& device,
                                const std::vector<std::string>& search_dirs);

// Every variable of EnvironmentVariables() that is set, and its value, as
// read now (python -m torch_pjrt doctor shows them).
std::vector<std::pair<std::string, std::string>> EnvironmentValues();

// Makes the plugin log at TORCH_PJRT_LOG_LEVEL through its own control,
// TF_CPP_MIN_LOG_LEVEL (XLA's plugins read it when they first log), unless
// the user set that variable: call before loading a plugin. Never touches
// stderr, so the plugin's errors and crash messages still reach the user.
// Throws pjrt::Error naming TORCH_PJRT_LOG_LEVEL when it is malformed.
void ApplyPluginLogLevel();

// Client-creation options for `choice` implied by `o`: CPU_NUM_DEVICES for
// the CPU plugin; one visible device per process for GPU plugins in a
// multi-process job.
std::vector<pjrt::NamedOption> ClientOptions(const Options& o, const pjrt::PluginChoice& choice);

}  // namespace tpj::runtime
