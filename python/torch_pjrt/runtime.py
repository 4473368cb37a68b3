"""The stable runtime API of torch-pjrt (PJRT only)."""

from __future__ import annotations

from torch_pjrt import _C, _device


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
