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
        assert "waiting for the programs still compiling or running" in line, line + p.stderr.read()
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == -signal.SIGINT  # as an uncaught KeyboardInterrupt ends it
        assert time.monotonic() - t0 < 3.0
    finally:
        p.kill()


# Two failing programs: one read (its IndexError caught), one launched and
# never read; a third whose check passed. Only the unread failure is told.
UNREAD_LAUNCHED = """
import torch, torch_pjrt
d = torch_pjrt.device()
x = torch.zeros(5, device=d)
try:
    x[torch.tensor([7], device=d)].cpu()
except IndexError:
    print("caught", flush=True)
y = torch.zeros(5, device=d)
y[torch.tensor([2], device=d)] = 1.0
torch_pjrt.sync(wait=True)
z = torch.zeros(5, device=d)
z[torch.tensor([9], device=d)] = 1.0  # the unread failure (this line)
torch_pjrt.sync()
print("exiting", flush=True)
"""

# The failing check is still pending at exit: it is launched then.
UNREAD_PENDING = """
import torch, torch_pjrt
d = torch_pjrt.device()
z = torch.zeros(5, device=d)
z.index_add_(0, torch.tensor([11], device=d), torch.ones(1, device=d))
print("exiting", flush=True)
"""


def test_a_failure_nothing_read_is_printed_at_exit():
    for code, line in ((UNREAD_LAUNCHED, 13), (UNREAD_PENDING, 5)):
        r = run_python(code)
        assert r.returncode == 0 and r.stdout.split()[-1] == "exiting", r.stderr[-2000:]
        told = [s for s in r.stderr.splitlines() if s.startswith("torch_pjrt: at exit, a failure that nothing read")]
        assert len(told) == 1, r.stderr[-2000:]
        assert "index out of range" in told[0] and f"(traced at <string>:{line})" in told[0], told[0]
    # after an uncaught exception the pending work is not launched
    r = run_python(UNREAD_PENDING.replace('print("exiting", flush=True)', 'raise SystemError("stop")'))
    assert "SystemError: stop" in r.stderr and "at exit" not in r.stderr, r.stderr[-2000:]
