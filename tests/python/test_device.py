"""The pjrt device: registration, transfers, sync semantics, RNG, bad input."""

import os
import re
import time

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import run_python

DEV = torch_pjrt.device()


def test_registration():
    assert torch._C._get_privateuse1_backend_name() == "pjrt"
    assert torch_pjrt.device() == torch.device("pjrt:0")
    assert torch_pjrt.device_count() == 4  # the CPU plugin's default
    assert torch.device("pjrt").type == "pjrt"
    t = torch.ones(2).pjrt()
    assert t.is_pjrt and t.device == torch.device("pjrt:0")
    assert torch.pjrt.device_count() == 4 and torch.pjrt.is_available()
    assert torch.ones(2, device="pjrt:3").device.index == 3


def test_device_index_out_of_range_names_the_count():
    with pytest.raises(IndexError, match="there are 4 pjrt device"):
        torch_pjrt.device(4)
    with pytest.raises((IndexError, RuntimeError), match="4 pjrt device"):
        torch.zeros(2, device="pjrt:9")
    with pytest.raises(TypeError, match="takes a device index"):  # a string is not an index
        torch_pjrt.device("pjrt:3")
    with pytest.raises(TypeError, match="takes a directory path"):  # not a directory named "123"
        torch_pjrt.runtime.initialize_cache(123)
    import numpy as np
    assert torch_pjrt.device(np.int64(2)) == torch.device("pjrt:2")


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(dtype):
    x = (torch.randn(3, 4) * 50).to(dtype) if dtype != torch.bool else torch.randn(3, 4) > 0
    d = x.to(DEV)
    assert d.dtype == dtype and d.shape == x.shape
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)


def test_unsupported_dtype_is_a_clear_error():
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # PJRT has the type; torch-pjrt does not carry it
        with pytest.raises(NotImplementedError, match="not supported on the pjrt device: torch-pjrt does not handle 8-bit"):
            torch.zeros(2, dtype=dtype).to(DEV)
    with pytest.raises(NotImplementedError, match="PJRT has no buffer type"):
        torch.zeros(2, dtype=torch.complex32).to(DEV)
    # in an operator too (a TypeError there became "unsupported operand type(s)")
    h = torch.ones(2, dtype=torch.half).to(DEV)
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on the pjrt device"):
        h + 1j
    with pytest.raises(NotImplementedError, match="ComplexHalf is not supported on the pjrt device"):
        h * torch.tensor(1j).to(DEV)


def test_sparse_quantized_and_nested_tensors_are_clear_errors():
    coo = torch.eye(3).to_sparse()
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on pjrt"):
        coo.to(DEV)
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on pjrt"):
        torch.eye(3, device=DEV).to_sparse()
    # compressed layouts are assembled from dense parts: refused where they are made
    crow, col, v = (torch.tensor(x, device=DEV) for x in ([0, 1, 2], [0, 1], [1.0, 2.0]))
    for make in (lambda: torch.eye(3).to_sparse_csr().to(DEV), lambda: torch.eye(2, device=DEV).to_sparse_csr(),
                 lambda: torch.sparse_csr_tensor(crow, col, v, (2, 2)), lambda: torch.sparse_csc_tensor(crow, col, v),
                 lambda: torch.sparse_bsr_tensor(crow, col, v.view(2, 1, 1), (2, 2))):
        with pytest.raises(NotImplementedError, match="sparse tensors are not supported on pjrt"):
            make()
    q = torch.quantize_per_tensor(torch.rand(3), 0.1, 0, torch.quint8)
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported on pjrt"):
        q.to(DEV)
    nt = torch.nested.nested_tensor([torch.rand(2), torch.rand(3)])
    with pytest.raises(NotImplementedError, match="nested tensors are not supported on pjrt"):
        nt.to(DEV)
    # made on pjrt (with requires_grad, autograd aborted the process at its first op)
    parts = [torch.rand(2, 3), torch.rand(4, 3)]
    for make in (lambda: torch.nested.nested_tensor(parts, device=DEV, requires_grad=True),
                 lambda: torch.nested.as_nested_tensor(parts, device=DEV),
                 lambda: torch.nested.as_nested_tensor(parts, None, DEV),
                 lambda: torch.nested.nested_tensor([p.to(DEV) for p in parts])):
        with pytest.raises(NotImplementedError, match="nested tensors are not supported on pjrt"):
            make()
    jagged = torch.nested.nested_tensor([p.to(DEV) for p in parts], layout=torch.jagged)  # Python tensors: fine
    torch.testing.assert_close((jagged * 2).values().cpu(), torch.cat(parts) * 2)
    torch.testing.assert_close(coo.to_dense().to(DEV).cpu(), torch.eye(3))  # the advice works


def test_scalars_and_empty_tensors():
    z = torch.tensor(3.5, device=DEV)
    assert z.dim() == 0 and z.item() == 3.5
    e = torch.empty(0, 3, device=DEV)
    assert e.cpu().shape == (0, 3)
    assert (e.sum(0).cpu() == 0).all()
    assert torch.zeros(2, 3, device=DEV).sum().item() == 0


def test_one_sync_runs_one_program_for_all_pending_tensors():
    torch_pjrt.sync(wait=True)
    a = torch.randn(4, 4).to(DEV)
    b = a * 2
    c = a + 1
    d = b @ c
    before = torch_pjrt.metrics.counters().get("executions", 0)
    torch_pjrt.sync()
    assert torch_pjrt.metrics.counters()["executions"] == before + 1
    assert not torch_pjrt._C._is_pending(b) and not torch_pjrt._C._is_pending(d)
    torch.testing.assert_close(d.cpu(), (a.cpu() * 2) @ (a.cpu() + 1))


def test_sync_drops_work_whose_results_were_all_discarded():
    # Nothing to run, but the trace must not keep the dead nodes (and the
    # input buffers their parameters hold) until some later sync has work.
    torch_pjrt.sync(wait=True)
    a = torch.randn(8, 8).to(DEV)
    runs = torch_pjrt.metrics.counters().get("executions", 0)
    for _ in range(3):
        for _ in range(20):
            a * 2  # noqa: B018 (discarded on purpose)
        assert torch_pjrt._C._trace_nodes(0) >= 20
        torch_pjrt.sync()
        assert torch_pjrt._C._trace_nodes(0) == 0
    assert torch_pjrt.metrics.counters().get("executions", 0) == runs
    torch.testing.assert_close((a + 1).cpu(), a.cpu() + 1)


def test_a_trace_repeating_the_last_one_in_part_computes_its_own_values():
    # A trace takes over the nodes of the previous one while they repeat
    # (ir::Builder::Restart); these repeat it up to a node that differs in
    # the dtype it converts to, a number, a shape or the program's length.
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    xd = x.to(DEV)
    steps = [
        lambda t: (t * 2).to(torch.float64) + 1,
        lambda t: (t * 2).to(torch.int32) + 1,
        lambda t: (t * 2).to(torch.int32) + 3,
        lambda t: (t * 2).view(torch.int32) + 3,
        lambda t: (t * 2)[:, :2].sum(0),
        lambda t: (t * 2)[:1].sum(0),
        lambda t: t * 2,
        lambda t: (t * 2)[:1].sum(0),
    ]
    for step in steps * 2:
        want, got = step(x), step(xd).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_item_and_print_materialize():
    x = torch.arange(5.0, device=DEV) * 3
    assert x.sum().item() == 30.0
    assert "12." in str(x)
    assert torch.equal(x.cpu(), torch.arange(5.0) * 3)


def _as_the_cpu_prints(text: str) -> str:
    """A repr without the device suffix; the line breaks before suffixes
    (which depend on the suffixes' lengths) as single spaces."""
    return re.sub(r",\s+(dtype=|size=|requires_grad=|grad_fn=)", r", \1", re.sub(r",\s*device='pjrt:0'", "", text))


PRINT_CASES = [
    lambda: torch.tensor(2.5), lambda: torch.tensor(-7), lambda: torch.tensor(True),
    lambda: torch.randn(5, 7), lambda: torch.randn(4, 3, 2) * 1e6, lambda: torch.randn(3, 5) * 1e-6,
    lambda: torch.tensor([1.0, float("inf"), float("nan"), -0.0, 3.0]), lambda: torch.arange(12.0).view(3, 4),
    lambda: torch.randn(2000), lambda: torch.randn(40, 50), lambda: torch.randn(9, 8, 7, 6) * 100,
    lambda: torch.randn(64, 3, 5), lambda: torch.randint(-1000, 1000, (30, 40)), lambda: torch.rand(50, 30) > 0.5,
    lambda: torch.randn(40, 30).to(torch.bfloat16), lambda: torch.randn(7, 300).half(),
    lambda: torch.randn(30, 40, dtype=torch.complex64), lambda: torch.randn(3, 4, dtype=torch.float64),
    lambda: torch.randint(0, 255, (20, 70), dtype=torch.uint8), lambda: torch.zeros(0, 3), lambda: torch.tensor([]),
    # the CPU's index_put, which the summary's host copy used, has no kernel for these
    lambda: torch.randint(0, 60000, (30, 70)).to(torch.uint16), lambda: torch.arange(2000).to(torch.uint32),
    lambda: (torch.arange(1500) * 2**40).to(torch.uint64),
]
NO_NEG_ON_THE_CPU = (torch.bool, torch.uint16, torch.uint32, torch.uint64)
PRINT_VIEWS = [
    lambda t: t,
    lambda t: t.t() if t.dim() == 2 else t,
    lambda t: t[..., ::2] if t.dim() else t,
    lambda t: t.conj() if t.is_complex() else t if t.dtype in NO_NEG_ON_THE_CPU else torch._neg_view(t),
]


@pytest.mark.parametrize("options", [{}, {"threshold": 10, "edgeitems": 2}, {"threshold": 5, "edgeitems": 0},
                                     {"precision": 2, "sci_mode": True, "linewidth": 40}])
def test_print_shows_what_the_cpu_shows(options):
    """repr of a pjrt tensor (computed or pending, strided, conjugate and
    negative views, summarized or not, every print option) is the CPU's
    with the device named."""
    torch.manual_seed(0)
    with torch._tensor_str.printoptions(**options):
        for make in PRINT_CASES:
            cpu = make()
            computed = cpu.to(DEV)
            torch_pjrt.sync()
            for on_device in (computed, computed.clone()):  # the clone is pending
                for view in PRINT_VIEWS:
                    want, got = (_as_the_cpu_prints(repr(view(t))) for t in (cpu, on_device))
                    assert got == want, (options, tuple(cpu.shape), cpu.dtype)
    assert "device='pjrt:0'" in repr(computed)


def test_print_runs_no_program_for_a_computed_tensor_and_one_for_a_summary():
    """torch formats with tensor ops (masked_select, min, max, item per
    element): on the device each was a program, print(loss) compiled one
    every time. Only what is printed is read."""
    loss = torch.randn(8, device=DEV).square().mean()
    small, large = torch.randn(5, 7, device=DEV), torch.randn(64, 64, 64, device=DEV)
    param = torch.nn.Parameter(torch.randn(3, device=DEV))
    torch_pjrt.sync()
    for _ in range(2):
        torch_pjrt.metrics.reset()
        text = [repr(t) for t in (loss, small, param, loss * 2)]
        counters = torch_pjrt.metrics.counters()
        assert counters.get("executions", 0) == 1 and text[3] == repr(loss.cpu() * 2).replace(")", ", device='pjrt:0')")
        assert text[2].startswith("Parameter containing:") and text[2].endswith("device='pjrt:0', requires_grad=True)")
        want = repr(large.cpu())
        torch_pjrt.metrics.reset()
        assert _as_the_cpu_prints(repr(large)) == want
        counters = torch_pjrt.metrics.counters()
        assert counters.get("executions", 0) == 1 and counters.get("bytes_to_host", 0) < 6**3 * 4 * 2


def test_printing_a_large_tensor_touches_no_host_copy_of_it():
    """The summarized contents come from an uninitialized host tensor of the
    full shape whose untouched pages cost nothing: also in deterministic
    mode (which fills new memory) and with edgeitems=0."""
    import resource
    x = torch.zeros(2**26, device=DEV) + 1  # 256 MiB
    torch_pjrt.sync(wait=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        text = repr(x)
        with torch._tensor_str.printoptions(edgeitems=0):
            summary = repr(x.view(2**13, 2**13))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert text.startswith("tensor([1., 1., 1.,  ..., 1., 1., 1.]") and "..." in summary
    assert grown_mib < 64, grown_mib


def test_buffers_are_donated_when_overwritten():
    p = torch.randn(64, 64)
    d = p.to(DEV)
    keep = d * 1  # a second tensor computed from d's old contents
    torch_pjrt.sync(wait=True)
    before = torch_pjrt.metrics.counters().get("donated_buffers", 0)
    d.mul_(2)
    torch_pjrt.sync()
    assert torch_pjrt.metrics.counters().get("donated_buffers", 0) == before + 1
    torch.testing.assert_close(d.cpu(), p * 2)
    torch.testing.assert_close(keep.cpu(), p)
    # a buffer that another live tensor still reads is not donated
    alias = d.view(-1)
    other = d + 0
    torch_pjrt.sync(wait=True)
    before = torch_pjrt.metrics.counters().get("donated_buffers", 0)
    d.add_(1)
    torch_pjrt.sync(wait=True)
    torch.testing.assert_close(alias.cpu(), (p * 2 + 1).reshape(-1))
    torch.testing.assert_close(other.cpu(), p * 2)


def test_hard_target_update_keeps_one_program_per_step_kind():
    """DQN's target network: target.load_state_dict(online) every few steps
    gives each pair one value. Which of the two donates its old buffer to it
    is decided the same way every time (it depended on the storages'
    addresses, so programs kept appearing: 21 compiles in 60 steps of an
    8-layer DQN), and the values are the CPU's."""
    online = [torch.zeros(16) for _ in range(8)]
    target = [torch.zeros(16) for _ in range(8)]
    dev_online = [t.to(DEV) for t in online]
    dev_target = [t.to(DEV) for t in target]
    compiles = []
    for step in range(30):
        for on, tg in ((online, target), (dev_online, dev_target)):
            x = torch.full((16,), 0.01 * step).to(on[0].device)
            y = sum((t * x).sum() for t in tg)
            for t in on:
                t.add_(x * y + 0.1)
            if step % 3 == 0:
                for b, a in zip(tg, on):
                    b.copy_(a)
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))
    for a, b in zip(dev_online + dev_target, online + target):
        torch.testing.assert_close(a.cpu(), b)
    assert len(set(compiles[6:])) == 1, compiles


def test_memory_allocated_counts_what_tensors_hold_across_donating_steps():
    p = torch.zeros(1 << 14, device=DEV)

    def step():
        p.add_(1)  # the old buffer is donated to the new value
        scratch = p * 2  # read and dropped within the step
        del scratch
        torch_pjrt.sync()  # no wait: the launch may still be in flight

    step()
    torch_pjrt.sync(wait=True)
    held = torch_pjrt.runtime.memory_allocated()  # p, and what the step keeps (cached scalars)
    for i in range(3):
        step()
        assert torch_pjrt.runtime.memory_allocated() == held, i
    torch_pjrt.sync(wait=True)
    assert torch.equal(p.cpu(), torch.full((1 << 14,), 4.0))
    del p
    assert torch_pjrt.runtime.memory_allocated() == held - (1 << 14) * 4


def test_runtime_memory_calls_take_a_device_as_torch_pjrts_do():
    R = torch_pjrt.runtime
    before = R.memory_allocated(2)
    x = torch.ones(1 << 12, device="pjrt:2")
    torch_pjrt.sync(wait=True)
    for dev in (2, "pjrt:2", torch.device("pjrt", 2)):
        assert R.memory_allocated(dev) == before + (1 << 14) == torch.pjrt.memory_allocated(dev)
        assert R.device_memory_stats(dev)["allocated_bytes.all.current"] == before + (1 << 14)
        assert R.max_memory_allocated(dev) >= before + (1 << 14)
    for bad in (7, "pjrt:9"):  # one error for every call, as torch.pjrt's
        for fn in (R.memory_allocated, R.device_memory_stats, R.memory_stats):
            with pytest.raises(IndexError, match="out of range"):
                fn(bad)
    with pytest.raises(ValueError, match="expected a pjrt device"):
        R.memory_allocated("cpu")
    del x


def test_exception_mid_step_leaves_device_usable():
    x = torch.randn(3, 4).to(DEV)
    with pytest.raises(RuntimeError):
        y = x * 2
        y @ torch.randn(5, 5).to(DEV)  # shape error inside the traced step
    z = (x + 1).sum()
    torch.testing.assert_close(z.cpu(), (x.cpu() + 1).sum())


def test_manual_seed_makes_device_rng_deterministic():
    torch_pjrt.manual_seed(123)
    a = torch.rand(1000, device=DEV).cpu()
    torch_pjrt.manual_seed(123)
    b = torch.rand(1000, device=DEV).cpu()
    c = torch.rand(1000, device=DEV).cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean().item() - 0.5) < 0.05
    torch.manual_seed(7)  # also seeds pjrt through the device module
    n = torch.randn(20000, device=DEV).cpu()
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    r = torch.randint(3, 9, (5000,), device=DEV).cpu()
    assert r.min() == 3 and r.max() == 8
    x = torch.ones(10000, device=DEV)
    y = torch.nn.functional.dropout(x, 0.25, training=True).cpu()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.03 and torch.allclose(y[y != 0], torch.tensor(1 / 0.75))


@pytest.mark.parametrize("call", [lambda t: t.uniform_(2, 1), lambda t: t.uniform_(0, float("inf")),
                                  lambda t: t.uniform_(float("-inf"), 0), lambda t: t.uniform_(float("nan"), 1),
                                  lambda t: t.uniform_(-3e38, 3e38), lambda t: torch.nn.init.trunc_normal_(t, a=2, b=1),
                                  lambda t: torch.rand(3, dtype=torch.int64, device=t.device)],
                         ids=["from>to", "inf", "-inf", "nan", "span", "trunc_normal", "int"])
def test_uniform_refuses_the_bounds_the_cpu_refuses(call):
    # they once drew from (to, from), or filled inf or NaN
    with pytest.raises(Exception) as cpu:
        call(torch.empty(4))
    with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
        call(torch.empty(4, device=DEV))


def test_uniform_of_complex_draws_both_parts_as_the_cpu():
    z = torch.empty(4000, dtype=torch.complex64, device=DEV).uniform_(2, 3).cpu()
    assert z.dtype == torch.complex64
    for part in (z.real, z.imag):
        assert 2 <= part.min() and part.max() < 3 and abs(part.mean().item() - 2.5) < 0.05
    assert not torch.equal(z.real, z.imag)


@pytest.mark.parametrize("dtype,values", [(torch.bfloat16, 64), (torch.float16, 512)])
def test_half_uniform_covers_from_to_as_the_cpu(dtype, values):
    # uniform_(2, 3) of a half type once returned 3.0 (the excluded bound)
    # and drew (-1, 1) from a coarse grid (no value in 0 < |v| < 2**-8):
    # scaled in float and rounded once now, a value rounded up to `to`
    # becomes `from`, as the CPU's kernel.
    r = torch.empty(400000, dtype=dtype, device=DEV).uniform_(2, 3).float().cpu()
    assert 2 <= r.min() and r.max() < 3 and r.unique().numel() == values
    share = torch.stack([(r == 2).float().mean(), (r == r.max()).float().mean()]) * values
    assert ((share - 1).abs() < 0.15).all(), share  # every value of [2, 3) alike, the ends too
    s = torch.empty(400000, dtype=dtype, device=DEV).uniform_(-1, 1).float().cpu()
    assert s.abs()[s != 0].min() < 1e-4 and s.unique().numel() > (1000 if dtype == torch.bfloat16 else 8000)  # the coarse grid: 384 and 3072


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_normal_of_complex_splits_the_variance_between_the_parts_as_the_cpu(dtype):
    # complex randn / normal_ once raised "normal_ expects a floating point tensor"
    z = torch.randn(20000, dtype=dtype, device=DEV).cpu()
    w = torch.empty(20000, dtype=dtype, device=DEV).normal_(2.0, 3.0).cpu()
    assert z.dtype == w.dtype == dtype
    for part in (z.real, z.imag):  # N(0, 1/2) each, as the CPU's view_as_real draw
        assert abs(part.mean().item()) < 0.03 and abs(part.var().item() - 0.5) < 0.03
    for part in (w.real, w.imag):  # N(2, 9/2)
        assert abs(part.mean().item() - 2) < 0.1 and abs(part.var().item() - 4.5) < 0.25
    assert abs(torch.corrcoef(torch.stack([z.real, z.imag]))[0, 1].item()) < 0.05
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.empty(2, dtype=dtype, device=DEV).normal_(0, -1)


def test_autoload_through_torch_backends_entry_point():
    r = run_python("import torch; print(torch.ones(2, device='pjrt').cpu().tolist())")
    assert r.returncode == 0, r.stderr
    assert "[1.0, 1.0]" in r.stdout


def test_missing_plugin_is_a_clear_error():
    r = run_python("import torch_pjrt, torch; torch.ones(2, device='pjrt')", TORCH_PJRT_PLUGIN="/nonexistent/p.so")
    assert r.returncode != 0
    assert "not found" in r.stderr and "TORCH_PJRT_PLUGIN" in r.stderr


def test_multiple_devices_are_independent():
    a = torch.ones(3, device="pjrt:1") * 2
    b = torch.ones(3, device="pjrt:2") * 3
    assert a.cpu().tolist() == [2, 2, 2] and b.cpu().tolist() == [3, 3, 3]
    c = a.to("pjrt:2") + b
    assert c.device.index == 2 and c.cpu().tolist() == [5, 5, 5]
    with pytest.raises(RuntimeError, match="same pjrt device"):
        (a + b).cpu()


def test_rng_state_saves_and_restores_the_stream_position():
    torch_pjrt.manual_seed(7)
    torch.rand(3, device=DEV).cpu()  # move the stream past the seed
    state = torch.pjrt.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.rand(5, device=DEV).cpu()
    b = torch.rand(5, device=DEV).cpu()
    assert not torch.equal(a, b)
    torch.pjrt.set_rng_state(state)
    assert torch.equal(torch.rand(5, device=DEV).cpu(), a)
    assert torch.equal(torch.rand(5, device=DEV).cpu(), b)
    torch_pjrt.manual_seed(7)
    assert not torch.equal(torch.pjrt.get_rng_state(), state)  # a state is a position, not the seed
    with pytest.raises(ValueError, match="16-byte"):
        torch.pjrt.set_rng_state(torch.zeros(2, dtype=torch.int64))


def test_a_pjrt_generator_is_its_own_stream():
    g = torch.Generator(device=DEV)
    assert g.device == torch.device(DEV) and g.initial_seed() == torch.Generator().initial_seed()

    def draws(gen):
        kw = {"device": DEV} if gen is None else {"device": DEV, "generator": gen}
        ones = torch.ones(6, device=DEV)
        return [torch.randn(10, **kw), torch.rand(7, dtype=torch.float64, **kw), torch.randint(0, 9, (5,), **kw),
                torch.randperm(8, **kw), torch.bernoulli(ones / 2, generator=gen), torch.multinomial(ones, 3, generator=gen),
                torch.poisson(ones * 3, generator=gen), torch.empty(4, device=DEV).exponential_(generator=gen),
                torch.normal(torch.zeros(3, device=DEV), 1.0, generator=gen)]

    # seeded with s, it yields what the default stream yields after manual_seed(s)
    g.manual_seed(11)
    mine = [t.cpu() for t in draws(g)]
    torch_pjrt.manual_seed(11)
    default = [t.cpu() for t in draws(None)]
    assert all(torch.equal(a, b) for a, b in zip(mine, default))
    # consecutive draws differ, and a new draw from the generator compiles nothing
    assert not torch.equal(torch.rand(8, device=DEV, generator=g).cpu(), torch.rand(8, device=DEV, generator=g).cpu())
    torch_pjrt.metrics.reset()
    torch.rand(8, device=DEV, generator=g).cpu()
    assert torch_pjrt.metrics.counters().get("compiles", 0) == 0  # the key and counter are inputs
    # its draws leave the default stream where it was
    torch_pjrt.manual_seed(3)
    want = torch.rand(4, device=DEV).cpu()
    torch_pjrt.manual_seed(3)
    torch.rand(100, device=DEV, generator=g)
    assert torch.equal(torch.rand(4, device=DEV).cpu(), want)
    # get_state / set_state replay the stream
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.rand(5, device=DEV, generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(5, device=DEV, generator=g).cpu(), a)
    # a generator of another device is refused, as CUDA refuses it
    with pytest.raises(RuntimeError, match="Expected a 'pjrt' device type for generator but found 'cpu'"):
        torch.rand(3, device=DEV, generator=torch.Generator())
    # and a pjrt generator given to a CPU op (PyTorch dispatches on the
    # generator's device too, so the pjrt kernel sees the CPU tensor)
    for draw in (lambda: torch.randn(3, generator=g), lambda: torch.empty(3).uniform_(generator=g),
                 lambda: torch.bernoulli(torch.full((3,), 0.5), generator=g),
                 lambda: torch.multinomial(torch.ones(4), 2, generator=g),
                 lambda: torch.poisson(torch.ones(3), generator=g),
                 lambda: torch.randperm(6, generator=g),  # a factory: "tensors on cpu among pjrt tensors"
                 lambda: torch.utils.data.random_split(range(6), [3, 3], generator=g)):
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'pjrt'"):
            draw()
    if torch_pjrt.device_count() > 1:
        with pytest.raises(RuntimeError, match="generator of pjrt:1 was given to an op on pjrt:0"):
            torch.rand(3, device="pjrt:0", generator=torch.Generator(device="pjrt:1"))


def test_in_place_ops_from_threads_on_one_tensor_lose_no_update():
    # An in-place op reads its tensor's pending value and writes the result
    # in one step under the runtime's lock: threads updating one tensor (a
    # shared counter, a parameter averaged in place) interleave whole ops.
    import threading

    x = torch.zeros(1000, device=DEV)
    view = x[250:750]
    every, ones = torch.arange(1000, device=DEV), torch.ones(1000, device=DEV)
    torch_pjrt.sync()

    def work():
        for i in range(60):
            x.add_(1) if i % 2 else x.sub_(-1)
            view.mul_(1)
            x.index_add_(0, every, ones)
        torch_pjrt.sync()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(x.cpu(), torch.full((1000,), 480.0))


def test_torch_save_of_a_pending_tensor_lets_other_threads_run():
    # torch.save and pickle read a tensor through PyTorch's storage copy,
    # which keeps the GIL: the wait for the tensor's program froze every
    # other Python thread (a 10 ms ticker stalled 1.7 s). The wait releases it.
    import io
    import threading
    import time

    a = torch.randn(1500, 1500, device=DEV) / 40

    def work(x):
        for _ in range(24):
            x = torch.tanh(x @ a)
        return x

    work(a).sum().item()  # compiled once
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.005)

    result = work(a)
    torch_pjrt.sync()  # running now
    thread = threading.Thread(target=ticker)
    thread.start()
    while not ticks:
        time.sleep(0.001)
    start, before = time.perf_counter(), len(ticks)
    saved = io.BytesIO()
    torch.save(result, saved)
    waited, ticked = time.perf_counter() - start, len(ticks) - before
    stop.set()
    thread.join()
    if waited > 0.1:  # the program was still running
        assert ticked >= 5, (waited, ticked)
    saved.seek(0)
    assert torch.equal(torch.load(saved).cpu(), result.cpu())


def test_a_trace_grown_far_past_a_step_warns_once_before_any_compile():
    # A loop that never syncs: the warning comes while it runs (the compile
    # of such a trace would take minutes and gigabytes), once per process.
    code = """
import warnings, torch, torch_pjrt
x = torch.zeros(3, device=torch_pjrt.device())
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for i in range(80000):
        x.add_(1)
print(len(w), w[0].category.__name__, torch_pjrt.metrics.counters().get("compiles", 0))
print(w[0].message)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    count, category, compiles = r.stdout.splitlines()[0].split()
    assert (count, category, compiles) == ("1", "PjrtWarning", "0")
    assert "has grown to 100000 nodes without a sync()" in r.stdout and "torch_pjrt.sync()" in r.stdout


def test_backward_runs_on_the_calling_thread_unless_asked_otherwise():
    # docs/performance.md: a thread that creates pjrt tensors runs their
    # backward passes itself; TORCH_PJRT_AUTOGRAD_THREADS=1 keeps autograd's
    # per-device threads. Either way the gradients are the CPU's, also for
    # a backward started from a second thread. The tolerance is float32's
    # (assert_close's): sin(x) + x*cos(x) cancels near x = 2.03, where XLA's
    # and the CPU's one-ulp differences in sin and cos exceed allclose's
    # default 1e-8 (a failure in about 1 run of 300 with unseeded inputs).
    code = """
import threading, torch, torch_pjrt
dev = torch_pjrt.device()
before = torch.autograd.is_multithreading_enabled()
torch.manual_seed(0)
w = torch.randn(5, 3, requires_grad=True)
def grad_of(device):
    x = w.detach().to(device).requires_grad_()
    (x.sin() * x).sum().backward()
    return x.grad.cpu()
want = grad_of("cpu")
assert torch.allclose(grad_of(dev), want, atol=1e-5)
seen = {}
def worker():
    seen["grad"] = grad_of(dev)
    seen["mt"] = torch.autograd.is_multithreading_enabled()
t = threading.Thread(target=worker); t.start(); t.join()
assert torch.allclose(seen["grad"], want, atol=1e-5)
print(before, torch.autograd.is_multithreading_enabled(), seen["mt"])
"""
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.split() == ["True", "False", "False"], r.stderr
    r = run_python(code, TORCH_PJRT_AUTOGRAD_THREADS="1")
    assert r.returncode == 0 and r.stdout.split() == ["True", "True", "True"], r.stderr
    r = run_python(code, TORCH_PJRT_AUTOGRAD_THREADS="yes")
    assert r.returncode != 0 and "TORCH_PJRT_AUTOGRAD_THREADS" in r.stderr


def test_exit_right_after_a_backward_on_autograd_threads_does_not_abort():
    # With TORCH_PJRT_AUTOGRAD_THREADS=1 the device thread releases a finished
    # backward's Python context after waking the caller; at an exit right
    # after it, that release met finalization: std::terminate, "terminate
    # called without an active exception", in about 1 run of 4 with three at
    # once on 2 cores. The exit handler drains those threads first. A race:
    # six runs, three at a time, catch its return in about 4 tries of 5.
    import subprocess
    import sys

    code = """
import torch, torch_pjrt
x = torch.randn(5, 3, device=torch_pjrt.device(), requires_grad=True)
for _ in range(3):
    (x.sin() * x).sum().backward()
"""
    env = dict(os.environ, TORCH_PJRT_AUTOGRAD_THREADS="1")
    for _ in range(2):
        runs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(3)]
        for r in runs:
            _, err = r.communicate(timeout=120)
            assert r.returncode == 0, err


def test_transformer_encoder_inference_with_a_padding_mask():
    # PyTorch's inference fast path would make a nested tensor (which pjrt
    # cannot hold) on any PrivateUse1 device; pjrt declines it and computes
    # the dense batch: the unpadded positions match the CPU's fast path, and
    # every position its other path (docs/semantics.md)
    import copy

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    dev = copy.deepcopy(enc).to(DEV)
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        got = dev(x.to(DEV), src_key_padding_mask=pad.to(DEV)).cpu()
        fast = enc(x, src_key_padding_mask=pad)
        enc.use_nested_tensor = False
        slow = enc(x, src_key_padding_mask=pad)
    torch.testing.assert_close(got[~pad], fast[~pad], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, slow, rtol=1e-5, atol=1e-5)
    # mask_check=False makes the nested tensor without asking: a clear refusal
    dev.mask_check = False
    with torch.no_grad(), pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
        dev(x.to(DEV), src_key_padding_mask=pad.to(DEV))


def test_attention_fast_path_checks_mask_shapes_as_the_cpu():
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(3, 5, 8)
    wrong = [dict(attn_mask=torch.rand(3, 5, 5) > 0.7),  # (N, L, S), not (N * heads, L, S)
             dict(key_padding_mask=torch.zeros(3, 6, dtype=torch.bool))]
    for masks in wrong:
        with torch.no_grad(), pytest.raises(RuntimeError) as cpu:
            m(x, x, x, need_weights=False, **masks)
        d, xd = m.to(DEV), x.to(DEV)
        with torch.no_grad(), pytest.raises(RuntimeError) as dev:
            d(xd, xd, xd, need_weights=False, **{k: v.to(DEV) for k, v in masks.items()})[0].cpu()
        assert str(dev.value).splitlines()[0] == str(cpu.value).splitlines()[0]
        m = m.cpu()


@pytest.mark.parametrize("case", [
    lambda d: F.layer_norm(torch.randn(2, 3, device=d), (4,)),
    lambda d: F.layer_norm(torch.randn(2, 3, device=d), (2, 4)),
    lambda d: torch.randn(2, 3, device=d).copy_(torch.randn(4, device=d)),
    lambda d: torch.randn(3, device=d).copy_(torch.randn(2, 3, device=d)),
    lambda d: torch.randn(2, 3, device=d).copy_(torch.randn(4)),
])
def test_shape_errors_are_the_cpus(case):
    with pytest.raises(RuntimeError) as cpu:
        case("cpu")
    with pytest.raises(RuntimeError) as dev:
        case(DEV)
    assert str(dev.value) == str(cpu.value)


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_inference_fast_paths_run_on_the_device(need_weights):
    # eval + no grad + self-attention: PyTorch calls the fused
    # _native_multi_head_attention / _transformer_encoder_layer_fwd
    import copy

    torch.manual_seed(0)
    b, t, e, h = 3, 6, 16, 4
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [True] * 6])  # no key at all in the last row: NaN, as on the CPU
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    x = torch.randn(b, t, e)
    torch_pjrt.metrics.reset()
    for masks in [{}, dict(key_padding_mask=pad), dict(attn_mask=causal, key_padding_mask=pad)]:
        for avg in (True, False):
            m = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
            d = copy.deepcopy(m).to(DEV)
            xd = x.to(DEV)
            with torch.no_grad():
                want = m(x, x, x, need_weights=need_weights, average_attn_weights=avg, **masks)
                got = d(xd, xd, xd, need_weights=need_weights, average_attn_weights=avg,
                        **{k: v.to(DEV) for k, v in masks.items()})
            torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-5, atol=1e-5, equal_nan=True)
            assert (got[1] is None) == (want[1] is None)
            if want[1] is not None:
                torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-5, atol=1e-5, equal_nan=True)
    for norm_first, act in [(False, "relu"), (True, "gelu")]:
        layer = torch.nn.TransformerEncoderLayer(e, h, 32, batch_first=True, norm_first=norm_first, activation=act)
        enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        d = copy.deepcopy(enc).to(DEV)
        with torch.no_grad():
            torch.testing.assert_close(d(x.to(DEV), mask=causal.to(DEV)).cpu(), enc(x, mask=causal), rtol=1e-5, atol=1e-5)
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_streams_and_events_of_the_device_module(tmp_path):
    # one stream per device; a query or an event launches pending work, so
    # polling ends; synchronize waits
    s = torch.pjrt.current_stream()
    assert s == torch.accelerator.current_stream() == torch.pjrt.Stream(device=DEV) and s.device == DEV
    x = torch.randn(64, device=DEV) * 2
    e = torch.pjrt.Event(device="pjrt")
    e.record()
    while not e.query():
        pass
    y = x + 1
    while not s.query():
        pass
    s.synchronize()
    with torch.pjrt.stream(s):
        z = y * 2
    # as torch.cuda.stream: the stream's device is current inside the block
    with torch.pjrt.stream(torch.pjrt.current_stream(1)):
        assert torch.pjrt.current_device() == 1 and torch.empty(1, device="pjrt").device == torch.device("pjrt:1")
    assert torch.pjrt.current_device() == 0
    # record_stream (FSDP's, side-stream copies): nothing to record on one
    # stream; the value stays; a stream of another device is refused
    z.record_stream(s)
    torch.testing.assert_close(z.cpu(), (x.cpu() + 1) * 2)
    with pytest.raises(RuntimeError, match="expected a pjrt stream"):
        z.record_stream(torch.Stream(device="cpu"))
    # torch.distributed.checkpoint asks the current accelerator's module for its
    # streams: it saves and loads with pjrt loaded, CPU and pjrt tensors alike
    import torch.distributed.checkpoint as dcp
    for device in ("cpu", DEV):
        state = {"w": torch.arange(6.0, device=device), "b": torch.ones(2, 3, device=device)}
        dcp.save(state, checkpoint_id=str(tmp_path / str(device)))
        back = {"w": torch.zeros(6, device=device), "b": torch.zeros(2, 3, device=device)}
        dcp.load(back, checkpoint_id=str(tmp_path / str(device)))
        assert all(torch.equal(back[k].cpu(), state[k].cpu()) for k in state)
    # the memory calls such tools make: no cache of our own, so reserved is allocated
    torch.pjrt.empty_cache()
    assert torch.pjrt.memory_reserved() == torch.pjrt.memory_allocated() > 0 and torch.pjrt.is_bf16_supported()


def test_timing_events_and_device_properties_as_cuda_code_uses_them():
    # the timing idiom of CUDA scripts, ported: the work between the records
    # is in the elapsed time (here it includes a wait of 0.2 s between them)
    start, end = torch.pjrt.Event(enable_timing=True), torch.pjrt.Event(enable_timing=True)
    x = torch.randn(64, 64, device=DEV)
    start.record()
    time.sleep(0.2)
    y = (x @ x).sum()
    end.record()
    end.synchronize()
    assert 200 <= start.elapsed_time(end) < 60_000 and end.query()
    torch.testing.assert_close(y.cpu(), (x.cpu() @ x.cpu()).sum(), rtol=1e-4, atol=1e-3)
    # CUDA's errors: an event without timing, an event not recorded
    plain = torch.Event(DEV)
    plain.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        start.elapsed_time(plain)
    with pytest.raises((RuntimeError, ValueError), match="must be recorded"):
        torch.pjrt.Event(enable_timing=True).elapsed_time(end)
    # the device's name and memory, as torch.cuda's calls give them
    kind = torch_pjrt._C._device_info(0)["kind"]
    assert torch.pjrt.get_device_name() == torch.pjrt.get_device_properties(0).name == kind != ""
    free, total = torch.pjrt.mem_get_info()
    assert 0 <= free <= total == torch.pjrt.get_device_properties().total_memory > 0
    assert torch.accelerator.get_memory_info(0)[1] == total  # (CUDA code ported to torch.accelerator)
    with pytest.raises(IndexError, match="out of range"):
        torch.pjrt.get_device_name(torch.pjrt.device_count())
    # an index past the devices raises where it is set, as on CUDA, not at the next tensor
    with pytest.raises(IndexError, match="out of range"):
        torch.accelerator.set_device_index(torch.pjrt.device_count())
    with pytest.raises(IndexError, match="out of range"):
        with torch.accelerator.device_index(torch.pjrt.device_count()):
            pass
    assert torch.accelerator.current_device_index() == torch.pjrt.current_device() == 0
    # torch.cuda's device_of and memory_summary, as ported code calls them
    with torch.pjrt.device_of(torch.ones(2, device="pjrt:1")):
        assert torch.pjrt.current_device() == 1
    with torch.pjrt.device_of(torch.ones(2)):
        assert torch.pjrt.current_device() == 0
    assert "bytes_in_use" in torch.pjrt.memory_summary() and "free / total" in torch.pjrt.memory_summary(1)


def test_reading_a_small_tensor_element_by_element_downloads_it_once():
    preds = (torch.arange(3000, device=DEV) * 7) % 10
    torch_pjrt.sync()
    torch_pjrt.metrics.reset()
    got = [p.item() for p in preds]
    assert got == [(i * 7) % 10 for i in range(3000)]
    assert torch_pjrt.metrics.counters()["bytes_to_host"] <= 3000 * 8 + 16  # (and a check flag)
    # a copy kept on the host never outlives the value: in-place writes,
    # a donating optimizer step and a freed and reallocated tensor read anew
    preds.add_(1)
    assert [p.item() for p in preds[:5]] == [1, 8, 5, 2, 9]
    w = torch.nn.Parameter(torch.ones(4, device=DEV))
    opt = torch.optim.SGD([w], lr=0.5)
    assert w[0].item() == 1.0
    for k in range(3):
        (w * 2).sum().backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
        assert w[1].item() == 1.0 - (k + 1)
    del preds
    again = torch.full((3000,), 3, device=DEV)
    assert again[7].item() == 3


def test_reading_the_rows_of_a_larger_tensor_one_by_one_downloads_it_once():
    # 2 MiB: the first three rows are copied out on the device alone (a
    # small program each), the fourth read downloads the whole tensor, kept
    # for the rest
    x = torch.arange(512 * 1024, dtype=torch.float32, device=DEV).view(512, 1024) * 2
    torch_pjrt.sync()
    torch_pjrt.metrics.reset()
    rows = [r.tolist() for r in x[:50]]
    assert rows == (torch.arange(50 * 1024, dtype=torch.float32).view(50, 1024) * 2).tolist()
    c = torch_pjrt.metrics.counters()
    assert c["executions"] <= 3 and c["bytes_to_host"] <= 512 * 1024 * 4 + 3 * 1024 * 4 + 64, c
    # written: a new value, read anew (a part first, then whole again)
    x.add_(1)
    torch_pjrt.sync()
    assert x[3, 5].item() == (3 * 1024 + 5) * 2 + 1 and x[500, 7].item() == (500 * 1024 + 7) * 2 + 1


def test_sync_takes_devices_in_every_form_and_refuses_a_device_for_wait():
    x = torch.ones(2, device="pjrt:1") * 2
    for devices in ("pjrt:1", 1, torch.device("pjrt:1"), ["pjrt:1"], [torch.device("pjrt")]):
        torch_pjrt.sync(devices=devices)
    assert not torch_pjrt._C._is_pending(x)
    with pytest.raises(TypeError, match="takes a bool"):
        torch_pjrt.sync("pjrt:1")
    with pytest.raises(ValueError, match="expected a pjrt device"):
        torch_pjrt.sync(devices=[torch.device("cpu")])
    with pytest.raises(IndexError, match="out of range"):
        torch_pjrt.sync(devices=[torch_pjrt.device_count()])


def test_torch_accelerator_memory_calls_work_and_start_nothing():
    """torch_pjrt is loaded by torch's backend autoload, so pjrt is the
    current accelerator wherever it is installed: torch.accelerator's memory
    calls (Hugging Face accelerate empties the cache at the start of
    training, even on the CPU) work, and do not start the runtime."""
    r = run_python("""
import torch
torch.accelerator.empty_cache()
before = torch.accelerator.memory_allocated()
import torch_pjrt
started = torch_pjrt._C._initialized()
x = torch.ones(1000, device="pjrt") * 2
x.cpu()
now = torch.accelerator.memory_allocated()
torch.accelerator.reset_peak_memory_stats()
del x
print(torch.accelerator.current_accelerator(), before, started, now >= 4000,
      torch.accelerator.max_memory_allocated() >= now, torch.accelerator.memory_allocated() < now,
      torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.accelerator.memory_allocated())
torch.accelerator.empty_cache()
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pjrt", "0", "False", "True", "True", "True", "True"], r.stdout


def test_submodules_are_attributes_after_a_plain_import():
    """The docs write torch_pjrt.dynamo.replay = False after import
    torch_pjrt: the submodule loads on first use (an AttributeError before
    the first torch.compile)."""
    r = run_python("import torch_pjrt\n"
                   "print(torch_pjrt.dynamo.replay, callable(torch_pjrt.doctor.main))\n"
                   "try:\n    torch_pjrt.no_such_thing\nexcept AttributeError as e:\n    print('AttributeError', e)\n")
    assert r.returncode == 0, r.stderr
    assert "True True" in r.stdout and "AttributeError" in r.stdout and "no_such_thing" in r.stdout


def test_dlpack_export_is_refused_and_a_foreign_storage_is_an_error():
    # A pjrt storage's data pointer is a token for memory in the plugin: an
    # export through DLPack is refused, and a capsule made anyway (through
    # torch._C) gives a tensor whose first use is an error, not a crash.
    x = torch.arange(6.0).to(DEV)
    for export in (torch.utils.dlpack.to_dlpack, torch.to_dlpack, torch.from_dlpack, torch.Tensor.__dlpack__,
                   torch.Tensor.__dlpack_device__):
        with pytest.raises(RuntimeError, match="cannot be exported through DLPack"):
            export(x)
    assert torch.equal(torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(torch.arange(3.0))),
                       torch.arange(3.0))
    assert torch.equal(torch.from_dlpack(torch.arange(3.0)), torch.arange(3.0))
    assert torch.arange(3.0).__dlpack_device__()[1] == 0
    imported = torch.utils.dlpack.from_dlpack(torch._C._to_dlpack(x))
    for use in (lambda: imported.cpu(), lambda: imported + 1, lambda: repr(imported)):
        with pytest.raises(RuntimeError, match="torch-pjrt did not allocate"):
            use()
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))


def test_reading_a_small_part_of_a_large_tensor_moves_that_part():
    big = torch.arange(2**20, dtype=torch.float32).to(DEV) * 2  # 4 MiB
    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    assert big[5].item() == 10.0
    assert big.view(1024, 1024)[3, ::256].cpu().tolist() == [6144.0, 6656.0, 7168.0, 7680.0]
    assert torch_pjrt.metrics.counters()["bytes_to_host"] <= 64  # not 4 MiB per read
    z = torch.randn(600, 600, dtype=torch.complex64)
    assert torch.equal(z.to(DEV).conj()[3].cpu(), z.conj()[3])  # the conjugate bit applied on the way


def test_cuda_starting_beside_pjrt_warns_that_its_autograd_fails():
    # torch makes pjrt the process's one accelerator; CUDA's backward then
    # fails with an internal assert (docs/semantics.md). The warning is queued
    # for CUDA's lazy start; this torch may have no CUDA, so the test says it
    # was built with it and runs the queued calls itself.
    r = run_python("""
import warnings
import torch
torch.backends.cuda.is_built = lambda: True
import torch_pjrt
from torch_pjrt import _device
calls = [c for c, _ in torch.cuda._queued_calls if getattr(c, "__qualname__", "").startswith("_warn_when_cuda_starts")]
print(len(calls))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    calls[0]()
print(w[0].category.__name__, w[0].message.args[0] == _device.CUDA_AUTOGRAD_WARNING)
with warnings.catch_warnings():
    warnings.simplefilter("error")
    calls[0]()  # as an error it is dropped: CUDA's start must go on
print("started")
""", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "PjrtWarning", "True", "started"]
