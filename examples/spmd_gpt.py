"""The demo's GPT trained FSDP-style over 4 CPU devices with torch_pjrt.spmd:
parameters, gradients and AdamW state split over the "data" axis, the batch
too; XLA's SPMD partitioner inserts the gathers and reductions. Prints
per-device memory next to the unsharded figure; the last line reports the
loss and the memory ratio. See docs/spmd.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("CPU_NUM_DEVICES", "4")  # read when the CPU plugin's client starts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt import spmd  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from models import GPT  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Train the demo's GPT FSDP-sharded over a mesh of pjrt devices.")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)

    text = open(os.path.join(os.path.dirname(__file__), "data", "tiny.txt")).read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)

    torch.manual_seed(0)
    mesh = spmd.Mesh((args.devices,), ("data",))
    print(f"mesh    {mesh}")
    model = GPT(vocab=len(chars), d=args.d, heads=4, layers=args.layers, block=args.block, dropout=0.0)
    model = spmd.shard_module(model, mesh, "data")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)

    def batch():
        ix = torch.randint(0, len(data) - args.block - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + args.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + args.block] for i in ix])
        return spmd.distribute(x, mesh, ("data", None)), spmd.distribute(y, mesh, ("data", None))

    first = last = None
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        if step == 0 or step == args.steps - 1 or step % 25 == 0:
            value = loss.item()
            first = value if first is None else first
            last = value
            print(f"step {step:4d}  loss {value:.3f}  {time.perf_counter() - t0:6.2f} s")

    # parameters + optimizer state: unsharded size vs what each device holds
    tensors = list(model.parameters()) + [v for s in opt.state.values() for v in s.values()
                                          if isinstance(v, torch.Tensor) and v.device.type == "pjrt"]
    full = sum(t.numel() * t.element_size() for t in tensors)
    per_device = [0] * mesh.size
    for t in tensors:
        for i, b in enumerate(spmd.shard_bytes(t)):
            per_device[i] += b
    for i, d in enumerate(mesh.device_ids):
        print(f"pjrt:{d}  params+state {per_device[i]:8d} B   all buffers {torch.pjrt.memory_allocated(d):8d} B "
              f"(peak {torch.pjrt.max_memory_allocated(d)} B)")
    ratio = max(per_device) / full
    print(f"unsharded params+state {full} B")
    print(f"spmd_gpt: loss {first:.3f} -> {last:.3f}, per-device params+state {max(per_device)} B = "
          f"{ratio:.3f} of unsharded {full} B over {mesh.size} devices")
    return 0 if last < first and ratio < 1.5 / mesh.size else 1


if __name__ == "__main__":
    sys.exit(main())
