"""Data parallelism and collectives.

Two ways to spread work:

- **Many devices, one process.** ``with torch_pjrt.replicated() as r:``
  makes the traced step one program replicated over the local devices;
  ``r.shard(batch)`` gives each replica its slice; collectives below compile
  into that program (``stablehlo.all_reduce`` ...). One executable per step.
- **Many processes** (``torch_pjrt.launch`` or ``torchrun``): one device per
  process; collectives run through the job's torch.distributed group, the
  backend ``"pjrt"`` of ``torch_pjrt.process_group`` (gloo on host copies:
  ``runtime.capabilities()["cross_process_collectives"] == "gloo"``),
  rendezvous through its TCPStore (``MASTER_ADDR``/``MASTER_PORT``).

A peer that dies makes the others fail: collectives time out after
``TORCH_PJRT_DIST_TIMEOUT`` seconds (default 60) and ``launch`` reports the
rank that died and stops the rest.
"""

from __future__ import annotations

import datetime
import operator
import os
import socket
from typing import Callable, Iterable, List, Optional, Sequence

import torch

from torch_pjrt import _C, _device, runtime

_OPS = {"sum", "max", "min"}
_TAG_BYTES = 256  # rendezvous: a length byte and the tag's UTF-8 bytes


# ---------------------------------------------------------------- topology


def _multiprocess() -> bool:
    return runtime.process_count() > 1


def _replicas() -> int:
    return _C._replicas() if _C._initialized() else 1


def collective_size() -> int:
    """How many participants a collective called here reduces over: the
    replicas of the enclosing replicated region, else the processes of the job.
    (``torch_pjrt.runtime.world_size()`` is always the process count.)"""
    return _replicas() if _replicas() > 1 else runtime.process_count()


def timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=runtime.options()["dist_timeout_s"])


def init_process_group() -> None:
    """Joins the job's process group (done on first use by every call below):
    torch.distributed's backend ``"pjrt"`` (``torch_pjrt.process_group``),
    gloo on host copies, so that other code's ``torch.distributed`` calls on
    pjrt tensors work in it too."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    o = runtime.options()
    if not o["master_addr"] or not o["master_port"]:
        raise RuntimeError(
            "multi-process collectives need MASTER_ADDR and MASTER_PORT: start the job with torch_pjrt.launch or torchrun")
    _dist_call("init_process_group", lambda: _within_deadline(lambda: dist.init_process_group(
        "pjrt", rank=runtime.process_index(), world_size=runtime.process_count(), timeout=timeout()), o))


def _within_deadline(fn: Callable, o: dict):
    """``fn()`` on a thread of its own, waited for at most the timeout plus
    5 s. TCPStore's handshake has no deadline: a rank that reaches a
    listener which accepts and never answers (another service on
    MASTER_PORT) would wait forever inside it. The stuck thread is left to
    the process's exit."""
    import threading

    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="torch_pjrt rendezvous", daemon=True)
    t.start()
    t.join(timeout().total_seconds() + 5)
    if t.is_alive():
        raise RuntimeError(
            f"joining the job of WORLD_SIZE={o['world_size']} at MASTER_ADDR={o['master_addr']} "
            f"MASTER_PORT={o['master_port']} did not finish within {timeout().total_seconds() + 5:g}s: the "
            "processes may disagree on WORLD_SIZE, one may not have started, or another service may be listening "
            "on that port")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _check_op(op: str) -> str:
    if op not in _OPS:
        raise ValueError(f"reduction must be one of {sorted(_OPS)}, got {op!r}")
    return op


def _check_scale(tensor: torch.Tensor, scale) -> None:
    """A scale the tensor's dtype cannot hold (0.5 for an integer tensor) is
    PyTorch's error for ``tensor.mul_(scale)``, in one process as in many
    (the program would otherwise truncate it)."""
    result = torch.result_type(tensor, scale)
    if scale != 1 and not torch.can_cast(result, tensor.dtype):
        raise RuntimeError(f"result type {str(result).removeprefix('torch.')} can't be cast to the desired output "
                           f"type {str(tensor.dtype).removeprefix('torch.')}: scale={scale!r} on a {tensor.dtype} tensor")


def _gloo_op(op: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]


def _dist_call(what: str, fn: Callable, *tensors: torch.Tensor):
    """Runs the torch.distributed call `fn`, naming this rank and the timeout
    in its errors. Host `tensors` made here stay held from C++ until gloo's
    thread has let go of them (see _hold_for_collective in
    csrc/aten/collectives.h: else that thread may abort the process at exit);
    the job's process group holds the host copies of pjrt tensors itself."""
    if tensors:
        _C._hold_for_collective(list(tensors))
    try:
        return fn()
    except (RuntimeError, ValueError) as e:  # gloo errors; store timeouts (DistStoreError)
        raise RuntimeError(
            f"torch_pjrt.distributed.{what} failed on rank {runtime.process_index()} of {runtime.process_count()}: "
            f"{e}. A peer process may have died or timed out ({_timeout_words()})."
        ) from e


def _timeout_words() -> str:
    """The timeout the job's process group waits: TORCH_PJRT_DIST_TIMEOUT for
    the group made here, the script's own for one it made itself."""
    import torch.distributed as dist

    from torch_pjrt.process_group import ProcessGroupPjrt

    if dist.is_initialized() and not isinstance(dist.group.WORLD, ProcessGroupPjrt):
        return ("the timeout of the process group the script made, init_process_group(timeout=...), 30 minutes by "
                "default; TORCH_PJRT_DIST_TIMEOUT sets the group torch_pjrt makes when there is none")
    return f"TORCH_PJRT_DIST_TIMEOUT={timeout().total_seconds():g}s"


def _group_takes(tensor: torch.Tensor) -> bool:
    """Whether the job's group takes `tensor` as it is: any tensor in the
    group of backend "pjrt" (torch_pjrt.process_group stages pjrt tensors
    through the host), only CPU tensors in a group the script made itself
    (``init_process_group("gloo")`` before the first call here)."""
    import torch.distributed as dist

    from torch_pjrt.process_group import ProcessGroupPjrt

    return tensor.device.type == "cpu" or isinstance(dist.group.WORLD, ProcessGroupPjrt)


def _in_place(what: str, tensor: torch.Tensor, fn: Callable) -> None:
    """``fn(t)`` changes ``t`` in place through the job's group: ``tensor``
    itself, or in a group that cannot take it, a host copy written back."""
    if _group_takes(tensor):
        _dist_call(what, lambda: fn(tensor.detach()))
        return
    host = tensor.detach().cpu()
    _dist_call(what, lambda: fn(host), host)
    with torch.no_grad():
        tensor.copy_(host)


# -------------------------------------------------------------- collectives


def all_reduce(tensor: torch.Tensor, op: str = "sum", scale: float = 1.0) -> torch.Tensor:
    """In place: the reduction of ``tensor`` over all participants, times ``scale``."""
    _check_op(op)
    _check_scale(tensor, scale)
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        _in_place("all_reduce", tensor, lambda t: dist.all_reduce(t, op=_gloo_op(op)))
        if scale != 1.0:
            with torch.no_grad():
                tensor.mul_(scale)
        return tensor
    with torch.no_grad():
        _C._all_reduce_(tensor, op, float(scale))
    return tensor


def all_gather(tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The participants' tensors concatenated along ``dim`` (a new tensor)."""
    if tensor.dim() == 0:
        raise ValueError("all_gather concatenates along a dimension: a 0-d tensor has none (gather t.reshape(1))")
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        takes = _group_takes(tensor)
        mine = tensor.detach().contiguous() if takes else tensor.detach().cpu().contiguous()
        parts = [torch.empty_like(mine) for _ in range(runtime.process_count())]
        _dist_call("all_gather", lambda: dist.all_gather(parts, mine), *([] if takes else [mine, *parts]))
        return torch.cat(parts, dim).to(tensor.device)
    return _C._all_gather(tensor, dim)


def reduce_scatter(tensor: torch.Tensor, dim: int = 0, scale: float = 1.0) -> torch.Tensor:
    """The sum over participants, split along ``dim``; participant i keeps part i."""
    _check_scale(tensor, scale)
    if _multiprocess():
        n = runtime.process_count()
        if tensor.size(dim) % n:  # as in one process (the program's own check)
            raise ValueError(f"reduce_scatter: dimension {dim} of size {tensor.size(dim)} does not divide into "
                             f"{n} equal parts, one per participant")
        full = all_reduce(tensor.detach().clone(), "sum", scale)
        return full.chunk(n, dim)[runtime.process_index()].clone()
    return _C._reduce_scatter(tensor, dim, float(scale))


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """In place: every participant gets participant ``src``'s value."""
    if not 0 <= src < collective_size():
        raise ValueError(f"broadcast: src {src} is not a participant (0 to {collective_size() - 1})")
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        _in_place("broadcast", tensor, lambda t: dist.broadcast(t, src))
        return tensor
    with torch.no_grad():
        _C._broadcast_(tensor, src)
    return tensor


def barrier() -> None:
    """Waits for every process (no-op in one process)."""
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        _device.sync(wait=True)
        _dist_call("barrier", dist.barrier)


def rendezvous(tag: str) -> None:
    """A named barrier: every process must reach the same tag."""
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        # The tag's bytes in tensors made here, so that they can be held (see
        # _dist_call); all_gather_object's own tensors could not be.
        raw = tag.encode()
        if len(raw) > _TAG_BYTES - 1:
            raise ValueError(f"rendezvous tag longer than {_TAG_BYTES - 1} bytes: {tag!r}")
        mine = torch.zeros(_TAG_BYTES, dtype=torch.uint8)
        mine[0] = len(raw)
        mine[1:1 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        parts = [torch.empty_like(mine) for _ in range(runtime.process_count())]
        _dist_call("rendezvous", lambda: dist.all_gather(parts, mine), mine, *parts)
        tags = [bytes(p[1:1 + int(p[0])].tolist()).decode(errors="replace") for p in parts]
        if any(t != tag for t in tags):
            raise RuntimeError(f"rendezvous mismatch: processes reached {tags}")


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Copies rank 0's (replica 0's) parameters and buffers to every participant."""
    for t in list(model.parameters()) + list(model.buffers()):
        broadcast(t.data if isinstance(t, torch.nn.Parameter) else t, 0)


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """In place: each gradient of the optimizer's parameters becomes its mean over participants.

    Across processes, a parameter that some processes left unused (a branch
    or an expert this rank's batch did not take) has no gradient there: the
    processes first agree on which parameters have one anywhere (one small
    all-reduce), and a missing gradient counts as zeros in the mean. A
    parameter without a gradient on every process keeps none."""
    reduce_parameter_gradients([p for group in optimizer.param_groups for p in group["params"]])


def reduce_parameter_gradients(params: Sequence[torch.Tensor]) -> None:
    """:func:`reduce_gradients` for a list of parameters (a module's, for a
    strategy that averages after each backward, as DDP does)."""
    n = collective_size()
    if n <= 1:
        return
    params = list(params)
    if _multiprocess():
        import torch.distributed as dist

        init_process_group()
        have = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        _dist_call("reduce_gradients", lambda: dist.all_reduce(have, dist.ReduceOp.MAX), have)
        for p, anywhere in zip(params, have.tolist()):
            if anywhere and p.grad is None:
                p.grad = torch.zeros_like(p)
        params = [p for p, anywhere in zip(params, have.tolist()) if anywhere]
    for p in params:
        if p.grad is not None:
            all_reduce(p.grad, "sum", 1.0 / n)


def optimizer_step(optimizer: torch.optim.Optimizer, **step_kwargs):
    """All-reduces the gradients (mean over participants), then steps."""
    reduce_gradients(optimizer)
    return optimizer.step(**step_kwargs)


# ------------------------------------------------- one process, many devices


class replicated:
    """Context in which the traced work of pjrt device 0 is one program
    replicated over ``devices`` local devices (default: all).

        with torch_pjrt.replicated() as r:
            model = model.to(r.device)
            x, y = r.shard(inputs), r.shard(labels)
            loss = loss_fn(model(x), y); loss.backward()
            torch_pjrt.distributed.optimizer_step(opt)   # all-reduce mean inside the program
            torch_pjrt.sync()

    Tensors read back on the host (``.cpu()``, ``.item()``) give replica 0's
    value; ``values(t)`` gives every replica's. Every replica starts from the
    same random state.
    """

    def __init__(self, devices: Optional[int] = None):
        self.n = devices if devices is not None else runtime.addressable_device_count()
        if self.n < 1 or self.n > runtime.addressable_device_count():
            raise ValueError(f"cannot replicate over {self.n} devices: this process has "
                             f"{runtime.addressable_device_count()} pjrt device(s)")
        if _multiprocess():
            raise RuntimeError("replicated() is for one process; multi-process jobs use one device per process")

    @property
    def device(self) -> torch.device:
        return torch.device("pjrt", 0)

    def __enter__(self) -> "replicated":
        self._previous = _replicas()
        if self._previous > 1 and self.n > 1 and self._previous != self.n:
            # the inner programs would read each per-replica tensor of the
            # outer region (its shards) as replica 0's value on every replica
            raise RuntimeError(f"replicated({self.n}) inside a replicated({self._previous}) region: a nested region "
                               "must replicate over as many devices as the outer one")
        _C._set_replicas(self.n)
        return self

    def __exit__(self, *exc) -> None:
        _C._set_replicas(self._previous)  # nested regions restore the outer one

    def shard(self, batch: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Splits a host tensor into one equal slice per replica along ``dim``."""
        if batch.dim() == 0:
            raise ValueError("shard splits a tensor along a dimension: a 0-d tensor has none")
        if not -batch.dim() <= dim < batch.dim():
            raise IndexError(f"shard: dim {dim} is out of range for a tensor of {batch.dim()} dimension(s)")
        if batch.shape[dim] % self.n:
            raise ValueError(f"cannot split size {batch.shape[dim]} of dim {dim} into {self.n} equal replica slices")
        return _C._shard([p.contiguous() for p in batch.detach().cpu().chunk(self.n, dim)])

    def values(self, tensor: torch.Tensor) -> List[torch.Tensor]:
        """The tensor's value on every replica, as CPU tensors."""
        _device.sync()
        return list(_C._replica_values(tensor))


def replicate(fn: Callable, *args, devices: Optional[int] = None, **kwargs):
    """Runs ``fn(*args, **kwargs)`` as one program replicated over the local
    devices and launches it; ``fn`` shards its inputs with the region it gets
    as keyword ``region``."""
    with replicated(devices) as r:
        out = fn(*args, region=r, **kwargs)
        _device.sync()
    return out


# ---------------------------------------------------------- many processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_env(n: int, master_addr: str, master_port: str) -> dict:
    """The torchrun environment of a job of ``n`` processes on this host, one
    device each (what :func:`launch` gives its processes; the Lightning
    strategy ``pjrt_ddp`` gives its processes the same)."""
    o = runtime.options()
    env = {
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "GROUP_RANK": "0",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
        "_TPJ_RANK_BASE": "0",
    }
    if o["device"] in ("", "CPU") and o["cpu_device_count"] is None:
        env["CPU_NUM_DEVICES"] = "1"
    return env


def _enter_job(env: dict, local_rank: int) -> None:
    """In a started process, before anything opens a device: its place in the job."""
    os.environ.update(env)
    os.environ["RANK"] = str(int(env.get("_TPJ_RANK_BASE", "0")) + local_rank)
    os.environ["LOCAL_RANK"] = str(local_rank)


def _child(local_rank: int, fn: Callable, args: Sequence, env: dict) -> None:
    _enter_job(env, local_rank)
    fn(*args)
    _leave_process_group()


def _leave_process_group() -> None:
    """After a rank's function returned: its programs finished, then the gloo
    group torch_pjrt joined is destroyed while the interpreter is whole. Not
    after a failure: destroying could then wait on peers that will never
    come."""
    import torch.distributed as dist

    _C._await_launched()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _default_nprocs() -> int:
    """One process per local device, counted without opening the devices in
    this (parent) process when possible: a GPU or TPU plugin would hold them."""
    if _C._initialized():
        return runtime.addressable_device_count()
    o = runtime.options()
    if o["device"] in ("", "CPU") and not o["plugin"]:
        return o["cpu_device_count"] or 4  # the CPU plugin's default device count
    raise ValueError("torch_pjrt.launch needs nprocs= on this platform (counting devices here would open them "
                     "in the parent process)")


def launch(fn: Callable, args: Iterable = (), nprocs: Optional[int] = None, start_method: str = "spawn") -> None:
    """Runs ``fn(*args)`` in ``nprocs`` processes on this host (default: one
    per local device), with the torchrun environment set, one device each.
    Under torchrun (``WORLD_SIZE`` already set) it just calls ``fn``.

    If a process dies or raises, the others are stopped and the error names
    its rank."""
    if nprocs is not None:  # (numpy's integers too)
        count = operator.index(nprocs) if hasattr(nprocs, "__index__") and not isinstance(nprocs, bool) else 0
        if count < 1:
            raise ValueError(f"torch_pjrt.launch: nprocs must be a positive number of processes, got {nprocs!r}")
        nprocs = count
    o = runtime.options()
    if o["torchrun"]:
        fn(*args)
        return
    import torch.multiprocessing as mp

    n = nprocs or _default_nprocs()
    env = _job_env(n, o["master_addr"] or "127.0.0.1", o["master_port"] or str(_free_port()))
    ctx = mp.start_processes(_child, args=(fn, tuple(args), env), nprocs=n, join=False, start_method=start_method)
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        # a SIGINT sent to this process alone (kill -INT, an IDE's stop
        # button), not to its group as a terminal's Ctrl-C is: stop the ranks
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(10)
        raise
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"torch_pjrt.launch: rank {e.error_index} died (exit code {e.exit_code}); "
                           f"the other {n - 1} process(es) were stopped") from None
    except mp.ProcessRaisedException as e:
        raise RuntimeError(f"torch_pjrt.launch: rank {e.error_index} raised:\n{e}") from None
