"""``torch.compile(model, backend="pjrt")``.

AOTAutograd hands us functional core-ATen graphs (forward and backward,
core-ATen decompositions applied). Each compiled graph runs through the same
ATen-to-IR lowerings as the lazy device: its nodes are traced on pjrt tensors
and ``sync()`` turns the graph into one StableHLO program, compiled once and
cached (an identical graph traced again compiles nothing new).

Inputs on the pjrt device stay there (parameters never leave the device).
CPU inputs are accepted: they are moved to the current pjrt device, and the
outputs are moved back to the CPU, so a CPU model compiled with
``backend="pjrt"`` runs on the device transparently (at the cost of copies on
every call).

Nodes without a lowering do not fail the compile: they run on the CPU through
the same fallback as the lazy device, counted in ``torch_pjrt.metrics``
(``aten::<name>``); the program is split around them. ``explain(gm)`` lists
them ahead of time, and the metrics count ``dynamo_graphs``,
``dynamo_nodes`` and ``dynamo_fallback_nodes`` at compile time.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch
import torch.fx

from torch_pjrt import _C, _device

_PRIVATEUSE1 = "PrivateUse1"


def _has_lowering(target) -> bool:
    """Whether an ATen overload runs natively on pjrt (our kernel, or a
    composite that decomposes into ops we lower)."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = target.default
    if not isinstance(target, torch._ops.OpOverload):
        return True  # Python callables, getitem: no device work of their own
    name = target._schema.name + ("." + target._overloadname if target._overloadname != "default" else "")
    # Our kernel, or a backend-generic implementation in terms of other ops.
    # (CompositeExplicitAutogradNonFunctional kernels call an out= variant
    # that needs a backend kernel of its own: not a lowering.)
    for key in (_PRIVATEUSE1, "CompositeImplicitAutograd", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return True
    return False


def _on_constants_only(n: torch.fx.Node) -> bool:
    """A node whose tensor inputs are all constants of the graph module
    (``get_attr``: CPU tensors such as ``torch.tensor([..])`` in the model,
    lifted by ``lift_fresh_copy``) runs on the CPU by design: not a fallback."""
    inputs = n.all_input_nodes
    return bool(inputs) and all(i.op == "get_attr" for i in inputs)


def explain(gm: torch.fx.GraphModule) -> List[str]:
    """The ATen ops of ``gm`` that will run on the CPU (no pjrt lowering)."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and not _has_lowering(n.target) and not _on_constants_only(n):
            t = n.target.default if isinstance(n.target, torch._ops.OpOverloadPacket) else n.target
            out.add(str(t))
    return sorted(out)


def _is_cpu_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """AOTAutograd emits ``view`` where its fake tensors' strides allow one;
    those strides follow the CPU's layout rules (``_to_copy`` and elementwise
    ops keep a permuted input's layout), while pjrt results are contiguous,
    so such a view may not be possible on the device ("view size is not
    compatible", seen under autocast). The graphs are functional: ``reshape``
    gives the same values, as a view where it can and a copy where not."""
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
            n.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence) -> Callable:
    _views_as_reshapes(gm)
    fallback = explain(gm)
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    _C._metrics_add("dynamo_graphs", 1)
    _C._metrics_add("dynamo_nodes", nodes)
    _C._metrics_add("dynamo_fallback_nodes", sum(1 for n in gm.graph.nodes
                                                 if n.op == "call_function" and str(n.target) in fallback))

    def run(*args):
        on_cpu = any(_is_cpu_tensor(a) and a.dim() > 0 for a in args) and not any(
            isinstance(a, torch.Tensor) and a.device.type == "pjrt" for a in args)
        if on_cpu:
            dev = _device.device()
            moved = [a.to(dev) if _is_cpu_tensor(a) else a for a in args]
            outs = gm(*moved)
            _device.sync()
            return _map_tensors(outs, lambda t: t.cpu() if t.device.type == "pjrt" else t)
        outs = gm(*args)
        _device.sync()  # one program per compiled graph, launched asynchronously
        return outs

    def boxed(args):
        a = list(args)
        args.clear()
        return run(*a)

    boxed._boxed_call = True  # AOTAutograd's boxed calling convention: args as one list
    return boxed


def _map_tensors(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, fn) for v in x)
    return x


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs: Sequence):
    """The Dynamo backend registered as ``"pjrt"``."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_compile_graph, bw_compiler=_compile_graph,
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def register() -> None:
    from torch._dynamo import list_backends, register_backend

    if "pjrt" not in list_backends(exclude_tags=()):
        register_backend(name="pjrt")(pjrt_backend)
