"""torch.compile(backend="pjrt") replays the recorded program of each graph:
results equal the traced path (dropout's random stream, BatchNorm's in-place
statistics, checks compiled into the program), calls that do not match the
recording are traced again, and the program count per steady training step
stays what it is (counters of the runtime: programs, compiles, transfers)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import dynamo as pjrt_dynamo

DEV = torch_pjrt.device()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    pjrt_dynamo.replay = True
    pjrt_dynamo.join = True
    yield
    pjrt_dynamo.replay = True
    pjrt_dynamo.join = True
    torch._dynamo.reset()


class Net(nn.Module):
    """Linear, BatchNorm (running statistics: input mutations), dropout (random)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.dropout(torch.relu(self.bn(self.fc1(x))), 0.25, self.training))


def _data(n=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def _compiled_net(replay=True, join=True):
    """A seeded Net, its SGD optimizer (momentum) and the compiled model."""
    torch._dynamo.reset()
    pjrt_dynamo.replay = replay
    pjrt_dynamo.join = join
    torch.manual_seed(0)
    model = Net().to(DEV)
    torch_pjrt.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, torch.compile(model, backend="pjrt")


def _train(replay, steps=6, compile_step=False, join=True):
    """Losses, final weights and BN statistics of a compiled training loop."""
    model, opt, cm = _compiled_net(replay, join)
    opt_step = torch.compile(opt.step, backend="pjrt") if compile_step else opt.step
    data = [(x.to(DEV), y.to(DEV)) for x, y in _data()]
    losses = []
    for s in range(steps):
        x, y = data[s % len(data)]
        loss = F.cross_entropy(cm(x), y)
        loss.backward()
        opt_step()
        opt.zero_grad()
        torch_pjrt.sync()
        losses.append(loss.detach())
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    return [float(l.cpu()) for l in losses], state


def test_replay_equals_tracing_every_call():
    torch_pjrt.metrics.reset()
    losses, state = _train(replay=True)
    c = torch_pjrt.metrics.counters()
    # The first call of the forward and of the backward records; the other five of
    # each replay (the loss's index check does not change the programs: its flag
    # is never a program argument).
    assert c.get("replays", 0) == 2 * 5
    ref_losses, ref_state = _train(replay=False)
    assert losses == ref_losses  # bitwise: the same programs on the same buffers, the same random stream
    for k in ref_state:
        assert torch.equal(state[k], ref_state[k]), k
    assert int(state["bn.num_batches_tracked"]) == 6


def test_compiled_optimizer_step_replays_too():
    losses, state = _train(replay=True, compile_step=True)
    ref_losses, ref_state = _train(replay=False)
    for a, b in zip(losses, ref_losses):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    for k in ref_state:
        assert torch.allclose(state[k], ref_state[k], rtol=1e-5, atol=1e-6), k


def test_batch_norm_compiled_settles_after_the_second_step():
    """Step 2 read the running statistics written by step 1's forward
    program and the weights written by its optimizer program: when check
    flags were program arguments it took two, step 3 one, and compiled again
    (4, 1, 1, 0). Each step's compiles."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, backend="pjrt")
    x, y = (t.to(DEV) for t in _data(1)[0])
    compiles = []
    for _ in range(4):
        before = torch_pjrt.metrics.counters().get("compiles", 0)
        F.cross_entropy(fwd(x), y).backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0) - before)
    assert compiles[2:] == [0, 0], compiles


def _steady_counts(compile_model, compile_step, steps=3, join=True):
    torch._dynamo.reset()
    pjrt_dynamo.join = join
    torch.manual_seed(0)
    model = Net().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fwd = torch.compile(model, backend="pjrt") if compile_model else model
    opt_step = torch.compile(opt.step, backend="pjrt") if compile_step else opt.step
    x, y = (t.to(DEV) for t in _data(1)[0])

    def step():
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt_step()
        opt.zero_grad()
        torch_pjrt.sync()
        return loss

    # First step (recordings), momentum buffers created, the first joined
    # program: steady (one more for margin).
    for _ in range(4):
        step()
    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    pjrt_dynamo.call_stats(reset=True)
    for _ in range(steps):
        loss = step()
    torch_pjrt.sync(wait=True)
    c = torch_pjrt.metrics.counters()
    per = lambda k: c.get(k, 0) / steps
    loss.cpu()
    return {k: per(k) for k in ("executions", "replays", "replays_joined", "compiles", "cache_hits", "traced_ops",
                                "bytes_to_device", "bytes_to_host", "ir_nodes_built", "relayouts")}


# Host transfers per steady step: nothing is uploaded; the only bytes read
# back are the check flags (one i32 per program with checks), read by the
# final sync(wait=True).


def test_steady_step_lazy_is_one_program():
    c = _steady_counts(compile_model=False, compile_step=False)
    assert c["executions"] == 1 and c["replays"] == 0 and c["compiles"] == 0
    assert c["bytes_to_device"] == 0 and c["bytes_to_host"] <= 4 * c["executions"]
    assert c["traced_ops"] > 30  # the whole step is traced (38 ops; an in-place op counts once)
    assert c["ir_nodes_built"] == 0  # ... over the last step's nodes
    assert c["relayouts"] == 0  # row-major in, row-major out: no layout work (aten/layout.h)


def test_steady_step_compiled_model_is_one_program():
    c = _steady_counts(compile_model=True, compile_step=False)
    # forward and backward replayed by joining the step's lazy trace (the
    # loss, its gradient, the optimizer): one program, as in lazy mode
    assert c["executions"] == 1 and c["replays"] == 2 and c["replays_joined"] == 2 and c["compiles"] == 0
    assert c["bytes_to_device"] == 0 and c["bytes_to_host"] <= 4 * c["executions"]
    lazy = _steady_counts(compile_model=False, compile_step=False)["traced_ops"]
    assert c["traced_ops"] < lazy  # the model's ops are no longer traced
    assert c["ir_nodes_built"] == 0  # the trace is taken over from the last step's, calls included
    assert pjrt_dynamo.call_stats()["refusals"] == {}


def test_steady_step_compiled_optimizer_is_one_program():
    c = _steady_counts(compile_model=True, compile_step=True)
    # forward, backward and optimizer replayed into the trace of the loss
    assert c["executions"] == 1 and c["replays"] == 3 and c["replays_joined"] == 3 and c["compiles"] == 0
    assert c["bytes_to_device"] == 0 and c["bytes_to_host"] <= 4 * c["executions"]
    assert c["traced_ops"] < 10  # the loss alone
    assert c["ir_nodes_built"] == 0


def test_steady_step_with_launched_replays_is_four_programs():
    # join=False: each replayed graph launches its own executable, pending
    # inputs first: forward; the loss and its gradient; backward; optimizer
    for compile_step, replays in ((False, 2), (True, 3)):
        c = _steady_counts(compile_model=True, compile_step=compile_step, join=False)
        assert c["executions"] == 4 and c["replays"] == replays and c["replays_joined"] == 0 and c["compiles"] == 0
        assert c["ir_nodes_built"] == 0


def test_joined_replay_equals_launched_replay():
    for compile_step in (False, True):
        losses, state = _train(replay=True, compile_step=compile_step)
        ref_losses, ref_state = _train(replay=True, compile_step=compile_step, join=False)
        for a, b in zip(losses, ref_losses):  # one program fused differently from four
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
        for k in ref_state:
            assert torch.allclose(state[k], ref_state[k], rtol=1e-5, atol=1e-6), k
        assert int(state["bn.num_batches_tracked"]) == 6


def _loop(sync_each_step, steps=8):
    """Weights after a compiled training loop, the counters of its last 4
    steps and the trace's size after each step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net().to(DEV)
    torch_pjrt.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cm = torch.compile(model, backend="pjrt")
    x, y = (t.to(DEV) for t in _data(1)[0])
    sizes = []
    for step in range(steps):
        if step == steps - 4:
            torch_pjrt.sync(wait=True)
            torch_pjrt.metrics.reset()
        F.cross_entropy(cm(x), y).backward()
        opt.step()
        opt.zero_grad()
        if sync_each_step:
            torch_pjrt.sync()
        sizes.append(torch_pjrt._C._trace_nodes(0))
    c = torch_pjrt.metrics.counters()
    return {k: v.cpu() for k, v in model.state_dict().items()}, c, sizes


def test_a_loop_that_never_syncs_launches_each_step_at_the_next_forward():
    state, c, sizes = _loop(sync_each_step=False)
    # The optimizer wrote the parameters since the forward graph joined: the
    # next step's forward launches the step before, so the trace holds one
    # step and no more.
    assert c["executions"] == 3 and c["replays_joined"] == 8
    assert sizes[-1] == sizes[-2] == sizes[-3] > 0
    ref_state, _, ref_sizes = _loop(sync_each_step=True)
    assert ref_sizes[-1] == 0
    for k in ref_state:  # the same programs' work, launched at other points
        assert torch.allclose(state[k], ref_state[k], rtol=1e-5, atol=1e-6), k


def _accumulate(micro, join=True, siamese=False, steps=6):
    """Weights after a compiled training loop of `micro` micro-batches per
    optimizer step (or a model applied to two inputs per step), and the
    counters of its last 3 steps."""
    model, opt, cm = _compiled_net(join=join)
    data = [(x.to(DEV), y.to(DEV)) for x, y in _data(max(micro, 2))]
    for step in range(steps):
        if step == steps - 3:
            torch_pjrt.sync(wait=True)
            torch_pjrt.metrics.reset()
        if siamese:
            (cm(data[0][0]) - cm(data[1][0])).square().mean().backward()
        for x, y in data[:micro]:
            (F.cross_entropy(cm(x), y) / micro).backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
    torch_pjrt.sync(wait=True)
    c = torch_pjrt.metrics.counters()
    return {k: v.cpu() for k, v in model.state_dict().items()}, c


@pytest.mark.parametrize("micro,siamese", [(3, False), (0, True)])
def test_a_graph_called_several_times_in_a_step_joins_each_time(micro, siamese):
    # Gradient accumulation's micro-batches, a model applied to two inputs:
    # no input of the graph was written since its last call, so each call
    # joins the trace and the step is one program (it was one per call).
    state, c = _accumulate(micro, siamese=siamese)
    calls = 2 * (micro + 2 * siamese)  # forward and backward per call
    assert c["executions"] == 3 and c["replays_joined"] == 3 * calls and c.get("compiles", 0) == 0
    ref_state, ref = _accumulate(micro, siamese=siamese, join=False)
    assert ref["executions"] > 3 * calls
    for k in ref_state:  # BatchNorm's statistics and dropout's stream included
        assert torch.allclose(state[k], ref_state[k], rtol=1e-5, atol=1e-6), k


def test_a_graph_joins_a_trace_at_most_kMaxJoins_times():
    f = torch.compile(lambda a: a * 1.5 + 1, backend="pjrt")
    x = torch.linspace(-1, 1, 7)
    y, ref = x.to(DEV), x
    for _ in range(3):  # recorded and replayed
        y, ref = f(y - 0.5), (ref - 0.5) * 1.5 + 1
    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    for _ in range(20):  # each call's input is pending: the calls join the trace
        y, ref = f(y - 0.5), (ref - 0.5) * 1.5 + 1
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-4)
    c = torch_pjrt.metrics.counters()
    # 16 calls joined; the 17th launched them (and the subtractions) first,
    # then found nothing pending and launched itself; the last 3 joined
    assert c["replays_joined"] == 19 and c["executions"] == 3


def test_inference_calls_read_at_once_are_launched():
    model = Net().to(DEV).eval()
    cm = torch.compile(model, backend="pjrt")
    x = _data(1)[0][0].to(DEV)
    with torch.no_grad():
        for _ in range(3):
            cm(x).cpu()
        torch_pjrt.metrics.reset()
        for _ in range(3):
            got = cm(x).cpu()
        c = torch_pjrt.metrics.counters()
        assert c["replays"] == 3 and c.get("replays_joined", 0) == 0 and c["executions"] == 3
        assert torch.allclose(got, model.cpu()(x.cpu()), rtol=1e-5, atol=1e-5)


def test_input_view_at_another_offset_is_traced_again():
    f = torch.compile(lambda a: a * 2 + 1, backend="pjrt", dynamic=False)
    base = torch.arange(12.0).to(DEV)
    for _ in range(3):
        assert torch.equal(f(base[:4]).cpu(), torch.arange(4.0) * 2 + 1)
    # Dynamo does not guard storage offsets: the replay must not read base[0:4]
    got = f(base[4:8]).cpu()
    assert torch.equal(got, torch.arange(4.0, 8.0) * 2 + 1)


def test_batches_sliced_from_device_data_replay_once_the_offset_moves():
    # data[i:i+b] of a dataset on the device: after the first offset change
    # the batch gets a storage of its own, and the step replays as one program
    torch.manual_seed(0)
    X, Y = torch.randn(64, 8), torch.randn(64, 1)
    ref, net = nn.Linear(8, 1), nn.Linear(8, 1)
    net.load_state_dict(ref.state_dict())
    net.to(DEV)
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(net.parameters(), lr=0.1)
    f = torch.compile(net, backend="pjrt")
    Xd, Yd = X.to(DEV), Y.to(DEV)
    pjrt_dynamo.call_stats(reset=True)
    for i in [0, 8, 16, 24, 32, 40]:
        F.mse_loss(ref(X[i:i + 8]), Y[i:i + 8]).backward()
        opt_ref.step()
        opt_ref.zero_grad()
        torch_pjrt.metrics.reset()
        loss = F.mse_loss(f(Xd[i:i + 8]), Yd[i:i + 8])
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        c = torch_pjrt.metrics.counters()
    assert c["executions"] == 1 and c["replays"] == 2 and c["compiles"] == 0
    for p_ref, p in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach(), rtol=1e-5, atol=1e-6)
    # the batches are copies; the dataset itself is unchanged
    assert torch.equal(Xd.cpu(), X)


def test_column_windows_of_device_data_replay_with_their_strides():
    f = torch.compile(lambda x, w: x * w + x.sum(0), backend="pjrt")
    data, w = torch.randn(10, 40), torch.randn(10, 4)
    dd, wd = data.to(DEV), w.to(DEV)
    torch_pjrt.metrics.reset()
    for i in range(10):
        got = f(dd[:, i:i + 4], wd)
        torch.testing.assert_close(got.cpu(), data[:, i:i + 4] * w + data[:, i:i + 4].sum(0))
    assert torch_pjrt.metrics.counters()["replays"] >= 8
    assert torch.equal(dd.cpu(), data)


def test_a_tensor_the_graph_holds_as_a_constant_is_read_anew_on_replay():
    # a global read in a nonstrict_trace helper is a get_attr constant of the
    # graph: written in place between calls, the replay reads its new value
    w = torch.ones(3, device=DEV)

    @torch._dynamo.nonstrict_trace
    def helper(x):
        return x * w

    f = torch.compile(lambda x: helper(x) + 1, backend="pjrt")
    x = torch.ones(3, device=DEV)
    torch_pjrt.metrics.reset()
    for i in range(4):
        assert f(x).cpu().tolist() == [2.0 + i] * 3
        w.add_(1)
    assert torch_pjrt.metrics.counters()["replays"] >= 2


def test_batched_grad_outputs_are_traced_not_replayed():
    # autograd.grad(is_grads_batched=True) (jacobian(vectorize=True)) hands the
    # backward graph vmap's batched tensors, which have no storage to replay on
    def f(x):
        return torch.tanh(x) * 3

    def jacobian(fn, x):
        x = x.detach().requires_grad_()
        eye = torch.eye(4, device=x.device)
        return torch.autograd.grad(fn(x), x, eye, is_grads_batched=True)[0]

    x = torch.randn(4)
    want = jacobian(f, x)
    compiled = torch.compile(f, backend="pjrt")
    for _ in range(3):  # batched calls: traced each time
        torch.testing.assert_close(jacobian(compiled, x.to(DEV)).cpu(), want)
    plain = x.to(DEV).requires_grad_()
    torch.autograd.grad(compiled(plain).sum(), plain)  # recorded now: a later batched call must not replay it
    torch.testing.assert_close(jacobian(compiled, x.to(DEV)).cpu(), want)
    torch.testing.assert_close(torch.autograd.functional.jacobian(compiled, x.to(DEV), vectorize=True).cpu(), want)
    assert any("batched" in why for why in pjrt_dynamo.call_stats()["refusals"])


@torch.library.custom_op("tpj_test::scale_by_item", mutates_args=())
def _scale_by_item(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x * s.item()  # a host read inside the graph, as library code (grouped_mm fallbacks) does


@_scale_by_item.register_fake
def _(x, s):
    return torch.empty_like(x)


_state = {"bias": torch.zeros(())}


@torch.library.custom_op("tpj_test::add_state", mutates_args=())
def _add_state(x: torch.Tensor) -> torch.Tensor:
    return x + _state["bias"]  # state the graph does not show


@_add_state.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_graph_with_cpu_fallbacks_says_why_it_is_not_replayed():
    """Graphs with ops that run on the CPU are traced on every call;
    call_stats named no reason for them."""
    f = torch.compile(lambda a: torch.special.erfcx(a) + 1, backend="pjrt")
    pjrt_dynamo.call_stats(reset=True)
    x = torch.rand(4)
    for _ in range(2):
        torch.testing.assert_close(f(x.to(DEV)).cpu(), torch.special.erfcx(x) + 1)
    refusals = pjrt_dynamo.call_stats()["refusals"]
    assert any("run on the CPU" in why and "special_erfcx" in why for why in refusals), refusals


@pytest.mark.parametrize("custom_ops_trusted", [False, True])
def test_graph_that_reads_a_value_to_the_host_is_not_replayed(monkeypatch, custom_ops_trusted):
    """A custom op reading an input with .item() bakes the value into the
    traced program: replaying it gave every later call the first call's
    result (transformers' MoE grouped_mm fallback: wrong expert gradients
    from the second step). Graphs with custom ops are traced on every call;
    with that rule lifted, the host read itself refuses the recording."""
    if custom_ops_trusted:
        monkeypatch.setattr(pjrt_dynamo, "_BUILTIN_OPS", pjrt_dynamo._BUILTIN_OPS | {"tpj_test"})
    f = torch.compile(lambda x, s: _scale_by_item(x, s) + 1, backend="pjrt")
    x = torch.ones(4, device=DEV)
    pjrt_dynamo.call_stats(reset=True)
    for v in (2.0, 3.0, 5.0):
        s = torch.tensor(v, device=DEV)
        torch_pjrt.sync()  # materialized: .item() reads it without a sync
        assert torch.equal(f(x, s).cpu(), torch.full((4,), v + 1))
    refusals = pjrt_dynamo.call_stats()["refusals"]
    want = "read to the host" if custom_ops_trusted else "custom ops"
    assert any(want in why for why in refusals), refusals


def test_custom_op_reading_state_outside_the_graph_sees_its_changes():
    f = torch.compile(lambda x: _add_state(x) * 2, backend="pjrt")
    x = torch.ones(3, device=DEV)
    for v in (0.0, 1.0, 4.0):
        _state["bias"] = torch.tensor(v, device=DEV)
        assert torch.equal(f(x).cpu(), torch.full((3,), 2 * (1 + v)))


@torch.library.custom_op("tpj_test::add_state_", mutates_args=("out",))
def _add_state_(out: torch.Tensor) -> None:
    out.add_(_state["bias"])  # mutating: AOTAutograd wraps it in auto_functionalized


@_add_state_.register_fake
def _(out):
    return None


@pytest.mark.parametrize("where", ["mutating", "map", "scan"])
def test_custom_ops_hidden_in_higher_order_ops_still_trace_every_call(where):
    """A mutating custom op (inside auto_functionalized) and a custom op in
    a map or scan body were not seen as custom ops: the graph was replayed
    with the first call's state (2, 2, 2 instead of 2, 4, 10)."""
    from torch._higher_order_ops.map import map as hmap
    from torch._higher_order_ops.scan import scan

    def f(x):
        if where == "mutating":
            y = x.clone()
            _add_state_(y)
            return y * 2
        if where == "map":
            return hmap(lambda t: _add_state(t) * 2, x)
        return scan(lambda c, t: (c + _add_state(t), c * 2), x[0], x[1:])[0]

    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    x = torch.ones(3, 2)
    for v in (1.0, 2.0, 5.0):
        _state["bias"] = torch.tensor(v)
        want = f(x)
        _state["bias"] = torch.tensor(v, device=DEV)
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), want)


def test_input_written_lazily_before_the_call_is_read_updated():
    f = torch.compile(lambda a: a.sum(0), backend="pjrt")
    a = torch.ones(3, 2).to(DEV)
    for _ in range(2):
        f(a)
    a.mul_(3)  # pending when the replayed call starts
    assert torch.equal(f(a).cpu(), torch.full((2,), 9.0))


def test_in_place_update_of_an_input_is_donated_on_replay():
    @torch.compile(backend="pjrt")
    def update(p, g):
        with torch.no_grad():
            p.sub_(0.5 * g)

    p = torch.zeros(64).to(DEV)
    g = torch.ones(64).to(DEV)
    for _ in range(3):
        update(p, g)
    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    held = torch_pjrt.runtime.memory_allocated()
    update(p, g)
    c = torch_pjrt.metrics.counters()
    assert c.get("replays") == 1 and c.get("donated_buffers") == 1
    # The donated buffer no longer counts, though its release may wait
    # for the next launch (the replay may still be in flight).
    assert torch_pjrt.runtime.memory_allocated() == held
    assert torch.equal(p.cpu(), torch.full((64,), -2.0))


def test_checks_compiled_into_the_program_hold_on_replay():
    emb = nn.Embedding(10, 4).to(DEV)
    f = torch.compile(lambda i: emb(i) * 2, backend="pjrt")
    ok = torch.tensor([1, 2, 3]).to(DEV)
    with torch.no_grad():
        for _ in range(3):
            f(ok).cpu()
        torch_pjrt.metrics.reset()
        out = f(torch.tensor([1, 12, 3]).to(DEV))
        assert torch_pjrt.metrics.counters().get("replays") == 1
        with pytest.raises(IndexError):
            out.cpu()
        # The same call joining pending work: the check holds in the one program.
        bad = torch.tensor([1, 12, 3]).to(DEV) + 0
        torch_pjrt.metrics.reset()
        out = f(bad)
        assert torch_pjrt.metrics.counters().get("replays_joined") == 1
        with pytest.raises(IndexError):
            out.cpu()


@pytest.mark.parametrize("op", ["cholesky", "inv"])
def test_graphs_with_effect_tokens_replay_and_keep_their_checks(op):
    # linalg.cholesky / inv check their info output through an op with
    # effects, which AOTAutograd threads through CPU token tensors (as does
    # MultivariateNormal, which factors its covariance): such graphs replay,
    # and the check still raises for a matrix that is not positive definite
    fn = getattr(torch.linalg, op)
    f = torch.compile(lambda c: fn(c) * 2, backend="pjrt")
    pjrt_dynamo.call_stats(reset=True)
    good = torch.eye(3) * 2 + 0.5
    for i in range(3):
        torch.testing.assert_close(f((good + i).to(DEV)).cpu(), fn(good + i) * 2)
    torch_pjrt.metrics.reset()
    out = f(-torch.ones(3, 3).to(DEV))
    assert torch_pjrt.metrics.counters()["replays"] == 1
    with pytest.raises(torch.linalg.LinAlgError):
        out.cpu()
    assert pjrt_dynamo.call_stats()["refusals"] == {}


@pytest.mark.parametrize("capturable", [True, False])
def test_compiled_adamw_replays(capturable):
    # AdamW's step counters are CPU tensors unless capturable=True (Dynamo
    # sets it only for CUDA/XPU): copies run on the device, the increment
    # stays on the CPU.
    def run(compiled):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = nn.Linear(8, 4).to(DEV)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=capturable)
        step = torch.compile(opt.step, backend="pjrt") if compiled else opt.step
        x = torch.randn(4, 8).to(DEV)
        for _ in range(5):
            m(x).square().sum().backward()
            step()
            opt.zero_grad()
            torch_pjrt.sync()
        steps = [s["step"] for s in opt.state.values()]
        assert all(s.device.type == ("pjrt" if capturable else "cpu") and float(s) == 5 for s in steps)
        return m.weight.detach().cpu()

    pjrt_dynamo.call_stats(reset=True)
    torch_pjrt.metrics.reset()
    got = run(True)
    assert pjrt_dynamo.call_stats()["refusals"] == {}
    assert torch_pjrt.metrics.counters().get("replays", 0) >= 3
    assert torch.allclose(got, run(False), rtol=1e-5, atol=1e-6)


def test_float_argument_with_batch_norm_updates_statistics_once():
    """The graph's CPU part computes only what depends on the CPU numbers:
    BatchNorm's running statistics, written on the device, are written once
    per call."""
    torch.manual_seed(0)
    ref = nn.BatchNorm1d(4)
    dev = nn.BatchNorm1d(4).to(DEV)
    f = lambda m, x, s: m(x) * s
    cf = torch.compile(f, backend="pjrt")
    for k, s in enumerate([0.5, 1.5, 2.5, 3.5]):
        x = torch.randn(6, 4)
        torch.testing.assert_close(cf(dev, x.to(DEV), s).cpu(), f(ref, x, s), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev.running_mean.cpu(), ref.running_mean)
    torch.testing.assert_close(dev.running_var.cpu(), ref.running_var)
    assert int(dev.num_batches_tracked) == 4


def test_python_float_arguments_replay_with_their_values():
    """Dynamo passes a Python float argument as a 0-d float64 CPU tensor; it
    is moved to the device, so forward and backward replay for every value,
    and the number the forward saves for the backward stays a CPU number."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    dev = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEV)
    dev.load_state_dict(ref.state_dict())

    def step(m, x, scale, t):
        return ((m(x) * scale).sin() / t).sum() * scale

    cstep = torch.compile(step, backend="pjrt")
    x = torch.randn(5, 8)
    values = [(0.1, 2.0), (0.2, 3.0), (1.7, 0.5), (-0.3, 4.0), (0.9, 1.0), (2.5, 0.25)]
    for k, (scale, t) in enumerate(values):
        if k == 2:  # Dynamo made the numbers inputs at the second value
            pjrt_dynamo.call_stats(reset=True)
            torch_pjrt.metrics.reset()
        want = step(ref, x, scale, t)
        want.backward()
        got = cstep(dev, x.to(DEV), scale, t)
        got.backward()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        for p, q in zip(dev.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)
    c = torch_pjrt.metrics.counters()
    assert pjrt_dynamo.call_stats()["refusals"] == {}
    assert c.get("replays", 0) == 2 * (len(values) - 2), c  # forward and backward of every later value
    assert c.get("compiles", 0) <= 1, c  # the backward's seed, lazily; nothing per value


def test_alternating_sizes_under_dynamic_shapes_each_replay():
    """Under dynamic=True one graph serves every size, its sizes Python
    inputs: each size's recording is kept (it was the last size's only, so
    lengths alternating 12/14/16 traced every call)."""
    lin = nn.Linear(16, 16).to(DEV)
    f = torch.compile(lambda x: torch.relu(lin(x)).sum(), backend="pjrt", dynamic=True)
    xs = {n: torch.randn(n, 16) for n in (8, 12, 15)}
    for n in (8, 8, 12, 12, 15, 15):  # warm: each size traced, recorded, replayed once
        f(xs[n].to(DEV)).cpu()
    torch_pjrt.metrics.reset()
    for n in (8, 12, 15, 12, 8, 15):
        got = f(xs[n].to(DEV)).cpu()
        torch.testing.assert_close(got, torch.relu(xs[n] @ lin.weight.detach().cpu().t() + lin.bias.detach().cpu()).sum())
    c = torch_pjrt.metrics.counters()
    assert c.get("replays", 0) == 6 and c.get("compiles", 0) == 0 and c.get("replay_recordings", 0) == 0, c


def test_scalar_inputs_that_the_graph_writes_stay_on_the_cpu():
    """A 0-d CPU input the graph updates in place (Adam's step counter
    without capturable=True) is written where it lives, every call."""
    n = torch.zeros(())
    w = torch.ones(3, device=DEV)

    @torch.compile(backend="pjrt")
    def f(w, n):
        n.add_(1)
        return w * n

    for k in range(1, 5):
        torch.testing.assert_close(f(w, n).cpu(), torch.full((3,), float(k)))
    assert n.device.type == "cpu" and float(n) == 4.0


def test_backward_of_a_slice_replays():
    """The backward of a slice (and of select, diagonal) is slice_scatter,
    whose only kernel is PyTorch's backend-generic one: it runs natively, so
    the graph replays (rotary embeddings slice in every Llama layer)."""
    p = torch.randn(6, 4, device=DEV, requires_grad=True)
    f = torch.compile(lambda p: (p[:3] * 2).sum() + p.diagonal().sum() + p[1].pow(2).sum(), backend="pjrt")
    want = torch.zeros(6, 4)
    want[:3] += 2
    want += torch.eye(6, 4)
    torch_pjrt.metrics.reset()
    pjrt_dynamo.call_stats(reset=True)
    for _ in range(4):
        f(p).backward()
        got = p.grad.cpu()
        p.grad = None
        row = torch.zeros(6, 4)
        row[1] = 2 * p.detach().cpu()[1]
        torch.testing.assert_close(got, want + row)
    c = torch_pjrt.metrics.counters()
    assert c.get("dynamo_fallback_nodes", 0) == 0 and torch_pjrt.metrics.fallbacks() == {}
    assert c["replays"] == 6, c  # forward and backward of the 3 later calls
    assert pjrt_dynamo.call_stats()["refusals"] == {}


def test_mamba_backward_replays_from_its_second_call():
    # Mamba's forward saves views with a size-1 dim: traced, its stride was
    # the matmul's (3072), replayed the fake tensor's (16). The backward's
    # replay compared that stride, which addresses nothing, and traced its
    # second call again (3 more compiles in step 2).
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2,
                                      conv_kernel=4, use_cache=False)
    model = transformers.MambaForCausalLM(config).to(DEV)
    ids = torch.randint(0, 128, (2, 12)).to(DEV)
    g = torch.compile(lambda ids: model(input_ids=ids, labels=ids).loss, backend="pjrt")
    g(ids).backward()
    pjrt_dynamo.call_stats(reset=True)
    torch_pjrt.metrics.reset()
    g(ids).backward()
    torch_pjrt.sync()
    assert torch_pjrt.metrics.counters()["replays"] == 2  # forward and backward
    assert pjrt_dynamo.call_stats()["refusals"] == {}


def test_inductor_modes_are_accepted_with_a_warning():
    for mode in ("reduce-overhead", "max-autotune"):
        torch._dynamo.reset()
        with pytest.warns(UserWarning, match=f"ignores mode='{mode}'"):
            out = torch.compile(lambda x: x * 2 + 1, backend="pjrt", mode=mode)(torch.ones(3, device=DEV))
        assert torch.equal(out.cpu(), torch.full((3,), 3.0))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode=max-autotuen"):  # a misspelt mode: Inductor's error
        torch.compile(lambda x: x * 2, backend="pjrt", mode="max-autotuen")(torch.ones(3, device=DEV))


def test_compiled_write_at_a_symbolic_position_keeps_one_program():
    """A compiled decode step writing per-layer KV caches at a Python-int
    position (Dynamo makes it symbolic): AOTAutograd's copy and
    slice_scatter / select_scatter write into the input at an offset that is
    a parameter, so new positions reuse the program (before: one compile per
    position), and the caches equal the CPU's."""
    torch.manual_seed(0)
    H, T, D = 2, 12, 4

    def step(caches, k, pos):
        for l, c in enumerate(caches):
            c[:, pos:pos + 1] = k * (l + 1)
        return sum(c.sum() for c in caches)

    f = torch.compile(step, backend="pjrt")
    cpu = [torch.zeros(H, T, D) for _ in range(2)]
    dev = [c.to(DEV) for c in cpu]
    compiles = []
    for pos in range(8):
        k = torch.randn(H, 1, D)
        want = step(cpu, k, pos)
        torch_pjrt.metrics.reset()
        got = f(dev, k.to(DEV), pos)
        torch.testing.assert_close(got.cpu(), want)
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.cpu(), c)
    assert compiles[3:] == [0] * 5, compiles


@pytest.mark.parametrize("modified", ["input", "output"])
def test_replay_keeps_autograds_check_of_tensors_modified_before_backward(modified):
    """x or y = tanh(x * w) changed in place between forward and backward:
    eager autograd raises (a tensor saved for the backward was modified).
    A replay returns the inputs and outputs the traced call returned as the
    same tensors or views of them, so it raises too (it returned copies, and
    computed a gradient from the changed values)."""
    f = torch.compile(lambda x, w: (x * w).tanh(), backend="pjrt")
    torch_pjrt.metrics.reset()
    for i in range(4):
        x = torch.full((3,), 0.5, device=DEV)
        w = torch.full((3,), 0.3 + i, device=DEV, requires_grad=True)
        y = f(x, w)
        (x if modified == "input" else y).mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    assert torch_pjrt.metrics.counters().get("replays", 0) > 0


def test_a_compiled_training_step_is_one_program_from_the_first_step():
    """The first calls of the forward and backward graphs are recorded in the
    pending trace, not launched as programs of their own: the first step is
    one program (it was 4: forward, loss, backward, optimizer), and a loop
    that reads the loss after opt.step() settles as the lazy one does (it
    compiled 6 programs, 2 of them whole steps, the first step's optimizer
    joining the second step). Values are the CPU's: BatchNorm's running
    statistics are written inside the recorded forward."""
    def make(dev):
        torch.manual_seed(0)
        # (no bias before BatchNorm: its gradient is rounding noise, which AdamW scales up)
        model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    data = _data(4)
    cpu, cpu_opt = make("cpu")
    model, opt = make(DEV)
    fwd = torch.compile(model, backend="pjrt")
    pjrt_dynamo.call_stats(reset=True)
    compiles, executions = [], []
    for x, y in data:
        want = F.cross_entropy(cpu(x), y)
        want.backward()
        cpu_opt.step()
        cpu_opt.zero_grad()
        before = torch_pjrt.metrics.counters()
        loss = F.cross_entropy(fwd(x.to(DEV)), y.to(DEV))
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
        after = torch_pjrt.metrics.counters()
        compiles.append(after.get("compiles", 0) - before.get("compiles", 0))
        executions.append(after.get("executions", 0) - before.get("executions", 0))
    assert compiles == [1, 1, 0, 0] and executions == [1, 1, 1, 1], (compiles, executions)
    assert pjrt_dynamo.call_stats()["refusals"] == {}
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k].cpu(), v, rtol=1e-5, atol=1e-6)


def test_a_graph_recorded_in_the_pending_trace_launches_alone_later():
    """Recorded where work was pending (joined), called later with nothing
    pending: its program is compiled then and launched on the inputs'
    buffers, the input it writes in place included."""
    def step(acc, x):
        acc.add_(x * 2)
        return acc.sum() + x.mean()

    f = torch.compile(step, backend="pjrt")
    acc_cpu, acc = torch.zeros(5), torch.zeros(5, device=DEV)
    x_cpu = torch.arange(5.0)
    x = x_cpu.to(DEV)
    pending = x * 3  # work pending: the first call is recorded in that trace
    out = f(acc, pending)
    want = step(acc_cpu, x_cpu * 3)
    torch.testing.assert_close(out.cpu(), want)
    torch_pjrt.metrics.reset()
    for _ in range(3):
        out = f(acc, x)  # nothing pending: launched alone
        torch.testing.assert_close(out.cpu(), step(acc_cpu, x_cpu))
    torch.testing.assert_close(acc.cpu(), acc_cpu)
    c = torch_pjrt.metrics.counters()
    assert c["replays"] == 3 and c.get("replays_joined", 0) == 0 and c["compiles"] == 1, c


def test_checks_of_a_graph_recorded_in_the_pending_trace_are_its_own():
    """A graph recorded in a trace that already holds a check: its program
    carries its own checks only, and the check before it still fails where
    it should."""
    g = torch.compile(lambda t, i: t[i] * 2, backend="pjrt")
    t = torch.arange(5.0, device=DEV)
    good, bad = torch.tensor([1, 4], device=DEV), torch.tensor([1, 7], device=DEV)
    before = t[good]  # a check pending before the call
    out = g(t, good)
    assert out.cpu().tolist() == [2.0, 8.0] and before.cpu().tolist() == [1.0, 4.0]
    out = g(t * 1, good)  # replayed, joined
    assert out.cpu().tolist() == [2.0, 8.0]
    with pytest.raises(IndexError, match="out of range"):
        g(t * 1, bad).cpu()
    with pytest.raises(IndexError, match="out of range"):
        (t[bad] + g(t * 1, good)).cpu()  # the failing check before the call


@pytest.mark.parametrize("join", [0, 2], ids=["alone", "in_trace"])
@pytest.mark.parametrize("reset", ["manual_seed", "set_rng_state"])
def test_a_graph_that_sets_the_random_state_is_not_recorded(join, reset):
    """Dynamo breaks graphs at manual_seed and set_rng_state; were a graph to
    hold one, the runtime refuses to record it (its program's draws would
    not follow the state it set) and the values stay right."""
    from torch_pjrt import _C
    x = torch.ones(6, device=DEV)
    torch_pjrt.sync()
    state = torch.pjrt.get_rng_state()
    rec = _C._replay_begin([x], join)
    a = x + torch.rand(6, device=DEV)
    if reset == "manual_seed":
        torch.pjrt.manual_seed(123)
    else:
        torch.pjrt.set_rng_state(state)
    b = x + torch.rand(6, device=DEV)
    program, why = _C._replay_end(rec, [x], [a, b])
    assert program is None and "sets the random state" in why, why
    if reset == "manual_seed":
        torch.pjrt.manual_seed(123)
    else:
        torch.pjrt.set_rng_state(state)
    again = torch.rand(6, device=DEV).cpu()
    torch.testing.assert_close(b.cpu(), again + 1)
    if reset == "set_rng_state":
        torch.testing.assert_close(a.cpu(), b.cpu())
