"""``python -m torch_pjrt doctor``: is this environment able to run pjrt, and
if not, what to do about it.

It reports the running torch and the torch ``_C`` was built for, the PJRT
plugins installed and their API versions, the hardware found (NVIDIA driver
and GPUs, TPU chips, ROCm GPUs) and which plugin wheel fits it, every
environment variable torch-pjrt reads that is set, whether the compile cache
directory is writable, and a smoke test (a small program compiled and run on
the chosen plugin, in a child process so that a crashing plugin cannot take
the doctor with it). Each problem comes with its fix; the exit code is 1 when
there is one.

The hardware probes read files only (``/proc``, ``/sys``, ``/dev``) under a
``root`` that tests point at recorded trees; ``nvidia-smi`` is a fallback for
the driver version when ``/proc/driver/nvidia/version`` is missing.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# Minimum NVIDIA driver of each CUDA major the plugin wheels are built with
# (NVIDIA's CUDA compatibility guide: CUDA 13.x needs >= 580, CUDA 12.x
# >= 525.60.13 through minor-version compatibility).
CUDA13_MIN_DRIVER = (580, 65, 6)
CUDA12_MIN_DRIVER = (525, 60, 13)

NVIDIA_PCI_VENDOR = "0x10de"
GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips
DISPLAY_OR_3D_CLASS = ("0x0300", "0x0302")  # PCI class prefixes of GPUs


@dataclass
class Check:
    name: str
    status: str  # "ok", "info", "warn" or "fail"
    detail: str
    fix: str = ""


@dataclass
class Hardware:
    nvidia_driver: Optional[str] = None  # "580.65.06"
    nvidia_gpus: int = 0  # GPUs the driver lists, else NVIDIA display/3D PCI functions
    nvidia_driver_source: str = ""  # where the version came from
    tpu_chips: int = 0
    tpu_devices: List[str] = field(default_factory=list)  # /dev/accel*, /dev/vfio/<n>
    rocm_gpus: int = 0
    rocm_kfd: bool = False


def _read(path: str) -> Optional[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def parse_nvidia_version(text: str) -> Optional[str]:
    """The driver version in ``/proc/driver/nvidia/version``'s NVRM line, e.g.
    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19
    ...`` or ``... Open Kernel Module for x86_64  580.65.06  Release Build ...``."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", line)
            if m:
                return m.group(1)
    return None


def version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _pci_devices(root: str) -> List[Tuple[str, str]]:
    """(vendor, class) of every PCI function under root/sys/bus/pci/devices."""
    out = []
    for d in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*"))):
        vendor = (_read(os.path.join(d, "vendor")) or "").strip().lower()
        cls = (_read(os.path.join(d, "class")) or "").strip().lower()
        out.append((vendor, cls))
    return out


def detect_hardware(root: str = "/", nvidia_smi: Optional[Callable[[], Optional[str]]] = None) -> Hardware:
    """What accelerators this machine has, read from ``root`` (``/`` on a real
    machine, a recorded tree in tests). ``nvidia_smi`` returns the driver
    version when /proc has none (default: asks ``nvidia-smi``)."""
    hw = Hardware()
    pci = _pci_devices(root)

    text = _read(os.path.join(root, "proc/driver/nvidia/version"))
    if text is not None:
        hw.nvidia_driver = parse_nvidia_version(text)
        hw.nvidia_driver_source = "/proc/driver/nvidia/version"
    hw.nvidia_gpus = len(glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*")))
    if hw.nvidia_gpus == 0:
        hw.nvidia_gpus = sum(1 for v, c in pci if v == NVIDIA_PCI_VENDOR and c.startswith(DISPLAY_OR_3D_CLASS))
    if hw.nvidia_driver is None and (hw.nvidia_gpus or text is not None):
        ask = nvidia_smi if nvidia_smi is not None else _nvidia_smi_driver
        version = ask()
        if version:
            hw.nvidia_driver, hw.nvidia_driver_source = version, "nvidia-smi"

    hw.tpu_chips = sum(1 for v, _ in pci if v == GOOGLE_PCI_VENDOR)
    hw.tpu_devices = sorted(glob.glob(os.path.join(root, "dev/accel*")))
    if hw.tpu_chips:  # TPU v5e/v6e hand their chips to user space through VFIO groups
        hw.tpu_devices += sorted(p for p in glob.glob(os.path.join(root, "dev/vfio/*")) if os.path.basename(p).isdigit())
    hw.tpu_devices = [os.path.join("/", os.path.relpath(p, root)) for p in hw.tpu_devices]
    if not hw.tpu_chips:
        hw.tpu_chips = len([p for p in hw.tpu_devices if "/dev/accel" in p])

    hw.rocm_kfd = os.path.exists(os.path.join(root, "dev/kfd"))
    for props in glob.glob(os.path.join(root, "sys/class/kfd/kfd/topology/nodes/*/properties")):
        m = re.search(r"^simd_count\s+(\d+)", _read(props) or "", re.M)
        if m and int(m.group(1)) > 0:  # CPU nodes have no SIMDs
            hw.rocm_gpus += 1
    return hw


def _nvidia_smi_driver() -> Optional[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = r.stdout.strip().splitlines()[:1]
    return first[0].strip() if r.returncode == 0 and first else None


def recommend(hw: Hardware) -> List[Check]:
    """Which plugin wheel fits the hardware, or what stands in the way."""
    out: List[Check] = []
    if hw.nvidia_gpus or hw.nvidia_driver:
        what = f"{hw.nvidia_gpus} NVIDIA GPU(s)" if hw.nvidia_gpus else "an NVIDIA driver"
        if not hw.nvidia_driver:
            out.append(Check("plugin for NVIDIA", "fail", f"{what}, but no NVIDIA driver is loaded",
                             "install the NVIDIA driver (>= 580 for jax-cuda13-pjrt, >= 525.60.13 for "
                             "jax-cuda12-pjrt), then `pip install jax-cuda13-pjrt` (or jax-cuda12-pjrt)"))
        else:
            v = version_tuple(hw.nvidia_driver)
            if v >= CUDA13_MIN_DRIVER:
                out.append(Check("plugin for NVIDIA", "ok", f"{what}, driver {hw.nvidia_driver}: jax-cuda13-pjrt "
                                 "fits (jax-cuda12-pjrt works too)", ""))
            elif v >= CUDA12_MIN_DRIVER:
                out.append(Check("plugin for NVIDIA", "ok", f"{what}, driver {hw.nvidia_driver}: jax-cuda12-pjrt fits "
                                 "(jax-cuda13-pjrt needs driver >= 580)", ""))
            else:
                out.append(Check("plugin for NVIDIA", "fail", f"{what}, driver {hw.nvidia_driver} is older than any "
                                 "plugin wheel supports", "upgrade the NVIDIA driver to >= 580 (jax-cuda13-pjrt) or "
                                 ">= 525.60.13 (jax-cuda12-pjrt)"))
    if hw.tpu_chips or hw.tpu_devices:
        out.append(Check("plugin for TPU", "ok", f"{hw.tpu_chips} TPU chip(s) ({', '.join(hw.tpu_devices) or 'PCI'}): "
                         "libtpu fits", ""))
    if hw.rocm_gpus or hw.rocm_kfd:
        if hw.rocm_kfd:
            out.append(Check("plugin for ROCm", "ok", f"{hw.rocm_gpus} ROCm GPU(s) (/dev/kfd): a jax ROCm PJRT plugin "
                             "fits (jax-rocm7-pjrt for ROCm 7)", ""))
        else:
            out.append(Check("plugin for ROCm", "fail", f"{hw.rocm_gpus} ROCm GPU(s) but no /dev/kfd",
                             "load the amdgpu kernel driver (ROCm) and make /dev/kfd accessible to this user"))
    if not out:
        out.append(Check("accelerators", "info", "none found: the CPU plugin (xla-cpu-pjrt) fits", ""))
    return out


def _wanted_device(hw: Hardware) -> Optional[str]:
    if hw.tpu_chips or hw.tpu_devices:
        return "TPU"
    if hw.nvidia_driver:
        return "CUDA"
    if hw.rocm_kfd:
        return "ROCM"
    return None


def _plugin_checks(hw: Hardware) -> Tuple[List[Check], List[Dict[str, object]]]:
    from torch_pjrt import _C, _plugins

    checks: List[Check] = []
    plugins: List[Dict[str, object]] = []
    try:
        choice, choice_error = _plugins.find_plugin(), None
    except Exception as e:
        choice, choice_error = None, e
    # TORCH_PJRT_PLUGIN answers for every device: its file is checked once, under its own name
    custom = choice.path if choice is not None and choice.device == "CUSTOM" else None
    for device in ("CPU", "CUDA", "ROCM", "TPU"):
        try:
            path = _C.find_plugin(device, _plugins.plugin_search_dirs())[0]
        except Exception:
            if device == _wanted_device(hw):
                checks.append(Check(f"{device} plugin", "fail", f"this machine has {device} hardware and no "
                                    f"{device} plugin is installed", _C.package_hint(device)))
            continue
        if any(p["path"] == path for p in plugins):  # TORCH_PJRT_PLUGIN answers for every device
            continue
        name = "TORCH_PJRT_PLUGIN" if path == custom else f"{device} plugin"
        entry: Dict[str, object] = {"device": "CUSTOM" if path == custom else device, "path": path}
        try:
            plugin = _C.Plugin.load(path)
            major, minor = plugin.api_version
            entry["pjrt_api_version"] = f"{major}.{minor}"
            entry["xla_version"] = plugin.attributes.get("xla_version", "")
            checks.append(Check(name, "ok", f"{path} (PJRT API {major}.{minor})"))
        except Exception as e:
            # Fatal for the hardware this machine has; otherwise a plugin of no use here.
            entry["error"] = str(e)
            status = "fail" if path == custom or device in (_wanted_device(hw) or "CPU", "CPU") else "warn"
            fix = ("point TORCH_PJRT_PLUGIN at a PJRT plugin .so, or unset it (docs/environment.md)" if path == custom
                   else f"reinstall it ({_C.package_hint(device)})" if status == "fail"
                   else "uninstall it if this machine has no such device")
            checks.append(Check(name, status, f"{path} does not load: {e}", fix))
        plugins.append(entry)
    if choice is None:
        checks.append(Check("plugin in use", "fail", str(choice_error), "install the plugin it names, or fix "
                            "PJRT_DEVICE / TORCH_PJRT_PLUGIN (docs/environment.md)"))
    else:
        broken = next((p["error"] for p in plugins if p["path"] == choice.path and "error" in p), None)
        checks.append(Check("plugin in use", "fail" if broken else "ok",
                            f"{choice.device}: {choice.path} ({choice.reason})" + (" does not load" if broken else ""),
                            "see the check of that plugin above" if broken else ""))
    return checks, plugins


def _writable(path: str) -> Tuple[bool, str]:
    """Whether the cache could write into ``path`` (creating it if missing)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return False, f"{probe} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".torch_pjrt_doctor_"):
            pass
    except OSError as e:
        return False, f"cannot write into {probe}: {e.strerror}"
    return True, ""


SMOKE = """
import time, torch, torch_pjrt
t0 = time.perf_counter()
x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
y = (torch.tanh(x.to("pjrt")) @ x.to("pjrt").T).sum(0).cpu()
ref = (torch.tanh(x) @ x.T).sum(0)
assert torch.allclose(y, ref, rtol=1e-5, atol=1e-5), (y, ref)
print(f"{torch_pjrt.runtime.device_type()} {time.perf_counter() - t0:.2f}")
"""


def smoke_test(timeout: float = 300) -> Check:
    """Compiles and runs a small program on the chosen plugin in a child
    process, and compares it with the CPU."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", SMOKE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Check("smoke test", "fail", f"a tiny program did not finish in {timeout:.0f} s",
                     "rerun with TORCH_PJRT_DEBUG=1 TORCH_PJRT_LOG_LEVEL=info to see where it stops")
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit code {r.returncode}"
        return Check("smoke test", "fail", f"a tiny program failed ({how}):\n{tail}",
                     "fix the problems above; else rerun with TORCH_PJRT_LOG_LEVEL=info and report the output")
    platform, seconds = r.stdout.split()[-2:]
    return Check("smoke test", "ok", f"compiled and ran a program on {platform}, equal to the CPU "
                 f"({float(seconds):.2f} s in the program, {time.perf_counter() - t0:.1f} s with start-up)")


def run(smoke: bool = True, root: str = "/") -> Dict[str, object]:
    import torch

    from torch_pjrt import _C, _extension

    checks: List[Check] = []
    running = _extension.running_torch()
    built = _extension.built_for()
    report: Dict[str, object] = {
        "python": sys.executable,
        "torch": running[0],
        "torch_built_for": built[0] if built else None,
    }
    if not _extension.is_loaded(_C):
        message = vars(_C).get("_message", "the native extension is not loaded")
        checks.append(Check("native extension", "fail", message, _extension.rebuild_hint()))
    else:
        checks.append(Check("native extension", "ok", f"{_C.__file__}, built for torch {built[0] if built else '?'}, "
                            f"running torch {running[0]}"))

    hw = detect_hardware(root)
    report["hardware"] = asdict(hw)
    checks += recommend(hw)

    if _extension.is_loaded(_C):
        values = dict(_C._environment_values())
        report["environment"] = [{"name": n, "value": values.get(n), "default": d}
                                 for n, _, d in _C._environment_variables()]
        try:
            options = _C._options()
            checks.append(Check("environment", "ok", f"{len(values)} of the {len(report['environment'])} variables "
                                "torch-pjrt reads are set, all valid"))
        except Exception as e:  # plugin discovery reads the same variables: nothing more to learn
            options = None
            checks.append(Check("environment", "fail", str(e), "fix or unset the variable it names"))
        if options is not None:
            plugin_checks, report["plugins"] = _plugin_checks(hw)
            checks += plugin_checks
            for name, key in (("TORCH_PJRT_CACHE_DIR", "cache_dir"), ("TORCH_PJRT_DUMP_DIR", "dump_dir")):
                path = options[key]
                if not path:
                    continue
                ok, why = _writable(path)
                checks.append(Check(name, "ok" if ok else "warn", f"{path} is writable" if ok else why,
                                    "" if ok else f"point {name} at a directory this user can write"))
            if not options["cache_dir"]:
                checks.append(Check("compile cache", "info", "in memory only (set TORCH_PJRT_CACHE_DIR to keep "
                                    "compiled programs across processes)"))
        if smoke and not any(c.status == "fail" for c in checks):
            checks.append(smoke_test())
    report["checks"] = [asdict(c) for c in checks]
    report["problems"] = [asdict(c) for c in checks if c.status == "fail"]
    report["ok"] = not report["problems"]
    return report


_MARK = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}


def format_text(report: Dict[str, object]) -> str:
    lines = [f"python  {report['python']}", f"torch   {report['torch']} (the extension was built for "
             f"{report['torch_built_for'] or 'an unknown torch'})"]
    for c in report["checks"]:
        detail = c["detail"].replace("\n", "\n        ")
        lines.append(f"[{_MARK[c['status']]}] {c['name']}: {detail}")
        if c["fix"] and c["status"] in ("fail", "warn"):
            lines.append(f"        fix: {c['fix']}")
    env = report.get("environment") or []
    if env:
        given = [e for e in env if e["value"] is not None]
        unset = len(env) - len(given)
        if given:
            lines.append(f"environment set ({unset} more unset, at their defaults: docs/environment.md):")
            lines += [f"  {e['name']}={e['value']}" for e in given]
        else:
            lines.append(f"environment: all {unset} unset, at their defaults (docs/environment.md)")
    problems = report["problems"]
    lines.append("no problems found" if not problems else f"{len(problems)} problem(s) found")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_pjrt doctor",
                                     description="Check that this environment can run torch-pjrt, and say how to "
                                     "fix what is wrong. Exit code 1 when there is a problem.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--no-smoke", action="store_true", help="skip compiling and running a small program")
    args = parser.parse_args(list(argv))
    report = run(smoke=not args.no_smoke)
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0 if report["ok"] else 1
