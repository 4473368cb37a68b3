"""CI subset of the OpInfo conformance run: every entry of the pass list must
still pass natively (right answer, no CPU fallback; gradients for float32),
and the expected-failure file must name a reason for each entry it lists.
The full run is `make conformance` (3.5-6 minutes on 2 cores)."""

import copy
import os

import pytest
import torch

import torch_pjrt
from torch_pjrt import conformance

HERE = os.path.dirname(__file__)


def _pass_list():
    entries = []
    for line in open(os.path.join(HERE, "opinfo_pass_list.txt")):
        line = line.strip()
        if line and not line.startswith("#"):
            op, dtype = line.split()
            entries.append((op, dtype))
    return entries


PASS = _pass_list()
BY_NAME = {}
for _op in conformance.op_db():
    BY_NAME.setdefault(conformance._entry_name(_op), _op)


def test_pass_list_is_large_and_known():
    f32 = [op for op, dt in PASS if dt == "float32"]
    assert len(f32) >= 300, len(f32)
    missing = [op for op, _ in PASS if op not in BY_NAME]
    assert not missing, f"pass-list entries unknown to this torch's op_db: {missing[:10]}"


def test_expected_failures_have_reasons():
    known = conformance.load_expected(os.path.join(HERE, "opinfo_expected_failures.txt"))
    assert known and all(len(reason) > 20 for reason in known.values())
    assert not any((op, dt) in set(PASS) for key in known for op, dt in [key.split(" ")])


@pytest.mark.parametrize("op_name,dtype", PASS, ids=[f"{o}-{d}" for o, d in PASS])
def test_entry_passes_natively(op_name, dtype):
    torch_pjrt.metrics.reset()
    v = conformance.run_entry(BY_NAME[op_name], conformance.DTYPES[dtype], max_samples=2, grads=True,
                              device=torch_pjrt.device())
    assert conformance.status(v) == "pass", v


class _WrongGrad(torch.autograd.Function):
    """exp with a wrong gradient (2 exp) or, with `raising`, one that raises."""

    @staticmethod
    def forward(ctx, x, raising):
        ctx.save_for_backward(x)
        ctx.raising = raising
        return torch.exp(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.raising:
            raise RuntimeError("backward refused")
        (x,) = ctx.saved_tensors
        return g * torch.exp(x) * 2, None


def _exp_entry(on_device):
    """OpInfo's exp entry (its first two samples: 20 elements, and empty),
    but running on_device(x) for pjrt inputs."""
    op = copy.copy(BY_NAME["exp"])
    op.op = lambda x, *a, **k: on_device(x) if x.device.type == "pjrt" else torch.exp(x, *a, **k)
    return conformance.run_entry(op, torch.float32, max_samples=2, grads=True, device=torch_pjrt.device())


def _raise(message):
    raise RuntimeError(message)


def test_the_runner_tells_each_kind_of_difference_apart():
    # The pass list only checks that entries pass: here each kind of
    # difference must be found and named, with every case of an entry traced
    # before any is read (one program for the samples and their gradients).
    torch_pjrt.metrics.reset()
    right = _exp_entry(torch.exp)
    assert conformance.status(right) == "pass" and right["samples"] == right["passed"] == 2, right
    assert torch_pjrt.metrics.counters().get("executions") == 1
    wrong = _exp_entry(lambda x: torch.exp(x) + 0.01)
    assert conformance.status(wrong) == "fail" and wrong["failed"] == 1, wrong  # the empty sample is right
    assert wrong["detail"].startswith("output 0"), wrong
    grad = _exp_entry(lambda x: _WrongGrad.apply(x, False))
    assert conformance.status(grad) == "fail" and grad["detail"].startswith("gradient output 0"), grad
    refused = _exp_entry(lambda x: _raise("the device refused"))
    assert conformance.status(refused) == "error" and "RuntimeError: the device refused" in refused["detail"], refused
    grad_raises = _exp_entry(lambda x: _WrongGrad.apply(x, True))
    assert conformance.status(grad_raises) == "error" and "backward refused" in grad_raises["detail"], grad_raises
    # a gradient that raises counts only where the forward compared right:
    # the 20-element sample is a wrong answer, the empty one an error
    both = _exp_entry(lambda x: _WrongGrad.apply(x, True) + 0.01)
    assert both["failed"] == 1 and both["errored"] == 1 and both["detail"].startswith("output 0"), both


def test_the_cli_refuses_op_names_it_does_not_know(capsys):
    # --ops with a misspelt name ran nothing and reported "0 passed, 0 failed", exit 0
    with pytest.raises(SystemExit) as e:
        conformance.main(["--ops", "erfcx,sinn", "--json", os.devnull])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no OpInfo entry named erfcx (did you mean special.erfcx?)" in err and "sinn" in err
