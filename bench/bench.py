"""torch-pjrt benchmarks: steady-state training step time of eager PyTorch,
torch.compile (inductor) and torch-pjrt on the same machine in the same run:
lazy mode, torch.compile(backend="pjrt") of the model (replayed forward and
backward, lazy optimizer), and of the model and `opt.step`; the
"execute only" time (the step's cached executables alone, on arguments of
the same shapes: XLA's own time); first-step time (trace + compile) in a new
process, and a warm start (another new process, disk-cache hit); peak device
bytes (when the plugin reports them) and host RSS of that process; tracing
overhead per op; the backend's own time per compiled-graph call; and the cost
of the checks compiled into programs (pjrt lazy with them vs without).
The backends of a model are timed in interleaved rounds (`time_rounds`).
The eager baseline runs on the CPU, or with `--eager-device cuda` on the GPU,
timed in a child process that does not import torch_pjrt (torch allows one
accelerator per process), in rounds of its own.

Prints a table (ratios are to the eager baseline; < 1 is faster), writes
bench/results.json and bench/results.png (matplotlib). Run with `make bench`
(`--quick`: small models only). Numbers are only comparable within one run on
one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

# torch_pjrt is imported by main() (import_pjrt), not here: the eager
# baseline on an accelerator (--eager-device cuda) runs in a child process
# that never imports it. torch allows one accelerator per process, and once
# torch_pjrt is imported it is pjrt: a backward pass through CUDA tensors
# then fails inside autograd (docs/semantics.md, "One accelerator per process").
torch_pjrt = None


def import_pjrt():
    global torch_pjrt
    import torch_pjrt.dynamo  # noqa: F401  (binds the package; call_stats)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models import CNN, GPT, MLP  # noqa: E402


# The matmul-bound bfloat16 step (--matmul, for GPUs): a stack of square
# bias-free Linear layers; a training step's FLOPs are 2 * batch * d^2 per
# product: each layer's forward and weight gradient, and the input gradient
# of every layer but the first (the input needs none).
MATMUL = {"d": 4096, "layers": 4, "batch": 8192}


def matmul_flops() -> float:
    return 2.0 * MATMUL["batch"] * MATMUL["d"] ** 2 * (3 * MATMUL["layers"] - 1)


def matmul_case():
    d, layers, batch = MATMUL["d"], MATMUL["layers"], MATMUL["batch"]

    def build():
        torch.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [torch.nn.Linear(d, d, bias=False), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods).to(torch.bfloat16)

    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return ("matmul-bf16", build, (x, torch.zeros(1)), lambda p: torch.optim.SGD(p, lr=1e-3),
            lambda o, _: o.float().square().mean(), None)


def cases(quick: bool, matmul: bool = False):
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
    if matmul:
        out.append(matmul_case())
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


class Backend:
    """One way of running a model's training step, timed in rounds with the
    other backends of the same model (`time_rounds`). `step()` runs a step
    (pjrt: up to its launch), `finish()` waits for the steps launched,
    `enter()` sets what the process must hold for this backend (the checks
    switch). A `counted` backend sums the pjrt counters, timers and
    compiled-graph call stats of its steps in the rounds (`steps` of them)."""

    def __init__(self, step, finish=lambda: None, enter=lambda: None, counted=False, first=None):
        self.step, self.finish, self.enter, self.counted, self.first = step, finish, enter, counted, first
        self.best = float("inf")
        self.steps = 0
        self.counters, self.timers = {}, {}
        self.calls = {"calls": 0, "seconds": 0.0}
        self.refusals = {}
        self.per_block = 3

    @staticmethod
    def snapshot():
        return (torch_pjrt.metrics.counters(), torch_pjrt.metrics.timers(), torch_pjrt.dynamo.call_stats())

    def add(self, before, after):
        for acc, b, a in ((self.counters, before[0], after[0]), (self.timers, before[1], after[1]),
                          (self.calls, before[2], after[2]), (self.refusals, before[2]["refusals"], after[2]["refusals"])):
            for k, v in a.items():
                if isinstance(v, (int, float)):
                    acc[k] = acc.get(k, 0) + v - b.get(k, 0)


EXEC_STEPS = 10  # steps of the execute-only run


def op_chain_us(device, rounds: int = 5, steps: int = 30) -> float:
    """Microseconds per op of a chain of 600 tiny ops (8x8 mm, add_, relu) on
    `device`: the host's per-op floor. Eager CPU's is PyTorch's own dispatch
    from Python; pjrt's is the same dispatch plus tracing, sync once per chain
    included. Best of `rounds`."""
    dev = torch.device(device)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0)).to(dev)
    w = (torch.eye(8) * 0.5).to(dev)
    finish = (lambda: torch_pjrt.sync()) if dev.type == "pjrt" else (lambda: None)

    def chain():
        y = x
        for _ in range(200):
            y = torch.mm(y, w).add_(1.0).relu()
        finish()

    for _ in range(3):
        chain()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            chain()
        if dev.type == "pjrt":
            torch_pjrt.sync(wait=True)
        best = min(best, (time.perf_counter() - t) / steps / 600 * 1e6)
    return best


def time_rounds(backends, rounds, block_s):
    """Each backend's seconds per steady step: `rounds` rounds, each timing
    one block of every backend in turn, the fastest block of each kept (its
    mean). A block is two untimed steps, then as many steps as last about
    `block_s`. In turn rather than one backend after another: a burst of load
    on a shared machine lands in one block of every backend instead of in
    every block of one, and a millisecond step is not timed a handful at a
    time."""
    for b in backends:
        b.enter()
        t0 = time.perf_counter()
        for _ in range(3):
            b.step()
        b.finish()
        b.per_block = max(3, math.ceil(block_s / max((time.perf_counter() - t0) / 3, 1e-6)))
    for _ in range(rounds):
        for b in backends:
            b.enter()
            # Counted from the untimed steps on: a backend that compiled again
            # when its turn came round would show it.
            before = b.snapshot() if b.counted else None
            for _ in range(2):
                b.step()
            b.finish()
            t0 = time.perf_counter()
            for _ in range(b.per_block):
                b.step()
            b.finish()
            b.best = min(b.best, (time.perf_counter() - t0) / b.per_block)
            if before is not None:
                b.add(before, b.snapshot())
            b.steps += b.per_block + 2
    if torch_pjrt is not None:
        torch_pjrt._C._set_checks(True)


def eager_finish(device: str):
    """What waits for the eager steps launched on `device`."""
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def eager_backend(build, data, make_opt, loss_fn, clip, warmup, device="cpu"):
    model = build().to(device)
    opt = make_opt(model.parameters())
    step = make_step(model, opt, loss_fn, clip, *(t.to(device) for t in data))
    for _ in range(warmup):
        step()
    eager_finish(device)()
    return Backend(step, eager_finish(device))


def inductor_backend(build, data, make_opt, loss_fn, clip, warmup, device="cpu"):
    model = build().to(device)
    opt = make_opt(model.parameters())
    cmodel = torch.compile(model)
    step = make_step(cmodel, opt, loss_fn, clip, *(t.to(device) for t in data))
    t0 = time.perf_counter()
    step()
    eager_finish(device)()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    eager_finish(device)()
    return Backend(step, eager_finish(device), first=first)


def device_backend(step, warmup, checks=True):
    """A pjrt step as a Backend: each step ends with sync() (launch, no wait);
    `first` is the first step's time (trace and compile)."""
    def enter():
        torch_pjrt._C._set_checks(checks)

    enter()
    torch_pjrt.sync(wait=True)
    t0 = time.perf_counter()
    step()
    torch_pjrt.sync(wait=True)
    first = time.perf_counter() - t0
    last = []

    def synced_step():
        last[:] = [step()]  # keep the loss alive, as a training loop does: same program every step
        torch_pjrt.sync()

    for _ in range(warmup):
        synced_step()
    torch_pjrt.sync(wait=True)
    b = Backend(synced_step, lambda: torch_pjrt.sync(wait=True), enter, counted=True, first=first)
    b.raw_step = step
    return b


def execute_only(b: Backend, steps: int) -> float:
    """Seconds per step of b's programs of one more steady step, run alone on
    arguments of the same shapes (XLA's own time)."""
    b.enter()
    torch_pjrt.sync(wait=True)
    torch_pjrt._C._start_launch_log()
    b.raw_step()
    torch_pjrt.sync(wait=True)
    out = torch_pjrt._C._execute_logged_programs(steps)
    torch_pjrt._C._set_checks(True)
    return out


def lazy_backend(build, data, make_opt, loss_fn, clip, warmup, checks=True):
    """Lazy mode; `checks=False` traces without the index/divisor checks
    (TORCH_PJRT_CHECKS=0) to measure what they cost."""
    torch_pjrt._C._set_checks(checks)
    dev = torch_pjrt.device()
    model = build().to(dev)
    opt = make_opt(model.parameters())
    x, y = (t.to(dev) for t in data)
    return device_backend(make_step(model, opt, loss_fn, clip, x, y), warmup, checks)


def lazy_stats(b: Backend, steps: int) -> dict:
    c, t = b.counters, b.timers
    ops = c.get("traced_ops", 0)
    return {
        "step_s": b.best,
        "first_step_s": b.first,
        "execute_only_s": execute_only(b, steps),
        "programs_per_step": c.get("executions", 0) / b.steps,
        # The definition: host time of a step (first op to the return
        # of sync) per traced op; and the part of it spent in torch-pjrt's
        # own C++ (lowering, IR, sync), the rest being Python, PyTorch's
        # dispatch and autograd.
        "step_us_per_op": b.best / (ops / b.steps) * 1e6 if ops else 0.0,
        "trace_us_per_op": t.get("trace", 0.0) / ops * 1e6 if ops else 0.0,
        "ops_per_step": ops / b.steps,
        "compiles_in_steady_state": c.get("compiles", 0),
        "fallbacks": c.get("cpu_fallbacks", 0),
    }


def dynamo_backend(build, data, make_opt, loss_fn, clip, warmup, compile_step=False):
    """torch.compile(model, backend="pjrt"): forward and backward replayed;
    the optimizer lazy on the device, or compiled too (`compile_step`:
    torch.compile(opt.step), as PyTorch documents for compiled optimizers)."""
    dev = torch_pjrt.device()
    model = build().to(dev)
    opt = make_opt(model.parameters())
    cmodel = torch.compile(model, backend="pjrt")
    x, y = (t.to(dev) for t in data)
    step = make_step(cmodel, opt, loss_fn, clip, x, y)
    if compile_step:
        # Step counters on the device (Dynamo does this itself only for CUDA
        # and XPU): CPU tensor inputs would make the step graph trace every call.
        for group in opt.param_groups:
            if "capturable" in group:
                group["capturable"] = True
        compiled_step = torch.compile(opt.step, backend="pjrt")

        def step():
            loss = loss_fn(cmodel(x), y)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            compiled_step()
            opt.zero_grad()
            return loss

    return device_backend(step, warmup)


def dynamo_stats(b: Backend, steps: int) -> dict:
    c, calls = b.counters, b.calls
    return {
        "step_s": b.best,
        "first_step_s": b.first,
        "execute_only_s": execute_only(b, steps),
        "programs_per_step": c.get("executions", 0) / b.steps,
        "replays_per_step": c.get("replays", 0) / b.steps,
        "compiles_in_steady_state": c.get("compiles", 0),
        "backend_us_per_call": calls["seconds"] / calls["calls"] * 1e6 if calls["calls"] else None,
        "calls_per_step": calls["calls"] / b.steps,
        "refusals": {k: v for k, v in b.refusals.items() if v},
    }


def first_step_in_new_process(name: str, mode: str, cache_dir: str) -> dict:
    """First step of `name` (mode "lazy" or "compile") in a new process with
    the disk cache in `cache_dir`, its peak host RSS and device bytes."""
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, __file__, "--first-step", name, "--mode", mode], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"first step of {name} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_first_step(name: str, mode: str) -> int:
    """--first-step: one model's first step (and a few more) in this process."""
    (_, build, data, make_opt, loss_fn, clip), = [c for c in cases(False, name == "matmul-bf16") if c[0] == name]
    torch.manual_seed(0)
    dev = torch_pjrt.device()
    model = build().to(dev)
    opt = make_opt(model.parameters())
    fwd = torch.compile(model, backend="pjrt") if mode == "compile" else model
    x, y = (t.to(dev) for t in data)
    step = make_step(fwd, opt, loss_fn, clip, x, y)
    torch_pjrt.sync(wait=True)
    t0 = time.perf_counter()
    step()
    torch_pjrt.sync(wait=True)
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
        torch_pjrt.sync()
    torch_pjrt.sync(wait=True)
    stats = torch_pjrt.runtime.memory_stats(0) or {}
    peak = stats.get("peak_bytes_in_use") or stats.get("bytes_in_use")
    c = torch_pjrt.metrics.counters()
    print(json.dumps({"first_step_s": first, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "peak_device_bytes": peak, "compiles": c.get("compiles", 0),
                      "disk_cache_hits": c.get("disk_cache_hits", 0)}))
    return 0


def baseline_backends(name, build, data, make_opt, loss_fn, clip, args, out=None) -> dict:
    """The eager backend of a case on --eager-device, and inductor's unless
    --no-inductor (a failure to compile is reported on `out`, default stdout,
    and skipped)."""
    backends = {"eager": eager_backend(build, data, make_opt, loss_fn, clip, args.warmup, args.eager_device)}
    if not args.no_inductor:
        try:
            backends["inductor"] = inductor_backend(build, data, make_opt, loss_fn, clip, args.warmup,
                                                    args.eager_device)
        except Exception as e:  # inductor needs a working C++ toolchain
            print(f"  inductor failed on {name}: {type(e).__name__}: {e}".splitlines()[0], file=out)
    return backends


def baseline_times(backends) -> dict:
    ind = backends.get("inductor")
    return {"eager_step_s": backends["eager"].best, "inductor_step_s": ind.best if ind else None,
            "inductor_first_step_s": ind.first if ind else None}


def baselines(name: str, args, backends) -> dict:
    """Eager (and inductor) step times of `name` on --eager-device: timed in
    the rounds of the pjrt backends (`backends`) on the CPU, in a child
    process that never imports torch_pjrt on an accelerator."""
    if args.eager_device != "cpu":
        cmd = [sys.executable, __file__, "--eager-child", name, "--eager-device", args.eager_device,
               "--rounds", str(args.rounds), "--block-s", str(args.block_s), "--warmup", str(args.warmup)]
        # TORCH_DEVICE_BACKEND_AUTOLOAD=0: `import torch` would import the
        # installed torch_pjrt through its torch.backends entry point.
        try:
            out = subprocess.run(cmd + (["--no-inductor"] if args.no_inductor else []), capture_output=True,
                                 text=True, timeout=900, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"eager {args.eager_device} baseline of {name}: no result in 900 s") from None
        if out.returncode != 0:
            raise RuntimeError(f"eager {args.eager_device} baseline of {name} failed: "
                               f"{out.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    return baseline_times(backends)


def run_eager_child(name: str, args) -> int:
    """--eager-child: `name`'s eager (and inductor) steps on --eager-device,
    timed in rounds in this process, which does not import torch_pjrt."""
    if "torch_pjrt" in sys.modules:
        raise SystemExit("--eager-child: torch_pjrt is imported (run with TORCH_DEVICE_BACKEND_AUTOLOAD=0)")
    (_, build, data, make_opt, loss_fn, clip), = [c for c in cases(False, name == "matmul-bf16") if c[0] == name]
    torch.manual_seed(0)
    backends = baseline_backends(name, build, data, make_opt, loss_fn, clip, args, out=sys.stderr)
    time_rounds(list(backends.values()), args.rounds, args.block_s)
    print(json.dumps(baseline_times(backends)))
    return 0


def matmul_peak_tflops(device: str) -> float:
    """TFLOP/s of a square bfloat16 matrix product on the eager device (8192
    on a GPU, 1024 on the CPU): the reference the matmul-bound step is held to."""
    n = 8192 if device.startswith("cuda") else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    finish = eager_finish(device)
    for _ in range(3):
        a @ b
    finish()
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    finish()
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def chart(rows, path: str, eager_name: str = "eager CPU") -> None:
    """Bars of each backend's ratio to the eager baseline, per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (make bench installs it)")
        return
    series = [("pjrt lazy", "pjrt_vs_eager"), ("pjrt compile", "pjrt_dynamo_vs_eager"),
              ("pjrt compile + opt.step", "pjrt_dynamo_opt_vs_eager"), ("execute only (lazy)", "execute_only_vs_eager"),
              ("inductor", "inductor_vs_eager")]
    series = [(label, key) for label, key in series if any(r.get(key) for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    width = 0.8 / max(1, len(series))
    for i, (label, key) in enumerate(series):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r.get(key) or 0 for r in rows], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["model"] for r in rows])
    ax.set_ylabel(f"step time / {eager_name} (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds of timing; each times one block of every backend in turn (default 5)")
    p.add_argument("--block-s", type=float, default=0.15,
                   help="seconds of steps per block, at least 3 steps (default 0.15)")
    p.add_argument("--warmup", type=int, default=3, help="steps of each backend before timing (default 3)")
    p.add_argument("--quick", action="store_true", help="small sizes only")
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile (inductor)")
    p.add_argument("--no-first-step", action="store_true", help="skip the new-process first-step and warm-start runs")
    p.add_argument("--eager-device", default="cpu",
                   help="device of the eager and inductor baselines: cpu (default) or cuda (with PJRT_DEVICE=CUDA)")
    p.add_argument("--matmul", action="store_true",
                   help="add the matmul-bound bfloat16 step (for GPUs) and its TFLOP/s against a bfloat16 matrix "
                        "product of the eager device")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.json"))
    p.add_argument("--first-step", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--eager-child", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="lazy", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.eager_child:
        return run_eager_child(args.eager_child, args)
    import_pjrt()
    if args.first_step:
        return run_first_step(args.first_step, args.mode)

    # The per-op floor next to the traced steps' us/op: what PyTorch's own
    # dispatch from Python costs on the eager CPU, and pjrt's on the same
    # chain; timed first, in a process that has run nothing else yet.
    chain = {"eager_cpu": op_chain_us("cpu"), "pjrt": op_chain_us(torch_pjrt.device())}
    rows = []
    eager_name = "eager " + ("CUDA" if args.eager_device.startswith("cuda") else args.eager_device.upper())
    gpu = torch.cuda.get_device_name() if args.eager_device.startswith("cuda") else None
    print(f"torch {torch.__version__}, plugin {torch_pjrt._C._plugin_path() if torch_pjrt.device_count() else '?'}, "
          f"{os.cpu_count()} CPU(s), {platform.machine()}{', ' + gpu if gpu else ''}; ratios to {eager_name}")
    header = (f"{'model':<10} {'eager ms':>8} {'ind.':>5} {'lazy':>5} {'exec':>5} {'comp':>5} {'c+opt':>5}"
              f" {'exec':>5} {'prg':>3} {'us/call':>7} {'chk':>5} {'1st s':>5} {'warm':>5} {'1st c':>5}"
              f" {'warm':>5} {'RSS MB':>6} {'dev MB':>6} {'us/op':>5} {'ours':>5} {'ops':>5}")
    print("ratios to eager: ind. inductor; lazy pjrt lazy, exec its programs alone; comp torch.compile (model),"
          " c+opt (model and opt.step), exec its programs alone; prg programs per step (compile);"
          " us/call backend time per graph call; chk cost of checks; 1st s first step (new process),"
          " warm its warm start / cold; 1st c, warm the same for compile; us/op lazy step host time per traced op,"
          " ours the part in torch-pjrt's C++")
    print(header)
    print("-" * len(header))
    for name, build, data, make_opt, loss_fn, clip in cases(args.quick, args.matmul):
        torch.manual_seed(0)
        torch._dynamo.reset()
        # On an accelerator the baselines run in a child process (baselines()).
        backends = baseline_backends(name, build, data, make_opt, loss_fn, clip, args) \
            if args.eager_device == "cpu" else {}
        backends["lazy"] = lazy_backend(build, data, make_opt, loss_fn, clip, args.warmup)
        backends["unchecked"] = lazy_backend(build, data, make_opt, loss_fn, clip, args.warmup, checks=False)
        backends["compile"] = dynamo_backend(build, data, make_opt, loss_fn, clip, args.warmup)
        backends["compile_opt"] = dynamo_backend(build, data, make_opt, loss_fn, clip, args.warmup, compile_step=True)
        time_rounds(list(backends.values()), args.rounds, args.block_s)
        base = baselines(name, args, backends)
        eager, ind, ind_first = base["eager_step_s"], base["inductor_step_s"], base["inductor_first_step_s"]
        pj = lazy_stats(backends["lazy"], EXEC_STEPS)
        unchecked = {"step_s": backends["unchecked"].best}
        dyn = dynamo_stats(backends["compile"], EXEC_STEPS)
        dyn_opt = dynamo_stats(backends["compile_opt"], EXEC_STEPS)
        del backends
        starts = {}
        if not args.no_first_step:
            for mode in ("lazy", "compile"):
                with tempfile.TemporaryDirectory() as cache:
                    cold = first_step_in_new_process(name, mode, cache)
                    warm = first_step_in_new_process(name, mode, cache)
                starts[mode] = (cold, warm)
        row = {"model": name, "eager_step_s": eager, "inductor_step_s": ind, "inductor_first_step_s": ind_first,
               "pjrt_step_s": pj["step_s"], "pjrt_first_step_s": pj["first_step_s"],
               "pjrt_vs_eager": pj["step_s"] / eager, "inductor_vs_eager": (ind / eager) if ind else None,
               "execute_only_s": pj["execute_only_s"], "execute_only_vs_eager": pj["execute_only_s"] / eager,
               "pjrt_programs_per_step": pj["programs_per_step"],
               "pjrt_dynamo_step_s": dyn["step_s"], "pjrt_dynamo_first_step_s": dyn["first_step_s"],
               "pjrt_dynamo_vs_eager": dyn["step_s"] / eager, "pjrt_dynamo": dyn,
               "pjrt_dynamo_opt_step_s": dyn_opt["step_s"], "pjrt_dynamo_opt_vs_eager": dyn_opt["step_s"] / eager,
               "pjrt_dynamo_opt": dyn_opt,
               "dynamo_execute_only_vs_eager": dyn_opt["execute_only_s"] / eager,
               "step_us_per_op": pj["step_us_per_op"], "trace_us_per_op": pj["trace_us_per_op"],
               "ops_per_step": pj["ops_per_step"],
               "pjrt_steady_state_compiles": pj["compiles_in_steady_state"], "pjrt_fallbacks": pj["fallbacks"],
               "pjrt_unchecked_step_s": unchecked["step_s"],
               "checks_cost": pj["step_s"] / unchecked["step_s"] - 1}
        for mode, (cold, warm) in starts.items():
            row[f"{mode}_cold_first_step_s"] = cold["first_step_s"]
            row[f"{mode}_warm_first_step_s"] = warm["first_step_s"]
            row[f"{mode}_warm_vs_cold"] = warm["first_step_s"] / cold["first_step_s"]
            row[f"{mode}_peak_rss_bytes"] = cold["peak_rss_bytes"]
            row[f"{mode}_peak_device_bytes"] = cold["peak_device_bytes"]
            row[f"{mode}_warm_compiles"] = warm["compiles"]
        rows.append(row)
        r = lambda v: f"{v:5.2f}" if v is not None else f"{'-':>5}"
        mb = lambda v: f"{v / 2**20:6.0f}" if v else f"{'-':>6}"
        print(f"{name:<10} {eager * 1e3:8.2f} {r(row['inductor_vs_eager'])} {r(row['pjrt_vs_eager'])}"
              f" {r(row['execute_only_vs_eager'])} {r(row['pjrt_dynamo_vs_eager'])} {r(row['pjrt_dynamo_opt_vs_eager'])}"
              f" {r(row['dynamo_execute_only_vs_eager'])} {dyn['programs_per_step']:3.0f}"
              f" {dyn['backend_us_per_call'] or 0:7.1f} {row['checks_cost'] * 100:4.0f}%"
              f" {r(row.get('lazy_cold_first_step_s'))} {r(row.get('lazy_warm_vs_cold'))}"
              f" {r(row.get('compile_cold_first_step_s'))} {r(row.get('compile_warm_vs_cold'))}"
              f" {mb(row.get('lazy_peak_rss_bytes'))} {mb(row.get('lazy_peak_device_bytes'))}"
              f" {pj['step_us_per_op']:5.1f} {pj['trace_us_per_op']:5.1f} {pj['ops_per_step']:5.0f}")
        if dyn["refusals"] or dyn_opt["refusals"]:
            print(f"  not replayed: {dyn['refusals'] or dyn_opt['refusals']}")
    peak = None
    mm = [r for r in rows if r["model"] == "matmul-bf16"]
    if mm:
        peak = matmul_peak_tflops(args.eager_device)
        r = mm[0]
        for key, label in (("eager_step_s", eager_name), ("pjrt_step_s", "pjrt lazy"),
                           ("pjrt_dynamo_step_s", "pjrt compile"), ("pjrt_dynamo_opt_step_s", "pjrt compile + opt.step")):
            r[key.replace("step_s", "tflops")] = matmul_flops() / r[key] / 1e12
        print(f"matmul-bf16 TFLOP/s: " + ", ".join(
            f"{label} {r[key.replace('step_s', 'tflops')]:.1f}" for key, label in
            (("eager_step_s", eager_name), ("pjrt_step_s", "pjrt lazy"), ("pjrt_dynamo_step_s", "pjrt compile"),
             ("pjrt_dynamo_opt_step_s", "pjrt compile + opt.step")))
              + f"; a square bfloat16 matrix product on {eager_name}: {peak:.1f}")
    small = [r for r in rows if r["model"].endswith("small")]
    # A target whose numbers this run did not measure (--no-first-step) is
    # None, printed as "not measured", never a vacuous yes.
    measured = not args.no_first_step
    targets = {
        "compile_at_most_eager_on_small_models": all(r["pjrt_dynamo_opt_vs_eager"] <= 1.0 for r in small),
        "lazy_at_most_1.3x_eager_on_small_models": all(r["pjrt_vs_eager"] <= 1.3 for r in small),
        "trace_under_1.5us_per_op": all(r["step_us_per_op"] <= 1.5 for r in rows),
        "first_step_under_2s_on_small_models":
            all(r["lazy_cold_first_step_s"] <= 2 for r in small) if measured else None,
        "compiled_first_step_under_2s_on_small_models":
            all(r["compile_cold_first_step_s"] <= 2 for r in small) if measured else None,
        "warm_start_under_30_percent":
            all(r[f"{m}_warm_vs_cold"] <= 0.3 for r in rows for m in ("lazy", "compile")) if measured else None,
        "no_steady_state_compiles": all(r["pjrt_steady_state_compiles"] == 0 and
                                        r["pjrt_dynamo"]["compiles_in_steady_state"] == 0 and
                                        r["pjrt_dynamo_opt"]["compiles_in_steady_state"] == 0 for r in rows),
        "checks_under_3_percent": all(r["checks_cost"] < 0.03 for r in rows),
    }
    if mm:
        targets["matmul_bf16_at_least_60_percent_of_peak"] = mm[0]["pjrt_dynamo_opt_tflops"] >= 0.6 * peak
    print(f"per-op floor, a chain of 600 tiny ops (8x8 mm, add_, relu): eager CPU {chain['eager_cpu']:.2f} us/op,"
          f" pjrt lazy {chain['pjrt']:.2f} us/op (tracing and one sync per chain)")
    print("targets:", ", ".join(f"{k}={'not measured' if v is None else 'yes' if v else 'NO'}" for k, v in targets.items()))
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
                   "eager_device": args.eager_device, "gpu": gpu, "matmul_peak_tflops": peak,
                   "plugin": torch_pjrt.runtime.plugin_info(), "rows": rows, "op_chain_us": chain,
                   "targets": targets}, f, indent=2)
    print(f"wrote {args.out}")
    chart(rows, os.path.splitext(args.out)[0] + ".png", eager_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
