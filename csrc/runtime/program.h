// Compiling IR graphs through a PJRT client.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "pjrt/client.h"
#include "pjrt/executable.h"

namespace tpj::runtime {

struct CompiledProgram {
  std::unique_ptr<pjrt::Executable> executable;
  std::string stablehlo;  // the text that was compiled
};

// Prints `graph`, compiles it for `device_ids` (one per replica; empty: the
// plugin's default device) and records argument specs so that Execute checks
// its input. A compile failure is a pjrt::Error whose message adds the
// StableHLO line the plugin complained about, when it names one.
CompiledProgram CompileGraph(pjrt::Client& client, const ir::Graph& graph,
                             const std::vector<int>& device_ids = {});

// Compiles StableHLO text; on failure the pjrt::Error names the program line
// the plugin complained about, when its message gives one.
//
// The PJRT compile call cannot be interrupted, and a large program compiles
// for minutes: with an interrupt check set (Runtime::SetCompileInterruptCheck,
// as the Python bindings do), the compile runs on a thread of its own while the
// caller waits, calling the check once SIGINT came; Ctrl-C raises from it.
// The interrupted compile goes on to its end on its thread: a later
// CompileText of the same program, options and arguments on the same client
// waits for it rather than compiling again (the last few are kept), and
// exit waits for it (CompilesRunning).
std::unique_ptr<pjrt::Executable> CompileText(pjrt::Client& client, const std::string& text,
                                              const pjrt::CompileOptions& options,
                                              std::vector<pjrt::ArgSpec> args = {});
// Whether the last CompileText on this thread ended by its wait check
// throwing (an interrupt) rather than by the compile's own result, since
// ClearCompileInterrupted(): a caller clears it before the calls whose
// exception it then asks about.
bool CompileInterrupted();
void ClearCompileInterrupted();
// Compiles still running on their threads, interrupted ones included.
int CompilesRunning();

// The device memory the compiler planned for one run of a program, where
// the plugin reports it.
struct ProgramMemory {
  int64_t argument = 0, output = 0, alias = 0, temp = 0, peak = 0;
  // What a run allocates beyond its arguments: temporaries and the results
  // that reuse no donated argument.
  int64_t run() const { return temp + output - alias; }
};
std::optional<ProgramMemory> MemoryOf(const pjrt::Executable& exe);

// XLA's CPU client allocates a program's temporaries once its launch has
// returned: one too large fails the run after the arguments were donated,
// losing them (a training step's parameters). Such a program is refused
// before its launch instead (CheckHostMemory), when a run allocates more
// than the host has. HostRunBytes: what a run of `exe` allocates on the CPU
// plugin, 0 elsewhere (not checked).
int64_t HostRunBytes(pjrt::Client& client, const pjrt::Executable& exe);
// Throws an out-of-memory pjrt::Error where `run_bytes` exceed the host's
// available memory (MemAvailable + SwapFree, within the cgroup v2
// memory.max; read only above 256 MiB).
void CheckHostMemory(int64_t run_bytes);
// The host memory this process can still get, as CheckHostMemory reads it
// (MemAvailable + SwapFree, within the cgroup's memory.max); -1 where the
// kernel does not say.
int64_t HostBytesAvailable();
// (free, total) bytes of pjrt device `index` of `client` (torch's
// mem_get_info): the plugin's bytes_limit less bytes_in_use where it
// reports them; else (XLA's CPU plugin: its buffers are host memory) what
// this process can still get of the host's memory, and the host's
// physical memory.
std::pair<int64_t, int64_t> DeviceMemoryInfo(pjrt::Client& client, int index);

// The program line `line` (1-based) of `text` with its number, or "".
std::string ProgramLine(const std::string& text, int line);

}  // namespace tpj::runtime
