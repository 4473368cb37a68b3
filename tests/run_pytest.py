"""Runs pytest over tests/python in N parallel shards (make test-python).

    python tests/run_pytest.py --shards N --log-dir DIR [pytest arguments...]

Shard k runs ``pytest --shard=k/N`` (tests/python/conftest.py assigns whole
test files to shards, balanced by their measured times). Shard 0 prints to
the terminal as it goes; the others write DIR/pytest-shard-<k>.log, which is
printed when they end. The exit status is the first failing one of the
shards (0 when all passed; a shard left without tests by a selection is
not a failure). ``--shards 1`` runs pytest alone, as before.

Two shards on a 2-core machine: the suite is mostly single-threaded Python
and XLA compiles, so the second core, idle under one pytest, takes the
other half (measured in README.md, build details).
"""
import argparse
import os
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--log-dir", default=".")
    opts, pytest_args = parser.parse_known_args()
    if opts.shards < 1:
        parser.error("--shards must be at least 1")
    cmd = [sys.executable, "-m", "pytest", *pytest_args]
    if opts.shards == 1:
        return subprocess.call(cmd)
    os.makedirs(opts.log_dir, exist_ok=True)
    logs = [os.path.join(opts.log_dir, f"pytest-shard-{k}.log") for k in range(1, opts.shards)]
    procs = []
    for k, log in enumerate(logs, start=1):
        with open(log, "w") as f:
            procs.append(subprocess.Popen([*cmd, f"--shard={k}/{opts.shards}"], stdout=f, stderr=subprocess.STDOUT))
        print(f"run_pytest: shard {k}/{opts.shards} runs in the background, output in {log}", flush=True)
    procs.insert(0, subprocess.Popen([*cmd, f"--shard=0/{opts.shards}"]))
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:  # Ctrl-C reached the shards too (same process group): let them stop
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        codes = [p.wait() for p in procs]
    for k, log in enumerate(logs, start=1):
        print(f"\n===== run_pytest: shard {k}/{opts.shards} (exit status {codes[k]}), {log} =====", flush=True)
        with open(log) as f:
            sys.stdout.write(f.read())
    print(f"\nrun_pytest: exit status of the shards {codes}", flush=True)
    # A shard that a selection left without tests (pytest's 5) is no failure
    # while another shard ran some.
    failed = [c for c in codes if c not in (0, NO_TESTS)]
    return failed[0] if failed else (0 if 0 in codes else NO_TESTS)


NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED (also when every test was deselected)


if __name__ == "__main__":
    sys.exit(main())
