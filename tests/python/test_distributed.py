"""Runtime API, data parallelism over devices (one process) and processes
(launch, torchrun, two simulated nodes), and faults. Loopback only."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import distributed as D, runtime
from conftest import run_python

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
import dp_worker  # noqa: E402


def single_device_weights():
    dev = torch_pjrt.device()
    m = dp_worker.model().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    X, Y = dp_worker.data()
    for s in range(dp_worker.STEPS):
        F.cross_entropy(m(X[s].to(dev)), Y[s].to(dev)).backward()
        opt.step()
        opt.zero_grad()
        torch_pjrt.sync()
    return [p.detach().cpu() for p in m.parameters()]


@pytest.fixture(scope="module")
def reference():
    return single_device_weights()


def assert_weights_equal(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_infos(out_dir, n):
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(n)]


def test_runtime_api_in_one_process():
    assert runtime.device_type() == "CPU"
    assert runtime.world_size() == 1 and runtime.global_ordinal() == 0 and runtime.local_ordinal() == 0
    assert runtime.host_index() == 0 and runtime.process_index() == 0 and runtime.process_count() == 1
    assert runtime.addressable_device_count() == 4 and runtime.global_device_count() == 4
    assert runtime.devices()[-1] == torch.device("pjrt:3")
    assert runtime.using_pjrt() is True
    info = runtime.plugin_info()
    assert os.path.isfile(info["path"]) and info["pjrt_api_version"].startswith("0.")
    caps = runtime.capabilities()
    assert caps["multiprocess"] and caps["collectives"] and caps["cross_process_collectives"] == "gloo"


def test_runtime_import_does_not_warn():
    r = run_python("import warnings; warnings.simplefilter('error'); import torch_pjrt.runtime as r; print(r.world_size())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_inconsistent_launcher_environment_is_an_error():
    r = run_python("import torch_pjrt; torch_pjrt.runtime.global_ordinal()", RANK="3", WORLD_SIZE="2")
    assert r.returncode != 0 and "RANK=3 with WORLD_SIZE=2" in r.stderr


def test_four_devices_in_one_process_match_single_device(reference):
    with torch_pjrt.replicated(4) as r:
        m = dp_worker.model().to(r.device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        X, Y = dp_worker.data()
        torch_pjrt.metrics.reset()
        for s in range(dp_worker.STEPS):
            F.cross_entropy(m(r.shard(X[s])), r.shard(Y[s])).backward()
            D.optimizer_step(opt)
            opt.zero_grad()
            torch_pjrt.sync()
        assert torch_pjrt.metrics.counters()["executions"] == dp_worker.STEPS  # one program per step
        replicas = [r.values(p) for p in m.parameters()]
    assert_weights_equal(reference, [v[0] for v in replicas])
    for per_param in replicas:
        for v in per_param[1:]:
            torch.testing.assert_close(v, per_param[0], rtol=0, atol=0)


def test_collectives_inside_a_replicated_program():
    with torch_pjrt.replicated(4) as r:
        x = r.shard(torch.arange(8.0).reshape(4, 2))  # replica i holds [2i, 2i+1]
        s = D.all_reduce(x.clone())
        g = D.all_gather(x, 0)
        rs = D.reduce_scatter(torch.ones(4, device=r.device) * (x[0:1, 0] + 1), 0)
        b = D.broadcast(x.clone(), 2)
        torch_pjrt.sync()
        assert [v.tolist() for v in r.values(s)] == [[[12.0, 16.0]]] * 4
        assert all(v.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] for v in r.values(g))
        assert [v.tolist() for v in r.values(rs)] == [[16.0]] * 4  # sum over replicas of (2i + 1)
        assert [v.tolist() for v in r.values(b)] == [[[4.0, 5.0]]] * 4


def test_max_and_min_across_replicas_are_nan_where_a_replica_holds_one():
    # as torch.max over the replicas' values (XLA's maximum across replicas alone drops a NaN)
    with torch_pjrt.replicated(2) as r:
        t = r.shard(torch.tensor([[float("nan"), 1.0], [2.0, 3.0]]))
        hi, lo = D.all_reduce(t.clone(), "max"), D.all_reduce(t.clone(), "min")
        f16 = D.all_reduce(t.half(), "max")
        assert all(v[0, 0].isnan().item() and v[0, 1].item() == 3.0 for v in r.values(hi))
        assert all(v[0, 0].isnan().item() and v[0, 1].item() == 1.0 for v in r.values(lo))
        assert all(v[0, 0].isnan().item() and v[0, 1].item() == 3.0 for v in r.values(f16))


def test_a_nested_region_of_another_size_is_refused_a_later_one_reads_replica_0():
    with torch_pjrt.replicated(3) as r:
        a = r.shard(torch.tensor([1.0, 2.0, 3.0]))
        w = torch.ones(2, device=r.device)
        w.add_(1)  # written in the region: one (equal) value per replica
        with pytest.raises(RuntimeError, match=r"replicated\(2\) inside a replicated\(3\) region"):
            with torch_pjrt.replicated(2):
                pass
        assert [v.tolist() for v in r.values(D.all_reduce(a.clone()))] == [[6.0]] * 3
    assert (a * 1).cpu().tolist() == [1.0]  # outside a region: replica 0's, as host reads
    with torch_pjrt.replicated(2) as r2:  # a later region of another size: replica 0's too
        assert [v.tolist() for v in r2.values(w * 2)] == [[4.0, 4.0]] * 2


def test_bad_arguments_of_the_one_process_collectives_are_clear_errors():
    with torch_pjrt.replicated(2) as r:
        x = r.shard(torch.arange(4.0).reshape(2, 2))
        with pytest.raises(ValueError, match="src 2 is not a participant"):
            D.broadcast(x, 2)
        with pytest.raises(ValueError, match="0-d tensor"):
            D.all_gather(x[0, 0], 0)
        with pytest.raises(ValueError, match="0-d tensor"):
            r.shard(torch.tensor(3.0))
        with pytest.raises(IndexError, match="dim 5 is out of range"):
            r.shard(torch.ones(2, 2), dim=5)
    with pytest.raises(ValueError, match="src -1 is not a participant"):
        D.broadcast(torch.ones(2, device="pjrt"), -1)
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="nprocs must be a positive number"):
            D.launch(print, nprocs=n)


def test_a_scale_an_integer_tensor_cannot_hold_is_torchs_error_not_truncated():
    # it was truncated in one process (0.5 -> 0: all zeros; 1.5 -> 1)
    with torch_pjrt.replicated(2) as r:
        t = r.shard(torch.tensor([[3, 5], [3, 6]]))
        for scale in (0.5, 1.5):
            with pytest.raises(RuntimeError, match="can't be cast to the desired output type int64"):
                D.all_reduce(t, "sum", scale)
            with pytest.raises(RuntimeError, match="can't be cast"):
                D.reduce_scatter(t, 0, scale)
        D.all_reduce(t, "sum", 2)  # an integer scale stays exact
        h = r.shard(torch.tensor([[3.0, 5.0], [3.0, 6.0]], dtype=torch.float16))
        D.all_reduce(h, "sum", 0.5)
        torch_pjrt.sync()
        assert [v.tolist() for v in r.values(t)] == [[[12, 22]]] * 2
        assert [v.tolist() for v in r.values(h)] == [[[3.0, 5.5]]] * 2
    with pytest.raises(RuntimeError, match="can't be cast"):
        D.all_reduce(torch.tensor([3, 5], device=torch_pjrt.device()), "sum", 0.5)


def test_launch_two_processes_match_single_device(reference, tmp_path):
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import dp_worker, torch_pjrt\n"
            f"if __name__ == '__main__':\n"
            f"    torch_pjrt.launch(dp_worker.main, args=({str(tmp_path)!r},), nprocs=2)\n")
    r = run_python(code, timeout=300, CPU_NUM_DEVICES=None)
    assert r.returncode == 0, r.stderr[-3000:]
    infos = read_infos(tmp_path, 2)
    assert sorted(i["rank"] for i in infos) == [0, 1] and all(i["world"] == 2 for i in infos)
    assert [i["local"] for i in infos] == [0, 1] and all(i["host"] == 0 and i["devices"] == 1 for i in infos)
    assert_weights_equal(reference, torch.load(tmp_path / "weights.pt"))


def torchrun(args, tmp_path, extra_env=None, log=None, worker="dp_worker.py", worker_args=()):
    """torchrun of `worker` (dp_worker); its output piped, or into the file `log`."""
    env = dict(os.environ)
    env.pop("CPU_NUM_DEVICES", None)
    env["CPU_NUM_DEVICES"] = "1"
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, os.path.join(HERE, worker), str(tmp_path), *worker_args]
    if log is None:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def stop(p):
    """SIGTERM (torchrun stops its workers), then SIGKILL of its group."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_torchrun_two_processes_match_single_device(reference, tmp_path):
    # the script makes its own gloo group first: torch_pjrt.distributed
    # uses it through host copies (launch's test covers the "pjrt" group)
    p = torchrun(["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())], tmp_path,
                 worker_args=("-1", "gloo"))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    infos = read_infos(tmp_path, 2)
    assert sorted(i["rank"] for i in infos) == [0, 1]
    assert_weights_equal(reference, torch.load(tmp_path / "weights.pt"))


def test_torch_distributed_backend_pjrt_matches_gloo_on_the_cpu(tmp_path):
    # A plain torch.distributed script (init_process_group("pjrt"), the
    # collectives, DistributedDataParallel, compiled too, SyncBatchNorm, FSDP
    # and FSDP2) gives on pjrt
    # tensors what the same group gives on CPU tensors (gloo's own results).
    p = torchrun(["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())], tmp_path,
                 worker="c10d_worker.py")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    results = [json.load(open(tmp_path / f"c10d{r}.json")) for r in (0, 1)]
    for r, res in enumerate(results):
        assert res["backend"] == "pjrt"
        assert res["pjrt"] == res["cpu"], r
        assert res["pjrt"]["all_reduce_view"] == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]  # not gloo's failure either
        assert res["pjrt"]["all_reduce_int_product"] == [12] and res["pjrt"]["async_completed"] == [1.0]
        assert res["pjrt"]["new_group"] == [3.0]
        assert res["pjrt"]["all_reduce_strided"] == [[r, 3, 2 + r, 7], [4 + r, 11, 6 + r, 15]]
        assert res["pjrt"]["all_reduce_avg"] == [2.5] and res["pjrt"]["all_reduce_int_avg"] == [2]  # truncated, as NCCL
        ddp = res["ddp"]
        assert ddp["moved"] > 0.05  # the weights trained
        # BatchNorm removes the first layer's bias from the loss: its gradient
        # is rounding noise, which momentum keeps small
        assert max(ddp["diff"].values()) < 1e-5, ddp["diff"]
        # steady DDP steps: the buffer broadcast, the bucket's all-reduce in
        # the backward, the update: 3 programs, nothing compiled
        assert ddp["steady"] == {"executions": 3 * 4, "compiles": 0}, ddp["steady"]
        assert ddp["fallbacks"] == {}
        # nn.SyncBatchNorm under DDP, each process on its half: the whole
        # batch's BatchNorm on the CPU (outputs, gradients, running statistics)
        sbn = res["sync_batch_norm"]
        assert sbn["sync_bn"] == "SyncBatchNorm" and sbn["fallbacks"] == {}
        assert max(sbn["diff"].values()) < 1e-5, sbn["diff"]
        assert max(sbn["running_var"]) > 1.2  # the statistics moved from 1
        assert res["compiled_ddp"] < 1e-5  # torch.compile of the DDP model, backend "pjrt"
        assert res["fsdp"]["fsdp"] < 1e-5 and res["fsdp"]["fsdp2"] < 1e-5 and res["fsdp"]["fallbacks"] == {}
    assert results[0]["pjrt"]["gather"] == [0.0, 1.0]
    assert results[1]["pjrt"]["recv"] == [42.0, 5.0, 0.0]  # from rank 0; from any rank, and which one
    assert [res["pjrt"]["ring"] for res in results] == [[2.0, 2.0], [1.0, 1.0]]


def test_local_rank_as_a_device_index_says_each_process_numbers_its_own_devices():
    # CUDA scripts pick cuda:LOCAL_RANK; a pjrt process of a job has its own
    # devices from 0 (torch_pjrt.launch and torchrun alike)
    r = run_python("""
import torch, torch_pjrt
for make in (lambda: torch.ones(1, device="pjrt:1"), lambda: torch.ones(1).to("pjrt:1"), lambda: torch_pjrt.device(1),
             lambda: torch.Generator(device="pjrt:1")):
    try:
        make()
    except IndexError as e:
        print(e)
""", CPU_NUM_DEVICES=1, WORLD_SIZE=2, RANK=1, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2)
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4, r.stdout + r.stderr
    assert all("1 pjrt device(s) in this process (one of 2 in the job" in m and 'torch.device("pjrt")' in m
               and "LOCAL_RANK" in m for m in lines)


def test_two_nodes_on_loopback_have_host_index_0_and_1(reference, tmp_path):
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    logs = [tmp_path / f"node{n}.log" for n in (0, 1)]
    procs = [torchrun(common + ["--node-rank", str(n)], tmp_path, log=logs[n]) for n in (0, 1)]
    # Both awaited together (outputs in files, never a full pipe): the two
    # agents meet at torchrun's exit barrier, so one stuck keeps the other
    # waiting. On a timeout both are stopped and both logs shown.
    deadline = time.monotonic() + 240
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            stop(p)
        pytest.fail("the two torchrun nodes did not finish in 240 s:\n" + "\n".join(
            f"--- node {n} (exit {procs[n].returncode}):\n{logs[n].read_text()[-3000:]}" for n in (0, 1)))
    for n, p in enumerate(procs):
        assert p.returncode == 0, logs[n].read_text()[-3000:]
    infos = sorted(read_infos(tmp_path, 2), key=lambda i: i["rank"])
    assert [i["host"] for i in infos] == [0, 1]
    assert [i["local"] for i in infos] == [0, 0]
    assert_weights_equal(reference, torch.load(tmp_path / "weights.pt"))


def test_pjrt_group_leaves_cpu_tensors_to_gloo_unheld_and_takes_sparse_ones():
    # a one-process "pjrt" group in this process: the caller's CPU tensors go
    # to gloo as they are (not held: a tensor reduced every step is not kept
    # once per call), sparse ones too; non-contiguous ones come back right
    import datetime
    import torch.distributed as dist
    from torch_pjrt.process_group import ProcessGroupPjrt

    g = ProcessGroupPjrt(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    try:
        t = torch.ones(3)
        before = t._use_count()
        for _ in range(5):
            g.allreduce([t]).wait()
        torch_pjrt._C._hold_for_collective([])
        deadline = time.monotonic() + 10  # gloo's worker threads let go of their finished work shortly after
        while t._use_count() != before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t._use_count() == before
        sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), check_invariants=True)
        g.allreduce([sparse]).wait()
        assert sparse.to_dense().tolist() == [1.0, 0.0, 2.0, 0.0]
        y = torch.arange(8.0).reshape(2, 4)
        g.allreduce([y[:, 1::2]]).wait()
        assert y.tolist() == torch.arange(8.0).reshape(2, 4).tolist()
        p = torch.arange(4.0, device=torch_pjrt.device())
        g.allreduce([p[::2]]).wait()
        assert p.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        g.shutdown()


def test_host_tensors_of_a_collective_stay_held_while_another_holder_remains():
    # What the gloo call holds is stood for by a view (it holds its base from
    # C++). While it does, the hold keeps the tensor (and so its Python
    # object); once only the Python object remains, the next call lets go.
    t = torch.ones(3)
    alone = sys.getrefcount(t)
    torch_pjrt._C._hold_for_collective([t])
    assert sys.getrefcount(t) == alone + 1  # held from C++: its Python object is kept
    v = t[...]
    assert v._base is t
    torch_pjrt._C._hold_for_collective([])
    assert sys.getrefcount(t) == alone + 1
    del v
    torch_pjrt._C._hold_for_collective([])
    assert sys.getrefcount(t) == alone


def test_dead_peer_is_reported_by_rank_and_others_stop(tmp_path):
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import dp_worker, torch_pjrt\n"
            f"if __name__ == '__main__':\n"
            f"    torch_pjrt.launch(dp_worker.main, args=({str(tmp_path)!r}, 1), nprocs=2)\n")
    t0 = time.time()
    r = run_python(code, timeout=120, CPU_NUM_DEVICES=None, TORCH_PJRT_DIST_TIMEOUT="20")
    assert r.returncode != 0
    assert "rank 1 died (exit code 3)" in r.stderr, r.stderr[-2000:]
    assert time.time() - t0 < 100


def test_rendezvous_names_the_tags_each_process_reached(tmp_path):
    (tmp_path / "tags.py").write_text(
        "from torch_pjrt import distributed as D, runtime\n"
        "def main():\n"
        "    D.rendezvous('same')\n"
        "    D.rendezvous('')\n"
        "    D.rendezvous('step-%d' % runtime.process_index())\n")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import tags, torch_pjrt\n"
            "if __name__ == '__main__':\n"
            "    torch_pjrt.launch(tags.main, nprocs=2)\n")
    r = run_python(code, timeout=120, CPU_NUM_DEVICES=None, TORCH_PJRT_DIST_TIMEOUT="20")
    assert r.returncode != 0
    assert "rendezvous mismatch: processes reached ['step-0', 'step-1']" in r.stderr, r.stderr[-2000:]


def test_missing_peer_times_out_with_a_message():
    code = ("import torch, torch_pjrt\n"
            "t = torch.ones(2, device='pjrt')\n"
            "torch_pjrt.distributed.all_reduce(t)\n")
    t0 = time.time()
    r = run_python(code, timeout=120, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TORCH_PJRT_DIST_TIMEOUT="5")
    assert r.returncode != 0
    assert "rank 0 of 2" in r.stderr and "peer process may have died" in r.stderr, r.stderr[-2000:]
    assert time.time() - t0 < 90


def test_a_failure_names_the_timeout_of_the_group_that_waited():
    # TORCH_PJRT_DIST_TIMEOUT sets the group torch_pjrt makes; a group the
    # script made itself keeps its own timeout, which the error names
    code = ("import torch.distributed as dist, torch_pjrt\n"
            "from torch_pjrt import distributed as D\n"
            "print(D._timeout_words())\n"
            "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:%d')\n"
            "print(D._timeout_words())\n" % free_port())
    r = run_python(code, timeout=120, TORCH_PJRT_DIST_TIMEOUT="15")
    assert r.returncode == 0, r.stderr[-2000:]
    ours, theirs = r.stdout.strip().splitlines()[-2:]
    assert ours == "TORCH_PJRT_DIST_TIMEOUT=15s"
    assert "the process group the script made" in theirs and "init_process_group(timeout=...)" in theirs


UNUSED_CHILD = """
import torch, torch_pjrt
from torch_pjrt import distributed as D, runtime
rank, dev = runtime.process_index(), torch_pjrt.device()
torch.manual_seed(0)
m = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(4)]).to(dev)  # trunk, head a, head b, never used
opt = torch.optim.AdamW(m.parameters(), lr=0.1)
for step in range(2):
    h = m[0](torch.ones(2, 4, device=dev) * (rank + 1))
    out = m[2](h) if step == 1 - rank else m[1](h) + m[2](h)  # each rank leaves head a out once
    out.sum().backward()
    D.optimizer_step(opt)
    opt.zero_grad(set_to_none=True)
    torch_pjrt.sync()
assert m[3].weight.grad is None and not opt.state.get(m[3].weight)  # unused everywhere: no gradient, no step
w = D.all_gather(torch.cat([p.detach().reshape(1, -1) for p in m[:3].parameters()], 1))
assert torch.equal(w[0].cpu(), w[1].cpu()), "replicas diverged"
try:  # one part per process, or an error, as in one process
    D.reduce_scatter(torch.ones(3, device=dev))
    raise SystemExit("reduce_scatter of 3 over 2 processes did not raise")
except ValueError:
    pass
print("ok")
"""


def test_parameters_unused_on_some_ranks_keep_the_replicas_equal():
    # reducing only the gradients each rank has would pair different
    # parameters' gradients across ranks: the ranks first agree on the set
    port = free_port()
    env = dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", CPU_NUM_DEVICES="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), TORCH_PJRT_DIST_TIMEOUT="30")
    procs = [subprocess.Popen([sys.executable, "-c", UNUSED_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]


LAUNCH_LOOP = """
import sys, time, torch, torch_pjrt
from torch_pjrt import distributed as D
def fn():
    t = torch.ones(2, device="pjrt")
    D.all_reduce(t)
    if torch_pjrt.runtime.process_index() == 0:  # one line: the ranks share the pipe
        print("rank started", flush=True)
    for _ in range(600):  # a minute of steps
        D.all_reduce(t)
        time.sleep(0.1)
    print("rank finished", flush=True)
if __name__ == "__main__":
    torch_pjrt.launch(fn, nprocs=2)
"""


def test_sigint_to_the_launcher_alone_stops_its_ranks(tmp_path):
    # kill -INT <pid> (an IDE's stop button) reaches the launcher only, not
    # its process group as a terminal's Ctrl-C does
    script = tmp_path / "job.py"
    script.write_text(LAUNCH_LOOP)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, "CPU_NUM_DEVICES": "1"})
    try:
        assert p.stdout.readline().strip() == "rank started"
        t0 = time.time()
        os.kill(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        assert time.time() - t0 < 30 and "rank finished" not in out
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


SLOW_PEER = """
import os, sys, time, torch, torch_pjrt
from torch_pjrt import distributed as D
t = torch.ones(2, device="pjrt")
D.all_reduce(t)  # both ranks joined
if os.environ["RANK"] == "1":
    time.sleep(120)  # the slow peer: never reaches the next collective
    sys.exit(0)
print("waiting", flush=True)
D.all_reduce(t) if sys.argv[1] == "all_reduce" else torch.distributed.barrier()
print("returned", flush=True)
"""


@pytest.mark.parametrize("what", ["all_reduce", "barrier"])
def test_ctrl_c_interrupts_a_collective_waiting_for_a_slow_peer(what):
    # gloo's wait does not look at signals: before, KeyboardInterrupt came
    # only when the group's timeout (60 s here) ran out, and exit waited
    # for the abandoned collective as long again
    port = free_port()
    env = dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", CPU_NUM_DEVICES="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), TORCH_PJRT_DIST_TIMEOUT="60")
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_PEER, what], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    try:
        assert procs[0].stdout.readline().strip() == "waiting", procs[0].stderr.read()[-2000:]
        time.sleep(1.0)  # in gloo's wait by now
        t0 = time.time()
        procs[0].send_signal(signal.SIGINT)
        out, err = procs[0].communicate(timeout=50)
        assert time.time() - t0 < 10, f"took {time.time() - t0:.1f}s"
        assert procs[0].returncode != 0 and "returned" not in out
        assert "KeyboardInterrupt" in err and "Operation timed out" not in err, err[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_a_silent_listener_on_the_master_port_is_an_error_not_a_hang():
    # another service holds MASTER_PORT: it accepts and never answers, and
    # TCPStore's handshake has no deadline of its own
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        code = ("import torch, torch_pjrt\n"
                "torch_pjrt.distributed.all_reduce(torch.ones(2, device='pjrt'))\n")
        t0 = time.time()
        r = run_python(code, timeout=120, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(silent.getsockname()[1]), TORCH_PJRT_DIST_TIMEOUT="1")
    assert r.returncode != 0 and "did not finish within 6s" in r.stderr and "another service" in r.stderr, r.stderr[-2000:]
    assert time.time() - t0 < 60


def test_random_stream_continues_across_replicated_regions():
    torch_pjrt.manual_seed(5)
    x = torch.rand(8, device="pjrt").cpu()
    with torch_pjrt.replicated(2):
        pass
    y = torch.rand(8, device="pjrt").cpu()
    assert not torch.equal(x, y)


def test_nested_regions_restore_the_outer_one():
    with torch_pjrt.replicated(4):
        with torch_pjrt.replicated(4):
            assert torch_pjrt._C._replicas() == 4
        assert torch_pjrt._C._replicas() == 4
        with torch_pjrt.replicated(1):  # one replica: no per-replica tensor to misread
            assert torch_pjrt._C._replicas() == 1
        assert torch_pjrt._C._replicas() == 4
    assert torch_pjrt._C._replicas() == 1


def test_collective_size_counts_replicas_in_a_region_else_processes():
    assert D.collective_size() == runtime.process_count() == 1
    with torch_pjrt.replicated(4):
        assert D.collective_size() == 4
        assert runtime.world_size() == 1  # processes, whatever the region
    with torch_pjrt.replicated(2):
        assert D.collective_size() == 2
    assert D.collective_size() == 1
    assert not hasattr(D, "world_size")  # one meaning per name: runtime.world_size() counts processes
