"""The model zoo (tests/python/zoo.py) on pjrt against eager CPU: a few AdamW
steps from the same weights and data; losses agree, nothing falls back to
the CPU, nothing compiles once the step is warm.

`make test` runs the subset in SUBSET (a few families, both modes, about two
minutes on 2 cores); `make models` runs every family in every mode
(`pytest --models=all`).

Tolerance: relative 2e-3 per step (float32 with XLA's fusion and
reassociation stays near 1e-7 on these models; a wrong gradient or a wrong
mask moves the loss by more than 1e-2 within three steps). Under bfloat16
autocast the reference is float32 training on the CPU, and the tolerance is
bfloat16's: relative 3e-2 (an 8-bit mantissa, 4e-3 per rounding, through a
few matmuls and optimizer steps)."""

import pytest
import torch

import torch_pjrt
import zoo


STEPS = 4
RTOL = 2e-3
RTOL_BF16 = 3e-2

# (family, mode, variant): mode is "lazy" or "compile"; variant is "train",
# "checkpointing" (gradient checkpointing on), "bf16" (training under
# torch.autocast("pjrt", dtype=torch.bfloat16)) or "eval" (inference_mode).
SUBSET = [
    ("gpt2", "lazy", "train"),
    ("bert", "lazy", "eval"),
    ("llama", "lazy", "checkpointing"),
    ("t5", "lazy", "train"),
    ("mixtral", "lazy", "train"),
    ("llama", "compile", "train"),
    ("mobilenetv3", "lazy", "train"),
    ("gpt2", "lazy", "bf16"),
    ("swin", "compile", "train"),
]


def _all_cases():
    for name in zoo.FAMILIES:
        for mode in ("lazy", "compile"):
            yield name, mode, "train"
            yield name, mode, "bf16"
            yield name, mode, "eval"
            if name in zoo.HF and name != "vit":
                yield name, mode, "checkpointing"


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        everything = metafunc.config.getoption("--models") == "all"
        cases = list(_all_cases()) if everything else SUBSET
        metafunc.parametrize("case", cases, ids=["-".join(c) for c in cases])


def _assert_close(cpu, dev, what, rtol=RTOL):
    for step, (a, b) in enumerate(zip(cpu, dev)):
        assert b == pytest.approx(a, rel=rtol), f"{what} step {step}: cpu {a} vs pjrt {b}"


def test_model_matches_cpu(case):
    name, mode, variant = case
    model, batches = zoo.make(name)
    if variant == "eval":
        cpu = zoo.evaluate(model, batches, "cpu")
        torch_pjrt.metrics.reset()
        dev = zoo.evaluate(model, batches, torch_pjrt.device(), mode=mode)
        _assert_close(cpu, dev, name)
        assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
        return
    ckpt = variant == "checkpointing"
    cpu = zoo.train(model, batches, "cpu", steps=STEPS, checkpointing=ckpt)
    compiles = []

    def after_step():
        torch_pjrt.sync()
        compiles.append(torch_pjrt.metrics.counters().get("compiles", 0))  # 0: all served from the cache

    torch_pjrt.metrics.reset()
    bf16 = variant == "bf16"
    dev = zoo.train(model, batches, torch_pjrt.device(), steps=STEPS, mode=mode, checkpointing=ckpt, sync=after_step,
                    autocast=torch.bfloat16 if bf16 else None)
    _assert_close(cpu, dev, name, RTOL_BF16 if bf16 else RTOL)
    assert cpu[2] < cpu[0], "the model should learn (steps 1 and 3 see the same batch)"
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
    # steps 3 and 4 repeat steps 1 and 2's shapes: nothing new compiles
    assert compiles[-1] == compiles[1], f"compiles after each step: {compiles}\n{torch_pjrt.metrics.report()}"
