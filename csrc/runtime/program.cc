#include "runtime/program.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "ir/printer.h"
#include "runtime/dtype_map.h"

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

std::unique_ptr<pjrt::Executable> CompileText(pjrt::Client& client, const std::string& text,
                                              const pjrt::CompileOptions& options,
                                              std::vector<pjrt::ArgSpec> args) {
  auto where = [&](const std::string& msg) {
    const int line = MessageLine(msg);
    return ProgramLine(text, line > 0 ? line : LineWithDims(text, msg));
  };
  try {
    return client.Compile(text, options, std::move(args));
  } catch (const pjrt::Error& e) {
    const std::string at = where(e.what());
    if (at.empty()) throw;
    throw pjrt::Error(e.code(), std::string(e.what()) + "\n  in StableHLO " + at);
  } catch (const std::exception& e) {
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
