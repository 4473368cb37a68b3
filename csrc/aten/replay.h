// torch.compile graphs replayed from their recorded program (runtime/replay.h):
// the tensor side. A Recording is taken around the first (traced) call of a
// graph; a Replayable then runs later calls straight from the inputs'
// buffers, after checking that each input has the recorded dtype, sizes,
// strides, storage offset and storage size, and wraps the program's results
// into fresh pjrt tensors laid out as the recorded outputs were.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace tpj::aten {

// A graph input or output: a tensor, or any other value (nullopt).
using MaybeTensors = std::vector<std::optional<at::Tensor>>;

struct TensorLayout {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

struct Recording {
  runtime::RecordingStart start;
  std::string why_not;  // non-empty: the call cannot be recorded (it is traced and synced as usual)
};

class Replayable {
 public:
  // Runs the recorded program on `inputs`; nullopt (nothing launched) when
  // they do not match the recording. Outputs that were not tensors are nullopt.
  // `join`: see runtime::Runtime::Replay.
  std::optional<MaybeTensors> Run(const MaybeTensors& inputs, runtime::Runtime::ReplayJoin join) const;

 private:
  friend std::shared_ptr<Replayable> EndRecording(Recording&, const MaybeTensors&, const MaybeTensors&,
                                                  std::string*);
  struct Output {
    int fresh = -1;  // index of its fresh storage, or -1
    int input = -1;  // else the input whose storage it views, or -1 (not a tensor)
    TensorLayout layout;
  };
  std::shared_ptr<const runtime::ReplayProgram> program_;
  std::vector<std::optional<TensorLayout>> inputs_;
  std::vector<Output> outputs_;
  std::vector<size_t> fresh_nbytes_;
};

// Before tracing the graph on `inputs`, which `join` would join to the
// pending trace or not (runtime::Runtime::BeginRecording). A recording with
// why_not set when the call cannot be recorded (a CPU tensor input).
std::unique_ptr<Recording> BeginRecording(const MaybeTensors& inputs, runtime::Runtime::ReplayJoin join);
// After tracing: the replayable program, or null with *why_not set (and
// the devices synced). A recording of its own syncs the device.
std::shared_ptr<Replayable> EndRecording(Recording& rec, const MaybeTensors& inputs, const MaybeTensors& outputs,
                                         std::string* why_not);

}  // namespace tpj::aten
