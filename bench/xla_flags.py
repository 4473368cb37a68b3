"""XLA's own compile flags on the CPU plugin: the steady lazy training step of
bench.py's compute-bound models (mlp-large, cnn-large) under each XLA_FLAGS
setting, each in a new process (the plugin reads XLA_FLAGS once), against the
plugin's defaults in the same run. docs/performance.md records the result.

    python bench/xla_flags.py [--steps N] [--models mlp-large,cnn-large]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = [
    "",
    "--xla_cpu_use_thunk_runtime=false",
    "--xla_cpu_multi_thread_eigen=false",
    "--xla_cpu_enable_fast_math=true",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_prefer_vector_width=512",
]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(%(bench)r))
import torch, torch_pjrt
import bench
torch.set_num_threads(max(1, os.cpu_count() or 1))
out = {}
for name, build, data, make_opt, loss_fn, clip in bench.cases(False):
    if name not in %(models)r:
        continue
    torch.manual_seed(0)
    r = bench.time_pjrt(build, data, make_opt, loss_fn, clip, %(steps)d, 2)
    out[name] = {"step_s": r["step_s"], "execute_only_s": r["execute_only_s"]}
print(json.dumps(out))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--models", default="mlp-large,cnn-large")
    p.add_argument("--settings", help="';'-separated XLA_FLAGS values to try (default: the built-in list)")
    args = p.parse_args(argv)
    models = args.models.split(",")
    settings = args.settings.split(";") if args.settings else SETTINGS
    code = CHILD % {"bench": os.path.dirname(os.path.abspath(__file__)), "models": models, "steps": args.steps}
    results = {}
    for flags in settings:
        env = dict(os.environ, XLA_FLAGS=flags)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{flags or '(defaults)':<48} failed: {tail[:100]}")
            results[flags] = {"error": tail}
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[flags] = r
        base = results.get("", {})
        cells = []
        for m in models:
            ms = r[m]["step_s"] * 1e3
            rel = f" ({ms / (base[m]['step_s'] * 1e3):.2f}x)" if m in base and "step_s" in base.get(m, {}) else ""
            cells.append(f"{m} {ms:8.1f} ms{rel} exec {r[m]['execute_only_s'] * 1e3:7.1f} ms")
        print(f"{flags or '(defaults)':<48} " + "  ".join(cells), flush=True)
    with open(os.path.join(os.path.dirname(__file__), "xla_flags.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
