#include "runtime/program.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <signal.h>
#include <unistd.h>

#include "ir/printer.h"
#include "pjrt/compile_options.h"
#include "runtime/dtype_map.h"
#include "runtime/metrics.h"
#include "runtime/runtime.h"

namespace tpj::runtime {
namespace {

// Finds "<something>:LINE:COL" in a compiler message; 0 when there is none.
int MessageLine(const std::string& msg) {
  for (size_t i = 0; i + 1 < msg.size(); ++i) {
    if (msg[i] != ':' || !std::isdigit(static_cast<unsigned char>(msg[i + 1]))) continue;
    size_t j = i + 1;
    int line = 0;
    while (j < msg.size() && std::isdigit(static_cast<unsigned char>(msg[j]))) {
      line = line * 10 + (msg[j] - '0');
      ++j;
    }
    if (j + 1 < msg.size() && msg[j] == ':' && std::isdigit(static_cast<unsigned char>(msg[j + 1]))) {
      return line;
    }
  }
  return 0;
}

// The first line of `text` whose types hold the dimensions the message's
// first [...] lists ("dimensions=[2147483648, 2147483648]" names
// tensor<2147483648x2147483648xf32>), or 0: plugins that name no line
// often name the shape they refused.
int LineWithDims(const std::string& text, const std::string& msg) {
  const size_t open = msg.find('[');
  const size_t close = open == std::string::npos ? std::string::npos : msg.find(']', open);
  if (close == std::string::npos) return 0;
  std::string dims;
  for (size_t i = open + 1; i < close; ++i) {
    const char c = msg[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      dims += c;
    } else if (c == ',') {
      dims += 'x';
    } else if (c != ' ') {
      return 0;  // not a list of sizes
    }
  }
  if (dims.empty()) return 0;
  std::istringstream is(text);
  std::string l;
  for (int i = 1; std::getline(is, l); ++i) {
    if (l.find("<" + dims + "x") != std::string::npos || l.find("<" + dims + ">") != std::string::npos) return i;
  }
  return 0;
}

// A number read from a file, or -1 (missing, unreadable, "max").
int64_t ReadNumber(const char* path) {
  std::ifstream f(path);
  int64_t v = -1;
  return f >> v ? v : -1;
}

}  // namespace

int64_t HostBytesAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0, available = -1, swap = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") available = kib * 1024;
    if (key == "SwapFree:") swap = kib * 1024;
  }
  if (available < 0) return -1;
  available += swap;
  const int64_t limit = ReadNumber("/sys/fs/cgroup/memory.max");
  const int64_t used = ReadNumber("/sys/fs/cgroup/memory.current");
  if (limit >= 0 && used >= 0) available = std::min(available, std::max<int64_t>(limit - used, 0));
  return available;
}

std::pair<int64_t, int64_t> DeviceMemoryInfo(pjrt::Client& client, int index) {
  const auto& ids = client.addressable_device_ids();
  if (index < 0 || static_cast<size_t>(index) >= ids.size()) {
    throw std::out_of_range("pjrt device index " + std::to_string(index) + " is out of range: this process has " +
                            std::to_string(ids.size()) + " pjrt device(s)");
  }
  if (auto stats = client.MemoryStats(ids[static_cast<size_t>(index)])) {
    auto stat = [&](const char* name) -> std::optional<int64_t> {
      for (const auto& [n, v] : *stats) {
        if (n == name) return v;
      }
      return std::nullopt;
    };
    if (auto limit = stat("bytes_limit")) return {*limit - stat("bytes_in_use").value_or(0), *limit};
  }
  const int64_t total = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const int64_t available = HostBytesAvailable();
  return {available >= 0 ? std::min(available, total) : 0, total};
}

namespace {

// Programs that allocate at most this much are not checked.
constexpr int64_t kPreflightBytes = int64_t{256} << 20;

}  // namespace

std::string ProgramLine(const std::string& text, int line) {
  if (line <= 0) return "";
  std::istringstream is(text);
  std::string l;
  for (int i = 1; std::getline(is, l); ++i) {
    if (i == line) {
      const size_t start = l.find_first_not_of(' ');
      return "line " + std::to_string(line) + ": " + (start == std::string::npos ? l : l.substr(start));
    }
  }
  return "";
}

CompiledProgram CompileGraph(pjrt::Client& client, const ir::Graph& graph,
                             const std::vector<int>& device_ids) {
  CompiledProgram out;
  out.stablehlo = ir::PrintStableHlo(graph);
  pjrt::CompileOptions options;
  options.num_replicas = graph.num_replicas;
  options.num_partitions = graph.num_partitions;
  options.device_ids = device_ids;
  std::vector<pjrt::ArgSpec> args;
  for (int32_t id : graph.params) {
    const ir::Shape& s = graph.nodes[id].results[0];
    args.push_back(pjrt::ArgSpec{ToPjrt(s.dtype), s.dims});
  }
  out.executable = CompileText(client, out.stablehlo, options, std::move(args));
  return out;
}

namespace {

// One compile on a thread of its own (CompileText).
struct CompileJob {
  std::weak_ptr<const pjrt::Client> client;
  std::string key;   // options and argument specs
  std::string text;  // the program, compiled from this copy
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::unique_ptr<pjrt::Executable> exe;
  std::exception_ptr error;
};

std::atomic<int> compiles_running{0};
thread_local bool last_interrupted = false;

// SIGINT while a compile is awaited. The wait check takes the GIL, and the
// waiting thread may hold the runtime lock, which another thread holding
// the GIL may be waiting for: called every 50 ms, the check could deadlock
// there. So it is called only once SIGINT came, as seen by a handler
// chained in front of the process's own (Python's) for the time of the
// wait, and the common such waiter, a pjrt tensor freed from Python, lets
// the GIL go while it waits (Runtime::Unregister). Another one (a binding
// that holds the GIL into the runtime) met by a Ctrl-C during a compile
// would still deadlock; without SIGINT the wait is a plain compile call's.
std::atomic<uint64_t> sigints{0};
std::mutex sigint_mu;
int sigint_watchers = 0;            // under sigint_mu
struct sigaction sigint_previous;   // the handler chained to; under sigint_mu

void OnSigint(int sig, siginfo_t* info, void* context) {
  ++sigints;
  if (sigint_previous.sa_flags & SA_SIGINFO) {
    sigint_previous.sa_sigaction(sig, info, context);
  } else {
    sigint_previous.sa_handler(sig);
  }
}

// Chains OnSigint in front of SIGINT's handler while it lives, where that
// handler is a function (SIG_DFL ends the process anyway; SIG_IGN ignores).
class SigintWatch {
 public:
  SigintWatch() {
    std::lock_guard<std::mutex> l(sigint_mu);
    if (sigint_watchers++ > 0) return;
    struct sigaction now {};
    if (sigaction(SIGINT, nullptr, &now) != 0) return;
    const bool function = (now.sa_flags & SA_SIGINFO) ? now.sa_sigaction != nullptr
                                                       : now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN;
    if (!function) return;
    sigint_previous = now;
    struct sigaction ours = now;
    ours.sa_flags |= SA_SIGINFO;
    ours.sa_sigaction = &OnSigint;
    sigaction(SIGINT, &ours, nullptr);
  }
  ~SigintWatch() {
    std::lock_guard<std::mutex> l(sigint_mu);
    if (--sigint_watchers > 0) return;
    struct sigaction now {};
    // (put back unless something else replaced it meanwhile)
    if (sigaction(SIGINT, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == &OnSigint) {
      sigaction(SIGINT, &sigint_previous, nullptr);
    }
  }
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;
  // Whether SIGINT came since the last call (each watcher counts its own).
  bool Came() {
    const uint64_t now = sigints.load();
    const bool came = now != seen_;
    seen_ = now;
    return came;
  }

 private:
  uint64_t seen_ = sigints.load();
};

// Interrupted compiles, newest last, until a CompileText of the same
// program takes one over (a kept executable holds its client). Never
// destroyed: an executable must not be freed by exit's destructors, under
// the plugin's own.
constexpr size_t kInterruptedKept = 4;
std::mutex& InterruptedMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::deque<std::shared_ptr<CompileJob>>& Interrupted() {
  static auto* jobs = new std::deque<std::shared_ptr<CompileJob>>;
  return *jobs;
}

std::string JobKey(const pjrt::CompileOptions& options, const std::vector<pjrt::ArgSpec>& args) {
  std::ostringstream key;
  key << EncodeCompileOptions(options) << '\n';
  for (const pjrt::ArgSpec& a : args) {
    key << static_cast<int>(a.type);
    for (int64_t d : a.dims) key << ',' << d;
    key << ';';
  }
  return key.str();
}

std::shared_ptr<CompileJob> TakeInterrupted(const pjrt::Client& client, const std::string& key,
                                            const std::string& text) {
  std::lock_guard<std::mutex> l(InterruptedMutex());
  auto& jobs = Interrupted();
  for (auto it = jobs.begin(); it != jobs.end(); ++it) {
    if ((*it)->client.lock().get() == &client && (*it)->key == key && (*it)->text == text) {
      std::shared_ptr<CompileJob> job = std::move(*it);
      jobs.erase(it);
      return job;
    }
  }
  return nullptr;
}

void KeepInterrupted(std::shared_ptr<CompileJob> job) {
  std::lock_guard<std::mutex> l(InterruptedMutex());
  auto& jobs = Interrupted();
  jobs.push_back(std::move(job));
  while (jobs.size() > kInterruptedKept) jobs.pop_front();  // its thread, if running, holds it to the end
}

// Starts `job` on a detached thread that holds the client (and the job)
// until the compile ends; nullptr where no thread could be started.
std::shared_ptr<CompileJob> StartCompile(pjrt::Client& client, std::string key, const std::string& text,
                                         const pjrt::CompileOptions& options, std::vector<pjrt::ArgSpec> args) {
  auto job = std::make_shared<CompileJob>();
  std::shared_ptr<pjrt::Client> holder = client.shared_from_this();
  job->client = holder;
  job->key = std::move(key);
  job->text = text;
  ++compiles_running;
  try {
    std::thread([job, holder, options, args = std::move(args)]() mutable {
      std::unique_ptr<pjrt::Executable> exe;
      std::exception_ptr error;
      try {
        exe = holder->Compile(job->text, options, std::move(args));
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> l(job->mu);
        job->exe = std::move(exe);
        job->error = error;
        job->done = true;
      }
      job->cv.notify_all();
      // Released before the count drops: exit waits for the count, and the
      // last holder of a client or an executable frees it in the plugin.
      job.reset();
      holder.reset();
      --compiles_running;
    }).detach();
  } catch (...) {  // no thread to be had: compiled on the caller's
    --compiles_running;
    return nullptr;
  }
  return job;
}

// Waits for `job`; once SIGINT came, calls `check`. A throwing check leaves
// the job to its thread (kept for a later CompileText) and throws on.
std::unique_ptr<pjrt::Executable> AwaitCompile(const std::shared_ptr<CompileJob>& job, const pjrt::WaitCheck& check) {
  SigintWatch sigint;
  const std::shared_ptr<void> waiting = Runtime::EnterWait();
  std::unique_lock<std::mutex> l(job->mu);
  while (!job->cv.wait_for(l, std::chrono::milliseconds(50), [&] { return job->done; })) {
    if (!sigint.Came()) continue;
    l.unlock();
    try {
      check();
    } catch (...) {
      last_interrupted = true;
      Metrics::Get().Add("compiles_interrupted");
      KeepInterrupted(job);
      throw;
    }
    l.lock();
  }
  if (job->error) std::rethrow_exception(job->error);
  return std::move(job->exe);
}

std::unique_ptr<pjrt::Executable> Compile(pjrt::Client& client, const std::string& text,
                                          const pjrt::CompileOptions& options, std::vector<pjrt::ArgSpec> args) {
  const pjrt::WaitCheck check = Runtime::CompileInterruptCheckFn();
  if (!check) return client.Compile(text, options, std::move(args));
  std::string key = JobKey(options, args);
  std::shared_ptr<CompileJob> job = TakeInterrupted(client, key, text);
  if (job) Metrics::Get().Add("compiles_resumed");
  if (!job) job = StartCompile(client, std::move(key), text, options, args);
  if (!job) return client.Compile(text, options, std::move(args));
  return AwaitCompile(job, check);
}

}  // namespace

bool CompileInterrupted() { return last_interrupted; }

void ClearCompileInterrupted() { last_interrupted = false; }

int CompilesRunning() { return compiles_running.load(); }

std::unique_ptr<pjrt::Executable> CompileText(pjrt::Client& client, const std::string& text,
                                              const pjrt::CompileOptions& options,
                                              std::vector<pjrt::ArgSpec> args) {
  auto where = [&](const std::string& msg) {
    const int line = MessageLine(msg);
    return ProgramLine(text, line > 0 ? line : LineWithDims(text, msg));
  };
  last_interrupted = false;
  try {
    return Compile(client, text, options, std::move(args));
  } catch (const pjrt::Error& e) {
    const std::string at = where(e.what());
    if (at.empty() || last_interrupted) throw;
    throw pjrt::Error(e.code(), std::string(e.what()) + "\n  in StableHLO " + at);
  } catch (const std::exception& e) {
    if (last_interrupted) throw;  // the wait check's own (KeyboardInterrupt)
    // a C++ exception out of the plugin's compiler (absl's "Bad StatusOr access")
    const std::string at = where(e.what());
    throw pjrt::Error(pjrt::Code::kInternal, std::string("the plugin failed to compile the program: ") + e.what() +
                                                 (at.empty() ? "" : "\n  in StableHLO " + at));
  }
}

std::optional<ProgramMemory> MemoryOf(const pjrt::Executable& exe) {
  auto stats = exe.CompiledMemoryStats();
  if (!stats) return std::nullopt;
  ProgramMemory p;
  for (const auto& [name, bytes] : *stats) {
    if (name == "argument_bytes") p.argument = bytes;
    if (name == "output_bytes") p.output = bytes;
    if (name == "alias_bytes") p.alias = bytes;
    if (name == "temp_bytes") p.temp = bytes;
    if (name == "peak_memory_bytes") p.peak = bytes;
  }
  return p;
}

void CheckHostMemory(int64_t run_bytes) {
  if (run_bytes <= kPreflightBytes) return;
  const int64_t available = HostBytesAvailable();
  if (available < 0 || run_bytes <= available) return;
  auto gib = [](int64_t b) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1) << static_cast<double>(b) / static_cast<double>(int64_t{1} << 30) << " GiB";
    return o.str();
  };
  throw pjrt::Error(pjrt::Code::kResourceExhausted,
                    "Out of memory: the program needs " + gib(run_bytes) + " for its temporaries and results, the host has " +
                        gib(available) + " available (MemAvailable + SwapFree, within the cgroup's memory.max); it was not launched");
}

int64_t HostRunBytes(pjrt::Client& client, const pjrt::Executable& exe) {
  if (client.platform_name() != "cpu") return 0;
  auto memory = MemoryOf(exe);
  return memory ? memory->run() : 0;
}

}  // namespace tpj::runtime
