#include "runtime/options.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pjrt/error.h"

namespace tpj::runtime {
namespace {

std::string Get(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

[[noreturn]] void Invalid(const char* name, const std::string& value, const std::string& want) {
  throw pjrt::Error(pjrt::Code::kInvalidArgument, std::string(name) + " must be " + want + ", got '" + value +
                                                      "': fix or unset it");
}

// The number `name` holds, read whole by `parse` (stod or stoll), or none
// when unset; an error naming `want` unless it reads whole and is `ok`.
// Spaces around the number are ignored (as Python's int() and float()).
template <class T, class Parse, class Ok>
std::optional<T> Number(const char* name, Parse parse, Ok ok, const char* want) {
  const std::string v = Get(name);
  if (v.empty()) return std::nullopt;
  const char* space = " \t\n\r\f\v";
  const size_t first = v.find_first_not_of(space);
  const std::string number = first == std::string::npos ? "" : v.substr(first, v.find_last_not_of(space) - first + 1);
  size_t used = 0;
  T x{};
  try {
    x = parse(number, &used);
  } catch (...) {
    used = 0;
  }
  if (number.empty() || used != number.size() || !ok(x)) Invalid(name, v, want);
  return x;
}

// A number of seconds: positive, or also 0 when `zero_ok`.
std::optional<double> Seconds(const char* name, bool zero_ok) {
  return Number<double>(
      name, [](const std::string& v, size_t* used) { return std::stod(v, used); },
      [zero_ok](double x) { return (zero_ok ? x >= 0 : x > 0) && x <= 1e7; },  // finite, and a deadline fits a clock
      zero_ok ? "a number of seconds from 0 to 1e7" : "a positive number of seconds up to 1e7");
}

// An integer in [min, max]; `want` says so in the error.
std::optional<int64_t> IntIn(const char* name, int64_t min, int64_t max, const char* want) {
  return Number<int64_t>(
      name, [](const std::string& v, size_t* used) { return static_cast<int64_t>(std::stoll(v, used)); },
      [min, max](int64_t n) { return n >= min && n <= max; }, want);
}

std::optional<int64_t> Int(const char* name, int64_t min) {
  return IntIn(name, min, INT64_MAX, min > 0 ? "a positive integer" : "a non-negative integer");
}

int LogLevel() {
  const std::string v = Get("TORCH_PJRT_LOG_LEVEL");
  if (v.empty() || v == "warning") return 1;
  if (v == "info") return 0;
  if (v == "error") return 2;
  if (v == "fatal") return 3;
  Invalid("TORCH_PJRT_LOG_LEVEL", v, "one of info, warning, error, fatal");
}

std::vector<std::string> SplitPath(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

const std::vector<EnvironmentVariable>& EnvironmentVariables() {
  static const std::vector<EnvironmentVariable> vars = {
      {"PJRT_DEVICE", "plugin kind: CPU, CUDA, ROCM, TPU or a name given to torch_pjrt.register_plugin", "CPU"},
      {"TORCH_PJRT_PLUGIN", "path of a PJRT plugin .so; wins over PJRT_DEVICE", ""},
      {"TORCH_PJRT_SEARCH_PATH", "':'-separated directories searched for installed plugins", "site-packages, sys.path"},
      {"CPU_NUM_DEVICES", "devices of the CPU plugin in this process (1 to 127, PyTorch's 8-bit device index)", "the plugin's (4)"},
      {"TORCH_PJRT_CACHE_DIR", "directory of the persistent compile cache", "memory cache only"},
      {"TORCH_PJRT_DUMP_DIR", "directory where every compiled program is written (one .mlir file per program)", "no dumps"},
      {"TORCH_PJRT_DEBUG", "1: log compiles and recompile reasons on stderr, warn at first CPU fallbacks", "0"},
      {"TORCH_PJRT_FALLBACK",
       "allow, warn (a PjrtWarning at each op's first CPU fallback, with the Python file:line that called it) or "
       "error (raise instead of falling back, naming the op and the line)",
       "allow"},
      {"TORCH_PJRT_CHECKS",
       "0 turns off the checks compiled into programs (indices in range, integer divisors non-zero, the conditions of torch._assert_async, e.g. compiled one_hot's class range)", "1"},
      {"TORCH_PJRT_AUTOGRAD_THREADS",
       "1 keeps autograd's per-device threads for pjrt; by default a thread that creates pjrt tensors runs its "
       "backward passes itself (torch.autograd.set_multithreading_enabled(False) on that thread), which saves two "
       "thread hand-offs per backward",
       "0"},
      {"TORCH_PJRT_GPU_PREALLOCATE",
       "1 lets a GPU plugin (CUDA, ROCm) reserve most of the GPU's memory when it starts, XLA's own default; by "
       "default it allocates as it goes, so eager CUDA tensors in the same process keep room",
       "0"},
      {"TORCH_PJRT_DIST_TIMEOUT",
       "seconds a multi-process collective or rendezvous waits for a peer (more than 0, at most 1e7), in the "
       "process group torch_pjrt makes (a script's own init_process_group takes its timeout= argument)",
       "60"},
      {"TORCH_PJRT_COMPILE_PROGRESS",
       "seconds after which a running compile is reported on stderr (with its op count and cache key), and again "
       "when it ends; only with TORCH_PJRT_DEBUG=1 or TORCH_PJRT_LOG_LEVEL=info (0 to 1e7)",
       "5"},
      {"RANK", "global index of this process (set by the launcher)", "0"},
      {"WORLD_SIZE", "number of processes in the job", "`RANK` + 1"},
      {"LOCAL_RANK", "index of this process on its host", "0"},
      {"LOCAL_WORLD_SIZE", "processes on this host", "`LOCAL_RANK` + 1"},
      {"GROUP_RANK", "index of this host", "0"},
      {"MASTER_ADDR", "rendezvous host (torch.distributed TCPStore)", ""},
      {"MASTER_PORT", "rendezvous port (1 to 65535)", ""},
      {"TORCHELASTIC_RUN_ID", "set by torchrun; torch_pjrt.launch then runs the script in place", ""},
      {"TORCH_PJRT_LOG_LEVEL",
       "the PJRT plugin's own log lines shown: info, warning, error or fatal (set through TF_CPP_MIN_LOG_LEVEL)",
       "warning"},
      {"TF_CPP_MIN_LOG_LEVEL", "XLA's log level (0 info ... 3 fatal); when set, TORCH_PJRT_LOG_LEVEL leaves it alone",
       "set from TORCH_PJRT_LOG_LEVEL"},
      {"XLA_FLAGS",
       "XLA's compiler flags, read by the plugin itself; part of the disk compile cache's directory name, so "
       "programs compiled under other flags are never reused",
       "unset"},
  };
  return vars;
}

Options Options::FromEnvironment() {
  Options o;
  o.device = Upper(Get("PJRT_DEVICE"));
  o.plugin = Get("TORCH_PJRT_PLUGIN");
  o.search_path = SplitPath(Get("TORCH_PJRT_SEARCH_PATH"));
  // Bounded by PyTorch's device index, 8-bit: from 128 devices on, autograd's
  // device threads failed ("vector::_M_default_append", a segfault at 256).
  o.cpu_device_count = IntIn("CPU_NUM_DEVICES", 1, 127, "an integer from 1 to 127");
  o.cache_dir = Get("TORCH_PJRT_CACHE_DIR");
  o.dump_dir = Get("TORCH_PJRT_DUMP_DIR");
  const std::string debug = Get("TORCH_PJRT_DEBUG");
  if (!debug.empty() && debug != "0" && debug != "1") Invalid("TORCH_PJRT_DEBUG", debug, "0 or 1");
  o.debug = debug == "1";
  const std::string fallback = Get("TORCH_PJRT_FALLBACK");
  if (fallback.empty() || fallback == "allow") {
    o.fallback = FallbackMode::kAllow;
  } else if (fallback == "warn") {
    o.fallback = FallbackMode::kWarn;
  } else if (fallback == "error") {
    o.fallback = FallbackMode::kError;
  } else {
    Invalid("TORCH_PJRT_FALLBACK", fallback, "one of allow, warn, error");
  }
  const std::string checks = Get("TORCH_PJRT_CHECKS");
  if (!checks.empty() && checks != "0" && checks != "1") Invalid("TORCH_PJRT_CHECKS", checks, "0 or 1");
  o.checks = checks != "0";
  const std::string threads = Get("TORCH_PJRT_AUTOGRAD_THREADS");
  if (!threads.empty() && threads != "0" && threads != "1") Invalid("TORCH_PJRT_AUTOGRAD_THREADS", threads, "0 or 1");
  o.autograd_threads = threads == "1";
  const std::string prealloc = Get("TORCH_PJRT_GPU_PREALLOCATE");
  if (!prealloc.empty() && prealloc != "0" && prealloc != "1") Invalid("TORCH_PJRT_GPU_PREALLOCATE", prealloc, "0 or 1");
  o.gpu_preallocate = prealloc == "1";
  o.dist_timeout_s = Seconds("TORCH_PJRT_DIST_TIMEOUT", false).value_or(o.dist_timeout_s);
  o.compile_progress_s = Seconds("TORCH_PJRT_COMPILE_PROGRESS", true).value_or(5);
  // A size that is not given is the smallest one consistent with the rank:
  // launchers other than torchrun (Lightning's spawn strategies, for one) set
  // LOCAL_RANK without LOCAL_WORLD_SIZE. Only sizes given are checked.
  o.rank = Int("RANK", 0).value_or(0);
  o.world_size = Int("WORLD_SIZE", 1).value_or(o.rank + 1);
  o.local_rank = Int("LOCAL_RANK", 0).value_or(0);
  o.local_world_size = Int("LOCAL_WORLD_SIZE", 1).value_or(o.local_rank + 1);
  o.group_rank = Int("GROUP_RANK", 0).value_or(0);
  o.master_addr = Get("MASTER_ADDR");
  o.master_port = Get("MASTER_PORT");
  IntIn("MASTER_PORT", 1, 65535, "a port number from 1 to 65535");  // checked; kept as text
  o.torchrun = !Get("TORCHELASTIC_RUN_ID").empty();
  o.plugin_log_level = LogLevel();
  o.xla_flags = Get("XLA_FLAGS");
  if (!o.debug && o.plugin_log_level != 0) o.compile_progress_s = -1;  // reported only when asked for
  if (o.rank >= o.world_size) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "inconsistent launcher environment: RANK=" +
                                                        std::to_string(o.rank) + " with WORLD_SIZE=" +
                                                        std::to_string(o.world_size));
  }
  if (o.local_rank >= o.local_world_size) {
    throw pjrt::Error(pjrt::Code::kInvalidArgument, "inconsistent launcher environment: LOCAL_RANK=" +
                                                        std::to_string(o.local_rank) + " with LOCAL_WORLD_SIZE=" +
                                                        std::to_string(o.local_world_size));
  }
  return o;
}

std::vector<std::pair<std::string, std::string>> EnvironmentValues() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const EnvironmentVariable& v : EnvironmentVariables()) {
    if (const char* value = std::getenv(v.name)) out.emplace_back(v.name, value);
  }
  return out;
}

void ApplyPluginLogLevel() {
  const int level = LogLevel();
  if (std::getenv("TF_CPP_MIN_LOG_LEVEL") == nullptr) {
    ::setenv("TF_CPP_MIN_LOG_LEVEL", std::to_string(level).c_str(), 0);
  }
}

pjrt::PluginChoice ChoosePlugin(const Options& o, const std::string& device,
                                const std::vector<std::string>& search_dirs) {
  pjrt::PluginRequest r;
  r.path = o.plugin;
  if (!device.empty()) {
    r.device = device;
    r.how = "argument";
  } else {
    r.device = o.device;
    r.how = "PJRT_DEVICE";
  }
  if (!r.path.empty()) r.how = "TORCH_PJRT_PLUGIN";
  r.search_dirs = o.search_path.empty() ? search_dirs : o.search_path;
  return pjrt::FindPlugin(r);
}

std::vector<pjrt::NamedOption> ClientOptions(const Options& o, const pjrt::PluginChoice& choice) {
  std::vector<pjrt::NamedOption> out;
  const bool gpu = choice.device == "CUDA" || choice.device == "GPU" || choice.device == "ROCM";
  if (gpu) out.push_back({"preallocate", o.gpu_preallocate});
  if (gpu && o.world_size > 1) {
    out.push_back({"visible_devices", std::vector<int64_t>{o.local_rank}});  // one device per process
  }
  if (choice.device == "CPU" && o.cpu_device_count) out.push_back({"cpu_device_count", *o.cpu_device_count});
  return out;
}

}  // namespace tpj::runtime
