#include "pjrt/executable.h"

#include <atomic>
#include <sstream>

namespace tpj::pjrt {
namespace {

std::string DimsText(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << "]";
  return os.str();
}

// Owns the PJRT_Executable view of a loaded executable for one query.
class ExecutableView {
 public:
  ExecutableView(const Plugin& p, pjrt_abi::LoadedExecutable* loaded) : p_(p) {
    auto a = pjrt_abi::make<pjrt_abi::LoadedExecutableGetExecutableArgs>();
    a.loaded_executable = loaded;
    TPJ_CALL(p_, PJRT_LoadedExecutable_GetExecutable, &a);
    exe_ = a.executable;
  }
  ~ExecutableView() {
    auto a = pjrt_abi::make<pjrt_abi::ExecutableDestroyArgs>();
    a.executable = exe_;
    TPJ_CALL_NOTHROW(p_, PJRT_Executable_Destroy, &a);
  }
  pjrt_abi::Executable* get() const { return exe_; }

 private:
  const Plugin& p_;
  pjrt_abi::Executable* exe_ = nullptr;
};

}  // namespace

Executable::Executable(std::shared_ptr<Client> client, pjrt_abi::LoadedExecutable* exe,
                       CompileOptions options, std::vector<ArgSpec> args)
    : client_(std::move(client)), exe_(exe), options_(std::move(options)), args_(std::move(args)) {
  ExecutableView view(client_->plugin(), exe_);
  auto a = pjrt_abi::make<pjrt_abi::ExecutableNumOutputsArgs>();
  a.executable = view.get();
  TPJ_CALL(client_->plugin(), PJRT_Executable_NumOutputs, &a);
  num_outputs_ = a.num_outputs;
}

std::optional<std::vector<std::pair<std::string, int64_t>>> Executable::CompiledMemoryStats() const {
  const Plugin& p = client_->plugin();
  if (!TPJ_HAS(p, PJRT_Executable_GetCompiledMemoryStats)) return std::nullopt;
  ExecutableView view(p, exe_);
  auto a = pjrt_abi::make<pjrt_abi::ExecutableCompiledMemoryStatsArgs>();
  a.executable = view.get();
  try {
    TPJ_CALL(p, PJRT_Executable_GetCompiledMemoryStats, &a);
  } catch (const Error& e) {
    if (e.code() == static_cast<int>(Code::kUnimplemented)) return std::nullopt;
    throw;
  }
  std::vector<std::pair<std::string, int64_t>> out{
      {"argument_bytes", a.argument_size_in_bytes},
      {"output_bytes", a.output_size_in_bytes},
      {"alias_bytes", a.alias_size_in_bytes},
      {"temp_bytes", a.temp_size_in_bytes},
      {"generated_code_bytes", a.generated_code_size_in_bytes},
      {"host_argument_bytes", a.host_argument_size_in_bytes},
      {"host_output_bytes", a.host_output_size_in_bytes},
      {"host_alias_bytes", a.host_alias_size_in_bytes},
      {"host_temp_bytes", a.host_temp_size_in_bytes},
      {"host_generated_code_bytes", a.host_generated_code_size_in_bytes},
  };
  // 0 from a plugin that predates the field (or a program with no buffers).
  if (a.peak_memory_in_bytes > 0) out.emplace_back("peak_memory_bytes", a.peak_memory_in_bytes);
  return out;
}

Executable::~Executable() {
  auto a = pjrt_abi::make<pjrt_abi::LoadedExecutableDestroyArgs>();
  a.executable = exe_;
  TPJ_CALL_NOTHROW(client_->plugin(), PJRT_LoadedExecutable_Destroy, &a);
}

void Executable::CheckArgs(const std::vector<std::vector<Buffer*>>& args) const {
  const size_t lists = static_cast<size_t>(options_.num_replicas) * options_.num_partitions;
  if (args.size() != lists) {
    throw Error(Code::kInvalidArgument,
                "program is compiled for " + std::to_string(options_.num_replicas) + " replica(s) x " +
                    std::to_string(options_.num_partitions) + " SPMD partition(s) but was given " +
                    std::to_string(args.size()) + " argument list(s)");
  }
  for (size_t r = 0; r < args.size(); ++r) {
    const auto& list = args[r];
    if (!args_.empty() && list.size() != args_.size()) {
      throw Error(Code::kInvalidArgument,
                  "program takes " + std::to_string(args_.size()) + " argument(s), got " +
                  std::to_string(list.size()));
    }
    if (r > 0 && list.size() != args[0].size()) {
      throw Error(Code::kInvalidArgument, "every replica needs the same number of arguments");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      Buffer* b = list[i];
      if (b == nullptr) throw Error(Code::kInvalidArgument, "argument " + std::to_string(i) + " is null");
      if (b->is_deleted()) {
        throw Error(Code::kFailedPrecondition,
                    "argument " + std::to_string(i) +
                    " is a deleted buffer (donated to an earlier program, or deleted)");
      }
      if (!args_.empty()) {
        const ArgSpec& want = args_[i];
        const auto type = b->element_type();
        const auto& dims = b->dims();
        if (type != want.type || dims != want.dims) {
          throw Error(Code::kInvalidArgument,
                      "argument " + std::to_string(i) + " has type " + TypeName(type) +
                      DimsText(dims) + " but the program expects " +
                      TypeName(want.type) + DimsText(want.dims));
        }
      }
      if (!options_.device_ids.empty() && b->device_id() != options_.device_ids[r]) {
        throw Error(Code::kInvalidArgument,
                    "argument " + std::to_string(i) + " of replica " + std::to_string(r) +
                    " is on device " + std::to_string(b->device_id()) +
                    " but that replica runs on device " +
                    std::to_string(options_.device_ids[r]));
      }
    }
  }
}

std::vector<std::vector<std::unique_ptr<Buffer>>> Executable::ExecuteReplicated(
    const std::vector<std::vector<Buffer*>>& args) {
  CheckArgs(args);
  const size_t n = args.size();
  const size_t num_args = n ? args[0].size() : 0;
  std::vector<std::vector<pjrt_abi::Buffer*>> handles(n);
  std::vector<pjrt_abi::Buffer* const*> arg_lists(n);
  std::vector<std::vector<pjrt_abi::Buffer*>> outs(n, std::vector<pjrt_abi::Buffer*>(num_outputs_));
  std::vector<pjrt_abi::Buffer**> out_lists(n);
  for (size_t r = 0; r < n; ++r) {
    for (Buffer* b : args[r]) handles[r].push_back(b->handle());
    arg_lists[r] = handles[r].data();
    out_lists[r] = outs[r].data();
  }
  auto options = pjrt_abi::make<pjrt_abi::ExecuteOptions>();
  // Every launch gets its own id: the CPU plugin keys collective rendezvous
  // on it, and two replicated launches in flight with one id deadlock.
  static std::atomic<int> next_launch{1};
  options.launch_id = next_launch.fetch_add(1, std::memory_order_relaxed);
  if (options.launch_id <= 0) options.launch_id = 1;  // after wrap-around
  auto a = pjrt_abi::make<pjrt_abi::LoadedExecutableExecuteArgs>();
  a.executable = exe_;
  a.options = &options;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = num_args;
  a.output_lists = out_lists.data();
  std::vector<pjrt_abi::Event*> done(n, nullptr);
  std::unique_lock<std::mutex> serial;
  if (n > 1) {
    serial = std::unique_lock<std::mutex>(client_->replicated_mu_);
    for (auto& e : client_->replicated_inflight_) e->Await();
    client_->replicated_inflight_.clear();
    a.device_complete_events = done.data();
  }
  TPJ_CALL(client_->plugin(), PJRT_LoadedExecutable_Execute, &a);
  for (pjrt_abi::Event* e : done) {
    if (e) client_->replicated_inflight_.push_back(std::make_unique<Event>(client_->plugin_ptr(), e));
  }

  std::vector<std::vector<std::unique_ptr<Buffer>>> result(n);
  for (size_t r = 0; r < n; ++r) {
    for (pjrt_abi::Buffer* b : outs[r]) result[r].push_back(std::make_unique<Buffer>(client_, b));
  }
  return result;
}

std::vector<std::unique_ptr<Buffer>> Executable::Execute(const std::vector<Buffer*>& args) {
  auto all = ExecuteReplicated(std::vector<std::vector<Buffer*>>{args});
  return std::move(all[0]);
}

std::string Executable::Serialize() const {
  const Plugin& p = client_->plugin();
  ExecutableView view(p, exe_);
  auto a = pjrt_abi::make<pjrt_abi::ExecutableSerializeArgs>();
  a.executable = view.get();
  TPJ_CALL(p, PJRT_Executable_Serialize, &a);
  std::string bytes(a.serialized_bytes, a.serialized_bytes_size);
  if (a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
  return bytes;
}

}  // namespace tpj::pjrt
