"""Printing a ``pjrt`` tensor reads on the host only what is printed.

torch's printing (``torch/_tensor_str.py``) formats a tensor with tensor
ops: a ``masked_select`` of the finite values, their minimum and maximum,
one ``.item()`` per printed element. On a lazy device each of those is a
program of its own: ``print(loss)`` ran 5 programs and compiled one every
time (27 ms warm), a summarized 64x64x64x64 tensor 435 programs (0.2 s).
torch copies ``xla`` and ``lazy`` tensors to the CPU before printing for
that reason, and has no such hook for a PrivateUse1 device, so this module
wraps ``torch._tensor_str._str_intern`` and hands it the contents formatted
from a CPU copy; the prefix and the suffixes (device, dtype, grad_fn) still
come from the ``pjrt`` tensor, so the text is the CPU's with the device
named.

What is copied: the whole tensor when it is not summarized (at most
``threshold`` elements, ``torch.set_printoptions``); otherwise only the
``edgeitems`` first and last indices of each dimension longer than twice
that (one device program, cached per shape), placed at their indices in an
uninitialized CPU tensor of the full shape, of which torch's printing reads
no other element (``get_summarized_data`` and the formatter visit these
indices alone). Where that host tensor cannot be allocated (larger than
the host's memory), torch's own path runs on the device.
"""

from __future__ import annotations

import torch
import torch._tensor_str as _tensor_str

_installed = False


def _edges_on_host(t: torch.Tensor) -> torch.Tensor | None:
    """A CPU tensor of ``t``'s shape equal to ``t`` at every index torch's
    summarized printing reads (see the module's docstring), or None where
    the host cannot allocate that shape."""
    e = _tensor_str.PRINT_OPTS.edgeitems
    if e == 0:  # only "..." is printed: no value is needed (torch's formatter reads them all, as on the CPU)
        return torch.zeros((), dtype=t.dtype).expand(t.shape)
    summarized = [d for d in range(t.dim()) if t.size(d) > 2 * e]
    edges = t
    for d in summarized:
        n = edges.size(d)
        edges = torch.cat([edges.narrow(d, 0, e), edges.narrow(d, n - e, e)], d)
    edges = edges.cpu().resolve_conj().resolve_neg()
    if not summarized:
        return edges
    fill = torch.utils.deterministic.fill_uninitialized_memory  # deterministic mode would fill every page
    try:
        torch.utils.deterministic.fill_uninitialized_memory = False
        host = torch.empty(t.shape, dtype=edges.dtype)  # untouched pages cost no memory
    except RuntimeError as error:
        if "DefaultCPUAllocator" not in str(error):
            raise
        return None
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
    index = []
    for d in range(t.dim()):
        n = t.size(d)
        i = torch.arange(n) if n <= 2 * e else torch.cat([torch.arange(e), torch.arange(n - e, n)])
        shape = [1] * t.dim()
        shape[d] = -1
        index.append(i.view(shape))
    target, source = host, edges
    if host.dtype in _UNSIGNED_AS_SIGNED:  # the CPU's index_put has no kernel for these: write their bits
        target, source = host.view(_UNSIGNED_AS_SIGNED[host.dtype]), edges.view(_UNSIGNED_AS_SIGNED[host.dtype])
    target[tuple(index)] = source
    return host


_UNSIGNED_AS_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _contents(inp: torch.Tensor) -> str | None:
    """The text torch prints between ``tensor(`` and the suffixes, formatted
    from a CPU copy, or None where torch's own path should run."""
    if (type(inp) is not torch.Tensor and type(inp) is not torch.nn.Parameter) or inp.device.type != "pjrt":
        return None
    if torch._C._functorch.is_functorch_wrapped_tensor(inp) or inp.is_nested or inp.layout != torch.strided:
        return None
    t = torch.autograd.forward_ad.unpack_dual(inp).primal
    if not all(isinstance(n, int) for n in t.shape):  # symbolic sizes (printed while Dynamo traces): torch's path
        return None
    if t.numel() == 0:
        return None
    if t.numel() <= _tensor_str.PRINT_OPTS.threshold:
        host = t.cpu().resolve_conj().resolve_neg()
    else:
        host = _edges_on_host(t)
    if host is None:
        return None  # torch's path, on the device
    return _tensor_str._tensor_str(host, len("tensor("))


def install() -> None:
    """Wraps torch's printing once (see the module's docstring)."""
    global _installed
    if _installed:
        return
    original = _tensor_str._str_intern

    def _str_intern(inp, *, tensor_contents=None):
        if tensor_contents is None:
            tensor_contents = _contents(inp)
        return original(inp, tensor_contents=tensor_contents)

    _str_intern.__wrapped__ = original
    _tensor_str._str_intern = _str_intern
    _installed = True
