"""``torch.compile(model, backend="pjrt")``.

AOTAutograd hands us functional core-ATen graphs (forward and backward,
core-ATen decompositions applied; the few composite ops pjrt has kernels of
its own for, such as ``embedding_backward``, stay as they are). Each compiled
graph runs through the same ATen-to-IR lowerings as the lazy device: its
nodes are traced on pjrt tensors and ``sync()`` turns the graph into one
StableHLO program, compiled once and cached (an identical graph traced again
compiles nothing new).

Inputs on the pjrt device stay there (parameters never leave the device).
CPU inputs are accepted: they are moved to the pjrt device current when
the graph was compiled, with what the graph creates on the CPU, and the
outputs that eager gives on the CPU are moved back, so a CPU model compiled
with ``backend="pjrt"`` runs on the device transparently (at the cost of
copies on every call).

Replay: the first call of each graph is traced as above and recorded as a
function of the graph's inputs (runtime ``Replay``), with its graph: in the
pending trace, where later calls would join it (the graph's part of the
trace becomes one call of the recorded graph, nothing is launched), else as
the program its own sync launched. Later calls run without FX interpretation or
lowering: they join the device's pending lazy trace as one call node (so a
training step with the loss and optimizer around the compiled graphs is one
program), or, with nothing pending, run the executable directly from the
inputs' buffers (see ``_compile_graph``; ``join = False`` always launches).
The runtime checks what it relies on (dtype, sizes, strides and storage
offset of every input, its storage size, which inputs share a storage,
donated buffers held by nobody else, check flags as recorded); a call that
does not match is traced again and recorded anew. Input mutations stay
in the graph (``keep_inference_input_mutations``), so the program writes the
updated inputs, donating their buffers. 0-d CPU tensor inputs (Python float
arguments, step counters) are moved to the device first (``_movable_scalars``). Graphs with
CPU fallback nodes, other CPU tensor inputs or a sync during the trace are
traced on every call.

Nodes without a lowering do not fail the compile: they run on the CPU through
the same fallback as the lazy device, counted in ``torch_pjrt.metrics``
(``aten::<name>``); the program is split around them. ``explain(gm)`` lists
them ahead of time, and the metrics count ``dynamo_graphs``,
``dynamo_nodes`` and ``dynamo_fallback_nodes`` at compile time.
"""

from __future__ import annotations

import functools
import operator
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.fx
from torch._prims import rng_prims

from torch_pjrt import _C, _device, metrics

_PRIVATEUSE1 = "PrivateUse1"


def _has_lowering(target) -> bool:
    """Whether an ATen overload runs natively on pjrt: our kernel, or a
    backend-generic implementation in terms of other ops. A
    CompositeExplicitAutogradNonFunctional kernel is one (slice_scatter and
    the other view scatters, the *_copy views) unless the op is a structured
    op whose generic functional kernel calls its backends' out= kernel
    (igamma, the special functions): those have a CPU kernel for .out."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = target.default
    if not isinstance(target, torch._ops.OpOverload):
        return True  # Python callables, getitem: no device work of their own
    name = target._schema.name + ("." + target._overloadname if target._overloadname != "default" else "")
    for key in (_PRIVATEUSE1, "CompositeImplicitAutograd", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return True
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutogradNonFunctional"):
        packet = target._overloadpacket
        outs = [o for o in packet.overloads() if "out" in o]  # "out", "output", "grad_input", ...
        return not any(torch._C._dispatch_has_kernel_for_dispatch_key(f"{target._schema.name}.{o}", "CPU")
                       for o in outs)
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
    those strides follow the CPU's layout rules, which pjrt results follow
    for most ops but not all (flip, sort, the linalg and fft results are
    row-major here: docs/semantics.md), so such a view may not be possible
    on the device ("view size is not compatible"). The graphs are functional: ``reshape``
    gives the same values, as a view where it can and a copy where not."""
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
            n.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()


def _pjrt_device_in(args, kwargs) -> Optional[torch.device]:
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        d = a.device if isinstance(a, torch.Tensor) else a if isinstance(a, torch.device) else None
        if d is not None and d.type == "pjrt":
            return d
    return None


def _run_and_save_rng_state(op, *args, **kwargs):
    d = _pjrt_device_in(args, kwargs)
    if d is None:
        return rng_prims.run_and_save_rng_state(op, *args, **kwargs)
    return torch.get_device_module(d).get_rng_state(d), op(*args, **kwargs)


def _run_with_rng_state(rng_state, op, *args, **kwargs):
    d = _pjrt_device_in(args, kwargs)
    if d is None:
        return rng_prims.run_with_rng_state(rng_state, op, *args, **kwargs)
    m = torch.get_device_module(d)
    now = m.get_rng_state(d)
    m.set_rng_state(rng_state, d)
    try:
        return op(*args, **kwargs)
    finally:
        m.set_rng_state(now, d)


def _rng_state_ops_for_pjrt(gm: torch.fx.GraphModule) -> bool:
    """Activation checkpointing under torch.compile: AOTAutograd's
    partitioner wraps each random op that the backward recomputes (dropout's
    mask) in ``run_and_save_rng_state`` (forward) and ``run_with_rng_state``
    (backward), so that both draw the same numbers. Those operators know the
    CPU, CUDA, HPU and XPU only (an AssertionError on pjrt tensors); here
    they save and restore the pjrt device's random state, as they do CUDA's.
    True when the graph has them. A replay would draw the backward's numbers
    from the first call's saved state (the state it sets becomes a constant
    of the program), so such graphs are traced on every call, not replayed;
    reading the state launches nothing, so they join the pending trace as a
    replayed graph would (one program per step)."""
    hops = {rng_prims.run_and_save_rng_state: _run_and_save_rng_state,
            rng_prims.run_with_rng_state: _run_with_rng_state}
    found = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in hops:
            n.target = hops[n.target]
            found = True
    if found:
        gm.recompile()
    return found


# How a replayed call runs (Runtime::Replay): launched, joining the device's
# pending trace when it has pending work, or always joining it.
_LAUNCH, _JOIN_WHEN_PENDING, _JOIN = 0, 1, 2


# Operator namespaces whose ops are functions of their arguments alone.
_BUILTIN_OPS = frozenset({"aten", "prims", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence, mode: int = _JOIN_WHEN_PENDING) -> Callable:
    """The backend's function for one graph AOTAutograd hands over. `mode`:
    the forward of a training graph always joins the pending trace (its
    backward, the loss and the optimizer follow: one program per step);
    backward, inference and optimizer graphs join it when work is pending
    (the loss's gradient, the gradients), and otherwise launch at once (an
    inference call whose result is read next)."""
    _views_as_reshapes(gm)
    rng_states = _rng_state_ops_for_pjrt(gm)
    fallback = explain(gm)
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    _C._metrics_add("dynamo_graphs", 1)
    _C._metrics_add("dynamo_nodes", nodes)
    _C._metrics_add("dynamo_fallback_nodes", sum(1 for n in gm.graph.nodes
                                                 if n.op == "call_function" and str(n.target) in fallback))

    mutated = _mutated_inputs(gm)
    cpu_model = _cpu_model_on_device(gm, example_inputs)
    # Recordings by the graph's non-tensor inputs (under dynamic=True, the
    # sizes): (program, non-tensor outputs, output type, same objects).
    # Alternating sequence lengths replay each one's program instead of
    # tracing every call (a compiled GPT-NeoX step at lengths 12/14/16: 30 ms
    # traced, 4 ms replayed); the oldest is dropped past _RECORDINGS.
    recordings: dict = {}
    # A custom op's Python body may read what the graph does not show (a
    # module-level tensor or number): its program would hold the first
    # call's values, so such graphs are traced on every call.
    custom = _custom_ops(gm)
    record = not fallback and not custom and not rng_states
    if fallback and replay:
        why = "ops of it run on the CPU (no pjrt lowering): " + ", ".join(sorted(fallback))
        _refusals[why] = _refusals.get(why, 0) + 1
    if custom and replay:
        why = "it calls custom ops, whose Python bodies may read state the graph does not show: " + ", ".join(custom)
        _refusals[why] = _refusals.get(why, 0) + 1
    if rng_states and replay:
        why = "it saves and restores the random state around ops that checkpointing recomputes"
        _refusals[why] = _refusals.get(why, 0) + 1

    def fallbacks_so_far() -> int:  # a recording is kept only if none ran while the graph was traced
        return dict(_C._metrics_counters()).get("cpu_fallbacks", 0)

    # AOTAutograd's effect tokens (CPU tensors threaded through ops with
    # side effects, such as linalg's error checks) stay out of the
    # recording: torch drops the returned ones, so a replay returns the
    # traced call's.
    token_in, token_out = _effect_tokens(gm)
    # pjrt tensors the graph holds as constants (get_attr: a global read in a
    # nonstrict_trace helper) join the recording as inputs after the graph's
    # own: a write to one gives it a new buffer, which a replay then reads
    # (recorded as a constant, the replay kept the first call's value).
    constants = _tensor_constants(gm)

    def recorded_args(args):
        out = [None if i in token_in else a for i, a in enumerate(args)] if token_in else args
        return list(out) + constants if constants else out

    def joining(args) -> Optional[int]:
        """The index of the device whose pending trace a graph traced on every
        call stays in, as a replayed one would join it (`mode`); None where
        it launches as its own program."""
        if not (rng_states and join and replay):
            return None
        d = _pjrt_device_in(args, {})
        index = (d.index or 0) if d is not None else 0
        return index if mode == _JOIN or (d is not None and _C._pending_count(index) > 0) else None

    # The device's trace (its epoch) when this graph last stayed in it:
    # called again in that same trace, before anything launched, it begins
    # a new step, as a replayed graph does (Runtime::MayJoinAgain), so that
    # a loop that never reads does not grow one trace over all its steps.
    stayed_in = [None]

    def new_step_first(index: int):
        if stayed_in[0] == (index, _C._trace_epoch(index)):
            _device.sync()
        stayed_in[0] = (index, _C._trace_epoch(index))

    def traced(args):
        rec = _C._replay_begin(recorded_args(args), mode if join else _LAUNCH) if record and replay else None
        before = fallbacks_so_far() if rec is not None else 0
        stay = joining(args) if rec is None else None
        if stay is not None:
            new_step_first(stay)
        outs = gm(*args)
        if rec is None:
            if stay is None:
                _device.sync()  # one program per compiled graph, launched asynchronously
            return outs
        seq = isinstance(outs, (list, tuple))
        flat = list(outs) if seq else [outs]
        program, why = _C._replay_end(rec, recorded_args(args), [None if j in token_out else o for j, o in enumerate(flat)])
        if program is not None and fallbacks_so_far() != before:
            program, why = None, "an op of the graph ran on the CPU (a fallback)"
        key = _values_key(args)
        if program is None:
            _C._metrics_add("replay_refused", 1)
            _refusals[why] = _refusals.get(why, 0) + 1
            recordings.pop(key, None)
        elif key is not None:
            others = [(i, o) for i, o in enumerate(flat) if not isinstance(o, torch.Tensor) or i in token_out]
            recordings.pop(key, None)
            recordings[key] = (program, others, type(outs) if seq else None, _same_objects(args, flat))
            while len(recordings) > _RECORDINGS:
                del recordings[next(iter(recordings))]
        return outs

    def replayed(args):
        """The recorded program's outputs on `args`, or None (not recorded, or not matching)."""
        if not recordings or not replay:
            return None
        recorded = recordings.get(_values_key(args))  # Python values (e.g. sizes) shape the program
        if recorded is None:
            return None
        program, others, kind, same = recorded
        out = _C._replay_run(program, recorded_args(args), mode if join else _LAUNCH)
        if out is None:
            return None
        for i, v in others:
            out[i] = v
        for j, from_input, k, view in same:
            src = args[k] if from_input else out[k]
            out[j] = src if view is None else src.as_strided(*view)
        return out[0] if kind is None else (out if kind is list else kind(out))

    def run_on_device(args):
        out = replayed(args)
        return traced(args) if out is None else out

    # Inputs whose storage offset changes from call to call (batches sliced
    # from a dataset on the device, data[i:i+b]) miss a recording made at
    # another offset: its program reads their storage where the first call's
    # view lay. Once a graph sees an input's offset change, each call gives
    # that input a storage of its own (a lazy copy, which joins the call's
    # program), and the graph records and replays on the copies. Inputs the
    # graph writes keep the caller's storage.
    unwritten = set(range(len(example_inputs))) - set(mutated)
    moving: set = set()
    offsets: dict = {}  # input position -> its storage offset in the last call traced

    def run(args):
        if moving:
            args = [_own_storage(a) if i in moving else a for i, a in enumerate(args)]
        out = replayed(args)  # the common case first: pjrt inputs, as recorded
        if out is not None:
            return out
        if record and replay:
            for i, a in enumerate(args):
                if i in unwritten and i not in moving and _moving_view(a):
                    if offsets.setdefault(i, a.storage_offset()) != a.storage_offset():
                        moving.add(i)
                        args[i] = _own_storage(a)
        # A replay returns program outputs and views of inputs or outputs
        # only; what the graph itself returned may hold views AOTAutograd
        # did not plan for. (Dynamo guards devices: a CPU model's graph gets
        # CPU inputs on every call.)
        return _unforeseen_views_made_plain(args, _on_cpu(args, run_on_device, mutated, cpu_model)
                                            if cpu_model is not None else traced(args))

    scalars = _movable_scalars(gm, example_inputs)
    if scalars is not None:
        run = functools.partial(_with_scalars_on_device, scalars, run)

    def boxed(args):
        t0 = time.perf_counter_ns()
        a = list(args)
        args.clear()
        out = run(a)
        _calls[0] += 1
        _calls[1] += time.perf_counter_ns() - t0
        return out

    boxed._boxed_call = True  # AOTAutograd's boxed calling convention: args as one list
    return boxed


def _tensor_constants(gm: torch.fx.GraphModule) -> List[torch.Tensor]:
    """The pjrt tensors that get_attr nodes of the graph read."""
    found = []
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        value = gm
        for part in n.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and value.device.type == "pjrt" and not any(value is f for f in found):
            found.append(value)
    return found


def _moving_view(a) -> bool:
    """Whether `a` is a pjrt view, without overlapping elements, of part
    of a larger storage (a row window ``data[i:i+b]``, a column window
    ``data[:, j:j+b]``)."""
    if not isinstance(a, torch.Tensor) or a.device.type != "pjrt" or a.numel() == 0:
        return False
    dims = sorted((st, n) for n, st in zip(a.shape, a.stride()) if n > 1)
    span = 1  # elements from the first to one past the last
    for st, n in dims:
        if st < span:
            return False  # overlapping (expanded) dims
        span = st * (n - 1) + span
    try:
        nbytes = a.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):  # vmap's batched tensors have no storage
        return False
    return a.storage_offset() != 0 or span * a.element_size() != nbytes


def _own_storage(a):
    """`a` in a storage of its own with the same sizes and strides (its
    span, from offset 0), or `a`."""
    if not _moving_view(a):
        return a
    out = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
    with torch.no_grad():
        out.copy_(a)
    return out


def _effect_tokens(gm: torch.fx.GraphModule) -> Tuple[frozenset, frozenset]:
    """The positions of effect tokens among a graph's inputs (placeholders
    that ``with_effects`` takes as its token) and outputs (the tokens it
    returns, or an input token returned as it is)."""
    with_effects = torch.ops.higher_order.with_effects
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ins = {i for i, p in enumerate(placeholders)
           if any(u.op == "call_function" and u.target is with_effects and u.args[0] is p for u in p.users)}
    token_nodes = {placeholders[i] for i in ins}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    outs = set()
    for j, r in enumerate(results):
        if not isinstance(r, torch.fx.Node):
            continue
        if r in token_nodes or (r.op == "call_function" and r.target is operator.getitem and r.args[1] == 0
                                and isinstance(r.args[0], torch.fx.Node) and r.args[0].target is with_effects):
            outs.add(j)
    return frozenset(ins), frozenset(outs)


def _custom_ops(gm: torch.fx.GraphModule) -> List[str]:
    """The custom (non-builtin) ops a graph calls: its own nodes, the ops
    that higher-order ops call by argument (AOTAutograd wraps a mutating
    custom op in auto_functionalized), and the subgraphs of higher-order
    ops (map, scan, ...), at any depth."""
    found = set()
    for _, module in gm.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for n in module.graph.nodes:
            if n.op != "call_function":
                continue
            for t in (n.target, *n.args):
                if isinstance(t, torch._ops.OpOverload) and t.namespace not in _BUILTIN_OPS:
                    found.add(str(t))
    return sorted(found)


def _values_key(args) -> Optional[tuple]:
    """A graph call's non-tensor inputs, by position, type and value (a
    recording's key), or None where one is not hashable."""
    key = tuple((i, type(a), a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
    try:
        hash(key)
    except TypeError:
        return None
    return key


# Recordings kept per compiled graph (one per set of sizes under dynamic=True).
_RECORDINGS = 8

# Whether compiled graphs replay their recorded program (bench and tests turn
# it off to compare with tracing every call).
replay = True
# Whether replayed calls may join the device's pending trace (see
# _compile_graph); False launches each one's executable, pending inputs
# first as their own program (tests compare the two).
join = True
# Calls of compiled graphs and the nanoseconds spent in them (entry to
# return of the backend's function; Dynamo guards and AOTAutograd's
# wrappers excluded); see call_stats().
_calls = [0, 0]
# Why graphs could not be recorded for replay, with counts.
_refusals: dict = {}


def call_stats(reset: bool = False) -> dict:
    """``{"calls": n, "seconds": s, "refusals": {reason: count}}`` of the
    compiled graphs' calls so far (the backend's own time per call is
    seconds / calls); ``reset=True`` starts counting anew."""
    out = {"calls": _calls[0], "seconds": _calls[1] / 1e9, "refusals": dict(_refusals)}
    if reset:
        _calls[0] = _calls[1] = 0
        _refusals.clear()
    return out


def _unforeseen_views_made_plain(args: Sequence, outs):
    """`outs` with each output that is an autograd view of a tensor made
    inside the graph (not of an input or another output) turned into a plain tensor on the same
    memory (``_unsafe_view``, as eager PyTorch's reshape-like ops return).
    AOTAutograd plans outputs on fake tensors and handles the views it
    foresees outside its autograd Function; a view it did not foresee (a
    reshape that copies under the fake strides and views on the device,
    Longformer's attention output) would leave the Function as a view made
    inside it, which autograd then forbids to modify in place. Views of the
    inputs stay (AOTAutograd regenerates those from the inputs), and so do
    views of other outputs (the forward's saved tensors: they share the
    version counter that lets autograd see an output modified in place
    before the backward)."""
    seq = isinstance(outs, (list, tuple))
    flat = outs if seq else [outs]
    if not any(isinstance(o, torch.Tensor) and o._is_view() for o in flat):
        return outs
    roots = {id(x._base if x._base is not None else x) for x in args if isinstance(x, torch.Tensor)}
    roots.update(id(o) for o in flat if isinstance(o, torch.Tensor) and not o._is_view())
    plain: dict = {}  # one replacement per object: an output listed twice (returned, saved) stays one tensor
    fixed = []
    for o in flat:
        if isinstance(o, torch.Tensor) and o._is_view() and id(o._base) not in roots:
            if id(o) not in plain:
                plain[id(o)] = torch.ops.aten._unsafe_view(o, o.shape)
            o = plain[id(o)]
        fixed.append(o)
    return fixed[0] if not seq else (fixed if isinstance(outs, list) else type(outs)(fixed))


def _same_objects(args: Sequence, outs: Sequence) -> List[tuple]:
    """(j, from_input, k, view) for each output j that the traced call
    returned as the very tensor of input k or of an earlier output k (view
    None), or as a view of one ((sizes, strides, offset)). A replay returns
    those objects, and such views of them: AOTAutograd saves outputs for the
    backward, and autograd's check that a saved tensor was not modified in
    place before the backward follows the version counter that a tensor
    shares with its views (separate tensors let x.mul_(2) or y.mul_(2)
    between forward and backward pass silently)."""
    def storage(t):
        return (t.untyped_storage().data_ptr(), t.dtype) if t.device.type == "pjrt" else None

    sources = [(True, i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    same = []
    for j, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            continue
        found = next(((inp, k) for inp, k, s in sources if s is o), None)
        if found is not None:
            same.append((j, found[0], found[1], None))
        else:
            found = next(((inp, k) for inp, k, s in sources if storage(s) is not None and storage(s) == storage(o)),
                         None)
            if found is not None:
                same.append((j, found[0], found[1], (tuple(o.size()), tuple(o.stride()), o.storage_offset())))
        sources.append((False, j, o))
    return same


# Platforms whose XLA computes float64 (a Python float argument arrives as a
# float64 CPU tensor; TPUs have no float64).
_FLOAT64_PLATFORMS = frozenset({"CPU", "CUDA", "ROCM"})


class _Scalars(NamedTuple):
    """A graph's 0-d CPU tensor inputs that run on the device (see _movable_scalars)."""

    positions: List[int]
    device: torch.device
    cpu_outputs: List[int]  # outputs computed on the CPU by cpu_part
    cpu_part: Optional[torch.fx.GraphModule]


def _movable_scalars(gm: torch.fx.GraphModule, example_inputs: Sequence):
    """How a graph of pjrt tensors with 0-d CPU tensor inputs runs them on the
    device, or None. Dynamo passes a Python float argument (``f(x, scale)``)
    as a 0-d float64 CPU tensor, AOTAutograd passes the CPU numbers the
    forward saved to the backward, and a compiled Adam's step counters are
    0-d CPU tensors unless ``capturable=True``; on the CPU they make the
    graph trace on every call (a CPU input cannot be a replayed program's
    argument). Copies moved to the device (a few bytes per call) are the
    program's arguments, so the graph replays. What the graph computes on the
    CPU from those inputs alone and returns (the backward's saved numbers)
    or writes into them (the step counters' increment) is still computed
    there, by the graph's own nodes for those results, so it stays on the
    CPU with the CPU's values. Not moved (traced on every call, as before):
    CPU tensors with dimensions, float64 numbers where the plugin has no
    float64 (TPUs), numbers that the graph reads back (``.item()``) or hands
    to an op without a lowering, and CPU results that depend on pjrt inputs
    (a ``.cpu()`` in the graph)."""
    ex = list(example_inputs)
    devices = [e.device for e in ex if isinstance(e, torch.Tensor) and e.device.type == "pjrt"]
    cpu = [i for i, e in enumerate(ex) if isinstance(e, torch.Tensor) and e.device.type == "cpu"]
    if not devices or not cpu or any(ex[i].dim() != 0 for i in cpu):
        return None
    if any(ex[i].dtype == torch.float64 for i in cpu):
        from torch_pjrt import runtime

        if runtime.device_type() not in _FLOAT64_PLATFORMS:
            return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in cpu:  # a number read back to Python (.item()) or by a CPU fallback: cheaper where it is
        for u in placeholders[i].users:
            if u.op == "call_function" and (u.target is torch.ops.aten._local_scalar_dense.default
                                            or not _has_lowering(u.target)):
                return None
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if not isinstance(output.args[0], (list, tuple)):
        return None
    outs = list(output.args[0])
    cpu_outputs = []
    for j, v in enumerate(outs):
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
        if isinstance(v, torch.fx.Node) and val is None:
            return None  # where it belongs is unknown
        if isinstance(val, torch.Tensor) and val.device.type == "cpu":
            cpu_outputs.append(j)
    writes = _input_writes(gm)
    roots = [outs[j] for j in cpu_outputs] + [w for i in cpu for w in writes.get(i, [])]
    if not roots:
        return _Scalars(cpu, devices[0], [], None)
    allowed = {placeholders[i] for i in cpu}
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and n not in allowed:
            return None
        todo.extend(n.all_input_nodes)
    graph, env = torch.fx.Graph(), {}
    for n in gm.graph.nodes:  # those results and what they depend on, nothing else (not the device's writes)
        if n.op == "placeholder" or n in seen:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[r] for r in roots))  # the writes' results are not used
    return _Scalars(cpu, devices[0], cpu_outputs, torch.fx.GraphModule(gm, graph))


def _with_scalars_on_device(scalars: _Scalars, run: Callable, args: list):
    """`run` on `args` with the 0-d CPU inputs of `scalars` moved to the
    device, and the outputs that belong on the CPU computed there."""
    moved = list(args)
    for i in scalars.positions:
        moved[i] = args[i].to(scalars.device)
    out = run(moved)
    if scalars.cpu_part is None:
        return out
    on_cpu = scalars.cpu_part(*args)
    if not scalars.cpu_outputs:
        return out
    flat = list(out)
    for j, v in zip(scalars.cpu_outputs, on_cpu):
        flat[j] = v
    return flat if isinstance(out, list) else type(out)(flat)


def _input_writes(gm: torch.fx.GraphModule) -> dict:
    """{position: [nodes]} of the graph inputs that an op of the graph writes
    (the copy_ AOTAutograd keeps in the graph for an inference input
    mutation, an in-place op), with the nodes that write them."""
    position = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    writes: dict = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        for i, a in enumerate(n.target._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write and i < len(n.args):
                if n.args[i] in position:
                    writes.setdefault(position[n.args[i]], []).append(n)
    return writes


def _mutated_inputs(gm: torch.fx.GraphModule) -> List[int]:
    """Positions of the graph inputs that an op of the graph writes."""
    return sorted(_input_writes(gm))


def _is_cpu_model(inputs: Sequence) -> bool:
    """Whether a graph's inputs are a CPU model's: CPU tensors with
    dimensions and none on pjrt. Those graphs run on the device (_on_cpu)."""
    tensors = [e for e in inputs if isinstance(e, torch.Tensor)]
    return any(e.device.type == "cpu" and e.dim() > 0 for e in tensors) and not any(e.device.type == "pjrt" for e in tensors)


class _CpuModel(NamedTuple):
    """How a graph of a CPU model runs on the device (see _cpu_model_on_device)."""

    device: torch.device
    cpu_outputs: List[bool]  # per output: whether eager gives it on the CPU


def _cpu_model_on_device(gm: torch.fx.GraphModule, example_inputs: Sequence) -> Optional[_CpuModel]:
    """For a graph of a CPU model (CPU inputs with dimensions, none on
    pjrt: Dynamo guards the devices, so every call is such), the graph
    rewritten to run on the current pjrt device: what it creates on the CPU
    (``torch.arange(n)``, the ``arange`` of a decomposed ``c[1] = v``, a
    ``torch.tensor([..])`` constant) is created there instead, as its inputs
    will be. Outputs that eager PyTorch gives on the CPU come back to the
    CPU; those it gives on pjrt (``x.to("pjrt")`` in the function) stay.
    None for other graphs (nothing changed)."""
    if not _is_cpu_model(example_inputs):
        return None
    dev = _device.device()
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.kwargs.get("device"), torch.device) and n.kwargs["device"].type == "cpu":
            n.kwargs = {**n.kwargs, "device": dev}
            changed = True
        elif n.op == "get_attr":
            value = getattr(gm, n.target, None)
            if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0:
                with torch._subclasses.fake_tensor.unset_fake_temporarily():  # the compile runs under fake tensors
                    setattr(gm, n.target, value.to(dev))
    if changed:
        gm.recompile()
    outs = gm.graph.output_node().args[0]
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in outs]
    return _CpuModel(dev, [not (isinstance(v, torch.Tensor) and v.device.type == "pjrt") for v in vals])


def _moved_as_laid_out(a: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU input on the device with the CPU tensor's strides, its storage
    offset 0 on the device matching the CPU's offset: ``.to()`` keeps a dense
    layout, and a tensor that is not dense in its storage (a column slice
    ``ids[:, 1:]``, an expanded row) is moved as the span of storage it
    covers, where that span is at most twice its elements. So every device
    offset maps back to the caller's memory (``_on_cpu``)."""
    if a.numel() == 0 or any(s < 0 for s in a.stride()):
        return a.to(device)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))
    if span == a.numel() or span > 2 * a.numel() + 64:  # dense (.to() keeps its strides), or too sparse
        return a.to(device)
    flat = a.as_strided((span,), (1,), a.storage_offset()).to(device)
    return flat.as_strided(a.shape, a.stride(), 0)


def _on_cpu(args: list, run_on_device: Callable, mutated: Sequence[int], model: _CpuModel):
    """A graph of a CPU model: its CPU inputs run on pjrt and its outputs come
    back (those eager gives on the CPU). What the graph wrote into an input (an in-place op, BatchNorm's
    running statistics, a compiled optimizer's parameters) is written back
    into the caller's tensor. Outputs keep eager's aliasing, which autograd's
    version counters rely on (a tensor saved for the backward and modified in
    place before it raises "modified by an inplace operation", as in eager):
    an output that is an input, or a view of one (a saved ``x``, a weight's
    ``t()``), is the caller's tensor or a view of it, not a copy; an output
    returned twice (the result and its saved copy) is one CPU tensor; and
    outputs that share memory on the device share it on the CPU (y, y.t()
    and y.view(torch.int32) stay views of one tensor)."""
    moved = [_moved_as_laid_out(a, model.device) if _is_cpu_tensor(a) else a for a in args]
    outs = run_on_device(moved)
    with torch.no_grad():
        for i in mutated:
            if moved[i] is not args[i]:
                args[i].copy_(moved[i])
    # Device storages of moved inputs -> the caller's tensor, where a device
    # offset k is the caller's offset + k (same strides, device offset 0).
    callers = {m.untyped_storage().data_ptr(): (m, a) for m, a in zip(moved, args)
               if m is not a and m.stride() == a.stride() and m.storage_offset() == 0}
    seq = isinstance(outs, (list, tuple))
    flat = list(outs) if seq else [outs]
    # The outputs that come back (eager gives them on the CPU); the others stay.
    back = [i for i, o in enumerate(flat) if (i >= len(model.cpu_outputs) or model.cpu_outputs[i])
            and isinstance(o, torch.Tensor) and o.device.type == "pjrt"]
    # Device storage -> its CPU copy: an output that covers it whole, where one does.
    bases: dict = {}
    for t in (flat[i] for i in back):
        key = t.untyped_storage().data_ptr()
        if key not in callers and key not in bases and t.is_contiguous() and \
                t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes():
            bases[key] = (t, t.detach().cpu())
    done: dict = {}  # id of a device output -> its CPU tensor

    def on_base(base: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
        if base.dtype != t.dtype:  # y.view(torch.int32): the same bytes, read as another dtype
            base = base.view(-1).view(t.dtype)
        return base.as_strided(t.size(), t.stride(), offset)

    def to_cpu(t):
        if id(t) in done:
            return done[id(t)]
        key = t.untyped_storage().data_ptr()
        m, caller = callers.get(key, (None, None))
        if caller is not None and caller.dtype == t.dtype:
            out = caller if t is m else on_base(caller, t, caller.storage_offset() + t.storage_offset())
        elif key in bases and bases[key][0] is t:
            out = bases[key][1]
        else:
            if key not in bases:  # no output covers the storage: a hidden copy of it all
                n = t.untyped_storage().nbytes() // t.element_size()
                whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
                bases[key] = (whole, whole.cpu())
            out = on_base(bases[key][1], t, t.storage_offset())
        out = out.requires_grad_() if t.requires_grad and t.is_leaf and not out.requires_grad else out
        done[id(t)] = out
        return out

    for i in back:
        flat[i] = to_cpu(flat[i])
    return type(outs)(flat) if seq else flat[0]


# torch.compile's modes (Inductor's names); the pjrt backend runs every one alike.
_INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The torch.compile options already warned about (once each).
_ignored_options_warned: set = set()


@functools.cache
def _decompositions() -> dict:
    """PyTorch's core ATen decompositions, less those whose result loses the
    CPU's error: nll_loss as a gather raised gather's RuntimeError for a
    target out of range where the CPU (and pjrt's own nll_loss kernels)
    raise IndexError; and nan_to_num's, which fails on complex inputs
    (``isneginf``; pjrt's kernel takes them, as the CPU's).

    The table is the one ``core_aten_decompositions()`` starts from, without
    the entries it adds for every CompositeImplicitAutograd op: tracing
    decomposes those ops by themselves the same way (make_fx runs an op's
    CompositeImplicitAutograd kernel where autograd would have), except where
    pjrt registers a kernel of its own, which is then used as in lazy mode.
    Collecting those entries took 0.15 s of every process's first compile
    (``docs/performance.md``, "A warm start under torch.compile"). With a
    torch that lacks the private function, the public table is used."""
    import torch._decomp as decomp

    table = getattr(decomp, "_core_aten_decompositions_post_autograd", None)
    table = dict(table() if table is not None else decomp.core_aten_decompositions().items())
    aten = torch.ops.aten
    keep = {aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.nll_loss2d_forward.default,
            aten.nll_loss2d_backward.default, aten.nan_to_num.default, *_NATIVE_WHILE_TRACING}
    return {op: fn for op, fn in table.items() if op not in keep}


# Ops whose Python decomposition for the Autograd key (applied while
# AOTAutograd traces) gives wrong values, so that the backend traces their
# native kernels instead (pjrt's lowerings, as in lazy mode):
# multilabel_margin_loss_forward's (torch 2.13) sums the hinge terms of the
# labels after a row's first -1 too (a loss of 6.08 for the CPU's 1.93).
_NATIVE_WHILE_TRACING = (torch.ops.aten.multilabel_margin_loss_forward.default,)


class _NativeKernels:
    """While the backend traces: the ops of ``_NATIVE_WHILE_TRACING``
    without their Python Autograd kernels (put back on exit; the op's
    dispatch cache is cleared both ways)."""

    def __enter__(self):
        key = torch._C.DispatchKey.Autograd
        self.saved = [(op, op.py_kernels.pop(key, None)) for op in _NATIVE_WHILE_TRACING]
        for op, _ in self.saved:
            op._dispatch_cache.clear()

    def __exit__(self, *exc):
        for op, kernel in self.saved:
            if kernel is not None:
                op.py_kernels[torch._C.DispatchKey.Autograd] = kernel
            op._dispatch_cache.clear()


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, **options):
    """The Dynamo backend registered as ``"pjrt"``. ``torch.compile``'s
    ``mode`` and ``options`` (Inductor's settings) are accepted and ignored,
    with a warning: every graph is one XLA program, replayed after its first
    call, which is what ``mode="reduce-overhead"`` asks of Inductor."""
    mode = options.get("mode")
    if mode is not None and mode not in _INDUCTOR_MODES:  # Inductor's own error for a misspelt mode
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_INDUCTOR_MODES)}")
    if options and options != {"mode": "default"}:
        import warnings

        key = repr(sorted(options.items(), key=lambda kv: str(kv[0])))
        if key not in _ignored_options_warned:
            _ignored_options_warned.add(key)
            warnings.warn(f"torch.compile(backend='pjrt') ignores {', '.join(f'{k}={v!r}' for k, v in options.items())}: "
                          "those are Inductor's settings; the pjrt backend compiles each graph to one XLA program and "
                          "replays it", stacklevel=2)
    from torch._dynamo.backends.common import aot_autograd

    metrics._note_dynamo_compile()
    _dense_embedding_gradients(gm)
    # keep_inference_input_mutations: in-place updates of inputs (BatchNorm's
    # running statistics, a compiled optimizer's parameters) stay in the
    # program, which donates the inputs' buffers to their new values.
    compile = aot_autograd(fw_compiler=functools.partial(_compile_graph, mode=_JOIN),
                           bw_compiler=_compile_graph, inference_compiler=_compile_graph,
                           decompositions=_decompositions(),
                           keep_inference_input_mutations=True)
    if not _is_cpu_model(example_inputs):
        with _NativeKernels():
            return compile(gm, example_inputs)
    # A CPU model's graph is traced on CPU (fake) tensors, on which
    # scaled_dot_product_attention picks the CPU's flash kernel; that
    # kernel's decomposition returns the attention weights where its
    # backward reads the logsumexp (gradients off by up to 200 on a small
    # attention). The math kernel is what pjrt runs anyway.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH), _NativeKernels():
        return compile(gm, example_inputs)


# Where each embedding function takes `sparse` (positionally).
_EMBEDDING_SPARSE_ARG = {torch.nn.functional.embedding: 6, torch.embedding: 4}


def _dense_embedding_gradients(gm: torch.fx.GraphModule) -> None:
    """``sparse=True`` embeddings of a Dynamo graph become dense, as the
    lazy device's gradient is (docs/device.md): AOTAutograd traced their
    sparse backward, whose COO tensors pjrt has no layout for (a device
    model with ``max_norm`` and every CPU model failed to compile)."""
    changed = False
    for n in gm.graph.nodes:
        at = _EMBEDDING_SPARSE_ARG.get(n.target) if n.op == "call_function" else None
        if at is None:
            continue
        if n.kwargs.get("sparse") is True:
            n.kwargs = {**n.kwargs, "sparse": False}
            changed = True
        elif len(n.args) > at and n.args[at] is True:
            n.args = n.args[:at] + (False,) + n.args[at + 1:]
            changed = True
    if changed:
        gm.recompile()


_meta_library = None


def _register_meta_kernels() -> None:
    """Meta kernels torch lacks for ops the backend traces, so that fake
    tensors of symbolic sizes (dynamic=True, or Dynamo's automatic dynamic
    shapes from a second size on) run them ("Operator does not support
    running with fake tensors": a graph break, or an error under
    fullgraph=True). The fused GRU cell, which nn.GRUCell calls on pjrt (as
    on CUDA; the LSTM cell's are torch's own): hy [B, H] and workspace
    [B, 5H]; its backward's gate gradients [B, 3H], grad_hx [B, H], bias
    gradients [3H] or none (shapes as ops_rnn.cc's kernels). The backward
    of multilabel_margin_loss, whose forward the backend traces natively
    (_NATIVE_WHILE_TRACING): the input's shape. The samplers of Dirichlet,
    Beta and Binomial (``_sample_dirichlet``, ``binomial``) and the
    gradients of Gamma's and Dirichlet's samples: without a Meta kernel,
    tracing ran the real op on zeros of the device, a real draw that moved
    the random stream (a compiled Dirichlet's first call ignored
    manual_seed). Each only where torch has no Meta kernel of its own."""
    global _meta_library
    if _meta_library is not None:
        return

    def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
        return (hx.new_empty(hx.shape),
                input_gates.new_empty((input_gates.shape[0], 5 * hx.shape[1])))

    def gru_cell_backward(grad_hy, workspace, has_bias):
        b, h = grad_hy.shape
        bias = (workspace.new_empty((3 * h,)), workspace.new_empty((3 * h,))) if has_bias else (None, None)
        return (workspace.new_empty((b, 3 * h)), workspace.new_empty((b, 3 * h)), grad_hy.new_empty((b, h))) + bias

    def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
        return self.new_empty(self.shape)

    def like_first(x, *args, **kwargs):
        return torch.empty_like(x)

    def binomial(count, prob, generator=None):
        return count.new_empty(torch.broadcast_shapes(count.shape, prob.shape))

    _meta_library = torch.library.Library("aten", "IMPL")
    for name, fn in (("_thnn_fused_gru_cell", gru_cell), ("_thnn_fused_gru_cell_backward", gru_cell_backward),
                     ("multilabel_margin_loss_backward", multilabel_margin_loss_backward),
                     ("_sample_dirichlet", like_first), ("binomial", binomial),
                     ("_standard_gamma_grad", like_first), ("_dirichlet_grad", like_first)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _meta_library.impl(name, fn, "Meta")


def register() -> None:
    """Registers the backend as "pjrt" unless the registry knows the name:
    registered, or the entry point Dynamo found when first asked for a
    backend, which Dynamo registers itself when it loads it (this import
    may be that load: registering here too raised "duplicate name")."""
    from torch._dynamo.backends import registry

    if "pjrt" not in registry._BACKENDS:
        registry.register_backend(name="pjrt")(pjrt_backend)
    _register_meta_kernels()
    # sync(), device() and current_device() end a compiled graph with our reason
    # (_device._graph_break_here); their own frames then run eagerly rather
    # than being compiled from the break on (which warned about each _C call).
    skip = getattr(torch._dynamo.eval_frame, "skip_code", None)
    if skip is not None:
        for fn in (_device.sync, _device.device, torch.pjrt.current_device):
            skip(fn.__code__)
