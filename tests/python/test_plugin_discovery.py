"""Plugin discovery and `python -m torch_pjrt info`, against the installed plugin."""

import json
import os

import pytest

import torch_pjrt


def test_default_is_an_installed_cpu_plugin(monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_PLUGIN", raising=False)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    choice = torch_pjrt.find_plugin()
    assert choice.device == "CPU"
    assert os.path.isfile(choice.path)
    assert choice.reason.startswith("default")


def test_explicit_plugin_path_wins(monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_PLUGIN", "/opt/x/plugin.so")
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    choice = torch_pjrt.find_plugin()
    assert choice.path == "/opt/x/plugin.so"
    assert choice.reason == "TORCH_PJRT_PLUGIN"


def test_missing_plugin_names_the_package(monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_PLUGIN", raising=False)
    with pytest.raises(torch_pjrt.PjrtError) as e:
        torch_pjrt.find_plugin("TPU")
    assert "pip install libtpu" in str(e.value)
    assert e.value.code_name == "NOT_FOUND"


def test_registered_plugin_is_found_by_name(monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_PLUGIN", raising=False)
    real = torch_pjrt.find_plugin("CPU").path
    torch_pjrt.register_plugin("mycpu", real)
    monkeypatch.setenv("PJRT_DEVICE", "mycpu")
    choice = torch_pjrt.find_plugin()
    assert (choice.path, choice.device, choice.reason) == (real, "MYCPU", "registered")
    client = torch_pjrt.create_client()
    assert client.platform_name == "cpu"


def test_info_text_and_json(run_module):
    text = run_module(["info"], CPU_NUM_DEVICES="3", PJRT_DEVICE=None, TORCH_PJRT_PLUGIN=None)
    assert text.returncode == 0, text.stderr
    assert "pjrt_api_version" in text.stdout and "xla_version" in text.stdout
    js = run_module(["info", "--json"], CPU_NUM_DEVICES="3", PJRT_DEVICE=None, TORCH_PJRT_PLUGIN=None)
    assert js.returncode == 0, js.stderr
    info = json.loads(js.stdout)
    assert info["device"] == "CPU" and info["platform_name"] == "cpu"
    major, minor = map(int, info["pjrt_api_version"].split("."))
    assert major == 0 and minor >= 57
    assert [d["id"] for d in info["devices"]] == [0, 1, 2]
    assert info["stablehlo_current_version"].count(".") == 2


def test_info_reports_bad_input_clearly(run_module, tmp_path):
    bad = run_module(["info"], CPU_NUM_DEVICES="many", TORCH_PJRT_PLUGIN=None)
    assert bad.returncode == 1
    assert "CPU_NUM_DEVICES must be a positive integer" in bad.stderr
    missing = run_module(["info"], TORCH_PJRT_PLUGIN=str(tmp_path / "nope.so"))
    assert missing.returncode == 1
    assert "not found" in missing.stderr and "Traceback" not in missing.stderr
    notelf = tmp_path / "fake.so"
    notelf.write_text("not a library")
    r = run_module(["info"], TORCH_PJRT_PLUGIN=str(notelf))
    assert r.returncode == 1 and "cannot load PJRT plugin" in r.stderr


def test_help_describes_info(run_module):
    r = run_module(["info", "--help"])
    assert r.returncode == 0
    assert "TORCH_PJRT_PLUGIN" in r.stdout
