"""A ``torch.distributed`` backend named ``"pjrt"``.

``torch.distributed.init_process_group("pjrt")`` (or with no backend, the
pjrt device being PyTorch's accelerator) makes a process group whose
collectives take pjrt tensors as well as CPU tensors, so that code written
for ``torch.distributed`` runs unchanged: ``DistributedDataParallel``,
``dist.all_reduce`` in a training script, torchmetrics' cross-process sync.

Each collective runs through gloo on host copies, as the rest of
``torch_pjrt.distributed`` does across processes: the pjrt tensors are
read (which runs their pending work), gloo reduces the copies, and the
results are written back into the same pjrt tensors (views included, such as
DDP's gradient buckets). The returned work is complete: gloo's own timeout
(``TORCH_PJRT_DIST_TIMEOUT`` through ``torch_pjrt.distributed``, else the
``timeout`` given to ``init_process_group``) bounds a wait for a dead peer.
CPU tensors go to gloo unchanged.
"""

from __future__ import annotations

import datetime
import functools
import sys
import time
from typing import Any, List

import torch
import torch.distributed as dist

from torch_pjrt import _C, _device

NAME = "pjrt"

# The collectives of torch.distributed's ProcessGroup, by the names its Python
# API and DDP's C++ reducer call them, and the name of gloo's method for each
# (gloo is a Backend: some have older names there). The first argument is
# where results land (c10d's convention); every other tensor is only read.
_COLLECTIVES = {
    name: name for name in (
        "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base", "broadcast",
        "reduce", "reduce_scatter", "_reduce_scatter_base", "gather", "scatter", "alltoall", "alltoall_base",
        "send", "recv", "recv_anysource")
}
_COLLECTIVES.update(all_gather_single="_allgather_base", reduce_scatter_single="_reduce_scatter_base",
                    all_to_all_single="alltoall_base")
# Collectives whose first argument is only written: their pjrt outputs need
# host buffers, not host copies (a read would run and transfer them).
_WRITE_ONLY = {
    "allgather", "allgather_coalesced", "_allgather_base", "all_gather_single", "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
    "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", "gather", "scatter", "alltoall",
    "alltoall_base", "all_to_all_single", "recv", "recv_anysource",
}
_POINT_TO_POINT = {"send", "recv", "recv_anysource"}
# Coalesced forms gloo lacks: one single-tensor call per (output, input) pair.
_PAIRWISE = {
    "all_gather_single_coalesced": "_allgather_base", "allgather_into_tensor_coalesced": "_allgather_base",
    "reduce_scatter_single_coalesced": "_reduce_scatter_base", "reduce_scatter_tensor_coalesced": "_reduce_scatter_base",
}


def _on_pjrt(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == NAME


def _staged(t: torch.Tensor) -> bool:
    """Whether gloo gets a contiguous host copy of `t` rather than `t`
    (sparse tensors go to gloo as they are)."""
    return _on_pjrt(t) or (t.layout == torch.strided and not t.is_contiguous())


def _name_rank(e: BaseException, what: str, group) -> None:
    """Prefixes gloo's error (its own type kept: DistBackendError, ...) with
    the collective and this rank."""
    e.args = (f"torch.distributed {what} failed on rank {group.rank()} of {group.size()}: {e}", *e.args[1:])


_SLICE = datetime.timedelta(milliseconds=50)


def _await(start, backend) -> None:
    """``start().wait()`` for a collective that ``start`` enqueues on the
    gloo ``backend``, which Ctrl-C interrupts. gloo's wait does not look at
    signals: a collective waiting for a slow peer would raise
    KeyboardInterrupt only when it returned (the peer came, or the group's
    timeout ran out). It is waited for in slices of 50 ms instead, and a
    SIGINT's handler runs between two (Python runs it in the main thread
    once a slice returns).

    An abandoned collective goes on in gloo's thread, its results unwritten:
    its host buffers stay held for that thread (_hold_for_collective), and
    the backend is never destroyed, since its destructor would wait for the
    collective at exit.

    Collectives only: a timed-out slice of a collective's wait leaves the
    work running (c10d's Work::wait), while one of a receive's (gloo's
    RecvWork) would end the receive with a timeout."""
    try:
        work = start()  # (a SIGINT during the enqueue is raised as it returns)
        while True:
            try:
                work.wait(_SLICE)
                return
            except RuntimeError:
                pass  # (no call here: a KeyboardInterrupt gets no "Operation timed out!" as its context)
            if work.is_completed():
                break
    except RuntimeError:
        raise  # gloo refused the call: nothing runs (the slices' own are caught above)
    except BaseException:  # KeyboardInterrupt, from a SIGINT's handler
        _C._keep_until_exit(backend)
        raise
    work.wait()  # raises gloo's own error


def _map(x: Any, fn):
    """``fn`` applied to every tensor of a (nested) list argument."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return [_map(v, fn) for v in x]
    return x


def _tensors(x: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    _map(x, out.append)
    return out


def _outside_dynamo(fn):
    """``fn`` run with Dynamo off. Under ``torch.compile`` of a DDP model,
    Dynamo runs DDP's bucket rebuild eagerly (a graph break) with its frame
    hook still set, and the rebuild's C++ broadcast calls this group's Python
    method: Dynamo would then trace the method's frame and fail on the process
    group (an opaque object to it). torch._dynamo is used only when something
    has imported it already (importing it costs about a second)."""
    disabled = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(fn, recursive=True))
        return disabled[0](*args, **kwargs)

    return call


# torch builds without torch.distributed (some macOS wheels) have no
# ProcessGroup to derive from: then there is no backend to register.
_Base = dist.ProcessGroup if dist.is_available() else object


class ProcessGroupPjrt(_Base):
    """The process group ``init_process_group("pjrt")`` makes: gloo on host
    copies for pjrt tensors (and non-contiguous CPU tensors), gloo itself for
    CPU tensors."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        # gloo as this group's CPU backend: c10d keeps a group's name on its
        # backends (torch.compile's DDP looks the group up by name), and what
        # this class does not override reaches gloo for CPU tensors.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return NAME

    def _collective(self, what: str, *args):
        tensors = [t for a in args for t in _tensors(a)]
        opts = args[-1] if args else None
        # ReduceOp.AVG (Lightning's mean of logged values on a backend not
        # named gloo): gloo's sum, then the division here, integers as
        # NCCL's average does them (truncated).
        avg = getattr(opts, "reduceOp", None) == dist.ReduceOp.AVG
        if not avg and not any(_staged(t) for t in tensors):
            return self._gloo_call(what, *args)  # the caller's CPU tensors, as gloo alone takes them
        # A contiguous host tensor (as gloo needs) for each pjrt tensor, and
        # for each non-contiguous CPU tensor (gloo would write that one as if
        # it were contiguous: all_reduce of y[:, 1::2] wrote y[0, :4]): a copy
        # of what the collective reads (the read of a pjrt tensor runs its
        # pending work), an empty buffer for what it only writes.
        pairs = []

        def on_host(read: bool):
            def to_host(t: torch.Tensor) -> torch.Tensor:
                if not _staged(t):
                    return t
                h = t.detach().cpu().contiguous() if read else torch.empty(t.shape, dtype=t.dtype)
                pairs.append((t, h))
                return h

            return to_host

        host_args = [_map(a, on_host(k > 0 or what not in _WRITE_ONLY)) for k, a in enumerate(args)]
        _C._hold_for_collective([h for _, h in pairs])  # see torch_pjrt.distributed._dist_call
        if what in _POINT_TO_POINT:
            # Not waited for here: a ring of isend/irecv (batch_isend_irecv)
            # needs every rank's send posted before any completes. A receive
            # writes into its pjrt tensors when it is waited for.
            work = self._gloo_call(what, *host_args)
            return work if what == "send" else _Receive(self, work, pairs, args[0])
        if avg:
            opts.reduceOp = dist.ReduceOp.SUM
        try:
            _await(lambda: self._gloo_call(what, *host_args), self._gloo)
        except RuntimeError as e:
            _name_rank(e, what, self)
            raise
        finally:
            if avg:
                opts.reduceOp = dist.ReduceOp.AVG
        with torch.no_grad():
            if avg:
                for h in _tensors(host_args[0]):
                    h.copy_(h.div(self.size(), rounding_mode=None if h.is_floating_point() else "trunc"))
            written = {id(h) for h in _tensors(host_args[0])}
            for t, h in pairs:
                if id(h) in written:
                    t.copy_(h)
        return _completed(args[0])

    def _gloo_call(self, what: str, *args):
        if what in _PAIRWISE:
            outputs, inputs, opts = args
            for o, i in zip(outputs, inputs):
                _await(lambda: self._gloo_call(_PAIRWISE[what], o, i, opts), self._gloo)
            return _completed(outputs)
        name = _COLLECTIVES[what]
        if name in ("_allgather_base", "_reduce_scatter_base"):
            # The flat tensor of the world's parts may have any shape of the
            # right size (NCCL's reading; nn.SyncBatchNorm gathers into
            # [1, world * n]): gloo wants the parts stacked along dim 0.
            out, inp, opts = args
            flat, part = (out, inp) if name == "_allgather_base" else (inp, out)
            stacked = [self.size() * part.size(0), *part.shape[1:]] if part.dim() else [self.size()]
            if flat.is_contiguous() and flat.numel() == self.size() * part.numel():
                flat = flat.view(stacked)
            args = (flat, inp, opts) if name == "_allgather_base" else (out, flat, opts)
        return getattr(self._gloo, name)(*args)

    def _get_backend(self, device):
        # init_process_group(device_id=torch.device("pjrt", i)) (PyTorch's
        # DDP tutorial) and new_group ask the bound device's backend whether
        # it can split communicators: this group's pjrt collectives are the
        # methods above, with no C++ backend to ask, and it does not split.
        if torch.device(device).type == NAME:
            return _NO_SPLIT
        return super()._get_backend(device)

    def shutdown(self) -> None:  # destroy_process_group
        self._gloo.shutdown()

    def abort(self) -> None:
        self._gloo.abort()

    @_outside_dynamo
    def barrier(self, opts=None):
        _device.sync(wait=True)  # the work queued before the barrier is done when it returns
        try:  # (async_op=True too: a barrier's work is done when it returns)
            _await(lambda: self._gloo.barrier(opts) if opts is not None else self._gloo.barrier(), self._gloo)
        except RuntimeError as e:
            _name_rank(e, "barrier", self)
            raise
        return _completed([])


class _NoSplit:
    """What this group answers for its pjrt "backend": no communicator
    splitting, no coalescing, no time estimates."""

    supports_splitting = supports_coalescing = supports_time_estimate = False

    def name(self) -> str:
        return NAME


_NO_SPLIT = _NoSplit()


class _Receive(dist._Work if dist.is_available() else object):
    """A receive into pjrt tensors: gloo's work on host buffers, written into
    the pjrt tensors when it is waited for (or found completed)."""

    def __init__(self, group: "ProcessGroupPjrt", work, pairs, result):
        super().__init__()
        self._group, self._work, self._pairs, self._result, self._done = group, work, pairs, result, False

    def wait(self, timeout=None) -> bool:
        if not self._done:
            try:
                self._work.wait() if timeout is None else self._work.wait(timeout)
            except RuntimeError as e:
                _name_rank(e, "recv", self._group)
                raise
            with torch.no_grad():
                for t, h in self._pairs:
                    t.copy_(h)
            self._done = True
        return True

    def is_completed(self) -> bool:
        # a finished receive is written into its pjrt tensors before it
        # says so (a failed one says so, and raises at wait())
        if not self._done and self._work.is_completed() and self._work.is_success():
            self.wait()
        return self._done or self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def source_rank(self) -> int:
        return self._work.source_rank()

    _source_rank = source_rank

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        # the future of a finished receive (c10d gives no hook to write the
        # pjrt tensors when gloo's future completes): asking for it waits
        self.wait()
        return _completed(self._result).get_future()


def _completed(result):
    """A finished c10d Work whose future holds ``result``."""
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _bind(what: str):
    def collective(self, *args):
        return self._collective(what, *args)

    collective.__name__ = what
    collective.__doc__ = f"``{what}`` on host copies of pjrt tensors (gloo for CPU tensors)."
    return _outside_dynamo(collective)


for _what in (*_COLLECTIVES, *_PAIRWISE):
    setattr(ProcessGroupPjrt, _what, _bind(_what))


def _create(store, rank: int, size: int, timeout) -> ProcessGroupPjrt:
    return ProcessGroupPjrt(store, rank, size, timeout)


def register() -> None:
    """Registers the backend with torch.distributed (done by ``import torch_pjrt``)."""
    if dist.is_available() and NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu", NAME])
