"""A process may exit while the plugin still runs a program it launched.

Without waiting, exit() destroys C++ statics (torch's registries, the
plugin's own) while the plugin's worker threads still execute the program:
SIGSEGV, or std::terminate inside the plugin ("terminate called without an
active exception", which is how rank 1 of torch_pjrt.launch died with the
PJRT API 0.115 CPU plugin: its last step was still running when it returned).
torch_pjrt waits for launched programs in a Python exit handler."""

import signal
import subprocess
import sys
import time

from conftest import run_python

# A program of about 3 s, whatever the machine's speed (8 products took 8 s
# on one 2-core machine and 0.9 s on another, too short for the wait's
# message after 1 s): it must outlive the interpreter's teardown (without
# the exit handler this crashed 2 runs of 3 on 2 cores).
EXIT_WHILE_RUNNING = """
import time, torch, torch_pjrt
d = torch_pjrt.device()
x = torch.randn(2500, 2500).to(d)
for _ in range(2):  # the second one timed, its program cached
    start = time.perf_counter()
    torch.tanh(x @ x).sum().item()
one = time.perf_counter() - start
for _ in range(max(8, int(3.0 / one))):
    x = torch.tanh(x @ x)
torch_pjrt.sync()  # launched, not awaited
print("exiting", flush=True)
"""


def test_exit_while_a_program_runs_is_clean():
    r = run_python(EXIT_WHILE_RUNNING)
    assert r.stdout.strip() == "exiting", r.stderr[-2000:]
    assert r.returncode == 0, f"exit code {r.returncode}: {r.stderr[-2000:]}"
    assert "terminate called" not in r.stderr


def test_ctrl_c_while_exit_waits_for_a_program_exits_at_once():
    # the running program cannot be stopped: a second Ctrl-C (or the first
    # one during the wait) ends the process instead of waiting it out
    p = subprocess.Popen([sys.executable, "-c", EXIT_WHILE_RUNNING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "exiting"
        line = p.stderr.readline()
        assert "waiting for the programs still running" in line, line + p.stderr.read()
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == -signal.SIGINT  # as an uncaught KeyboardInterrupt ends it
        assert time.monotonic() - t0 < 3.0
    finally:
        p.kill()
