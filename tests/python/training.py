"""Shared training loops for parity tests and benchmarks: the same model,
data and optimizer on CPU (eager, the oracle) and on pjrt."""

from __future__ import annotations

import copy
import os
import sys
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from models import CNN, GPT, MLP  # noqa: E402


def make_case(name: str, seed: int = 0):
    """(model, batches, optimizer factory, loss function, clip) of one reference case."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "mlp":
        model = MLP()
        batches = [(torch.randn(32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)]
        return model, batches, lambda p: torch.optim.AdamW(p, lr=3e-3), F.cross_entropy, None
    if name == "cnn":
        model = CNN()
        batches = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(4)]
        return model, batches, lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9), F.cross_entropy, None
    if name == "gpt":
        model = GPT()
        batches = []
        for _ in range(4):
            seq = torch.randint(0, 64, (4, 17), generator=g)
            batches.append((seq[:, :-1], seq[:, 1:]))

        def loss_fn(out, tgt):
            return F.cross_entropy(out.reshape(-1, out.size(-1)), tgt.reshape(-1))

        return model, batches, lambda p: torch.optim.AdamW(p, lr=3e-3), loss_fn, 1.0
    raise ValueError(name)


def train(model, batches, make_opt, loss_fn, clip, steps: int, device, after_step: Callable[[int], None] = None
          ) -> List[float]:
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    data = [(x.to(device), y.to(device)) for x, y in batches]
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        if after_step is not None:
            after_step(step)
        losses.append(loss.detach())
    return [float(l.cpu()) for l in losses]
