"""Vision and diffusion blocks on pjrt against eager CPU, forward and backward,
with no CPU fallback: upsampling (nearest, nearest-exact, linear, bilinear,
trilinear, bicubic, antialiased bilinear and bicubic; sizes, integer and fractional scale factors with and
without recompute_scale_factor; align_corners both ways), grid_sample
(bilinear and nearest, the three padding modes, align_corners both ways;
gradients of the input and of the grid), GroupNorm, nn.SyncBatchNorm's
kernels and var_mean/std_mean.
Then two small models train five AdamW steps each with CPU parity: a
diffusion-UNet down/up block and a spatial-transformer head.

Tolerance: 2e-5 forward, 1e-4 for gradients (float32; XLA fuses and
reassociates sums, so results differ from the CPU's by a few ulps)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt

DEV = torch_pjrt.device()


def rand(*shape, seed=0, lo=-2.0, hi=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * (hi - lo) + lo


def check_parity(fn, inputs, grads=True):
    """fn(*inputs) -> list of tensors, on the CPU and on pjrt: values, and the
    gradients of every input of a random weighting of all outputs."""
    torch_pjrt.metrics.reset()
    cpu_in = [x.clone().requires_grad_(grads) for x in inputs]
    dev_in = [x.to(DEV).requires_grad_(grads) for x in inputs]
    want, got = fn(*cpu_in), fn(*dev_in)
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.device.type == "pjrt"
        torch.testing.assert_close(g.cpu(), w, rtol=2e-5, atol=2e-5, msg=lambda m: f"output {i}: {m}")
    if grads:
        weights = [rand(*w.shape, seed=100 + i) for i, w in enumerate(want)]
        sum((w * k).sum() for w, k in zip(want, weights)).backward()
        sum((g * k.to(DEV)).sum() for g, k in zip(got, weights)).backward()
        for i, (c, d) in enumerate(zip(cpu_in, dev_in)):
            torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"grad of input {i}: {m}")
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()


# ------------------------------------------------------------------ upsample

# Each: keyword arguments of F.interpolate besides mode/align_corners. The
# scale factors cover integer, fractional up (the ATen op gets the scale and
# uses 1/scale), fractional down through the recompute path (the op gets
# sizes only, as with size=), and a factor whose output size equals the
# input size (the CPU kernels' copy shortcuts).
RESIZES = [
    dict(scale_factor=2),
    dict(scale_factor=1.7),
    dict(scale_factor=0.6, recompute_scale_factor=True),
    dict(scale_factor=1.05),
]

SHAPES = {1: (2, 3, 7), 2: (2, 3, 5, 7), 3: (1, 2, 3, 4, 5)}


def interpolate_all(x, modes, resizes):
    """Every (mode, align_corners) of `modes` at every resize."""
    return [F.interpolate(x, mode=m, **({} if ac is None else dict(align_corners=ac)), **r)
            for m, ac in modes for r in resizes]


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_upsample_nearest(rank):
    check_parity(lambda x: interpolate_all(x, [("nearest", None), ("nearest-exact", None)], RESIZES),
                 [rand(*SHAPES[rank])])


@pytest.mark.parametrize("mode,rank", [("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)])
def test_upsample_interpolating(mode, rank):
    check_parity(lambda x: interpolate_all(x, [(mode, False), (mode, True)], RESIZES), [rand(*SHAPES[rank])])


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_upsample_antialiased(mode):
    # torchvision's Resize of a float tensor: downscaling (windows wider than
    # the filter, of varying width), upscaling, one dimension unchanged,
    # align_corners, a scale factor; and an inf beside a window stays out
    x = rand(2, 3, 17, 23)
    sizes = [dict(size=(5, 7)), dict(size=(30, 9)), dict(size=(17, 6)), dict(scale_factor=(0.37, 0.61)),
             dict(size=(6, 40), align_corners=True)]
    check_parity(lambda x: [F.interpolate(x, mode=mode, antialias=True, **k) for k in sizes], [x])
    y = rand(1, 1, 8, 8)
    y[0, 0, 0, 0], y[0, 0, 7, 7] = float("inf"), float("nan")
    want = F.interpolate(y, size=(3, 5), mode=mode, antialias=True)
    torch.testing.assert_close(F.interpolate(y.to(DEV), size=(3, 5), mode=mode, antialias=True).cpu(), want,
                               equal_nan=True)


def test_upsample_modules_and_per_dim_sizes():
    up = nn.Upsample(scale_factor=(2, 3), mode="nearest")
    bil = nn.Upsample(size=(4, 9), mode="bilinear", align_corners=False)
    check_parity(lambda x: [up(x), bil(x), F.interpolate(x, scale_factor=(0.5, 1.5), mode="bicubic")],
                 [rand(2, 3, 6, 5)])


def test_upsample_nearest_integer_dtype_and_inf():
    # nearest copies: exact for integers; one inf spreads only to its copies
    x = torch.arange(24, dtype=torch.uint8).reshape(1, 2, 3, 4)
    torch.testing.assert_close(F.interpolate(x.to(DEV), scale_factor=2).cpu(), F.interpolate(x, scale_factor=2))
    # interpolating integer images keeps the CPU's fixed-point rounding: a
    # documented, counted fallback
    torch_pjrt.metrics.reset()
    torch.testing.assert_close(F.interpolate(x.to(DEV), scale_factor=1.5, mode="bilinear").cpu(),
                               F.interpolate(x, scale_factor=1.5, mode="bilinear"))
    assert "aten::upsample_bilinear2d" in torch_pjrt.metrics.fallbacks()
    y = rand(1, 1, 4, 4)
    y[0, 0, 1, 2] = float("inf")
    for mode in ("nearest", "bilinear", "bicubic"):
        want = F.interpolate(y, size=(7, 9), mode=mode)
        torch.testing.assert_close(F.interpolate(y.to(DEV), size=(7, 9), mode=mode).cpu(), want, equal_nan=True)


# -------------------------------------------------------------- grid_sample

@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample(padding):
    # the grid reaches past [-1, 1] so that every padding rule is used
    def fn(x, grid):
        return [F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=ac)
                for mode, ac in (("bilinear", False), ("bilinear", True), ("nearest", padding == "border"))]

    check_parity(fn, [rand(2, 3, 5, 6), rand(2, 4, 7, 2, seed=1, lo=-1.6, hi=1.6)])


def test_grid_sample_of_an_empty_batch():
    # a detector's crops of an image with no boxes: empty results and gradients
    def fn(x, grid):
        return [F.grid_sample(x, grid, mode=mode, align_corners=False) for mode in ("bilinear", "nearest")]

    check_parity(fn, [rand(0, 3, 5, 6), rand(0, 4, 7, 2, seed=1)])


def test_grid_sample_bicubic_runs_on_cpu():
    # documented fallback (docs/semantics.md): counted, and still right
    x, grid = rand(1, 2, 4, 4), rand(1, 3, 3, 2, seed=1, lo=-1.2, hi=1.2)
    torch_pjrt.metrics.reset()
    got = F.grid_sample(x.to(DEV), grid.to(DEV), mode="bicubic", align_corners=False)
    torch.testing.assert_close(got.cpu(), F.grid_sample(x, grid, mode="bicubic", align_corners=False))
    assert "aten::grid_sampler_2d" in torch_pjrt.metrics.fallbacks()


# ----------------------------------------------------- group norm, var_mean

def test_group_norm():
    # 4-D with and without affine parameters, 5-D, 3-D
    w, bias, w3, b3 = rand(6, seed=2), rand(6, seed=3), rand(3, seed=4), rand(3, seed=5)

    def fn(x4, x5, w, bias, w3, b3):
        return [F.group_norm(x4, 2, w, bias), F.group_norm(x4, 3), F.group_norm(x5, 3, w3, b3, eps=1e-3),
                F.group_norm(x4.flatten(2), 2, w, bias)]

    check_parity(fn, [rand(2, 6, 3, 4) * 3 + 1, rand(2, 3, 2, 3, 2, seed=1), w, bias, w3, b3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sync_batch_norm_kernels_over_uneven_shares_equal_batch_norm_on_the_whole_batch(dtype):
    # nn.SyncBatchNorm's kernels, the processes played in one: shares of 3
    # and 5 rows, their statistics merged with their counts, normalized, and
    # the backward's sums added over the shares as its all-reduce does. The
    # CPU has none of these kernels (CUDA's): BatchNorm on the whole batch is
    # the oracle.
    torch_pjrt.metrics.reset()
    x, go = rand(8, 3, 2, 2, seed=7) * 3 + 1, rand(8, 3, 2, 2, seed=8)
    w, b = rand(3, seed=9), rand(3, seed=10)
    rm, rv = rand(3, seed=11), rand(3, seed=12, lo=0.5, hi=2)
    eps, momentum, shares = 1e-5, 0.1, (3, 5)
    # the CPU: batch norm on the whole batch, in float32 (the kernels' statistics type)
    cx, cw, cb = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    crm, crv = rm.clone(), rv.clone()
    want = F.batch_norm(cx, crm, crv, cw, cb, training=True, momentum=momentum, eps=eps)
    want.backward(go)
    # pjrt, share by share
    dx, dgo = x.to(DEV, dtype).split(shares), go.to(DEV, dtype).split(shares)
    dw, db, drm, drv = w.to(DEV), b.to(DEV), rm.to(DEV), rv.to(DEV)
    stats = [torch.batch_norm_stats(part, eps) for part in dx]
    assert stats[0][0].dtype == torch.float32  # float16 statistics in float, as CUDA's
    counts = torch.tensor([n * 4 for n in shares], dtype=torch.float32, device=DEV)  # elements per channel
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x.to(DEV, dtype), torch.stack([m for m, _ in stats]), torch.stack([i for _, i in stats]), drm, drv, momentum,
        eps, counts)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(mean.cpu(), x.mean((0, 2, 3)), **tol)
    torch.testing.assert_close(invstd.cpu(), (x.var((0, 2, 3), unbiased=False) + eps).rsqrt(), **tol)
    torch.testing.assert_close(drm.cpu(), crm, **tol)
    torch.testing.assert_close(drv.cpu(), crv, **tol)  # updated with the unbiased variance of all 8 rows
    out = torch.cat([torch.batch_norm_elemt(part, dw.to(dtype), db.to(dtype), mean, invstd, eps) for part in dx])
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), want.detach(), **tol)
    reduced = [torch.batch_norm_backward_reduce(g, part, mean, invstd, dw, True, True, True) for g, part in zip(dgo, dx)]
    sum_dy, sum_dy_xmu = sum(r[0] for r in reduced), sum(r[1] for r in reduced)
    torch.testing.assert_close(sum(r[2] for r in reduced).cpu(), cw.grad, **tol)
    torch.testing.assert_close(sum(r[3] for r in reduced).cpu(), cb.grad, **tol)
    count_tensor = counts.to(torch.int32).view(2, 1)
    gi = torch.cat([torch.batch_norm_backward_elemt(g, part, mean, invstd, dw, sum_dy, sum_dy_xmu, count_tensor)
                    for g, part in zip(dgo, dx)])
    assert gi.dtype == dtype
    torch.testing.assert_close(gi.cpu().float(), cx.grad, **tol)
    only_weight = torch.batch_norm_backward_reduce(dgo[0], dx[0], mean, invstd, dw, False, True, False)
    assert only_weight[2].shape == (3,) and all(t is None for t in (only_weight[0], only_weight[1], only_weight[3]))
    assert torch_pjrt.metrics.fallbacks() == {}


def test_var_mean_and_std_mean():
    def fn(x):
        outs = []
        for r in (torch.var_mean(x), torch.var_mean(x, 1), torch.var_mean(x, (0, 2), keepdim=True),
                  torch.var_mean(x, dim=-1, correction=0), torch.var_mean(x, unbiased=False),
                  torch.std_mean(x, dim=(1, 2), correction=2), torch.std_mean(x, -1, keepdim=True)):
            outs.extend(r)
        return outs

    check_parity(fn, [rand(3, 4, 5)])


# -------------------------------------------------------------------- models

class UNetBlock(nn.Module):
    """A diffusion UNet level: a residual block with GroupNorm and SiLU, down
    by a strided conv plus an average pool, up by nearest upsampling, and a
    skip connection."""

    def __init__(self, c=4):
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.norm2 = nn.GroupNorm(2, c)
        self.out = nn.Conv2d(2 * c, 3, 3, padding=1)

    def forward(self, x):
        h = self.inp(x)
        skip = h + self.conv1(F.silu(self.norm1(h)))
        d = self.down(skip) + F.avg_pool2d(skip, 2)
        u = F.interpolate(F.silu(self.norm2(d)), scale_factor=2, mode="nearest")
        return self.out(torch.cat([u, skip], 1))


class SpatialTransformer(nn.Module):
    """A localization net predicts an affine theta (initialized to the
    identity), the input is resampled with affine_grid + grid_sample, and a
    small classifier reads the result."""

    def __init__(self, classes=3):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.1)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
        self.head = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                  nn.Linear(16, classes))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.shape, align_corners=False)
        return self.head(F.grid_sample(x, grid, padding_mode="border", align_corners=False))


def train_both(make_model, x, loss_fn, steps=5):
    """Trains copies of one model on the CPU and on pjrt; returns both loss
    curves and the final parameters."""
    results = []
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        model = make_model().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model(x.to(dev)), dev)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results.append((losses, [p.detach().cpu() for p in model.parameters()]))
    return results


@pytest.mark.parametrize("name", ["unet_block", "spatial_transformer"])
def test_model_trains_like_cpu(name):
    torch_pjrt.metrics.reset()
    if name == "unet_block":
        x, target = rand(2, 3, 8, 8), rand(2, 3, 8, 8, seed=1)
        (cpu, cpu_p), (dev, dev_p) = train_both(UNetBlock, x, lambda y, dev: F.mse_loss(y, target.to(dev)))
    else:
        x, labels = rand(4, 1, 10, 10), torch.tensor([0, 2, 1, 2])
        (cpu, cpu_p), (dev, dev_p) = train_both(SpatialTransformer, x,
                                                lambda y, dev: F.cross_entropy(y, labels.to(dev)))
    for step, (a, b) in enumerate(zip(cpu, dev)):
        assert b == pytest.approx(a, rel=1e-4), f"step {step}: cpu {a} vs pjrt {b}"
    assert cpu[-1] < cpu[0], "the model should learn"
    for a, b in zip(cpu_p, dev_p):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
