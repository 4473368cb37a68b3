"""Mixed precision as users write it: ``torch.autocast("pjrt")`` follows
CUDA's policy (csrc/aten/autocast.cc, docs/autocast.md), ``GradScaler("pjrt")``
runs its two kernels on the device, and models train under both, eager and
compiled, without a CPU fallback.

Tolerances: a bfloat16 result has 8 significant bits (unit roundoff 3.9e-3);
op results are compared with rtol 2e-2 against the same op computed on the
CPU with the same explicit casts. Loss curves of a few optimizer steps in
bfloat16 against float32 CPU training stay within rtol 2e-2 (we measure
6e-4..1e-3 on the XLA CPU plugin, docs/autocast.md), float16 with a
GradScaler too (1e-4)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import torch_pjrt
from training import make_case
from models import GPT

DEV = torch_pjrt.device()
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(autouse=True)
def clean_metrics():
    torch_pjrt.metrics.reset()
    yield
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()


def test_autocast_is_available_and_defaults_to_bfloat16():
    assert torch.amp.is_autocast_available("pjrt")
    assert torch.get_autocast_dtype("pjrt") == BF16
    assert torch.pjrt.get_amp_supported_dtype() == [BF16, F16]
    x = torch.randn(4, 4).to(DEV)
    with torch.autocast("pjrt"):
        assert torch.is_autocast_enabled("pjrt")
        assert torch.get_autocast_dtype("pjrt") == BF16
        assert (x @ x).dtype == BF16
    assert not torch.is_autocast_enabled("pjrt")
    assert (x @ x).dtype == F32


def _inputs():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(4, 8, generator=g),
        "w": torch.randn(6, 8, generator=g),
        "b": torch.randn(6, generator=g),
        "img": torch.randn(2, 3, 8, 8, generator=g),
        "k": torch.randn(4, 3, 3, 3, generator=g),
        "t": torch.randint(0, 6, (4,), generator=g),
        "h": torch.randn(2, 4, 8, generator=g),
    }


# (name, op, expected dtype on pjrt, whether CPU autocast's policy agrees,
#  CPU reference with explicit casts)
CASES = [
    ("linear", lambda a: F.linear(a["x"], a["w"], a["b"]), BF16, True,
     lambda a: F.linear(a["x"].to(BF16), a["w"].to(BF16), a["b"].to(BF16))),
    ("matmul", lambda a: a["x"] @ a["w"].t(), BF16, True, lambda a: a["x"].to(BF16) @ a["w"].t().to(BF16)),
    ("bmm", lambda a: torch.bmm(a["h"], a["h"].transpose(1, 2)), BF16, True,
     lambda a: torch.bmm(a["h"].to(BF16), a["h"].transpose(1, 2).to(BF16))),
    ("conv2d", lambda a: F.conv2d(a["img"], a["k"], padding=1), BF16, True,
     lambda a: F.conv2d(a["img"].to(BF16), a["k"].to(BF16), padding=1)),
    # not in CUDA's lists, but computed in float32 on pjrt (docs/autocast.md)
    ("batch_norm", lambda a: F.batch_norm(F.conv2d(a["img"], a["k"], padding=1) + 3, None, None, training=True), BF16,
     True, lambda a: F.batch_norm(F.conv2d(a["img"].to(BF16), a["k"].to(BF16), padding=1) + 3, None, None,
                                  training=True)),
    # float32 ops, here given a bfloat16 input: they compute in float32
    ("softmax", lambda a: F.softmax((a["x"] @ a["x"].t()), -1), F32, False,
     lambda a: F.softmax((a["x"].to(BF16) @ a["x"].t().to(BF16)).float(), -1)),
    ("log_softmax", lambda a: F.log_softmax(F.linear(a["x"], a["w"]), -1), F32, False,
     lambda a: F.log_softmax(F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), -1)),
    ("layer_norm", lambda a: F.layer_norm(F.linear(a["x"], a["w"]), (6,)), F32, False,
     lambda a: F.layer_norm(F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), (6,))),
    ("cross_entropy", lambda a: F.cross_entropy(F.linear(a["x"], a["w"]), a["t"]), F32, True,
     lambda a: F.cross_entropy(F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), a["t"])),
    ("mse_loss", lambda a: F.mse_loss(F.linear(a["x"], a["w"]), a["x"][:, :6]), F32, True,
     lambda a: F.mse_loss(F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), a["x"][:, :6])),
    ("sum", lambda a: F.linear(a["x"], a["w"]).sum(1), F32, False,
     lambda a: F.linear(a["x"].to(BF16), a["w"].to(BF16)).float().sum(1)),
    ("exp", lambda a: torch.exp(F.linear(a["x"], a["w"]) / 8), F32, False,
     lambda a: torch.exp(F.linear(a["x"].to(BF16), a["w"].to(BF16)).float() / 8)),
    # promote: the widest float dtype among the inputs
    ("cat", lambda a: torch.cat([F.linear(a["x"], a["w"]), a["x"]], 1), F32, True,
     lambda a: torch.cat([F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), a["x"]], 1)),
    ("addcmul", lambda a: torch.addcmul(a["b"], F.linear(a["x"], a["w"]), a["b"]), F32, True,
     lambda a: torch.addcmul(a["b"], F.linear(a["x"].to(BF16), a["w"].to(BF16)).float(), a["b"])),
    # not listed: runs in the dtype it is given
    ("relu", lambda a: F.relu(F.linear(a["x"], a["w"])), BF16, True,
     lambda a: F.relu(F.linear(a["x"].to(BF16), a["w"].to(BF16)))),
]


@pytest.mark.parametrize("name,op,dtype,cpu_agrees,ref", CASES, ids=[c[0] for c in CASES])
def test_op_dtypes_and_values(name, op, dtype, cpu_agrees, ref):
    a = _inputs()
    dev = {k: v.to(DEV) for k, v in a.items()}
    with torch.autocast("pjrt", dtype=BF16):
        got = op(dev)
    assert got.dtype == dtype
    if cpu_agrees:
        with torch.autocast("cpu", dtype=BF16):
            assert op(a).dtype == dtype
    want = ref(a)
    assert want.dtype == dtype
    torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-2)


def test_ops_outside_the_lists_accumulate_16_bit_sums_in_float32():
    """mean, avg pooling and the like run in the activation's dtype under
    autocast; their sums accumulate in float32 as the CPU's do."""
    x = (torch.randn(8, 8, 16, 16, generator=torch.Generator().manual_seed(0)) ** 2).to(BF16)
    for op in (lambda t: t.mean((0, 2, 3)), lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: F.avg_pool2d(t, 4)):
        got = op(x.to(DEV))
        assert got.dtype == BF16
        torch.testing.assert_close(got.cpu(), op(x), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batch_norm_of_a_half_model_runs_under_autocast(dtype):
    # model.half() under autocast: batch_norm's float32 path gave the float32
    # input half parameters, which batch_norm refuses
    bn = torch.nn.BatchNorm2d(4).to(dtype)
    x = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    dev = copy.deepcopy(bn).to(DEV)
    for train in (True, False):
        bn.train(train), dev.train(train)
        with torch.autocast("cpu", dtype=dtype):
            want = bn(x)
        with torch.autocast(DEV.type, dtype=dtype):
            got = dev(x.to(DEV))
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dev.running_var.cpu(), bn.running_var, rtol=1e-2, atol=1e-3)


def test_disabled_and_nested_regions():
    x = torch.randn(4, 4).to(DEV)
    with torch.autocast("pjrt", enabled=False):
        assert (x @ x).dtype == F32
    with torch.autocast("pjrt", dtype=BF16):
        assert (x @ x).dtype == BF16
        with torch.autocast("pjrt", enabled=False):
            assert (x @ x).dtype == F32
            # outside autocast a bfloat16 operand is not cast back
            assert (x.to(BF16) @ x.to(BF16)).dtype == BF16
        with torch.autocast("pjrt", dtype=F16):
            assert (x @ x).dtype == F16
        assert (x @ x).dtype == BF16
        # CPU tensors are left to CPU autocast, which is off here
        assert (x.cpu() @ x.cpu()).dtype == F32
    assert (x @ x).dtype == F32


def test_backward_through_autocast():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    wd = w.detach().to(DEV).requires_grad_()
    with torch.autocast("pjrt", dtype=BF16):
        y = torch.tanh(x.to(DEV) @ wd)
        loss = F.mse_loss(y, torch.zeros_like(y))
    assert y.dtype == BF16 and loss.dtype == F32
    loss.backward()
    assert wd.grad.dtype == F32
    ref = F.mse_loss(torch.tanh((x.to(BF16) @ w.to(BF16))).float(), torch.zeros(4, 8))
    ref.backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad, rtol=3e-2, atol=3e-3)


def _train(model, batches, make_opt, loss_fn, steps, device, dtype=None, scaler=None, compiled=False, out_dtypes=None):
    model = copy.deepcopy(model).to(device)
    run = torch.compile(model, backend="pjrt") if compiled else model
    opt = make_opt(model.parameters())
    data = [(x.to(device), y.to(device)) for x, y in batches]
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        with torch.autocast(device.type if isinstance(device, torch.device) else device, dtype=dtype or BF16,
                            enabled=dtype is not None):
            out = run(x)
            loss = loss_fn(out, y)
        if out_dtypes is not None:
            out_dtypes.append(out.dtype)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
        if device != "cpu":
            torch_pjrt.sync()
        losses.append(loss.detach())
    return [float(l.cpu()) for l in losses], model


def _adamw(p):
    return torch.optim.AdamW(p, lr=3e-3)


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_training_in_bfloat16_tracks_float32(name):
    model, batches, _, loss_fn, _ = make_case(name)
    if name == "gpt":
        torch.manual_seed(0)
        model = GPT(layers=1)  # one block: half the compile time, the same ops
    steps = 6
    ref, _ = _train(model, batches, _adamw, loss_fn, steps, "cpu")
    got, trained = _train(model, batches, _adamw, loss_fn, steps, DEV, dtype=BF16)
    for step, (a, b) in enumerate(zip(ref, got)):
        assert b == pytest.approx(a, rel=2e-2), f"step {step}: float32 cpu {a} vs bfloat16 pjrt {b}"
    assert got[-1] < got[0]
    assert all(p.dtype == F32 for p in trained.parameters())


def test_grad_scaler_trains_in_float16():
    dtype = F16
    model, batches, _, loss_fn, _ = make_case("mlp")
    steps = 6
    ref, _ = _train(model, batches, _adamw, loss_fn, steps, "cpu")
    scaler = torch.amp.GradScaler("pjrt", init_scale=2.0**14)
    got, _ = _train(model, batches, _adamw, loss_fn, steps, DEV, dtype=dtype, scaler=scaler)
    for step, (a, b) in enumerate(zip(ref, got)):
        assert b == pytest.approx(a, rel=2e-2), f"step {step}: float32 cpu {a} vs {dtype} pjrt {b}"
    assert scaler.get_scale() == 2.0**14  # no overflow in 6 steps; growth after 2000
    assert scaler._scale.device == DEV


def test_grad_scaler_skips_overflowing_steps():
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    w0 = m.weight.detach().cpu().clone()
    scaler = torch.amp.GradScaler("pjrt", init_scale=2.0**60)  # float16 gradients overflow
    x = torch.randn(4, 8).to(DEV)
    for step in range(2):
        with torch.autocast("pjrt", dtype=F16):
            loss = m(x).float().pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert scaler.get_scale() == 2.0 ** (59 - step)
    assert torch.equal(m.weight.detach().cpu(), w0)


def test_grad_scaler_kernels_match_cpu():
    """The two kernels against CPU's, through overflow, backoff and growth."""
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(5, generator=g), torch.randn(2, 3, generator=g).to(BF16), torch.randn(3, generator=g)]
    grads[2][1] = float("inf")
    for bad in (False, True):
        cpu = [t.clone() if bad else t.nan_to_num(posinf=1.0) for t in grads]
        dev = [t.to(DEV) for t in cpu]
        found_c, found_d = torch.zeros(1), torch.zeros(1).to(DEV)
        inv = torch.full((1,), 0.25)
        torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_c, inv)
        torch._amp_foreach_non_finite_check_and_unscale_(dev, found_d, inv.to(DEV))
        assert float(found_d.cpu()) == float(found_c) == float(bad)
        for a, b in zip(cpu, dev):
            assert b.dtype == a.dtype
            torch.testing.assert_close(b.cpu(), a, equal_nan=True)
    scale_c, tracker_c = torch.full((1,), 8.0), torch.zeros(1, dtype=torch.int32)
    scale_d, tracker_d = scale_c.to(DEV), tracker_c.to(DEV)
    for found in [0, 0, 0, 1, 0, 0, 0, 0]:
        f = torch.full((1,), float(found))
        torch._amp_update_scale_(scale_c, tracker_c, f, 2.0, 0.5, 3)
        torch._amp_update_scale_(scale_d, tracker_d, f.to(DEV), 2.0, 0.5, 3)
        assert float(scale_d.cpu()) == float(scale_c)
        assert int(tracker_d.cpu()) == int(tracker_c)


def test_compiled_model_under_autocast():
    """Dynamo and AOTAutograd trace through the same policy: the compiled
    transformer's logits are bfloat16, its losses track float32 training."""
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        model = GPT(layers=1)
        _, batches, _, loss_fn, _ = make_case("gpt")
        steps = 3
        ref, _ = _train(model, batches, _adamw, loss_fn, steps, "cpu")
        dtypes = []
        compiled, _ = _train(model, batches, _adamw, loss_fn, steps, DEV, dtype=BF16, compiled=True, out_dtypes=dtypes)
        assert dtypes == [BF16] * steps
        c = torch_pjrt.metrics.counters()
        assert c["dynamo_graphs"] == 2 and c["dynamo_fallback_nodes"] == 0
        for step, (a, b) in enumerate(zip(ref, compiled)):
            assert b == pytest.approx(a, rel=2e-2), f"step {step}: float32 cpu {a} vs compiled bfloat16 pjrt {b}"
    finally:
        torch._dynamo.reset()


def test_activation_checkpointing_under_autocast():
    """checkpoint() re-enters the device's autocast state for the recomputation:
    the gradients equal those of the plain run."""

    def block(x, w):
        return torch.tanh(x @ w) @ w

    def grads(use_checkpoint):
        torch.manual_seed(11)
        w = torch.randn(8, 8).to(DEV).requires_grad_()
        x = torch.randn(4, 8).to(DEV)
        with torch.autocast("pjrt", dtype=BF16):
            y = checkpoint(block, x, w, use_reentrant=False) if use_checkpoint else block(x, w)
        assert y.dtype == BF16
        y.float().pow(2).sum().backward()
        return w.grad.cpu()

    assert torch.equal(grads(False), grads(True))


def test_grad_scaler_grows_to_a_scale_whose_reciprocal_is_normal():
    # The reciprocal of 2^127 is subnormal, which XLA flushes to 0: a scaler
    # grown there (the CPU's schedule) would unscale every gradient to 0 and
    # train nothing, silently. pjrt's scale stops at 2^126, with the CPU's
    # parameters; a scale of 2^127 given at the start skips its first step
    # as an overflow and backs off.
    def run(device, init_scale, steps=4):
        w = torch.ones(2, device=device, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=1)
        scales = []
        for _ in range(steps):
            opt.zero_grad()
            scaler.scale((w * 0.5).sum()).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return w.detach().cpu(), scales

    cpu_w, cpu_scales = run("cpu", 2.0**124)
    got_w, got_scales = run(DEV, 2.0**124)
    assert cpu_scales == [2.0**125, 2.0**126, 2.0**127, 2.0**127]
    assert got_scales == [2.0**125, 2.0**126, 2.0**126, 2.0**126]
    torch.testing.assert_close(got_w, cpu_w, rtol=0, atol=0)
    assert torch.allclose(got_w, torch.full((2,), 1 - 4 * 0.05))
    got_w, got_scales = run(DEV, 2.0**127)
    assert got_scales == [2.0**126, 2.0**126, 2.0**126, 2.0**126]
    assert torch.allclose(got_w, torch.full((2,), 1 - 3 * 0.05))  # the first step skipped
