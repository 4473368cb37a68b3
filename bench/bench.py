"""torch-pjrt benchmarks: steady-state training step time of eager PyTorch
(CPU), torch.compile (inductor, CPU) and torch-pjrt on the same machine in
the same run, first-step time (trace + compile), tracing overhead per op, and
the cost of the checks compiled into programs (pjrt lazy with them vs without).

Prints a table (ratios are to eager CPU; < 1 is faster) and writes
bench/results.json. Run with `make bench`. Numbers are only comparable within
one run on one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

import torch_pjrt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import CNN, GPT, MLP  # noqa: E402


def cases(quick: bool):
    def ce(o, t):
        return F.cross_entropy(o.reshape(-1, o.size(-1)), t.reshape(-1))

    g = torch.Generator().manual_seed(0)
    out = []
    for size, (mlp_h, cnn_c, gpt) in {"small": (64, 8, (32, 2, 16, 4)), "large": (512, 32, (128, 4, 64, 16))}.items():
        if quick and size == "large":
            continue
        out.append((f"mlp-{size}", lambda h=mlp_h: MLP(32, h, 10),
                    (torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)),
                    lambda p: torch.optim.AdamW(p, lr=1e-3), F.cross_entropy, None))
        out.append((f"cnn-{size}", lambda c=cnn_c: CNN(c),
                    (torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)),
                    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), F.cross_entropy, None))
        d, layers, block, batch = gpt
        seq = torch.randint(0, 64, (batch, block + 1), generator=g)
        out.append((f"gpt-{size}", lambda d=d, layers=layers, block=block: GPT(64, d, 4, layers, block),
                    (seq[:, :-1], seq[:, 1:]), lambda p: torch.optim.AdamW(p, lr=1e-3), ce, 1.0))
    return out


def make_step(model, opt, loss_fn, clip, x, y):
    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        return loss

    return step


def time_eager(build, data, make_opt, loss_fn, clip, steps, warmup):
    model = build()
    opt = make_opt(model.parameters())
    step = make_step(model, opt, loss_fn, clip, *data)
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def time_inductor(build, data, make_opt, loss_fn, clip, steps, warmup):
    torch._dynamo.reset()
    model = build()
    opt = make_opt(model.parameters())
    cmodel = torch.compile(model)
    step = make_step(cmodel, opt, loss_fn, clip, *data)
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps, first


def time_device_steps(step, steps, warmup, before_timing=lambda: None):
    """(first step incl. trace and compile, steady-state seconds per step) of a pjrt step."""
    torch_pjrt.sync(wait=True)
    t0 = time.perf_counter()
    loss = step()
    torch_pjrt.sync(wait=True)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        loss = step()  # keep it alive as in the timed loop: same program
        torch_pjrt.sync()
    torch_pjrt.sync(wait=True)
    before_timing()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
        torch_pjrt.sync()
    torch_pjrt.sync(wait=True)
    loss.cpu()
    return first, (time.perf_counter() - t0) / steps


def time_pjrt(build, data, make_opt, loss_fn, clip, steps, warmup, checks=True):
    """Lazy mode; `checks=False` traces without the index/divisor checks
    (TORCH_PJRT_CHECKS=0) to measure what they cost."""
    torch_pjrt._C._set_checks(checks)
    dev = torch_pjrt.device()
    model = build().to(dev)
    opt = make_opt(model.parameters())
    x, y = (t.to(dev) for t in data)
    step = make_step(model, opt, loss_fn, clip, x, y)
    first, per_step = time_device_steps(step, steps, warmup, torch_pjrt.metrics.reset)
    torch_pjrt._C._set_checks(True)
    c = torch_pjrt.metrics.counters()
    t = torch_pjrt.metrics.timers()
    ops = c.get("traced_ops", 0)
    return {
        "step_s": per_step,
        "first_step_s": first,
        "trace_us_per_op": t.get("trace", 0.0) / ops * 1e6 if ops else 0.0,
        "ops_per_step": ops / steps,
        "compiles_in_steady_state": c.get("compiles", 0),
        "fallbacks": c.get("cpu_fallbacks", 0),
    }


def time_pjrt_dynamo(build, data, make_opt, loss_fn, clip, steps, warmup):
    """torch.compile(model, backend="pjrt"), optimizer eager on the device."""
    torch._dynamo.reset()
    dev = torch_pjrt.device()
    model = build().to(dev)
    opt = make_opt(model.parameters())
    cmodel = torch.compile(model, backend="pjrt")
    x, y = (t.to(dev) for t in data)
    first, per_step = time_device_steps(make_step(cmodel, opt, loss_fn, clip, x, y), steps, warmup)
    return per_step, first


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes only")
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile (inductor)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.json"))
    args = p.parse_args(argv)

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = []
    print(f"torch {torch.__version__}, plugin {torch_pjrt._C._plugin_path() if torch_pjrt.device_count() else '?'}, "
          f"{os.cpu_count()} CPU(s), {platform.machine()}")
    header = (f"{'model':<11} {'eager ms':>9} {'inductor':>9} {'x eager':>8} {'pjrt ms':>8} {'x eager':>8}"
              f" {'dynamo-pjrt':>11} {'x eager':>8} {'checks':>8} {'1st pjrt s':>10} {'1st ind. s':>10} {'us/op':>6} {'ops/step':>8}")
    print(header)
    print("-" * len(header))
    for name, build, data, make_opt, loss_fn, clip in cases(args.quick):
        torch.manual_seed(0)
        eager = time_eager(build, data, make_opt, loss_fn, clip, args.steps, args.warmup)
        ind, ind_first = (None, None)
        if not args.no_inductor:
            try:
                ind, ind_first = time_inductor(build, data, make_opt, loss_fn, clip, args.steps, args.warmup)
            except Exception as e:  # inductor needs a working C++ toolchain
                print(f"  inductor failed on {name}: {type(e).__name__}: {e}".splitlines()[0])
        pj = time_pjrt(build, data, make_opt, loss_fn, clip, args.steps, args.warmup)
        unchecked = time_pjrt(build, data, make_opt, loss_fn, clip, args.steps, args.warmup, checks=False)
        dyn, dyn_first = time_pjrt_dynamo(build, data, make_opt, loss_fn, clip, args.steps, args.warmup)
        row = {"model": name, "eager_step_s": eager, "inductor_step_s": ind, "inductor_first_step_s": ind_first,
               "pjrt_step_s": pj["step_s"], "pjrt_first_step_s": pj["first_step_s"],
               "pjrt_vs_eager": pj["step_s"] / eager, "inductor_vs_eager": (ind / eager) if ind else None,
               "pjrt_dynamo_step_s": dyn, "pjrt_dynamo_first_step_s": dyn_first, "pjrt_dynamo_vs_eager": dyn / eager,
               "trace_us_per_op": pj["trace_us_per_op"], "ops_per_step": pj["ops_per_step"],
               "pjrt_steady_state_compiles": pj["compiles_in_steady_state"], "pjrt_fallbacks": pj["fallbacks"],
               "pjrt_unchecked_step_s": unchecked["step_s"],
               "checks_cost": pj["step_s"] / unchecked["step_s"] - 1}
        rows.append(row)
        fmt = lambda v, s=1e3: f"{v * s:9.2f}" if v is not None else f"{'-':>9}"
        print(f"{name:<11} {eager * 1e3:9.2f} {fmt(ind)} {fmt(row['inductor_vs_eager'], 1):>8}"
              f" {pj['step_s'] * 1e3:8.2f} {row['pjrt_vs_eager']:8.2f} {dyn * 1e3:11.2f} {dyn / eager:8.2f}"
              f" {row['checks_cost'] * 100:7.1f}%"
              f" {pj['first_step_s']:10.2f}"
              f" {fmt(ind_first, 1):>10} {pj['trace_us_per_op']:6.2f} {pj['ops_per_step']:8.0f}")
    gpt = [r for r in rows if r["model"].startswith("gpt")]
    targets = {
        "gpt_pjrt_faster_than_eager": all(r["pjrt_vs_eager"] < 1 for r in gpt),
        "trace_under_5us_per_op": all(r["trace_us_per_op"] < 5 for r in rows),
        "no_steady_state_compiles": all(r["pjrt_steady_state_compiles"] == 0 for r in rows),
        "checks_under_3_percent": all(r["checks_cost"] < 0.03 for r in rows),
    }
    print("targets:", ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in targets.items()))
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
                   "plugin": torch_pjrt.runtime.plugin_info(), "rows": rows, "targets": targets}, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
