"""A data-parallel training job used by the distributed tests: each process
trains the same MLP on its slice of every global batch (gradients averaged
across processes), then writes its rank's view of the runtime and, on rank
0, the final weights. With ``gloo`` as its third argument the script first
makes its own gloo process group, which torch_pjrt.distributed then uses
(through host copies: gloo cannot take pjrt tensors)."""

import json
import os
import sys

import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import distributed as D, runtime

STEPS = 10


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 16, 8, generator=g), torch.randint(0, 4, (STEPS, 16), generator=g)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def main(out_dir: str, die_rank: int = -1, group: str = "") -> None:
    rank, world = runtime.global_ordinal(), runtime.world_size()
    if group == "gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    info = {"rank": rank, "world": world, "local": runtime.local_ordinal(), "host": runtime.host_index(),
            "process_count": runtime.process_count(), "devices": runtime.addressable_device_count(),
            "type": runtime.device_type(), "using_pjrt": runtime.using_pjrt()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    dev = torch_pjrt.device()
    m = model().to(dev)
    D.broadcast_master_param(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    X, Y = data()
    per = 16 // world
    for s in range(STEPS):
        if s == 3 and rank == die_rank:
            os._exit(3)  # a peer dies mid-training
        x = X[s][rank * per:(rank + 1) * per].to(dev)
        y = Y[s][rank * per:(rank + 1) * per].to(dev)
        F.cross_entropy(m(x), y).backward()
        D.optimizer_step(opt)
        opt.zero_grad()
        torch_pjrt.sync()
    D.rendezvous("done")
    if rank == 0:
        torch.save([p.detach().cpu() for p in m.parameters()], os.path.join(out_dir, "weights.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1, sys.argv[3] if len(sys.argv) > 3 else "")
