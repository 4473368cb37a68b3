"""The torch-pjrt demo: a small GPT-style character model trained on a short
text that ships with the repository, on the pjrt device (PJRT CPU plugin by
default; set PJRT_DEVICE=CUDA with a CUDA plugin installed for a GPU).

Prints the loss, steps per second, compiles and cache hits, then a short
greedy sample. Run with `make demo`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import torch_pjrt

sys.path.insert(0, os.path.dirname(__file__))
from models import GPT  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Train a small GPT on the pjrt device.")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)

    text = open(os.path.join(os.path.dirname(__file__), "data", "tiny.txt")).read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)

    torch.manual_seed(0)
    dev = torch_pjrt.device()
    print(f"plugin  {torch_pjrt._C._plugin_path()}")
    print(f"device  {dev} ({torch_pjrt._C._platform_name()}), {torch_pjrt.device_count()} device(s)")
    print(f"text    {len(text)} characters, vocabulary {len(chars)}")

    model = GPT(vocab=len(chars), d=args.d, heads=4, layers=args.layers, block=args.block, dropout=0.1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)

    def batch():
        ix = torch.randint(0, len(data) - args.block - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + args.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + args.block] for i in ix])
        return x.to(dev), y.to(dev)

    torch_pjrt.metrics.reset()
    first_loss = None
    t0 = time.perf_counter()
    window = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batch()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        if step == 1:
            first_loss = loss.item()
            print(f"step {step:4d}  loss {first_loss:.3f}  (first step, with compile: {time.perf_counter() - t0:.2f} s)")
            window = time.perf_counter()
        elif step % args.log_every == 0 or step == args.steps:
            value = loss.item()
            elapsed = time.perf_counter() - window
            n = args.log_every if step % args.log_every == 0 else step % args.log_every
            c = torch_pjrt.metrics.counters()
            print(f"step {step:4d}  loss {value:.3f}  {n / elapsed:6.1f} steps/s  compiles {c.get('compiles', 0)}"
                  f"  cache hits {c.get('cache_hits', 0)}  fallbacks {c.get('cpu_fallbacks', 0)}")
            window = time.perf_counter()

    # Greedy sample with a fixed-size window: one compiled program for every step.
    model.eval()
    ctx = [stoi[" "]] * args.block
    out = []
    with torch.no_grad():
        for _ in range(80):
            logits = model(torch.tensor([ctx[-args.block:]], device=dev))
            nxt = int(logits[0, -1].argmax().item())
            out.append(chars[nxt])
            ctx.append(nxt)
    print("sample:", repr("".join(out)))

    c = torch_pjrt.metrics.counters()
    ok = value < first_loss * 0.75 and c.get("cpu_fallbacks", 0) == 0
    print(torch_pjrt.metrics.report())
    print("demo:", "PASSED (loss fell, no CPU fallbacks)" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
