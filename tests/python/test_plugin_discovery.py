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
    assert "CPU_NUM_DEVICES must be an integer from 1 to 127" in bad.stderr
    missing = run_module(["info"], TORCH_PJRT_PLUGIN=str(tmp_path / "nope.so"))
    assert missing.returncode == 1
    assert "not found" in missing.stderr and "Traceback" not in missing.stderr
    notelf = tmp_path / "fake.so"
    notelf.write_text("not a library")
    r = run_module(["info"], TORCH_PJRT_PLUGIN=str(notelf))
    assert r.returncode == 1 and "cannot load PJRT plugin" in r.stderr
    # a cut copy of the real plugin: dlopen maps it and touching a page past
    # the end killed the process with SIGBUS
    cut = tmp_path / "cut.so"
    with open(torch_pjrt.find_plugin("CPU").path, "rb") as f:
        cut.write_bytes(f.read(4 << 20))
    r = run_module(["info"], TORCH_PJRT_PLUGIN=str(cut))
    assert r.returncode == 1 and "the file is truncated" in r.stderr, (r.returncode, r.stderr[-500:])


def test_help_describes_info(run_module):
    r = run_module(["info", "--help"])
    assert r.returncode == 0
    assert "TORCH_PJRT_PLUGIN" in r.stdout


# --- several installed CPU plugins: the three package layouts and the rule.
# Recorded layouts are fake package directories in tmp_path; the one real
# library among them is the installed plugin, linked into a layout.

from torch_pjrt import _C, _plugins

CPU_LAYOUTS = {  # pip package -> library path inside site-packages
    "xla-cpu-pjrt": "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    "lammps-jax-pjrt-cpu": "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
    "fastatomstruct-xla-cpu": "fastatomstruct_xla_cpu/libpjrt_cpu.so",
}


def _fake_site(root, files):
    """files: {relative path: None (a file that is no library) or a path to link to}."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, target in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if target is None:
            p.write_text("not a library")
        else:
            p.symlink_to(target)
    return str(root)


def test_the_three_cpu_layouts_are_found_in_rule_order(tmp_path, monkeypatch):
    a = _fake_site(tmp_path / "a", {CPU_LAYOUTS["fastatomstruct-xla-cpu"]: None})
    b = _fake_site(tmp_path / "b", {CPU_LAYOUTS["lammps-jax-pjrt-cpu"]: None, CPU_LAYOUTS["xla-cpu-pjrt"]: None})
    monkeypatch.setenv("TORCH_PJRT_SEARCH_PATH", f"{a}:{b}")
    found = _C.plugin_candidates("CPU", [], False)
    assert [c["package"] for c in found] == ["xla-cpu-pjrt", "lammps-jax-pjrt-cpu", "fastatomstruct-xla-cpu"]
    assert [c["path"] for c in found] == [f"{b}/{CPU_LAYOUTS['xla-cpu-pjrt']}", f"{b}/{CPU_LAYOUTS['lammps-jax-pjrt-cpu']}",
                                          f"{a}/{CPU_LAYOUTS['fastatomstruct-xla-cpu']}"]
    assert all(c["pjrt_api_version"] == "" for c in found)  # not probed
    probed = _C.plugin_candidates("CPU", [], True)
    assert all("cannot be loaded" in c["problem"] and c["pjrt_api_version"] == "" for c in probed)


def test_rule_picks_the_newest_pjrt_api_on_recorded_versions():
    # The versions of xla-cpu-pjrt 0.0.1, lammps-jax-pjrt-cpu 0.11.2, fastatomstruct-xla-cpu 2026.6.23.
    assert _C._pick_newest_api([(0, 81), (0, 115), (0, 106)]) == 1
    assert _C._pick_newest_api([(0, 81), (0, 106)]) == 1
    assert _C._pick_newest_api([(0, 106), (0, 106)]) == 0  # ties: the earlier layout
    assert _C._pick_newest_api([(0, 56), (0, 57)]) == 1  # older than 0.57 is not supported
    assert _C._pick_newest_api([(1, 200), (-1, -1), (0, 3)]) == -1  # another major, unreadable, too old
    assert _C._pick_newest_api([]) == -1


def test_an_unusable_library_loses_to_a_working_plugin(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_PLUGIN", raising=False)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    real = os.path.realpath(torch_pjrt.find_plugin("CPU").path)
    # The broken library sits in the first layout: only the rule can make the second win.
    site = _fake_site(tmp_path / "site", {CPU_LAYOUTS["xla-cpu-pjrt"]: None, CPU_LAYOUTS["lammps-jax-pjrt-cpu"]: real})
    monkeypatch.setenv("TORCH_PJRT_SEARCH_PATH", site)
    choice = torch_pjrt.find_plugin()
    assert choice.path == f"{site}/{CPU_LAYOUTS['lammps-jax-pjrt-cpu']}"
    assert "newest PJRT API (0." in choice.reason and "of 2 installed CPU plugins" in choice.reason
    version = [c["pjrt_api_version"] for c in _plugins.plugin_candidates() if c["path"] == choice.path]
    assert version == ["%d.%d" % _C.Plugin.load(real).api_version]


def test_a_plugin_file_of_a_known_layout_is_a_cpu_plugin(monkeypatch):
    # So CPU_NUM_DEVICES reaches it (torch_pjrt.launch gives each process one device that way).
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    for rel in CPU_LAYOUTS.values():
        monkeypatch.setenv("TORCH_PJRT_PLUGIN", "/opt/site/" + rel)
        assert torch_pjrt.find_plugin().device == "CPU"
        assert _plugins.default_client_options() == {"cpu_device_count": 2}
    monkeypatch.setenv("TORCH_PJRT_PLUGIN", "/opt/site/libpjrt_cpu.so")  # not inside its package directory
    assert torch_pjrt.find_plugin().device == "CUSTOM"
    assert _plugins.default_client_options() == {}


def test_info_shows_the_choice_and_the_alternatives(run_module, tmp_path):
    real = os.path.realpath(torch_pjrt.find_plugin("CPU").path)
    site = _fake_site(tmp_path / "site", {CPU_LAYOUTS["xla-cpu-pjrt"]: real, CPU_LAYOUTS["fastatomstruct-xla-cpu"]: None})
    js = run_module(["info", "--json"], TORCH_PJRT_SEARCH_PATH=site, PJRT_DEVICE=None, TORCH_PJRT_PLUGIN=None,
                    CPU_NUM_DEVICES="1")
    assert js.returncode == 0, js.stderr
    info = json.loads(js.stdout)
    assert info["plugin"] == f"{site}/{CPU_LAYOUTS['xla-cpu-pjrt']}" and info["package"] == "xla-cpu-pjrt"
    assert "of 2 installed CPU plugins" in info["chosen_by"]
    [alt] = info["alternatives"]
    assert alt["package"] == "fastatomstruct-xla-cpu" and "cannot be loaded" in alt["problem"]
    text = run_module(["info"], TORCH_PJRT_SEARCH_PATH=site, PJRT_DEVICE=None, TORCH_PJRT_PLUGIN=None,
                      CPU_NUM_DEVICES="1")
    assert text.returncode == 0, text.stderr
    assert "alternatives" in text.stdout and "fastatomstruct-xla-cpu" in text.stdout


def test_memory_stats_come_from_the_plugin():
    from torch_pjrt import runtime

    stats = runtime.memory_stats(0)
    if runtime.device_type() == "CPU":
        # The three XLA CPU builds answer PJRT_Device_MemoryStats with
        # UNIMPLEMENTED: None, not numbers of our own making.
        assert stats is None
    else:
        assert stats["bytes_in_use"] >= 0
    with pytest.raises(IndexError, match="out of range"):
        runtime.memory_stats(runtime.addressable_device_count())
