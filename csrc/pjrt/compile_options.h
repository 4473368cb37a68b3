// Compile options, and their encoding as a serialized xla.CompileOptionsProto.
//
// We write the few varint fields we need by hand instead of linking a protobuf
// library. Field numbers (public facts of the proto schema):
//   CompileOptionsProto.executable_build_options = 3
//   ExecutableBuildOptionsProto: device_ordinal = 1, num_replicas = 4,
//     num_partitions = 5, use_spmd_partitioning = 6, device_assignment = 9
//   DeviceAssignmentProto: replica_count = 1, computation_count = 2,
//     computation_devices = 3 { replica_device_ids = 1 }
//   CompileOptionsProto.env_option_overrides = 7 (map<string,
//     OptionOverrideProto>: entry key = 1, value = 2); OptionOverrideProto:
//     bool_field = 2
//
// Every program is compiled with XLA's `xla_allow_excess_precision` off:
// with it on (XLA's default), XLA may drop the rounding of a float16 or
// bfloat16 intermediate it computes in float (1 / x rounded, then scaled),
// where PyTorch's CPU kernels round each op's result to its dtype. Off, the
// two agree op for op (docs/semantics.md, "Half precision").
#pragma once

#include <string>
#include <vector>

namespace tpj::pjrt {

struct CompileOptions {
  int num_replicas = 1;     // >= 1
  int num_partitions = 1;   // >= 1
  // XLA's SPMD partitioner turns the one program into num_partitions
  // programs from the shardings on its arguments, results and constraints.
  bool use_spmd_partitioning = false;
  // Global device ids, replica-major: device_ids[r * num_partitions + p].
  // Empty: the plugin's default assignment.
  std::vector<int> device_ids;
};

// Validates `options` (throws Error) and returns the serialized proto.
std::string EncodeCompileOptions(const CompileOptions& options);

}  // namespace tpj::pjrt
