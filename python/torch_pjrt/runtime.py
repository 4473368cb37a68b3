"""The runtime API of torch-pjrt: PJRT only, stable, documented, no warnings.

Topology comes from the launcher, whichever it is (``torch_pjrt.launch`` or
``torchrun``): both set the same environment variables.

| variable | meaning | default |
| --- | --- | --- |
| ``PJRT_DEVICE`` | plugin kind: ``CPU``, ``CUDA``, ``ROCM``, ``TPU`` or a registered name | ``CPU`` |
| ``TORCH_PJRT_PLUGIN`` | path of a plugin ``.so`` (wins over ``PJRT_DEVICE``) | |
| ``CPU_NUM_DEVICES`` | devices of the CPU plugin in this process | plugin's (4) |
| ``RANK`` | global index of this process | 0 |
| ``WORLD_SIZE`` | number of processes | 1 |
| ``LOCAL_RANK`` | index of this process on its host | 0 |
| ``LOCAL_WORLD_SIZE`` | processes on this host | 1 |
| ``GROUP_RANK`` | index of this host (node) | 0 |
| ``MASTER_ADDR``, ``MASTER_PORT`` | rendezvous (torch.distributed TCPStore) | |
| ``TORCH_PJRT_CACHE_DIR`` | persistent compile cache | |

Ordinals count processes (one process drives one device in multi-process
data parallelism); within one process, ``torch_pjrt.replicated`` spreads one
program over the local devices instead.
"""

from __future__ import annotations

import os
from typing import Dict, List

from torch_pjrt import _C, _device, _plugins


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _check_topology() -> None:
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"inconsistent launcher environment: RANK={rank} with WORLD_SIZE={world}")
    if local_world < 1 or not 0 <= local < local_world:
        raise ValueError(f"inconsistent launcher environment: LOCAL_RANK={local} with LOCAL_WORLD_SIZE={local_world}")


def device_type() -> str:
    """The plugin's platform in upper case: ``"CPU"``, ``"CUDA"``, ``"TPU"``, ..."""
    _device._configure_once()
    name = _C._platform_name().upper()
    return {"GPU": "CUDA"}.get(name, name)


def process_index() -> int:
    """Global index of this process (``RANK``)."""
    _check_topology()
    return _env_int("RANK", 0)


def process_count() -> int:
    """Number of processes in the job (``WORLD_SIZE``)."""
    _check_topology()
    return _env_int("WORLD_SIZE", 1)


def local_process_count() -> int:
    """Processes on this host (``LOCAL_WORLD_SIZE``)."""
    _check_topology()
    return _env_int("LOCAL_WORLD_SIZE", 1)


def world_size() -> int:
    """Number of data-parallel participants: processes in the job."""
    return process_count()


def global_ordinal() -> int:
    """This participant's index among all of them (``RANK``)."""
    return process_index()


def local_ordinal() -> int:
    """This participant's index on its host (``LOCAL_RANK``)."""
    _check_topology()
    return _env_int("LOCAL_RANK", 0)


def host_index() -> int:
    """Index of this host (node) in the job (``GROUP_RANK``; 0 on one machine)."""
    return _env_int("GROUP_RANK", 0)


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
    _device._configure_once()
    _C._device_count()  # initializes the runtime
    _C._initialize_cache(str(path), bool(readonly))


def using_pjrt() -> bool:
    """Always True: the runtime is PJRT only (kept for code written against older runtimes)."""
    return True


__all__ = [
    "addressable_device_count", "capabilities", "device_type", "devices", "global_device_count", "global_ordinal",
    "host_index", "initialize_cache", "local_ordinal", "local_process_count", "plugin_info", "process_count",
    "process_index", "using_pjrt", "world_size",
]
