"""CPU fallback for ops without a lowering, metrics, recompilation reasons."""

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import run_python

DEV = torch_pjrt.device()


def test_unlowered_op_runs_on_cpu_and_is_counted():
    # special_bessel_j0: a special function without a lowering (linalg.det
    # and special_i1e, the examples here before, lower now)
    x = torch.randn(5, 5)
    torch_pjrt.metrics.reset()
    got = torch.special.bessel_j0(x.to(DEV))
    assert got.device.type == "pjrt"
    torch.testing.assert_close(got.cpu(), torch.special.bessel_j0(x), rtol=1e-5, atol=1e-5)
    fb = torch_pjrt.metrics.fallbacks()
    assert sum(fb.values()) >= 1 and any("bessel_j0" in op for op in fb), fb
    assert torch_pjrt.metrics.counters()["cpu_fallbacks"] == sum(fb.values())
    # each fallback names the line that triggered it
    sites = torch_pjrt.metrics.fallback_sites()
    assert set(sites) == set(fb)
    for op, n in fb.items():
        assert sum(sites[op].values()) == n
        assert all(w.startswith(__file__ + ":") for w in sites[op]), sites
    report = torch_pjrt.metrics.report()
    assert "CPU fallbacks" in report and "test_fallback_metrics.py:" in report


def test_inplace_fallback_writes_back():
    x, y = torch.rand(6) + 0.5, torch.rand(6) + 0.5
    d = x.to(DEV)
    torch_pjrt.metrics.reset()
    d.igamma_(y.to(DEV))  # (i0_ and erfinv_, the examples here before, lower now)
    torch.testing.assert_close(d.cpu(), torch.igamma(x, y))
    fb = torch_pjrt.metrics.fallbacks()
    assert sum(n for op, n in fb.items() if op.startswith("aten::igamma")) == 1, fb


def test_fallback_can_be_forbidden():
    r = run_python("import torch, torch_pjrt; torch.special.bessel_j0(torch.eye(3).to('pjrt')).cpu()",
                   TORCH_PJRT_FALLBACK="error")
    assert r.returncode != 0
    assert "has no pjrt lowering" in r.stderr and "TORCH_PJRT_FALLBACK=error" in r.stderr
    assert "(at <string>:1)" in r.stderr


def test_fallback_warns_once_per_op_with_its_location():
    code = (
        "import warnings, torch, torch_pjrt\n"
        "warnings.simplefilter('always')\n"
        "x = torch.rand(4).to('pjrt') * 0.5\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    for _ in range(3):\n"
        "        torch.special.bessel_j0(x).cpu()\n"
        "msgs = [str(m.message) for m in w if issubclass(m.category, torch_pjrt.PjrtWarning)]\n"
        "print(len(msgs)); print(msgs[0])\n"
    )
    r = run_python(code, TORCH_PJRT_FALLBACK="warn")
    assert r.returncode == 0, r.stderr
    count, message = r.stdout.strip().splitlines()
    assert count == "1", r.stdout
    assert "'aten::special_bessel_j0'" in message and "<string>:6" in message, message


def test_counters_and_report():
    torch_pjrt.metrics.reset()
    x = torch.randn(8, 8).to(DEV)
    for _ in range(3):
        y = (x @ x).relu().sum()
        torch_pjrt.sync()
    y.cpu()
    c = torch_pjrt.metrics.counters()
    assert c["compiles"] == 1 and c["cache_hits"] == 2 and c["executions"] == 3
    assert c["bytes_to_host"] == 4 and c["traced_ops"] > 0
    t = torch_pjrt.metrics.timers()
    assert t["compile"] > 0 and t["trace"] > 0
    text = torch_pjrt.metrics.report()
    assert "compiles" in text and "trace_per_op" in text


def test_trace_time_leaves_out_what_a_read_inside_an_op_compiles():
    # .cpu() traces an op whose read syncs, compiles and waits: that is not
    # tracing (trace_per_op read 5063 us after three tiny compiles).
    torch_pjrt.metrics.reset()
    x = torch.randn(64, 64).to(DEV)
    for n in range(3):
        ((x[: 20 + n] @ x.t()).tanh() * 3).sum(0).cpu()  # a new program each time
    t = torch_pjrt.metrics.timers()
    assert torch_pjrt.metrics.counters()["compiles"] >= 3
    assert t["trace"] < 0.5 * t["compile"], t


def test_program_memory_is_the_compilers_plan():
    # The plugin's compiled memory statistics (PJRT_Executable_GetCompiledMemoryStats):
    # a program that reads a 64 KiB input and writes a 64 KiB output plans at
    # least both, and its matmul chain needs a temporary.
    torch_pjrt.metrics.reset()
    x = torch.randn(128, 128).to(DEV)
    torch_pjrt.sync()
    y = ((x @ x).relu() @ x).tanh()
    torch_pjrt.sync()
    c = torch_pjrt.metrics.counters()
    assert c["program_peak_bytes"] >= 2 * 128 * 128 * 4
    assert 0 < c["program_temp_bytes"] < c["program_peak_bytes"]
    # The largest program wins; a smaller later one does not lower it.
    peak = c["program_peak_bytes"]
    (x[:2] + 1).cpu()
    assert torch_pjrt.metrics.counters()["program_peak_bytes"] == peak
    torch.testing.assert_close(y.cpu(), ((x.cpu() @ x.cpu()).relu() @ x.cpu()).tanh(), rtol=1e-4, atol=1e-4)


def test_compiles_of_changing_graphs_are_counted_where_the_sync_ran():
    """A graph whose ops change from step to step (a loop over a length
    read on the host, as packed sequences' batch sizes) compiles anew each
    time without being a recompile of a known structure; compile_sites()
    counts it at the line whose sync compiled it, and report() shows it."""
    torch_pjrt.metrics.reset()
    # (a shape and ops of this test alone: a structure another test compiled
    # with other shapes would make the first compile here a recompile)
    x = torch.randn(3, 17).to(DEV)
    for n in (1, 2, 3, 2):
        y = x
        for _ in range(n):
            y = y.cosh() * 2 + 1
        y.cpu()  # the sync
    line = inspect.currentframe().f_lineno - 1
    sites = torch_pjrt.metrics.compile_sites()
    assert sites.get(f"{__file__}:{line}") == 3, sites  # n = 2 again is a cache hit
    assert torch_pjrt.metrics.recompiles() == []
    assert f"3  {__file__}:{line}" in torch_pjrt.metrics.report()


def test_recompile_reason_names_the_changed_input():
    torch_pjrt.metrics.reset()

    def step(n):
        x = torch.randn(n, 16).to(DEV)
        return (x * 2).sum(1)

    step(4).cpu()
    step(4).cpu()
    step(5).cpu()
    rc = torch_pjrt.metrics.recompiles()
    assert len(rc) == 1, rc
    assert "[4,16]" in rc[0]["why"] and "[5,16]" in rc[0]["why"], rc[0]
    assert rc[0]["where"].endswith(".py:" + rc[0]["where"].rsplit(":", 1)[1]), rc[0]
    assert "test_fallback_metrics.py" in rc[0]["where"]


def test_recompile_reason_names_a_slices_moving_offset():
    # a random crop of a computed value (its slice starts are program
    # constants) recompiled as "same structure, different details"
    torch_pjrt.metrics.reset()
    x = torch.randn(2, 3, 12, 12).to(DEV)
    for dy in range(3):
        (x * 2)[:, :, dy:dy + 8, dy:dy + 8].sum().cpu()
    rc = torch_pjrt.metrics.recompiles()
    assert len(rc) == 2, rc
    assert "starts=[0,0,0,0]" in rc[0]["why"] and "starts=[0,0,1,1]" in rc[0]["why"], rc[0]


def test_the_same_program_on_another_device_says_so():
    torch_pjrt.metrics.reset()
    x = torch.randn(4, 17)
    for d in (1, 2):
        (x.to(f"pjrt:{d}").cosh() * 3).atan2(x.to(f"pjrt:{d}")).logsumexp(1).cpu()
    rc = torch_pjrt.metrics.recompiles()
    assert rc and rc[-1]["why"] == "devices changed from 1 to 2", rc


def test_changing_python_scalars_do_not_recompile():
    torch_pjrt.metrics.reset()
    x = torch.randn(10).to(DEV)
    for lr in (0.1, 0.01, 0.001, 0.5):
        x = x - lr * x
        torch_pjrt.sync()
    assert torch_pjrt.metrics.counters()["compiles"] == 1


def test_debug_log_shows_recompile_with_python_line():
    code = (
        "import torch, torch_pjrt\n"
        "for n in (3, 4):\n"
        "    x = torch.ones(n).to('pjrt')\n"
        "    (x * 2).cpu()\n"
    )
    r = run_python(code, TORCH_PJRT_DEBUG="1")
    assert r.returncode == 0, r.stderr
    assert "recompiling a known graph" in r.stderr
    assert "<string>:4" in r.stderr


def test_mini_batches_sliced_from_a_device_data_set_share_one_program():
    """x[i:i+b], x[i] and x[:, j] of a tensor held on the device read their
    offset as a parameter: a training loop over a data set moved to pjrt
    once compiles its step once, not once per batch, and every batch is
    the right one."""
    torch.manual_seed(0)
    data, target = torch.randn(64, 8), torch.randn(64, 2)
    x, y = data.to(DEV), target.to(DEV)
    for read in (lambda t, i: t[i * 8:(i + 1) * 8].sum(0), lambda t, i: t[i], lambda t, i: t[:, i]):
        compiles = []
        for i in range(6):
            torch_pjrt.metrics.reset()
            torch.testing.assert_close(read(x, i).cpu(), read(data, i))
            compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
        assert compiles[1:] == [0] * 5, compiles
    model = torch.nn.Linear(8, 2)
    runs = []
    for device, xs, ys in (("cpu", data, target), (DEV, x, y)):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses, compiles = [], []
        for i in range(0, 64, 16):
            torch_pjrt.metrics.reset()
            loss = F.mse_loss(m(xs[i:i + 16]), ys[i:i + 16])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
        runs.append((losses, compiles))
    torch.testing.assert_close(torch.tensor(runs[1][0]), torch.tensor(runs[0][0]))
    assert runs[1][1][2:] == [0, 0], runs[1][1]  # (the first two steps: without and with optimizer state)


def test_writes_at_a_moving_position_share_one_program():
    """A replay buffer (obs[i] = x), a MoCo queue (q[:, p:p+k] = keys) and a
    KV cache (kv[:, :, t] = v), each written and then read-modified-written
    at the same moving position in one step: the offset is a parameter of
    the write as of the read, so the step compiles once, and the contents
    equal the CPU's."""
    torch.manual_seed(0)
    cpu = [torch.zeros(16, 5), torch.zeros(4, 12), torch.zeros(2, 3, 8, 4)]
    dev = [t.to(DEV) for t in cpu]
    torch_pjrt.sync()
    writes = (
        lambda t, i: t.select(0, i),                    # obs[i]
        lambda t, i: t[:, (3 * i) % 12:(3 * i) % 12 + 3],  # queue window, wrapping round
        lambda t, i: t[:, :, i],                        # cache position
    )
    compiles = []
    for i in range(8):
        torch_pjrt.metrics.reset()
        for c, d, view in zip(cpu, dev, writes):
            new = torch.randn(view(c, i).shape)
            view(c, i).copy_(new)
            view(d, i).copy_(new.to(DEV))
            view(c, i).mul_(2).add_(1)
            view(d, i).mul_(2).add_(1)
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    for c, d in zip(cpu, dev):
        assert torch.equal(d.cpu(), c)
    assert compiles[2:] == [0] * 6, compiles


def test_batch_norm_cumulative_average_does_not_recompile_per_step():
    """BatchNorm(momentum=None) (swa_utils.update_bn sets it) averages with
    1/num_batches_tracked: a parameter of the program, not a constant, and
    the running statistics equal the CPU's."""
    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm1d(6, momentum=None)
    dev = copy.deepcopy(cpu).to(DEV)
    compiles = []
    for _ in range(6):
        x = torch.randn(5, 6)
        torch_pjrt.metrics.reset()
        torch.testing.assert_close(dev(x.to(DEV)).cpu(), cpu(x))
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    torch.testing.assert_close(dev.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(dev.running_var.cpu(), cpu.running_var)
    assert compiles[2:] == [0] * 4, compiles


def test_storages_given_one_value_settle_after_the_second_step():
    """SGD's momentum buffer is a clone of the gradient at the first step,
    and an EMA copy_ of the parameters: storages holding one value. Each
    gets its own output buffer, so the second step's program donates them
    as every later one does (sharing one buffer, they could not: a third
    program compiled at the third step)."""
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Linear(6, 3).to(device)
        ema = [torch.empty_like(p) for p in m.parameters()]
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(5, 6).to(device)
        compiles = []
        for step in range(5):
            torch_pjrt.metrics.reset()
            opt.zero_grad(set_to_none=False)
            m(x).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                for e, p in zip(ema, m.parameters()):
                    e.copy_(p) if step == 0 else e.lerp_(p, 0.1)
            if device == DEV:
                torch_pjrt.sync()
            compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
        return [p.detach().cpu() for p in m.parameters()] + [e.cpu() for e in ema], compiles

    want, _ = run("cpu")
    got, compiles = run(DEV)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert compiles[2:] == [0] * 3, compiles


def test_recurrence_written_into_a_buffer_compiles_in_linear_time():
    """GAE as written in PPO code, a Python loop storing each step's state
    into a buffer (adv[t] = last = delta + g * last): each stored state is
    computed once into memory. Before, XLA recomputed every earlier step
    inside each write (96 steps: about a minute of compile; now about 2 s)."""
    T, N = 96, 4
    rew, val = torch.randn(T, N), torch.randn(T + 1, N)

    def gae(rew, val):
        adv, last = torch.zeros_like(rew), torch.zeros(N, device=rew.device)
        for t in reversed(range(T)):
            delta = rew[t] + 0.99 * val[t + 1] - val[t]
            adv[t] = last = delta + 0.99 * 0.95 * last
        return adv

    x, v = rew.to(DEV), val.to(DEV)
    torch_pjrt.sync()
    torch_pjrt.metrics.reset()
    torch.testing.assert_close(gae(x, v).cpu(), gae(rew, val))
    assert torch_pjrt.metrics.counters()["compiles"] == 1
    assert torch_pjrt.metrics.timers()["compile"] < 20, torch_pjrt.metrics.timers()


def test_numbers_written_into_a_buffer_keep_one_program():
    """reward[i] = r, done[i] = d, action[i] = a with r in {-1, 0, 1}: the
    numbers are parameters (as constants, 0, 1 and -1 made one program per
    combination of values), and the buffers hold what the CPU's hold."""
    import random
    rng = random.Random(0)
    bufs = {dev: (torch.zeros(32, device=dev), torch.zeros(32, dtype=torch.bool, device=dev),
                  torch.zeros(32, dtype=torch.long, device=dev)) for dev in ("cpu", DEV)}
    compiles = []
    for i in range(24):
        r, done, a = rng.choice([-1.0, 0.0, 1.0]), rng.random() < 0.3, rng.randrange(3)
        for rew, dn, act in bufs.values():
            rew[i], dn[i], act[i] = r, done, a
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    for c, d in zip(bufs["cpu"], bufs[DEV]):
        assert torch.equal(d.cpu(), c)
    assert len(set(compiles[2:])) == 1, compiles
