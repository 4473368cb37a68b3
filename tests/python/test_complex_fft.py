"""Complex numbers and torch.fft on pjrt against eager CPU, forward and
backward, with no CPU fallback: elementwise complex arithmetic, abs/angle/
real/imag/conj, view_as_real/view_as_complex as true views, exact complex
transfers, every torch.fft function (norms, n= padding and truncation, dim=),
and an FFT-convolution model that trains like the CPU."""

import re

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

DEV = torch_pjrt.device()


def r(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)


def c(*shape, seed=0, dtype=torch.complex64):
    part = torch.float64 if dtype == torch.complex128 else torch.float32
    return torch.complex(r(*shape, seed=seed, dtype=part), r(*shape, seed=seed + 1, dtype=part))


# name -> (fn, inputs, differentiable input indices)
CASES = {
    # elementwise complex arithmetic, complex leaves
    "add_sub_mul_div_neg": (lambda a, b: (a + b) * a - b / (a + 3) - (-a) * 0.5, [c(3, 4), c(3, 4, seed=2)], [0, 1]),
    "exp_log_pow": (lambda a: a.exp() + (a + 3).log() + a.pow(2) + a ** 3 + a.sqrt(), [c(5)], [0]),
    "conj_lazy_and_physical": (lambda a, b: a * b.conj() + torch.conj_physical(a) + a.conj().resolve_conj() * 2
                               + (a.conj() @ b.conj().T), [c(3, 3), c(3, 3, seed=4)], [0, 1]),
    "mul_by_real": (lambda a, x: a * x + x / (a + 3) + 2.5 * a + a * (1 - 2j) + x.to(a.dtype), [c(2, 5), r(5)], [0, 1]),
    "sum_mean": (lambda a: torch.stack([a.sum(), a.mean(), a.sum(1).sum(), a.mean(0, keepdim=True).sum()]),
                 [c(4, 6)], [0]),
    "abs_angle_sgn": (lambda a: torch.stack([a.abs(), a.angle(), a.sgn().real, a.sgn().imag]), [c(3, 4)], [0]),
    # complex gradients take the conjugate of the derivative (they did not)
    "tanh_sigmoid": (lambda a: a.tanh() * 2 + torch.sigmoid(a) + F.tanhshrink(a), [c(3, 4)], [0]),
    "conj_physical_in_place": (lambda a: (a * 1).conj_physical_() + (a * 2)[:, 1:].conj_physical_().sum(), [c(3, 4)], [0]),
    # a complex variance is real (the mean of |x - mean|^2); it was complex
    "var_std": (lambda a: torch.cat([a.var(0), a.std(1), torch.var_mean(a, 1)[0], torch.std_mean(a)[0].reshape(1),
                                     torch.var_mean(a, 0)[1].abs()]), [c(3, 4)], [0]),
    "real_imag": (lambda a: a.real * 2 + a.imag - a.real * a.imag, [c(3, 4)], [0]),
    "view_as_real_and_back": (lambda a, x: torch.view_as_complex(torch.view_as_real(a) * 2 + x), [c(3, 4), r(3, 4, 2)],
                              [0, 1]),
    "complex_polar": (lambda x, y: torch.complex(x, y) * torch.polar(x.abs() + 0.1, y), [r(6), r(6, seed=3)], [0, 1]),
    "angle_of_real": (lambda x: torch.angle(x) + torch.angle(x.double()).float(),
                      [torch.tensor([-1.5, 0.0, 2.0, -0.0, float("nan")])], []),
    "complex128": (lambda a: (a * a.conj() + a.exp()).sum(0) / 3, [c(4, 3, dtype=torch.complex128)], [0]),
    # the case: abs of a spectrum is real
    "rfft_abs": (lambda x: torch.fft.rfft(x).abs(), [r(4, 8)], [0]),
    # torch.fft: every function, norms, n= padding/truncation, dim=
    "fft_ifft": (lambda a: torch.fft.fft(a) + torch.fft.ifft(a, norm="ortho") + torch.fft.fft(a, norm="forward"),
                 [c(3, 8)], [0]),
    "fft_n_dim": (lambda a: torch.cat([torch.fft.fft(a, n=5, dim=0), torch.fft.ifft(a, n=12, dim=0)[:5]], 1),
                  [c(7, 4)], [0]),
    "rfft_norms_n": (lambda x: torch.cat([torch.fft.rfft(x), torch.fft.rfft(x, norm="ortho"),
                                          torch.fft.rfft(x, norm="forward"), torch.fft.rfft(x, n=12)[..., :5],
                                          torch.fft.rfft(x, n=6, dim=0)[:, :5]], 0), [r(9, 8)], [0]),
    "irfft_n": (lambda a: torch.cat([torch.fft.irfft(a), torch.fft.irfft(a, n=7), torch.fft.irfft(a, n=12, norm="ortho")[:, :7],
                                     torch.fft.irfft(a, n=4, norm="forward")], 1), [c(3, 5)], [0]),
    "fft2_ifft2": (lambda a: torch.fft.fft2(a) + torch.fft.ifft2(a, norm="ortho") + torch.fft.fft2(a, dim=(0, 2)),
                   [c(3, 4, 5)], [0]),
    "rfft2_irfft2": (lambda x: torch.fft.irfft2(torch.fft.rfft2(x) * 1.5, s=x.shape[-2:]) + torch.fft.irfft2(
        torch.fft.rfft2(x, norm="forward"), s=(4, 6), norm="forward")[..., :4, :5], [r(2, 4, 5)], [0]),
    "fftn_rfftn_irfftn": (lambda x: torch.fft.irfftn(torch.fft.rfftn(x, dim=(0, 1, 2, 3)) + torch.fft.fftn(x, dim=(1, 3))
                                                     [..., :3], s=x.shape, dim=(0, 1, 2, 3)), [r(2, 3, 4, 5)], [0]),
    "hfft_ihfft": (lambda a, x: torch.cat([torch.fft.hfft(a, n=8), torch.fft.ihfft(x).real, torch.fft.ihfft(x).imag], 0),
                   [c(5), r(8)], [0, 1]),
    "fftshift": (lambda a: torch.fft.ifftshift(torch.fft.fftshift(torch.fft.fft(a), dim=-1)
                                                   * torch.arange(5, device=a.device)),
                 [c(3, 5)], [0]),
    "fft_complex128": (lambda x: torch.fft.irfft(torch.fft.rfft(x) * torch.fft.fft(x.to(torch.complex128))[:3], n=5),
                       [r(5, dtype=torch.float64)], [0]),
}


def _loss(out, weight):
    if out.is_complex():
        return (torch.view_as_real(out) * weight).sum()
    return (out * weight).sum()


@pytest.mark.parametrize("name", list(CASES))
def test_complex_op_matches_cpu(name):
    fn, inputs, grads = CASES[name]
    torch_pjrt.metrics.reset()
    cpu_in = [x.clone().requires_grad_(i in grads) for i, x in enumerate(inputs)]
    dev_in = [x.clone().to(DEV).requires_grad_(i in grads) for i, x in enumerate(inputs)]
    want = fn(*cpu_in)
    got = fn(*dev_in)
    assert got.device.type == "pjrt" and got.dtype == want.dtype and got.shape == want.shape
    double = want.dtype in (torch.float64, torch.complex128)
    tol = dict(rtol=1e-10, atol=1e-10) if double else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **tol)
    if grads:
        shape = torch.view_as_real(want).shape if want.is_complex() else want.shape
        weight = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        _loss(want, weight.to(torch.view_as_real(want).dtype if want.is_complex() else want.dtype)).backward()
        _loss(got, weight.to(torch.view_as_real(want).dtype if want.is_complex() else want.dtype).to(DEV)).backward()
        for i in grads:
            torch.testing.assert_close(dev_in[i].grad.cpu(), cpu_in[i].grad, rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"grad of input {i}: {m}")
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def _bits(z):
    part = torch.view_as_real(z.resolve_conj()) if z.is_complex() else z
    return part.contiguous().view(torch.int64 if part.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_transfers_round_trip_exactly(dtype):
    part = torch.float64 if dtype == torch.complex128 else torch.float32
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30, -3.5, 2.0 ** 100], dtype=part)
    z = torch.complex(special, special.flip(0))
    torch_pjrt.metrics.reset()
    back = z.to(DEV).cpu()
    assert back.dtype == dtype and torch.equal(_bits(back), _bits(z))
    assert torch.equal(_bits(z.to(DEV)[1::3].cpu()), _bits(z[1::3]))  # a strided view
    # computed on the device: the conjugate flips only the imaginary sign bits
    assert torch.equal(_bits(torch.conj_physical(z.to(DEV)).cpu()), _bits(torch.conj_physical(z)))
    assert torch.equal(_bits(torch.view_as_real(z.to(DEV)).mul(1).cpu()), _bits(torch.view_as_real(z)))
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def test_views_between_complex_and_real_alias_both_ways():
    def work(dev):
        z = c(3, 4).to(dev)
        v = torch.view_as_real(z)        # (3, 4, 2) float32 over z's storage
        v[0, 1, 1] = 5.0                 # the imaginary part of z[0, 1]
        z.real.mul_(2)                   # through real: a view of view_as_real
        z.imag[2] += 1.0
        x = r(2, 3, 2).to(dev)
        w = torch.view_as_complex(x)     # (2, 3) complex64 over x's storage
        w[1, 2] = 7 - 1j
        w.mul_(1j)
        zc = z.conj()
        zc[1, 0] = 2 + 3j                # written through a lazy conjugate view
        return [t.cpu() for t in (z, v, x, w, zc.resolve_conj())]

    torch_pjrt.metrics.reset()
    for got, want in zip(work(DEV), work("cpu")):
        assert torch.equal(got, want)
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def test_printing_a_complex_tensor_matches_the_cpu():
    z = c(2, 3)
    # the same text but for the device (which may move to a line of its own)
    assert re.sub(r"\s+", "", repr(z.to(DEV))) == re.sub(r"\s+", "", repr(z))[:-1] + ",device='pjrt:0')"
    assert str(torch.fft.rfft(r(4)).to(DEV).abs()) .startswith("tensor([")


def test_fft_convolution_model_trains_like_the_cpu():
    """A circular FFT convolution (rfft of signal and kernel, product, irfft)
    with learnable kernels, then a linear head: 5 AdamW steps on pjrt and on
    the CPU from the same start give the same parameters."""

    class FftConv(torch.nn.Module):
        def __init__(self, channels, length, taps):
            super().__init__()
            self.kernel = torch.nn.Parameter(torch.randn(channels, taps) / taps)
            self.head = torch.nn.Linear(channels * length, 3)
            self.length = length

        def forward(self, x):
            spec = torch.fft.rfft(x, dim=-1) * torch.fft.rfft(self.kernel, n=self.length, dim=-1)
            y = torch.fft.irfft(spec, n=self.length, dim=-1)
            return self.head(F.gelu(y).flatten(1))

    torch.manual_seed(0)
    cpu_model = FftConv(4, 16, 5)
    dev_model = FftConv(4, 16, 5)
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model.to(DEV)
    start = cpu_model.kernel.detach().clone()
    data = [(r(8, 4, 16, seed=s), r(8, 3, seed=s + 100)) for s in range(5)]
    torch_pjrt.metrics.reset()
    for model, dev in ((cpu_model, "cpu"), (dev_model, DEV)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for x, y in data:
            opt.zero_grad()
            F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
            torch_pjrt.sync()
    for (name, want), got in zip(cpu_model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert (cpu_model.kernel.detach() - start).abs().max() > 1e-3  # it trained
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.fallbacks()


def test_inplace_abs_of_complex_raises_and_out_form_matches_the_cpu():
    z = c(4)
    with pytest.raises(RuntimeError, match="In-place abs is not supported for complex tensors"):
        z.to(DEV).abs_()
    out = torch.empty(4, dtype=torch.complex64, device=DEV)
    torch.abs(z.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.abs(z, out=torch.empty(4, dtype=torch.complex64)))


def test_sign_of_complex_raises_as_on_the_cpu():
    z = c(3)
    with pytest.raises(RuntimeError) as cpu:
        torch.sign(z)
    with pytest.raises(RuntimeError, match="torch.sgn instead") as dev:
        torch.sign(z.to(DEV))
    assert type(dev.value) is type(cpu.value) and str(dev.value) == str(cpu.value)
    torch.testing.assert_close(torch.sgn(z.to(DEV)).cpu(), torch.sgn(z))


def test_complex_power_of_zero_base_is_zero_as_on_the_cpu():
    """XLA's complex power is exp(e log x): NaN at x = 0 where the CPU gives
    0 for an exponent with a positive real part."""
    base = torch.tensor([0j, 0j, 1 + 1j, -2 + 0j])
    e = torch.tensor([1 + 2j, 0.5 + 0j, 2 + 0j, 0.5 + 0j])
    torch.testing.assert_close((base.to(DEV) ** e.to(DEV)).cpu(), base ** e)
    torch.testing.assert_close((base.real.to(DEV) ** (1 + 2j)).cpu(), base.real ** (1 + 2j))


REFUSED = {
    "fmod": lambda z: torch.fmod(z, 2.0), "remainder": lambda z: torch.remainder(z, z),
    "maximum": lambda z: torch.maximum(z, z), "minimum": lambda z: torch.minimum(z, z),
    "atan2": lambda z: torch.atan2(z, z), "isposinf": torch.isposinf, "isneginf": torch.isneginf, "mish": F.mish,
    # computed here before (mse_loss gave a complex "loss", isin all False)
    "mse_loss": lambda z: F.mse_loss(z, z * 2), "isin": lambda z: torch.isin(z, z[:1]),
    "layer_norm": lambda z: F.layer_norm(z.reshape(3, 4), (4,)),
    "batch_norm": lambda z: F.batch_norm(z.reshape(2, 3, 2), None, None, training=True),
    "avg_pool2d": lambda z: F.avg_pool2d(z.reshape(1, 3, 2, 2), 2),
    "adaptive_avg_pool3d": lambda z: F.adaptive_avg_pool3d(z.reshape(1, 3, 2, 2, 1), (1, 2, 1)),
    "nearest": lambda z: F.interpolate(z.reshape(1, 3, 2, 2), scale_factor=2),
    "bilinear": lambda z: F.interpolate(z.reshape(1, 3, 2, 2), scale_factor=2, mode="bilinear"),
    "bicubic": lambda z: F.interpolate(z.reshape(1, 3, 2, 2), scale_factor=2, mode="bicubic"),
    "linear": lambda z: F.interpolate(z.reshape(1, 3, 4), scale_factor=2, mode="linear"),
    # sort-based: StableHLO's "cannot sort by complex keys" (a RuntimeError), unique_consecutive computed
    "sort": torch.sort, "argsort": torch.argsort, "topk": lambda z: torch.topk(z, 2), "unique": torch.unique,
    "unique_dim": lambda z: torch.unique(z.reshape(3, 4), dim=1), "unique_consecutive": torch.unique_consecutive,
    "unique_consecutive_dim": lambda z: torch.unique_consecutive(z.reshape(3, 4), dim=0),
    "median": torch.median, "median_dim": lambda z: torch.median(z, 0), "nanmedian": torch.nanmedian,
    "kthvalue": lambda z: torch.kthvalue(z, 2), "mode": lambda z: torch.mode(z),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_complex_ops_the_cpu_refuses_raise_its_error(name):
    """These computed on complex inputs (fmod killed the process: XLA's CPU
    compiler crashes on a complex remainder); the CPU refuses them."""
    fn = REFUSED[name]
    z = c(12)
    with pytest.raises((RuntimeError, NotImplementedError)) as cpu:
        fn(z)
    with pytest.raises(cpu.type) as dev:
        fn(z.to(DEV)).cpu()
    assert str(dev.value) == str(cpu.value)


def test_complex_scatter_reduce_matches_the_cpu():
    """sum, mean and prod of complex updates compute (they failed on a
    complex comparison inside StableHLO); amax and amin raise the CPU's error."""
    z, i = c(6), torch.tensor([0, 0, 1, 2, 2, 2])
    for reduce in ("sum", "mean", "prod"):
        for include_self in (False, True):
            want = torch.ones(4, dtype=torch.complex64).scatter_reduce(0, i, z, reduce, include_self=include_self)
            got = torch.ones(4, dtype=torch.complex64, device=DEV).scatter_reduce(0, i.to(DEV), z.to(DEV), reduce,
                                                                                  include_self=include_self)
            torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(NotImplementedError, match="reduce_amax\" not implemented for 'ComplexFloat'"):
        torch.ones(4, dtype=torch.complex64, device=DEV).scatter_reduce(0, i.to(DEV), z.to(DEV), "amax")


@pytest.mark.parametrize("name,make,fn", [
    ("kthvalue 0-d complex", lambda: torch.tensor(1 + 2j), lambda t: torch.kthvalue(t, 1)),
    ("mode 0-d complex", lambda: torch.tensor(1 + 2j), torch.mode),
    ("kthvalue 0-d bool", lambda: torch.tensor(True), lambda t: torch.kthvalue(t, 1, -1)),
    ("median empty complex", lambda: torch.ones(2, 0, dtype=torch.complex64), torch.median),
    ("nanmedian empty complex", lambda: torch.ones(2, 0, dtype=torch.complex64), torch.nanmedian),
    ("mode empty complex", lambda: torch.ones(2, 0, dtype=torch.complex64), lambda t: torch.mode(t, -1)),
    ("median empty bool", lambda: torch.zeros(0, dtype=torch.bool), lambda t: torch.median(t, 0)),
    ("topk empty complex", lambda: torch.zeros(0, dtype=torch.complex64), lambda t: torch.topk(t, 1)),
])
def test_the_cpus_shortcuts_come_before_its_dtype_refusals(name, make, fn):
    """A 0-d input is its own answer, an empty dim or a bad k is the CPU's
    error, before it looks at the dtype: as the CPU, not a refusal."""
    def outcome(device):
        try:
            r = fn(make().to(device))
            return tuple(x.cpu() for x in r) if isinstance(r, tuple) else (r.cpu(),)
        except Exception as e:  # noqa: BLE001 - the CPU's error is the answer
            return type(e), str(e)
    want, got = outcome("cpu"), outcome(DEV)
    if isinstance(want[0], type):
        assert got == want, name
    else:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, equal_nan=True)
