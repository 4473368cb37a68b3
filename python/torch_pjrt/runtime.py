"""The runtime API of torch-pjrt: PJRT only, stable, documented, no warnings.

Topology comes from the launcher, whichever it is (``torch_pjrt.launch`` or
``torchrun``): both set the same environment variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``). Every
variable the project reads, and its default, is listed in
``docs/environment.md`` and by :func:`environment`; one place in C++
(``csrc/runtime/options.cc``) reads them, and this module asks it.

Ordinals count processes (one process drives one device in multi-process
data parallelism); within one process, ``torch_pjrt.replicated`` spreads one
program over the local devices instead.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

import torch

from torch_pjrt import _C, _device

# A device as the memory calls take it: an index, "pjrt:2" or a torch.device.
DeviceLike = Union[int, str, torch.device, None]


def options() -> Dict[str, object]:
    """The environment as torch-pjrt reads it, now (raises ``PjrtError`` naming
    a malformed variable and its fix)."""
    return _C._options()


def environment() -> List[Dict[str, str]]:
    """Every environment variable torch-pjrt reads: name, meaning, default."""
    return [{"name": n, "meaning": m, "default": d} for n, m, d in _C._environment_variables()]


def device_type() -> str:
    """The plugin's platform in upper case: ``"CPU"``, ``"CUDA"``, ``"TPU"``, ..."""
    _device._configure_once()
    name = _C._platform_name().upper()
    return {"GPU": "CUDA"}.get(name, name)


def process_index() -> int:
    """Global index of this process (``RANK``)."""
    return options()["rank"]


def process_count() -> int:
    """Number of processes in the job (``WORLD_SIZE``)."""
    return options()["world_size"]


def local_process_count() -> int:
    """Processes on this host (``LOCAL_WORLD_SIZE``)."""
    return options()["local_world_size"]


def world_size() -> int:
    """Number of data-parallel participants: processes in the job."""
    return process_count()


def global_ordinal() -> int:
    """This participant's index among all of them (``RANK``)."""
    return process_index()


def local_ordinal() -> int:
    """This participant's index on its host (``LOCAL_RANK``)."""
    return options()["local_rank"]


def host_index() -> int:
    """Index of this host (node) in the job (``GROUP_RANK``; 0 on one machine)."""
    return options()["group_rank"]


def addressable_device_count() -> int:
    """pjrt devices this process drives."""
    return _device.device_count()


def global_device_count() -> int:
    """pjrt devices in the job (processes x devices per process)."""
    return addressable_device_count() * process_count()


def devices() -> List["torch.device"]:  # noqa: F821
    """The pjrt devices of this process."""
    import torch

    return [torch.device("pjrt", i) for i in range(addressable_device_count())]


def plugin_info() -> Dict[str, object]:
    """Path, PJRT API version, XLA and StableHLO versions of the plugin in use."""
    _device._configure_once()
    path = _C._plugin_path()
    plugin = _C.Plugin.load(path)
    attrs = plugin.attributes
    major, minor = plugin.api_version
    return {
        "path": path,
        "pjrt_api_version": f"{major}.{minor}",
        "xla_version": attrs.get("xla_version", ""),
        "stablehlo_current_version": attrs.get("stablehlo_current_version", "").replace(",", "."),
        "stablehlo_minimum_version": attrs.get("stablehlo_minimum_version", "").replace(",", "."),
        "platform": device_type(),
    }


def _which(device) -> int:
    """A device argument (an index, "pjrt:2", a torch.device; a negative
    index or None: the current device) as an index this process has
    (IndexError otherwise), as torch.pjrt's memory calls take it; starts
    the runtime."""
    return _device._index(device)


def memory_stats(index: DeviceLike = 0) -> Optional[Dict[str, int]]:
    """The plugin's allocator statistics for pjrt device ``index`` (an
    index, ``"pjrt:N"`` or a ``torch.device``, as for every call below)
    (``bytes_in_use``, and ``peak_bytes_in_use``, ``bytes_limit``, ... where
    the plugin sets them), read through ``PJRT_Device_MemoryStats`` when the
    plugin's API table has it; None when the plugin does not report them (the
    XLA CPU plugins answer UNIMPLEMENTED)."""
    return _C._memory_stats(_which(index))


def memory_allocated(index: DeviceLike = 0) -> int:
    """Bytes of the buffers torch_pjrt holds on pjrt device ``index`` now
    (sharded tensors count their piece on each device), counted from the
    buffers' sizes: available on every plugin."""
    return int(_C._buffer_bytes(_which(index))[0])


def max_memory_allocated(index: DeviceLike = 0) -> int:
    """The most ``memory_allocated(index)`` was since the start or the last
    ``reset_peak_memory_stats(index)``."""
    return int(_C._buffer_bytes(_which(index))[1])


def reset_peak_memory_stats(index: DeviceLike = 0) -> None:
    _C._reset_peak_buffer_bytes(_which(index))


def device_memory_stats(index: DeviceLike = 0) -> Dict[str, int]:
    """``memory_stats(index)`` where the plugin reports statistics, else our
    buffers' counts: ``bytes_in_use``, ``peak_bytes_in_use``, ``num_buffers``
    and torch's names ``allocated_bytes.all.current`` /
    ``allocated_bytes.all.peak``."""
    index = _which(index)
    stats = dict(memory_stats(index) or {})
    if not stats:
        in_use, peak, count = _C._buffer_bytes(index)
        stats = {"bytes_in_use": int(in_use), "peak_bytes_in_use": int(peak), "num_buffers": int(count)}
    stats.setdefault("allocated_bytes.all.current", stats.get("bytes_in_use", 0))
    stats.setdefault("allocated_bytes.all.peak", stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0)))
    return stats


def capabilities() -> Dict[str, object]:
    """What this runtime can do here; test these instead of ``hasattr``.

    - ``multiprocess``: several processes can train together (always).
    - ``collectives``: collectives compile into programs across the local
      devices of one process (``torch_pjrt.replicated``).
    - ``native_multiprocess_collectives``: cross-process collectives run
      inside PJRT programs. False: they run through torch.distributed's gloo
      on host copies (``cross_process_collectives`` says which).
    - ``persistent_cache``, ``bf16``, ``donation``: as named.
    """
    return {
        "multiprocess": True,
        "collectives": True,
        "native_multiprocess_collectives": False,
        "cross_process_collectives": "gloo",
        "persistent_cache": True,
        "bf16": True,
        "donation": True,
        "replicated_devices": addressable_device_count(),
    }


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled programs in ``path`` across processes (also set by
    ``TORCH_PJRT_CACHE_DIR``). Entries are keyed on the plugin's XLA version
    and program hash, written atomically; corrupt entries are dropped and
    recompiled. ``readonly``: use entries, never write."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"initialize_cache takes a directory path, got {path!r}")
    _device.device_count()  # starts the runtime
    _C._initialize_cache(str(path), bool(readonly))


def spmd_in_use() -> bool:
    """Whether a device's programs run partitioned over an SPMD mesh
    (``torch_pjrt.spmd``; docs/spmd.md)."""
    if not _C._initialized():
        return False
    return bool(_C._spmd_in_use())


def using_pjrt() -> bool:
    """Always True: the runtime is PJRT only (kept for code written against older runtimes)."""
    return True


__all__ = [
    "addressable_device_count", "capabilities", "spmd_in_use", "memory_allocated", "max_memory_allocated",
    "reset_peak_memory_stats", "device_memory_stats", "device_type", "devices", "environment", "global_device_count",
    "global_ordinal", "host_index", "initialize_cache", "local_ordinal", "local_process_count", "options",
    "plugin_info", "process_count", "process_index", "using_pjrt", "world_size",
]
