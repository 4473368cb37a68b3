// A compiled program loaded on a client's devices.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pjrt/buffer.h"
#include "pjrt/client.h"
#include "pjrt/compile_options.h"

namespace tpj::pjrt {

class Executable {
 public:
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  size_t num_outputs() const { return num_outputs_; }
  const CompileOptions& options() const { return options_; }
  const std::vector<ArgSpec>& arg_specs() const { return args_; }

  // Runs the program once per replica: args[r] are the arguments of replica r
  // (on that replica's device). Returns outputs[r][i], owned by the caller.
  // Arguments the program marks as donated (tf.aliasing_output) are consumed:
  // their Buffer objects become deleted buffers. Outputs may still be
  // computing on return; reading them waits.
  std::vector<std::vector<std::unique_ptr<Buffer>>> ExecuteReplicated(
      const std::vector<std::vector<Buffer*>>& args);

  // Single-replica convenience.
  std::vector<std::unique_ptr<Buffer>> Execute(const std::vector<Buffer*>& args);

  // What the compiler planned for one run (PJRT_Executable_GetCompiledMemoryStats),
  // as (name, bytes) pairs: argument, output, alias, temp and generated-code
  // bytes on the device, the host_* counterparts, and peak_memory when the
  // plugin reports it. nullopt when the plugin does not offer the call.
  std::optional<std::vector<std::pair<std::string, int64_t>>> CompiledMemoryStats() const;

  // Bytes that Client::Deserialize turns back into this executable, with a
  // plugin of the same XLA version.
  std::string Serialize() const;

 private:
  friend class Client;
  Executable(std::shared_ptr<Client> client, pjrt_abi::LoadedExecutable* exe,
             CompileOptions options, std::vector<ArgSpec> args);
  void CheckArgs(const std::vector<std::vector<Buffer*>>& args) const;

  std::shared_ptr<Client> client_;
  pjrt_abi::LoadedExecutable* exe_;
  CompileOptions options_;
  std::vector<ArgSpec> args_;
  size_t num_outputs_ = 0;
};

}  // namespace tpj::pjrt
