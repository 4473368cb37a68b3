"""PyTorch Lightning on pjrt: ``Trainer(accelerator="pjrt", devices=1)``
(``lightning.pytorch``) or ``Fabric(accelerator="pjrt", devices=1)``
(``lightning.fabric``).

Lightning has no entry point for accelerators, so importing this module
registers them (torch_pjrt imports it when ``lightning.pytorch`` is
imported: ``_device._register_with_lightning_when_imported``): the accelerator ``"pjrt"`` and the strategy
``"pjrt_single"`` in both registries, and the precision plugins that make
``precision="bf16-mixed"`` (and ``"16-mixed"``) use ``torch.autocast("pjrt")``
(Lightning would give an accelerator it does not know CUDA's autocast).

- The optimizer step syncs the program: the strategy's ``optimizer_step``
  runs Lightning's (the closure traces forward and backward, the optimizer
  traces its update) and then ``torch_pjrt.sync()``, so that each training
  step is one compiled program, as ``opt.step(); torch_pjrt.sync()`` is
  without Lightning. Under manual optimization the user's
  ``training_step`` ends the program instead, and each validation, test
  and predict batch ends one (``_ProgramPerBatch``).
- ``precision="bf16-true"`` is Lightning's own ``HalfPrecision``: it needs
  nothing device-specific.
- Checkpoints are written from CPU copies of the tensors (as Lightning's XLA
  strategy does) and load back onto the device through ``load_state_dict``.
- ``devices=N`` (N > 1, Trainer): the strategy ``"pjrt_ddp"``, one process
  per device. Its launcher is Lightning's spawn launcher (as ``ddp_spawn``:
  each ``fit``/``validate``/``test``/``predict`` starts N processes, and the
  trained weights and logged metrics come back to the calling process); each
  process enters the job as ``torch_pjrt.launch`` starts its processes (the
  torchrun environment, one device each). Gradients are averaged over the
  processes by ``torch_pjrt.distributed`` after each backward, as DDP does,
  and each step starts from rank 0's buffers. The job's process group is
  torch.distributed's backend ``"pjrt"`` (gloo on host copies), so logged
  values with ``sync_dist=True``, ``all_gather``, barriers and torchmetrics'
  own synchronization work on pjrt tensors. Fabric with N > 1 is refused;
  docs/lightning.md.

The accelerator reads what it needs from :mod:`torch_pjrt.runtime` (devices
of this process, whether a plugin is installed).
"""

from __future__ import annotations

import contextlib
import warnings
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
from lightning.fabric.strategies import ParallelStrategy as _FabricParallel
from lightning.fabric.strategies import SingleDeviceStrategy as _FabricSingleDevice
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import AcceleratorRegistry as _PL_ACCELERATORS
from lightning.pytorch.plugins.precision import MixedPrecision as _PlMixedPrecision
from lightning.pytorch.strategies import DDPStrategy as _PlDDP
from lightning.pytorch.strategies import ParallelStrategy as _PlParallel
from lightning.pytorch.strategies import SingleDeviceStrategy as _PlSingleDevice
from lightning.pytorch.strategies import StrategyRegistry as _PL_STRATEGIES
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.trainer.states import TrainerFn

from torch_pjrt import distributed

__all__ = ["PjrtAccelerator", "PjrtSingleDeviceStrategy", "PjrtDDPStrategy", "PjrtFabricSingleDeviceStrategy"]

NAME = "pjrt"
STRATEGY = "pjrt_single"
DDP_STRATEGY = "pjrt_ddp"


_FABRIC_ONE_DEVICE = (
    "Fabric(accelerator='pjrt') runs on one device in one process, got {}: several devices are written for the "
    "Trainer only (strategy 'pjrt_ddp'). Use devices=1, or torch_pjrt.launch and "
    "torch_pjrt.distributed.optimizer_step (one process per device); docs/lightning.md")
_JOB_OF_PROCESSES = (
    "strategy 'pjrt_single' in a job of {} processes (WORLD_SIZE): each process would train alone. Give the "
    "Trainer devices=<processes per host> (strategy 'pjrt_ddp'), or start one process; docs/lightning.md")


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
        # One process per device (pjrt_ddp): process i drives device i of
        # this host, which it sees as its own device 0. Counted here only
        # where that opens nothing: a GPU plugin would hold its devices in
        # this process, which trains nothing (a missing one fails in the
        # process that asks for it).
        if indices != list(range(len(indices))):
            raise ValueError(f"accelerator='pjrt' with several devices runs process i on device i: devices={devices!r} "
                             f"is not 0..N-1; use devices={len(indices)}")
        o = runtime.options()
        on_cpu = o["device"] in ("", "CPU") and not o["plugin"]
        if not on_cpu and torch_pjrt._C._initialized() and len(indices) > runtime.addressable_device_count():
            raise ValueError(f"devices={devices!r}: this host has {runtime.addressable_device_count()} pjrt device(s)")
        return indices
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
        # Lightning answers False with "can not run on your system" alone:
        # the reason (a PJRT_DEVICE without a plugin, a bad CPU_NUM_DEVICES)
        # goes with it as a warning.
        try:
            torch_pjrt.find_plugin()
        except Exception as e:
            warnings.warn(f"the pjrt accelerator is not available: {e}", stacklevel=2)
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


class _CpuCheckpoints:
    """Strategy mixin: a checkpoint is written after the pending work has
    run, with its tensors on the CPU (loadable without torch-pjrt)."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        torch_pjrt.sync()
        super().save_checkpoint(apply_to_collection(checkpoint, torch.Tensor, _to_cpu), filepath, storage_options)


class _ProgramPerBatch:
    """Strategy mixin: where the program ends. A training step with
    automatic optimization ends at its optimizer step (the closure traces
    forward and backward, the optimizer its update; with
    ``accumulate_grad_batches=k``, one program per k batches). A manual
    optimization step ends with the user's ``training_step`` (the update
    may bypass Lightning's optimizer, or there may be none: before, the
    whole epoch became one program; two optimizers are one program, not
    two), and every validation, test and predict batch with its step (the
    evaluation epoch was one program, compiled anew for each batch count,
    its compile time growing faster than the epoch)."""

    def _manual(self) -> bool:
        return not self.lightning_module.automatic_optimization

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        inner = getattr(optimizer, "optimizer", optimizer)
        first = isinstance(inner, torch.optim.Optimizer) and not inner.state
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if not self._manual():
            try:
                torch_pjrt.sync()
            except torch.OutOfMemoryError:
                # What the step created is lost with its program (its
                # gradients, a first step's optimizer state): dropped, so
                # that the next step (Lightning's batch-size search trying
                # a smaller batch) and teardown's copy to the CPU do not
                # read them. A program refused before its launch leaves the
                # parameters as they were; one that failed while it ran
                # (raised by a later sync) lost what it wrote, which raises
                # when read.
                for p in self.lightning_module.parameters():
                    p.grad = None
                if first:
                    inner.state.clear()
                raise
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().training_step(*args, **kwargs)
        if self._manual():
            torch_pjrt.sync()
        return out

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return _synced(super().validation_step(*args, **kwargs))

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return _synced(super().test_step(*args, **kwargs))

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return _synced(super().predict_step(*args, **kwargs))


def _synced(out: Any) -> Any:
    """`out`, after the pending work up to it has been launched."""
    torch_pjrt.sync()
    return out


class PjrtSingleDeviceStrategy(_CpuCheckpoints, _ProgramPerBatch, _PlSingleDevice):
    """Lightning Trainer on one pjrt device."""

    strategy_name = STRATEGY

    def __init__(self, device: Union[int, torch.device] = 0, **kwargs: Any):
        if isinstance(device, int):
            device = torch.device(NAME, device)
        super().__init__(device=device, **kwargs)

    @_PlSingleDevice.precision_plugin.setter
    def precision_plugin(self, precision_plugin) -> None:
        self._precision_plugin = _pjrt_precision(precision_plugin, _PlMixedPrecision)

    def setup_environment(self) -> None:
        if runtime.process_count() > 1:  # each process would train alone, silently
            raise ValueError(_JOB_OF_PROCESSES.format(runtime.process_count()))
        super().setup_environment()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(STRATEGY, cls, description="one pjrt device (torch-pjrt)")


class _PjrtLauncher(_MultiProcessingLauncher):
    """Lightning's spawn launcher (the calling process gets rank 0's results,
    trained weights and logged metrics back, as with ``ddp_spawn``), whose
    processes enter the job as ``torch_pjrt.launch`` starts its own: the
    torchrun environment, one device each, set before anything opens a
    device; the process group is left when the work is done."""

    def __init__(self, strategy: "PjrtDDPStrategy") -> None:
        super().__init__(strategy, start_method="spawn")
        self._env: Dict[str, str] = {}

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        cluster = self._strategy.cluster_environment
        self._env = distributed._job_env(self._strategy.num_processes, cluster.main_address, str(cluster.main_port))
        return super().launch(function, *args, trainer=trainer, **kwargs)

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        distributed._enter_job(self._env, process_idx)
        super()._wrapping_function(process_idx, *args, **kwargs)
        distributed._leave_process_group()


class PjrtDDPStrategy(_CpuCheckpoints, _ProgramPerBatch, _PlDDP):
    """Lightning Trainer on N pjrt devices, one process each (``devices=N``).

    Lightning's DDP strategy without the ``DistributedDataParallel`` wrapper:
    rank 0's weights are broadcast at setup, the gradients are averaged over the
    processes after each backward (outside gradient accumulation's
    ``no_sync``), every training step starts from rank 0's buffers, and the
    step ends with ``torch_pjrt.sync()``. Reductions of logged values, ``all_gather`` and
    barriers use the job's process group, torch.distributed's backend
    ``"pjrt"`` (gloo on host copies)."""

    strategy_name = DDP_STRATEGY

    def __init__(self, **kwargs: Any):
        start_method = kwargs.pop("start_method", "spawn")
        if start_method != "spawn":
            raise ValueError(f"strategy 'pjrt_ddp' starts its processes with 'spawn', got start_method={start_method!r}: "
                             "a process forked after the PJRT plugin started cannot use it")
        backend = kwargs.get("process_group_backend")
        if backend not in (None, "pjrt"):
            raise ValueError(f"strategy 'pjrt_ddp' needs torch.distributed's backend 'pjrt', got process_group_backend="
                             f"{backend!r}: its group cannot reduce pjrt tensors (logged values, torchmetrics); leave "
                             "it unset")
        # the job's timeout (TORCH_PJRT_DIST_TIMEOUT), not Lightning's 30 minutes
        kwargs.setdefault("timeout", distributed.timeout())
        super().__init__(start_method="spawn", **kwargs)
        self._sync_gradients = True

    @_PlDDP.precision_plugin.setter
    def precision_plugin(self, precision_plugin) -> None:
        self._precision_plugin = _pjrt_precision(precision_plugin, _PlMixedPrecision)

    @property
    def root_device(self) -> torch.device:
        return torch.device(NAME, 0)  # each process's one device

    def _configure_launcher(self) -> None:
        # Under torchrun the processes exist already, with their environment:
        # their number must be the devices asked for (Lightning's check, which
        # its own launcher for such processes makes), or the sampler splits
        # the data for processes that do not exist.
        if self.cluster_environment.creates_processes_externally:
            self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
            self._launcher = None
        else:
            self._launcher = _PjrtLauncher(self)

    def setup_distributed(self) -> None:
        # DDP's, without its device_id, on torch.distributed's backend "pjrt"
        # (torch_pjrt.process_group: gloo on host copies), so that what calls
        # torch.distributed on pjrt tensors (torchmetrics' sync, Lightning's
        # SIGTERM forwarding) works.
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or "pjrt"
        _init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout)

    def setup(self, trainer) -> None:
        if self._layer_sync is not None and trainer.state.fn == TrainerFn.FITTING:
            # sync_batchnorm=True: nn.SyncBatchNorm, whose statistics go
            # through the job's "pjrt" process group (DDP's setup does the same)
            self.model = self._layer_sync.apply(self.model)
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        distributed.broadcast_master_param(self.model)  # every process starts from rank 0's weights
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @contextlib.contextmanager
    def block_backward_sync(self):
        """Gradient accumulation's backward passes before the last one (and
        manual optimization's ``toggle_model(sync_grad=False)``) leave the
        gradients local, as DDP's ``no_sync``."""
        was, self._sync_gradients = self._sync_gradients, False
        try:
            yield
        finally:
            self._sync_gradients = was

    def post_backward(self, closure_loss) -> None:
        # Averaged after each backward, as DDP does: what runs between the
        # backward and the step (on_after_backward, manual optimization's
        # clip_gradients) sees the mean gradients. Accumulated gradients stay
        # right: the mean of a sum is the sum of the means.
        super().post_backward(closure_loss)
        if self._sync_gradients:
            distributed.reduce_parameter_gradients([p for p in self.lightning_module.parameters() if p.requires_grad])

    def _broadcast_buffers(self) -> None:
        # DDP's broadcast_buffers: every process runs the forward with rank
        # 0's buffers (BatchNorm's running statistics), so that evaluation and
        # the logged metrics agree across processes; DDP does it before the
        # forwards of validation, test and predict too (a validation inside
        # fit logged each process's own statistics' loss here before)
        # (one broadcast per dtype of buffers)
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for b in self.lightning_module.buffers():
            by_dtype.setdefault(b.dtype, []).append(b)
        with torch.no_grad():
            for group in by_dtype.values():
                flat = distributed.broadcast(torch.cat([b.reshape(-1) for b in group]), 0)
                for b, v in zip(group, flat.split([b.numel() for b in group])):
                    b.copy_(v.view_as(b))

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._broadcast_buffers()
        return super().training_step(*args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        self._broadcast_buffers()
        return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        self._broadcast_buffers()
        return super().test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        self._broadcast_buffers()
        return super().predict_step(*args, **kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        torch_pjrt.sync()
        super().barrier(*args, **kwargs)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(DDP_STRATEGY, cls, description="one process per pjrt device (torch-pjrt)")


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


def _patch_auto_strategy(connector_cls, strategy_cls, ddp_cls=None) -> None:
    """Lightning's automatic strategy choice gives an accelerator it does not
    know a single-device strategy on ``"cpu"`` (or DDP for several devices);
    for pjrt it must be ours. The one hook Lightning offers is the
    connector's ``_choose_strategy``: wrap it."""
    original = connector_cls._choose_strategy
    if getattr(original, "_torch_pjrt", False):
        return

    def _choose_strategy(self):
        if _is_pjrt(self._accelerator_flag):
            if len(self._parallel_devices) == 1 and self._num_nodes_flag <= 1:
                return strategy_cls(device=self._parallel_devices[0])
            if ddp_cls is None:
                raise ValueError(_FABRIC_ONE_DEVICE.format(f"{len(self._parallel_devices)} devices"))
            return ddp_cls()
        return original(self)

    _choose_strategy._torch_pjrt = True
    connector_cls._choose_strategy = _choose_strategy


def _patch_strategy_check(connector_cls, parallel_cls, allowed: tuple, names: str) -> None:
    """A parallel strategy of Lightning's named explicitly with the pjrt
    accelerator (``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``) failed only in its
    processes, at their first collective ("No backend type associated with
    device type pjrt"): refused when the Trainer or Fabric is made."""
    original = connector_cls._init_strategy
    if getattr(original, "_torch_pjrt", False):
        return

    def _init_strategy(self):
        original(self)
        strategy = self.strategy
        if _is_pjrt(self._accelerator_flag) and isinstance(strategy, parallel_cls) and not isinstance(strategy, allowed):
            name = self._strategy_flag if isinstance(self._strategy_flag, str) else type(strategy).__name__
            raise ValueError(f"strategy {name!r} does not run on the pjrt accelerator (its process group is gloo's, "
                             f"which cannot reduce pjrt tensors, and its processes do not get one pjrt device each): "
                             f"use {names}; docs/lightning.md")

    _init_strategy._torch_pjrt = True
    connector_cls._init_strategy = _init_strategy


def _patch_oom_check() -> None:
    """Lightning's batch-size search (``Tuner.scale_batch_size``) backs off
    on the errors its ``is_oom_error`` knows: CUDA's and the CPU allocator's
    messages. pjrt's ``torch.OutOfMemoryError`` is one too."""
    from lightning.pytorch.tuner import batch_size_scaling

    known = batch_size_scaling.is_oom_error
    if getattr(known, "_torch_pjrt", False):
        return

    def is_oom_error(exception: BaseException) -> bool:
        return isinstance(exception, torch.OutOfMemoryError) or known(exception)

    is_oom_error._torch_pjrt = True
    batch_size_scaling.is_oom_error = is_oom_error


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
    if DDP_STRATEGY not in _PL_STRATEGIES:
        PjrtDDPStrategy.register_strategies(_PL_STRATEGIES)
    _patch_auto_strategy(_AcceleratorConnector, PjrtSingleDeviceStrategy, PjrtDDPStrategy)
    _patch_auto_strategy(_Connector, PjrtFabricSingleDeviceStrategy)
    _patch_strategy_check(_AcceleratorConnector, _PlParallel, (PjrtDDPStrategy,),
                          f"strategy={DDP_STRATEGY!r} (devices=N), or leave it unset")
    _patch_strategy_check(_Connector, _FabricParallel, (),
                          f"strategy={STRATEGY!r} (Fabric runs one pjrt device per process), or leave it unset")
    _patch_oom_check()


register()
