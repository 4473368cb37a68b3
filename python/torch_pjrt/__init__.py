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

from torch_pjrt import _C
from torch_pjrt._C import PjrtError
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
from torch_pjrt import metrics, runtime, distributed
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
    "find_plugin",
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


def _register_dynamo() -> None:
    try:
        from torch_pjrt import dynamo

        dynamo.register()
    except ImportError:  # torch built without Dynamo
        pass


_register_dynamo()
