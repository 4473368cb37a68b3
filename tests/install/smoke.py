"""The tiny program `make test-install` runs with a fresh venv's python,
from outside the source tree, after `pip install --no-build-isolation
<checkout>`: the installed package (not the checkout) serves the pjrt device,
through the entry points torch loads, and its _C names no path into the
environment that built it."""

import os
import subprocess
import sys
import sysconfig

import torch

site = sysconfig.get_paths()["platlib"]
assert "pjrt" in dir(torch) and torch.pjrt.is_available(), "torch.backends entry point did not load torch_pjrt"
import torch_pjrt  # noqa: E402  (already imported by torch's autoload)

assert torch_pjrt.__file__.startswith(site), f"torch_pjrt imported from {torch_pjrt.__file__}, not {site}"
so = torch_pjrt._C.__file__
assert so.startswith(os.path.join(site, "torch_pjrt")), so

# Relocatable: the only run paths are relative to the package ($ORIGIN).
dynamic = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
paths = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "RPATH" in line or "RUNPATH" in line]
assert paths and all(p.startswith("$ORIGIN") for entry in paths for p in entry.split(":")), paths

x = torch.randn(64, 32)
w = torch.randn(32, 8, requires_grad=True)
wp = w.detach().to("pjrt").requires_grad_()
loss_cpu = torch.tanh(x @ w).sum()
loss_cpu.backward()
loss = torch.tanh(x.to("pjrt") @ wp).sum()
loss.backward()
torch_pjrt.sync()
assert torch.allclose(loss.cpu(), loss_cpu, rtol=1e-5, atol=1e-4), (loss.cpu(), loss_cpu)
assert torch.allclose(wp.grad.cpu(), w.grad, rtol=1e-5, atol=1e-5)

compiled = torch.compile(lambda a: torch.relu(a) * 2, backend="pjrt")  # the torch_dynamo_backends entry point
assert torch.equal(compiled(x.to("pjrt")).cpu(), torch.relu(x) * 2)
print(f"installed torch-pjrt {torch_pjrt.__version__} works from {os.getcwd()} (run path {paths[0]}), "
      f"torch {torch.__version__}, {sys.executable}")
