"""torch-pjrt: PyTorch on any PJRT device.

``import torch_pjrt`` registers the ``pjrt`` device with PyTorch (it also
loads automatically with torch >= 2.5 through the ``torch.backends`` entry
point). Tensors on ``pjrt`` record their operations lazily; :func:`sync`
compiles the pending work into one StableHLO program per device through the
PJRT plugin (cached) and runs it.

    dev = torch_pjrt.device()
    model = Net().to(dev)
    ...
    loss.backward(); opt.step(); opt.zero_grad()
    torch_pjrt.sync()
"""

from __future__ import annotations

import torch

from torch_pjrt import _extension

# The native extension, or (built for another torch, or failing to load) a
# stand-in that raises why at first use: `import torch` imports us and must
# never fail because of us. Set before the submodules import it by name.
_C = _extension.load()
PjrtError = _C.PjrtError

from torch_pjrt._plugins import (
    PluginChoice,
    create_client,
    find_plugin,
    load_plugin,
    plugin_search_dirs,
    register_plugin,
)
from torch_pjrt import _device
from torch_pjrt._device import PjrtWarning, device, device_count, manual_seed, sync
from torch_pjrt import metrics, runtime, distributed, generation, spmd, process_group
from torch_pjrt.distributed import launch, replicate, replicated

__version__ = "0.2.0"

__all__ = [
    "PjrtError",
    "PjrtWarning",
    "PluginChoice",
    "create_client",
    "device",
    "device_count",
    "distributed",
    "launch",
    "replicate",
    "replicated",
    "spmd",
    "find_plugin",
    "generation",
    "load_plugin",
    "manual_seed",
    "metrics",
    "plugin_search_dirs",
    "register_plugin",
    "runtime",
    "sync",
    "__version__",
]

_device.register()
process_group.register()  # torch.distributed's backend "pjrt"


def _register_dynamo() -> None:
    """Makes ``torch.compile(backend="pjrt")`` work: registers the backend by
    name as soon as ``torch._dynamo`` is imported (at once if it is;
    importing it here would add more than a second to every ``import
    torch``). Dynamo would also find the installed package's
    ``torch_dynamo_backends`` entry point when first asked for the name, but
    it registers an entry point's backend after a check of its own, so that
    threads compiling for the first time at once raised "duplicate name:
    pjrt"; registered during the import, the name is there before any
    thread asks."""
    def register() -> None:
        try:
            from torch_pjrt import dynamo

            dynamo.register()
        except ImportError:  # torch built without Dynamo, or imported midway: the entry point remains
            pass

    _device._after_import("torch._dynamo", register)


_register_dynamo()

# Submodules that import heavy dependencies (torch._dynamo, lightning) load
# on first use, so `torch_pjrt.dynamo.replay = False` works after a plain
# `import torch_pjrt` without `import torch` paying for them.
_LAZY_SUBMODULES = ("conformance", "doctor", "dynamo", "lightning")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"torch_pjrt.{name}")
    raise AttributeError(f"module 'torch_pjrt' has no attribute {name!r}")
