"""SPMD sharding: one program over a mesh of devices, split by XLA's partitioner.

    mesh = spmd.Mesh((4,), ("data",))
    x = spmd.distribute(batch, mesh, ("data", None))      # rows split over 4 devices
    model = spmd.shard_module(model, mesh, "data")        # FSDP-style: parameters split too
    loss = loss_fn(model(x), y); loss.backward(); opt.step(); torch_pjrt.sync()

A sharded tensor lives on its mesh's first device (``mesh.device``); its
storage is backed by one buffer per mesh device holding that device's piece.
The pending work of that device compiles as one program with
``num_partitions`` = mesh size; XLA inserts the collectives. See docs/spmd.md.
"""

from __future__ import annotations

import math
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from torch_pjrt import _C, _device

__all__ = [
    "Mesh",
    "Sharding",
    "distribute",
    "distribute_module",
    "mark_sharding",
    "shard_bytes",
    "shard_module",
    "sharding_of",
    "spmd_in_use",
    "with_sharding_constraint",
]

SpecEntry = Union[None, str, Tuple[str, ...]]


class Mesh:
    """A logical array of local pjrt devices with named axes.

    ``Mesh((2, 2), ("data", "model"))`` puts pjrt:0..3 in row-major order:
    ``devices`` (a flat list of indices or ``torch.device``) picks others.
    """

    def __init__(self, shape: Union[int, Sequence[int]], axis_names: Union[str, Sequence[str]],
                 devices: Optional[Iterable[Union[int, torch.device]]] = None):
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if len(shape) != len(axis_names):
            raise ValueError(f"a mesh of shape {shape} needs {len(shape)} axis names, got {axis_names}")
        if len(set(axis_names)) != len(axis_names) or not all(isinstance(a, str) and a for a in axis_names):
            raise ValueError(f"mesh axis names must be distinct non-empty strings, got {axis_names}")
        if any(s < 1 for s in shape):
            raise ValueError(f"mesh dimensions must be >= 1, got {shape}")
        n = math.prod(shape)
        available = _device.device_count()
        if devices is None:
            if n > available:
                from torch_pjrt import runtime

                procs = runtime.process_count()
                hint = (f"a mesh spans the devices of one process; a mesh over the job's {procs} processes is not "
                        "supported (docs/spmd.md, 'Many processes')" if procs > 1 else
                        f"the CPU plugin: set CPU_NUM_DEVICES={n} before the first use")
                raise ValueError(f"a mesh of shape {shape} needs {n} devices, but this process has {available} "
                                 f"pjrt device(s) ({hint})")
            devices = list(range(n))
        else:
            devices = [_index(d) for d in devices]
            if len(devices) != n:
                raise ValueError(f"a mesh of shape {shape} needs {n} devices, got {len(devices)}: {devices}")
            bad = [d for d in devices if d < 0 or d >= available]
            if bad:
                raise ValueError(f"mesh devices {bad} do not exist: this process has {available} pjrt device(s)")
            if len(set(devices)) != n:
                raise ValueError(f"a mesh lists a device twice: {devices}")
        self.shape: Tuple[int, ...] = shape
        self.axis_names: Tuple[str, ...] = axis_names
        self.device_ids: List[int] = devices  # row-major over the mesh axes: mesh position -> pjrt index

    @property
    def size(self) -> int:
        return len(self.device_ids)

    @property
    def device(self) -> torch.device:
        """Where this mesh's tensors report to be: its first device."""
        return torch.device("pjrt", self.device_ids[0])

    def axis_size(self, name: str) -> int:
        return self.shape[self.axis_names.index(name)]

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and (self.shape, self.axis_names, self.device_ids) == (
            other.shape, other.axis_names, other.device_ids)

    def __hash__(self) -> int:
        return hash((self.shape, self.axis_names, tuple(self.device_ids)))

    def __repr__(self) -> str:
        return f"Mesh({self.shape}, {self.axis_names}, devices={self.device_ids})"


def _index(d: Union[int, torch.device, str]) -> int:
    if isinstance(d, int):
        return d
    d = torch.device(d)
    if d.type != "pjrt":
        raise ValueError(f"mesh devices must be pjrt devices, got {d}")
    return d.index or 0


class Sharding(NamedTuple):
    """How a tensor's storage is split: the HLO sharding string XLA reads
    (``{devices=[4,1]0,1,2,3}``, ``{replicated}``), the mesh's devices and
    the storage's logical shape."""
    hlo: str
    devices: List[int]
    shape: Tuple[int, ...]


def _placements_to_spec(placements, rank: int, mesh: Mesh) -> List[SpecEntry]:
    """torch.distributed.tensor placements (one per mesh dimension) as a spec
    (one entry per tensor dimension)."""
    if len(placements) != len(mesh.shape):
        raise ValueError(f"placements {list(placements)} need one entry per mesh dimension of {mesh}")
    per_dim: List[List[str]] = [[] for _ in range(rank)]
    for axis, p in zip(mesh.axis_names, placements):
        kind = type(p).__name__
        if kind == "Partial" or (hasattr(p, "is_partial") and p.is_partial()):
            raise ValueError(f"Partial placements are not supported by torch_pjrt.spmd (mesh axis {axis!r}): "
                             "a tensor holds its full value; reduce it first and use Replicate() or Shard(d)")
        if kind == "Replicate":
            continue
        if kind == "Shard" or hasattr(p, "dim"):
            d = p.dim if p.dim >= 0 else p.dim + rank
            if not 0 <= d < rank:
                raise ValueError(f"placement {p} names dimension {p.dim} of a {rank}-d tensor")
            per_dim[d].append(axis)
            continue
        raise ValueError(f"unknown placement {p!r}: use Shard(d) or Replicate()")
    return [None if not a else a[0] if len(a) == 1 else tuple(a) for a in per_dim]


def _is_placements(spec) -> bool:
    return isinstance(spec, (list, tuple)) and len(spec) > 0 and all(
        type(p).__name__ in ("Shard", "Replicate", "Partial") for p in spec)


def _sharding_args(shape: Sequence[int], mesh: Mesh, spec) -> Tuple[List[int], List[int], int, List[int]]:
    """(devices, tiles, replicate, tile_devices) for runtime/sharding.h."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected a torch_pjrt.spmd.Mesh, got {type(mesh).__name__}")
    shape = tuple(int(s) for s in shape)
    rank = len(shape)
    if spec is None:
        spec = [None] * rank
    elif _is_placements(spec):
        spec = _placements_to_spec(spec, rank, mesh)
    spec = list(spec)

    def fail(why: str):
        raise ValueError(f"cannot shard a tensor of shape {shape} with spec {tuple(spec)} over {mesh}: {why}")

    if len(spec) != rank:
        fail(f"the spec needs one entry per tensor dimension ({rank}), got {len(spec)}")
    axes_of: List[Tuple[str, ...]] = []
    used: List[str] = []
    for d, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for a in names:
            if not isinstance(a, str):
                fail(f"entry {entry!r} of dimension {d}: use a mesh axis name, a tuple of names, or None")
            if a not in mesh.axis_names:
                fail(f"unknown mesh axis {a!r} (the mesh's axes: {mesh.axis_names})")
            if a in used:
                fail(f"mesh axis {a!r} is used twice")
            used.append(a)
        tiles = math.prod(mesh.axis_size(a) for a in names)
        if shape[d] % tiles:
            fail(f"dimension {d} of size {shape[d]} does not split into {tiles} equal pieces "
                 f"(mesh axes {names})")
        axes_of.append(names)
    tiles = [math.prod(mesh.axis_size(a) for a in names) for names in axes_of]
    rest = [a for a in mesh.axis_names if a not in used]
    replicate = math.prod(mesh.axis_size(a) for a in rest)
    # Mesh position p, at coordinates c over the mesh axes, holds piece
    # (mixed radix of c over each dimension's axes, in the spec's order) and
    # copy (mixed radix of c over the unused axes, in mesh order).
    tile_devices = [0] * len(mesh.device_ids)
    for p in range(len(mesh.device_ids)):
        coord = {}
        rem = p
        for a, s in reversed(list(zip(mesh.axis_names, mesh.shape))):
            coord[a] = rem % s
            rem //= s

        def radix(names):
            v = 0
            for a in names:
                v = v * mesh.axis_size(a) + coord[a]
            return v

        linear = 0
        for names, t in zip(axes_of, tiles):
            linear = linear * t + radix(names)
        linear = linear * replicate + radix(rest)
        tile_devices[linear] = p
    return list(mesh.device_ids), tiles, replicate, tile_devices


def distribute(tensor: torch.Tensor, mesh: Mesh, spec=None) -> torch.Tensor:
    """A sharded pjrt tensor holding ``tensor`` (a CPU tensor): each device's
    piece is uploaded straight to it. ``spec``: one entry per tensor
    dimension (a mesh axis name, a tuple of names, or None), or PyTorch
    placements (one ``Shard(d)``/``Replicate()`` per mesh dimension); None:
    replicated."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute takes a tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        if tensor.device.type == "pjrt":
            raise TypeError("distribute takes a CPU tensor (its pieces go straight to their devices); "
                            "for a pjrt tensor use mark_sharding (resharded on the devices)")
        tensor = tensor.cpu()
    args = _sharding_args(tensor.shape, mesh, spec)
    _device._configure_once()
    out = _C._spmd_distribute(tensor.detach(), *args)
    return out.requires_grad_(tensor.requires_grad) if tensor.is_floating_point() else out


def mark_sharding(tensor: torch.Tensor, mesh: Mesh, spec=None) -> torch.Tensor:
    """Shards a pjrt tensor on ``mesh.device`` in place (its storage takes the
    sharding from the next program on: the data moves device to device).
    Works on pending intermediates too (a sharding constraint for XLA).
    Returns ``tensor``."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "pjrt":
        raise TypeError("mark_sharding takes a pjrt tensor; use distribute for a CPU tensor")
    args = _sharding_args(tensor.shape, mesh, spec)
    _C._spmd_mark_sharding(tensor.detach(), *args)
    return tensor


def with_sharding_constraint(tensor: torch.Tensor, mesh: Mesh, spec=None) -> torch.Tensor:
    """A copy of ``tensor`` constrained to the sharding (differentiable): for
    intermediates that are views or need to stay unchanged."""
    out = tensor.clone(memory_format=torch.contiguous_format)
    mark_sharding(out, mesh, spec)
    return out


def sharding_of(tensor: torch.Tensor) -> Optional[Sharding]:
    """The tensor's storage's sharding, or None for a tensor of one device."""
    if tensor.device.type != "pjrt":
        return None
    got = _C._spmd_sharding_of(tensor.detach())
    if got is None:
        return None
    hlo, devices, dims = got
    return Sharding(hlo, list(devices), tuple(dims))


def shard_bytes(tensor: torch.Tensor) -> List[int]:
    """Bytes of the tensor's storage held on each mesh device, read from the
    buffers (materializes pending work); one entry for a tensor of one device."""
    return list(_C._spmd_shard_bytes(tensor.detach()))


def spmd_in_use() -> bool:
    """Whether a device's programs run partitioned over a mesh."""
    return bool(_C._spmd_in_use())


def distribute_module(module: torch.nn.Module, mesh: Mesh, spec_fn=None) -> torch.nn.Module:
    """Moves every parameter and buffer of ``module`` onto the mesh:
    ``spec_fn(name, tensor)`` gives each one's spec (None: replicated)."""
    names = {id(t): n for n, t in list(module.named_parameters()) + list(module.named_buffers())}

    def place(t: torch.Tensor) -> torch.Tensor:
        spec = spec_fn(names.get(id(t), ""), t) if spec_fn else None
        if t.device.type == "pjrt":
            if t.device != mesh.device:
                t = t.cpu()
            else:
                return mark_sharding(t.detach().clone(), mesh, spec)
        return distribute(t.detach(), mesh, spec)

    return module._apply(place)


def shard_module(module: torch.nn.Module, mesh: Mesh, axis: Union[str, Tuple[str, ...]], dim: int = 0) -> torch.nn.Module:
    """FSDP-style: splits each parameter and buffer over mesh ``axis`` along
    dimension ``dim``, or the first later dimension (cyclically) that divides
    evenly; tensors with none stay replicated. Gradients and optimizer state
    take the same sharding (the sharding rule of docs/spmd.md); XLA gathers
    weights where they are used."""
    n = math.prod(mesh.axis_size(a) for a in ((axis,) if isinstance(axis, str) else axis))

    def spec(name: str, t: torch.Tensor):
        for k in range(t.dim()):
            d = (dim + k) % t.dim()
            if t.shape[d] % n == 0:
                return [axis if i == d else None for i in range(t.dim())]
        return None

    return distribute_module(module, mesh, spec)
