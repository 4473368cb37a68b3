"""`import torch` never fails because of torch-pjrt (torch imports us through
its `torch.backends` entry point and re-raises our errors): registering the
device needs no plugin, no runtime and no environment, and an extension
built for another torch is reported at the first use of the device, with the
rebuild command. Each case runs in a fresh interpreter."""

import os
import sys

import pytest
import torch

from conftest import run_python

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Makes `import torch_pjrt._C` fail as a _C built for another torch does.
STALE_EXTENSION = """
import sys, importlib.abc
class Stale(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch_pjrt._C":
            raise ImportError("_C.so: undefined symbol: _ZN3c1015SmallVectorBaseIjE8grow_podEPKvmm")
sys.meta_path.insert(0, Stale())
"""

# The record a build for another torch leaves.
OTHER_TORCH_BUILD = """
import sys, types
info = types.ModuleType("torch_pjrt._build_info")
info.TORCH_VERSION, info.CXX11_ABI = "2.0.0+cpu", 1
sys.modules["torch_pjrt._build_info"] = info
"""

# After `import torch` and a seed (which reaches every registered device), the
# first use of the device must raise one clear error.
FIRST_USE = """
import torch
torch.manual_seed(0)
print("imported", torch.pjrt.is_available())
for use in (lambda: torch.ones(2, device="pjrt"), lambda: torch.zeros(2).to("pjrt")):
    try:
        use()
        print("no error")
    except Exception as e:
        print(type(e).__name__, e)
print("extension loaded:", "torch_pjrt._C" in sys.modules and hasattr(sys.modules["torch_pjrt._C"], "_sync"))
"""


def _import_then_use(prelude="", **env):
    r = run_python("import sys\n" + prelude + FIRST_USE, **env)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr, r.stderr  # the exit handlers of an unloaded extension
    lines = r.stdout.splitlines()
    assert lines[0] == "imported False", r.stdout
    return lines[1:3], lines[3]


@pytest.mark.parametrize("name, value, message", [
    ("TORCH_PJRT_PLUGIN", "/nonexistent/p.so", "Set TORCH_PJRT_PLUGIN to a plugin .so"),
    ("PJRT_DEVICE", "NOPE", "torch_pjrt.register_plugin('NOPE', path)"),
    ("CPU_NUM_DEVICES", "four", "CPU_NUM_DEVICES must be an integer from 1 to 127"),
    ("CPU_NUM_DEVICES", "128", "CPU_NUM_DEVICES must be an integer from 1 to 127"),
])
def test_a_bad_environment_is_an_error_at_first_use_not_at_import(name, value, message):
    # only this variable set: a TORCH_PJRT_PLUGIN inherited from the run (make
    # test-plugin sets one) names a file, and a file wins over PJRT_DEVICE
    env = {"TORCH_PJRT_PLUGIN": None, "PJRT_DEVICE": None, "CPU_NUM_DEVICES": None, name: value}
    errors, _ = _import_then_use(**env)
    for e in errors:
        assert e.startswith("PjrtError") and message in e


def test_an_extension_built_for_another_torch_is_never_loaded():
    errors, loaded = _import_then_use(OTHER_TORCH_BUILD)
    for e in errors:
        assert e.startswith("PjrtError torch_pjrt's native extension was built for torch 2.0.0+cpu"), e
        assert f"torch {torch.__version__}" in e and "make -C " in e and " build" in e
    assert loaded == "extension loaded: False"


def test_an_extension_that_fails_to_load_is_an_error_at_first_use():
    errors, _ = _import_then_use(STALE_EXTENSION)
    for e in errors:
        assert "native extension failed to load" in e and "undefined symbol" in e and "make -C " in e


def test_the_entry_point_guards_the_whole_package_import():
    # torch loads the entry point inside `import torch`. It lives outside the
    # package, so that even an error in the package's own import is caught.
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["torch.backends"] == {"torch_pjrt": "_torch_pjrt_autoload:load"}
    r = run_python("""
import sys, warnings, importlib.abc
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch_pjrt._device":
            raise RuntimeError("a bug in torch_pjrt")
sys.meta_path.insert(0, Broken())
import torch, _torch_pjrt_autoload
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    _torch_pjrt_autoload.load()  # as torch's autoload calls it
print(torch.ones(2).sum().item(), [str(m.message) for m in w])
""", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("2.0 ['torch-pjrt could not be loaded") and "a bug in torch_pjrt" in r.stdout


def test_seeding_before_first_use_neither_starts_the_runtime_nor_is_lost():
    r = run_python("""
import torch, torch_pjrt
torch.manual_seed(5)
print(torch_pjrt._C._initialized())
a = torch.rand(4, device="pjrt:1").cpu()
torch.manual_seed(5)
print(torch.equal(a, torch.rand(4, device="pjrt:1").cpu()))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_a_plugin_registered_after_import_serves_pjrt_device():
    import torch_pjrt

    path = torch_pjrt.find_plugin("CPU").path
    r = run_python(f"""
import torch
torch.manual_seed(1)
import torch_pjrt
torch_pjrt.register_plugin("mine", {path!r})
print((torch.ones(2, device="pjrt") + 1).cpu().tolist(), torch_pjrt.runtime.plugin_info()["path"] == {path!r})
""", PJRT_DEVICE="mine")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2.0, 2.0] True"


def test_the_build_records_the_torch_it_was_built_against():
    from torch_pjrt import _build_info, _extension

    assert (_build_info.TORCH_VERSION, _build_info.CXX11_ABI) == _extension.running_torch()


def test_the_rebuild_command_fits_how_the_package_was_installed(monkeypatch, tmp_path):
    import sys
    import types

    from torch_pjrt import _extension

    hint = _extension.rebuild_hint()
    assert "make -C " in hint  # this checkout (make build and the editable install)
    # Another venv than the checkout's .venv is named: make builds for it in a directory of its own.
    other_venv = os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(_extension._source_tree(), ".venv"))
    assert (f" build VENV={sys.prefix}`" in hint) == other_venv, hint
    monkeypatch.setattr(_extension, "_source_tree", lambda: None)  # as installed into site-packages by pip
    info = types.ModuleType("torch_pjrt._build_info")
    info.TORCH_VERSION, info.CXX11_ABI, info.BUILT_BY, info.SOURCE_DIR = "2.0.0", 1, "pip", str(tmp_path)
    monkeypatch.setitem(sys.modules, "torch_pjrt._build_info", info)
    monkeypatch.setattr(sys.modules["torch_pjrt"], "_build_info", info, raising=False)
    (tmp_path / "pyproject.toml").write_text("")
    hint = _extension.rebuild_hint()
    assert f"-m pip install --no-build-isolation --no-deps --force-reinstall --no-cache-dir {tmp_path}`" in hint
    (tmp_path / "pyproject.toml").unlink()  # built from an sdist unpacked in a directory since removed
    hint = _extension.rebuild_hint()
    assert "from its source (a checkout or the sdist it came from)" in hint and "--no-build-isolation" in hint


def test_pinned_memory_works_in_a_program_that_never_names_pjrt():
    # With torch-pjrt installed pjrt is the current accelerator, which
    # tensor.pin_memory() and DataLoader(pin_memory=True) ask for pinned
    # memory: plain host memory, recorded so that is_pinned() answers for it
    r = run_python("""
import torch
from torch.utils.data import DataLoader, TensorDataset
x = torch.rand(100)
p = x.pin_memory()
print(p.is_pinned(), x.is_pinned(), p[10:].is_pinned(), torch.equal(p, x), torch.empty(4, pin_memory=True).is_pinned())
batches = list(DataLoader(TensorDataset(torch.rand(8, 3)), batch_size=4, pin_memory=True))
print(all(b.is_pinned() for b, in batches), len(batches))
y = p.to("pjrt", non_blocking=True)
print(torch.equal(y.cpu(), x))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "True", "True", "True", "True", "2", "True"]
