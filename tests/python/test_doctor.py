"""python -m torch_pjrt doctor: hardware detection on recorded machine trees
(fake /proc, /sys and /dev), the plugin wheel it recommends, and the command
itself on this machine: exit code 0 when all is well, 1 with each problem's
fix otherwise."""

import json
import os

import pytest
import torch

from conftest import run_python
import torch_pjrt
from torch_pjrt import doctor

# /proc/driver/nvidia/version as the proprietary and the open kernel modules write it.
PROPRIETARY_535 = """NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023
GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)
"""
OPEN_580 = """NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul 22 23:41:07 UTC 2025
GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)
"""
OLD_470 = """NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.239.06  Wed Feb 28 23:03:33 UTC 2024
GCC version:  gcc version 9.4.0 (Ubuntu 9.4.0-1ubuntu1~20.04.2)
"""


def _write(root, rel, text=""):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _pci(root, address, vendor, cls):
    _write(root, f"sys/bus/pci/devices/{address}/vendor", vendor + "\n")
    _write(root, f"sys/bus/pci/devices/{address}/class", cls + "\n")


def _no_smi():
    return None


@pytest.mark.parametrize("text, version", [(PROPRIETARY_535, "535.104.05"), (OPEN_580, "580.65.06"),
                                           (OLD_470, "470.239.06"), ("garbage\n", None)])
def test_driver_version_is_read_from_both_kernel_modules(text, version):
    assert doctor.parse_nvidia_version(text) == version


@pytest.mark.parametrize("text, status, wheel", [
    (OPEN_580, "ok", "jax-cuda13-pjrt fits"),
    (PROPRIETARY_535, "ok", "jax-cuda12-pjrt fits"),
    (OLD_470, "fail", None),
])
def test_nvidia_driver_picks_the_plugin_wheel(tmp_path, text, status, wheel):
    root = str(tmp_path)
    _write(root, "proc/driver/nvidia/version", text)
    for gpu in ("0000:19:00.0", "0000:3b:00.0"):
        os.makedirs(os.path.join(root, "proc/driver/nvidia/gpus", gpu))
    hw = doctor.detect_hardware(root, nvidia_smi=_no_smi)
    assert hw.nvidia_gpus == 2 and hw.nvidia_driver == doctor.parse_nvidia_version(text)
    [check] = doctor.recommend(hw)
    assert check.status == status
    if wheel:
        assert wheel in check.detail
    else:
        assert "upgrade the NVIDIA driver to >= 580" in check.fix


def test_nvidia_gpu_without_a_driver_is_a_problem_with_its_fix(tmp_path):
    root = str(tmp_path)
    _pci(root, "0000:01:00.0", "0x10de", "0x030200")  # a 3D controller, no driver loaded
    _pci(root, "0000:00:1f.0", "0x8086", "0x060100")  # an Intel bridge: not a GPU
    hw = doctor.detect_hardware(root, nvidia_smi=_no_smi)
    assert hw.nvidia_gpus == 1 and hw.nvidia_driver is None
    [check] = doctor.recommend(hw)
    assert check.status == "fail" and "install the NVIDIA driver" in check.fix


def test_nvidia_smi_answers_when_proc_has_no_version(tmp_path):
    root = str(tmp_path)
    _pci(root, "0000:01:00.0", "0x10de", "0x030000")
    hw = doctor.detect_hardware(root, nvidia_smi=lambda: "550.54.15")
    assert (hw.nvidia_driver, hw.nvidia_driver_source) == ("550.54.15", "nvidia-smi")
    assert "jax-cuda12-pjrt fits" in doctor.recommend(hw)[0].detail


def test_tpu_chips_behind_vfio_and_accel(tmp_path):
    root = str(tmp_path)
    for i in range(4):  # TPU v5e/v6e: Google PCI functions handed out through VFIO groups
        _pci(root, f"0000:00:0{i + 4}.0", "0x1ae0", "0x120000")
        _write(root, f"dev/vfio/{i}")
    _write(root, "dev/vfio/vfio")  # the VFIO control node is not a chip
    hw = doctor.detect_hardware(root, nvidia_smi=_no_smi)
    assert hw.tpu_chips == 4 and hw.tpu_devices == [f"/dev/vfio/{i}" for i in range(4)]
    [check] = doctor.recommend(hw)
    assert check.status == "ok" and "libtpu" in check.detail

    accel = str(tmp_path / "accel")  # TPU v4: /dev/accel<N>, no PCI tree recorded
    for i in range(2):
        _write(accel, f"dev/accel{i}")
    hw = doctor.detect_hardware(accel, nvidia_smi=_no_smi)
    assert hw.tpu_chips == 2 and hw.tpu_devices == ["/dev/accel0", "/dev/accel1"]


def test_rocm_gpus_are_the_kfd_nodes_with_simds(tmp_path):
    root = str(tmp_path)
    _write(root, "dev/kfd")
    _write(root, "sys/class/kfd/kfd/topology/nodes/0/properties", "cpu_cores_count 64\nsimd_count 0\n")
    for node in (1, 2):
        _write(root, f"sys/class/kfd/kfd/topology/nodes/{node}/properties", "cpu_cores_count 0\nsimd_count 304\n")
    hw = doctor.detect_hardware(root, nvidia_smi=_no_smi)
    assert hw.rocm_kfd and hw.rocm_gpus == 2
    [check] = doctor.recommend(hw)
    assert check.status == "ok" and "ROCm" in check.detail


def test_a_machine_without_accelerators_fits_the_cpu_plugin(tmp_path):
    hw = doctor.detect_hardware(str(tmp_path), nvidia_smi=_no_smi)
    assert (hw.nvidia_gpus, hw.tpu_chips, hw.rocm_gpus, hw.nvidia_driver) == (0, 0, 0, None)
    [check] = doctor.recommend(hw)
    assert check.status == "info" and "xla-cpu-pjrt" in check.detail


def test_doctor_on_this_machine(run_module, tmp_path):
    cache = tmp_path / "cache"
    r = run_module(["doctor", "--json"], TORCH_PJRT_CACHE_DIR=str(cache), TORCH_PJRT_FALLBACK="warn")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["problems"] == []
    assert report["torch"] == torch.__version__ == report["torch_built_for"]
    cpu = [p for p in report["plugins"] if p["device"] == "CPU"]
    assert cpu and cpu[0]["pjrt_api_version"].count(".") == 1
    env = {e["name"]: e["value"] for e in report["environment"]}
    assert env["TORCH_PJRT_CACHE_DIR"] == str(cache) and env["TORCH_PJRT_FALLBACK"] == "warn"
    assert set(env) == {n for n, _, _ in torch_pjrt._C._environment_variables()}  # every variable, set or not
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["TORCH_PJRT_CACHE_DIR"]["status"] == "ok"
    assert checks["smoke test"]["status"] == "ok" and "equal to the CPU" in checks["smoke test"]["detail"]

    text = run_module(["doctor", "--no-smoke"], TORCH_PJRT_CACHE_DIR=str(cache))
    assert text.returncode == 0 and text.stdout.rstrip().endswith("no problems found"), text.stdout


def test_doctor_names_each_problem_and_its_fix(run_module, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    r = run_module(["doctor", "--json"], CPU_NUM_DEVICES="four")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    [problem] = report["problems"]
    assert "CPU_NUM_DEVICES must be an integer from 1 to 127" in problem["detail"] and problem["fix"]
    assert all(c["name"] != "smoke test" for c in report["checks"])  # nothing runs on a broken setup

    r = run_module(["doctor", "--no-smoke"], TORCH_PJRT_CACHE_DIR=str(blocker / "cache"))
    assert r.returncode == 0  # an unusable cache costs a warning, as at run time
    assert "[WARN] TORCH_PJRT_CACHE_DIR" in r.stdout and "fix: point TORCH_PJRT_CACHE_DIR" in r.stdout


def test_doctor_blames_torch_pjrt_plugin_when_its_file_does_not_load(run_module, tmp_path):
    r = run_module(["doctor", "--json", "--no-smoke"], TORCH_PJRT_PLUGIN=str(tmp_path / "missing.so"))
    assert r.returncode == 1
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["TORCH_PJRT_PLUGIN"]["status"] == "fail"
    assert "point TORCH_PJRT_PLUGIN at a PJRT plugin" in checks["TORCH_PJRT_PLUGIN"]["fix"]
    assert checks["plugin in use"]["status"] == "fail"  # not "ok" for a file that does not load


def test_doctor_reports_an_extension_built_for_another_torch():
    r = run_python("""
import sys, types
info = types.ModuleType("torch_pjrt._build_info")
info.TORCH_VERSION, info.CXX11_ABI = "2.0.0+cpu", 1
sys.modules["torch_pjrt._build_info"] = info
from torch_pjrt.__main__ import main
sys.exit(main(["doctor", "--no-smoke"]))
""")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[FAIL] native extension: torch_pjrt's native extension was built for torch 2.0.0+cpu" in r.stdout
    assert "fix: rebuild it against the running torch with `make -C " in r.stdout
