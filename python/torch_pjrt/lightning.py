"""PyTorch Lightning on pjrt: ``import torch_pjrt.lightning``, then
``Trainer(accelerator="pjrt", devices=1)`` (``lightning.pytorch``) or
``Fabric(accelerator="pjrt", devices=1)`` (``lightning.fabric``).

Lightning has no entry point for accelerators, so importing this module
registers them: the accelerator ``"pjrt"`` and the strategy
``"pjrt_single"`` in both registries, and the precision plugins that make
``precision="bf16-mixed"`` (and ``"16-mixed"``) use ``torch.autocast("pjrt")``
(Lightning would give an accelerator it does not know CUDA's autocast).

- The optimizer step syncs the program: the strategy's ``optimizer_step``
  runs Lightning's (the closure traces forward and backward, the optimizer
  traces its update) and then ``torch_pjrt.sync()``, so that each training
  step is one compiled program, as ``opt.step(); torch_pjrt.sync()`` is
  without Lightning.
- ``precision="bf16-true"`` is Lightning's own ``HalfPrecision``: it needs
  nothing device-specific.
- Checkpoints are written from CPU copies of the tensors (as Lightning's XLA
  strategy does) and load back onto the device through ``load_state_dict``.
- One device per process. ``devices=N`` with N > 1 is refused with an error
  that says what to do: Lightning's multi-device strategies are built on
  ``torch.distributed`` process groups (DDP), while pjrt runs data
  parallelism either as one process per device with its own launcher
  (``torch_pjrt.launch``) or as one replicated program within a process
  (``torch_pjrt.replicated``); docs/lightning.md.

The accelerator reads what it needs from :mod:`torch_pjrt.runtime` (devices
of this process, whether a plugin is installed).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import torch

import torch_pjrt
from torch_pjrt import runtime

try:
    import lightning.fabric as _fabric
    import lightning.pytorch as _pl
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("torch_pjrt.lightning needs Lightning: `pip install lightning` "
                      "(or `pip install torch-pjrt[lightning]`)") from e

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY as _FABRIC_ACCELERATORS
from lightning.fabric.plugins.precision import MixedPrecision as _FabricMixedPrecision
from lightning.fabric.strategies import STRATEGY_REGISTRY as _FABRIC_STRATEGIES
from lightning.fabric.strategies import SingleDeviceStrategy as _FabricSingleDevice
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch.accelerators import AcceleratorRegistry as _PL_ACCELERATORS
from lightning.pytorch.plugins.precision import MixedPrecision as _PlMixedPrecision
from lightning.pytorch.strategies import SingleDeviceStrategy as _PlSingleDevice
from lightning.pytorch.strategies import StrategyRegistry as _PL_STRATEGIES

__all__ = ["PjrtAccelerator", "PjrtSingleDeviceStrategy", "PjrtFabricSingleDeviceStrategy"]

NAME = "pjrt"
STRATEGY = "pjrt_single"


_ONE_DEVICE = (
    "accelerator='pjrt' trains on one device in one process, got {}: Lightning's multi-device strategies (DDP) "
    "reduce gradients through torch.distributed, which cannot reduce pjrt tensors. Use devices=1, or train on "
    "several devices outside Lightning with torch_pjrt.replicated (one process) or torch_pjrt.launch and "
    "torch_pjrt.distributed.optimizer_step (one process per device); docs/lightning.md")


def _device_indices(devices: Union[int, str, List[int]]) -> List[int]:
    if isinstance(devices, str):
        devices = devices.strip()
        if devices == "auto":
            devices = PjrtAccelerator.auto_device_count()
        elif devices == "-1":
            devices = -1
        elif "," in devices:
            devices = [int(d) for d in devices.split(",") if d.strip()]
        else:
            devices = int(devices)
    if isinstance(devices, int):
        if devices == -1:
            devices = runtime.addressable_device_count()
        indices = list(range(devices))
    else:
        indices = [int(d) for d in devices]
    if not indices:
        raise ValueError("accelerator='pjrt' needs at least one device: devices=1")
    if len(indices) > 1:
        raise ValueError(_ONE_DEVICE.format(f"devices={devices!r}"))
    count = runtime.addressable_device_count()
    for i in indices:
        if not 0 <= i < count:
            raise ValueError(f"pjrt device {i} does not exist: this process has {count} pjrt device(s)")
    return indices


class PjrtAccelerator(_pl.accelerators.Accelerator):
    """The ``pjrt`` device for Lightning (Trainer and Fabric: Lightning's
    Trainer accelerator class extends Fabric's)."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != NAME:
            raise ValueError(f"PjrtAccelerator got device {device}, expected a pjrt device")
        if runtime.process_count() > 1:  # each process would train alone, silently
            raise ValueError(_ONE_DEVICE.format(f"a job of {runtime.process_count()} processes (WORLD_SIZE)"))
        torch_pjrt.device(device.index or 0)  # starts the runtime: errors surface here, not mid-step

    def teardown(self) -> None:
        torch_pjrt.sync()

    @staticmethod
    def name() -> str:
        return NAME

    @staticmethod
    def parse_devices(devices: Union[int, str, List[int]]) -> List[int]:
        return _device_indices(devices)

    @staticmethod
    def get_parallel_devices(devices: Union[int, str, List[int]]) -> List[torch.device]:
        return [torch.device(NAME, i) for i in _device_indices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return 1  # one device per process (see the module's docstring)

    @staticmethod
    def is_available() -> bool:
        try:
            torch_pjrt.find_plugin()
        except Exception:
            return False
        return True

    def get_device_stats(self, device: Union[str, torch.device]) -> Dict[str, Any]:
        return {f"pjrt/{k}": v for k, v in torch_pjrt.metrics.counters().items() if isinstance(v, (int, float))}

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(NAME, cls, description="PyTorch on a PJRT plugin (torch-pjrt)")


def _pjrt_precision(precision, mixed_cls):
    """Lightning gives an accelerator it does not know CUDA's autocast: the
    same mixed precision on pjrt's autocast (and GradScaler for 16-mixed)."""
    if isinstance(precision, mixed_cls) and precision.device != NAME:
        return mixed_cls(precision=precision.precision, device=NAME)
    return precision


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.cpu() if tensor.device.type == NAME else tensor


class PjrtSingleDeviceStrategy(_PlSingleDevice):
    """Lightning Trainer on one pjrt device."""

    strategy_name = STRATEGY

    def __init__(self, device: Union[int, torch.device] = 0, **kwargs: Any):
        if isinstance(device, int):
            device = torch.device(NAME, device)
        super().__init__(device=device, **kwargs)

    @_PlSingleDevice.precision_plugin.setter
    def precision_plugin(self, precision_plugin) -> None:
        self._precision_plugin = _pjrt_precision(precision_plugin, _PlMixedPrecision)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        torch_pjrt.sync()
        return out

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        torch_pjrt.sync()
        super().save_checkpoint(apply_to_collection(checkpoint, torch.Tensor, _to_cpu), filepath, storage_options)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(STRATEGY, cls, description="one pjrt device (torch-pjrt)")


class PjrtFabricSingleDeviceStrategy(_FabricSingleDevice):
    """Lightning Fabric on one pjrt device."""

    def __init__(self, device: Union[int, torch.device] = 0, **kwargs: Any):
        if isinstance(device, int):
            device = torch.device(NAME, device)
        super().__init__(device=device, **kwargs)

    @_FabricSingleDevice.precision.setter
    def precision(self, precision) -> None:
        self._precision = _pjrt_precision(precision, _FabricMixedPrecision)

    def optimizer_step(self, optimizer, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, **kwargs)
        torch_pjrt.sync()
        return out

    def save_checkpoint(self, path, state: Dict[str, Any], storage_options: Optional[Any] = None,
                        filter: Optional[Dict[str, Any]] = None) -> None:
        torch_pjrt.sync()
        state = {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()}
        super().save_checkpoint(path, apply_to_collection(state, torch.Tensor, _to_cpu), storage_options, filter)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(STRATEGY, cls, description="one pjrt device (torch-pjrt)")


def _is_pjrt(flag: Any) -> bool:
    return flag == NAME or isinstance(flag, PjrtAccelerator)


def _patch_auto_strategy(connector_cls, strategy_cls) -> None:
    """Lightning's automatic strategy choice gives an accelerator it does not
    know a single-device strategy on ``"cpu"``; for pjrt it must be ours. The
    one hook Lightning offers is the connector's ``_choose_strategy``: wrap it."""
    original = connector_cls._choose_strategy
    if getattr(original, "_torch_pjrt", False):
        return

    def _choose_strategy(self):
        if _is_pjrt(self._accelerator_flag) and self._num_nodes_flag <= 1:
            return strategy_cls(device=self._parallel_devices[0])
        return original(self)

    _choose_strategy._torch_pjrt = True
    connector_cls._choose_strategy = _choose_strategy


def register() -> None:
    """Registers the accelerator and strategies with lightning.pytorch and
    lightning.fabric (done on import; calling it again changes nothing)."""
    from lightning.fabric.connector import _Connector
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    if NAME not in _PL_ACCELERATORS:
        PjrtAccelerator.register_accelerators(_PL_ACCELERATORS)
    if NAME not in _FABRIC_ACCELERATORS:
        PjrtAccelerator.register_accelerators(_FABRIC_ACCELERATORS)
    if STRATEGY not in _PL_STRATEGIES:
        PjrtSingleDeviceStrategy.register_strategies(_PL_STRATEGIES)
    if STRATEGY not in _FABRIC_STRATEGIES:
        PjrtFabricSingleDeviceStrategy.register_strategies(_FABRIC_STRATEGIES)
    _patch_auto_strategy(_AcceleratorConnector, PjrtSingleDeviceStrategy)
    _patch_auto_strategy(_Connector, PjrtFabricSingleDeviceStrategy)


register()
