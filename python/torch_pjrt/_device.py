"""The ``pjrt`` PyTorch device: registration and the user-facing calls."""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import operator
import os
import re
import secrets
import signal
import struct
import sys
import time
import types
import warnings
from typing import Callable, List, NamedTuple, Optional, Tuple, Union

import torch

from torch_pjrt import _C, _extension, _plugins, _printing

_registered = False


class PjrtWarning(UserWarning):
    """A problem torch-pjrt worked around (an unusable cache or dump
    directory): the run goes on. Filter it like any warning."""


def _warn(message: str) -> None:
    """The runtime's warning sink: C++ warnings reach Python's ``warnings``,
    attributed to the innermost caller outside torch and torch_pjrt."""
    frame, depth = _user_frame(sys._getframe(1))
    warnings.warn(message, PjrtWarning, stacklevel=depth + 2 if frame is not None else 1)


def _user_frame(frame):
    """The innermost frame from ``frame`` outwards that is neither torch's nor
    ours, and how many frames out it is (None when there is none)."""
    here = os.path.dirname(__file__)
    torch_dir = os.path.dirname(torch.__file__)
    depth = 0
    while frame is not None and frame.f_code.co_filename.startswith((here, torch_dir)):
        frame, depth = frame.f_back, depth + 1
    return frame, depth


def _await_launched_at_exit() -> None:
    # Python's exit handlers run before C++ static destructors: a program
    # (or a compile: one interrupted by Ctrl-C goes on in its thread) still
    # running in the plugin's threads when exit() tears those down crashes
    # the process (SIGSEGV, or std::terminate in the plugin). Neither can
    # be stopped: the wait polls (no thread: Python 3.12 refuses new
    # threads at exit), and Ctrl-C during it ends the process at once, by
    # SIGINT as an uncaught KeyboardInterrupt does (the exit handlers
    # registered before this one do not run).
    if not _extension.is_loaded(_C):  # nothing was launched without it (and its stub would raise again)
        return
    unread = []
    try:
        # On the CPU an out-of-range index raises at its op: pending work
        # that holds a check runs now rather than being dropped unseen
        # (not after an uncaught exception, which ended the script already).
        if _C._pending_checks() and getattr(sys, "last_value", None) is None:
            nodes = sum(_C._trace_nodes(d) for d in range(_C._device_count()))
            if nodes > 2000:  # a compile of seconds: said, so that exit does not look hung
                print(f"torch_pjrt: running the pending work ({nodes} IR nodes) before exiting: it holds checks (an "
                      f"index, a divisor) whose failure would otherwise go unseen; sync() before exit to see it "
                      f"earlier", file=sys.stderr, flush=True)
            try:
                _C._sync([], False)
            except Exception as e:  # a compile failure: said below like the rest
                unread.append(str(e))
        start, told = time.monotonic(), False
        while not _C._launches_done():
            if not told and time.monotonic() - start > 1.0:
                print("torch_pjrt: waiting for the programs still compiling or running on the device before exiting "
                      "(Ctrl-C to exit at once)", file=sys.stderr, flush=True)
                told = True
            time.sleep(0.02)
    except KeyboardInterrupt:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: exiting anyway
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)  # (where the signal did not end it)
    _C._drain_autograd_threads()  # with autograd's device threads: a crash at exit otherwise
    unread += _C._await_launched()  # all finished: drops their events
    for error in unread:
        # as a device-side assertion prints at a CUDA program's exit; the exit status stays
        print(f"torch_pjrt: at exit, a failure that nothing read: {error}", file=sys.stderr, flush=True)


atexit.register(_await_launched_at_exit)


def _configure_once() -> None:
    """Hands Python's plugin search directories to the runtime before its
    first use (which reads the environment, loads the plugin and creates the
    client)."""
    if _C._initialized():
        return
    try:
        _C._configure(_plugins.plugin_search_dirs(), {})
    except _C.PjrtError:
        pass  # initialized meanwhile by another thread


def _in_bad_fork() -> bool:
    """True in a child forked after the PJRT plugin was loaded (pjrt is unusable there)."""
    try:
        return bool(_C._in_bad_fork())
    except Exception:  # an extension that did not load: nothing was forked from it
        return False


def _location() -> str:
    """file:line of the innermost caller outside torch and torch_pjrt; in a
    graph torch.compile made (FX's generated code), the user's line that
    the running node was traced from."""
    frame, _ = _user_frame(sys._getframe(1))
    if frame is None:
        return ""
    if frame.f_code.co_filename.startswith("<eval_with_key>"):
        traced = _traced_from(frame)
        if traced:
            return traced
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


_STACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _traced_from(frame) -> str:
    """file:line of the user code an FX graph's running node came from (its
    ``stack_trace``), or "" where the graph does not say."""
    gm = frame.f_locals.get("self")
    lines = getattr(gm, "_lineno_map", None)
    graph = getattr(gm, "graph", None)
    if not lines or graph is None:
        return ""
    index = lines.get(frame.f_lineno - getattr(gm, "_prologue_start", 0))
    if index is None:
        return ""
    for i, node in enumerate(graph.nodes):
        if i == index:
            found = _STACK_LINE.findall(node.meta.get("stack_trace") or "")
            return f"{found[-1][0]}:{found[-1][1]}" if found else ""
    return ""


def register() -> None:
    """Registers the ``pjrt`` device with PyTorch. Pure Python, reads no
    environment, loads no plugin: nothing here can fail because of the
    machine (torch's autoload runs it inside ``import torch``). The kernels,
    allocator and hooks were registered when ``_C`` loaded; when it could not
    be loaded, the device module's hooks raise why at first use."""
    global _registered
    if _registered:
        return
    if torch._C._get_privateuse1_backend_name() != "pjrt":
        torch.utils.rename_privateuse1_backend("pjrt")
    torch._register_device_module("pjrt", _make_device_module())
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    _default_autocast_dtype()
    _refuse_sharing_between_processes()
    _refuse_dlpack_export()
    _settle_before_saving()
    _refuse_strided_nested_on_pjrt()
    _register_with_lightning_when_imported()
    _warn_when_cuda_starts()
    _printing.install()
    if _extension.is_loaded(_C):
        _configure_once()  # stores the search directories only; the runtime starts at first use
        _ensure_location_provider()
        _C._set_warning_sink(_warn)
    _registered = True


CUDA_AUTOGRAD_WARNING = (
    "CUDA started in a process that imported torch_pjrt: torch allows one accelerator per process, and it is "
    "pjrt here, so a backward pass through CUDA tensors fails inside torch's autograd (torch 2.11: "
    "'opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED'); forward CUDA ops work. Train with eager "
    "CUDA and with pjrt in separate processes (docs/semantics.md, 'One accelerator per process').")


def _warn_when_cuda_starts() -> None:
    """Says once, when CUDA starts in this process (at once if it has), that
    CUDA autograd fails beside pjrt: torch's own error is an internal assert
    that names neither. Nothing on a torch built without CUDA."""
    if not torch.backends.cuda.is_built():
        return

    def warn():
        try:
            _warn(CUDA_AUTOGRAD_WARNING)
        except Warning:  # warnings as errors: CUDA's start must not fail for this
            pass

    if torch.cuda.is_initialized():
        warn()
    else:
        torch.cuda._lazy_call(warn)  # run by CUDA's lazy init, as its seeding is


def _refused_in_this_process(message: str):
    raise RuntimeError(message)


def _refuse_sharing_between_processes() -> None:
    """torch.multiprocessing sends a CPU tensor through shared memory and a
    CUDA tensor through CUDA IPC, so that both processes see one tensor.
    PJRT buffers cannot be shared that way, and a copy would silently break
    programs that rely on sharing (Hogwild training with
    ``model.share_memory()``): a pjrt tensor sent to another process is an
    error that says what to send instead."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    def reducer(base):
        def reduce(t):
            if t.device.type == "pjrt":
                message = ("a pjrt tensor cannot be shared with another process (PJRT buffers have no inter-process "
                           "handle); send t.cpu() and move it to pjrt in the receiving process")
                if torch.utils.data.get_worker_info() is not None:
                    # A DataLoader worker pickles its batches in a queue's
                    # feeder thread, where an error is only printed and the
                    # main process waits forever: the error travels with the
                    # batch and is raised where it is received.
                    return _refused_in_this_process, (message + " (return CPU tensors from the Dataset and move "
                                                      "the batch to pjrt in the training loop; pin_memory=True "
                                                      "speeds the copy)",)
                raise RuntimeError(message)
            return base(t)
        return reduce

    ForkingPickler.register(torch.Tensor, reducer(reductions.reduce_tensor))
    ForkingPickler.register(torch.nn.Parameter, reducer(reductions.reduce_tensor))
    ForkingPickler.register(torch.UntypedStorage, reducer(reductions.reduce_storage))  # typed ones reduce to it


def _refuse_dlpack_export() -> None:
    """``torch.utils.dlpack.to_dlpack`` (also ``torch.to_dlpack``) and
    ``Tensor.__dlpack__`` export any tensor's data pointer without asking its
    backend; a pjrt tensor's is a token for memory that lives in the PJRT
    plugin, which no DLPack consumer can reach. Each refuses pjrt tensors
    with what to do instead (``Tensor.__dlpack_device__``, which
    ``torch.from_dlpack`` and other libraries ask first, too); an imported
    capsule of one anyway is refused at its first use (``StorageOf``)."""
    import torch.utils.dlpack as dlpack

    def check(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "pjrt":
            raise RuntimeError("a pjrt tensor cannot be exported through DLPack: its memory lives in the PJRT "
                               "plugin, out of reach of other libraries; export tensor.cpu() instead")

    for owner, name in ((dlpack, "to_dlpack"), (torch, "to_dlpack"), (torch.Tensor, "__dlpack__"),
                        (torch.Tensor, "__dlpack_device__")):
        _guard(owner, name, check)


def _settle_before_saving() -> None:
    """``torch.save`` truncates its file before it reads the first tensor,
    and a pjrt tensor whose program failed a check (an index out of range,
    traced earlier) raises only when it is read: a good checkpoint at that
    path would be left cut short. The pjrt tensors of the object (in dicts,
    lists, tuples, modules, optimizer states) are settled first: their
    programs run and a failure raises before the file is opened."""
    import torch.serialization

    def check(obj, *args, **kwargs):
        tensors = _pjrt_tensors_in(obj)
        if tensors:
            _C._settle(tensors)

    for owner in (torch.serialization, torch):
        _guard(owner, "save", check)


def _pjrt_tensors_in(obj, limit: int = 1_000_000) -> List[torch.Tensor]:
    """The pjrt tensors in `obj`, its containers and modules (the first
    `limit` objects looked at)."""
    found, seen, todo = [], set(), [obj]
    while todo and len(seen) < limit:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.device.type == "pjrt":
                found.append(o)
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo.extend(o)
        elif isinstance(o, torch.nn.Module):
            todo.extend(o.state_dict(keep_vars=True).values())
        elif isinstance(o, torch.optim.Optimizer):
            todo.append(o.state)
    return found


def _guard(owner, name: str, check: Callable) -> None:
    """Wraps ``owner.name`` (once) so that ``check`` sees its arguments
    first; ``check`` raises to refuse them."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_pjrt_guard", False):
        return

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        check(*args, **kwargs)
        return original(*args, **kwargs)

    guarded._pjrt_guard = True
    setattr(owner, name, guarded)


def _after_import(target_name: str, callback: Callable[[], None],
                  imported: Callable[[types.ModuleType], bool] = lambda module: True) -> None:
    """Runs `callback` once module `target_name` is imported in this
    process: at once if it is (and `imported` says it is whole), else right
    after its code has run, inside that import (a finder in front of
    ``sys.meta_path`` wraps its loader, then removes itself)."""
    import importlib.abc
    import importlib.util

    if target_name in sys.modules:
        if imported(sys.modules[target_name]):
            callback()
        return

    class AfterImport(importlib.abc.MetaPathFinder):
        target = target_name

        def find_spec(self, fullname, path=None, target=None):
            if fullname != target_name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                callback()

            spec.loader.exec_module = exec_module
            return spec

    if not any(getattr(f, "target", None) == target_name for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport())


def _register_with_lightning_when_imported() -> None:
    """``Trainer(accelerator="pjrt")`` and ``Fabric(accelerator="pjrt")``
    need the accelerator registered, and Lightning has no entry point for
    accelerators: once ``lightning.pytorch`` is imported in this process
    (before or after torch_pjrt; ``import lightning`` imports it, and its
    import of torch is what loads torch_pjrt when torch autoloads it),
    ``torch_pjrt.lightning`` registers it, so that ``import
    torch_pjrt.lightning`` is not needed (docs/lightning.md). A failure there
    (another Lightning version) is a warning, never a failed import."""
    import importlib

    def register() -> None:
        try:
            importlib.import_module("torch_pjrt.lightning")
        except Exception as error:  # noqa: BLE001 - Lightning must still import
            warnings.warn(f"torch_pjrt could not register its Lightning accelerator ({type(error).__name__}: "
                          f"{error}); Trainer(accelerator='pjrt') will not be available", PjrtWarning, stacklevel=2)

    _after_import("lightning.pytorch", register, lambda module: hasattr(module, "Trainer"))


def _refuse_strided_nested_on_pjrt() -> None:
    """``torch.nested.nested_tensor`` and ``as_nested_tensor`` of CPU tensors
    with ``device="pjrt"`` build a strided nested tensor on pjrt through the
    CPU's kernel, which asks no pjrt code (from pjrt tensors the op itself is
    refused, ``aten/fallback.cc``). pjrt has no such layout: the tensor failed
    later inside torch, and with ``requires_grad=True`` autograd aborted the
    process. Refused here with the op's message; ``layout=torch.jagged``
    (Python tensors of strided pjrt tensors) works."""
    import torch.nested as nested

    def checker(signature):
        def check(*args, **kwargs):
            given = signature.bind_partial(*args, **kwargs).arguments  # as_nested_tensor takes them positionally too
            device, layout = given.get("device"), given.get("layout")
            if device is not None and torch.device(device).type == "pjrt" and layout in (None, torch.strided):
                raise NotImplementedError(
                    "nested tensors are not supported on pjrt (strided layout); keep them on the CPU, use "
                    "layout=torch.jagged, or convert to a dense tensor (to_padded_tensor()) before moving to pjrt")
        return check

    for name in ("nested_tensor", "as_nested_tensor"):
        _guard(nested, name, checker(inspect.signature(getattr(nested, name))))


# Low precision dtypes of autocast on pjrt. bfloat16 is the default: it has
# float32's range, so training needs no GradScaler; float16 needs one.
AMP_DTYPES = (torch.bfloat16, torch.float16)


def _default_autocast_dtype() -> None:
    """Makes bfloat16 the default of ``torch.autocast("pjrt")``. torch keeps
    the default per thread and starts PrivateUse1 at float16; this sets it
    for the thread that registers the device (the one that imports torch).
    A thread started later begins at torch's float16 unless it passes
    ``dtype=`` or calls ``torch.set_autocast_dtype("pjrt", torch.bfloat16)``."""
    if torch.get_autocast_dtype("pjrt") == torch.float16 and not torch.is_autocast_enabled("pjrt"):
        torch.set_autocast_dtype("pjrt", torch.bfloat16)


def _constant_under_dynamo(fn):
    """Marks `fn` as Dynamo's ``assume_constant_result`` does (without
    importing Dynamo): a compiled function that calls it gets its value at
    trace time instead of a graph break (``fullgraph=True`` failed). Only
    for values fixed for the process (the device count, availability): the
    mark installs no guard, so the current device (``torch_pjrt.device()``,
    ``torch.pjrt.current_device()``), which ``set_device`` changes, is not
    marked and stays a graph break inside a compiled function."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_under_dynamo
def device_count() -> int:
    """Number of pjrt devices this process can use (starts the runtime:
    loads the plugin and creates the client)."""
    _configure_once()
    n = _C._device_count()
    _apply_pending_seed()
    return n


def _graph_break_here(reason: str) -> None:
    """Under Dynamo, end the compiled graph before a call that talks to the
    runtime, with our reason instead of Dynamo's complaint about a C
    extension function (the call then runs eagerly)."""
    if torch.compiler.is_compiling():
        torch._dynamo.graph_break(msg=reason)


def device(index: Optional[int] = None) -> torch.device:
    """``torch.device("pjrt:<index>")``; the current device when index is None."""
    _graph_break_here("torch_pjrt.device() reads the runtime's device list and current device "
                      "(set_device changes it): call it outside the compiled function")
    if index is not None:  # (numpy's integers too)
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"torch_pjrt.device() takes a device index (an int), got {index!r}; "
                            "torch.device('pjrt:1') names a device by string")
        index = operator.index(index)
    n = device_count()
    if index is None:
        index = _C._current_device()
    if index < 0 or index >= n:
        raise IndexError(_C._device_index_error(index))
    return torch.device("pjrt", index)


def sync(wait: bool = False, devices: Optional[List[Union[int, str, torch.device]]] = None) -> None:
    """Compile (once, cached) and launch the pending work of every device, one
    program per device. Returns once launched; ``wait=True`` blocks until done.
    ``devices`` (indices, ``"pjrt:1"``, ``torch.device``s, or one of them):
    those devices only; ``"pjrt"`` is the current one."""
    _graph_break_here("torch_pjrt.sync() launches the pending work: a compiled graph is one "
                      "program already, and the call ends it")
    if not isinstance(wait, (bool, int)):
        raise TypeError(f"sync(wait=...) takes a bool, got {wait!r}; to sync some devices only, "
                        f"pass devices=[...]")
    _configure_once()
    if isinstance(devices, (int, str, torch.device)):
        devices = [devices]
    idx = [_index(d) for d in (devices or [])]
    if not _C._initialized() and not idx:
        return
    _C._sync(idx, bool(wait))


_location_set = False


def _ensure_location_provider() -> None:
    global _location_set
    if not _location_set:
        _C._set_location_provider(_location)
        _location_set = True


# A seed given before the runtime started (``torch.manual_seed`` seeds every
# registered device): applied when it starts, as CUDA queues its seed until
# its lazy init. Seeding must neither load a plugin nor fail for want of one.
_pending_seed: Optional[int] = None


def _apply_pending_seed() -> None:
    global _pending_seed
    seed, _pending_seed = _pending_seed, None
    if seed is not None:
        for d in range(_C._device_count()):
            _C._manual_seed(d, seed)


def manual_seed(seed: int) -> None:
    """Seeds the on-device random generator of every pjrt device (when the
    runtime has not started yet: as soon as it starts)."""
    global _pending_seed
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    if not _C._initialized():
        _pending_seed = seed
        return
    _pending_seed = None
    for d in range(_C._device_count()):
        _C._manual_seed(d, seed)


class _DeviceModule(types.ModuleType):
    """``torch.pjrt``. ``_initialized`` is a live attribute: torch's
    activation checkpointing reads it to decide whether to stash RNG state."""

    @property
    def _initialized(self) -> bool:
        return _C._initialized()


class _DeviceContext:
    """``with torch.pjrt.device(i):`` makes ``i`` the current pjrt device
    inside the block (torch's storage copies and checkpointing use it). A
    device without an index, None or -1 leaves the current device alone."""

    def __init__(self, device):
        self.index = _index_or_none(device)
        self.previous = -1

    def __enter__(self):
        if self.index is not None:
            device_count()  # starts the runtime, with a seed given before
            self.previous = _C._current_device()
            if self.previous != self.index:
                _C._set_device(self.index)
        return self

    def __exit__(self, *exc) -> bool:
        if self.index is not None and self.previous != self.index:
            _C._set_device(self.previous)
        return False


def _index_or_none(device) -> Optional[int]:
    if device is None:
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    d = torch.device(device)
    if d.type != "pjrt":
        raise ValueError(f"expected a pjrt device, got {d}")
    return d.index


def _index(dev) -> int:
    """A device argument as an index; None or an unindexed device: the current
    one. An index this process does not have raises IndexError."""
    return device(_index_or_none(dev)).index


class DeviceProperties(NamedTuple):
    """``torch.pjrt.get_device_properties()``: what PJRT says of a device.
    ``total_memory`` is ``mem_get_info()``'s total (the host's memory on
    XLA's CPU plugin)."""

    name: str
    total_memory: int
    debug_string: str


def _make_device_module() -> types.ModuleType:
    m = _DeviceModule("torch_pjrt.pjrt_device_module")

    def is_available() -> bool:
        try:
            return device_count() > 0
        except Exception:
            return False

    def current_device() -> int:
        _graph_break_here("torch.pjrt.current_device() changes with set_device: "
                          "call it outside the compiled function")
        return _C._current_device()

    def set_device(d) -> None:
        _C._set_device(_index(d))

    def synchronize(d=None) -> None:
        sync(wait=True, devices=None if d is None else [_index(d)])

    def manual_seed_one(seed: int) -> None:
        device_count()
        _C._manual_seed(current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF)

    def initial_seed() -> int:
        device_count()
        return _C._initial_seed(current_device())

    def seed() -> None:
        """Seeds the current device's generator with a non-deterministic
        number (``initial_seed`` says which), as ``torch.cuda.seed``."""
        manual_seed_one(int.from_bytes(secrets.token_bytes(8), "little"))

    def seed_all() -> None:
        """One non-deterministic seed for every device, as ``torch.cuda.seed_all``."""
        manual_seed(int.from_bytes(secrets.token_bytes(8), "little"))

    def get_rng_state(device=None) -> torch.Tensor:
        """The device's random stream position: its Threefry key and counter
        as 16 bytes, little-endian (a uint8 CPU tensor, as CUDA's is)."""
        device_count()
        key, counter = _C._rng_state(_index(device))
        return torch.frombuffer(bytearray(struct.pack("<QQ", key, counter)), dtype=torch.uint8)

    def set_rng_state(state: torch.Tensor, device=None) -> None:
        """Restores a state returned by ``get_rng_state``."""
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
            raise ValueError("a pjrt RNG state is the 16-byte uint8 tensor that get_rng_state returns")
        key, counter = struct.unpack("<QQ", bytes(state.detach().cpu().reshape(-1).tolist()))
        device_count()
        _C._set_rng_state(_index(device), [key, counter])

    def get_rng_state_all() -> List[torch.Tensor]:
        return [get_rng_state(i) for i in range(device_count())]

    def set_rng_state_all(states) -> None:
        for i, state in enumerate(states):
            set_rng_state(state, i)

    def lazy_init() -> None:
        """Called by torch before it creates a tensor on pjrt: starts the
        runtime, so that a missing plugin or a stale extension is reported here."""
        device_count()

    def get_amp_supported_dtype() -> List[torch.dtype]:
        """The dtypes ``torch.autocast("pjrt", dtype=...)`` accepts (torch
        asks whenever it enters autocast on pjrt). The policy, which ops run
        in them and which in float32, is registered by ``_C``
        (csrc/aten/autocast.cc; docs/autocast.md). Empty when ``_C`` could
        not be loaded: torch then warns and runs without autocast."""
        return list(AMP_DTYPES) if _extension.is_loaded(_C) else []

    _constant_under_dynamo(is_available)
    m.is_available = is_available
    m.get_amp_supported_dtype = get_amp_supported_dtype
    m.device_count = device_count
    m.current_device = current_device
    m.set_device = set_device
    m.device = _DeviceContext
    # torch.cuda.device_of: the device of a pjrt tensor's (or storage's) for the block; others change nothing
    m.device_of = lambda obj: _DeviceContext(obj.device if obj.device.type == "pjrt" else None)
    m.synchronize = synchronize
    m.manual_seed = manual_seed_one
    m.manual_seed_all = manual_seed
    m.initial_seed = initial_seed
    m.seed = seed
    m.seed_all = seed_all
    m.get_rng_state = get_rng_state
    m.set_rng_state = set_rng_state
    m.get_rng_state_all = get_rng_state_all
    m.set_rng_state_all = set_rng_state_all
    def _memory(fn_name: str):
        def call(device=None):
            from torch_pjrt import runtime
            return getattr(runtime, fn_name)(_index(device))
        call.__name__ = fn_name
        return call

    # per device: the plugin's statistics where it reports them, else our buffers' sizes
    m.memory_allocated = _memory("memory_allocated")
    m.max_memory_allocated = _memory("max_memory_allocated")
    m.reset_peak_memory_stats = _memory("reset_peak_memory_stats")
    m.memory_stats = _memory("device_memory_stats")
    # No cache of our own: buffers go with their tensors, so there is nothing
    # to empty and what is reserved is what is allocated.
    m.empty_cache = lambda: None
    m.memory_reserved = m.memory_allocated
    m.max_memory_reserved = m.max_memory_allocated
    m.is_bf16_supported = lambda including_emulation=True: True

    def memory_summary(device=None, abbreviated=False) -> str:
        """The device's memory counters as text (``torch.cuda.memory_summary``'s
        place in ported code): our buffers, and the plugin's statistics where
        it reports them."""
        index = _index(device)
        from torch_pjrt import runtime
        lines = [f"pjrt:{index} memory ({get_device_name(index)})"]
        lines += [f"  {name}: {value:,}" for name, value in runtime.device_memory_stats(index).items()]
        free, total = mem_get_info(index)
        lines.append(f"  free / total: {free:,} / {total:,}")
        return "\n".join(lines)

    m.memory_summary = memory_summary

    def get_device_name(device=None) -> str:
        """The plugin's name for the device's kind (PJRT's device
        description): ``"cpu"`` on XLA's CPU plugin, the GPU's model on CUDA."""
        return _C._device_info(_index(device))["kind"]

    def mem_get_info(device=None) -> Tuple[int, int]:
        """(free, total) bytes of the device: from the plugin's
        ``bytes_limit`` and ``bytes_in_use`` where it reports them; on a plugin
        without statistics (XLA's CPU plugin, whose buffers are host memory),
        the host's physical memory and what this process can still get of
        it (the out-of-memory preflight's figure, runtime/program.h)."""
        return tuple(_C._mem_get_info(_index(device)))

    def get_device_properties(device=None) -> DeviceProperties:
        index = _index(device)
        info = _C._device_info(index)
        return DeviceProperties(info["kind"], mem_get_info(index)[1], info["debug_string"])

    m.get_device_name = get_device_name
    m.mem_get_info = mem_get_info
    m.get_device_properties = get_device_properties
    # Streams: one per device (PJRT orders each device's work itself), as
    # torch.Stream objects; the tools that ask an accelerator module for its
    # streams (torch.distributed.checkpoint's writer) find them here.
    def current_stream(device=None) -> torch.Stream:
        return torch.Stream(device=torch.device("pjrt", _index(device)))

    @contextlib.contextmanager
    def stream(s):
        """As ``torch.cuda.stream``: the stream's device is the current one
        inside the block (its stream is the only one)."""
        if s is None:
            yield s
            return
        if s.device.type != "pjrt":
            raise ValueError(f"expected a pjrt stream, got one of {s.device}")
        with _DeviceContext(s.device.index):
            yield s

    m.Stream = torch.Stream
    m.Event = torch.Event
    m.current_stream = current_stream
    m.default_stream = current_stream
    m.stream = stream
    m.is_initialized = lambda: _C._initialized()
    m._is_in_bad_fork = _in_bad_fork
    m._lazy_init = lazy_init
    return m
