"""A plain torch.distributed script on the "pjrt" backend, checked against
itself on the CPU in the same processes (the same group reduces CPU tensors
through gloo): every collective, then DistributedDataParallel (eager and
compiled), SyncBatchNorm, FSDP and FSDP2 training of the same model on both
devices. Writes its rank's results as JSON."""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist

import torch_pjrt


def collectives(dev: torch.device, r: int, w: int) -> dict:
    """Each collective's results on `dev`, as lists."""
    out = {}
    t = torch.arange(6.0, device=dev).reshape(2, 3) + r
    v = t.t()  # a non-contiguous view: written back through the view
    dist.all_reduce(v)
    out["all_reduce_view"] = t
    y = torch.arange(8.0, device=dev).reshape(2, 4) + r
    dist.all_reduce(y[:, 1::2])  # not dense: gloo alone writes it as if contiguous
    out["all_reduce_strided"] = y
    m = torch.tensor([r + 1.0, -r], device=dev)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = m
    i = torch.tensor([r + 3], device=dev)
    dist.all_reduce(i, op=dist.ReduceOp.PRODUCT)
    out["all_reduce_int_product"] = i
    avg = torch.tensor([r + 2.0], device=dev)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)  # Lightning's mean on a backend not named gloo
    out["all_reduce_avg"] = avg
    iavg = torch.tensor([r + 2], device=dev)
    dist.all_reduce(iavg, op=dist.ReduceOp.AVG)
    out["all_reduce_int_avg"] = iavg
    x = torch.full((2,), float(r), device=dev)
    parts = [torch.empty(2, device=dev) for _ in range(w)]
    dist.all_gather(parts, x)
    out["all_gather"] = torch.stack(parts)
    flat = torch.empty(2 * w, device=dev)
    dist.all_gather_into_tensor(flat, x)
    out["all_gather_into_tensor"] = flat
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * w, device=dev) + 10 * r)
    out["reduce_scatter_tensor"] = rs
    b = torch.full((3,), float(r + 5), device=dev)
    dist.broadcast(b, 1)
    out["broadcast"] = b
    red = torch.tensor([r + 1.0], device=dev)
    dist.reduce(red, 0)
    out["reduce_to_0"] = red if r == 0 else torch.zeros(1)
    gathered = [torch.empty(1, device=dev) for _ in range(w)] if r == 0 else None
    dist.gather(torch.tensor([float(r)], device=dev), gathered, dst=0)
    out["gather"] = torch.cat(gathered) if r == 0 else torch.zeros(w)
    sc = torch.empty(1, device=dev)
    dist.scatter(sc, [torch.tensor([7.0 + k], device=dev) for k in range(w)] if r == 0 else None, src=0)
    out["scatter"] = sc
    a2a = torch.empty(w, device=dev)
    dist.all_to_all_single(a2a, torch.arange(w, dtype=torch.float32, device=dev) + 10 * r)
    out["all_to_all_single"] = a2a
    if r == 0:
        dist.send(torch.tensor([42.0], device=dev), 1)
        dist.send(torch.tensor([5.0], device=dev), 1)
        out["recv"] = torch.zeros(3)
    else:
        q, q_any = torch.empty(1, device=dev), torch.empty(1, device=dev)
        dist.recv(q, 0)
        src = dist.recv(q_any)  # from any rank
        out["recv"] = torch.tensor([q.item(), q_any.item(), float(src)])
    # a ring of isend/irecv (pipeline parallelism's batch_isend_irecv): every
    # rank sends before any receive completes
    ring_in, ring_out = torch.zeros(2, device=dev), torch.full((2,), r + 1.0, device=dev)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, ring_out, (r + 1) % w),
                                       dist.P2POp(dist.irecv, ring_in, (r - 1) % w)]):
        req.wait()
    out["ring"] = ring_in
    sub = torch.tensor([r + 1.0], device=dev)
    dist.all_reduce(sub, group=dist.new_group([0, 1]))  # a group of its own (not split: rebuilt)
    out["new_group"] = sub
    work = dist.all_reduce(torch.ones(1, device=dev), async_op=True)
    work.wait()
    out["async_completed"] = torch.tensor([float(work.is_completed())])
    return {k: v.cpu().tolist() for k, v in out.items()}


def ddp_training(r: int) -> dict:
    """The same DDP training on the CPU and on pjrt: differences, and the
    counters of the pjrt side's steady steps."""
    dev = torch_pjrt.device()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    nets = {"cpu": copy.deepcopy(net), "pjrt": copy.deepcopy(net).to(dev)}
    if r == 1:  # another start: DDP broadcasts rank 0's parameters and buffers
        with torch.no_grad():
            for n in nets.values():
                for p in n.parameters():
                    p.add_(1.0)
    ddps = {k: torch.nn.parallel.DistributedDataParallel(n) for k, n in nets.items()}
    opts = {k: torch.optim.SGD(d.parameters(), lr=0.1, momentum=0.9) for k, d in ddps.items()}
    X = torch.randn(8, 8, 4, generator=torch.Generator().manual_seed(1))
    before = {}
    for s in range(8):
        for k, d in ddps.items():
            x = X[s][r * 4:(r + 1) * 4].to(dev if k == "pjrt" else "cpu")
            d(x).square().mean().backward()
            opts[k].step()
            opts[k].zero_grad()
        torch_pjrt.sync()
        if s == 3:
            before = dict(torch_pjrt.metrics.counters())
    after = torch_pjrt.metrics.counters()
    diff = {n: (a - b.cpu()).abs().max().item()
            for (n, a), b in zip(nets["cpu"].state_dict().items(), nets["pjrt"].state_dict().values())}
    return {"diff": diff, "steady": {k: after.get(k, 0) - before.get(k, 0) for k in ("executions", "compiles")},
            "fallbacks": torch_pjrt.metrics.fallbacks(),
            "moved": (nets["cpu"][0].weight - net[0].weight).abs().max().item()}


def sync_batch_norm(r: int, w: int) -> dict:
    """nn.SyncBatchNorm under DDP, each process on its share of the batch,
    against BatchNorm on the whole batch on the CPU (the same statistics):
    largest differences of the outputs, running statistics and gradients."""
    dev = torch_pjrt.device()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Tanh())
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 1.5)
        net[1].bias.uniform_(-0.5, 0.5)
    whole = copy.deepcopy(net)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.SyncBatchNorm.convert_sync_batchnorm(net).to(dev))
    X = torch.randn(2, 4 * w, 3, 6, 6, generator=torch.Generator().manual_seed(2)) * 3 + 1
    per = 4
    diff = {"out": 0.0, "grad": 0.0, "running": 0.0}
    for s in range(2):
        x = X[s]
        mine = x[r * per:(r + 1) * per].to(dev).requires_grad_()
        out = ddp(mine)
        out.square().mean().backward()
        ref_x = x.clone().requires_grad_()
        ref = whole(ref_x)
        ref.square().mean().backward()  # the mean over w shares: DDP's mean of the per-share gradients
        diff["out"] = max(diff["out"], (out.detach().cpu() - ref[r * per:(r + 1) * per].detach()).abs().max().item())
        # the input's gradient: the share's loss is w times the whole batch's loss's share
        diff["grad"] = max(diff["grad"], (mine.grad.cpu() / w - ref_x.grad[r * per:(r + 1) * per]).abs().max().item())
        for a, b in zip(ddp.module.parameters(), whole.parameters()):
            diff["grad"] = max(diff["grad"], (a.grad.cpu() - b.grad).abs().max().item())
            a.grad = None
            b.grad = None
    bn = ddp.module[1]
    diff["running"] = max((bn.running_mean.cpu() - whole[1].running_mean).abs().max().item(),
                          (bn.running_var.cpu() - whole[1].running_var).abs().max().item())
    return {"diff": diff, "sync_bn": type(bn).__name__, "fallbacks": torch_pjrt.metrics.fallbacks(),
            "running_var": whole[1].running_var.tolist()}


def compiled_ddp(r: int) -> float:
    """torch.compile(DDP model, backend="pjrt") against DDP on the CPU: the
    largest difference of the weights after 3 SGD steps (Dynamo runs DDP's
    bucket rebuild, which calls this group, eagerly)."""
    dev = torch_pjrt.device()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    nets = {"cpu": copy.deepcopy(net), "pjrt": copy.deepcopy(net).to(dev)}
    steps = {"cpu": torch.nn.parallel.DistributedDataParallel(nets["cpu"]),
             "pjrt": torch.compile(torch.nn.parallel.DistributedDataParallel(nets["pjrt"]), backend="pjrt")}
    opts = {k: torch.optim.SGD(n.parameters(), lr=0.1) for k, n in nets.items()}
    X = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(3))
    for s in range(3):
        for k, f in steps.items():
            f(X[s][r * 4:(r + 1) * 4].to(dev if k == "pjrt" else "cpu")).square().mean().backward()
            opts[k].step()
            opts[k].zero_grad()
    return max((a - b.cpu()).abs().max().item() for a, b in zip(nets["cpu"].parameters(), nets["pjrt"].parameters()))


def fsdp(r: int) -> dict:
    """FSDP (FullyShardedDataParallel) and FSDP2 (fully_shard) on pjrt
    against the same on the CPU: the largest differences of the losses of 4
    AdamW steps and of the trained model's output."""
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    X = torch.randn(5, 8, 4, generator=torch.Generator().manual_seed(4))

    def train(kind, dev):
        m = copy.deepcopy(net).to(dev)
        if kind == "fsdp":
            m = FullyShardedDataParallel(m, device_id=dev, use_orig_params=True)
        else:
            fully_shard(m[0])
            fully_shard(m[2])
            fully_shard(m)
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        losses = []
        for s in range(4):
            loss = m(X[s][r * 4:(r + 1) * 4].to(dev)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        return torch.stack(losses), m(X[4].to(dev)).detach().cpu()

    out = {}
    for kind in ("fsdp", "fsdp2"):
        (lc, oc), (lp, op) = train(kind, torch.device("cpu")), train(kind, torch_pjrt.device())
        out[kind] = max((lc - lp).abs().max().item(), (oc - op).abs().max().item())
    out["fallbacks"] = torch_pjrt.metrics.fallbacks()
    return out


def main(out_dir: str) -> None:
    dist.init_process_group("pjrt", device_id=torch_pjrt.device())  # as PyTorch's DDP tutorial (eager init)
    r, w = dist.get_rank(), dist.get_world_size()
    result = {"backend": dist.get_backend(), "cpu": collectives(torch.device("cpu"), r, w),
              "pjrt": collectives(torch_pjrt.device(), r, w), "ddp": ddp_training(r),
              "sync_batch_norm": sync_batch_norm(r, w), "compiled_ddp": compiled_ddp(r),
              "fsdp": fsdp(r)}
    dist.barrier()
    with open(os.path.join(out_dir, f"c10d{r}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
