// Replaying a recorded program: a graph that torch.compile hands the backend
// is traced once (the lazy path), and the program its sync launched is
// recorded as a function of the graph's input storages. Later calls run that
// executable directly on the inputs' buffers: no tracing, no IR, no hashing.
// Or the call joins the device's lazy trace instead (Runtime::Replay says
// when): one Call node of the recorded graph (ir::CallAttrs) on the inputs'
// values there, pending or not, so that the work around it and the graph
// become one program (one launch, fused by XLA) rather than several.
//
// A recording says, for each program argument, where its buffer comes from
// (an input storage, the device's random state, or a constant such as a
// cached scalar), and for each program result which storage it becomes (an
// input written in place, a fresh storage of a graph output, the random
// state, the program's own check flag).
// Runtime::Replay checks what it relies on and returns false, launching
// nothing, when the call does not match the recording; the caller then
// traces again (and records anew).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"
#include "pjrt/executable.h"
#include "runtime/storage.h"

namespace tpj::runtime {

struct ReplayProgram {
  enum class Source { kInput, kRng, kConst };
  struct Arg {
    Source source = Source::kConst;
    int input = -1;         // kInput: the input it reads
    DeviceBuffer constant;  // kConst
    bool donated = false;   // the program reuses this buffer for a result
    ir::DType dtype = ir::DType::F32;  // of the program's parameter (read as such when the call joins a trace)
  };
  struct Input {
    bool storage = false;  // a pjrt storage (else a value the caller checks)
    int same_as = -1;      // an earlier input with the same storage, or -1 (distinct from all earlier)
    size_t nbytes = 0;
    ir::DType dtype = ir::DType::F32;
  };
  enum class Target { kInput, kFresh, kRng, kFlag };
  struct Result {
    Target target;
    int index = -1;  // kInput: input index; kFresh: fresh storage index
  };

  int device = 0;
  // Recorded in the pending trace: null until a call launches it alone
  // (Runtime::ExecutableOf compiles `body` with `aliases`).
  mutable std::shared_ptr<pjrt::Executable> executable;
  mutable int64_t run_bytes = 0;           // HostRunBytes of the executable
  std::vector<ir::Alias> aliases;          // of `body` compiled alone (args marked donated)
  std::vector<Arg> args;                   // per program argument
  std::vector<Input> inputs;               // per graph input
  std::vector<std::vector<Result>> results;  // per program result: the storages it becomes
  std::vector<ir::DType> fresh;            // dtype of each fresh storage
  bool checked = false;                    // one result is the check flag
  uint64_t rng_advance = 0;                // Threefry counters the program draws (Runtime::RngAdvance)
  // Where the recorded trace traced each check (Trace::check_sites): a
  // replay's failed check names the user's line, as a traced program's does.
  std::vector<std::pair<int32_t, std::string>> check_sites;
  // The program's graph (parameter k is argument k, output o result o), for
  // a call that joins the device's pending trace instead of launching the
  // executable (Runtime::Replay); null where its parameters are not the
  // program's arguments one for one. SPMD programs are not recorded.
  std::shared_ptr<const ir::Graph> body;
};

// What BeginRecording saw of the inputs before the trace: their buffers, and
// the trace epoch and host reads (a sync during the trace, e.g. a CPU fallback, or a value
// read to the host makes the call unrecordable).
struct RecordingStart {
  int device = 0;
  // Non-empty: why the device's programs cannot be recorded (replicated, or
  // SPMD: they take an argument list per device), said before any sync.
  std::string refused;
  int64_t epoch = 0;
  int64_t host_reads = 0;
  int64_t rng_resets = 0;
  std::vector<const pjrt::Buffer*> buffers;  // per input (null for non-storages)
  std::vector<size_t> nbytes;
  std::vector<ir::DType> dtypes;
  // Recorded in the pending trace (Runtime::BeginRecording): where the
  // graph's nodes begin, each input's pending value (or none: `buffers`
  // holds it), the random state, the checks and pending storages before it.
  bool in_trace = false;
  int32_t first_node = 0;
  std::vector<ir::Value> values;
  bool rng_pending = false;
  ir::Value rng_value;
  uint64_t rng_drawn = 0;
  ir::Value check_code;
  size_t check_sites = 0;
  std::unordered_map<const Storage*, ir::Value> pending;
};

}  // namespace tpj::runtime
