import os
import signal
import subprocess
import sys
import zlib

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# `make test` started in the background by a non-interactive shell (`make
# test &`, nohup) inherits SIGINT ignored, and so would every process the
# Ctrl-C tests start (Python keeps an inherited SIG_IGN: no
# KeyboardInterrupt): those tests failed as if Ctrl-C did nothing. A Python
# handler here gives the children SIGINT's default, as an interactive run has.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test draws its CPU inputs from a seed of its own name, so a
    failure repeats on a rerun (torch seeds itself at random per process).
    Only the CPU generator: seeding pjrt's would start the device's client
    before the tests that check how it starts."""
    import torch

    torch.random.default_generator.manual_seed(zlib.crc32(request.node.nodeid.encode()))


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
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th (0-based) of N shards of the test files (tests/run_pytest.py runs N in parallel)")


# Seconds each test file took on a 2-core AMD EPYC (pytest alone, 2026-12-04):
# only to balance the shards. A file missing here still runs, in one shard,
# weighted DEFAULT_WEIGHT.
FILE_SECONDS = {
    "test_opinfo": 141, "test_ops": 90, "test_models": 65, "test_distributed": 48, "test_faults": 43,
    "test_linalg": 39, "test_compile_cache": 39, "test_replay": 36, "test_lightning": 34,
    "test_out_inplace": 33, "test_sequence_blocks": 31, "test_plugin_discovery": 27, "test_autocast": 25,
    "test_vision_blocks": 24, "test_spmd": 24, "test_training_parity": 23, "test_generation": 22,
    "test_special_values": 21, "test_device": 20, "test_dynamo": 20, "test_import_safety": 19,
    "test_views_inplace": 18, "test_rnn": 18, "test_compile_progress": 17, "test_plugin_logs": 16,
    "test_doctor": 15, "test_fallback_metrics": 9, "test_dtype_edges": 8, "test_checkpoints": 6,
    "test_process_exit": 5, "test_complex_fft": 4,
}
DEFAULT_WEIGHT = 10


def assign_shards(files, n):
    """Each of `files` (module names) in exactly one of `n` shards, the
    heaviest first into the lightest shard (whole files: a module's
    fixtures are computed once)."""
    shards = [[] for _ in range(n)]
    load = [0] * n
    for f in sorted(files, key=lambda f: (-FILE_SECONDS.get(f, DEFAULT_WEIGHT), f)):
        k = load.index(min(load))
        shards[k].append(f)
        load[k] += FILE_SECONDS.get(f, DEFAULT_WEIGHT)
    return shards


def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if spec is None:
        return
    k, n = (int(x) for x in spec.split("/"))
    if not 0 <= k < n:
        raise pytest.UsageError(f"--shard={spec}: K must be in [0, N)")
    module = lambda item: os.path.splitext(os.path.basename(str(item.path)))[0]
    mine = set(assign_shards(sorted({module(i) for i in items}), n)[k])
    kept = [i for i in items if module(i) in mine]
    config.hook.pytest_deselected(items=[i for i in items if module(i) not in mine])
    items[:] = kept
