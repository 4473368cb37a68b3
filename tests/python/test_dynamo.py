"""torch.compile(backend="pjrt"): training parity, CPU inputs, partitioning
around unlowered ops, and our cache under Dynamo's recompiles."""

import copy
import functools

import pytest
import torch

import torch_pjrt
from torch_pjrt import dynamo as pjrt_dynamo
from training import make_case, train

DEV = torch_pjrt.device()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered_by_name():
    assert "pjrt" in torch._dynamo.list_backends(exclude_tags=())
    from importlib.metadata import entry_points

    names = [e.name for e in entry_points(group="torch_dynamo_backends")]
    assert "pjrt" in names


@pytest.mark.parametrize("dynamo_first", [False, True])
def test_threads_compiling_first_at_once_all_get_the_backend(dynamo_first):
    # Dynamo registers an entry point's backend after a check of its own:
    # threads asking for "pjrt" at once raised "duplicate name: pjrt". It is
    # registered when torch._dynamo is imported (before or after torch_pjrt).
    from conftest import run_python
    code = f"""
import threading, torch
{"import torch._dynamo" if dynamo_first else ""}
import torch_pjrt
from torch._dynamo.backends import registry
assert "pjrt" in registry._COMPILER_FNS  # since torch._dynamo was imported, before any thread asks
bar, errors, outs = threading.Barrier(4), [], []
def work(i):
    bar.wait()
    try:
        outs.append(torch.compile(lambda x: x + i, backend="pjrt")(torch.ones(2, device="pjrt")).cpu().sum().item())
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors, sorted(outs))
"""
    for _ in range(3):
        r = run_python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[-2] == "[] [2.0, 4.0, 6.0, 8.0]", r.stdout


def test_the_entry_point_alone_gives_the_backend():
    # torch_pjrt not imported (no autoload): Dynamo loads the entry point,
    # whose import of torch_pjrt must not register the name a second time
    from conftest import run_python
    code = """
import sys, torch
assert "torch_pjrt" not in sys.modules
print(torch.compile(lambda x: x * 2, backend="pjrt")(torch.ones(2)).tolist())
"""
    r = run_python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[2.0, 2.0]", r.stdout


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_training_matches_eager_cpu(name):
    steps = 12
    model, batches, make_opt, loss_fn, clip = make_case(name)
    cpu = train(model, batches, make_opt, loss_fn, clip, steps, "cpu")
    torch_pjrt.metrics.reset()
    m = copy.deepcopy(model).to(DEV)
    cm = torch.compile(m, backend="pjrt")
    opt = make_opt(m.parameters())
    data = [(x.to(DEV), y.to(DEV)) for x, y in batches]
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        loss = loss_fn(cm(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        losses.append(loss.detach())
    for step, (a, b) in enumerate(zip(cpu, [float(l.cpu()) for l in losses])):
        assert b == pytest.approx(a, rel=1e-4), f"step {step}: {a} vs {b}"
    c = torch_pjrt.metrics.counters()
    assert c["dynamo_graphs"] == 2  # forward and backward
    assert c["dynamo_fallback_nodes"] == 0 and torch_pjrt.metrics.fallbacks() == {}
    assert all(p.device == DEV for p in m.parameters())


def test_mask_assignment_and_weighted_smoothed_loss_trace_with_dynamic_shapes():
    """pjrt's autograd-key kernels (x[mask] = v, cross_entropy) read sizes:
    with a second size Dynamo traces fake tensors of symbolic sizes, which
    raised 'Cannot call numel() on tensor with symbolic sizes' (Faster
    R-CNN's box matcher, `matches[below] = -1`)."""
    import torch.nn.functional as F
    torch._dynamo.reset()

    def assign(x):
        y = x.clone()
        y[y < 0.5] = -1.0
        return y

    loss = lambda x, y, w: F.cross_entropy(x, y, weight=w, label_smoothing=0.1)
    c_assign, c_loss = torch.compile(assign, backend="pjrt"), torch.compile(loss, backend="pjrt")
    w = torch.rand(5)
    for n in (8, 12, 16):
        x = torch.rand(n)
        assert torch.equal(c_assign(x.to(DEV)).cpu(), assign(x))
        logits, y = torch.randn(n, 5), torch.randint(0, 5, (n,))
        y[0] = -100
        assert c_loss(logits.to(DEV), y.to(DEV), w.to(DEV)).item() == pytest.approx(loss(logits, y, w).item(), rel=1e-6)


def test_cpu_inputs_are_moved_and_results_come_back():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(5, 4)
    want = model(x)
    got = torch.compile(model, backend="pjrt")(x)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want)


def test_cpu_model_state_written_by_the_graph_reaches_the_cpu_tensors():
    """On the CPU-model path the graph runs on device copies: what it writes
    into its inputs (in-place ops, BatchNorm's running statistics, a compiled
    optimizer's parameters) is written back (before, every call after the
    first lost it), and outputs that are views of one tensor stay views."""
    def f(x, y):
        x.add_(1)
        y.copy_(x * 2)
        return x.sum()

    cf = torch.compile(f, backend="pjrt")
    for i in range(4):
        x, y = torch.full((3,), float(i)), torch.zeros(3)
        assert cf(x, y).item() == 3 * (i + 1)
        assert torch.equal(x, torch.full((3,), i + 1.0)) and torch.equal(y, 2 * x)

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    dev = copy.deepcopy(cpu)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (cpu, dev)]
    step = torch.compile(opts[1].step, backend="pjrt")
    cm = torch.compile(dev, backend="pjrt")
    for _ in range(4):
        x = torch.randn(6, 3)
        for m, opt, st in ((cpu, opts[0], opts[0].step), (cm, opts[1], step)):
            opt.zero_grad()
            m(x).square().mean().backward()
            st()
    for a, b in zip(list(cpu.parameters()) + list(cpu.buffers()), list(dev.parameters()) + list(dev.buffers())):
        torch.testing.assert_close(b, a)

    g = torch.compile(lambda x: (lambda y: (y, y[0], y.t()))(x * 2), backend="pjrt")
    for _ in range(3):
        y, row, t = g(torch.arange(4.0).reshape(2, 2))
        y.add_(1)
        assert row.tolist() == [1.0, 3.0] and t[1, 0].item() == 3.0


def test_cpu_model_outputs_keep_eagers_aliasing_and_inplace_checks():
    """A CPU model's outputs came back as separate copies: a tensor saved for
    the backward (exp's result, an input, a weight's t()) no longer shared
    the version counter of the caller's tensor, so modifying it in place
    before the backward gave a silently wrong gradient where eager raises;
    and y.view(torch.int32) stopped aliasing y."""
    def saved_output(cf):
        a = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
        o = cf(lambda x: x.exp())(a)
        o.mul_(2)
        o.sum().backward()

    def saved_input(cf):
        x, w = torch.ones(3), torch.ones(3, requires_grad=True)
        loss = cf(lambda x, w: (x * w).sum())(x, w)
        x.add_(1)
        loss.backward()

    def saved_column_slice(cf):  # not dense in its storage: moved as the span it covers
        x, w = torch.ones(3, 4)[:, 1:], torch.ones(3, requires_grad=True)
        loss = cf(lambda x, w: (x * w).sum())(x, w)
        x.add_(1)
        loss.backward()

    def stepped_weight(cf):
        m = torch.nn.Linear(3, 1, bias=False)
        cm, opt = cf(m), torch.optim.SGD(m.parameters(), lr=0.5)
        x = torch.ones(2, 3, requires_grad=True)
        l1, l2 = cm(x).square().sum(), cm(x * 2).square().sum()
        l1.backward()
        opt.step()
        l2.backward()

    compiled = functools.partial(torch.compile, backend="pjrt")
    for case in (saved_output, saved_input, saved_column_slice, stepped_weight):
        for cf in ((lambda f: f), compiled):
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                case(cf)
    for _ in range(2):  # traced, then replayed: the same aliasing
        a = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
        o = compiled(lambda x: x.exp())(a)
        o.sum().backward()
        torch.testing.assert_close(a.grad, a.detach().exp())
        y2, view = compiled(lambda x: (lambda y: (y, y.view(torch.int32)))(x * 2))(torch.ones(3))
        y2.add_(1)
        assert torch.equal(view, torch.full((3,), 3.0).view(torch.int32))


@pytest.mark.parametrize("name", ["select write", "column write", "constant", "arange", "to pjrt"])
def test_cpu_model_graph_creating_tensors_runs_on_the_device(name):
    """What a CPU model's graph creates on the CPU (the arange of a
    decomposed c[1] = v, a torch.tensor([..]) constant, torch.arange(n))
    is created on the device with the moved inputs (before, the graph
    raised "expected all tensors to be on the pjrt device"); an output that
    eager PyTorch gives on pjrt (x.to("pjrt") in the function) stays there
    instead of coming back to the CPU."""
    fn = {
        "select write": lambda c: (c.__setitem__(1, 3.0), c[0] * 2 + c[1])[1],
        "column write": lambda c: (c.__setitem__((slice(None), 1), 5.0), c.sum(0))[1],
        "constant": lambda c: c + torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8]),
        "arange": lambda c: c * torch.arange(8),
        "to pjrt": lambda c: (c.to(DEV) * 2, torch.ones(3, device=DEV) + c.sum(), c + 1),
    }[name]
    c = torch.arange(16.0).reshape(2, 8)
    want = fn(c.clone())
    cf = torch.compile(fn, backend="pjrt")
    for _ in range(2):  # traced, then replayed
        cc = c.clone()
        got = cf(cc)
        for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
            assert g.device.type == w.device.type
            torch.testing.assert_close(g.cpu(), w.cpu())
        if name.endswith("write"):
            assert not torch.equal(cc, c)  # the write reached the caller's tensor


def test_cpu_model_attention_gradients_match_the_cpu():
    """On CPU (fake) tensors scaled_dot_product_attention picks the CPU's
    flash kernel, whose decomposition's second output is not the logsumexp
    its backward reads: a CPU model's attention gradients were off by up to
    200. Traced with the math kernel, they match."""
    import torch.nn.functional as F

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    torch.manual_seed(0)
    xs = [torch.randn(2, 4, 12, 8, requires_grad=True) for _ in range(3)]
    ys = [x.detach().clone().requires_grad_() for x in xs]
    f(*xs).backward()
    before = torch_pjrt.metrics.counters().get("cpu_fallbacks", 0)
    torch.compile(f, backend="pjrt")(*ys).backward()
    assert torch_pjrt.metrics.counters().get("cpu_fallbacks", 0) == before
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-5, atol=1e-5)


def test_unlowered_node_runs_on_cpu_inside_a_compiled_graph():
    def f(a):
        return torch.special.bessel_j0(a * 2) + 1  # no pjrt lowering for bessel_j0

    a = torch.rand(6)
    torch_pjrt.metrics.reset()
    got = torch.compile(f, backend="pjrt")(a.to(DEV))
    torch.testing.assert_close(got.cpu(), f(a))
    c = torch_pjrt.metrics.counters()
    assert c["dynamo_fallback_nodes"] >= 1
    assert any("bessel_j0" in op for op in torch_pjrt.metrics.fallbacks())


def test_explain_lists_cpu_nodes():
    gm = torch.fx.symbolic_trace(lambda a: torch.ops.aten.special_bessel_j0(a) + torch.ops.aten.relu(a))
    assert pjrt_dynamo.explain(gm) == ["aten.special_bessel_j0.default"]


def test_explain_does_not_list_constants_lifted_on_the_cpu():
    # A tensor literal in the model becomes a graph constant copied by
    # lift_fresh_copy on the CPU: it never falls back at run time.
    from torch._dynamo.backends.common import aot_autograd

    seen = []

    def record(gm, example_inputs):
        seen.append((pjrt_dynamo.explain(gm), [str(n.target) for n in gm.graph.nodes]))
        return pjrt_dynamo._compile_graph(gm, example_inputs)

    def f(a):
        return a * torch.tensor([1.0, 2.0, 3.0]).sum() + 1

    a = torch.rand(3)
    torch_pjrt.metrics.reset()
    got = torch.compile(f, backend=aot_autograd(fw_compiler=record))(a.to(DEV))
    torch.testing.assert_close(got.cpu(), f(a))
    assert any("lift_fresh_copy" in " ".join(targets) for _, targets in seen), seen
    assert all(fallback == [] for fallback, _ in seen), seen
    assert torch_pjrt.metrics.fallbacks() == {}


def test_identical_graph_traced_again_compiles_nothing():
    def f(a, b):
        return (a @ b).relu().sum()

    a, b = torch.randn(4, 4).to(DEV), torch.randn(4, 4).to(DEV)
    torch.compile(f, backend="pjrt")(a, b).cpu()
    torch._dynamo.reset()  # Dynamo forgets; our cache does not
    torch_pjrt.metrics.reset()
    out = torch.compile(f, backend="pjrt")(a, b)
    torch.testing.assert_close(out.cpu(), f(a.cpu(), b.cpu()))
    assert torch_pjrt.metrics.counters().get("compiles", 0) == 0


def test_graph_break_and_new_shapes():
    def f(x):
        y = x.sin()
        print("graph break")  # noqa: T201
        return y.cos() * 2

    cf = torch.compile(f, backend="pjrt")
    for n in (3, 3, 5):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x.to(DEV)).cpu(), f(x))


class _Config:
    problem_type = None


def test_dynamo_recompiles_are_in_the_metrics():
    # As BERT's classification head does: an attribute set on the first
    # call fails a guard on the second, and Dynamo traces the function again.
    config = _Config()

    def f(x):
        if config.problem_type is None:
            config.problem_type = "regression"
        return x * 2

    cf = torch.compile(f, backend="pjrt")
    x = torch.randn(3).to(DEV)
    cf(x)
    torch_pjrt.metrics.reset()
    assert torch_pjrt.metrics.dynamo_recompiles() == []
    torch.testing.assert_close(cf(x).cpu(), x.cpu() * 2)
    (r,) = torch_pjrt.metrics.dynamo_recompiles()
    assert r["function"].startswith("f (") and "problem_type" in r["why"], r
    assert "Dynamo) recompilations" in torch_pjrt.metrics.report()
    cf(x)  # the new graph's guards hold
    assert len(torch_pjrt.metrics.dynamo_recompiles()) == 1
    torch_pjrt.metrics.reset()
    assert torch_pjrt.metrics.dynamo_recompiles() == []


def test_each_dynamo_recompile_is_listed_once():
    # Dynamo records one guard failure per cached graph of the function at
    # each recompile (1 + 2 + 3 for three): each recompile is one entry.
    def g(x):
        return x + 1

    cg = torch.compile(g, backend="pjrt", dynamic=False)
    cg(torch.randn(1).to(DEV))
    torch_pjrt.metrics.reset()
    for n in (2, 3, 4):
        cg(torch.randn(n).to(DEV))
    r = torch_pjrt.metrics.dynamo_recompiles()
    assert len(r) == 3 and all(e["function"].startswith("g (") for e in r), r
    torch._dynamo.reset()  # clears Dynamo's record: later recompiles still count
    torch_pjrt.metrics.reset()
    cg = torch.compile(g, backend="pjrt", dynamic=False)
    for n in (1, 2):
        cg(torch.randn(n).to(DEV))
    assert len(torch_pjrt.metrics.dynamo_recompiles()) == 1
    # as many recompiles after a reset as before it, and more: each listed
    torch._dynamo.reset()
    torch_pjrt.metrics.reset()
    cg = torch.compile(g, backend="pjrt", dynamic=False)
    for n in (1, 2, 3, 4, 5):
        cg(torch.randn(n).to(DEV))
    r = torch_pjrt.metrics.dynamo_recompiles()
    assert [e["why"].split(": ", 1)[0] for e in r] == ["0/0", "0/1", "0/2", "0/3"], r


def test_view_of_a_layout_the_device_does_not_keep():
    # On the CPU (and in AOTAutograd's fake tensors) a dtype conversion keeps
    # a permuted layout, so the traced graph views the permuted-back result;
    # pjrt results are contiguous, and the graph reshapes instead.
    def f(x):
        y = x.transpose(1, 2).to(torch.bfloat16)
        return y.transpose(1, 2).reshape(2, 12, 32).float() * 2

    x = torch.randn(2, 12, 4, 8)
    got = torch.compile(f, backend="pjrt")(x.to(DEV))
    torch.testing.assert_close(got.cpu(), f(x))


def test_outputs_that_view_graph_intermediates_leave_as_plain_tensors():
    x = torch.randn(4, 6, device=DEV)
    inner = x * 2  # made inside the graph
    same = inner.t()
    other = x + 1  # made inside the graph and returned too
    outs = pjrt_dynamo._unforeseen_views_made_plain([x], [inner.view(24), same, same, x.t(), other, other.t()])
    assert not outs[0]._is_view() and outs[0].untyped_storage().data_ptr() == inner.untyped_storage().data_ptr()
    assert outs[1] is outs[2] and not outs[1]._is_view()  # one tensor listed twice stays one tensor
    assert outs[3]._is_view() and outs[3]._base is x  # views of inputs stay views
    assert outs[4] is other and outs[5]._base is other  # and views of other outputs
    torch.testing.assert_close(outs[1].cpu(), same.cpu())


def test_longformer_writes_into_an_earlier_graphs_output():
    # Longformer's global attention writes into attn_output, which an earlier
    # graph (before a graph break) returned as a reshape of its own clone:
    # under the fake strides AOTAutograd planned a fresh tensor, on the
    # device it was a view made inside AOTAutograd's autograd Function, which
    # autograd forbids to modify in place ("Output 0 of AsStrided is a view").
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, attention_window=[8], max_position_embeddings=80,
                                        num_labels=2)
    cpu = transformers.LongformerForSequenceClassification(cfg).eval()
    dev = copy.deepcopy(cpu).to(DEV)
    ids = torch.randint(3, 100, (1, 16))
    want = cpu(input_ids=ids).logits
    want.sum().backward()
    got = torch.compile(dev, backend="pjrt")(input_ids=ids.to(DEV)).logits
    got.sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_compiled_cross_entropy_matches_the_cpu_and_its_index_error():
    # nll_loss stays one op in the graph: as core ATen's gather it raised
    # gather's RuntimeError for a target out of range, where the CPU raises IndexError
    torch.manual_seed(0)
    w = torch.rand(5)

    def f(x, t, t2):
        a = torch.nn.functional.cross_entropy(x, t, weight=w.to(x.device), ignore_index=2, label_smoothing=0.1)
        return a + torch.nn.functional.cross_entropy(x.reshape(2, 2, 5).permute(0, 2, 1)[..., None], t2[..., None])

    x, t, t2 = torch.randn(4, 5), torch.tensor([0, 2, 4, 1]), torch.tensor([[3, 0], [1, 4]])
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    want = f(xc, t, t2)
    got = torch.compile(f, backend="pjrt")(xd, t.to(DEV), t2.to(DEV))
    want.backward()
    got.backward()
    torch.testing.assert_close(got.cpu(), want.detach())
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    g = torch.compile(lambda x, t: torch.nn.functional.cross_entropy(x, t, weight=w.to(x.device)), backend="pjrt")
    with pytest.raises(IndexError, match="out of bounds"):
        g(x.to(DEV), torch.tensor([0, 7, 1, 1]).to(DEV)).cpu()


def test_compiled_multilabel_margin_loss_ignores_labels_after_the_first_minus_one():
    # torch's decomposition of it (applied while tracing) counts the labels
    # after a row's -1 too: the backend traces the op itself, as lazy mode runs it
    op = torch.ops.aten.multilabel_margin_loss_forward.default
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([[1, 2, -1, 0, 0, 0], [3, -1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5], [-1, 0, 0, 0, 0, 0]])
    for reduction in ("mean", "none"):
        def f(x, t):
            return torch.nn.functional.multilabel_margin_loss(x * 2, t, reduction=reduction)

        xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
        want, got = f(xc, t), torch.compile(f, backend="pjrt")(xd, t.to(DEV))
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(got.cpu(), want.detach())
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    assert torch._C.DispatchKey.Autograd in op.py_kernels  # torch's kernel is back after tracing


def test_the_decomposition_table_traces_as_torchs_core_aten_table():
    # The backend leaves out core_aten_decompositions()'s entries for the
    # CompositeImplicitAutograd ops (0.15 s per process to collect), because
    # tracing decomposes those ops by itself: the graphs stay the same, but
    # for the few such ops with a pjrt kernel, which the graph then keeps.
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_function, make_boxed_func

    aten = torch.ops.aten
    own = {aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.nll_loss2d_forward.default,
           aten.nll_loss2d_backward.default,  # the backend's own kernels, for the CPU's IndexError
           aten.nan_to_num.default}  # (its decomposition fails on complex inputs)
    public = {op: fn for op, fn in core_aten_decompositions().items() if op not in own}

    def graphs(fn, args, table):
        codes = []

        def capture(gm, _):
            codes.append(gm.code)
            return make_boxed_func(gm)

        out = aot_function(fn, fw_compiler=capture, bw_compiler=capture, decompositions=table)(*args)
        out.backward()
        return codes, [a.grad.cpu() for a in args if a.requires_grad]

    x = torch.randn(2, 3, 4, 4, device=DEV, requires_grad=True)
    w = torch.randn(5, 4, device=DEV, requires_grad=True)

    def f(x, w):  # linear, gelu, where with a number, type_as, nearest upsampling, &: decomposed by tracing
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w))
        h = torch.where(h > 0, 1.5, h).type_as(x)
        u = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        return h.sum() + u.mean() + ((x > 0) & (x < 1)).sum()

    ours, theirs = graphs(f, (x, w), pjrt_dynamo._decompositions()), graphs(f, (x, w), public)
    assert len(ours[0]) == 2 and ours[0] == theirs[0]
    # embedding_backward: pjrt's own kernel (one scatter, as in lazy mode) in place of the table's decomposition
    idx = torch.tensor([[0, 2], [1, 1]], device=DEV)
    wc = w.detach().cpu().requires_grad_()
    torch.nn.functional.embedding(idx.cpu(), wc).pow(2).sum().backward()
    for table in (pjrt_dynamo._decompositions(), public):
        w.grad = None
        (fw, bw), (grad,) = graphs(lambda w, i: torch.nn.functional.embedding(i, w).pow(2).sum(), (w, idx), table)
        assert ("embedding_backward" in bw) == (table is not public)
        torch.testing.assert_close(grad, wc.grad)


def test_nan_to_num_of_complex_compiles():
    # the table's decomposition failed on complex inputs (isneginf): the
    # backend traces pjrt's kernel, whose complex case runs on the CPU
    z = torch.tensor([complex(float("nan"), float("inf")), complex(-float("inf"), 2.0)])
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5])
    f = torch.compile(lambda t: torch.nan_to_num(t, posinf=7.0) * 2, backend="pjrt")
    torch.testing.assert_close(f(z.to(DEV)).cpu(), torch.nan_to_num(z, posinf=7.0) * 2)
    torch.testing.assert_close(f(x.to(DEV)).cpu(), torch.nan_to_num(x, posinf=7.0) * 2)


def test_device_count_and_availability_fold_to_constants_in_a_compiled_function():
    """torch.pjrt.is_available()/device_count() inside a compiled function
    are folded at trace time (they broke the graph; fullgraph=True failed).
    The current device is not folded: set_device changes it, and a folded
    value would have no guard."""
    def f(a):
        n = torch.pjrt.device_count() if torch.pjrt.is_available() else 0
        return a.sin() + (n > 0)

    x = torch.randn(4, 5)
    got = torch.compile(f, backend="pjrt", fullgraph=True)(x.to(DEV))
    torch.testing.assert_close(got.cpu(), x.sin() + 1)
    if torch_pjrt.device_count() > 1:
        g = torch.compile(lambda a: a.to(torch_pjrt.device()) + torch.pjrt.current_device(), backend="pjrt")
        y = torch.zeros(2)
        assert g(y).device == torch.device("pjrt", torch.pjrt.current_device())
        previous = torch.pjrt.current_device()
        torch.pjrt.set_device(1)
        try:
            out = g(y)
            assert out.device == torch.device("pjrt", 1) and out.cpu().eq(1).all()
        finally:
            torch.pjrt.set_device(previous)


def test_a_check_in_a_compiled_graph_names_the_users_line():
    """An out-of-range index found by a compiled graph's program named FX's
    generated code ("<eval_with_key>.1 ... in wrapped:6"); it names the line
    the node was traced from, as lazy mode does."""
    import inspect

    def f(a, i):
        b = a * 3
        return b[i] * 2  # the line the error names
    line = inspect.getsourcelines(f)[1] + 2
    g = torch.compile(f, backend="pjrt")
    with pytest.raises(IndexError, match=rf"traced at {__file__}:{line}\)"):
        g(torch.randn(5, device=DEV), torch.tensor([1, 9], device=DEV)).cpu()
    # later calls replay the recorded program without tracing: they name it too
    replays = torch_pjrt.metrics.counters().get("replays", 0)
    for bad in (7, -6):
        with pytest.raises(IndexError, match=rf"traced at {__file__}:{line}\)"):
            g(torch.randn(5, device=DEV), torch.tensor([1, bad], device=DEV)).cpu()
    assert torch_pjrt.metrics.counters().get("replays", 0) > replays


def test_sync_and_the_current_device_end_a_compiled_graph_with_our_reason():
    """torch_pjrt.sync(), torch_pjrt.device() and torch.pjrt.current_device()
    inside a compiled function are graph breaks that say why (they named a
    pybind11 internal and warned about each _C call); the results are
    eager's."""
    import warnings

    import torch._dynamo

    def f(a):
        b = a.sin()
        torch_pjrt.sync()
        return b + a.new_ones(()) * torch.pjrt.current_device() + 1

    def g(a):
        return a.to(torch_pjrt.device()).cos()

    x = torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reasons = " ".join(r.reason for r in torch._dynamo.explain(f)(x.to(DEV)).break_reasons)
        assert "torch_pjrt.sync() launches the pending work" in reasons, reasons
        assert "pybind11" not in reasons
        torch.testing.assert_close(torch.compile(f, backend="pjrt")(x.to(DEV)).cpu(),
                                   x.sin() + torch.pjrt.current_device() + 1)
        torch.testing.assert_close(torch.compile(g, backend="pjrt")(x).cpu(), x.cos())

    def h(a):  # a new function: Dynamo's cache of f would answer without tracing
        torch_pjrt.sync()
        return a + 1
    with pytest.raises(Exception, match="torch_pjrt.sync.. launches the pending work"):
        torch.compile(h, backend="pjrt", fullgraph=True)(x.to(DEV))


@pytest.mark.parametrize("where", ["pjrt", "cpu"])
def test_sparse_embeddings_compile_with_dense_gradients(where):
    """nn.Embedding(sparse=True) under torch.compile(backend="pjrt") gets
    the lazy device's dense gradient (AOTAutograd's sparse backward made
    COO tensors: a device model with max_norm and every CPU model failed to
    compile); values as a dense embedding's on the CPU, max_norm's renorm
    included."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 4, max_norm=1.0)
    emb = torch.nn.Embedding(10, 4, sparse=True, max_norm=1.0).to(where)
    with torch.no_grad():
        emb.weight.copy_(ref.weight)
    idx = torch.tensor([1, 2, 2, 7])
    ref(idx).square().sum().backward()
    torch.compile(emb, backend="pjrt")(idx.to(where)).square().sum().backward()
    assert emb.weight.grad.layout == torch.strided
    torch.testing.assert_close(emb.weight.grad.cpu(), ref.weight.grad)
    torch.testing.assert_close(emb.weight.detach().cpu(), ref.weight.detach())


def test_multilabel_margin_loss_compiles_at_a_second_size():
    """The backward of multilabel_margin_loss (its forward is traced
    natively) has a meta kernel: at a second input size Dynamo's automatic
    dynamic shapes compiled it with fake tensors of symbolic sizes, which
    failed (fullgraph=True: "Backend compiler exception"; else a graph
    break)."""
    import torch._dynamo

    torch._dynamo.reset()
    f = torch.compile(torch.nn.MultiLabelMarginLoss(), backend="pjrt", fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for n in (5, 6, 7):
        x = torch.randn(n, 10, generator=g, requires_grad=True)
        target = torch.randint(-1, 10, (n, 10), generator=g)
        want = torch.nn.MultiLabelMarginLoss()(x, target)
        want.backward()
        xd = x.detach().to(DEV).requires_grad_()
        got = f(xd, target.to(DEV))
        got.backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach())
        torch.testing.assert_close(xd.grad.cpu(), x.grad)


@pytest.mark.parametrize("sampler", ["dirichlet", "beta", "binomial"])
def test_compiled_samplers_follow_manual_seed_from_the_first_call(sampler):
    # _sample_dirichlet and binomial had no Meta kernel: tracing ran them on
    # zeros of the device, a real draw that moved the random stream
    import torch.distributions as D
    torch._dynamo.reset()
    conc = torch.tensor([0.5, 2.0, 3.0], device=DEV)
    f = {"dirichlet": lambda: D.Dirichlet(conc).sample((4,)),
         "beta": lambda: D.Beta(conc, conc + 1).sample((4,)),
         "binomial": lambda: D.Binomial(10, probs=conc / 4).sample((4,))}[sampler]
    torch.manual_seed(7)
    eager, after_eager = f().cpu(), torch.randn(3, device=DEV).cpu()
    compiled = torch.compile(f, backend="pjrt")
    torch.manual_seed(7)
    first, after_first = compiled().cpu(), torch.randn(3, device=DEV).cpu()
    assert torch.equal(first, eager) and torch.equal(after_first, after_eager)


def test_compiled_dirichlet_rsample_gradient_matches_lazy():
    import torch.distributions as D
    torch._dynamo.reset()

    def loss(conc):
        return (D.Dirichlet(conc).rsample((64,))[:, 0] ** 2).mean()

    grads = []
    for fn in (loss, torch.compile(loss, backend="pjrt")):
        conc = torch.tensor([0.5, 2.0, 3.0], device=DEV, requires_grad=True)
        torch.manual_seed(3)
        fn(conc).backward()
        grads.append(conc.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_a_model_split_over_two_devices_trains_compiled_as_on_the_cpu():
    # pipeline style: a graph whose inputs are on two devices is traced on
    # each call (its program is one per device), not refused
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)
    pa, pb = copy.deepcopy(a).to("pjrt:0"), copy.deepcopy(b).to("pjrt:1")

    def step(first, second, x, y, device0, device1, opt):
        out = second(torch.relu(first(x.to(device0))).to(device1))
        loss = torch.nn.functional.mse_loss(out, y.to(device1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    popt = torch.optim.SGD([*pa.parameters(), *pb.parameters()], lr=0.1)
    compiled = torch.compile(step, backend="pjrt")
    for i in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        want = step(a, b, x, y, "cpu", "cpu", opt)
        got = compiled(pa, pb, x, y, "pjrt:0", "pjrt:1", popt)
        assert got.device == torch.device("pjrt:1")
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pb.weight.cpu(), b.weight, rtol=1e-5, atol=1e-6)
    assert pa.weight.device == torch.device("pjrt:0")
