"""EmbeddingBag, unfold/fold, logcumsumexp, CTC loss and eye on pjrt: forward
and backward against eager CPU, with no CPU fallback, and a small CTC speech
head that trains with CPU parity."""

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

DEV = torch_pjrt.device()


def gen(seed):
    return torch.Generator().manual_seed(seed)


def no_fallbacks():
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def check_grads(fn, inputs, rtol=1e-5, atol=1e-5, grad_rtol=1e-4, grad_atol=1e-5):
    """fn(*inputs) on CPU and on pjrt: results and the gradients of every
    floating input under a random weighting of the result."""
    torch_pjrt.metrics.reset()
    cpu = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    dev = [x.clone().to(DEV).requires_grad_(x.is_floating_point()) for x in inputs]
    want, got = fn(*cpu), fn(*dev)
    assert got.device.type == "pjrt"
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)
    w = torch.randn(want.shape, generator=gen(7), dtype=want.dtype)
    (want * w).sum().backward()
    (got * w.to(DEV)).sum().backward()
    for i, (c, d) in enumerate(zip(cpu, dev)):
        if c.is_floating_point():
            torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=grad_rtol, atol=grad_atol,
                                       msg=lambda m: f"grad of input {i}: {m}")
    no_fallbacks()


# ------------------------------------------------------------------- eye

def test_eye():
    torch_pjrt.metrics.reset()
    cases = [((4,), torch.float32), ((3, 5), torch.int64), ((5, 2), torch.bool), ((0,), torch.float32),
             ((2, 2), torch.float64)]
    for args, dtype in cases:
        got = torch.eye(*args, dtype=dtype, device=DEV)
        assert got.device.type == "pjrt" and got.dtype == dtype
        torch.testing.assert_close(got.cpu(), torch.eye(*args, dtype=dtype))
    out = torch.empty(2, device=DEV, dtype=torch.int32)
    torch.eye(3, 4, out=out)
    torch.testing.assert_close(out.cpu(), torch.eye(3, 4, dtype=torch.int32))
    torch.eye(2, out=out)
    torch.testing.assert_close(out.cpu(), torch.eye(2, dtype=torch.int32))
    no_fallbacks()


# ---------------------------------------------------------- logcumsumexp

def test_logcumsumexp():
    x = torch.randn(6, 37, generator=gen(1)) * 3
    check_grads(lambda a: torch.logcumsumexp(a, 1) + torch.logcumsumexp(a, 0) * 0.5, [x])


def test_logcumsumexp_extremes():
    """-inf entries, values 1e4 apart (a global max shift would underflow the
    early prefixes), +inf, and float64."""
    ninf, inf = float("-inf"), float("inf")
    x = torch.tensor([[ninf, ninf, 0.0, -1e4, 3.0, ninf, 1e4, -1e4],
                      [-2e4, -1e4, 0.0, 1e4, 2e4, 3e4, 4e4, 5e4],
                      [ninf, 1.0, inf, 2.0, ninf, inf, -3.0, 1.0]])
    torch_pjrt.metrics.reset()
    for t in (torch.float32, torch.float64):
        got = torch.logcumsumexp(x.to(t).to(DEV), 1).cpu()
        torch.testing.assert_close(got, torch.logcumsumexp(x.to(t), 1), rtol=1e-6, atol=0, equal_nan=True)
    no_fallbacks()
    # gradient through large spreads (finite inputs)
    check_grads(lambda a: torch.logcumsumexp(a, 0), [x[1] / 1000])


# ----------------------------------------------------------- unfold/fold

GEOMETRIES = [  # kernel, dilation, padding, stride, batched
    ((3, 3), 1, 0, 1, True),
    ((2, 3), (2, 1), (1, 2), (2, 1), False),
    ((3, 2), 2, 1, 3, True),
    (1, 1, 0, 1, False),
]


@pytest.mark.parametrize("geo", range(len(GEOMETRIES)))
def test_unfold(geo):
    k, dil, pad, st, batched = GEOMETRIES[geo]
    x = torch.randn(*((2,) if batched else ()), 3, 9, 8, generator=gen(geo))
    check_grads(lambda a: F.unfold(a, k, dilation=dil, padding=pad, stride=st), [x])


@pytest.mark.parametrize("geo", range(len(GEOMETRIES)))
def test_fold(geo):
    k, dil, pad, st, batched = GEOMETRIES[geo]
    batched = not batched
    size = (9, 8)
    # the column count of that geometry, taken from the CPU's unfold
    cols = F.unfold(torch.zeros(1, 3, *size), k, dilation=dil, padding=pad, stride=st)
    x = torch.randn(*((2,) if batched else ()), *cols.shape[1:], generator=gen(geo + 10))
    check_grads(lambda a: F.fold(a, size, k, dilation=dil, padding=pad, stride=st), [x])


# ---------------------------------------------------------- EmbeddingBag

def bag_inputs(seed):
    g = gen(seed)
    weight = torch.randn(12, 5, generator=g)
    idx = torch.randint(0, 12, (15,), generator=g)
    idx[3] = idx[4] = 2  # padding_idx, and a duplicate inside a bag
    idx[9] = 7
    idx[10] = 7
    offsets = torch.tensor([0, 4, 4, 9, 14])  # an empty bag, and a bag of one
    psw = torch.rand(15, generator=g) + 0.5
    return weight, idx, offsets, psw


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("layout", ["offsets", "offsets_last", "2d"])
def test_embedding_bag(mode, layout):
    # padding_idx and the index dtype vary with the case
    padding_idx = None if layout == "offsets_last" else 2
    index_dtype = torch.int32 if layout == "offsets" else torch.int64
    weight, idx, offsets, _ = bag_inputs(3)
    idx, offsets = idx.to(index_dtype), offsets.to(index_dtype)
    if layout == "2d":
        check_grads(lambda w: F.embedding_bag(idx.view(3, 5).to(w.device), w, mode=mode, padding_idx=padding_idx),
                    [weight])
        return
    last = layout == "offsets_last"
    offs = torch.cat([offsets, torch.tensor([15], dtype=index_dtype)]) if last else offsets
    check_grads(lambda w: F.embedding_bag(idx.to(w.device), w, offs.to(w.device), mode=mode, padding_idx=padding_idx,
                                          include_last_offset=last), [weight])


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_per_sample_weights(padding_idx):
    weight, idx, offsets, psw = bag_inputs(4)
    check_grads(lambda w, p: F.embedding_bag(idx.to(w.device), w, offsets.to(w.device), mode="sum",
                                             per_sample_weights=p, padding_idx=padding_idx), [weight, psw])


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq(mode):
    """Each index's gradient divided by its frequency in the batch. The CPU's
    EmbeddingBag divides by the wrong count when counts differ (pytorch#190063,
    fixed after 2.13), so the oracle is the CPU's F.embedding, whose scaling
    is right, summed (or averaged) per bag."""
    weight, idx, offsets, _ = bag_inputs(5)
    bag_of = torch.tensor([0, 0, 0, 0, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4])  # from the offsets [0, 4, 4, 9, 14]
    sizes = torch.bincount(bag_of, minlength=5).clamp_min(1).float()

    def oracle(w):
        rows = F.embedding(idx, w, scale_grad_by_freq=True)
        if mode == "mean":
            rows = rows / sizes[bag_of].unsqueeze(1)
        return torch.zeros(5, w.shape[1]).index_add(0, bag_of, rows)

    cpu_w = weight.clone().requires_grad_()
    want = oracle(cpu_w)
    assert not torch.equal(torch.bincount(idx), torch.bincount(idx).clamp(max=1))  # some index repeats
    dev_w = weight.to(DEV).requires_grad_()
    torch_pjrt.metrics.reset()
    got = F.embedding_bag(idx.to(DEV), dev_w, offsets.to(DEV), mode=mode, scale_grad_by_freq=True)
    torch.testing.assert_close(got.cpu(), want)
    w = torch.randn(want.shape, generator=gen(8))
    (want * w).sum().backward()
    (got * w.to(DEV)).sum().backward()
    torch.testing.assert_close(dev_w.grad.cpu(), cpu_w.grad)
    no_fallbacks()


@pytest.mark.parametrize("mode, padding_idx, psw", [(0, -1, True), (0, 2, False), (1, 2, False), (2, -1, False),
                                                     (2, 2, False)])
@pytest.mark.parametrize("last", [False, True])
def test_embedding_bag_aux_outputs(mode, padding_idx, psw, last):
    """offset2bag, bag_size and max_indices in the shapes of torch's meta
    kernel for a device other than the CPU (which a compiled graph is traced
    with; CUDA's), with the CPU's values where the CPU returns them (the
    backward reads them)."""
    weight, idx, offsets, p = bag_inputs(6)
    if last:
        offsets = torch.cat([offsets, torch.tensor([idx.numel()])])
    torch_pjrt.metrics.reset()
    args = (False, mode, False, p if psw else None, last, padding_idx)
    out, offset2bag, bag_size, max_indices = torch.ops.aten._embedding_bag(weight, idx, offsets, *args)
    meta = torch.ops.aten._embedding_bag(*(t.to("meta") for t in (weight, idx, offsets)), False, mode, False,
                                         p.to("meta") if psw else None, last, padding_idx)
    pa = (False, mode, False, p.to(DEV) if psw else None, last, padding_idx)
    got = [t.cpu() for t in torch.ops.aten._embedding_bag(weight.to(DEV), idx.to(DEV), offsets.to(DEV), *pa)]
    assert [g.shape for g in got] == [m.shape for m in meta], ([g.shape for g in got], [m.shape for m in meta])
    torch.testing.assert_close(got[0], out)
    bags = out.shape[0]
    sizes = torch.zeros(bags, dtype=torch.long).index_add_(0, got[1], (idx != padding_idx).long())
    assert torch.equal(got[1], torch.arange(bags).repeat_interleave(offsets.diff(append=torch.tensor([idx.numel()]))[:bags]))
    assert torch.equal(got[2][:bags], sizes) and (got[2][bags:] == 0).all()
    if offset2bag.numel():
        assert torch.equal(got[1], offset2bag)
    if mode != 0:
        assert torch.equal(got[2][:bags], bag_size[:bags])
    if mode == 2:
        assert torch.equal(got[3], max_indices)
    no_fallbacks()


def test_embedding_bag_bad_offsets_raise():
    weight, idx, _, _ = bag_inputs(7)
    out = F.embedding_bag(idx.to(DEV), weight.to(DEV), torch.tensor([1, 5]).to(DEV))
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        out.cpu()
    out = F.embedding_bag(torch.tensor([0, 12]).to(DEV), weight.to(DEV), torch.tensor([0]).to(DEV))
    with pytest.raises(RuntimeError, match="index out of range") as raised:  # RuntimeError, as on the CPU
        out.cpu()
    assert raised.type is RuntimeError


# -------------------------------------------------------------- CTC loss

def ctc_inputs(seed, T=8, N=4, C=6, S=5):
    g = gen(seed)
    logits = torch.randn(T, N, C, generator=g)
    targets = torch.randint(1, C, (N, S), generator=g)
    targets[0, 1] = targets[0, 2]  # a repeated label (no skip transition)
    input_lengths = [T, T - 1, T - 3, 2]
    target_lengths = [S, 3, 0, 3]  # an empty target; the last one cannot fit in 2 frames (inf loss)
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("reduction, zero_infinity, targets_layout", [
    ("none", True, "padded"), ("mean", False, "concatenated"), ("sum", True, "concatenated")])
def test_ctc_loss(reduction, zero_infinity, targets_layout):
    logits, targets, il, tl = ctc_inputs(11)
    if not zero_infinity:  # an infinite loss gives NaN gradients on the CPU too
        il, tl = il[:3], tl[:3]
        logits, targets = logits[:, :3], targets[:3]
    if targets_layout == "concatenated":
        targets = torch.cat([targets[i, :n] for i, n in enumerate(tl)])

    def fn(x):
        lp = x.log_softmax(2)
        return F.ctc_loss(lp, targets.to(x.device), il, tl, reduction=reduction, zero_infinity=zero_infinity)

    check_grads(fn, [logits])


@pytest.mark.parametrize("blank", [5])
def test_ctc_loss_blank_and_tensor_lengths(blank):
    logits, targets, il, tl = ctc_inputs(12)
    targets = torch.where(targets == blank, (blank + 1) % 6, targets)
    il_t, tl_t = torch.tensor(il), torch.tensor(tl, dtype=torch.int32)

    def fn(x):
        lengths = (il_t.to(x.device), tl_t.to(x.device))
        return F.ctc_loss(x.log_softmax(2), targets.to(x.device), *lengths, blank=blank, reduction="sum",
                          zero_infinity=True)

    check_grads(fn, [logits])


def test_ctc_loss_unbatched_and_infinite():
    logits, targets, il, tl = ctc_inputs(13)
    check_grads(lambda x: F.ctc_loss(x.log_softmax(1), targets[0, :4].to(x.device), torch.tensor(8), torch.tensor(4)),
                [logits[:, 0]])
    torch_pjrt.metrics.reset()
    lp = logits.log_softmax(2)
    want = F.ctc_loss(lp, targets, il, tl, reduction="none")
    got = F.ctc_loss(lp.to(DEV), targets.to(DEV), il, tl, reduction="none").cpu()
    assert torch.isinf(want[3]) and torch.isinf(got[3])
    torch.testing.assert_close(got, want)
    no_fallbacks()


def test_ctc_loss_of_nan_log_probs_is_nan_as_on_the_cpu():
    """XLA's max reduction on the CPU drops NaN: a NaN log-probability
    gave an infinite loss (or a finite one, or 0 with zero_infinity) where
    the CPU's is NaN."""
    torch.manual_seed(0)
    lp = torch.randn(4, 2, 3).log_softmax(-1)
    targets, il, tl = torch.tensor([[1, 2], [2, 1]]), torch.tensor([4, 4]), torch.tensor([2, 2])
    for pos in ((0, 0, 0), (1, 0, 2), (3, 0, 0), (0, 1, 2)):
        x = lp.clone()
        x[pos] = float("nan")
        for zero_infinity in (False, True):
            want = F.ctc_loss(x, targets, il, tl, reduction="none", zero_infinity=zero_infinity)
            got = F.ctc_loss(x.to(DEV), targets.to(DEV), il, tl, reduction="none", zero_infinity=zero_infinity)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)


def test_ctc_gradient_is_nan_where_the_cpus_is():
    """The CPU's gradient is exp(lp) - exp(lcab + nll - lp): NaN at a -inf
    log-probability and for a sample that cannot be aligned (infinite
    loss); pjrt gave 0 or finite values at some of those places."""
    torch.manual_seed(0)
    lp = torch.randn(6, 3, 4).log_softmax(-1)
    lp[2, 0, 1] = -float("inf")
    lp[0, 1, :] = torch.tensor([0.0, -float("inf"), -float("inf"), -float("inf")])
    targets = torch.tensor([[1, 2, 1], [3, 3, 3], [1, 1, 1]])  # the last cannot fit in 2 frames
    il, tl = torch.tensor([6, 6, 2]), torch.tensor([2, 2, 3])
    for zero_infinity in (False, True):
        grads = []
        for d in ("cpu", DEV):
            x = lp.clone().to(d).requires_grad_()
            F.ctc_loss(x, targets.to(d), il.to(d), tl.to(d), reduction="sum", zero_infinity=zero_infinity).backward()
            grads.append(x.grad.cpu())
        assert grads[0].isnan().any()
        torch.testing.assert_close(grads[1], grads[0], equal_nan=True, rtol=1e-5, atol=1e-6)
    # a class whose states lie far below the frame's best still gets its share
    # (shifting by the frame's largest state underflowed it to 0)
    for dtype, gap in ((torch.float32, 120.0), (torch.float64, 800.0)):
        lp = torch.tensor([[[0.0, -gap]], [[0.0, -gap]]], dtype=dtype)
        grads = []
        for d in ("cpu", DEV):
            x = lp.clone().to(d).requires_grad_()
            F.ctc_loss(x, torch.tensor([[1]], device=d), torch.tensor([2]), torch.tensor([1])).backward()
            grads.append(x.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0])


def test_empty_inputs_of_ctc_and_embedding_bag_behave_as_on_the_cpu():
    """Both failed inside StableHLO (a gather slice larger than its operand)."""
    L = torch.long
    for lp, tgt, il, tl in ((torch.randn(5, 0, 4), torch.zeros(0, 2, dtype=L), torch.zeros(0, dtype=L), torch.zeros(0, dtype=L)),
                            (torch.randn(0, 2, 4), torch.ones(2, 1, dtype=L), torch.zeros(2, dtype=L), torch.ones(2, dtype=L))):
        with pytest.raises(RuntimeError, match="log_probs tensor must not be empty"):
            F.ctc_loss(lp, tgt, il, tl)
        with pytest.raises(RuntimeError, match="log_probs tensor must not be empty"):
            F.ctc_loss(lp.to(DEV), tgt.to(DEV), il.to(DEV), tl.to(DEV))
    args = (torch.zeros(0, dtype=L), torch.randn(0, 3), torch.tensor([0, 0]))
    want = F.embedding_bag(*args)
    assert torch.equal(F.embedding_bag(*(a.to(DEV) for a in args)).cpu(), want)


# ------------------------------------------------------ CTC speech head

class SpeechHead(torch.nn.Module):
    """Log-mel-like features [N, F, T] -> conv -> GELU -> linear -> log_softmax."""

    def __init__(self, feats=16, hidden=24, classes=8):
        super().__init__()
        self.conv = torch.nn.Conv1d(feats, hidden, 3, padding=1)
        self.proj = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        h = F.gelu(self.conv(x)).transpose(1, 2)  # [N, T, H]
        return self.proj(h).log_softmax(2).transpose(0, 1)  # [T, N, C]


def test_ctc_speech_head_trains():
    g = gen(21)
    model = SpeechHead()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    # few frames: the XLA CPU plugin compiles each unrolled step's kernels
    # separately (docs/semantics.md), which dominates this test's time
    feats = torch.randn(3, 16, 6, generator=g)
    targets = torch.randint(1, 8, (3, 3), generator=g)
    il, tl = [6, 5, 4], [3, 2, 3]  # lists: no host read of lengths per step

    def train(device):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x, y = feats.to(device), targets.to(device)
        losses, first_grads = [], None
        for step in range(5):
            loss = F.ctc_loss(m(x), y, il, tl)
            loss.backward()
            if step == 0:
                first_grads = [p.grad.detach().cpu() for p in m.parameters()]
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        return torch.stack(losses).cpu(), first_grads, [p.detach().cpu() for p in m.parameters()]

    want, want_grads, want_params = train("cpu")
    torch_pjrt.metrics.reset()
    got, got_grads, got_params = train(DEV)
    no_fallbacks()
    assert want[-1] < want[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, h in zip(got_grads, want_grads):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=2e-6)
    # AdamW turns a gradient entry near 0 (some are 1e-7 here) into a step of
    # about lr whose sign follows rounding, on both devices alike: parameters
    # agree to a fraction of lr (1e-2), not to float32 rounding.
    for p, q in zip(got_params, want_params):
        torch.testing.assert_close(p, q, rtol=0, atol=2e-3)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_per_sample_gradients_compile(mode):
    """torch.func's per-sample gradients through a bag, compiled: vmap's
    fallback views the kernel's outputs by the traced (meta) shapes, which
    the CPU's shapes broke ("shape '[6, 4]' is invalid for input of size 0")."""
    from torch.func import grad, vmap

    idx = torch.tensor([[0, 1], [2, 3]])
    def f(x):
        return vmap(grad(lambda a: F.embedding_bag(idx.to(a.device), a, mode=mode).pow(2).sum()))(x)
    x = torch.randn(6, 5, 5, generator=gen(8))
    torch.testing.assert_close(torch.compile(f, backend="pjrt")(x.to(DEV)).cpu(), f(x))
