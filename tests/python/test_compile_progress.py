"""Long compiles report progress when debugging is on: with TORCH_PJRT_DEBUG=1
(or TORCH_PJRT_LOG_LEVEL=info) a compile still running after
TORCH_PJRT_COMPILE_PROGRESS seconds gets a stderr line naming the program (op
count, cache key), and another when it ends; 0 reports every compile from its
start. Off, nothing is written (and no watcher thread is started)."""

import re

from conftest import first_use_error, run_python

# A step of a 12-layer MLP, forward, backward and Adam: a program of a few
# hundred ops that compiles in tenths of a second on the CPU plugin.
STEP = """
import os, sys, torch, torch_pjrt
torch.manual_seed(0)
layers = []
for _ in range(12):
    layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
model = torch.nn.Sequential(*layers).to("pjrt")
opt = torch.optim.Adam(model.parameters())
model(torch.randn(8, 64, device="pjrt")).square().mean().backward()
opt.step()
torch_pjrt.sync()
print("compile seconds", torch_pjrt.metrics.timers()["compile"])
"""

START = re.compile(r"torch_pjrt: compiling a program of (\d+) ops \(cache key ([\w-]+)\)\n")
STILL = re.compile(r"torch_pjrt: still compiling a program of (\d+) ops \(cache key ([\w-]+)\) after ([\d.]+) s\n")
END = re.compile(r"torch_pjrt: compiled a program of (\d+) ops \(cache key ([\w-]+)\) in ([\d.]+) s\n")


def _run(tmp_path, **env):
    r = run_python(STEP, TORCH_PJRT_DUMP_DIR=str(tmp_path), TORCH_PJRT_CACHE_DIR=None, **env)
    assert r.returncode == 0, r.stderr
    return r.stderr, float(r.stdout.split()[-1])


def test_every_compile_is_reported_from_its_start_with_progress_0(tmp_path):
    err, _ = _run(tmp_path, TORCH_PJRT_DEBUG="1", TORCH_PJRT_COMPILE_PROGRESS="0")
    starts, ends = START.findall(err), END.findall(err)
    assert starts and [s[:2] for s in ends] == starts, err
    # The cache key is the program's: the dump directory has one file by that name.
    assert sorted(k for _, k in starts) == sorted(p.stem for p in tmp_path.glob("*.mlir"))
    assert max(int(n) for n, _ in starts) > 100  # the training step


def test_a_compile_longer_than_the_threshold_reports_while_it_runs(tmp_path):
    err, seconds = _run(tmp_path, TORCH_PJRT_LOG_LEVEL="info", TORCH_PJRT_DEBUG=None,
                        TORCH_PJRT_COMPILE_PROGRESS="0.02")
    assert seconds > 0.1, f"the step compiled in {seconds} s: too fast to check the watcher"
    still = STILL.findall(err)
    assert still, err
    ends = {key: float(t) for _, key, t in END.findall(err)}
    for _, key, after in still:
        assert float(after) >= 0.02 and ends[key] >= float(after)  # each reported compile also ends
    assert not START.search(err)


def test_silent_when_off_or_below_the_threshold(tmp_path):
    for env in ({"TORCH_PJRT_DEBUG": None, "TORCH_PJRT_COMPILE_PROGRESS": "0"},
                {"TORCH_PJRT_DEBUG": "1", "TORCH_PJRT_COMPILE_PROGRESS": "300"}):
        err, _ = _run(tmp_path, TORCH_PJRT_LOG_LEVEL=None, **env)
        assert "compil" not in err.replace("compiling a new graph", ""), err


def test_a_malformed_threshold_is_an_error_naming_it():
    r = first_use_error(TORCH_PJRT_COMPILE_PROGRESS="soon")
    assert r.returncode == 0, r.stderr
    assert "TORCH_PJRT_COMPILE_PROGRESS" in r.stdout and "'soon'" in r.stdout
