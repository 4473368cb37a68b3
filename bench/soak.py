"""Soak test (`make soak`, not in CI): a long AdamW run on pjrt must compile
nothing after warm-up and hold its memory.

Trains a small MLP for --steps steps (default 20000) with AdamW, a learning
rate that changes every step (Python numbers must not change the program) and
a loss read every --read-every steps. Fails (exit 1) if any program is compiled
after --warmup steps, or if host RSS grows by more than --max-rss-growth
(default 2 %) between the end of warm-up plus 1000 steps and the end.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch
import torch.nn.functional as F

import torch_pjrt


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--read-every", type=int, default=50)
    p.add_argument("--max-rss-growth", type=float, default=0.02)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    dev = torch_pjrt.device()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    x = torch.randn(64, 32).to(dev)
    y = torch.randint(0, 10, (64,)).to(dev)
    compiles_at_warmup = rss_at_start = None
    t0 = time.perf_counter()
    loss = None
    for step in range(1, args.steps + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        torch_pjrt.sync()
        if step % args.read_every == 0:
            loss.item()
        if step == args.warmup:
            compiles_at_warmup = torch_pjrt.metrics.counters().get("compiles", 0)
        if step == args.warmup + 1000:
            rss_at_start = rss_bytes()
    final_loss = loss.item()
    compiles = torch_pjrt.metrics.counters().get("compiles", 0) - compiles_at_warmup
    growth = rss_bytes() / rss_at_start - 1
    took = time.perf_counter() - t0
    print(f"{args.steps} steps in {took:.1f} s, final loss {final_loss:.4f}, compiles after warm-up {compiles}, "
          f"RSS growth {growth * 100:.2f} % (limit {args.max_rss_growth * 100:.1f} %)")
    for r in torch_pjrt.metrics.recompiles():
        print("recompile:", r)
    ok = compiles == 0 and growth <= args.max_rss_growth
    print("soak:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
