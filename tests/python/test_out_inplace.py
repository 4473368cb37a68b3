"""In-place and out= forms derived from the functional lowerings
(csrc/aten/derived.cc): PyTorch's rules for outputs, the CPU's answers and
errors, and no CPU fallback."""

import warnings

import pytest
import torch

import torch_pjrt

DEV = torch_pjrt.device()


@pytest.fixture(autouse=True)
def no_fallbacks():
    torch_pjrt.sync()
    torch_pjrt.metrics.reset()
    yield
    assert torch_pjrt.metrics.fallbacks() == {}


def same(dev, cpu):
    got = dev.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape
    torch.testing.assert_close(got, cpu, rtol=1e-5, atol=1e-6)


def both(fn, *inputs):
    """fn on CPU copies and on pjrt copies; every input must end equal."""
    cpu = [x.clone() for x in inputs]
    dev = [x.clone().to(DEV) for x in inputs]
    fn(*cpu)
    fn(*dev)
    for d, c in zip(dev, cpu):
        same(d, c)


A = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
B = torch.linspace(-2, 2, 4)


def test_derived_kernels_are_registered():
    pairs = dict(torch_pjrt._C._derived_kernels())
    assert pairs["aten::add.out"] == "aten::add.Tensor"
    assert pairs["aten::max.dim_max"] == "aten::max.dim"
    assert pairs["aten::where.self_out"] == "aten::where.self"
    assert pairs["aten::logical_and_"] == "aten::logical_and"
    assert "aten::as_strided_" not in pairs  # a view: not derived


def test_add_out_resizes_with_the_cpu_warning():
    def f(a, b, out):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.add(a, b, out=out)
        assert any("was resized" in str(x.message) for x in w)

    both(f, A, B, torch.zeros(5))


@pytest.mark.parametrize("shape,warns", [((3,), True), ((0,), False), ((5, 1), False), ((5,), False)])
def test_arange_out_resizes_or_keeps_its_shape_as_the_cpu(shape, warns):
    # A wrong number of elements is resized with the CPU's warning (none
    # for an empty out); the right number keeps the out's shape.
    def f(out):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.arange(5, out=out)
        assert any("does not match the computed number of elements" in str(x.message) for x in w) == warns

    both(f, torch.zeros(shape))


def test_add_out_into_empty_does_not_warn():
    def f(a, b, out):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.add(a, b, out=out)

    both(f, A, B, torch.zeros(0))


def test_out_aliases_an_input():
    both(lambda a, b: torch.mul(a, b, out=a), A, B)
    both(lambda a: torch.exp(a, out=a), A)


def test_out_is_a_transposed_view():
    def f(big, a):
        torch.add(a, 1, out=big.t())

    both(f, torch.zeros(4, 3), A)


def test_out_is_a_strided_slice_rest_untouched():
    def f(big, b):
        torch.mul(b, 2, out=big[1, ::2])

    both(f, torch.full((3, 8), 5.0), B)


def test_int_out_of_float_result_raises_as_cpu():
    for device in ("cpu", DEV):
        out = torch.zeros(3, 4, dtype=torch.long, device=device)
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            torch.add(A.to(device), 0.5, out=out)


def test_float_out_of_int_result():
    both(lambda a, out: torch.add(a, a, out=out), torch.arange(6), torch.zeros(6, dtype=torch.float64))


def test_inplace_never_broadcasts_self():
    for device in ("cpu", DEV):
        x = torch.zeros(4, device=device)
        with pytest.raises(RuntimeError, match=r"output with shape \[4\] doesn't match the broadcast shape \[3, 4\]"):
            x.add_(A.to(device))
        with pytest.raises(RuntimeError, match=r"output with shape \[4\] doesn't match the broadcast shape \[3, 4\]"):
            x.atan2_(A.to(device))  # a derived in-place kernel


def test_out_that_is_an_input_is_not_resized():
    for device in ("cpu", DEV):
        x = torch.zeros(4, device=device)
        with pytest.raises(RuntimeError, match=r"output with shape \[4\] doesn't match the broadcast shape \[3, 4\]"):
            torch.mul(x, A.to(device), out=x)


def test_inplace_int_self_float_result_raises():
    for device in ("cpu", DEV):
        x = torch.arange(4, device=device)
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            x.atan2_(B.to(device))


def test_logical_and_inplace():
    both(lambda a, b: a.logical_and_(b), A > 0.5, B > 0)
    both(lambda a, b: a.logical_and_(b), A, B)  # float self keeps its dtype


def test_where_out():
    both(lambda c, a, b, out: torch.where(c, a, b, out=out), A > 0.5, A, B, torch.empty(3, 4))


def test_exp_out():
    both(lambda a, out: torch.exp(a, out=out), A, torch.empty(3, 4))


def test_mm_out():
    both(lambda a, b, out: torch.mm(a, b, out=out), A, A.t().contiguous(), torch.empty(3, 3))


def test_max_dim_out_two_outputs():
    both(lambda a, v, i: torch.max(a, 1, out=(v, i)), A, torch.empty(3), torch.empty(3, dtype=torch.long))
    both(lambda a, v, i: torch.max(a, 0, keepdim=True, out=(v, i)), A, torch.empty(0), torch.empty(0, dtype=torch.long))


def test_sort_values_out():
    both(lambda a, v, i: torch.sort(a, 1, descending=True, out=(v, i)), A.flip(1), torch.empty(3, 4),
         torch.empty(3, 4, dtype=torch.long))


def test_sum_out_computes_in_the_out_dtype():
    both(lambda a, out: torch.sum(a, 0, out=out), torch.arange(12).reshape(3, 4), torch.empty(4, dtype=torch.float64))


def test_comparison_inplace_keeps_self_dtype():
    both(lambda a, b: a.gt_(b), A, B)


def test_clamp_backward_has_no_fallback():
    def grad(device):
        x = A.clone().to(device).requires_grad_()
        torch.clamp(x, min=0.3, max=1.2).sum().backward()
        return x.grad

    same(grad(DEV), grad("cpu"))


@pytest.mark.parametrize("name,mode", [("add", "out"), ("mm", "out"), ("max.reduction_with_dim", "out"),
                                       ("atan2", "inplace"), ("logical_and", "inplace")])
def test_conformance_out_and_inplace_passes(name, mode):
    from torch_pjrt import conformance

    op = next(o for o in conformance.op_db([name]) if conformance._entry_name(o) == name)
    v = conformance.run_entry(op, torch.float32, max_samples=2, grads=False, device=DEV, mode=mode)
    assert v["samples"] > 0 and conformance.status(v) == "pass", v


# Foreach ops (every torch.optim step's default path): PyTorch's composite
# kernels run each item through the per-tensor kernels on pjrt.


def _foreach_entries():
    from torch.testing._internal import common_methods_invocations as cmi

    ops = cmi.foreach_unary_op_db + cmi.foreach_binary_op_db + cmi.foreach_pointwise_op_db + cmi.foreach_other_op_db
    ops += cmi.foreach_reduce_op_db
    return {op.name: op for op in ops}


@pytest.mark.parametrize("name", ["_foreach_add", "_foreach_mul", "_foreach_div", "_foreach_lerp", "_foreach_addcmul",
                                  "_foreach_addcdiv", "_foreach_sqrt", "_foreach_maximum", "_foreach_norm"])
def test_foreach_conformance(name):
    """PyTorch's own foreach samples (lists of several shapes, scalars,
    scalar lists, tensor scalars), functional with gradients and in place."""
    from torch_pjrt import conformance

    op = _foreach_entries()[name]
    ran = 0
    for mode in ("functional", "inplace"):
        if not conformance.has_mode(op, mode):
            continue
        for dtype in (torch.float32, torch.bfloat16):
            v = conformance.run_entry(op, dtype, max_samples=2, grads=dtype == torch.float32, device=DEV, mode=mode)
            # May be 0 of 0: addcdiv has no float32 samples with gradients.
            assert v["passed"] == v["samples"] and not v["fallback"], v
            ran += v["samples"]
    assert ran > 0


def test_foreach_inplace_counts_versions_as_cpu():
    def versions(device):
        a = [torch.ones(3, device=device), torch.ones(2, device=device)]
        torch._foreach_add_(a, [torch.ones(3, device=device), torch.ones(2, device=device)])
        torch._foreach_mul_(a, 2.0)
        torch._foreach_addcmul_(a, a, a, value=0.5)
        with torch.inference_mode():
            torch._foreach_add_(a, 1.0)  # counted in inference mode too, as on the CPU
        return [t._version for t in a]

    assert versions(DEV) == versions("cpu")

    # A saved tensor changed by a foreach op fails backward, as on the CPU.
    x = torch.ones(3, device=DEV, requires_grad=True)
    y = x * 1
    z = y * y
    torch._foreach_add_([y], 1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_foreach_mixed_lists_and_errors():
    # An item on the CPU runs on the CPU; a CPU number mixes with pjrt.
    p = [torch.ones(2, device=DEV), torch.ones(2)]
    torch._foreach_add_(p, [torch.full((2,), 2.0, device=DEV), torch.full((2,), 3.0)])
    assert p[0].device == DEV and p[1].device.type == "cpu"
    assert p[0].cpu().tolist() == [3.0, 3.0] and p[1].tolist() == [4.0, 4.0]
    q = [torch.ones(2, device=DEV)]
    torch._foreach_mul_(q, torch.tensor(3.0))
    assert q[0].cpu().tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add_([torch.ones(2, device=DEV)], [torch.ones(2, device=DEV)] * 2)
    with pytest.raises(RuntimeError, match="pjrt"):
        torch._foreach_add_([torch.ones(2, device=DEV)], [torch.ones(2)])
