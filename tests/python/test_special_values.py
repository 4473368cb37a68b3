"""NaN, +-inf, -0.0 and ties give exactly the CPU's answer, op by op: values
(NaN == NaN), indices, and the sign of zero where the CPU defines it.

Where the CPU itself does not define a result these tests leave it alone
(docs/semantics.md says why): the sign of max/min of a +0.0/-0.0 tie (it
changes with the CPU's vector width), the order of ties in topk and in
sort(stable=False). Ops that run on the CPU through the fallback today are
checked too, so that a future lowering keeps their answers; ops that are
lowered must stay lowered (no fallback)."""

import os

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import conformance

DEV = torch_pjrt.device()
nan, inf = float("nan"), float("inf")

# Rows: two NaNs (the first wins); ties of 2 and of -inf, -0.0 without +0.0;
# ties of inf and of 3; all NaN; -0.0 twice as the minimum.
X = torch.tensor([
    [1.0, nan, 0.0, 5.0, inf, nan, -1.0],
    [-inf, 2.0, -0.0, 3.0, 2.0, -inf, 0.5],
    [3.0, 3.0, -inf, inf, -2.0, inf, 1.0],
    [nan, nan, nan, nan, nan, nan, nan],
    [-0.0, 5.0, -0.0, 7.0, 7.0, 1.0, 2.0],
])
# The same without the all-NaN row and without +0.0/-0.0 ties in a column,
# for reductions along dim 0.
XC = X[[0, 1, 2, 4]].clone()
XC[0, 2] = 4.0
# No ties within a row (one NaN at most): results of sort(stable=False) and
# topk are then unique.
XU = torch.tensor([
    [1.0, nan, -0.0, 5.0, inf, -inf, -1.0],
    [-inf, 2.0, -0.0, 3.0, 0.5, 9.0, inf],
    [4.0, -3.0, 1.0, 0.0, nan, -5.0, 6.0],
])
XI = torch.tensor([[3, 1, 3, -2, 7], [0, 0, 7, 7, -9], [5, 5, 5, 5, 5]])


def _same(got, want, sign=True, rtol=0.0, what="result"):
    """Exact, or for finite results of arithmetic within rtol; NaN == NaN,
    +-inf exactly, and the sign of every zero of `want`."""
    got = got.detach().cpu()
    want = want.detach()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    torch.testing.assert_close(got, want, rtol=rtol, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}\n{got}\n{want}")
    if sign and want.is_floating_point():
        zero = want == 0
        assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero])), f"{what}: sign of zero\n{got}\n{want}"


def check(fn, *inputs, sign=True, native=True, rtol=0.0):
    """fn on the CPU and on pjrt, results compared exactly (rtol: for sums)."""
    want = fn(*inputs)
    torch_pjrt.metrics.reset()
    got = fn(*[t.to(DEV) for t in inputs])
    wants = list(want) if isinstance(want, tuple) else [want]
    gots = list(got) if isinstance(got, tuple) else [got]
    assert len(gots) == len(wants)
    for i, (g, w) in enumerate(zip(gots, wants)):
        _same(g, w, sign=sign, rtol=rtol, what=f"output {i}")
    if native:
        assert not torch_pjrt.metrics.fallbacks(), torch_pjrt.metrics.fallbacks()


def check_grad(fn, x, sign=True):
    """d(sum(fn(x) * w))/dx on both sides, w fixed; NaN == NaN."""

    def grad(t):
        t = t.detach().clone().requires_grad_(True)
        out = fn(t)
        out = out[0] if isinstance(out, tuple) else out
        w = torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape).to(t.device)
        (g,) = torch.autograd.grad((out * w).sum(), t)
        return g

    _same(grad(x.to(DEV)), grad(x), sign=sign, what="gradient")


# --------------------------------------------------------------- max, min


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_full_reduction(op):
    for row in range(X.shape[0]):
        # a +0.0/-0.0 tie has no defined sign on the CPU: none in these rows
        check(lambda t: getattr(t, op)(), X[row])
    check(lambda t: getattr(t, op)(), X)
    check(lambda t: getattr(t, op)(), XC)
    check(lambda t: getattr(t, op)(), XI)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_dim_values_and_first_index(op):
    for t in (X, XI):
        check(lambda t: getattr(t, op)(1), t)
        check(lambda t: getattr(t, op)(-1, keepdim=True), t)
    check(lambda t: getattr(t, op)(0), XC)
    check(lambda t: getattr(t, op)(0), X)
    # the value is the element at the index, +0.0 or -0.0 as the CPU gives it
    z = torch.tensor([[0.0, -0.0, -1.0], [-0.0, 0.0, -1.0], [-1.0, -0.0, 0.0]])
    check(lambda t: getattr(t, op)(1), z if op == "max" else -z)


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin(op):
    check(lambda t: getattr(t, op)(1), X)
    check(lambda t: getattr(t, op)(0), XC)
    check(lambda t: getattr(t, op)((0, 1)), XC)
    check(lambda t: getattr(t, op)(0, keepdim=True), X)
    check(lambda t: getattr(t, op)(), X)
    check(lambda t: getattr(t, op)(1), XI)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_first_nan_wins(op):
    for t in (X, XC, XU, XI):
        check(lambda t: getattr(t, op)(), t)
        check(lambda t: getattr(t, op)(1), t)
        check(lambda t: getattr(t, op)(0, keepdim=True), t)
    for row in range(X.shape[0]):
        check(lambda t: getattr(t, op)(), X[row])


def test_max_min_backward():
    for row in (X[0], X[1], X[2], X[4], XC):
        check_grad(lambda t: t.max(), row)
        check_grad(lambda t: t.min(), row)
    check_grad(lambda t: t.max(1), X)
    check_grad(lambda t: t.min(1), X)
    check_grad(lambda t: t.max(0), XC)


def test_amax_amin_backward():
    check_grad(lambda t: t.amax(1), X)
    check_grad(lambda t: t.amin(1), X)
    check_grad(lambda t: t.amax(0), XC)
    check_grad(lambda t: t.amax(), XC)


# ---------------------------------------------------- maximum, fmax, clamp

A = torch.tensor([1.0, nan, nan, inf, -inf, -0.0, 2.0, -inf, 3.0, nan])
Bv = torch.tensor([nan, 2.0, nan, -inf, -0.0, -1.0, inf, inf, 3.0, -inf])


@pytest.mark.parametrize("op", [torch.maximum, torch.minimum])
def test_maximum_minimum_propagate_nan(op):
    check(op, A, Bv)
    check(op, Bv, A)
    check(op, X, XC[0])  # broadcast
    check(op, XI, XI.flip(1))


@pytest.mark.parametrize("op", [torch.fmax, torch.fmin])
def test_fmax_fmin_ignore_nan(op):
    check(op, A, Bv)
    check(op, Bv, A)
    check(op, XI, XI.flip(1))


def test_maximum_backward():
    check_grad(lambda t: torch.maximum(t, Bv.to(t.device)), A)
    check_grad(lambda t: torch.minimum(Bv.to(t.device), t), A)


def test_clamp_scalar_bounds():
    for lo, hi in ((-1.0, 1.0), (2.0, -2.0), (0.0, None), (None, -0.0), (-inf, inf), (1.0, 1.0)):
        check(lambda t: t.clamp(lo, hi), X)
    check(lambda t: t.clamp_min(0.5), X)
    check(lambda t: t.clamp_max(0.5), X)
    check(lambda t: t.clamp(-2, 3), XI)
    # a NaN bound makes every element NaN on the CPU
    for lo, hi in ((nan, 1.0), (0.0, nan), (nan, None), (None, nan), (nan, nan)):
        check(lambda t: t.clamp(lo, hi), X)


def test_clamp_tensor_bounds():
    lo, hi = XC[0].clone(), XC[2].clone()
    check(lambda t, a, b: t.clamp(a, b), X, lo, hi)
    check(lambda t, a: t.clamp(min=a), X, lo)
    check(lambda t, b: t.clamp(max=b), X, hi)
    check(lambda t, a: t.clamp(a, a + 1), XI, XI.flip(1))


def test_clamp_inplace():
    check(lambda t: t.clone().clamp_(-1.0, 1.0), X)
    check(lambda t: t.clone().clamp_(nan, 1.0), X)


def test_clamp_backward():
    check_grad(lambda t: t.clamp(-1.0, 1.0), X)
    check_grad(lambda t: t.clamp(min=0.0), X)
    lo = XC[0].clone()
    check_grad(lambda t: t.clamp(lo.to(t.device), lo.to(t.device) + 1), X)


def test_relu_keeps_nan_and_negative_zero():
    check(torch.relu, X)


# ------------------------------------------------------------ sort family


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_is_largest_and_stable(descending):
    for t in (X, XC, XI):
        check(lambda t: t.sort(dim=1, descending=descending, stable=True), t)
        check(lambda t: t.sort(dim=0, descending=descending, stable=True), t)
        check(lambda t: t.argsort(dim=1, descending=descending, stable=True), t)
    # stable=False: the CPU's order of ties is unspecified, so no ties here
    check(lambda t: t.sort(1, descending=descending), XU)
    check(lambda t: t.argsort(-1, descending=descending), XU)


def test_sort_negative_nan_and_zeros():
    t = torch.tensor([nan, -0.0, 0.0, -nan, 1.0, -0.0, -inf, 0.0])
    check(lambda t: t.sort(stable=True), t)
    check(lambda t: t.sort(stable=True, descending=True), t)


def test_msort():
    check(torch.msort, XC.t().contiguous())
    check(torch.msort, X)


def test_sort_backward():
    check_grad(lambda t: t.sort(dim=1, stable=True), X)
    check_grad(lambda t: t.sort(dim=1, descending=True, stable=True), X)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    for k in (1, 3, 7):
        check(lambda t: t.topk(k, 1, largest=largest), XU)
    check(lambda t: t.topk(2, 0, largest=largest), XU)
    check(lambda t: t.topk(2, 1, largest=largest), torch.tensor([[3, -1, 8, 0], [5, 2, -7, 1]]))


# ------------------------------------- order statistics (CPU fallback today)


def check_selection(fn, t):
    """Values exactly as the CPU's; each index points at an element equal to
    its value (NaN at NaN). Among equal values (an all-NaN row of nanmedian,
    ties in kthvalue) the CPU's quickselect reports one it picks; pjrt the
    stable sort's."""
    want, got = fn(t), fn(t.to(DEV))
    assert not torch_pjrt.metrics.fallbacks(), torch_pjrt.metrics.fallbacks()
    _same(got.values, want.values, what="values")
    idx = got.indices.cpu()
    assert idx.dtype == torch.long and idx.shape == want.indices.shape
    picked = t.gather(1, idx.unsqueeze(1)).squeeze(1)
    _same(picked, want.values, what="the element at the index")


def test_median_nanmedian_kthvalue():
    torch_pjrt.metrics.reset()
    for t in (X, XC, XU):
        check(lambda t: t.median(), t)
        check(lambda t: t.nanmedian(), t)
        check_selection(lambda t: t.median(1), t)
        check_selection(lambda t: t.nanmedian(1), t)
        check_selection(lambda t: t.kthvalue(2, 1), t)
    check_selection(lambda t: t.median(1), XI)
    check_selection(lambda t: t.kthvalue(3, 1), XI)
    # without ties the index is the CPU's too
    check(lambda t: t.median(1), XU)
    check(lambda t: t.kthvalue(2, 1), XU)


def test_cummax_cummin():
    for t in (X, XU, XI):
        check(lambda t: t.cummax(1), t, native=False)
        check(lambda t: t.cummin(1), t, native=False)
    check(lambda t: t.cummax(0), XC, native=False)


def test_unique():
    t = torch.tensor([nan, 1.0, nan, -0.0, inf, 1.0, -inf, 0.0])
    check(lambda t: torch.unique(t, sorted=True), t, sign=False, native=False)
    check(lambda t: torch.unique(t, return_counts=True), torch.tensor([2.0, inf, 2.0, -inf]), native=False)


def test_nan_to_num():
    check(lambda t: t.nan_to_num(), X)
    check(lambda t: t.nan_to_num(1.5, 2.5, -3.5), X)
    check(lambda t: t.nan_to_num(posinf=7.0), X.double())
    check(lambda t: t.nan_to_num(), X.bfloat16())
    check(lambda t: t.nan_to_num(), XI)


# -------------------------------------------------------------- reductions

R = 1e-6  # finite results of sums may differ in the last bit (order of addition)


def test_sum_mean_std_var_propagate():
    for dim in (0, 1):
        t = X if dim == 1 else XC
        check(lambda t: t.sum(dim), t, rtol=R)
        check(lambda t: t.mean(dim), t, rtol=R)
        check(lambda t: t.var(dim), t, rtol=R)
        check(lambda t: t.std(dim), t, rtol=R)
    check(lambda t: t.sum(), X, rtol=R)
    check(lambda t: t.sum(1), XI)
    check(lambda t: t.prod(1), X, native=False, rtol=R)
    check(lambda t: t.prod(1), XI, native=False)
    z = torch.tensor([[-0.0, -0.0], [inf, -inf], [inf, inf], [-0.0, 1.0]])
    check(lambda t: t.sum(1), z)
    check(lambda t: t.mean(1), z)
    check(lambda t: t.var(1), z, rtol=R)


def test_norms():
    for p in (2, 1, 0, 0.5, inf, -inf):
        check(lambda t: torch.linalg.vector_norm(t, p, dim=1), X, rtol=R)
        check(lambda t: torch.linalg.vector_norm(t, p), XC, rtol=R)
    check(lambda t: t.norm(dim=0), XC, rtol=R)


def test_norms_without_identity_on_empty_input_raise_as_on_the_cpu():
    """inf, -inf and negative norms over an empty dimension have no value:
    the CPU raises (pjrt returned -inf or inf)."""
    for p, shape, dim in ((inf, (0,), None), (-inf, (0,), None), (-1, (3, 0), None), (inf, (3, 0), 1),
                          (-0.5, (3, 0), (0, 1))):
        with pytest.raises(RuntimeError) as cpu:
            torch.linalg.vector_norm(torch.zeros(shape), p, dim=dim)
        with pytest.raises(RuntimeError) as dev:
            torch.linalg.vector_norm(torch.zeros(shape, device=DEV), p, dim=dim)
        assert str(dev.value) == str(cpu.value)
    for p, shape, dim in ((inf, (3, 0), 0), (-inf, (0, 3), 1), (0.5, (3, 0), None)):  # nothing reduced is empty
        check(lambda t: torch.linalg.vector_norm(t, p, dim=dim), torch.zeros(shape))


def test_logsumexp():
    t = torch.tensor([[-inf, -inf, -inf], [inf, 1.0, 2.0], [inf, inf, -inf], [nan, 1.0, inf], [1.0, 2.0, 3.0]])
    check(lambda t: t.logsumexp(1), t, native=False, rtol=R)
    check(lambda t: t.logsumexp(0), XC, native=False, rtol=R)


def test_softmax_with_special_values():
    t = torch.tensor([[-inf, -inf, -inf], [inf, 1.0, 2.0], [-inf, 1.0, 2.0], [nan, 1.0, 2.0]])
    check(lambda t: torch.softmax(t, 1), t, rtol=R)
    check(lambda t: torch.log_softmax(t, 1), t, rtol=R)


def test_empty_inputs():
    e = torch.empty(0, 3)
    check(lambda t: t.sum(0), e)
    check(lambda t: t.mean(0), e)
    check(lambda t: t.amax(1), e)
    check(lambda t: t.max(1), e)
    check(lambda t: t.sort(0), e)
    check(lambda t: t.clamp(0, 1), e)
    check(lambda t: torch.maximum(t, t), e)


# ------------------------ other lowerings found by `make conformance-special`


def test_sign_of_nan_and_negative_zero():
    check(torch.sign, X)
    check(torch.sgn, X)
    check(torch.sign, XI)
    check_grad(torch.abs, X)  # grad * sign(x): 0 at NaN on the CPU
    check_grad(lambda t: F.l1_loss(t, XC[0].to(t.device).expand_as(t), reduction="none"), X)


def test_square_roots_as_powers_keep_the_cpus_signs():
    # x ** 0.5 and x ** -0.5 are sqrt and rsqrt on the CPU (bfloat16 too;
    # float16's -0.5 is a power): -0.0 ** -0.5 is -inf, -inf ** -0.5 NaN
    x = torch.tensor([-0.0, 0.0, -inf, inf, -4.0, 4.0, nan, 0.3])
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for e in (0.5, -0.5):
            check(lambda t: t ** e, x.to(dtype))


def test_floor_division_by_inf_and_zero():
    a = torch.tensor([-7.5, 7.5, -0.0, 0.0, 3.0, -3.0, nan, inf, -inf, 1.0, -1.0, 5.0, 0.5, -0.5])
    b = torch.tensor([inf, inf, inf, -inf, 0.0, 0.0, 2.0, 2.0, 2.0, -0.0, -inf, -2.0, 3.0, 3.0])
    check(lambda a, b: torch.div(a, b, rounding_mode="floor"), a, b)
    check(torch.floor_divide, a, b)
    check(torch.remainder, a, b)
    check_grad(lambda t: torch.remainder(a.to(t.device), t), b)  # -grad * floor(a / b)


def test_threshold_and_relu_backward_keep_nan():
    check(lambda t: F.threshold(t, 0.5, -2.0), X)
    check_grad(torch.relu, X)
    check_grad(lambda t: F.threshold(t, 0.5, -2.0), X)


def test_softmax_backward_as_the_cpu_computes_it():
    t = torch.tensor([[-inf, 1.0, 2.0], [0.0, -inf, -inf], [1.0, 2.0, 3.0]])
    check_grad(lambda t: torch.softmax(t, 1), t)
    y = torch.tensor([[inf, 0.25, 0.0], [0.5, 0.5, 0.0]])
    g = torch.tensor([[nan, 1.0, -2.0], [1.0, -1.0, 3.0]])
    check(lambda g, y: torch.ops.aten._softmax_backward_data(g, y, 1, torch.float32), g, y)


def test_masked_multiply_keeps_inf_times_zero_nan():
    v, m = torch.tensor([inf, 2.0, nan, -3.0]), torch.tensor([False, True, False, False])
    check(lambda v, m: v * m, v, m)
    check(lambda v, m: v * m.float(), v, m)
    check(lambda v, m: torch.ops.aten.native_dropout_backward(v, m, 2.0), v, m)


def test_adaptive_avg_pool_keeps_nan_in_its_window():
    t = torch.arange(2 * 12 * 12, dtype=torch.float32).reshape(2, 12, 12) / 7
    t[0, 1, 2], t[1, 5, 5], t[1, 0, 11] = nan, inf, -inf
    for size in ((4, 4), (5, 7), (1, 1), (12, 12), (3, 5)):
        check(lambda t: F.adaptive_avg_pool2d(t, size), t, rtol=R)
    check(lambda t: F.adaptive_avg_pool1d(t, 5), t, rtol=R)
    go = torch.ones(2, 4, 6)
    go[0, 1, 1] = nan
    check(lambda go, t: torch.ops.aten._adaptive_avg_pool2d_backward(go, t), go, t, rtol=R)


def test_batch_norm_with_inf_weight_and_statistics():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 5 - 2
    w, bias = torch.tensor([inf, 1.0, -inf]), torch.tensor([-inf, 0.0, 1.0])
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, bias, rtol=R)
    rm, rv = torch.tensor([0.0, nan, 1.0]), torch.tensor([1.0, 1.0, inf])
    check(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False), x, rm, rv, w, bias, rtol=R)
    e = torch.empty(0)
    check(lambda x, e: torch.native_batch_norm(x, e, e, e, e, False, 0.1, 1e-5), torch.empty(3, 2, 0), e)


def test_erf_and_gelu_at_the_tails():
    check(torch.erf, torch.tensor([inf, -inf, nan, 3.95, -4.5, 10.0, -10.0, 1e30, -1e30, 0.5, -0.0]), rtol=1e-5)
    # gelu(+inf) is NaN on the CPU; the sign of its underflowed zeros
    # depends on the CPU's vector unit (docs/semantics.md): -0.0 on pjrt
    x = torch.tensor([-inf, nan, -6.0, -10.0, -1e30, 0.5, -0.0, 1e30, 2.0])
    check(F.gelu, x, rtol=1e-5, sign=False)
    assert torch.signbit(F.gelu(x.to(DEV)).cpu()[[2, 3, 4, 6]]).all()


def test_index_select_with_no_indices():
    none = torch.empty(0, dtype=torch.long)
    check(lambda t, i: t.index_select(0, i), torch.empty(0), none)
    check(lambda t, i: t.index_select(1, i), torch.empty(5, 0), none)
    check(lambda t, i: t.index_select(1, i), X, none)


# ------------------------------------------ the conformance pass's own list

HERE = os.path.dirname(__file__)
EXPECTED = os.path.join(HERE, "special_values_expected_failures.txt")
SEMANTICS = os.path.join(HERE, "..", "..", "docs", "semantics.md")


def test_special_values_expected_failures_are_explained():
    """Each entry of the special-values pass's expected failures is a pass-list
    entry (the pass runs those), has a reason, and is named in docs/semantics.md."""
    known = conformance.load_expected(EXPECTED)
    passing = conformance.load_entries(os.path.join(HERE, "opinfo_pass_list.txt"))
    doc = open(SEMANTICS).read()
    assert known
    for key, reason in known.items():
        op, dtype = key.split(" ")
        assert len(reason) > 40, key
        assert (op, dtype) in passing or (dtype == "*" and any(o == op for o, _ in passing)), key
        assert f"`{op}`" in doc, f"{op}: listed in {EXPECTED} but not explained in docs/semantics.md"
