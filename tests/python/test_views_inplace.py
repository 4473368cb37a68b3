"""Views and in-place ops through views, compared with eager CPU."""

import pytest
import torch

import torch_pjrt

DEV = torch_pjrt.device()


def check(fn, *inputs, atol=1e-6):
    """Runs fn on CPU copies and on pjrt copies of the inputs; every returned
    tensor and every input must end equal."""
    cpu_in = [x.clone() for x in inputs]
    dev_in = [x.clone().to(DEV) for x in inputs]
    cpu_out = fn(*cpu_in)
    dev_out = fn(*dev_in)
    cpu_out = list(cpu_out) if isinstance(cpu_out, (tuple, list)) else [cpu_out]
    dev_out = list(dev_out) if isinstance(dev_out, (tuple, list)) else [dev_out]
    for a, b in zip(cpu_out + cpu_in, dev_out + dev_in):
        assert b.device.type == "pjrt"
        got = b.cpu()
        assert got.shape == a.shape and got.dtype == a.dtype
        torch.testing.assert_close(got, a, atol=atol, rtol=1e-5)


X = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def test_column_add_through_select():
    def f(x):
        x[:, 0] += 1
        return x
    check(f, X)


def test_flat_view_add():
    def f(x):
        v = x.view(-1)
        v.add_(1)
        return v
    check(f, X)


def test_narrow_copy():
    def f(x, y):
        x.narrow(1, 2, 3).copy_(y)
        return x
    check(f, X, torch.full((4, 3), -7.0))


def test_transpose_then_inplace():
    def f(x):
        t = x.t()
        t.mul_(2)
        t[0] = 5
        return t
    check(f, X)


def test_strided_slice_assignment():
    def f(x):
        x[1:3, ::2] = torch.tensor([[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]], device=x.device)
        return x
    check(f, X)


def test_view_of_view_and_diagonal():
    def f(x):
        sq = x[:, :4]
        sq.diagonal().fill_(-1)
        sq[2:, 1:3].zero_()
        return x
    check(f, X)


def test_overlapping_unfold_read_and_expand_clone():
    def f(x):
        u = x.reshape(-1).unfold(0, 5, 3)
        e = x[0:1].expand(3, 6).clone()
        e[0, 0] = 100
        return u * 2, e
    check(f, X)


def test_write_to_expanded_view_is_an_error():
    x = X.to(DEV)
    e = x[0:1].expand(3, 6)
    with pytest.raises(RuntimeError):
        e.add_(1)
        e.cpu()


def test_data_writes_and_detach_share_storage():
    def f(x):
        x.data[0] = 3
        d = x.detach()
        d[1, 1] = -3
        return x
    check(f, X)


def test_bool_mask_and_int64_index():
    def f(x):
        m = x > 10
        x[m] = 0
        idx = torch.tensor([0, 2, 2], device=x.device)
        g = x[idx]
        x[torch.tensor([1, 3], device=x.device)] += 5
        return x, g, x[x < 3]
    check(f, X)


def test_index_put_accumulate_with_repeats():
    def f(x):
        idx = torch.tensor([1, 1, 3], device=x.device)
        x.index_put_((idx,), torch.ones(3, 6, device=x.device), accumulate=True)
        return x
    check(f, X)


def test_zero_dim_and_empty():
    def f(x):
        s = x.sum()
        s += 1
        e = x[:, 6:]
        return s, e, e.sum(1), x[0, 0]
    check(f, X)


def test_non_contiguous_cpu_input():
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    t = base.t()[1:, ::2]
    d = t.to(DEV)
    torch.testing.assert_close(d.cpu(), t)
    torch.testing.assert_close((d * 2).cpu(), t * 2)


def test_param_grad_accumulation_and_no_grad():
    w0 = torch.randn(3, 3)

    def run(device):
        w = w0.clone().to(device).requires_grad_()
        for _ in range(2):
            (w * w).sum().backward()
        g = w.grad.clone()
        with torch.no_grad():
            w -= 0.1 * w.grad
            z = w * 2
        assert not z.requires_grad
        return g.cpu(), w.detach().cpu()

    for a, b in zip(run("cpu"), run(DEV)):
        torch.testing.assert_close(b, a)


def test_dtype_promotion_and_broadcasting():
    def f(i, fl):
        return i + fl, i * 2.5, i // 3, i / 2, (i > 3) & (fl < 1), fl.unsqueeze(1) - fl
    check(f, torch.arange(6), torch.linspace(0, 2, 6))


def test_resize_via_out_argument():
    def f(x):
        out = torch.empty(0, device=x.device)
        torch.add(x, 1, out=out)
        return out
    check(f, X)


@pytest.mark.parametrize("to", [torch.uint8, torch.int16, torch.float64, torch.bool], ids=str)
def test_dtype_views_of_another_element_size_share_the_bytes(to):
    # As torch.load rebuilds tensors: their bytes were uploaded untyped.
    x = torch.tensor([0.0, 1.5, -2.0, 3.25], dtype=torch.float32)
    if to == torch.bool:
        x = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1], dtype=torch.uint8)
    d = x.to(DEV)
    v = d.view(to)
    assert torch.equal(v.cpu(), x.view(to))
    v.add_(1) if to != torch.bool else v.logical_not_()
    (x.view(to).add_(1) if to != torch.bool else x.view(to).logical_not_())
    assert torch.equal(d.cpu(), x)  # written through the view, to the same bytes
