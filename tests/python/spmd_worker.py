"""SPMD training patterns on CPU_NUM_DEVICES devices (run by test_spmd.py in
a subprocess per device count): each trains 20 AdamW steps sharded and
prints one JSON line of measurements; the CPU (eager) run is the oracle."""

from __future__ import annotations

import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import metrics, spmd

STEPS = 20


class TPNet(nn.Module):
    """Attention (column-parallel q/k/v, row-parallel output) and an MLP
    (column-parallel fc1, row-parallel fc2) on [batch, seq, d]."""

    def __init__(self, d: int = 16, heads: int = 4, hidden: int = 32, classes: int = 8):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):
            return y.reshape(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(F.gelu(self.fc1(x)))
        return self.out(x.mean(1))


# column-parallel: output features split; row-parallel: input features split
TP_SPECS = {"q.weight": ("model", None), "k.weight": ("model", None), "v.weight": ("model", None),
            "q.bias": ("model",), "k.bias": ("model",), "v.bias": ("model",), "o.weight": (None, "model"),
            "fc1.weight": ("model", None), "fc1.bias": ("model",), "fc2.weight": (None, "model")}


def data(n: int, shape, classes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)) for _ in range(4)]


def cpu_run(model, batches, perturb: float = 0.0):
    model = copy.deepcopy(model)
    if perturb:
        g = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=g))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(STEPS):
        x, y = batches[step % len(batches)]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model


def spmd_run(model, batches, mesh, place_model, batch_spec):
    model = place_model(copy.deepcopy(model))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = [(spmd.distribute(x, mesh, batch_spec(x)), spmd.distribute(y, mesh, batch_spec(y))) for x, y in batches]
    losses = []
    counters = {}
    for step in range(STEPS):
        if step == 3:
            torch_pjrt.sync(wait=True)
            counters = metrics.counters()
        x, y = data[step % len(data)]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        losses.append(loss.detach())
    after = metrics.counters()  # before any wait: sync(wait=True) reads each program's check flag
    torch_pjrt.sync(wait=True)
    delta = {k: after.get(k, 0) - counters.get(k, 0) for k in
             ("bytes_to_host", "bytes_to_device", "compiles", "executions", "donated_buffers")}
    return [float(l.cpu()) for l in losses], model, opt, delta


def compare(cpu_losses, cpu_model, losses, model):
    """Largest relative difference of losses and final parameters."""
    worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(cpu_losses, losses))
    for (name, p), q in zip(cpu_model.named_parameters(), model.parameters()):
        got = q.detach().cpu()
        worst = max(worst, float((got - p.detach()).abs().max() / p.detach().abs().max().clamp_min(1e-6)))
    return worst


def per_device(tensors, n):
    out = [0] * n
    for t in tensors:
        b = spmd.shard_bytes(t)
        for i in range(n):
            out[i] += b[i] if len(b) == n else b[0] * (i == 0)
    return out


def main():
    n = torch_pjrt.device_count()
    result = {"devices": n}
    torch.manual_seed(0)

    # data parallel: batch split over "data", parameters replicated
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    batches = data(32, (32,), 10, seed=1)
    cpu_losses, cpu_model = cpu_run(mlp, batches)
    result["mlp_noise"] = compare(cpu_losses, cpu_model, *cpu_run(mlp, batches, perturb=1e-6))
    mesh = spmd.Mesh((n,), ("data",))
    batch_spec = lambda t: ("data",) + (None,) * (t.dim() - 1)  # noqa: E731
    losses, model, opt, delta = spmd_run(mlp, batches, mesh, lambda m: spmd.distribute_module(m, mesh), batch_spec)
    result["dp"] = {"diff": compare(cpu_losses, cpu_model, losses, model), "delta": delta,
                    "x_shard_bytes": spmd.shard_bytes(spmd.distribute(batches[0][0], mesh, batch_spec(batches[0][0])))}

    # FSDP-style: parameters, gradients, optimizer state split over "data"
    losses, model, opt, delta = spmd_run(mlp, batches, mesh, lambda m: spmd.shard_module(m, mesh, "data"), batch_spec)
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.device.type == "pjrt"]
    full = sum(p.numel() * p.element_size() for p in params) + sum(v.numel() * v.element_size() for v in state)
    dev = per_device(params + state, n)
    result["fsdp"] = {"diff": compare(cpu_losses, cpu_model, losses, model), "delta": delta,
                      "full_bytes": full, "per_device_bytes": dev,
                      "sharded_params": sum(not spmd.sharding_of(p).hlo.startswith("{replicated") for p in params),
                      "state_like_param": sum(spmd.sharding_of(v).hlo == spmd.sharding_of(p).hlo
                                              for p in params for v in opt.state[p].values()
                                              if isinstance(v, torch.Tensor) and v.device.type == "pjrt"),
                      "state_count": len(state)}

    # tensor parallel on a 2-D mesh (data x model)
    tp = TPNet()
    tbatches = data(8, (4, 16), 8, seed=2)
    cpu_losses, cpu_model = cpu_run(tp, tbatches)
    result["tp_noise"] = compare(cpu_losses, cpu_model, *cpu_run(tp, tbatches, perturb=1e-6))
    mesh2 = spmd.Mesh((2, n // 2), ("data", "model"))
    spec_fn = lambda name, t: TP_SPECS.get(name)  # noqa: E731
    losses, model, opt, delta = spmd_run(tp, tbatches, mesh2, lambda m: spmd.distribute_module(m, mesh2, spec_fn),
                                         batch_spec)
    result["tp"] = {"diff": compare(cpu_losses, cpu_model, losses, model), "delta": delta,
                    "fc1_shard_bytes": spmd.shard_bytes(model.fc1.weight),
                    "fc1_sharding": spmd.sharding_of(model.fc1.weight).hlo,
                    "o_sharding": spmd.sharding_of(model.o.weight).hlo}
    result["spmd_in_use"] = torch_pjrt.runtime.spmd_in_use()
    if "--misc" in sys.argv:
        result["misc"] = misc(mesh)
    print(json.dumps(result))


def misc(mesh):
    """Semantics beyond training: printing, state_dict, constraints on
    intermediates, memory, torch.compile, mixing errors."""
    n = mesh.size
    out = {}
    a = torch.randn(8 * n, 16)
    x = spmd.distribute(a, mesh, ("data", None))
    out["device"] = str(x.device)
    out["print_ok"] = repr(x.detach().cpu()) == repr(a) and str(x).startswith("tensor(")
    model = spmd.shard_module(nn.Linear(16, 8 * n), mesh, "data")
    sd = model.state_dict()
    out["state_dict_ok"] = all(t.device.type == "pjrt" for t in sd.values()) and sd["weight"].cpu().shape == (8 * n, 16)
    # a CPU state dict loaded into the sharded model (a host copy_ into each
    # parameter) keeps the parameters' shardings: it unsharded them
    fresh = nn.Linear(16, 8 * n)
    before = spmd.sharding_of(model.weight).hlo
    model.load_state_dict(fresh.state_dict())
    out["load_keeps_sharding"] = (spmd.sharding_of(model.weight).hlo == before and
                                  spmd.shard_bytes(model.weight) == [8 * 16 * 4] * n and
                                  torch.equal(model.weight.detach().cpu(), fresh.weight.detach()))
    # a constraint on a pending intermediate
    w = spmd.distribute(torch.randn(16, 8 * n), mesh)
    y = x @ w
    spmd.mark_sharding(y, mesh, (None, "data"))
    out["constraint_in_program"] = 'call_target_name = "Sharding"' in torch_pjrt._C._stablehlo([y])
    out["constraint_ok"] = torch.allclose(y.cpu(), a @ w.cpu(), atol=1e-4, rtol=1e-4)
    out["constraint_sharding"] = spmd.sharding_of(y).hlo
    out["constraint_bytes"] = spmd.shard_bytes(y)
    # a view: mark_sharding refuses it, with_sharding_constraint copies it
    c = spmd.with_sharding_constraint(x.t(), mesh, ("data", None))
    out["view_constraint_ok"] = torch.equal(c.cpu(), a.t()) and spmd.sharding_of(c).hlo.startswith(f"{{devices=[{n},1]")
    try:
        spmd.mark_sharding(x.t(), mesh, ("data", None))
        out["view_error"] = ""
    except ValueError as e:
        out["view_error"] = str(e)
    # memory: pieces of a 1 MiB tensor on each device
    torch_pjrt.sync(wait=True)
    before = [torch.pjrt.memory_allocated(i) for i in range(n)]
    big = spmd.distribute(torch.ones(64 * n, 1024), mesh, ("data", None))
    after = [torch.pjrt.memory_allocated(i) for i in range(n)]
    out["memory_growth"] = [b - c for b, c in zip(after, before)]
    out["memory_big_bytes"] = big.numel() * 4
    out["memory_stats_keys"] = sorted(torch.pjrt.memory_stats(0))
    out["max_memory_ok"] = torch.pjrt.max_memory_allocated(1) >= after[1]
    # torch.compile honours the shardings of its inputs
    lin = nn.Linear(16, 4)
    ref = lin(a)
    dlin = spmd.distribute_module(copy.deepcopy(lin), mesh)
    compiled = torch.compile(dlin, backend="pjrt")
    got = compiled(x)
    torch_pjrt.sync()
    out["dynamo_ok"] = torch.allclose(got.detach().cpu(), ref.detach(), atol=1e-5)
    out["dynamo_sharding"] = spmd.sharding_of(got).hlo if spmd.sharding_of(got) else None
    # later calls, forward and backward, on new inputs (they once failed: a
    # replay launched the SPMD program with one argument list)
    worst = 0.0
    for k in range(3):
        ak = a * (k + 2)
        xk = spmd.distribute(ak, mesh, ("data", None))
        loss = compiled(xk).square().mean()
        loss.backward()
        lin.zero_grad()
        lin(ak).square().mean().backward()
        worst = max(worst, (loss.detach().cpu() - lin(ak).square().mean().detach()).abs().item(),
                    (dlin.weight.grad.cpu() - lin.weight.grad).abs().max().item())
        dlin.zero_grad()
    out["dynamo_repeat_err"] = worst
    out["dynamo_refusals"] = sorted(torch_pjrt.dynamo.call_stats()["refusals"])
    # another mesh on the same first device: tensors of the first do not mix
    other = spmd.Mesh((2,), ("d",), devices=[0, 1])
    z = spmd.distribute(torch.ones(4, 2), other, ("d", None))
    try:
        (x[:4, :2] + z).cpu()
        out["mix_error"] = ""
    except RuntimeError as e:
        out["mix_error"] = str(e)
    try:
        (z + torch.ones(4, 2, device="pjrt:1")).cpu()
        out["device_error"] = ""
    except RuntimeError as e:
        out["device_error"] = str(e)
    return out


if __name__ == "__main__":
    sys.exit(main())
