"""CI subset of the OpInfo conformance run: every entry of the pass list must
still pass natively (right answer, no CPU fallback; gradients for float32),
and the expected-failure file must name a reason for each entry it lists.
The full run is `make conformance` (3.5-6 minutes on 2 cores)."""

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
