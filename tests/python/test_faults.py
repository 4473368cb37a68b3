"""Faults a user meets: out-of-range indices and zero divisors (checks
compiled into programs), failed programs, Ctrl-C during a wait, fork, and
recompiles that must not happen. Each raises a clear error or keeps the
right value; nothing is lost silently, nothing hangs."""

import copy
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import run_python

DEV = torch_pjrt.device()


def _raises_on_read(t, exc, match):
    with pytest.raises(exc, match=match):
        t.cpu()


# ------------------------------------------------------------ index checks

def _setitem(x, i):
    x[i] = 1.0
    return x


INDEX_CASES = {
    "index_select": lambda x, i: x.index_select(0, i),
    "getitem": lambda x, i: x[i],
    "gather": lambda x, i: x.gather(0, i),
    "embedding": lambda x, i: F.embedding(i, x.reshape(5, 1)),
    "scatter_": lambda x, i: x.clone().scatter_(0, i, torch.ones(2, device=x.device)),
    "scatter_add": lambda x, i: x.scatter_add(0, i, torch.ones(2, device=x.device)),
    "index_add_": lambda x, i: x.clone().index_add_(0, i, torch.ones(2, device=x.device)),
    "index_put_": lambda x, i: x.clone().index_put_((i,), torch.ones(2, device=x.device)),
    "setitem": lambda x, i: _setitem(x.clone(), i),
    "nll_loss": lambda x, i: F.nll_loss(x.reshape(1, 5).expand(2, 5), i),
    "cross_entropy": lambda x, i: F.cross_entropy(x.reshape(1, 5).expand(2, 5), i),
}


@pytest.mark.parametrize("name", sorted(INDEX_CASES))
def test_out_of_range_index_raises_like_the_cpu(name):
    op = INDEX_CASES[name]
    x = torch.arange(5.0)
    bad = torch.tensor([1, 7])
    with pytest.raises((IndexError, RuntimeError)) as on_cpu:
        r = op(x, bad)
        if isinstance(r, torch.Tensor):
            r.sum().item()  # CPU kernels may check lazily too; make sure they ran
    kind = on_cpu.type  # IndexError for indexing, RuntimeError for gather and scatter: the same here
    good = op(x, torch.tensor([1, 3]))
    xd = x.to(DEV)
    keep = (xd * 3)  # same program as the bad op
    with pytest.raises(kind, match="out of") as on_pjrt:
        out = None
        out = op(xd, bad.to(DEV))  # torch itself may check on the host first (then it raises here)
        out.cpu()
    assert on_pjrt.type is kind
    if out is not None:  # the check ran in the program
        with pytest.raises(kind):
            keep.cpu()  # every tensor the failed program wrote raises the same error
    assert torch.equal(xd.cpu(), x)  # an input it did not write keeps its value
    ok = op(xd, torch.tensor([1, 3]).to(DEV))  # the device keeps working
    if isinstance(good, torch.Tensor):
        torch.testing.assert_close(ok.cpu(), good)


def test_negative_indices_follow_the_cpu():
    x = torch.arange(5.0)
    xd = x.to(DEV)
    i = torch.tensor([-1, -5])
    assert torch.equal(xd[i.to(DEV)].cpu(), x[i])  # advanced indexing wraps
    with pytest.raises(IndexError):
        xd[torch.tensor([-6]).to(DEV)].cpu()
    with pytest.raises(IndexError):
        xd.index_select(0, i.to(DEV)).cpu()  # index_select does not wrap, on the CPU either


def test_sync_wait_raises_a_failed_check_once():
    xd = torch.arange(5.0).to(DEV)
    y = xd.index_select(0, torch.tensor([9]).to(DEV))
    with pytest.raises(IndexError, match="index_select"):
        torch_pjrt.sync(wait=True)
    torch_pjrt.sync(wait=True)  # reported: the next wait does not raise it again
    with pytest.raises(IndexError):
        y.cpu()  # but every read does
    y.copy_(torch.zeros(1))  # overwriting the whole tensor makes it valid again
    assert y.cpu().tolist() == [0.0]


def test_a_failed_check_names_the_line_of_its_program():
    # One message (an index out of range) comes from many lines: the error
    # names where the failed program traced it, also when a later program
    # carries the unread check of the one it reads.
    import inspect

    def here():
        return inspect.currentframe().f_back.f_lineno

    def raises_at(line):
        return pytest.raises(IndexError, match=rf"\(traced at [^ ]*test_faults.py:{line}\)")

    x = torch.arange(4.0, device=DEV)
    torch_pjrt.sync()
    a, at_a = x[torch.tensor([9], device=DEV)], here()
    with raises_at(at_a):
        a.cpu()
    b, at_b = x[torch.tensor([8], device=DEV)], here()
    with raises_at(at_b):
        b.cpu()
    c, at_c = x[torch.tensor([7], device=DEV)], here()
    torch_pjrt.sync()  # launched, its check not read yet
    d = c + 1  # the next program reads it
    with raises_at(at_c):
        d.cpu()
    with raises_at(at_c):
        c.cpu()  # its own program failed too (read here, not left to the next wait)
    assert len({at_a, at_b, at_c}) == 3


def test_a_value_computed_from_an_invalid_one_raises_through_programs_without_checks():
    x = torch.arange(4.0, device=DEV)
    torch_pjrt.sync()
    c = x[torch.tensor([7], device=DEV)]
    torch_pjrt.sync()  # launched, its check not read
    d = c + 1
    torch_pjrt.sync()  # a program with no check of its own
    e = d * 2
    torch_pjrt.sync()
    with pytest.raises(IndexError, match="out of") as later:
        e.cpu()
    # says it only inherits the failure (after a bad batch, the next good
    # batch raised the bad one's message word for word)
    assert "this value comes from a later program" in str(later.value)
    with pytest.raises(IndexError, match="out of") as failed:
        c.cpu()
    assert "later program" not in str(failed.value) and "reload them" in str(failed.value)
    with pytest.raises(IndexError, match="raised here by an op that reads one of those tensors"):
        c + 1  # traced: c itself was written by the failed program
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # only read by the failed program


def test_a_failure_is_named_where_it_happened_and_a_wait_raises_it_once():
    x = torch.arange(4.0, device=DEV)
    torch_pjrt.sync()
    a2 = x[torch.tensor([9], device=DEV)]  # the cause: an index out of range
    torch_pjrt.sync()
    torch.ops.aten._assert_async.msg((a2 > 100).all(), "a consequence")  # reads a2, fails too
    a3 = a2 + 1
    torch_pjrt.sync()
    c = a3 + a2  # reads the consequence first
    b = a2 * 2
    torch_pjrt.sync()
    with pytest.raises(IndexError, match="out of range"):
        c.cpu()
    with pytest.raises(IndexError, match="out of range"):
        a3.cpu()
    torch_pjrt.sync(wait=True)  # raised once by the reads: not again through b
    with pytest.raises(IndexError):
        b.cpu()  # a read raises every time


def test_a_wait_that_raises_leaves_later_checks_settling():
    """sync(wait=True) takes the launched outcomes off the device's list: one
    that raised must not leave the others unread, or every later program
    that read them could never be settled (one flag kept per program)."""
    x = torch.arange(4.0, device=DEV)
    i = torch.tensor([1], device=DEV)
    torch_pjrt.sync()
    bad = x[torch.tensor([9], device=DEV)]
    torch_pjrt.sync()
    x = x + x[i]
    torch_pjrt.sync()
    with pytest.raises(IndexError):
        torch_pjrt.sync(wait=True)
    del bad
    for _ in range(300):
        x = x - x[i] * 0
        torch_pjrt.sync()
    time.sleep(0.2)
    torch_pjrt.metrics.reset()
    assert x.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    flags = (torch_pjrt.metrics.counters().get("bytes_to_host", 0) - 16) // 4
    assert flags <= 100, flags


def test_checks_of_finished_programs_are_settled_without_a_read():
    """A loop that never reads a value: each program's outcome depends on the
    last one's; finished ones are settled at later launches, so the read at
    the end verifies a few flags, not one per program."""
    x = torch.arange(4.0, device=DEV)
    i = torch.tensor([1], device=DEV)
    torch_pjrt.sync()
    for _ in range(200):
        x = x + x[i]  # an index check in every program
        torch_pjrt.sync()
    time.sleep(0.2)
    torch_pjrt.metrics.reset()
    x.cpu()
    flags = (torch_pjrt.metrics.counters().get("bytes_to_host", 0) - 16) // 4
    assert 1 <= flags <= 100, flags


@pytest.mark.parametrize("op", ["floordiv", "mod", "trunc", "floor", "remainder", "fmod"])
def test_integer_division_by_zero_raises(op):
    a, b = torch.tensor([4, 5]), torch.tensor([1, 0])
    f = {
        "floordiv": lambda a, b: a // b,
        "mod": lambda a, b: a % b,
        "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "remainder": lambda a, b: torch.remainder(a, b),
        "fmod": lambda a, b: torch.fmod(a, b),
    }[op]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a.to(DEV), b.to(DEV)).cpu()
    assert torch.equal(f(a.to(DEV), torch.tensor([3, 2]).to(DEV)).cpu(), f(a, torch.tensor([3, 2])))
    # float division by zero is inf/nan on the CPU too: no check
    assert torch.isinf((a.float().to(DEV) / 0).cpu()).all()
    # zeros known when the program is built: XLA folds the division on the
    # host, where 0 / 0 in integers killed the process (SIGFPE)
    z = torch.zeros(2, dtype=torch.int64, device=DEV)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(z, z).cpu()


def test_an_op_that_throws_takes_its_checks_with_it():
    # remainder checks its zero divisor, then refuses the out= dtype; index_select
    # checks its index, then refuses out=. On the CPU nothing else is affected:
    # the next, unrelated results must not fail for the op that never ran.
    a, z = torch.tensor([5, 6, 7], device=DEV), torch.tensor([0, 1, 2], device=DEV)
    x, bad = torch.arange(4.0, device=DEV), torch.tensor([9], device=DEV)
    torch_pjrt.sync()
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.remainder(a, z, out=torch.empty(3, dtype=torch.bool, device=DEV))
    with pytest.raises(RuntimeError):
        torch.index_select(x, 0, bad, out=torch.empty(1, dtype=torch.int64, device=DEV))
    y = torch.arange(3.0, device=DEV) * 2
    assert y.cpu().tolist() == [0.0, 2.0, 4.0]
    torch_pjrt.sync(wait=True)
    # a check of an op that did run still fails its program
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (a // z).cpu()


def test_a_program_the_plugin_cannot_compile_names_its_stablehlo_op():
    y = torch.ones(1, 1, device=DEV).expand(2**31, 2**31).sum(0)  # 2^62 elements: the compiler refuses
    with pytest.raises(RuntimeError, match=r"(?s)compile.*in StableHLO line \d+: .*stablehlo.broadcast_in_dim.*"
                                           r"tensor<2147483648x2147483648xf32>"):
        y[:3].cpu()
    assert (torch.ones(3, device=DEV) * 2).sum().item() == 6.0  # the device goes on


def test_checks_can_be_turned_off():
    r = run_python(textwrap.dedent("""
        import torch, torch_pjrt
        x = torch.arange(5.0).to(torch_pjrt.device())
        y = x.index_select(0, torch.tensor([1, 7]).to(torch_pjrt.device()))
        y.cpu()
        print("no error")
    """), TORCH_PJRT_CHECKS="0")
    assert r.returncode == 0 and "no error" in r.stdout, r.stderr


def test_checks_add_no_recompiles_in_a_training_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Flatten(), torch.nn.Linear(24, 5)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 10, (4, 3)).to(DEV)
    y = torch.randint(0, 5, (4,)).to(DEV)
    for step in range(24):
        if step == 16:
            before = torch_pjrt.metrics.counters().get("compiles", 0)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        if step % 7 == 0:
            loss.item()
    assert torch_pjrt.metrics.counters().get("compiles", 0) == before


# -------------------------------------------------------- failed programs


def test_out_of_memory_before_a_launch_keeps_what_the_program_would_overwrite():
    w = torch.ones(4).to(DEV)
    torch_pjrt.sync()
    kept = torch.full((3,), 2.0).to(DEV)
    torch_pjrt.sync()
    w.mul_(10)  # pending, with w's buffer donated to the failing program
    fresh = torch.arange(4.0).to(DEV) + 1
    big = torch.zeros(2**37, device=DEV) + 1  # 512 GiB: more than the host has, refused before the launch
    # a PjrtError that device-agnostic code catches as torch.OutOfMemoryError
    with pytest.raises(torch_pjrt.PjrtError, match="RESOURCE_EXHAUSTED|memory") as failed:
        torch_pjrt.sync(wait=True)
    assert isinstance(failed.value, torch.OutOfMemoryError) and failed.value.code_name == "RESOURCE_EXHAUSTED"
    assert "not launched" in str(failed.value)
    for t in (fresh, big[:2]):  # made by the failed work: lost
        with pytest.raises(torch.OutOfMemoryError, match="lost"):
            t.cpu()
    assert w.cpu().tolist() == [1.0] * 4  # its value before the failed work (not lost: the buffer was not donated)
    assert kept.cpu().tolist() == [2.0, 2.0, 2.0]  # not written by the failed program
    fresh.copy_(torch.ones(4))  # a full overwrite makes a lost tensor usable again
    assert (fresh * 2).cpu().tolist() == [2.0] * 4
    # a tensor whose value had failed before stays failed through a rollback
    bad = torch.arange(4.0).to(DEV)[torch.tensor([10]).to(DEV)]
    torch_pjrt.sync()
    with pytest.raises(IndexError):
        bad.cpu()
    bad.fill_(7.0)
    big = torch.zeros(2**37, device=DEV) + 1
    with pytest.raises(torch.OutOfMemoryError):
        torch_pjrt.sync(wait=True)
    with pytest.raises(IndexError):
        bad.cpu()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_batch_size_search_goes_on_with_its_parameters(compiled):
    # A step too large for the host is refused before its launch: the
    # parameters and optimizer state keep their values (a launched program
    # would have taken them), and the smaller batch trains as on the CPU.
    # (SGD's state lives on the device; Adam's step count is a CPU tensor
    # that the failed step's Python code advanced.)
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 8)
    models = {"cpu": cpu, DEV: copy.deepcopy(cpu).to(DEV)}
    opts = {d: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for d, m in models.items()}

    def step(d, batch):
        width = 16 if batch <= 4 else 2**20  # the large batches: a (batch, 2^20) product, 4 TiB for the largest

        def loss_of(x):
            return (models[d](x) @ torch.ones(8, width, device=d)).tanh().mean()

        f = torch.compile(loss_of, backend="pjrt", dynamic=False) if compiled and d != "cpu" else loss_of
        opts[d].zero_grad()  # (a step that raised left its gradients)
        loss = f(torch.full((batch, 8), 0.5, device=d))
        loss.backward()
        opts[d].step()
        return loss.item()

    with pytest.raises(torch.OutOfMemoryError, match="not launched"):
        step(DEV, 2**20)
    # refused at loss.item(), after opt.step() traced (a compiled forward's
    # first call joins the step's trace too): the momentum buffers that step
    # made are lost with it
    with pytest.raises(torch.OutOfMemoryError, match=r"lost.*optimizer\.state\.clear\(\)"):
        step(DEV, 4)
    opts[DEV].state.clear()
    for d in models:
        step(d, 4)
    for batch in (2**20, 2**17):
        with pytest.raises(torch.OutOfMemoryError, match="not launched"):
            step(DEV, batch)
    for d in models:
        step(d, 4)
    for a, b in zip(models["cpu"].parameters(), models[DEV].parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="an address-space limit leaves ASan no room")
def test_out_of_memory_copying_to_the_device_is_out_of_memory():
    # the plugin's RESOURCE_EXHAUSTED from a host-to-device copy, inside
    # PyTorch's copy kernel, was a plain RuntimeError; the process goes on
    code = (
        "import resource, torch, torch_pjrt\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "keep = []\n"
        "try:\n"
        "    for i in range(40):\n"
        "        keep.append(torch.full((2**26,), float(i)).to('pjrt'))\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', 'copying' in str(e))\n"
        "keep.clear()\n"
        "print((torch.ones(2).to('pjrt') * 3).cpu().tolist())\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["OOM True", "[3.0, 3.0]"], r.stdout


@pytest.mark.parametrize("read", [lambda t: t.item(), lambda t: t.cpu(), lambda t: bool(t > 0), repr,
                                  lambda t: (t.expand(2**37) + 1)[:2].cpu()])
def test_out_of_memory_launched_by_a_read_is_out_of_memory(read):
    # a batch-size search catches torch.OutOfMemoryError wherever the failing
    # program was launched: here by the read itself
    big = torch.zeros(2**37, device=DEV) + 1  # 512 GiB, kept alive: the program must hold it
    with pytest.raises(torch.OutOfMemoryError, match="RESOURCE_EXHAUSTED|[Oo]ut of memory"):
        read(big.sum())
    del big
    assert (torch.arange(3.0, device=DEV) * 2).cpu().tolist() == [0.0, 2.0, 4.0]


def test_a_few_elements_of_a_pending_large_value_come_alone_to_the_host():
    # the pending value is computed first, then only the part is copied out
    # (the whole 64 MiB storage came to the host before)
    z = torch.zeros(2**24, device=DEV) + 1
    torch_pjrt.metrics.reset()
    assert z[5:7].cpu().tolist() == [1.0, 1.0]
    assert torch_pjrt.metrics.counters()["bytes_to_host"] < 1024


def test_out_of_memory_while_running_is_out_of_memory_and_random_numbers_go_on():
    # The XLA CPU plugin reports memory it cannot allocate when the program
    # runs as INTERNAL "Out of memory allocating"; the program drew random
    # numbers, so the device's random state buffer was its output: the
    # state it would have left (known on the host) is uploaded again and
    # draws go on, the same for the same seed.
    def attempt():
        torch.manual_seed(0)
        x = torch.rand(2**26, 1000, device=DEV)  # with the product below, over a TiB
        with pytest.raises(torch.OutOfMemoryError, match="[Oo]ut of memory"):
            (x @ torch.rand(1000, 4000, device=DEV)).sum().item()
        torch_pjrt.sync(wait=True)  # raised once, by the read: not again here
        drop = torch.nn.Dropout(0.5)
        return [drop(torch.ones(8, device=DEV)).cpu() for _ in range(2)]

    first, second = attempt(), attempt()
    for a, b in zip(first, second):
        assert torch.equal(a, b) and set(a.tolist()) <= {0.0, 2.0}
    assert not torch.equal(first[0], first[1])  # a stream, not a repeated state


def test_a_program_that_failed_while_running_is_raised_by_a_later_sync():
    # sync() launches without waiting, but raises the failure of a launch
    # found done since the last one; and the host runs at most 3 launches
    # ahead, so a loop that never reads waits for the older ones there (and
    # raises their failure). Before, every sync() of a batch-size search whose
    # programs failed while running returned, and the search went on as if
    # they fit. The programs fit the host (not refused at launch) but not the
    # process's data limit.
    code = textwrap.dedent("""
        import resource, torch, torch_pjrt
        resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))
        w = torch.ones(1000, 400, device="pjrt")
        torch_pjrt.sync(wait=True)
        raised, msg = None, ""
        for step in range(8):
            x = torch.rand(2**19, 1000, device="pjrt")  # 2 GiB
            y = (x @ w).sum()
            try:
                torch_pjrt.sync()
            except torch.OutOfMemoryError as e:
                raised, msg = step, str(e)
                break
        print("raised", raised, "launched earlier" in msg)
        del x, y
        print((torch.arange(3.0, device="pjrt") * 2).cpu().tolist())
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split("\n")
    # (step 0 where its program fails as it starts: found done at its own launch)
    assert lines[0] in [f"raised {k} True" for k in range(4)] and lines[1] == "[0.0, 2.0, 4.0]", r.stdout


def test_a_failure_absorbed_by_reading_the_random_state_is_still_raised_by_the_next_wait():
    # get_rng_state after a failed program that drew random numbers returns
    # the state (known on the host) instead of raising: the failure reaches
    # the user once, by the sync() that found it done (the program fails as
    # it starts here), else by sync(wait=True). The program fits the host
    # (its launch is not refused) but not the process's data limit: it fails
    # while running.
    code = textwrap.dedent("""
        import resource, torch, torch_pjrt
        resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))
        torch.manual_seed(0)
        x = torch.rand(2**19, 1000, device="pjrt")  # 2 GiB
        y = (x @ torch.rand(1000, 400, device="pjrt")).sum()
        reported = 0
        try:
            torch_pjrt.sync()
        except torch.OutOfMemoryError as e:
            reported += "ut of memory" in str(e)
        state = torch.pjrt.get_rng_state()
        print(state.dtype, state.numel())
        try:
            torch_pjrt.sync(wait=True)
        except torch.OutOfMemoryError as e:
            reported += "ut of memory" in str(e)
        print("OOM", reported)
        for _ in range(3):  # programs computed from the failed one, one after the other
            y = y + 1
            torch_pjrt.sync()
        try:
            y.item()
        except torch.OutOfMemoryError as e:  # the cause said once, not once per program
            print("chain", str(e).count("earlier program that failed"), str(e).count("dispatching"))
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:3] == ["torch.uint8 16", "OOM 1", "chain 1 0"], r.stdout + r.stderr[-2000:]


# ------------------------------------------------------- Ctrl-C and fork

_LONG = textwrap.dedent("""
    import sys, time, torch, torch_pjrt
    dev = torch_pjrt.device()
    x = torch.randn(1024, 1024).to(dev)
    w = torch.zeros(1024, 1024).to(dev)
    torch_pjrt.sync(wait=True)
    for _ in range(240):         # over a second even where the CPU plugin runs 1024^3 matmuls fast
        x = torch.tanh(x @ x)
    {update}
    torch_pjrt.sync()            # compiled and launched: the wait below is pure execution
    print("launched", flush=True)
    t0 = time.monotonic()
    try:
        {wait}
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted %.2f" % (time.monotonic() - t0), flush=True)
    print("after", (torch.ones(2).to(dev) * 3).cpu().tolist(), flush=True)
""")


@pytest.mark.parametrize("wait,update", [
    ("torch_pjrt.sync(wait=True)", ""), ("x.cpu()", ""), ("print(x.sum().item())", ""),
    # an in-place update (every optimizer step) donates w's buffer: the
    # interrupted wait no longer blocks on dropping it until the program ends
    ("torch_pjrt.sync(wait=True)", "w.add_(x)"),
])
def test_ctrl_c_interrupts_a_wait_within_a_second(wait, update):
    p = subprocess.Popen([sys.executable, "-c", _LONG.format(wait=wait, update=update)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("launched"), line + p.stderr.read()
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline()
        took = time.monotonic() - t0
        assert line.startswith("interrupted"), line + p.stderr.read()
        assert took < 1.0, took
        assert "after [3.0, 3.0]" in p.stdout.readline()  # the runtime stays usable
        assert p.wait(timeout=120) == 0
    finally:
        p.kill()


def test_ctrl_c_during_a_compile_that_reports_a_recompile_is_not_lost():
    # the recompile's report asks Python for the line (the GIL, and a pending
    # Ctrl-C with it): a Ctrl-C must not be swallowed there. It now lands in
    # the compile's wait (raised at once); the report and the work are kept
    # for the sync that comes again (below, a different program: one more
    # compile).
    code = textwrap.dedent("""
        import os, signal, threading, time, torch, torch_pjrt
        def trace(n):
            x, w = torch.zeros(n, device="pjrt"), torch.ones(n, device="pjrt")
            for i in range(430):  # about 3000 ops: a compile of seconds
                x = x * 0.999 + w * (i % 7) * 1e-3
            return x
        trace(8).cpu()  # the graph's first shape
        x = trace(9)    # the same graph at another shape: a recompile, reported
        threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
        try:
            torch_pjrt.sync(wait=True)
            time.sleep(3)
            print("lost")
        except KeyboardInterrupt:
            print("interrupted")
        print("after", (torch.ones(2, device="pjrt") * 3).cpu().tolist())
    """)
    r = run_python(code, timeout=170)
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["interrupted", "after [3.0, 3.0]"], r.stdout + r.stderr


def test_ctrl_c_interrupts_a_compile_and_the_work_stays_pending():
    # A compile runs on a thread of its own; Ctrl-C raises within the wait's
    # 50 ms while it goes on. The work stays pending: the next sync of the
    # same program takes that compile over, with the CPU's values. A SIGINT
    # handler of the program's own runs after the compile, as before (it
    # may use pjrt). One more interrupted right before exit: exit waits for
    # it (tearing the plugin down under a running compile would crash).
    code = textwrap.dedent("""
        import os, signal, sys, threading, time, torch, torch_pjrt
        from torch_pjrt import metrics
        def trace(x, w, n):
            for i in range(n):  # 4 ops per step (2000 ops, 5002 IR nodes): a compile of seconds
                x = x * 0.999 + w * (i % 7) * 1e-3
            return x
        def interrupt_soon():
            threading.Thread(target=lambda: (time.sleep(0.4), os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
            t0 = time.monotonic()
            try:
                torch_pjrt.sync(wait=True)
                return None
            except KeyboardInterrupt:
                return time.monotonic() - t0
        x = trace(torch.zeros(8, device="pjrt"), torch.ones(8, device="pjrt"), 500)
        print("interrupted after", interrupt_soon())
        got = x.cpu()
        c = metrics.counters()
        want = trace(torch.zeros(8), torch.ones(8), 500)
        print("resumed", c["compiles_interrupted"], c["compiles_resumed"], c["compiles"], torch.allclose(got, want))
        ran = []  # a handler of the program's own, using pjrt: run after the compile
        signal.signal(signal.SIGINT, lambda *_: ran.append((torch.ones(2, device="pjrt") * 2).cpu().tolist()))
        z = trace(torch.zeros(10, device="pjrt"), torch.ones(10, device="pjrt"), 500)
        print("own handler", interrupt_soon(), ran, torch.allclose(z.cpu(), trace(torch.zeros(10), torch.ones(10), 500)))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        y = trace(torch.zeros(9, device="pjrt"), torch.ones(9, device="pjrt"), 500)
        print("interrupted after", interrupt_soon(), flush=True)
    """)
    r = run_python(code, timeout=170, TORCH_PJRT_CACHE_DIR=None)  # (a disk-cache hit would compile nothing)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 4, r.stdout + r.stderr
    for line in lines[0], lines[3]:  # SIGINT at 0.4 s; the compiles take seconds
        took = line.split()[-1]
        assert line.startswith("interrupted after") and took != "None" and float(took) < 1.2, r.stdout + r.stderr
    assert lines[1] == "resumed 1 1 1 True", r.stdout + r.stderr
    # (run in the middle of the sync, it would have entered the sync again)
    assert lines[2] == "own handler None [[2.0, 2.0]] True", r.stdout + r.stderr


def test_fork_child_gets_a_clear_error_and_no_hang():
    r = run_python(textwrap.dedent("""
        import os, torch, torch_pjrt
        dev = torch_pjrt.device()
        kept = torch.ones(3).to(dev) * 2
        kept.cpu()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                torch.ones(2, device=dev).cpu()
                code = 3
            except RuntimeError as e:
                code = 0 if "forked subprocess" in str(e) and "spawn" in str(e) else 4
            try:
                kept.cpu()
                code = 5
            except RuntimeError:
                pass
            assert torch.pjrt._is_in_bad_fork()
            del kept  # inherited tensors are dropped without calling the plugin
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        print("parent", kept.cpu().tolist(), torch.pjrt._is_in_bad_fork())
    """), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "child 0" in r.stdout and "parent [2.0, 2.0, 2.0] False" in r.stdout, r.stdout + r.stderr


def test_dataloader_fork_workers_and_spawn_children_work(tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_pjrt
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader, TensorDataset

        def child(q):
            import torch, torch_pjrt
            q.put((torch.arange(3.0).to(torch_pjrt.device()) + 1).cpu().tolist())

        class OnDevice(torch.utils.data.Dataset):  # a mistake: workers must return CPU tensors
            def __len__(self):
                return 2
            def __getitem__(self, i):
                return torch.ones(2, device="pjrt") * i

        if __name__ == "__main__":
            dev = torch_pjrt.device()
            w = torch.ones(4).to(dev)
            data = TensorDataset(torch.arange(8.0))
            total = sum(float((b[0].to(dev) * w[0]).sum().cpu()) for b in
                        DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context="fork"))
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            print("total", total, "spawn", q.get(timeout=120))
            p.join()
            try:  # the worker's pickling error reaches the loop instead of hanging it
                next(iter(DataLoader(OnDevice(), batch_size=2, num_workers=1, multiprocessing_context="spawn")))
            except RuntimeError as e:
                print("worker refused:", e)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "total 28.0 spawn [1.0, 2.0, 3.0]" in r.stdout, r.stdout + r.stderr
    assert "worker refused: a pjrt tensor cannot be shared" in r.stdout and "return CPU tensors" in r.stdout, r.stdout


def test_sending_a_pjrt_tensor_to_another_process_is_a_clear_error():
    # torch.multiprocessing shares tensors (CPU: shared memory, CUDA: IPC);
    # PJRT buffers cannot be shared, and a silent copy would break Hogwild
    from multiprocessing.reduction import ForkingPickler
    model = torch.nn.Linear(2, 2).to(DEV)
    model.share_memory()
    for obj in (torch.ones(3).to(DEV), model.weight, model, torch.ones(3).to(DEV).untyped_storage()):
        with pytest.raises(RuntimeError, match="pjrt tensor cannot be shared with another process.*t.cpu()"):
            ForkingPickler.dumps(obj)
    assert len(ForkingPickler.dumps(torch.ones(3))) > 0  # CPU tensors are shared as before


# ------------------------------------------------------- needless recompiles


def test_equal_python_numbers_do_not_change_the_program():
    a = torch.ones(4).to(DEV)
    (a * 0.3 + a * 0.7).cpu()
    before = torch_pjrt.metrics.counters().get("compiles", 0)
    (a * 0.3 + a * 0.3).cpu()
    (a * 0.5 + a * 0.1).cpu()
    assert torch_pjrt.metrics.counters().get("compiles", 0) == before


def test_a_check_failing_on_one_replica_fails_the_replicated_program():
    with torch_pjrt.replicated() as r:
        n = r.replicas if hasattr(r, "replicas") else torch_pjrt.device_count()
        x = torch_pjrt._C._shard([torch.arange(5.0)] * n)
        idx = torch_pjrt._C._shard([torch.tensor([1])] * (n - 1) + [torch.tensor([9])])
        y = x.index_select(0, idx)
        with pytest.raises(IndexError, match="index_select"):
            torch_pjrt.sync(wait=True)
    with pytest.raises(IndexError):
        y.cpu()


def test_index_copy_wants_int64_indices_as_on_the_cpu():
    a, i, s = torch.zeros(3, 2), torch.tensor([1], dtype=torch.int32), torch.ones(1, 2)
    with pytest.raises(RuntimeError, match="Expected a long tensor for index"):
        a.index_copy(0, i, s)
    with pytest.raises(RuntimeError, match="Expected a long tensor for index"):
        a.to(DEV).index_copy(0, i.to(DEV), s.to(DEV))
    # index_add takes int32 on both
    assert torch.equal(a.to(DEV).index_add(0, i.to(DEV), s.to(DEV)).cpu(), a.index_add(0, i, s))
