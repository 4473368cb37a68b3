"""The torch-pjrt demo: a two-layer MLP forward pass, written in our graph IR,
compiled to StableHLO through the PJRT plugin and run on every device; then
the same program replicated over all devices with an all-reduce.

Checks every result against NumPy and prints timings. Run with `make demo`.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import torch_pjrt
from torch_pjrt import _C


def mlp_graph(batch: int, d_in: int, hidden: int, d_out: int, replicas: int = 1) -> "_C.ir.Graph":
    b = _C.ir.Builder(replicas)
    x = b.parameter("float32", [batch, d_in])
    w1 = b.parameter("float32", [d_in, hidden])
    b1 = b.parameter("float32", [hidden])
    w2 = b.parameter("float32", [hidden, d_out])
    b2 = b.parameter("float32", [d_out])
    h = b.dot(x, w1, [1], [0])
    h = b.binary("add", h, b.broadcast_in_dim(b1, [batch, hidden], [1]))
    h = b.binary("max", h, b.full("float32", [batch, hidden], 0.0))
    y = b.dot(h, w2, [1], [0])
    y = b.binary("add", y, b.broadcast_in_dim(b2, [batch, d_out], [1]))
    if replicas > 1:
        y = b.all_reduce(y, "sum")
    return b.build([y])


def mlp_numpy(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--d-in", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--d-out", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args(argv)

    choice = torch_pjrt.find_plugin()
    client = torch_pjrt.create_client()
    ids = client.addressable_device_ids
    print(f"plugin    {choice.path}")
    print(f"platform  {client.platform_name} ({client.platform_version}), {len(ids)} device(s)")

    rng = np.random.default_rng(0)
    shapes = [(args.batch, args.d_in), (args.d_in, args.hidden), (args.hidden,), (args.hidden, args.d_out), (args.d_out,)]
    host = [rng.standard_normal(s, dtype=np.float32) * 0.1 for s in shapes]
    want = mlp_numpy(*host)
    graph = mlp_graph(args.batch, args.d_in, args.hidden, args.d_out)
    flops = 2 * args.batch * (args.d_in * args.hidden + args.hidden * args.d_out)

    ok = True
    print(f"\nMLP {args.batch}x{args.d_in} -> {args.hidden} -> {args.d_out}, {args.iters} runs per device")
    print(f"{'device':>6} {'compile ms':>11} {'run us':>9} {'GFLOP/s':>8} {'max |err|':>10}  check")
    for dev in ids:
        t0 = time.perf_counter()
        exe = client.compile_graph(graph, [dev])
        compile_ms = (time.perf_counter() - t0) * 1e3
        bufs = [client.buffer_from_numpy(a, dev) for a in host]
        out = exe.execute([bufs])[0][0]
        got = out.to_numpy()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            out = exe.execute([bufs])[0][0]
        out.block_until_ready()
        run_us = (time.perf_counter() - t0) / args.iters * 1e6
        err = float(np.max(np.abs(got - want)))
        good = err <= 1e-4 * (1 + float(np.max(np.abs(want))))
        ok &= good
        print(f"{dev:>6} {compile_ms:>11.1f} {run_us:>9.1f} {flops / run_us / 1e3:>8.2f} {err:>10.2e}  {'ok' if good else 'WRONG'}")

    # One program replicated on every device: each replica gets its own batch,
    # the all-reduce sums the replicas' outputs.
    n = len(ids)
    graph_r = mlp_graph(args.batch, args.d_in, args.hidden, args.d_out, replicas=n)
    t0 = time.perf_counter()
    exe = client.compile_graph(graph_r, list(ids))
    compile_ms = (time.perf_counter() - t0) * 1e3
    xs = [rng.standard_normal(shapes[0], dtype=np.float32) for _ in range(n)]
    args_r = [[client.buffer_from_numpy(xs[i], dev)] + [client.buffer_from_numpy(a, dev) for a in host[1:]]
              for i, dev in enumerate(ids)]
    outs = exe.execute(args_r)
    want_r = sum(mlp_numpy(x, *host[1:]) for x in xs)
    errs = [float(np.max(np.abs(o[0].to_numpy() - want_r))) for o in outs]
    good = max(errs) <= 1e-4 * (1 + float(np.max(np.abs(want_r))))
    ok &= good
    t0 = time.perf_counter()
    for _ in range(args.iters):
        outs = exe.execute(args_r)
    for o in outs:
        o[0].block_until_ready()
    run_us = (time.perf_counter() - t0) / args.iters * 1e6
    print(f"\nreplicated over {n} device(s) with all_reduce: compile {compile_ms:.1f} ms, "
          f"run {run_us:.1f} us, max |err| {max(errs):.2e}  {'ok' if good else 'WRONG'}")

    print("\nresult check:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
