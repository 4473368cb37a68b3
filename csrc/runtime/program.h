// Compiling IR graphs through a PJRT client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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
std::unique_ptr<pjrt::Executable> CompileText(pjrt::Client& client, const std::string& text,
                                              const pjrt::CompileOptions& options,
                                              std::vector<pjrt::ArgSpec> args = {});

// The program line `line` (1-based) of `text` with its number, or "".
std::string ProgramLine(const std::string& text, int line);

}  // namespace tpj::runtime
