"""Linear algebra on pjrt against the CPU: Cholesky, triangular solves, LU
(factor, unpack, solve), solve, inverse, determinants, QR, eigh and the SVD,
matrix_exp, householder_product, geqrf and ormqr, forward and backward, batched, with no
CPU fallback; errors on non-PD and singular inputs as on the CPU; a Gaussian
log-likelihood through Cholesky and orthogonal parametrizations that train a
few steps with CPU parity."""

import copy
import math

import pytest
import torch

import torch_pjrt

DEV = torch_pjrt.device()


def gen(seed):
    return torch.Generator().manual_seed(seed)


def spd(*batch, n=4, seed=0, dtype=torch.float32):
    a = torch.randn(*batch, n, n, generator=gen(seed), dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


def well_conditioned(*shape, seed=0, dtype=torch.float32):
    a = torch.randn(*shape, generator=gen(seed), dtype=dtype)
    m, n = shape[-2:]
    return a + 3 * torch.eye(m, n, dtype=dtype)


@pytest.fixture(autouse=True)
def no_fallbacks():
    torch_pjrt.metrics.reset()
    yield
    assert torch_pjrt.metrics.fallbacks() == {}


def compare(fn, *inputs, rtol=1e-4, atol=1e-4, grad=True):
    """fn on the CPU and on pjrt: outputs, and the gradients of a weighted
    sum of the outputs with respect to every input."""
    cpu = [x.clone().requires_grad_(grad) for x in inputs]
    dev = [x.to(DEV).requires_grad_(grad) for x in inputs]
    want, got = fn(*cpu), fn(*dev)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for w, g in zip(want, got):
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=rtol, atol=atol)
    if not grad:
        return
    weights = [torch.randn(w.shape, generator=gen(7 + i), dtype=w.dtype) for i, w in enumerate(want)]
    sum(((w * k).sum() for w, k in zip(want, weights) if w.is_floating_point())).backward()
    sum(((g * k.to(DEV)).sum() for g, k in zip(got, weights) if g.is_floating_point())).backward()
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_batched_forward_backward(upper):
    a = spd(3, n=5)
    # symmetrize inside so that the gradient is the one of a symmetric input
    compare(lambda x: torch.linalg.cholesky((x + x.mT) / 2, upper=upper), a)


# torch 2.14 removed torch.cholesky (deprecated since 1.9): it raises before dispatch.
HAS_OLD_CHOLESKY = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 14)


def test_cholesky_float64_and_old_api():
    a = spd(2, n=6, dtype=torch.float64)
    compare(lambda x: torch.linalg.cholesky((x + x.mT) / 2), a, rtol=1e-10, atol=1e-10)
    if HAS_OLD_CHOLESKY:
        compare(lambda x: torch.cholesky((x + x.mT) / 2), a, rtol=1e-10, atol=1e-10)


def test_cholesky_of_non_pd_raises_and_ex_reports_info():
    a = torch.eye(4)
    a[2, 2] = -1
    want = torch.linalg.cholesky_ex(a)
    got = torch.linalg.cholesky_ex(a.to(DEV))
    assert int(got.info.cpu()) == int(want.info) == 3
    b = torch.stack([spd(n=4), a, -spd(n=4, seed=1)])
    assert torch.equal(torch.linalg.cholesky_ex(b.to(DEV)).info.cpu(), torch.linalg.cholesky_ex(b).info)
    assert torch.equal(torch.linalg.cholesky_ex(b.to(DEV), upper=True).info.cpu(),
                       torch.linalg.cholesky_ex(b, upper=True).info)
    with pytest.raises(RuntimeError, match="not positive-definite"):
        torch.linalg.cholesky(a)
    # the check is compiled into the program: nothing runs until a read
    torch_pjrt.metrics.reset()
    bad = torch.linalg.cholesky(a.to(DEV))
    assert torch_pjrt.metrics.counters().get("executions", 0) == 0
    with pytest.raises(RuntimeError, match="not positive-definite"):
        bad.cpu()
    with pytest.raises(RuntimeError, match="not positive-definite"):
        torch.linalg.cholesky(a.to(DEV)).cpu()


@pytest.mark.parametrize("upper,left,unit", [(False, True, False), (True, False, True)])
def test_solve_triangular(upper, left, unit):
    a = well_conditioned(2, 4, 4, seed=1)
    b = torch.randn(2, 4, 3, generator=gen(2)) if left else torch.randn(2, 3, 4, generator=gen(2))
    compare(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left, unitriangular=unit), a, b)


def test_triangular_solve_old_api_broadcasts():
    a = well_conditioned(4, 4, seed=3)
    b = torch.randn(2, 4, 2, generator=gen(4))
    compare(lambda y, x: torch.triangular_solve(y, x, upper=False, transpose=True), b, a)


@pytest.mark.parametrize("left", [False])  # left=True: the vector case below and lu_solve
def test_solve_batched_forward_backward(left):
    a = well_conditioned(3, 5, 5, seed=5)
    b = torch.randn(3, 5, 2, generator=gen(6)) if left else torch.randn(3, 2, 5, generator=gen(6))
    compare(lambda x, y: torch.linalg.solve(x, y, left=left), a, b)


def test_solve_vector_rhs_and_broadcast_batch():
    a = well_conditioned(2, 4, 4, seed=8)
    compare(lambda x, y: torch.linalg.solve(x, y), a, torch.randn(4, generator=gen(9)))


def test_solve_and_inv_of_singular_raise_and_ex_reports_info():
    # the last row and column are zero: the last pivot is exactly zero in any
    # elimination order, of A and of A^T (what det factors)
    s = torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.solve(s.to(DEV), torch.ones(3).to(DEV)).cpu()
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.inv(s.to(DEV)).cpu()
    got = torch.linalg.lu_factor_ex(s.to(DEV))
    want = torch.linalg.lu_factor_ex(s)
    assert int(got.info.cpu()) == int(want.info) == 3
    assert torch.equal(got.pivots.cpu(), want.pivots)
    sign, logabs = torch.linalg.slogdet(s.to(DEV))
    assert float(sign.cpu()) == 0.0 and float(logabs.cpu()) == float("-inf")


def test_inv_batched_forward_backward():
    compare(torch.linalg.inv, well_conditioned(3, 4, 4, seed=11))


def test_det_slogdet_logdet():
    compare(torch.linalg.det, well_conditioned(3, 4, 4, seed=13))
    compare(torch.logdet, spd(2, n=4, seed=14))


def test_lu_factor_pivots_match_the_cpu_and_lu_solve():
    a = torch.randn(2, 6, 6, generator=gen(15))
    want = torch.linalg.lu_factor(a)
    got = torch.linalg.lu_factor(a.to(DEV))
    assert torch.equal(got.pivots.cpu(), want.pivots)
    torch.testing.assert_close(got.LU.cpu(), want.LU, rtol=1e-4, atol=1e-4)
    b = torch.randn(2, 6, 3, generator=gen(16))
    for left, adjoint, grad in [(True, True, True), (False, False, False)]:
        rhs = b if left else b.mT
        compare(lambda lu, y: torch.linalg.lu_solve(lu, want.pivots.to(lu.device), y, left=left, adjoint=adjoint),
                want.LU, rhs, grad=grad)


@pytest.mark.parametrize("shape", [(2, 4, 6)])
def test_lu_and_lu_unpack(shape):
    a = torch.randn(*shape, generator=gen(17))
    compare(lambda x: torch.linalg.lu(x), a)
    lu, piv = torch.linalg.lu_factor(a)
    p, l, u = torch.lu_unpack(lu.to(DEV), piv.to(DEV))
    wp, wl, wu = torch.lu_unpack(lu, piv)
    assert torch.equal(p.cpu(), wp) and torch.equal(l.cpu(), wl) and torch.equal(u.cpu(), wu)


@pytest.mark.parametrize("mode,shape", [("reduced", (2, 6, 4)), ("complete", (4, 6)), ("complete", (6, 4)),
                                        ("r", (5, 5))])
def test_qr(mode, shape):
    a = torch.randn(*shape, generator=gen(18))
    if mode == "r":
        compare(lambda x: torch.linalg.qr(x, mode="r")[1], a, grad=False)  # no backward without Q
        assert torch.linalg.qr(a.to(DEV), mode="r").Q.shape == (0,)
    elif mode == "complete" and shape[-2] > shape[-1]:
        compare(lambda x: torch.linalg.qr(x, mode="complete"), a, grad=False)  # no backward on the CPU either
    else:
        compare(lambda x: torch.linalg.qr(x, mode=mode), a)


def test_eigh_and_eigvalsh():
    # well-separated eigenvalues (1, 2, ..., 6): eigenvector gradients scale
    # with 1 / gap, and float32 rounding with them
    q = torch.linalg.qr(torch.randn(3, 6, 6, generator=gen(19))).Q
    a = q @ torch.diag_embed(torch.arange(1.0, 7.0).expand(3, 6)) @ q.mT
    torch.testing.assert_close(torch.linalg.eigvalsh(a.to(DEV)).cpu(), torch.linalg.eigvalsh(a), rtol=1e-4, atol=1e-4)
    # Eigenvectors are defined up to sign: compare what does not depend on it.
    def invariant(x):
        w, v = torch.linalg.eigh(x, UPLO="U")
        return w, v * v, v @ torch.diag_embed(w) @ v.mT
    compare(invariant, a, rtol=2e-4, atol=2e-4)


def test_float64_eigh_and_svd_reach_float64_accuracy():
    # XLA's Jacobi sweeps stop at about 1e-8 |A| in float64 (their
    # off-diagonal norm cancels); two refinement steps bring it to rounding
    a = torch.randn(2, 32, 32, generator=gen(21), dtype=torch.float64)
    a = a + a.mT
    w, v = (t.cpu() for t in torch.linalg.eigh(a.to(DEV)))
    assert (v @ torch.diag_embed(w) @ v.mT - a).abs().max() < 1e-12
    assert (v.mT @ v - torch.eye(32, dtype=torch.float64)).abs().max() < 1e-13
    torch.testing.assert_close(w, torch.linalg.eigvalsh(a), rtol=0, atol=1e-12)
    u, sv, vh = (t.cpu() for t in torch.linalg.svd(a[0].to(DEV)))
    assert (u @ torch.diag(sv) @ vh - a[0]).abs().max() < 1e-12
    # eigenvalues 1e-6 apart
    q = torch.linalg.qr(torch.randn(16, 16, generator=gen(22), dtype=torch.float64)).Q
    ev = 1 + torch.arange(16, dtype=torch.float64) * 1e-6
    c = q @ torch.diag(ev) @ q.T
    assert (torch.linalg.eigvalsh(((c + c.T) / 2).to(DEV)).cpu() - ev).abs().max() < 1e-13


def test_non_finite_inputs_give_nan_or_the_cpus_error():
    # XLA's sweeps stop at once on a NaN norm: eigvalsh of a NaN matrix was
    # its sorted diagonal, svdvals zeros; inv of a NaN matrix said "singular"
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([[1.0, nan, 0.0], [nan, 2.0, 0.0], [0.0, 0.0, 3.0]])
    for x in (a, a.nan_to_num(nan=inf)):
        w, v = torch.linalg.eigh(x.to(DEV))
        assert w.cpu().isnan().all() and v.cpu().isnan().all()  # the CPU's: NaN where the NaN reaches
    upper_only = torch.tensor([[1.0, nan, 0.0], [0.5, 2.0, 0.0], [0.0, 0.0, 3.0]])  # UPLO="L" does not read it
    torch.testing.assert_close(torch.linalg.eigvalsh(upper_only.to(DEV)).cpu(), torch.linalg.eigvalsh(upper_only))
    assert torch.linalg.eigvalsh(upper_only.to(DEV), UPLO="U").cpu().isnan().all()
    for fn in (torch.linalg.svdvals, torch.linalg.pinv, torch.linalg.matrix_rank, lambda x: torch.linalg.matrix_norm(x, 2)):
        with pytest.raises(torch.linalg.LinAlgError) as cpu:
            fn(a)
        with pytest.raises(torch.linalg.LinAlgError) as dev:
            fn(a.to(DEV)).cpu()
        assert str(dev.value).startswith(str(cpu.value)), (str(dev.value), str(cpu.value))
        got, want = fn(a.nan_to_num(nan=inf).to(DEV)).cpu(), fn(a.nan_to_num(nan=inf))
        torch.testing.assert_close(got, want, equal_nan=True)  # inf: NaN (rank 0), as the CPU
    for fn in (torch.linalg.inv, lambda x: torch.linalg.solve(x, torch.ones(3, 1, device=x.device))):
        torch.testing.assert_close(fn(a.to(DEV)).cpu(), fn(a), equal_nan=True)


@pytest.mark.parametrize("shape", [(2, 6, 4)])
def test_svd_and_svdvals(shape):
    a = torch.randn(*shape, generator=gen(20)) + 2 * torch.eye(*shape[-2:])
    torch.testing.assert_close(torch.linalg.svdvals(a.to(DEV)).cpu(), torch.linalg.svdvals(a), rtol=1e-4, atol=1e-4)

    # Singular vectors are defined up to one sign per pair.
    def invariant(x):
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        return s, u * u, vh * vh, u @ torch.diag_embed(s) @ vh
    compare(invariant, a, rtol=2e-4, atol=2e-4)
    u, s, vh = torch.linalg.svd(a.to(DEV), full_matrices=True)
    m, n = shape[-2:]
    assert u.shape[-2:] == (m, m) and vh.shape[-2:] == (n, n)
    eye = torch.eye(m).expand(u.shape)
    torch.testing.assert_close((u.mT @ u).cpu(), eye, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((vh @ vh.mT).cpu(), torch.eye(n).expand(vh.shape), rtol=1e-5, atol=1e-5)
    k = min(m, n)
    torch.testing.assert_close((u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :]).cpu(), a, rtol=1e-4, atol=1e-4)


def test_svd_of_rank_deficient_matrices_has_orthonormal_factors():
    # The eigenvectors of +s and -s (and of the |m - n| zeros) of the
    # symmetric form the SVD is computed from mix where s is small next to
    # |A|: U's column of diag(3, 0, 1) was zero, V's of length sqrt(2), and
    # a singular value rounded to -1e-8.
    torch_pjrt.metrics.reset()
    g = gen(23)
    rank2 = torch.randn(3, 2, generator=g) @ torch.randn(2, 3, generator=g)
    q1, q2 = (torch.linalg.qr(torch.randn(n, 4, generator=g)).Q for n in (6, 4))
    small = q1 @ torch.diag(torch.tensor([3.0, 1.0, 1e-2, 1e-5])) @ q2.T
    cases = [torch.diag(torch.tensor([3.0, 0.0, 1.0])), torch.zeros(2, 2), rank2, small,
             torch.randn(5, 1, generator=g) @ torch.randn(1, 3, generator=g),  # tall, rank 1
             torch.randn(3, 1, generator=g) @ torch.randn(1, 5, generator=g),  # wide, rank 1
             torch.stack([rank2, torch.eye(3)]),  # batched
             torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])]
    for a in cases:
        scale = max(a.abs().max().item(), 1.0)
        m, n = a.shape[-2:]
        k = min(m, n)
        for full in (False, True):
            u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(DEV), full_matrices=full))
            assert (s >= 0).all(), s
            torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=0, atol=1e-5 * scale)
            eye_u, eye_v = torch.eye(u.shape[-1]).expand(u.mT.shape[:-1] + (u.shape[-1],)), torch.eye(vh.shape[-2])
            torch.testing.assert_close(u.mT @ u, eye_u, rtol=0, atol=1e-5)
            torch.testing.assert_close(vh @ vh.mT, eye_v.expand(eye_u.shape[:-2] + eye_v.shape), rtol=0, atol=1e-5)
            rebuilt = u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :]
            torch.testing.assert_close(rebuilt, a, rtol=0, atol=1e-5 * scale)
        assert (torch.linalg.svdvals(a.to(DEV)).cpu() >= 0).all()
    # svdvals' gradient, U V^T, is orthogonal (at diag(3, 0, 1) it was diag(1, 0, 1))
    x = torch.diag(torch.tensor([3.0, 0.0, 1.0])).to(DEV).requires_grad_()
    torch.linalg.svdvals(x).sum().backward()
    grad = x.grad.cpu()
    torch.testing.assert_close(grad @ grad.T, torch.eye(3), rtol=0, atol=1e-5)
    assert torch_pjrt.metrics.fallbacks() == {}


def test_gaussian_log_likelihood_through_cholesky_trains():
    """Fit a full-covariance Gaussian: the scale L is lower-triangular with a
    positive (softplus) diagonal; the negative log-likelihood goes, as
    torch.distributions.MultivariateNormal's, through the Cholesky factor of
    the covariance: a triangular solve and the log-determinant from its
    diagonal."""
    d, n = 4, 64
    torch.manual_seed(0)
    true_l = torch.tril(torch.randn(d, d)) + 2 * torch.eye(d)
    data = torch.randn(n, d) @ true_l.mT + torch.arange(d)

    def nll(raw, mu, x):
        diag = torch.nn.functional.softplus(torch.diagonal(raw))
        scale = torch.tril(raw, -1) + torch.diag_embed(diag)
        cov = scale @ scale.mT
        chol = torch.linalg.cholesky(cov)
        z = torch.linalg.solve_triangular(chol, (x - mu).mT, upper=False)
        logdet = 2 * torch.diagonal(chol).log().sum()  # as MultivariateNormal: from the factor
        return 0.5 * (z.pow(2).sum(0).mean() + logdet + d * math.log(2 * math.pi))

    losses = {}
    for device in ("cpu", DEV):
        raw = torch.eye(d).to(device).requires_grad_()
        mu = torch.zeros(d, device=device, requires_grad=True)
        opt = torch.optim.AdamW([raw, mu], lr=0.1)
        x = data.to(device)
        trace = []
        for _ in range(5):
            opt.zero_grad()
            loss = nll(raw, mu, x)
            loss.backward()
            if device != "cpu":
                torch_pjrt.sync()  # one program for the likelihood and its gradient, the same every step
            opt.step()
            trace.append(loss.detach())
        losses[str(device)] = (torch.stack(trace).cpu(), raw.detach().cpu(), mu.detach().cpu())
    want, got = losses["cpu"], losses[str(DEV)]
    assert want[0][-1] < want[0][0]  # it learns
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_matrix_exp_scales_each_matrix_and_backward():
    """Norms from 0.01 to 20 in one batch (each matrix needs its own number of
    squarings), float32 and float64 against the float64 CPU result (float32's
    squarings amplify rounding on the CPU too: there it is 8.5e-6 of the
    largest entry off for a norm-40 matrix), gradients through the
    block-matrix formula; an infinite entry gives NaN as on the CPU."""
    a = torch.randn(4, 5, 5, generator=gen(3), dtype=torch.float64) * torch.tensor([0.01, 1.0, 6.0, 20.0], dtype=torch.float64)[:, None, None]
    want = torch.linalg.matrix_exp(a)
    size = want.abs().amax((-2, -1), keepdim=True)
    for dtype, tol in ((torch.float32, 3e-5), (torch.float64, 1e-12)):
        got = torch.linalg.matrix_exp(a.to(dtype).to(DEV)).cpu().double()
        torch.testing.assert_close(got / size, want / size, rtol=0, atol=tol)
    compare(torch.linalg.matrix_exp, torch.randn(2, 4, 4, generator=gen(4)) * 0.8)
    inf = torch.tensor([[float("inf"), 0.0], [0.0, 1.0]])
    assert torch.linalg.matrix_exp(inf.to(DEV)).cpu().isnan().all()


def test_householder_product_and_orthogonal_parametrization_train():
    """householder_product (orgqr) against LAPACK's, then a layer kept
    orthogonal by torch.nn.utils.parametrizations.orthogonal through each of
    its maps (matrix_exp, cayley, householder) trains 3 Adam steps as on the
    CPU."""
    compare(torch.linalg.householder_product, torch.randn(2, 6, 4, generator=gen(5)), torch.rand(2, 3, generator=gen(6)))
    for orthogonal_map, shape in (("matrix_exp", (6, 6)), ("cayley", (6, 6)), ("householder", (6, 4))):
        torch.manual_seed(0)
        layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(shape[1], shape[0]), orthogonal_map=orthogonal_map)
        built = torch.nn.Sequential(torch.nn.Tanh(), layer)
        x, y = torch.randn(8, shape[1], generator=gen(8)), torch.randn(8, shape[0], generator=gen(9))
        runs = {}
        for device in ("cpu", DEV):
            model = copy.deepcopy(built).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.05)
            losses = []
            for _ in range(3):
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            w = model[1].weight.detach()
            runs[str(device)] = (torch.stack(losses).cpu(), w.cpu())
        want, got = runs["cpu"], runs[str(DEV)]
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1].mT @ got[1] if shape[0] >= shape[1] else got[1] @ got[1].mT,
                                   torch.eye(min(shape)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4), (3, 0)])
def test_geqrf_is_lapacks_and_ormqr_applies_its_q(shape):
    """geqrf's compact form (R above, reflectors below, tau) equals LAPACK's;
    ormqr multiplies by Q or its transpose from either side, with gradients;
    an orthogonal parametrization registered on a pjrt module (geqrf in its
    right_inverse) stays on the device. Errors as the CPU's."""
    a = torch.randn(*shape, generator=gen(20), dtype=torch.float64)
    want, got = torch.geqrf(a), torch.geqrf(a.to(DEV))
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)
    m = shape[-2]
    for left in (True, False):
        for transpose in (False, True):
            c = torch.randn(*shape[:-2], *((m, 2) if left else (2, m)), generator=gen(21))
            compare(lambda h, t, o: torch.ormqr(h, t, o, left=left, transpose=transpose),
                    want[0].float(), want[1].float(), c, grad=a.numel() > 0)  # (no reflectors: no gradient)
    with pytest.raises(RuntimeError, match=r"other.shape\[-2\] must be equal to input.shape\[-2\]"):
        torch.ormqr(got[0], got[1], torch.zeros(*shape[:-2], m + 1, 2, dtype=torch.float64, device=DEV))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.geqrf(torch.zeros(3, device=DEV))
    if shape == (5, 3):
        layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(3, 5).to(DEV))
        w = layer.weight.detach().cpu()
        torch.testing.assert_close(w.mT @ w, torch.eye(3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,driver", [((2, 6, 4), None), ((6, 4), "gelsd"), ((6, 4), "gels"), ((3, 5), None),
                                          ((5, 5), "gelss")])
def test_lstsq_matches_the_cpu(shape, driver):
    """Solutions (and their gradients), ranks, singular values and residuals
    as the CPU's driver returns them; a rank-deficient matrix gives the
    minimum-norm solution and its rank."""
    a = torch.randn(*shape, generator=gen(10))
    b = torch.randn(*shape[:-1], 3, generator=gen(11))
    want = torch.linalg.lstsq(a, b, driver=driver)
    got = torch.linalg.lstsq(a.to(DEV), b.to(DEV), driver=driver)
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
    compare(lambda x, y: torch.linalg.lstsq(x, y, driver=driver).solution, a, b)
    deficient = a.clone()
    deficient[..., 1] = deficient[..., 0]
    want = torch.linalg.lstsq(deficient, b, driver="gelsd")
    got = torch.linalg.lstsq(deficient.to(DEV), b.to(DEV), driver="gelsd")
    assert torch.equal(got.rank.cpu(), want.rank)
    torch.testing.assert_close(got.solution.cpu(), want.solution, rtol=1e-4, atol=1e-4)
    vec = torch.linalg.lstsq(a.to(DEV), b[..., 0].to(DEV), driver=driver).solution
    torch.testing.assert_close(vec.cpu(), torch.linalg.lstsq(a, b[..., 0], driver=driver).solution, rtol=1e-4, atol=1e-4)


def test_complex_inputs_run_on_the_cpu_and_eig_gradients_train():
    """The lowerings are real-valued: complex inputs run on the CPU (counted),
    which PyTorch's backward of linalg.eig needs (it solves a complex
    system); a spectral penalty's gradient equals the CPU's."""
    a = torch.tensor([[2.0, 1.0, 0.0], [0.5, 3.0, 1.0], [0.0, 1.0, 4.0]])
    for loss in (lambda m: torch.linalg.eigvals(m).abs().max(),
                 lambda m: (lambda w, v: v.abs().sum() + w.real.sum())(*torch.linalg.eig(m))):
        grads = []
        for d in ("cpu", DEV):
            m = a.clone().to(d).requires_grad_()
            loss(m).backward()
            grads.append(m.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0])
    z = torch.randn(3, 3, dtype=torch.complex64, generator=gen(1)) + 3 * torch.eye(3)
    rhs = torch.randn(3, 2, dtype=torch.complex64, generator=gen(2))
    for op in (lambda m: torch.linalg.solve(m, rhs.to(m.device)), torch.linalg.inv, torch.linalg.det,
               lambda m: torch.linalg.slogdet(m)[1], lambda m: torch.linalg.qr(m)[1]):
        torch.testing.assert_close(op(z.to(DEV)).cpu(), op(z))
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.complex64)
    for op in (torch.linalg.inv, lambda m: torch.linalg.solve(m, torch.ones(2, 1, dtype=m.dtype, device=m.device))):
        with pytest.raises(torch.linalg.LinAlgError):  # at once, as on the CPU: not at a later, unrelated read
            op(singular.to(DEV))
    assert (torch.ones(3, device=DEV) * 2).sum().item() == 6.0
    fell = torch_pjrt.metrics.fallbacks()
    assert {"aten::linalg_eig", "aten::_linalg_solve_ex", "aten::linalg_inv_ex"} <= set(fell), fell
    torch_pjrt.metrics.reset()  # counted, as documented: not what the fixture looks for
