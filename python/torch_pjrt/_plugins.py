"""Which PJRT plugin to load, and clients over it.

The rule lives in C++ (``csrc/pjrt/discovery.cc``) so that Python and C++
agree: ``TORCH_PJRT_PLUGIN=/path/to/plugin.so`` wins; else ``PJRT_DEVICE``
(``CPU``, ``CUDA``, ``ROCM``, ``TPU`` or a name given to
:func:`register_plugin`) picks an installed plugin from site-packages; else
``CPU``. When several plugins for the device are installed (the CPU builds
of ``xla-cpu-pjrt``, ``lammps-jax-pjrt-cpu`` and ``fastatomstruct-xla-cpu``,
say), the one with the newest PJRT API version wins; ties go to the earlier
layout in that list. This module only supplies Python's search directories.
"""

from __future__ import annotations

import os
import site
import sys
from typing import Dict, List, NamedTuple, Optional

from torch_pjrt import _C


class PluginChoice(NamedTuple):
    path: str  #: the plugin shared library
    device: str  #: upper-case device name it was chosen for, e.g. "CPU"
    reason: str  #: how it was chosen (for ``python -m torch_pjrt info``)


def plugin_search_dirs() -> List[str]:
    """Directories searched for installed plugins: site-packages, then sys.path."""
    dirs: List[str] = []
    candidates = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    candidates += sys.path
    for d in candidates:
        if d and os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def find_plugin(device: Optional[str] = None) -> PluginChoice:
    """The plugin for ``device`` (default: ``PJRT_DEVICE``, else CPU).

    Raises :class:`torch_pjrt.PjrtError` naming the package to install when
    no plugin is found.
    """
    path, dev, reason = _C.find_plugin(device or "", plugin_search_dirs())
    return PluginChoice(path, dev, reason)


def plugin_candidates(device: Optional[str] = None) -> List[Dict[str, str]]:
    """Every installed plugin for ``device`` (default: ``PJRT_DEVICE``, else
    CPU), in layout order: ``path``, ``package``, ``pjrt_api_version`` (read
    in a child process) and ``problem`` (why it cannot be used, else "")."""
    return list(_C.plugin_candidates(device or "", plugin_search_dirs()))


def register_plugin(name: str, path: str) -> None:
    """Make ``PJRT_DEVICE=<name>`` load the plugin at ``path`` in this process."""
    _C.register_plugin(name, path)


def load_plugin(device: Optional[str] = None) -> "_C.Plugin":
    return _C.Plugin.load(find_plugin(device).path)


def default_client_options(device: Optional[str] = None) -> Dict[str, object]:
    """Client options the environment implies for ``device``'s plugin
    (``CPU_NUM_DEVICES`` for the CPU plugin; one visible device per process
    for GPU plugins in a multi-process job). The rule lives in
    ``csrc/runtime/options.cc``, the one place that reads the environment."""
    return dict(_C.default_client_options(device or "", plugin_search_dirs()))


def create_client(device: Optional[str] = None, options: Optional[Dict[str, object]] = None) -> "_C.Client":
    """A new PJRT client for ``device``; ``options`` override the environment's."""
    choice = find_plugin(device)
    merged = default_client_options(device)
    merged.update(options or {})
    return _C.Client(_C.Plugin.load(choice.path), merged)
