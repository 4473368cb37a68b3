"""Quiet by default, without hiding crashes: the PJRT plugin's informational
log lines (the XLA CPU plugin prints `cpu_device_count set via
create_options`, after absl's pre-initialisation warning, whenever
CPU_NUM_DEVICES is set) reach the user only when asked for
(TORCH_PJRT_LOG_LEVEL=info, or TF_CPP_MIN_LOG_LEVEL set by the user), through
the plugin's own log level; stderr itself is never redirected."""

import pytest

from conftest import _is_cpu, first_use_error, run_python

pytestmark = pytest.mark.skipif(not _is_cpu(), reason="the log lines checked are the XLA CPU plugin's")

USE = """
import os, sys, torch, torch_pjrt
print((torch.ones(2, device="pjrt") + 1).cpu().tolist())
print("after plugin: python", file=sys.stderr, flush=True)
os.write(2, b"after plugin: fd 2\\n")
"""

INFO_LINE = "cpu_device_count set via create_options"
ABSL_LINE = "All log messages before absl::InitializeLog()"


def test_the_plugin_is_quiet_by_default_and_stderr_still_works():
    r = run_python(USE, CPU_NUM_DEVICES="2", TORCH_PJRT_LOG_LEVEL=None, TF_CPP_MIN_LOG_LEVEL=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2.0, 2.0]"
    assert INFO_LINE not in r.stderr and ABSL_LINE not in r.stderr, r.stderr
    assert "after plugin: python" in r.stderr and "after plugin: fd 2" in r.stderr


@pytest.mark.parametrize("env", [{"TORCH_PJRT_LOG_LEVEL": "info", "TF_CPP_MIN_LOG_LEVEL": None},
                                 {"TORCH_PJRT_LOG_LEVEL": None, "TF_CPP_MIN_LOG_LEVEL": "0"},
                                 {"TORCH_PJRT_LOG_LEVEL": "error", "TF_CPP_MIN_LOG_LEVEL": "0"}])
def test_the_plugin_logs_when_asked(env):
    r = run_python(USE, CPU_NUM_DEVICES="2", **env)
    assert r.returncode == 0, r.stderr
    assert INFO_LINE in r.stderr


def test_child_processes_inherit_the_quiet_level():
    r = run_python(USE + """
import subprocess
subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"], check=True)
""", CPU_NUM_DEVICES="2", TORCH_PJRT_LOG_LEVEL="error", TF_CPP_MIN_LOG_LEVEL=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "2"


def test_a_malformed_level_is_an_error_at_first_use():
    r = first_use_error(TORCH_PJRT_LOG_LEVEL="loud")
    assert r.returncode == 0, r.stderr
    assert "TORCH_PJRT_LOG_LEVEL must be one of info, warning, error, fatal, got 'loud'" in r.stdout
