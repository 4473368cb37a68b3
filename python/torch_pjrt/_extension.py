"""Loading the native extension ``torch_pjrt._C``, or refusing it.

``_C`` is linked against libtorch's C++ symbols: one built for another torch
fails to load (``undefined symbol``), or loads and misbehaves. ``import
torch`` imports us (the ``torch.backends`` entry point) and re-raises any
error of ours, so a stale ``_C`` must never be loaded at import. The build
writes ``_build_info.py`` next to ``_C`` (the torch version and C++ ABI it
compiled against; see CMakeLists.txt); :func:`load` compares it with the
running torch and loads ``_C`` only when they agree. Otherwise, or when
``_C`` fails to load, the package still imports and the ``pjrt`` device is
still registered (registration is pure Python), and the first use of the
device raises one :class:`PjrtError` that says what happened and how to
rebuild.
"""

from __future__ import annotations

import os
import types
from typing import Optional, Tuple

import torch


class PjrtError(RuntimeError):
    """Raised in place of ``torch_pjrt._C.PjrtError`` when the extension
    could not be loaded (the same name, so ``except torch_pjrt.PjrtError``
    catches both)."""


def _source_tree() -> Optional[str]:
    """The torch-pjrt checkout this package runs from, if it is one (also
    through the links to its files that a build for another venv, or the
    sanitizer build, puts next to its own _C: Makefile, PKG_ROOT)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    return root if os.path.isfile(os.path.join(root, "Makefile")) and os.path.isdir(os.path.join(root, "csrc")) else None


def _pip_rebuild(source: str) -> str:
    import shlex
    import sys

    return (f"`{shlex.quote(sys.executable)} -m pip install --no-build-isolation --no-deps --force-reinstall "
            f"--no-cache-dir {source}`")


def rebuild_hint() -> str:
    """The command that rebuilds _C against the running torch, for the way
    this package was installed: a checkout (``make build``, which the
    editable install shares), or pip from a checkout or an sdist
    (``_build_info.BUILT_BY``, ``SOURCE_DIR``)."""
    root = _source_tree()
    if root:
        import sys

        # make's default venv is the checkout's .venv; another is named (VENV=).
        venv = "" if os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(root, ".venv")) else \
            f" VENV={sys.prefix}"
        return f"rebuild it against the running torch with `make -C {root} build{venv}`, then restart Python"
    try:
        from torch_pjrt import _build_info

        built_by, source = getattr(_build_info, "BUILT_BY", ""), getattr(_build_info, "SOURCE_DIR", "")
    except ImportError:
        built_by, source = "", ""
    if built_by == "pip" and source and os.path.isfile(os.path.join(source, "pyproject.toml")):
        return f"reinstall it against the running torch with {_pip_rebuild(source)}, then restart Python"
    return (f"reinstall it against the running torch from its source (a checkout or the sdist it came from) "
            f"with {_pip_rebuild('<source>')}, then restart Python")


def running_torch() -> Tuple[str, int]:
    return str(torch.__version__), int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))


def built_for() -> Optional[Tuple[str, int]]:
    """(torch version, C++11 ABI flag) the extension was built against, or
    None when the build left no record (a build older than this check)."""
    try:
        from torch_pjrt import _build_info
    except ImportError:
        return None
    return str(_build_info.TORCH_VERSION), int(_build_info.CXX11_ABI)


class _Unloaded(types.ModuleType):
    """Stands in for ``_C`` when it could not be loaded: every attribute but
    ``PjrtError`` and ``_initialized`` raises the one error that explains it."""

    def __init__(self, message: str):
        super().__init__("torch_pjrt._C")
        self.PjrtError = PjrtError
        self._message = message

    def _initialized(self) -> bool:
        return False

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise PjrtError(self._message)


def load() -> types.ModuleType:
    """The extension module, or a stand-in that raises at first use why it
    could not be loaded."""
    running = running_torch()
    built = built_for()
    if built is not None and built != running:
        return _Unloaded(
            f"torch_pjrt's native extension was built for torch {built[0]} (C++11 ABI {built[1]}), but torch "
            f"{running[0]} (C++11 ABI {running[1]}) is running: {rebuild_hint()}.")
    try:
        from torch_pjrt import _C
    except Exception as e:  # ImportError (undefined symbol, missing file) or an error of its initialization
        what = "is not built" if isinstance(e, ModuleNotFoundError) and e.name == "torch_pjrt._C" else f"failed to load ({e})"
        return _Unloaded(f"torch_pjrt's native extension {what}: {rebuild_hint()}.")
    return _C


def is_loaded(module: types.ModuleType) -> bool:
    return not isinstance(module, _Unloaded)
