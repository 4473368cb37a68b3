"""Lightning on pjrt (torch_pjrt.lightning): a LightningModule trained by
Trainer(accelerator="pjrt", devices=1) follows the same trajectory as
Trainer(accelerator="cpu") step for step; a checkpoint saved at step 10 and
resumed to step 20 ends where 20 uninterrupted CPU steps end; validate, test
and predict agree with the CPU; bf16 precisions run on pjrt's own autocast;
Fabric works the same way."""

import warnings

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
from lightning.fabric import Fabric  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import torch_pjrt  # noqa: E402
import torch_pjrt.lightning as tpl  # noqa: E402

BATCHES_PER_EPOCH = 10  # a checkpoint at step 10 falls on an epoch boundary


def _data(n=BATCHES_PER_EPOCH * 8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return TensorDataset(x, y)


class Net(pl.LightningModule):
    def __init__(self, sgd=False):
        super().__init__()
        self.sgd = sgd
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 2))
        self.compute_dtypes = set()
        self.devices_seen = set()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        logits = self(x)
        self.compute_dtypes.add(logits.dtype)
        self.devices_seen.add(logits.device.type)
        return torch.nn.functional.cross_entropy(logits.float(), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x).float(), y))

    def test_step(self, batch, _):
        x, y = batch
        self.log("test_loss", torch.nn.functional.cross_entropy(self(x).float(), y))

    def predict_step(self, batch, _):
        return self(batch[0]).float()

    def configure_optimizers(self):
        if self.sgd:
            return torch.optim.SGD(self.parameters(), lr=0.5)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _trainer(accelerator, max_steps=20, precision="32-true", **kw):
    return pl.Trainer(accelerator=accelerator, devices=1, max_steps=max_steps, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, **kw)


def _loader():
    return DataLoader(_data(), batch_size=8, shuffle=False)


def _weights(model):
    return {k: v.detach().cpu().float() for k, v in model.state_dict().items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def cpu_20():
    model = Net()
    _trainer("cpu").fit(model, _loader())
    return _weights(model)


def test_twenty_steps_match_the_cpu_and_sync_once_per_step(cpu_20):
    model = Net()
    trainer = _trainer("pjrt")
    assert isinstance(trainer.strategy, tpl.PjrtSingleDeviceStrategy)
    assert trainer.strategy.root_device == torch.device("pjrt", 0)
    before = torch_pjrt.metrics.counters().get("executions", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, _loader())
    ours = [str(w.message) for w in caught if "pjrt" in (w.filename + str(w.message)).lower()
            or issubclass(w.category, (DeprecationWarning, FutureWarning)) and "torch_pjrt" in w.filename]
    assert ours == []
    assert trainer.global_step == 20
    assert model.devices_seen == {"pjrt"}  # (Lightning moves the model back to the CPU when fit ends)
    assert _max_diff(_weights(model), cpu_20) < 1e-5
    # The optimizer step syncs: at least one program per step ran.
    assert torch_pjrt.metrics.counters().get("executions", 0) - before >= 20


def _save_at_ten_resume_to_twenty(accelerator, path):
    model = Net()
    trainer = _trainer(accelerator, max_steps=10)
    trainer.fit(model, _loader())
    trainer.save_checkpoint(path)
    resumed = Net()
    trainer = _trainer(accelerator, max_steps=20)
    trainer.fit(resumed, _loader(), ckpt_path=path)
    assert trainer.global_step == 20
    return _weights(model), _weights(resumed)


def test_checkpoint_at_ten_resumed_to_twenty_matches_the_cpu(tmp_path):
    at_ten, resumed = _save_at_ten_resume_to_twenty("pjrt", tmp_path / "pjrt.ckpt")
    saved = torch.load(tmp_path / "pjrt.ckpt", map_location="cpu", weights_only=False)
    assert all(t.device.type == "cpu" for t in saved["state_dict"].values())
    assert saved["optimizer_states"][0]["state"], "the optimizer's moments were not saved"
    assert _max_diff(saved["state_dict"], at_ten) == 0
    # The same sequence on the CPU. (Lightning replays one batch when it
    # resumes from a checkpoint written after `max_steps` stopped it, so the
    # resumed run is compared with a resumed run, not with 20 straight steps.)
    _, cpu_resumed = _save_at_ten_resume_to_twenty("cpu", tmp_path / "cpu.ckpt")
    assert _max_diff(resumed, cpu_resumed) < 1e-5
    assert _max_diff(resumed, at_ten) > 1e-3  # it did train on after resuming


def test_validate_test_predict_match_the_cpu():
    results = {}
    for accelerator in ("cpu", "pjrt"):
        model = Net()
        trainer = _trainer(accelerator)
        before = torch_pjrt.metrics.counters()["executions"]
        val = trainer.validate(model, _loader(), verbose=False)[0]["val_loss"]
        if accelerator == "pjrt":  # a program per batch (the epoch was one program)
            ran = torch_pjrt.metrics.counters()["executions"] - before
            assert BATCHES_PER_EPOCH <= ran <= BATCHES_PER_EPOCH + 3, ran
        test = trainer.test(model, _loader(), verbose=False)[0]["test_loss"]
        preds = torch.cat(trainer.predict(model, _loader()))
        results[accelerator] = (val, test, preds)
    (v0, t0, p0), (v1, t1, p1) = results["cpu"], results["pjrt"]
    assert abs(v0 - v1) < 1e-5 and abs(t0 - t1) < 1e-5
    assert p1.device.type == "cpu" or p1.device.type == "pjrt"
    assert torch.allclose(p1.cpu(), p0, rtol=1e-5, atol=1e-5)


class ManualNet(Net):
    """Manual optimization that steps the raw optimizer (or, with no
    optimizer, updates the weights itself): nothing passes through
    Lightning's optimizer step, whose sync used to be the only one."""

    def __init__(self, raw_optimizer):
        super().__init__(sgd=True)
        self.raw_optimizer = raw_optimizer
        self.automatic_optimization = False

    def training_step(self, batch, _):
        loss = super().training_step(batch, _)
        if self.raw_optimizer:
            opt = self.optimizers(use_pl_optimizer=False)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        else:
            grads = torch.autograd.grad(loss, list(self.parameters()))
            with torch.no_grad():
                for p, g in zip(self.parameters(), grads):
                    p.sub_(0.5 * g)

    def configure_optimizers(self):
        return super().configure_optimizers() if self.raw_optimizer else None


@pytest.mark.parametrize("raw_optimizer", [True, False], ids=["raw_optimizer", "no_optimizer"])
def test_manual_optimization_is_a_program_per_step(raw_optimizer):
    weights = {}
    for accelerator in ("cpu", "pjrt"):
        model = ManualNet(raw_optimizer)
        # (global_step counts Lightning's optimizer steps only: none here)
        trainer = _trainer(accelerator, max_steps=-1, max_epochs=2)
        before = torch_pjrt.metrics.counters()["executions"]
        trainer.fit(model, _loader())
        weights[accelerator] = _weights(model)
    ran = torch_pjrt.metrics.counters()["executions"] - before
    assert 20 <= ran <= 26, ran  # one per step, a few at epoch ends (before: 3-5 for the 20 steps)
    assert _max_diff(weights["pjrt"], weights["cpu"]) < 1e-5


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_precisions_train_on_pjrt(precision):
    # SGD: AdamW divides each gradient by its own scale, so a bfloat16
    # rounding difference in a near-zero gradient becomes a whole step.
    out = {}
    for accelerator in ("cpu", "pjrt"):
        model = Net(sgd=True)
        _trainer(accelerator, max_steps=10, precision=precision).fit(model, _loader())
        out[accelerator] = model
    pjrt, cpu = out["pjrt"], out["cpu"]
    start = _weights(Net())
    # bf16-mixed: autocast computes the linear layers in bfloat16 (pjrt's
    # autocast, not CUDA's) and keeps the weights in float32; bf16-true: all bfloat16.
    assert pjrt.compute_dtypes == {torch.bfloat16} == cpu.compute_dtypes
    want = torch.float32 if precision == "bf16-mixed" else torch.bfloat16
    assert {p.dtype for p in pjrt.parameters()} == {want}
    # Same trajectory within bfloat16's resolution (the autocast policies of
    # CPU and pjrt differ in which ops they cast, not in the linear layers),
    # small against how far training moved the weights.
    diff, moved = _max_diff(_weights(pjrt), _weights(cpu)), _max_diff(_weights(cpu), start)
    assert diff < 1e-2 and diff < moved / 10, (diff, moved)


def test_mixed_precision_uses_pjrt_autocast():
    trainer = _trainer("pjrt", precision="bf16-mixed")
    assert trainer.strategy.precision_plugin.device == "pjrt"
    fabric = Fabric(accelerator="pjrt", devices=1, precision="bf16-mixed")
    assert fabric.strategy.precision.device == "pjrt"
    linear = torch.nn.Linear(4, 2)
    inside = []
    linear.register_forward_hook(lambda m, i, o: inside.append((o.device.type, o.dtype)))
    model = fabric.setup(linear)
    out = model(torch.ones(3, 4, device="pjrt"))
    assert inside == [("pjrt", torch.bfloat16)]  # computed under autocast; Fabric returns float32
    assert out.dtype == torch.float32 and model.weight.dtype == torch.float32


class SplitNet(Net):
    """Net whose loaders give process r of n the batch slices r, r+n, ...
    of the one-device loader's batches (8 rows); its test also logs a
    torchmetrics metric, which synchronizes itself across processes
    (torch.distributed on pjrt tensors)."""

    def __init__(self, sgd=False):
        super().__init__(sgd)
        import torchmetrics

        self.mse = torchmetrics.MeanSquaredError()

    def _loader(self):
        n, rank = self.trainer.world_size, self.trainer.global_rank
        sampler = torch.utils.data.distributed.DistributedSampler(_data(), n, rank, shuffle=False)
        return DataLoader(_data(), batch_size=8 // n, sampler=sampler)

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x).float(), y), sync_dist=True)

    def test_step(self, batch, _):
        x, y = batch
        logits = self(x).float()
        self.log("test_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.mse(logits.softmax(-1)[:, 1], y.float())
        self.log("test_mse", self.mse)

    def on_predict_start(self):
        self.predictions = []

    def predict_step(self, batch, _):
        out = super().predict_step(batch, _)
        self.predictions.append(out.cpu())
        return out

    def on_predict_end(self):  # spawned processes return no predictions (Lightning): each writes its own
        torch.save(torch.cat(self.predictions), f"{self.out_dir}/predictions{self.global_rank}.pt")
        r = float(self.global_rank)
        gathered = [self.all_gather(torch.tensor([[r, r + 10]], device=self.device)),
                    self.all_gather(torch.tensor(r, device=self.device))]
        assert all(g.device == self.device for g in gathered)
        torch.save([g.cpu() for g in gathered], f"{self.out_dir}/gathered{self.global_rank}.pt")


def test_two_processes_match_one_device(cpu_20, tmp_path):
    # devices=2: strategy pjrt_ddp, one process per device (spawned for each
    # of fit, validate, test and predict), each on half of every batch.
    trainer = pl.Trainer(accelerator="pjrt", devices=2, max_steps=20, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         use_distributed_sampler=False)
    assert isinstance(trainer.strategy, tpl.PjrtDDPStrategy) and trainer.strategy.num_processes == 2
    model = SplitNet()
    model.out_dir = str(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
        val = trainer.validate(model, verbose=False)[0]["val_loss"]
        tested = trainer.test(model, verbose=False)[0]
        test = tested["test_loss"]
        trainer.predict(model)
        preds = [torch.load(tmp_path / f"predictions{rank}.pt") for rank in (0, 1)]
        gathered = [torch.load(tmp_path / f"gathered{rank}.pt") for rank in (0, 1)]
    assert [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))] == []
    # The weights rank 0 ended with came back: 20 steps of the gradient mean
    # over two half batches end where 20 steps on whole batches end.
    assert _max_diff(_weights(model), cpu_20) < 1e-5
    # Validation and test means over both processes (sync_dist) are the
    # one-device means; each process predicted its half of the rows.
    one = _trainer("cpu")
    assert abs(val - one.validate(model, _loader(), verbose=False)[0]["val_loss"]) < 1e-5
    one_tested = one.test(model, _loader(), verbose=False)[0]
    assert abs(test - one_tested["test_loss"]) < 1e-5
    assert abs(tested["test_mse"] - one_tested["test_mse"]) < 1e-6  # the metric's state summed over both
    want = torch.cat(one.predict(model, _loader()))
    # all_gather stacks every process's tensor (world size first), as Lightning's own does.
    for g in gathered:
        assert torch.equal(g[0], torch.tensor([[[0.0, 10.0]], [[1.0, 11.0]]]))
        assert torch.equal(g[1], torch.tensor([0.0, 1.0]))
    for rank in (0, 1):
        assert preds[rank].shape == want[rank::2].shape
        assert torch.allclose(preds[rank], want[rank::2], rtol=1e-5, atol=1e-5)


class ManualClipNet(SplitNet):
    """Manual optimization that clips between the backward and the step (a
    gradient mean is what DDP clips), and a buffer each process counts up by
    its rank + 1 per step: DDP's broadcast_buffers gives every step rank 0's,
    and every validation too (what each validation saw is kept)."""

    def __init__(self):
        super().__init__(sgd=True)
        self.automatic_optimization = False
        self.register_buffer("counter", torch.zeros(()))
        self.seen = []

    def validation_step(self, batch, i):
        if i == 0:
            self.seen.append(self.counter.item())
        return super().validation_step(batch, i)

    def training_step(self, batch, _):
        opt = self.optimizers()
        self.counter += self.global_rank + 1
        loss = super().training_step(batch, _)
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad()

    def on_train_end(self):
        if hasattr(self, "out_dir"):
            torch.save((self.counter.cpu(), self.seen), f"{self.out_dir}/counter{self.global_rank}.pt")


def test_two_processes_clip_mean_gradients_and_share_rank_zeros_buffers(tmp_path):
    one = ManualClipNet()
    _trainer("cpu", max_steps=10).fit(one, _loader())
    model = ManualClipNet()
    model.out_dir = str(tmp_path)
    trainer = pl.Trainer(accelerator="pjrt", devices=2, max_steps=10, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         use_distributed_sampler=False, val_check_interval=5)
    assert trainer.strategy._timeout == torch_pjrt.distributed.timeout()  # TORCH_PJRT_DIST_TIMEOUT, not 30 minutes
    trainer.fit(model)
    # clipped local gradients ended 3e-3 away before the gradients were averaged after each backward
    assert _max_diff({k: v for k, v in _weights(model).items() if k != "counter"},
                     {k: v for k, v in _weights(one).items() if k != "counter"}) < 1e-5
    # each step starts from rank 0's buffer: 4 steps of +1, then the fifth step's own +1 or +2;
    # the validations after steps 5 and 10 take rank 0's (rank 1 saw its own, 6 and 11, before),
    # which the training ends with
    ends = [torch.load(tmp_path / f"counter{r}.pt") for r in (0, 1)]
    assert [seen for _, seen in ends] == [[5.0, 10.0], [5.0, 10.0]]
    assert [counter.item() for counter, _ in ends] == [10.0, 10.0]


class BatchNormNet(SplitNet):
    """SplitNet with a BatchNorm layer: with sync_batchnorm=True its
    statistics over the two processes' halves are the whole batch's."""

    def __init__(self):
        super().__init__(sgd=True)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.GELU(),
                                       torch.nn.Linear(32, 2))


def test_two_processes_with_sync_batchnorm_match_one_device():
    one = BatchNormNet()
    _trainer("cpu", max_steps=10).fit(one, _loader())
    model = BatchNormNet()
    trainer = pl.Trainer(accelerator="pjrt", devices=2, max_steps=10, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         use_distributed_sampler=False, sync_batchnorm=True)
    trainer.fit(model)
    # weights and running statistics as one device's on whole batches (each
    # process's own BatchNorm would see only its half)
    assert type(model.net[1]) is torch.nn.BatchNorm1d  # converted back when the fit ends, as Lightning's DDP
    assert _max_diff(_weights(model), _weights(one)) < 1e-5


def test_devices_other_than_torchruns_processes_are_refused(monkeypatch):
    # under torchrun the processes exist: devices=3 with 2 of them split the
    # data for a process that does not exist (a third of every epoch unseen)
    for k, v in {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                 "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"devices=3.*does not match the world size \(2\)"):
        pl.Trainer(accelerator="pjrt", devices=3, logger=False)


def test_bad_device_lists_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="runs process i on device i.*devices=2"):
        pl.Trainer(accelerator="pjrt", devices=[1, 3])
    with pytest.raises(ValueError, match="Fabric.*one device in one process.*pjrt_ddp"):
        Fabric(accelerator="pjrt", devices=2)
    with pytest.raises(ValueError, match="start_method='fork'"):
        tpl.PjrtDDPStrategy(start_method="fork")
    with pytest.raises(ValueError, match="backend 'pjrt', got process_group_backend='gloo'"):
        tpl.PjrtDDPStrategy(process_group_backend="gloo")  # logged values and torchmetrics would fail in its processes
    assert pl.Trainer(accelerator="pjrt", logger=False).strategy.root_device == torch.device("pjrt", 0)  # devices="auto"
    # Lightning's own DDP strategies failed in their processes, at their first collective
    for strategy in ("ddp", "ddp_spawn"):
        with pytest.raises(ValueError, match=f"strategy '{strategy}' does not run on the pjrt accelerator.*pjrt_ddp"):
            pl.Trainer(accelerator="pjrt", devices=2, strategy=strategy, logger=False)
    with pytest.raises(ValueError, match="does not run on the pjrt accelerator.*pjrt_single"):
        Fabric(accelerator="pjrt", devices=1, strategy="ddp")
    assert isinstance(pl.Trainer(accelerator="pjrt", devices=2, strategy="pjrt_ddp", logger=False).strategy,
                      tpl.PjrtDDPStrategy)
    assert isinstance(pl.Trainer(accelerator="pjrt", devices=1, strategy="pjrt_single", logger=False).strategy,
                      tpl.PjrtSingleDeviceStrategy)


class _Hungry(Net):
    """A step whose memory grows with the batch: beyond 8 rows it asks the
    device for 2**40 bytes (refused by pjrt with torch.OutOfMemoryError)."""

    def __init__(self):
        super().__init__()
        self.batch_size = 2

    def train_dataloader(self):
        return DataLoader(_data(), batch_size=self.batch_size)

    validation_step = None  # (Net's needs a val_dataloader)

    def training_step(self, batch, i):
        loss = super().training_step(batch, i)
        if batch[0].shape[0] > 8:
            loss = loss + torch.zeros(2**38, device=loss.device).sum()
        return loss


def test_batch_size_search_backs_off_on_pjrt_out_of_memory(tmp_path):
    # Lightning's is_oom_error knew CUDA's and the CPU allocator's messages
    # only: the search ended with pjrt's OutOfMemoryError at 16
    from lightning.pytorch.tuner import Tuner

    model = _Hungry()
    trainer = _trainer("pjrt", max_steps=3, limit_val_batches=0, default_root_dir=tmp_path)  # (its checkpoint)
    found = Tuner(trainer).scale_batch_size(model, mode="power", init_val=2, max_trials=5, steps_per_trial=2)
    assert found == 8 and model.batch_size == 8


def test_an_unavailable_accelerator_says_why(monkeypatch):
    def missing():
        raise torch_pjrt.PjrtError("no PJRT plugin for PJRT_DEVICE=FOO")

    monkeypatch.setattr(torch_pjrt, "find_plugin", missing)
    with pytest.warns(UserWarning, match="pjrt accelerator is not available: .*PJRT_DEVICE=FOO"):
        with pytest.raises(Exception, match="not available"):
            pl.Trainer(accelerator="pjrt", devices=1, logger=False)


def test_fabric_matches_the_cpu():
    def run(accelerator):
        fabric = Fabric(accelerator=accelerator, devices=1)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = fabric.setup(model, opt)
        loader = fabric.setup_dataloaders(_loader())
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
        assert x.device.type == ("pjrt" if accelerator == "pjrt" else "cpu")
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    cpu, pjrt = run("cpu"), run("pjrt")
    assert _max_diff(pjrt, cpu) < 1e-5


@pytest.mark.parametrize("imports", ["import torch_pjrt; import lightning as L",
                                     "import lightning as L; import torch_pjrt",
                                     "import torch_pjrt; import lightning.fabric; import lightning as L"])
def test_the_accelerator_is_registered_without_importing_torch_pjrt_lightning(imports):
    # Lightning has no entry point for accelerators: Trainer(accelerator="pjrt")
    # raised "invalid accelerator name" unless torch_pjrt.lightning was imported.
    from conftest import run_python

    r = run_python(imports + """
t = L.Trainer(accelerator="pjrt", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
f = L.Fabric(accelerator="pjrt", devices=1)
print(type(t.accelerator).__name__, type(t.strategy).__name__, type(f.accelerator).__name__)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-3:] == ["PjrtAccelerator", "PjrtSingleDeviceStrategy", "PjrtAccelerator"], r.stdout
