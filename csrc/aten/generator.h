// torch.Generator(device="pjrt"): a Threefry key and counter kept on the host.
// A random op given such a generator draws from it instead of the device's
// default stream: the op's GeneratorScope routes RandomBits there. A
// generator seeded with s yields what the default stream yields after
// torch.manual_seed(s): the same key, and the counter advanced as XLA
// advances it (one step per 64 bits drawn).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>

#include "ir/graph.h"

namespace tpj::aten {

// A new generator of pjrt device `device` (-1: the current one), seeded
// with PyTorch's default seed.
at::Generator NewGenerator(int device);

// For the lifetime of one random op: its generator argument, if any, serves
// every draw the op makes (including draws of ops it calls without one). A
// generator of another device type is refused as on CUDA, and so is a pjrt
// generator given to an op on another device (`op_tensor`, the tensor the
// op writes or reads; PyTorch dispatches on the generator's device too, so
// `torch.randn(3, generator=pjrt_generator)` reaches the pjrt kernel with a
// CPU tensor). `op_tensor` may be undefined (a factory op).
class GeneratorScope {
 public:
  GeneratorScope(const std::optional<at::Generator>& g, const at::Tensor& op_tensor);
  // A factory op (randperm) whose result goes to `op_device`.
  GeneratorScope(const std::optional<at::Generator>& g, c10::DeviceType op_device);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  c10::GeneratorImpl* previous_;
};

// `bits` random bits (u32 or u64 elements) on device `d`: from the current
// scope's generator, or the device's default stream.
ir::Value RandomBits(int d, const ir::Shape& bits);

}  // namespace tpj::aten
