import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def client():
    import torch_pjrt

    return torch_pjrt.create_client(options={"cpu_device_count": 4} if _is_cpu() else {})


def _is_cpu() -> bool:
    return os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU"


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
