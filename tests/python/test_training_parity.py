"""The three reference models train for 30 steps on pjrt and on CPU (eager,
the oracle) from the same weights and data; their loss curves must agree.

Tolerance: relative 1e-4 per step. Float32 has a 1.2e-7 unit roundoff; XLA
fuses and reassociates reductions, so single ops differ by a few ulps, and 30
optimizer steps amplify that by the problem's conditioning. We measure about
2e-7 on the XLA CPU plugin; 1e-4 leaves room for other plugins' kernels while
still failing on any real bug (a wrong gradient moves the curve by >1e-2
within a few steps)."""

import pytest
import torch

import torch_pjrt
from training import make_case, train

STEPS = 30


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_loss_curves_match_cpu(name):
    model, batches, make_opt, loss_fn, clip = make_case(name)
    cpu = train(model, batches, make_opt, loss_fn, clip, STEPS, "cpu")
    compiles = []

    def after(step):
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))

    torch_pjrt.metrics.reset()
    pjrt = train(model, batches, make_opt, loss_fn, clip, STEPS, torch_pjrt.device(), after)
    for step, (a, b) in enumerate(zip(cpu, pjrt)):
        assert b == pytest.approx(a, rel=1e-4), f"step {step}: cpu {a} vs pjrt {b}"
    assert cpu[-1] < cpu[0], "the model should learn"
    # steady state: nothing compiles after step 3
    assert compiles[3] == compiles[-1], f"compiles per step: {compiles}"
    assert compiles[-1] <= 3
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
    assert torch_pjrt.metrics.counters()["executions"] >= STEPS
