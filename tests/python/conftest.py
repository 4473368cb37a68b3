import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def client():
    import torch_pjrt

    return torch_pjrt.create_client(options={"cpu_device_count": 4} if _is_cpu() else {})


def _is_cpu() -> bool:
    return os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU"


def run_python(code: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with extra environment variables."""
    full = dict(os.environ)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = str(v)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout)


def first_use_error(**env) -> subprocess.CompletedProcess:
    """Creates a pjrt tensor in a fresh interpreter with `env`; prints the
    PjrtError it raises, if any."""
    return run_python("""
import torch, torch_pjrt
try:
    torch.ones(2, device="pjrt")
except torch_pjrt.PjrtError as e:
    print(e)
""", **env)


@pytest.fixture
def run_module():
    """Runs `python -m torch_pjrt ...` in a subprocess with extra env vars."""

    def run(args, **env):
        full = dict(os.environ)
        for k, v in env.items():
            if v is None:
                full.pop(k, None)
            else:
                full[k] = v
        return subprocess.run(
            [sys.executable, "-m", "torch_pjrt", *args], capture_output=True, text=True, env=full, timeout=120
        )

    return run


def pytest_addoption(parser):
    parser.addoption("--models", default="subset", choices=("subset", "all"),
                     help="test_models.py: the subset in make test, or every family, mode and variant (make models)")
