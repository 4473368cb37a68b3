"""One place turns the environment into options (csrc/runtime/options.cc):
the documented table matches it, nothing else reads the environment, and
malformed values are errors naming the variable."""

import os
import re

import pytest
import torch

import torch_pjrt
from torch_pjrt import _C

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _doc_table():
    rows = []
    with open(os.path.join(ROOT, "docs", "environment.md")) as f:
        for line in f:
            m = re.match(r"\| `([A-Z_0-9]+)` \| (.*) \| (.*) \|$", line.rstrip("\n"))
            if m:
                rows.append(m.groups())
    return rows


def test_docs_list_exactly_the_variables_the_code_reads():
    code = [(n, m) for n, m, _ in _C._environment_variables()]
    doc = [(n, m) for n, m, _ in _doc_table()]
    assert doc == code, "docs/environment.md and csrc/runtime/options.cc disagree"
    names = [n for n, _ in code]
    assert len(names) == len(set(names))


def _sources(top, exts):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
        for name in files:
            if name.endswith(exts):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    yield os.path.relpath(path, ROOT), f.read()


def test_only_options_cc_reads_the_environment():
    readers = [p for p, text in _sources("csrc", (".cc", ".h")) if re.search(r"\bgetenv\s*\(", text)]
    assert readers == [os.path.join("csrc", "runtime", "options.cc")]
    # Python may write the environment for child processes (torch_pjrt.launch), never read it.
    read = re.compile(r"os\.environ\.get\(|os\.getenv\(|\bin os\.environ\b|os\.environ\[[^\]]+\](?!\s*=)")
    offenders = [p for p, text in _sources(os.path.join("python", "torch_pjrt"), ".py") if read.search(text)]
    assert offenders == []


def test_options_read_the_environment_now(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_DIST_TIMEOUT", "7.5")
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "warn")
    o = torch_pjrt.runtime.options()
    assert o["dist_timeout_s"] == 7.5 and o["fallback"] == "warn"
    assert torch_pjrt.distributed.timeout().total_seconds() == 7.5
    assert {v["name"] for v in torch_pjrt.runtime.environment()} >= {"PJRT_DEVICE", "CPU_NUM_DEVICES", "RANK"}


@pytest.mark.parametrize("name,value", [("CPU_NUM_DEVICES", "four"), ("TORCH_PJRT_FALLBACK", "maybe"),
                                        ("WORLD_SIZE", "0"), ("TORCH_PJRT_COMPILE_PROGRESS", "inf"),
                                        ("TORCH_PJRT_DIST_TIMEOUT", "1e10"), ("TORCH_PJRT_DEBUG", "yes"),
                                        ("CPU_NUM_DEVICES", "99999999999"), ("MASTER_PORT", "99999"),
                                        ("MASTER_PORT", "abc")])
def test_malformed_values_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(torch_pjrt.PjrtError, match=name):
        torch_pjrt.runtime.options()


def test_inconsistent_topology_is_an_error(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(torch_pjrt.PjrtError, match="RANK=3 with WORLD_SIZE=2"):
        torch_pjrt.runtime.process_index()


def test_client_options_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert torch_pjrt._plugins.default_client_options("CPU") == {"cpu_device_count": 2}
    monkeypatch.delenv("CPU_NUM_DEVICES")
    assert torch_pjrt._plugins.default_client_options("CPU") == {}
