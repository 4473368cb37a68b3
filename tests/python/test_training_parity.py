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


def _fused_run(dev, cls, fused, kw, scaled=False, steps=4):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dev)
    opt = cls(m.parameters(), fused=fused, **kw)
    scaler = torch.amp.GradScaler(dev, init_scale=1024.0) if scaled else None
    x = torch.randn(8, 6).to(dev)
    for i in range(steps):
        opt.zero_grad()
        loss = m(x).pow(2).sum()
        if scaler is None:
            loss.backward()
            opt.step()
        else:  # step 2 overflows: the scaler skips it and halves its scale
            scaler.scale(loss * (float("inf") if i == 2 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        if dev != "cpu":
            torch_pjrt.sync()
    return [p.detach().cpu() for p in m.parameters()] + [p.grad.cpu() for p in m.parameters()]


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.Adam, dict(weight_decay=0.1, amsgrad=True)),
    (torch.optim.AdamW, dict(weight_decay=0.1, maximize=True)),
    (torch.optim.Adam, dict(lr=torch.tensor(0.01))),
    (torch.optim.SGD, dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.01, momentum=0.9, dampening=0.1, maximize=True)),
    (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
], ids=["adam-amsgrad", "adamw-maximize", "adam-tensor-lr", "sgd-nesterov", "sgd-dampening", "adagrad"])
def test_fused_optimizers_step_on_the_device(cls, kw):
    """fused=True runs the optimizer's fused kernel (_fused_adam_, ...): on
    pjrt it traces into the step, against the CPU's unfused step."""
    torch_pjrt.metrics.reset()
    for scaled in (False, True):
        want = _fused_run("cpu", cls, False, kw, scaled)
        got = _fused_run(torch_pjrt.device(), cls, True, kw, scaled)
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def test_fused_adamw_keeps_its_program_when_the_lr_equals_another_number():
    """The fused step's numbers were shared by value: a learning rate equal
    to the weight decay (a schedule reaching 0.01) compiled a program of
    another structure for that step. One argument per role now."""
    p = torch.nn.Parameter(torch.randn(4, device=torch_pjrt.device()))
    opt = torch.optim.AdamW([p], lr=0.02, weight_decay=0.01, fused=True)
    compiles = []
    for lr in (0.02, 0.015, 0.013, 0.01, 0.9, 0.012):  # 0.01 is the weight decay, 0.9 beta1
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.ones(4, device=torch_pjrt.device())
        torch_pjrt.sync()
        torch_pjrt.metrics.reset()
        opt.step()
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    assert compiles[2:] == [0, 0, 0, 0], compiles


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_adam_computes_its_bias_corrections_in_double(cls):
    """1 - beta2 ** step in float32 put the update off by up to 7e-4 of
    itself at beta2 = 0.99999 (the CPU's fused kernel and the unfused step
    compute it in double)."""
    torch.manual_seed(0)
    g = torch.randn(256)
    updates = {}
    for dev, fused in (("cpu", True), (torch_pjrt.device(), True)):
        p = torch.nn.Parameter(torch.zeros(256, device=dev))
        opt = cls([p], lr=1e-3, betas=(0.9, 0.99999), weight_decay=0.01, fused=fused)
        for _ in range(3):
            p.grad = g.to(dev)
            opt.step()
        updates[str(dev)] = p.detach().cpu()
    torch.testing.assert_close(updates["pjrt:0"], updates["cpu"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_adam_moves_its_first_moment_by_lerp_as_the_cpu(cls):
    """exp_avg as the CPU's fused kernel makes it, exp_avg.lerp(grad, 1 -
    beta1): bit-equal for either form of lerp (beta1 above and below 0.5),
    and NaN after an infinite gradient is followed by a finite one, where m *
    beta1 + g * (1 - beta1) kept the infinity."""
    torch.manual_seed(0)
    grads = [torch.randn(512) for _ in range(3)] + [torch.full((512,), float("inf")), torch.ones(512)]
    for betas in ((0.9, 0.999), (0.3, 0.99)):
        state = {}
        for dev in ("cpu", torch_pjrt.device()):
            p = torch.nn.Parameter(torch.ones(512, device=dev))
            opt = cls([p], lr=1e-3, betas=betas, fused=True)
            moments = []
            for g in grads:
                p.grad = g.to(dev)
                opt.step()
                moments.append(opt.state[p]["exp_avg"].cpu().clone())
            state[str(dev)] = moments
        for want, got in zip(state["cpu"], state["pjrt:0"]):
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
        assert state["cpu"][-1].isnan().all()
