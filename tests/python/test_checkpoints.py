"""torch.save / torch.load of pjrt tensors, models and optimizers: exact round
trips with the default `weights_only=True`, to the saved device, the CPU or
another pjrt device; and a checkpoint saved from pjrt loads on the CPU where
torch-pjrt is not installed (storages are saved as bytes tagged "pjrt:<i>")."""

import io

import pytest
import torch

import torch_pjrt
from conftest import run_python

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.complex64]


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _values(dtype):
    x = torch.arange(-6, 6).reshape(3, 4) * 7
    return x > 0 if dtype == torch.bool else x.to(dtype) / (3 if dtype.is_floating_point else 1)


@pytest.mark.parametrize("map_location, device", [
    (None, "pjrt:1"), ("cpu", "cpu"), ("pjrt:2", "pjrt:2"), (torch.device("pjrt", 0), "pjrt:0"),
], ids=["saved-device", "cpu", "pjrt-string", "pjrt-device"])
def test_tensors_round_trip_exactly(map_location, device):
    saved = {str(d): _values(d).to("pjrt:1") for d in DTYPES}
    loaded = _round_trip(saved, map_location=map_location)
    for name, t in saved.items():
        assert loaded[name].device == torch.device(device) and loaded[name].dtype == t.dtype
        assert torch.equal(loaded[name].cpu(), t.cpu()), name
        assert (loaded[name] == t.to(loaded[name].device)).all().item(), name  # computed with, not only read back


def test_complex_tensors_loaded_onto_pjrt_compute_exactly():
    # torch.load uploads bytes; complex values are rebuilt from them on the device
    z = torch.tensor([1 + 2j, 3 - 1j, -0.5 + 1e-30j]).to("pjrt")
    buf = io.BytesIO()
    torch.save(z, buf)
    buf.seek(0)
    assert torch.equal((torch.load(buf) * 2).cpu(), z.cpu() * 2)
    buf.seek(0)
    assert torch.equal((torch.load(buf, map_location="cpu").to("pjrt") * 2).cpu(), z.cpu() * 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.float32, torch.int32, torch.bfloat16])
def test_a_loaded_tensor_read_as_itself_and_as_another_type_in_one_program(dtype):
    # The first typed read of the uploaded bytes types the storage; a view
    # of a third type read in the same program is then a bitcast of a bitcast,
    # which XLA's simplifier folded into one its verifier refused (the
    # compile failed and the loaded value was lost).
    saved = _values(dtype)
    loaded = _round_trip(saved.to("pjrt"), map_location="pjrt")
    views = [t for t in (torch.float32, torch.int32, torch.bfloat16, torch.int16, torch.uint8, torch.int64)
             if t.itemsize <= dtype.itemsize and t != dtype]
    got = [loaded * 1] + [loaded.view(t) * 1 for t in views]
    want = [saved * 1] + [saved.view(t) * 1 for t in views]
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w), (g.dtype, g.cpu(), w)
    assert torch.equal(loaded.cpu(), saved)


def test_views_keep_sharing_their_storage():
    base = torch.arange(12, dtype=torch.float32).to("pjrt:0")
    loaded = _round_trip({"base": base, "row": base.view(3, 4)[1], "col": base.view(3, 4)[:, 2]})
    assert loaded["row"].cpu().tolist() == [4, 5, 6, 7] and loaded["col"].cpu().tolist() == [2, 6, 10]
    loaded["base"].add_(100)  # one storage: the views see it
    assert loaded["row"].cpu().tolist() == [104, 105, 106, 107]


def test_pickle_and_legacy_save_copy_pending_values_and_views():
    # pickle and torch.save(_use_new_zipfile_serialization=False) copy a
    # storage to the host through at::from_blob of its data pointer
    import pickle
    base = torch.arange(12, dtype=torch.float32).to("pjrt:1") * 3  # pending, never synced
    tensors = {str(d): _values(d).to("pjrt") for d in DTYPES}
    tensors.update(pending=base, view=base.view(3, 4)[1:, ::2])
    for name, t in tensors.items():
        got = pickle.loads(pickle.dumps(t))
        assert got.device == t.device and got.dtype == t.dtype and torch.equal(got.cpu(), t.cpu()), name
    p = pickle.loads(pickle.dumps(torch.nn.Parameter(base.clone())))
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad and torch.equal(p.detach().cpu(), base.cpu())
    buf = io.BytesIO()
    torch.save(tensors, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    loaded = torch.load(buf)
    assert all(torch.equal(loaded[k].cpu(), t.cpu()) for k, t in tensors.items())
    loaded["pending"].add_(1)  # the view still shares the loaded storage
    assert loaded["view"].cpu().tolist() == [[13.0, 19.0], [25.0, 31.0]]

def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("pjrt")
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _step(model, opt, i):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 4, generator=g).to("pjrt"), torch.randn(16, 2, generator=g).to("pjrt")
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _trained(steps=2):
    model, opt = _model()
    for i in range(steps):
        _step(model, opt, i)
    return model, opt  # no sync: pending values must be saved as computed


def _assert_same(a, b, device):
    if isinstance(a, torch.Tensor):
        assert b.device.type == device and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k], device if not isinstance(a[k], torch.Tensor) or a[k].device.type != "cpu"
                         else "cpu")
    else:
        assert a == b


@pytest.mark.parametrize("map_location", [None, "cpu"])
def test_model_and_optimizer_state_round_trip(map_location):
    model, opt = _trained()
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    loaded = _round_trip(state, map_location=map_location)
    _assert_same(state["model"], loaded["model"], "pjrt" if map_location is None else "cpu")
    assert loaded["opt"]["param_groups"] == state["opt"]["param_groups"]
    for i, s in state["opt"]["state"].items():
        for k, v in s.items():
            w = loaded["opt"]["state"][i][k]
            assert torch.equal(v.cpu(), w.cpu()) and v.dtype == w.dtype
            assert w.device.type == ("cpu" if map_location == "cpu" else v.device.type)


@pytest.mark.parametrize("map_location", [None, "cpu"])
def test_resuming_from_a_checkpoint_continues_training_exactly(map_location):
    # One program per step in both runs: bits agree only for the same programs
    # (docs/semantics.md).
    model, opt = _model()
    for i in range(3):
        _step(model, opt, i)
        torch_pjrt.sync()
    reference = [p.detach().cpu() for p in model.parameters()]
    model, opt = _model()
    for i in range(2):
        _step(model, opt, i)
        torch_pjrt.sync()
    ckpt = _round_trip({"model": model.state_dict(), "opt": opt.state_dict()}, map_location=map_location)
    model, opt = _model()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    # the loads' copies in a program of their own, as in the first run, so
    # the step's program is the one the first run compiled for it
    torch_pjrt.sync()
    _step(model, opt, 2)
    torch_pjrt.sync()
    for p, r in zip(model.parameters(), reference):
        assert torch.equal(p.detach().cpu(), r)


def test_a_pjrt_checkpoint_loads_on_the_cpu_without_torch_pjrt(tmp_path):
    model, opt = _trained()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    expected = tmp_path / "expected.pt"
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, expected)
    r = run_python(f"""
import sys, importlib.abc
class NoTorchPjrt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch_pjrt":
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, NoTorchPjrt())
import torch
assert not hasattr(torch, "pjrt") and "torch_pjrt" not in sys.modules
ckpt = torch.load({str(path)!r}, map_location="cpu")
expected = torch.load({str(expected)!r})
assert all(torch.equal(ckpt["model"][k], v) and ckpt["model"][k].device.type == "cpu" for k, v in expected.items())
assert all(t.device.type == "cpu" for s in ckpt["opt"]["state"].values() for t in s.values())
print("ok", len(ckpt["model"]), len(ckpt["opt"]["state"]))
""", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok 4 4"


def test_a_failed_check_raises_before_torch_save_truncates_the_file(tmp_path):
    # an index out of range traced earlier raises when its value is read:
    # torch.save reads its tensors after it opened (truncated) the file, so
    # they are settled first and the good checkpoint there stays whole
    m = torch.nn.Linear(4, 4).to("pjrt")
    path = tmp_path / "ck.pt"
    torch.save({"model": m.state_dict(), "epoch": 1}, path)
    good = path.read_bytes()
    emb = torch.randn(3, 4, device="pjrt")
    m(emb[torch.tensor([0, 7], device="pjrt")]).sum().backward()
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch_pjrt.sync()
    with pytest.raises(IndexError):
        torch.save({"model": m.state_dict(), "epoch": 2}, path)
    assert path.read_bytes() == good
    assert torch.load(path)["epoch"] == 1
    # a whole module and a list are looked into too
    with pytest.raises(IndexError):
        torch.save([m], tmp_path / "other.pt")
    assert not (tmp_path / "other.pt").exists()
