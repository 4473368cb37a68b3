"""torch-pjrt: PyTorch on any PJRT device.

This release provides the native core: PJRT plugin discovery and loading,
clients, buffers, executables, and the graph IR with its StableHLO printer
(``torch_pjrt._C``). The ``pjrt`` PyTorch device builds on it.
"""

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

__version__ = "0.1.0"

__all__ = [
    "PjrtError",
    "PluginChoice",
    "create_client",
    "find_plugin",
    "load_plugin",
    "plugin_search_dirs",
    "register_plugin",
    "__version__",
]
