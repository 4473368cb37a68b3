"""torch_pjrt.spmd: sharded training on 4 and 8 CPU devices through XLA's
SPMD partitioner (spmd_worker.py runs in a subprocess per device count, as
CPU_NUM_DEVICES is read when the client starts), and the API's errors."""

import json
import os

import pytest
import torch

from conftest import _is_cpu, run_python

WORKER = os.path.join(os.path.dirname(__file__), "spmd_worker.py")
TOL = 2e-3  # relative, on losses and final parameters against eager CPU


def _matches(result, pattern, noise):
    # within 2e-3, or no further from eager CPU than eager CPU from a run
    # with parameters perturbed by 1e-6 (all-reduce order changes rounding)
    diff = result[pattern]["diff"]
    assert diff < TOL or diff <= result[noise], (pattern, diff, result[noise])


def _run(n: int, *args):
    r = run_python(f"import runpy, sys; sys.argv = ['w'] + {list(args)!r}; runpy.run_path({WORKER!r}, run_name='__main__')",
                   timeout=600, CPU_NUM_DEVICES=n)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=[4, 8])
def result(request):
    if not _is_cpu():
        pytest.skip("device counts are set with CPU_NUM_DEVICES (the CPU plugin)")
    return _run(request.param, "--misc")


def _steady(delta):
    # steps 4..20: one program per step, nothing compiled, nothing read back;
    # only Python numbers (AdamW's bias corrections) are uploaded, a few bytes each
    assert delta["compiles"] == 0 and delta["executions"] == 17, delta
    assert delta["bytes_to_host"] == 0, delta
    assert delta["bytes_to_device"] < 17 * 256, delta


def test_data_parallel(result):
    n = result["devices"]
    dp = result["dp"]
    _matches(result, "dp", "mlp_noise")
    _steady(dp["delta"])
    assert dp["x_shard_bytes"] == [32 * 32 * 4 // n] * n  # the batch's rows, split
    assert result["spmd_in_use"]


def test_fsdp(result):
    n = result["devices"]
    f = result["fsdp"]
    _matches(result, "fsdp", "mlp_noise")
    _steady(f["delta"])
    assert f["delta"]["donated_buffers"] > 0  # parameters and state are updated in place, piece by piece
    assert f["sharded_params"] == 5  # all but the 10-element last bias
    assert f["state_like_param"] == f["state_count"] == 12  # exp_avg, exp_avg_sq follow their parameter
    per_device, full = f["per_device_bytes"], f["full_bytes"]
    assert len(per_device) == n
    assert max(per_device) <= full / n * 1.05 + 64, (per_device, full)  # the replicated bias: 10 floats x 3


def test_tensor_parallel(result):
    n = result["devices"]
    tp = result["tp"]
    _matches(result, "tp", "tp_noise")
    _steady(tp["delta"])
    # fc1 (32x16) column-parallel over "model" (n/2), replicated over "data" (2)
    assert tp["fc1_shard_bytes"] == [32 * 16 * 4 // (n // 2)] * n
    assert tp["fc1_sharding"].endswith("last_tile_dim_replicate}")
    assert tp["o_sharding"].startswith(f"{{devices=[1,{n // 2},2]")


def test_semantics(result):
    n = result["devices"]
    m = result["misc"]
    assert m["device"] == "pjrt:0"
    assert m["print_ok"] and m["state_dict_ok"]
    assert m["load_keeps_sharding"]
    assert m["constraint_in_program"] and m["constraint_ok"]
    assert m["constraint_sharding"] == f"{{devices=[1,{n}]{','.join(map(str, range(n)))}}}"
    assert m["constraint_bytes"] == [8 * n * 8 * n * 4 // n] * n
    assert m["view_constraint_ok"] and "whole storage" in m["view_error"], m["view_error"]
    assert m["memory_growth"] == [m["memory_big_bytes"] // n] * n
    assert {"bytes_in_use", "allocated_bytes.all.current"} <= set(m["memory_stats_keys"])
    assert m["max_memory_ok"]
    assert m["dynamo_ok"] and m["dynamo_sharding"] is not None
    assert m["dynamo_repeat_err"] < 1e-4
    assert any("SPMD programs" in why for why in m["dynamo_refusals"]), m["dynamo_refusals"]
    assert "different meshes" in m["mix_error"] or "do not mix" in m["mix_error"], m["mix_error"]
    assert "pjrt:1" in m["device_error"] and "device" in m["device_error"], m["device_error"]


# --- errors: checked before anything reaches a device ------------------------

def _mesh(shape, names):
    from torch_pjrt import spmd
    if torch.pjrt.device_count() < 4:
        pytest.skip("needs 4 pjrt devices")
    return spmd.Mesh(shape, names, devices=list(range(4)))


def test_error_unknown_axis():
    from torch_pjrt import spmd
    with pytest.raises(ValueError, match=r"shape \(8, 4\).*spec \('model', None\).*unknown mesh axis 'model'"):
        spmd.distribute(torch.zeros(8, 4), _mesh((4,), ("data",)), ("model", None))


def test_error_not_divisible():
    from torch_pjrt import spmd
    with pytest.raises(ValueError, match=r"shape \(6, 4\).*Mesh\(\(4,\).*dimension 0 of size 6 does not split into 4"):
        spmd.distribute(torch.zeros(6, 4), _mesh((4,), ("data",)), ("data", None))


def test_error_wrong_entry_count():
    from torch_pjrt import spmd
    with pytest.raises(ValueError, match=r"shape \(8, 4\).*one entry per tensor dimension \(2\), got 1"):
        spmd.distribute(torch.zeros(8, 4), _mesh((4,), ("data",)), ("data",))


def test_error_mesh_larger_than_devices():
    from torch_pjrt import spmd
    n = torch.pjrt.device_count()
    with pytest.raises(ValueError, match=rf"needs {2 * n} devices, but this process has {n}.*CPU_NUM_DEVICES"):
        spmd.Mesh((2, n), ("a", "b"))


def test_error_mesh_over_processes_says_it_is_not_supported(monkeypatch):
    # under torchrun the hint was CPU_NUM_DEVICES, which gives each process a mesh of its own
    from torch_pjrt import runtime, spmd
    monkeypatch.setattr(runtime, "process_count", lambda: 2)
    n = torch.pjrt.device_count()
    with pytest.raises(ValueError, match=r"mesh over the job's 2 processes is not supported") as e:
        spmd.Mesh((2 * n,), ("d",))
    assert "CPU_NUM_DEVICES" not in str(e.value)


def test_placements_and_partial():
    from torch_pjrt import spmd
    from torch.distributed.tensor import Partial, Replicate, Shard
    mesh = _mesh((2, 2), ("data", "model"))
    got = spmd._sharding_args((8, 4), mesh, [Shard(0), Shard(1)])
    assert got == spmd._sharding_args((8, 4), mesh, ("data", "model"))
    assert spmd._sharding_args((8, 4), mesh, [Replicate(), Shard(0)]) == spmd._sharding_args((8, 4), mesh, ("model", None))
    with pytest.raises(ValueError, match="Partial placements are not supported"):
        spmd._sharding_args((8, 4), mesh, [Partial(), Shard(0)])


def test_tile_assignment():
    from torch_pjrt import spmd
    mesh = _mesh((2, 2), ("data", "model"))
    # dims split over (model, data): device (d, m) holds piece m * 2 + d
    assert spmd._sharding_args((8,), mesh, [("model", "data")])[1:] == ([4], 1, [0, 2, 1, 3])
    # split over "model" only: pieces by model coordinate, copies over data
    assert spmd._sharding_args((8, 4), mesh, (None, "model"))[1:] == ([1, 2], 2, [0, 2, 1, 3])


def test_random_draws_of_a_sharded_tensor_are_the_unsharded_draws():
    """rand_like and dropout of a row-sharded tensor: the same numbers as the
    one-device draws from the same state (so no two shards repeat each
    other), and the state moves as far."""
    from torch_pjrt import spmd
    mesh = _mesh((4,), ("data",))
    x = spmd.distribute(torch.zeros(8, 6), mesh, ("data", None))
    torch.pjrt.synchronize()
    state = torch.pjrt.get_rng_state()
    r1, r2 = torch.rand_like(x), torch.rand_like(x)
    d = torch.nn.functional.dropout(x + 1, 0.5)
    got = [t.cpu() for t in (r1, r2, d)]
    after = torch.pjrt.get_rng_state()
    torch.pjrt.set_rng_state(state)
    one = torch.zeros(8, 6, device="pjrt")
    want = [torch.rand(8, 6, device="pjrt").cpu(), torch.rand(8, 6, device="pjrt").cpu(),
            torch.nn.functional.dropout(one + 1, 0.5).cpu()]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(after, torch.pjrt.get_rng_state())
    assert got[0].unique().numel() == 48
    rows = got[0].chunk(4)
    assert all(not torch.equal(rows[i], rows[j]) for i in range(4) for j in range(i + 1, 4))
