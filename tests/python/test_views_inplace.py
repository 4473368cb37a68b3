"""Views and in-place ops through views, compared with eager CPU."""

import copy

import pytest
import torch

import torch_pjrt
import zoo

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


PARTIAL_OVERLAP = {
    "add_": lambda x: x[1:].add_(x[:-1]),
    "addcmul_": lambda x: x[1:].addcmul_(x[:-1], x[1:]),
    "copy_": lambda x: x[1:].copy_(x[:-1]),
    "index": lambda x: x.__setitem__(slice(1, None), x[:-1]),
    "add out=": lambda x: torch.add(x[:-1], 1, out=x[1:]),
    "derived lerp_": lambda x: x[1:].lerp_(x[:-1], 0.5),
    "derived exp out=": lambda x: torch.exp(x[:-1], out=x[1:]),
    "transposed": lambda x: x.view(2, 2).add_(x.view(2, 2).t()),
    # The index writes refuse any source in self's memory, the same memory too.
    "index_put_": lambda x: x.index_put_((_idx(x, 1, 2, 3),), x[:3]),
    "setitem": lambda x: x.__setitem__(_idx(x, 1, 2, 3), x[:3]),
    "index_add_ same memory": lambda x: x.index_add_(0, _idx(x, 0, 1, 2, 3), x),
    "index_copy_": lambda x: x.index_copy_(0, _idx(x, 1, 2, 3), x[:3]),
    "scatter_": lambda x: x.scatter_(0, _idx(x, 1, 2, 3), x[:3]),
    "scatter_add_ same memory": lambda x: x.scatter_add_(0, _idx(x, 0, 1, 2, 3), x),
    "put_": lambda x: x.put_(_idx(x, 1, 2, 3), x[:3]),
    # out= forms whose CPU kernels refuse an out tensor in their input's memory
    "index_select out= its input": lambda x: torch.index_select(x, 0, _idx(x, 1, 0, 3, 2), out=x),
    "gather out= its input": lambda x: torch.gather(x, 0, _idx(x, 1, 0, 3, 2), out=x),
    "take out= its input": lambda x: torch.take(x, _idx(x, 3, 2, 1, 0), out=x),
    "index out= its input": lambda x: torch.ops.aten.index.Tensor_out(x, [_idx(x, 1, 0, 3, 2)], out=x),
    "index_add out= its source": lambda x: torch.index_add(x, 0, _idx(x, 0, 1), x[2:], out=x),
    "scatter out= its source": lambda x: torch.scatter(x, 0, _idx(x, 1, 0), x[2:], out=x),
    "cat out= its input, resized": lambda x: torch.cat([x, x], out=x),
}


def _idx(x, *i):
    return torch.tensor(i, device=x.device)


@pytest.mark.parametrize("name", PARTIAL_OVERLAP)
def test_partly_overlapping_operand_raises_as_on_the_cpu(name):
    # The CPU refuses an operand that partly overlaps the tensor written (its
    # answer would depend on the order memory is written in): so does pjrt,
    # with the same error, and the tensor keeps its value.
    f = PARTIAL_OVERLAP[name]
    with pytest.raises(RuntimeError, match="unsupported operation") as cpu:
        f(torch.arange(4.0))
    x = torch.arange(4.0).to(DEV)
    with pytest.raises(RuntimeError) as dev:
        f(x)
    assert str(dev.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    # The same memory (an in-place op on itself) is no overlap.
    x.add_(x)
    x[:].mul_(x)
    assert x.cpu().tolist() == [0.0, 4.0, 16.0, 36.0]


def test_a_reduction_into_part_of_its_input_is_refused():
    # The CPU computes torch.sum(x, 0, out=x[0]) unchecked, writing the out
    # tensor before reading the input there ([2, 3] where the sum is [2, 4]);
    # pjrt refuses it as a partial overlap, and computes into another tensor.
    x = torch.arange(4.0).to(DEV)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.sum(x.view(2, 2), 0, out=x[:2])
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    out = torch.empty(2).to(DEV)
    torch.sum(x.view(2, 2), 0, out=out)
    assert out.cpu().tolist() == [2.0, 4.0]
    # out= of an index op into another tensor, and self as the out tensor
    # where the CPU allows it (index_add's check reads source and index)
    assert torch.index_select(x, 0, _idx(x, 3, 0), out=out).cpu().tolist() == [3.0, 0.0]
    torch.index_add(x, 0, _idx(x, 0, 1), torch.ones(2).to(DEV), out=x)
    assert x.cpu().tolist() == [1.0, 2.0, 2.0, 3.0]


STRIDED_OVERLAP = {
    # The CPU's check gives up on strided views and writes them element by
    # element (its answer depends on that order: a history buffer shifted
    # with buf[:, 1:] = buf[:, :-1] ends with its first column everywhere);
    # pjrt checks them exactly and refuses, with the CPU's error.
    "buffer shift": lambda x: x.view(2, 5).__setitem__((slice(None), slice(1, None)), x.view(2, 5)[:, :-1]),
    "strided shift": lambda x: x.__setitem__(slice(2, None, 2), x[:-2:2]),
    # written through a view that overlaps itself: the CPU doubles a shared element twice
    "overlapping windows": lambda x: x.unfold(0, 4, 2).mul_(2),
    "out= into overlapping windows": lambda x: torch.neg(x[:6].view(3, 2), out=x.unfold(0, 2, 1)[:3]),
    "row times its first column": lambda x: x.view(2, 5).mul_(x.view(2, 5)[:, :1]),
    "diagonal shift": lambda x: x[:9].view(3, 3).diagonal()[1:].copy_(x[:9].view(3, 3).diagonal()[:-1]),
    "out= of columns": lambda x: torch.exp(x.view(2, 5)[:, :-1], out=x.view(2, 5)[:, 1:]),
    # index writes whose source is another view of self's strided memory
    "index_add_ from an alias": lambda x: x[::2].index_add_(0, _idx(x, 1, 0, 2, 3, 4), x[::2][:]),
    "index_copy_ from a shifted view": lambda x: x[::2][1:].index_copy_(0, _idx(x, 1, 0, 2, 3), x[::2][:4]),
    "scatter_add_ from an alias": lambda x: x[::2].scatter_add_(0, _idx(x, 1, 0), x[::2].detach()),
    "put_ from an alias": lambda x: x[::2].put_(_idx(x, 1, 0), x[::2].view_as(x[::2])[:2]),
    "index_put_ accumulating an alias": lambda x: x[::2].index_put_((_idx(x, 1, 0),), x[::2][:2], accumulate=True),
    # index and mask writes through windows that share elements
    "index_add_ into overlapping windows": lambda x: x.unfold(0, 2, 1).index_add_(0, _idx(x, 0, 1), torch.ones(2, 2).to(x)),
    "index_put_ accumulating into overlapping windows":
        lambda x: x.unfold(0, 2, 1).index_put_((_idx(x, 0, 1),), torch.tensor(10.0).to(x), accumulate=True),
    "masked_fill_ of overlapping windows": lambda x: x.unfold(0, 2, 1).masked_fill_(torch.eye(9, 2).bool().to(x.device), 10),
    # an out= resized over the storage of an input (the CPU rereads the input after writing it)
    "out= resized over an input": lambda x: torch.add(x[:1], torch.ones(3).to(x), out=x[5:6]),
    "cat's empty out= resized over its inputs": lambda x: torch.cat([x[:2], x[2:4]], out=x[:0]),
}
NO_OVERLAP = {  # strided views of one storage that share no element
    "interleaved halves": lambda x: x[0::2].add_(x[1::2]),
    "column from column": lambda x: x.view(5, 2)[:, 0].copy_(x.view(5, 2)[:, 1]),
    "rotary pairs": lambda x: x.view(2, 5)[:, 1::2].mul_(x.view(2, 5)[:, 0::2][:, :2]),
    "same columns": lambda x: x.view(2, 5)[:, 1:].mul_(x.view(2, 5)[:, 1:]),
    "windows that do not overlap": lambda x: x.unfold(0, 2, 2).mul_(2),
    "strided view that does not overlap itself": lambda x: x.as_strided((3, 2), (2, 3)).mul_(2),
    # a shift toward lower addresses: the CPU reads each element before writing it
    "left buffer shift": lambda x: x.view(2, 5).__setitem__((slice(None), slice(None, -1)), x.view(2, 5)[:, 1:]),
    "left shift add": lambda x: x.view(2, 5)[:, :-1].add_(x.view(2, 5)[:, 1:]),
    "rows over their last element": lambda x: x.view(2, 5).div_(x.view(2, 5)[:, -1:]),
    "float16 view sharing no byte": lambda x: x[:4:2].copy_(x.view(torch.float16)[2:8:4]),
    "index_add_ from the other half": lambda x: x[0::2].index_add_(0, _idx(x, 1, 0, 2, 4, 3), x[1::2]),
    "scatter_ from another column": lambda x: x.view(5, 2)[:, 0].scatter_(0, _idx(x, 4, 3, 2), x.view(5, 2)[:3, 1]),
    # one value of self's memory written without accumulating: read before any write, on the CPU too
    "one value under a mask": lambda x: x.__setitem__(x > 5, x[0]),
    "one value into a column": lambda x: x.view(5, 2)[:, 0].__setitem__(_idx(x, 0, 1), x[2]),
    "index_fill_ of a column with a value of it": lambda x: x.view(5, 2)[:, 0].index_fill_(0, _idx(x, 0), x[4]),
    # an empty out= view resized to contiguous strides at its offset: the input itself, in place
    "empty out= resized onto its input": lambda x: torch.clamp(x, 2, 7, out=x[:0]),
}


@pytest.mark.parametrize("name", STRIDED_OVERLAP)
def test_strided_views_that_partly_overlap_are_refused(name):
    x = torch.arange(10.0).to(DEV)
    with pytest.raises(RuntimeError, match="unsupported operation: (some elements|more than one element)") as e:
        STRIDED_OVERLAP[name](x)
    assert "the CPU would" in str(e.value)
    assert x.cpu().tolist() == list(range(10))


def test_large_strided_overlaps_are_refused_and_large_disjoint_views_compute():
    x = torch.randn(512, 512).to(DEV)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        x.mul_(x[:, :1])  # 262144 elements written, each row by its first element
    with pytest.raises(RuntimeError, match="unsupported operation"):
        x[:, 1:].copy_(x[:, :-1])
    cpu = x.cpu()
    x[:, 1:].add_(x[:, :1])  # disjoint columns
    cpu[:, 1:].add_(cpu[:, :1])
    torch.testing.assert_close(x.cpu(), cpu)


@pytest.mark.parametrize("name", NO_OVERLAP)
def test_strided_views_that_share_no_element_compute_as_the_cpu(name):
    cpu, x = torch.arange(10.0), torch.arange(10.0).to(DEV)
    NO_OVERLAP[name](cpu)
    NO_OVERLAP[name](x)
    assert x.cpu().tolist() == cpu.tolist()


def test_masked_scatter_from_its_own_memory():
    # The CPU writes a source in self's memory in order, each element read
    # after the writes before it; a program cannot repeat that, so pjrt
    # refuses it (the CPU's overlap error), and self keeps its value.
    for m, src in (([1, 1, 1], lambda x: x[:-1]), ([1, 0, 1, 1], lambda x: x)):
        x = torch.arange(4.0).to(DEV)
        dst = x[1:] if len(m) == 3 else x
        mask = torch.tensor(m, dtype=torch.bool)
        cpu = torch.arange(4.0)
        (cpu[1:] if len(m) == 3 else cpu).masked_scatter_(mask, src(cpu))
        assert cpu.tolist() in ([0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0])  # the in-order answers
        with pytest.raises(RuntimeError, match="unsupported operation"):
            dst.masked_scatter_(mask.to(DEV), src(x))
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    x = torch.arange(4.0).to(DEV)
    x.masked_scatter_(torch.tensor([True, False, True, True], device=DEV), x.clone())
    assert x.cpu().tolist() == [0.0, 1.0, 1.0, 2.0]


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


@pytest.mark.parametrize("pending", [False, True], ids=["stored", "pending"])
def test_a_wider_dtype_view_of_a_storage_with_left_over_bytes(pending):
    """A view of a wider type on part of a storage whose bytes are no whole
    number of its elements (7 bytes as int32, 10 as int64, a float storage
    resized to 6 bytes) reads, computes and writes as on the CPU: the bytes
    past its last whole element are no element of it and keep their value
    (reads and writes failed: "the last dimension must be a multiple of 4")."""
    def run(dev):
        u = torch.arange(7, dtype=torch.uint8).to(dev)
        h = torch.arange(5, dtype=torch.int16).to(dev)
        f = torch.tensor([1.5, 2.5]).to(dev)
        if not pending:
            torch_pjrt.sync()
        v = u[:4].view(torch.int32)
        out = [v.clone(), v + 1]
        h[:4].view(torch.int64).fill_(1 << 40)
        u[:4].view(torch.float32).mul_(2)
        y = f[:1]
        f.untyped_storage().resize_(6)
        y.add_(1)
        raw = torch.empty(0, dtype=torch.uint8, device=dev).set_(f.untyped_storage(), 0, (6,), (1,))
        c = torch.empty(0, dtype=torch.complex64, device=dev).set_(u.untyped_storage(), 0, (0,), (1,))
        return [t.cpu() for t in out + [h, u, y, raw, c]]

    for got, want in zip(run(DEV), run("cpu")):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


# ---------------------------------------------------------------- memory formats

CL = torch.channels_last


@pytest.mark.parametrize("make", [
    lambda x: x.to(memory_format=CL),
    lambda x: x.contiguous(memory_format=CL),
    lambda x: x.clone(memory_format=CL),
    lambda x: x.to(memory_format=CL).clone(),  # preserve keeps channels_last
    lambda x: x.to(memory_format=CL).to(torch.float64),
    lambda x: x.to(memory_format=CL).contiguous(),
    lambda x: x.transpose(1, 3).clone(),  # preserve keeps a dense permuted layout
    lambda x: x[:, :, ::2].clone(),  # not dense: row-major
    lambda x: torch.empty_like(x.to(memory_format=CL)).copy_(x),
    lambda x: torch.empty(x.shape, device=x.device, memory_format=CL).copy_(x),
    lambda x: torch.empty(2, 3, 5, 4, 2, device=x.device, memory_format=torch.channels_last_3d).fill_(1),
], ids=["to", "contiguous", "clone", "clone_preserve", "to_dtype", "back", "transposed", "sliced", "empty_like",
        "empty", "empty_3d"])
def test_memory_format_requests_lay_out_as_on_the_cpu(make):
    x = torch.randn(2, 3, 5, 4)
    want = make(x)
    got = make(x.to(DEV))
    assert got.device.type == "pjrt"
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)
    assert got.cpu().stride() == want.stride()  # the host copy keeps the layout, as from CUDA


def test_channels_last_host_tensors_keep_their_layout_on_the_device():
    x = torch.randn(2, 3, 5, 4).to(memory_format=CL)
    d = x.to(DEV)
    assert d.stride() == x.stride()
    # the layout is what makes this view legal, on the CPU and here
    torch.testing.assert_close(d.permute(0, 2, 3, 1).view(2, -1).cpu(), x.permute(0, 2, 3, 1).view(2, -1))
    d.mul_(2).add_(1)  # in place through the permuted layout
    torch.testing.assert_close(d.cpu(), x * 2 + 1)
    assert d.stride() == x.stride()


def test_memory_format_errors_match_the_cpu():
    for fn in (lambda dev: torch.randn(3, 4, device=dev).to(memory_format=CL),
               lambda dev: torch.empty(2, 3, 4, 5, device=dev, memory_format=torch.preserve_format),
               lambda dev: torch.randn(2, 3, 4, 5, device=dev).contiguous(memory_format=torch.channels_last_3d)):
        with pytest.raises(RuntimeError) as cpu:
            fn("cpu")
        with pytest.raises(RuntimeError, match=str(cpu.value).splitlines()[0][:40]):
            fn(DEV)


def test_channels_last_cnn_trains_as_on_the_cpu():
    """model.to(memory_format=torch.channels_last), the documented CNN recipe:
    parameters and gradients keep the layout, losses and weights match."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(),
                                torch.nn.LazyLinear(5))
    x = torch.randn(4, 3, 10, 10)
    y = torch.randint(0, 5, (4,))
    model(x)  # materialize the lazy layer
    results = []
    for dev in ("cpu", DEV):
        m = copy.deepcopy(model).to(dev).to(memory_format=CL)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        xd, yd = x.to(dev).to(memory_format=CL), y.to(dev)
        losses = []
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(m(xd), yd)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        w = m[0].weight
        results.append((losses, w.detach().cpu(), w.stride()))
    (cl, cw, cs), (pl, pw, ps) = results
    assert ps == cs  # the conv weight stays channels_last through the optimizer
    torch.testing.assert_close(torch.tensor(pl), torch.tensor(cl), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pw, cw, rtol=1e-4, atol=1e-6)


F = torch.nn.functional
OPS_ON_CHANNELS_LAST = {
    "relu": lambda x, c, w: F.relu(x),
    "add_first_decides": lambda x, c, w: x + c,
    "add_row_major_first": lambda x, c, w: c + x,
    "broadcast": lambda x, c, w: x * c[0, :, :1, :1],
    "where": lambda x, c, w: torch.where(x > 0, x, c),
    "gelu": lambda x, c, w: F.gelu(x),
    "conv": lambda x, c, w: F.conv2d(x, w, padding=1),
    "conv_weight_decides": lambda x, c, w: F.conv2d(x.contiguous(), w.contiguous(memory_format=CL)),
    "batch_norm": lambda x, c, w: F.batch_norm(x, None, None, training=True),
    "max_pool": lambda x, c, w: F.max_pool2d(x, 2),
    "avg_pool": lambda x, c, w: F.avg_pool2d(x, 2),
    "adaptive_avg_pool": lambda x, c, w: F.adaptive_avg_pool2d(x, 3),
    "upsample": lambda x, c, w: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "group_norm": lambda x, c, w: F.group_norm(x, 3),
    "pad": lambda x, c, w: F.pad(x, (1, 1, 1, 1)),
    "reflect_pad": lambda x, c, w: F.pad(x, (1, 1, 1, 1), mode="reflect"),
    "cat": lambda x, c, w: torch.cat([x, x], 1),
    "cat_mixed": lambda x, c, w: torch.cat([x, c], 1),
    "softmax": lambda x, c, w: torch.softmax(x, 1),
    "glu": lambda x, c, w: F.glu(x, 1),
    "prelu": lambda x, c, w: F.prelu(x, torch.full((6,), 0.1, device=x.device)),
    "hardshrink": lambda x, c, w: F.hardshrink(x),
    "special_function": lambda x, c, w: torch.special.erfinv(x.tanh() * 0.9),
    "logaddexp": lambda x, c, w: torch.logaddexp(x, c),
    "transposed_2d": lambda x, c, w: x.contiguous()[0, 0].t() * 2,
}


@pytest.mark.parametrize("name", list(OPS_ON_CHANNELS_LAST))
def test_op_results_keep_the_layout_the_cpu_gives(name):
    """Results and input gradients have the CPU's strides (channels_last in,
    channels_last out, TensorIterator's first-operand rule) and its values."""
    fn = OPS_ON_CHANNELS_LAST[name]
    torch.manual_seed(0)
    x0, c0, w0 = torch.randn(2, 6, 6, 6).to(memory_format=CL), torch.randn(2, 6, 6, 6), torch.randn(6, 6, 3, 3)
    outs = []
    for dev in ("cpu", DEV):
        x = x0.to(dev).detach().requires_grad_()
        c, w = c0.to(dev), w0.to(dev)
        y = fn(x, c, w)
        y.backward(torch.ones_like(y))
        outs.append((y, x.grad))
    (cy, cg), (py, pg) = outs
    assert py.stride() == cy.stride()
    assert pg.stride() == cg.stride()
    torch.testing.assert_close(py.cpu(), cy.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pg.cpu(), cg, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", [lambda x: F.max_pool3d(x, 2), lambda x: F.max_pool3d(x, 3, 2, 1),
                                  lambda x: F.avg_pool3d(x, 2), lambda x: F.adaptive_max_pool3d(x, 2),
                                  lambda x: F.adaptive_avg_pool3d(x, 2)],
                         ids=["max", "max_padded", "avg", "adaptive_max", "adaptive_avg"])
def test_3d_pooling_of_channels_last_3d_has_the_cpus_strides(pool):
    """3-d pooling of a channels_last_3d input: results and input gradients
    laid out as the CPU's (max_pool3d's result was row-major where the
    CPU's stays channels_last_3d)."""
    torch.manual_seed(0)
    x0 = torch.randn(2, 3, 6, 6, 6).to(memory_format=torch.channels_last_3d)
    outs = []
    for dev in ("cpu", DEV):
        x = x0.to(dev).detach().requires_grad_()
        y = pool(x)
        y.square().sum().backward()
        outs.append((y, x.grad))
    (cy, cg), (py, pg) = outs
    assert (py.stride(), pg.stride()) == (cy.stride(), cg.stride())
    torch.testing.assert_close(py.detach().cpu(), cy.detach())
    torch.testing.assert_close(pg.cpu(), cg)


def test_channels_last_results_view_as_on_the_cpu():
    """The layout is what makes these views legal: NHWC flattening of a conv
    block's output, as channels_last code writes it."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    want = block.to(memory_format=CL)(x).permute(0, 2, 3, 1).view(2, -1)
    got = block.to(DEV)(x.to(DEV)).permute(0, 2, 3, 1).view(2, -1)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)


def test_channels_last_mobilenet_trains_as_on_the_cpu():
    """Depthwise convolutions, squeeze-excite (a pooled (N, C, 1, 1) scale
    broadcast over the map), hardswish: channels_last through the zoo's
    MobileNetV3, against the CPU."""
    model, batches = zoo.make("mobilenetv3")
    torch_pjrt.metrics.reset()
    losses = []
    for dev in ("cpu", DEV):
        m = copy.deepcopy(model).to(dev).to(memory_format=CL)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        run = []
        for b in batches:
            loss = F.cross_entropy(m(b["x"].to(dev).to(memory_format=CL)), b["y"].to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.append(loss.item())
        losses.append(run)
    assert torch_pjrt.metrics.fallbacks() == {}
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-5, atol=1e-6)


def test_host_copies_respect_conjugate_and_negative_bits():
    """A conjugate or negative view's memory holds conj(value) / -value: a
    host copy into such a view, or from one, writes values, not raw memory."""
    src = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j])
    for make_dst, source in ((lambda dev: torch.zeros(3, dtype=torch.complex64, device=dev), src.conj()),
                             (lambda dev: torch.zeros(3, dtype=torch.complex64, device=dev).conj(), src),
                             (lambda dev: torch.zeros(3, device=dev)._neg_view(), torch.tensor([1.0, 2.0, 3.0])),
                             (lambda dev: torch.zeros(3, device=dev), torch.tensor([1.0, 2.0, 3.0])._neg_view())):
        want, got = make_dst("cpu"), make_dst(DEV)
        want.copy_(source)
        got.copy_(source)
        torch.testing.assert_close(got.cpu(), want)
        base_want, base_got = want._base if want._base is not None else want, got._base if got._base is not None else got
        torch.testing.assert_close(base_got.cpu().resolve_conj().resolve_neg(), base_want.resolve_conj().resolve_neg())


def _non_dense_transposed(dev):
    """A (4, 3) tensor whose memory is transposed and has gaps: strides (1, 8)."""
    return torch.arange(24.0, device=dev).view(6, 4).t()[:, ::2]


STRIDED_RESULTS = {
    "clone": lambda d: _non_dense_transposed(d).clone(),
    "clone_keeps_size_one_strides": lambda d: torch.arange(64.0, device=d).view(4, 16)[:1].t().clone(),
    "number_added_keeps_size_one_strides": lambda d: torch.arange(512.0, device=d).view(1, 16, 32).transpose(0, 1) + 1,
    "same_shapes_give_row_major": lambda d: (lambda x: x * x)(torch.arange(512.0, device=d).view(1, 16, 32).transpose(0, 1)),
    "where_orders_by_every_operand": lambda d: torch.where(
        torch.arange(8.0, device=d).view(2, 4).unsqueeze(0) > 3,
        torch.arange(8.0, device=d).view(2, 4).unsqueeze(0).as_strided((1, 2, 4), (4, 4, 1)),
        torch.arange(8.0, device=d).view(4, 2).t().unsqueeze(0)),
    "comparison_with_a_number_keeps_size_one_strides":
        lambda d: torch.arange(512.0, device=d).view(1, 16, 32).transpose(0, 1) > 3,
    "broadcast_operand_orders_the_result": lambda d: torch.arange(24.0, device=d).view(2, 3, 4).permute(2, 0, 1)
        + torch.arange(3.0, device=d).view(1, 1, 3),
    "nonzero_is_column_major": lambda d: torch.tensor([[1, 0, 1], [1, 1, 0]], device=d).nonzero(),
    "nonzero_as_tuple_is_contiguous": lambda d: torch.tensor([[1, 0, 1], [1, 1, 0]], device=d).nonzero(as_tuple=True)[1],
    "to_dtype_keeps_size_one_strides": lambda d: torch.arange(512.0, device=d).view(1, 16, 32).transpose(0, 1).double(),
    "to_dtype": lambda d: _non_dense_transposed(d).to(torch.float64),
    "elementwise": lambda d: _non_dense_transposed(d) * 2,
    "copy_into_gaps": lambda d: torch.ops.aten.copy.default(torch.zeros(32, device=d)[::16], torch.ones(2, device=d)),
    "copy_into_transposed": lambda d: torch.ops.aten.copy.default(torch.zeros(4, 6, device=d).t(), torch.ones(6, 4, device=d)),
    "slice_scatter_of_a_part": lambda d: torch.ops.aten.slice_scatter.default(
        torch.arange(800.0, device=d).view(8, 10, 2, 5)[:, :7], torch.full((8, 7, 2, 3), -1.0, device=d), 3, 2),
    "select_scatter_of_a_part": lambda d: torch.ops.aten.select_scatter.default(
        torch.arange(800.0, device=d).view(8, 10, 2, 5)[:, :7], torch.full((8, 7, 5), -2.0, device=d), 2, 0),
    "slice_scatter_of_a_transpose": lambda d: torch.ops.aten.slice_scatter.default(
        torch.arange(24.0, device=d).view(4, 6).t(), torch.zeros(2, 4, device=d), 0, 1, 3),
    "slice_scatter_of_an_empty_part": lambda d: torch.ops.aten.slice_scatter.default(
        torch.zeros(4, 6, device=d)[3:3], torch.zeros(0, 6, device=d), 0, 0, 0),
    "slice_scatter_of_an_expanded": lambda d: torch.ops.aten.slice_scatter.default(
        torch.zeros(3, 1, device=d).expand(3, 4), torch.ones(3, 2, device=d), 1, 0, 2),
}


@pytest.mark.parametrize("name", list(STRIDED_RESULTS))
def test_results_of_strided_inputs_have_the_cpu_strides(name):
    """clone, dtype conversion and elementwise ops lay a gapped input's result
    out densely in the input's order of strides (empty_like's rule), and
    copy / slice_scatter / select_scatter keep self's strides as the CPU's
    clone_preserve_strides does: AOTAutograd's fake tensors have these
    strides, and the graphs it traces view the results accordingly."""
    want = STRIDED_RESULTS[name]("cpu")
    got = STRIDED_RESULTS[name](DEV)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


def test_a_graph_viewing_a_scattered_transpose_runs_as_traced():
    """AOTAutograd's own graph (aot_eager: no view-to-reshape rewriting) on
    pjrt tensors: a write through x.t() becomes slice_scatter(x.t(), ...),
    whose result the graph transposes back and views flat, legal for the
    strides of its fake tensor (before, pjrt's row-major result raised "view
    size is not compatible")."""
    def f(x, v):
        y = x.t()
        y[1:3] = v
        return y.t().view(-1) * 2

    x, v = torch.randn(4, 6), torch.randn(2, 4)
    want = f(x.clone(), v)
    xd = x.to(DEV)
    got = torch.compile(f, backend="aot_eager")(xd, v.to(DEV))
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xd.cpu(), x.t().index_copy(0, torch.tensor([1, 2]), v).t())


def test_set_past_the_storage_end_grows_it_keeping_its_contents():
    # torch.Tensor.set_ with a view past the end grows the storage, as on the
    # CPU; the bytes it had stay (it once lost them, zeroing the other tensor).
    for d in ("cpu", DEV):
        a = torch.arange(6.0, device=d)
        b = torch.empty(0, device=d).set_(a.untyped_storage(), 4, (4,), (1,))
        assert b.untyped_storage().nbytes() == 32
        assert b[:2].tolist() == [4.0, 5.0] and a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert b.cpu().shape == (4,)


def test_storage_resize_frees_regrows_and_shrinks_as_on_the_cpu():
    # untyped_storage().resize_(0) and back (FSDP's and offloading's pattern)
    a = torch.arange(4.0, device=DEV)
    s = a.untyped_storage()
    s.resize_(0)
    assert s.nbytes() == 0
    # the CPU reads freed memory here (or crashes); pjrt refuses every use
    for use in (lambda: a + 1, lambda: a.sum(), lambda: a.fill_(1), lambda: a.view(2, 2).mul_(2), lambda: a.tolist()):
        with pytest.raises(RuntimeError, match="not allocated|out of bounds"):
            use()
    s.resize_(16)
    a.copy_(torch.full((4,), 3.0))
    assert a.tolist() == [3.0] * 4
    s.resize_(32)  # grown: the first bytes kept, as on the CPU
    b = torch.empty(0, device=DEV).set_(s, 0, (8,), (1,))
    assert b[:4].tolist() == [3.0] * 4 and s.nbytes() == 32
    s.resize_(8)  # shrunk: the first bytes kept; a no longer fits
    assert torch.empty(0, device=DEV).set_(s, 0, (2,), (1,)).tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="reaches past the end of its storage"):
        a + 1


def test_deterministic_mode_fills_uninitialized_memory_as_the_cpu():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = {}
        for d in ("cpu", DEV):
            r = torch.ones(2, device=d)
            r.resize_(4)
            got[str(d)] = (torch.empty(3, device=d).tolist(), torch.empty(2, dtype=torch.int32, device=d).tolist(),
                           torch.empty_strided((2, 2), (1, 2), device=d).isnan().all().item(), r[2:].tolist())
        cpu, dev = got["cpu"], got[str(DEV)]
        assert str(dev) == str(cpu)  # NaN, the int's largest value, NaN, the grown tail NaN
        assert dev[1] == [2**31 - 1] * 2 and dev[2] is True
    finally:
        torch.use_deterministic_algorithms(was)


def test_is_set_to_compares_storage_and_geometry_as_the_cpu():
    for x in (torch.arange(6.0), torch.arange(6.0).to(DEV)):
        got = [x.is_set_to(x), x.is_set_to(x.view(6)), x.is_set_to(x[1:]), x.is_set_to(x.clone()),
               x.view(2, 3).is_set_to(x.view(3, 2).t().t())]
        assert got == [True, True, False, False, False], (x.device, got)
    assert torch_pjrt.metrics.fallbacks().get("aten::is_set_to", 0) == 0


def test_set_without_a_source_gives_a_new_empty_storage():
    # set_() ran on the CPU (a fallback) and kept the old storage: a later
    # resize_ and fill_ overwrote the views of it
    torch_pjrt.metrics.reset()
    for dev in ("cpu", DEV):
        x = torch.arange(6.0).to(dev)
        v = x.view(2, 3)
        x.set_()
        assert x.shape == (0,) and x.untyped_storage().nbytes() == 0 and not x.is_set_to(v)
        x.resize_(6).fill_(-1)
        assert v.cpu().flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and x.cpu().tolist() == [-1.0] * 6
    assert torch_pjrt.metrics.fallbacks() == {}


def _random_view(rng, n):
    nd = rng.choice([1, 2, 2, 3])
    sizes = [rng.randint(1, 4) for _ in range(nd)]
    strides = [rng.choice([0, 1, 1, 2, 3, 4, 5, 8]) for _ in range(nd)]
    offset = rng.randint(0, 6)
    if offset + sum((s - 1) * st for s, st in zip(sizes, strides)) >= n:
        return None
    return sizes, strides, offset


def test_random_strided_writes_never_differ_silently_from_the_cpu():
    # x.as_strided(w).add_(x.as_strided(o)) for random views of one storage:
    # where pjrt computes, it equals the CPU (which writes element by
    # element); where the CPU refuses, pjrt refuses too. pjrt may refuse
    # where the CPU's order happens to give the before-the-write answer
    # (views whose strides do not nest, a few in a hundred).
    import random
    rng = random.Random(1)
    computed = refused = 0
    for _ in range(1500):
        w, o = _random_view(rng, 40), _random_view(rng, 40)
        if w is None or o is None or any(st == 0 and s > 1 for s, st in zip(*w[:2])):
            continue
        base = torch.arange(40.0) + 1
        try:
            if torch.broadcast_shapes(base.as_strided(*o).shape, base.as_strided(*w).shape) != torch.Size(w[0]):
                continue
        except RuntimeError:
            continue
        cpu, dev = base.clone(), base.to(DEV)
        try:
            cpu.as_strided(*w).add_(cpu.as_strided(*o))
            cpu_error = None
        except RuntimeError as e:
            cpu_error = e
        try:
            dev.as_strided(*w).add_(dev.as_strided(*o))
            got = dev.cpu()
        except RuntimeError:
            refused += 1
            continue
        assert cpu_error is None, (w, o, cpu_error)
        assert torch.equal(got, cpu), (w, o)
        computed += 1
    assert computed > 75 and refused > 75, (computed, refused)
