"""The _C runtime from Python: buffers, compile, execute, donation,
serialization and errors, against the real plugin with NumPy as the oracle."""

import numpy as np
import pytest

import torch_pjrt
from torch_pjrt import _C

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_round_trip(client, dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 5)) * 100).astype(dtype)
    b = client.buffer_from_numpy(a, client.addressable_device_ids[-1])
    assert b.dims == [3, 5]
    assert b.device_id == client.addressable_device_ids[-1]
    out = b.to_numpy()
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out, a)


def test_non_contiguous_input_is_copied_dense(client):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(client.buffer_from_numpy(a, 0).to_numpy(), a)


def test_unsupported_numpy_dtype_is_a_type_error(client):
    with pytest.raises(TypeError, match="has no PJRT buffer type"):
        client.buffer_from_numpy(np.array(["a", "b"]), 0)


def mlp(replicas=1):
    b = _C.ir.Builder(replicas)
    x = b.parameter("float32", [4, 8])
    w = b.parameter("float32", [8, 3])
    y = b.binary("max", b.dot(x, w, [1], [0]), b.full("float32", [4, 3], 0.0))
    if replicas > 1:
        y = b.all_reduce(y, "sum")
    return b.build([y])


def test_compile_and_execute_against_numpy(client):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8), dtype=np.float32)
    w = rng.standard_normal((8, 3), dtype=np.float32)
    exe = client.compile_graph(mlp(), [0])
    out = exe.execute([[client.buffer_from_numpy(x, 0), client.buffer_from_numpy(w, 0)]])
    np.testing.assert_allclose(out[0][0].to_numpy(), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)


def test_replicated_all_reduce(client):
    ids = client.addressable_device_ids
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((4, 8), dtype=np.float32) for _ in ids]
    w = rng.standard_normal((8, 3), dtype=np.float32)
    exe = client.compile_graph(mlp(len(ids)), list(ids))
    outs = exe.execute([[client.buffer_from_numpy(x, d), client.buffer_from_numpy(w, d)] for x, d in zip(xs, ids)])
    want = sum(np.maximum(x @ w, 0) for x in xs)
    for o, d in zip(outs, ids):
        assert o[0].device_id == d
        np.testing.assert_allclose(o[0].to_numpy(), want, rtol=1e-5, atol=1e-5)


def test_donation_and_serialization(client):
    b = _C.ir.Builder()
    p = b.parameter("float32", [3])
    g = b.build([b.binary("add", p, p)], aliases=[(0, 0)])
    assert "tf.aliasing_output = 0 : i32" in g.stablehlo()
    exe = client.compile_graph(g, [0])
    buf = client.buffer_from_numpy(np.array([1, 2, 3], np.float32), 0)
    out = exe.execute([[buf]])[0][0]
    np.testing.assert_array_equal(out.to_numpy(), [2, 4, 6])
    assert buf.is_deleted
    with pytest.raises(torch_pjrt.PjrtError, match="deleted"):
        buf.to_numpy()
    data = exe.serialize()
    fresh = torch_pjrt.create_client()
    again = fresh.deserialize(data, device_ids=[0])
    out2 = again.execute([[fresh.buffer_from_numpy(np.array([5, 6, 7], np.float32), 0)]])[0][0]
    np.testing.assert_array_equal(out2.to_numpy(), [10, 12, 14])


def test_builder_shape_errors_are_value_errors_before_compile():
    b = _C.ir.Builder()
    x = b.parameter("float32", [2, 3])
    y = b.parameter("float32", [3, 2])
    with pytest.raises(ValueError, match=r"Add \(stablehlo.add\) with operands tensor<2x3xf32>, tensor<3x2xf32>"):
        b.binary("add", x, y)
    with pytest.raises(ValueError, match="unknown IR op"):
        b.binary("frobnicate", x, x)
    with pytest.raises(ValueError, match="unknown dtype"):
        b.parameter("float128", [1])


def test_compile_error_shows_plugin_message_and_our_line(client):
    text = ('module {\n  func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {\n'
            '    %0 = "stablehlo.add"(%arg0) : (tensor<2xf32>) -> tensor<2xf32>\n'
            '    "func.return"(%0) : (tensor<2xf32>) -> ()\n  }\n}\n')
    with pytest.raises(torch_pjrt.PjrtError) as e:
        client.compile(text)
    assert "in StableHLO line 3" in str(e.value)
    assert "stablehlo.add" in str(e.value)


def test_wrong_arguments_are_clear_errors(client):
    exe = client.compile_graph(mlp(), [0])
    x = client.buffer_from_numpy(np.zeros((4, 8), np.float32), 0)
    with pytest.raises(torch_pjrt.PjrtError, match=r"takes 2 argument\(s\), got 1"):
        exe.execute([[x]])
    with pytest.raises(torch_pjrt.PjrtError, match=r"argument 1 has type f32\[4,8\] but the program expects f32\[8,3\]"):
        exe.execute([[x, x]])
    with pytest.raises(torch_pjrt.PjrtError, match=r"compiled for 1 replica"):
        exe.execute([[x, x], [x, x]])
