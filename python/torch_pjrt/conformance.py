"""OpInfo conformance: PyTorch's own sample inputs for each operator
(``torch.testing._internal.common_methods_invocations.op_db``, shipped in the
wheel) run on pjrt and on the CPU, results compared.

Per (op, dtype) entry the verdict is one of:

- ``pass``: every sample gives the CPU answer, and nothing fell back;
- ``fallback``: right answers, but some sample ran an op on the CPU;
- ``fail``: a wrong answer (value, shape or dtype), forward or gradient;
- ``error``: pjrt raised where the CPU did not;
- ``skip``: no sample could run on the CPU either.

    python -m torch_pjrt.conformance [--dtypes float32,int64,bool,bfloat16]
        [--ops NAME,...] [--entries FILE] [--max-samples N] [--no-grad]
        [--special-values] [--out] [--inplace] [--json conformance.json]

prints one line per entry and a summary ``N passed, N failed`` (passed counts
``pass`` and ``fallback``; failed counts ``fail`` and ``error``), and writes
the JSON report.

``--special-values`` runs each sample in two other forms instead: with NaN,
+inf, -inf and -0.0 written into every floating-point input (at fixed,
evenly spread positions, so each run is the same), and with every input
emptied along its last dimension. NaN equals NaN, and a zero of the CPU's
result must have its sign. ``make conformance-special`` runs it over the
float32 and bfloat16 entries of the native pass list (``--entries``);
docs/semantics.md explains the differences it expects.

``--out`` and ``--inplace`` run each sample through the op's ``out=`` form
(entries whose OpInfo says ``supports_out``) and its ``inplace_variant``
instead, as entries named ``op[out]`` and ``op[inplace]``, compared with the
CPU doing the same; where the CPU raises, pjrt must raise too. The out= pass
tries four outputs per sample: fresh tensors of the right shape and dtype,
empty tensors (resized), non-contiguous views into bigger tensors (the rest
must stay untouched), and, for a floating-point result, int64 tensors (the
CPU refuses the cast). No gradients. ``make conformance-out`` runs both over
the float32 entries of the pass list (docs/device.md, "In-place and out= forms").
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
import traceback
import warnings
from typing import Dict, Iterable, List, Optional

import torch

import torch_pjrt

DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool, "bfloat16": torch.bfloat16}

# Ops whose results are random, data-dependent in size or order, or depend on
# memory layout, so a value comparison with the CPU says nothing.
NOT_COMPARABLE = {
    "bernoulli", "normal", "uniform", "rand_like", "randn_like", "randint_like", "randint", "randn", "rand",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.rrelu", "multinomial", "item", "to_sparse",
    "unique", "unique_consecutive", "data_ptr", "storage_offset", "equal", "allclose", "isclose",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "randperm", "cauchy",
    "exponential", "geometric", "log_normal", "sparse.sampled_addmm", "sparse.mm", "resize_", "resize_as_",
}


def _entry_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _to(x, device):
    if isinstance(x, torch.Tensor):
        y = x.detach().to(device)
        return y.requires_grad_(x.requires_grad) if x.is_floating_point() or x.is_complex() else y
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        # a factory's device= argument moves too: its result must be made on
        # the device, not on the CPU and compared with itself
        return {k: device if k == "device" and isinstance(v, (str, torch.device)) else _to(v, device)
                for k, v in x.items()}
    return x


def _flatten(x) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out = []
        for v in x:
            out += _flatten(v)
        return out
    return []


# Written into floating-point inputs by the special-values pass.
SPECIAL_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0)


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _with_special_values(t: torch.Tensor, k: int) -> torch.Tensor:
    """A copy of `t` with NaN, +inf, -inf, -0.0 (rotated by k, the tensor's
    place among the sample's float inputs) at evenly spread positions."""
    out = t.detach().clone()
    values = SPECIAL_VALUES[k % 4:] + SPECIAL_VALUES[:k % 4]
    if out.dim() == 0:
        out.fill_(values[0])
    else:
        m = min(out.numel(), 4)
        for j in range(m):
            pos = torch.tensor((j * out.numel()) // m)
            out[tuple(int(i) for i in torch.unravel_index(pos, out.shape))] = values[j]
    return out.requires_grad_(t.requires_grad)


def _emptied(t: torch.Tensor) -> torch.Tensor:
    """`t` cut to size 0 along its last dimension, without gradient: the
    gradients of empty tensors are empty, and the CPU's own backward of some
    ops crashes on them (native_batch_norm)."""
    return t.detach() if t.dim() == 0 else t.detach()[..., :0].clone()


def _cases(sample, special: bool):
    """(label, [input, args, kwargs]) forms of one sample to run; gradients
    are checked for inputs that require them."""
    base = [sample.input, list(sample.args), dict(sample.kwargs)]
    if not special:
        return [("sample", base)]
    counter = [0]

    def inject(t):
        if not t.is_floating_point():
            return t
        counter[0] += 1
        return _with_special_values(t, counter[0] - 1)

    return [("special values", _map(base, inject)), ("empty", _map(base, _emptied))]


def _tolerance(dtype):
    if dtype in (torch.bfloat16, torch.float16, torch.complex32):
        return dict(rtol=1.6e-2, atol=1e-2)
    if dtype.is_floating_point or dtype.is_complex:
        return dict(rtol=1e-4, atol=1e-5)
    return dict(rtol=0, atol=0)


def _compare(got, want, dtype, signed_zeros: bool = False) -> Optional[str]:
    g, w = _flatten(got), _flatten(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, expected {len(w)}"
    for i, (a, b) in enumerate(zip(g, w)):
        a = a.detach().cpu()
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype}, expected {b.dtype}"
        if a.shape != b.shape:
            return f"output {i}: shape {tuple(a.shape)}, expected {tuple(b.shape)}"
        tol = _tolerance(b.dtype)
        if (b.dtype.is_floating_point or b.dtype.is_complex) and b.numel():
            # absolute error relative to the output's scale: reductions over
            # large values differ by a few ulps of the large values
            finite = b.detach()[torch.isfinite(b.detach())]
            if finite.numel():
                tol["atol"] *= max(1.0, float(finite.abs().max()))
        try:
            torch.testing.assert_close(a, b.detach(), equal_nan=True, **tol)
        except AssertionError as e:
            return f"output {i}: " + str(e).strip().splitlines()[0]
        if signed_zeros and b.dtype.is_floating_point:
            zeros = (a == 0) & (b.detach() == 0)
            wrong = torch.signbit(a[zeros]) != torch.signbit(b.detach()[zeros])
            if wrong.any():
                return f"output {i}: {int(wrong.sum())} zero(s) of the wrong sign"
    return None


def _fallbacks() -> int:
    return sum(torch_pjrt.metrics.fallbacks().values())


def _grads(out, inputs: List[torch.Tensor]):
    outs = [o for o in _flatten(out) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    wanted = [t for t in inputs if t.requires_grad]
    if not outs or not wanted:
        return None
    gen = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs)
    return torch.autograd.grad(loss, wanted, allow_unused=True)


MODES = ("functional", "out", "inplace")


def has_mode(op, mode: str) -> bool:
    return mode == "functional" or (mode == "out" and op.supports_out) or (
        mode == "inplace" and op.inplace_variant is not None)


def _samples(op, dtype, requires_grad: bool, n: int) -> list:
    """The first `n` of ``op.sample_inputs("cpu", dtype, requires_grad)``,
    drawn as OpInfo draws them: each after seeding torch's CPU generator,
    ``random`` and numpy with the test suite's SEED (the device's generator
    is left alone: no sample is drawn there). OpInfo's own iterator also
    looks for the running unittest case through ``inspect.stack()`` twice
    per call (slow under pytest's deep stacks) and reseeds every accelerator
    module (CUDA, XPU and MTIA format a traceback per lazy seed), and the
    callers used to draw every sample to keep `n` (max_pool2d makes
    hundreds): half of the time of the heaviest OpInfo tests."""
    import random

    from torch.testing._internal import common_utils

    samples = iter(op.sample_inputs_func(op, "cpu", dtype, requires_grad))
    out = []
    for _ in range(n):
        torch.default_generator.manual_seed(common_utils.SEED)
        random.seed(common_utils.SEED)
        if common_utils.TEST_NUMPY:
            import numpy

            numpy.random.seed(common_utils.SEED)
        sample = next(samples, None)
        if sample is None:
            break
        out.append(sample)
    return out


def run_entry(op, dtype, max_samples: int, grads: bool, device, special: bool = False,
              mode: str = "functional") -> dict:
    name = _entry_name(op) + ("" if mode == "functional" else f"[{mode}]")
    verdict = {"op": name, "dtype": str(dtype).replace("torch.", ""), "samples": 0, "passed": 0,
               "fallback": 0, "failed": 0, "errored": 0, "detail": ""}
    if mode != "functional":
        try:
            samples = _samples(op, dtype, False, max_samples)
        except Exception as e:
            verdict["detail"] = f"no samples: {type(e).__name__}"
            return verdict
        for sample in samples:
            case = [sample.input, list(sample.args), dict(sample.kwargs)]
            if mode == "out":
                for label, make in OUT_FORMS:
                    _run_out_case(op, dtype, case, device, label, make, verdict)
            else:
                _run_inplace_case(op, dtype, case, device, verdict)
        return verdict
    want_grad = grads and dtype == torch.float32 and op.supports_autograd
    try:
        samples = _samples(op, dtype, want_grad, max_samples)
    except Exception as e:  # the OpInfo itself cannot make samples here
        verdict["detail"] = f"no samples: {type(e).__name__}"
        return verdict
    # Every case of the entry is traced before any is read, so that they run
    # as one program: compiles are most of the run's time. An error raised
    # when that program runs is counted to the first case read.
    started = [_start_case(op, dtype, case, want_grad, device, special, label, verdict)
               for sample in samples for label, case in _cases(sample, special)]
    for case in started:
        if case is not None:
            _finish_case(case, dtype, special, verdict)
    return verdict


def _start_case(op, dtype, case, want_grad: bool, device, special: bool, label: str, verdict: dict):
    """Runs one case on the CPU and traces it on the device, its gradients
    included, reading nothing back. Returns what _finish_case compares, or
    None when the case is settled here (the CPU cannot run it either, or the
    device raised while tracing)."""
    prefix = f"{label}: " if special else ""
    try:
        want = op(case[0], *case[1], **case[2])
        want_g = _grads(want, _flatten(case)) if want_grad else None
    except Exception:
        return None  # not runnable on the CPU either
    verdict["samples"] += 1
    dev_sample = _to(case, device)
    before = _fallbacks()
    try:
        got = op(dev_sample[0], *dev_sample[1], **dev_sample[2])
        # results belong on the device, unless the sample moves them to a
        # device it names itself (Tensor.to("cpu", ...))
        named = [a for a in dev_sample[1]
                 if isinstance(a, torch.device) or (isinstance(a, str) and a in ("cpu", "meta"))]
        home = torch.device(named[0]).type if named else torch.device(device).type
        # an error of the gradients counts only once the forward compared right
        got_g = grad_error = None
        if want_g is not None:
            try:
                got_g = _grads(got, _inputs_of(dev_sample))
            except Exception as e:
                grad_error = e
    except Exception as e:
        _count(verdict, None, e, False, prefix)
        return None
    return {"prefix": prefix, "want": want, "want_g": want_g, "got": got, "got_g": got_g,
            "grad_error": grad_error, "home": home, "fell": _fallbacks() > before}


def _finish_case(c: dict, dtype, special: bool, verdict: dict) -> None:
    """Reads a case _start_case traced and counts its verdict."""
    before = _fallbacks()
    try:
        elsewhere = [t.device for t in _flatten(c["got"]) if t.device.type != c["home"]]
        problem = (f"an output is on {elsewhere[0]}, not on the device" if elsewhere
                   else _compare(c["got"], c["want"], dtype, signed_zeros=special))
        if problem is None and c["want_g"] is not None:
            if c["grad_error"] is not None:
                raise c["grad_error"]
            if c["got_g"] is None:
                problem = "no gradient on pjrt"
            else:
                for i, (a, b) in enumerate(zip(c["got_g"], c["want_g"])):
                    if (a is None) != (b is None):
                        problem = f"gradient {i}: defined on one side only"
                        break
                    if a is not None:
                        p = _compare(a, b, dtype, signed_zeros=special)
                        if p:
                            problem = "gradient " + p
                            break
    except Exception as e:
        _count(verdict, None, e, False, c["prefix"])
        return
    _count(verdict, problem, None, c["fell"] or _fallbacks() > before, c["prefix"])


def _out_like(want, make):
    """Output tensors shaped like the CPU result `want` (a tensor or a tuple
    of them), each made by make(tensor) -> (out, base): base is what the
    out tensor is a view of, compared too."""
    if isinstance(want, torch.Tensor):
        return make(want)
    pairs = [make(w) for w in want]
    return tuple(o for o, _ in pairs), tuple(b for _, b in pairs)


def _fresh_out(w):
    o = torch.full(w.shape, 7, dtype=w.dtype) if w.dtype != torch.bool else torch.ones(w.shape, dtype=torch.bool)
    return o, o


def _empty_out(w):
    o = torch.empty(0, dtype=w.dtype)
    return o, o


def _view_out(w):
    """Every other element of the last dimension of a bigger tensor, the
    dimensions reversed: neither contiguous nor starting at offset 0."""
    base = torch.full(tuple(reversed(w.shape)) + (2,), 3, dtype=w.dtype) if w.dtype != torch.bool else \
        torch.ones(tuple(reversed(w.shape)) + (2,), dtype=torch.bool)
    view = base[..., 1].permute(*reversed(range(w.dim()))) if w.dim() else base[..., 1]
    return view, base


def _long_out(w):
    o = torch.zeros(w.shape, dtype=torch.long if (w.is_floating_point() or w.is_complex()) else w.dtype)
    return o, o


# (label, make): the out= forms tried per sample.
OUT_FORMS = [("out", _fresh_out), ("empty out", _empty_out), ("view out", _view_out), ("int64 out", _long_out)]


def _detached(x):
    return _map(x, lambda t: t.detach().clone())


def _mirror(make_cpu, device):
    """make, but on `device`, from the CPU-made tensors (same values and view)."""
    def make(w):
        o, base = make_cpu(w)
        dev_base = base.to(device)
        if o is base:
            return dev_base, dev_base
        return dev_base.as_strided(o.shape, o.stride(), o.storage_offset()), dev_base
    return make


def _count(verdict: dict, problem: Optional[str], error: Optional[Exception], fell: bool, prefix: str) -> None:
    """Counts one case: errored (pjrt raised), failed (a wrong answer),
    fallback (right, but an op ran on the CPU) or passed; the entry's detail
    is its first problem."""
    if error is not None:
        verdict["errored"] += 1
        verdict["detail"] = verdict["detail"] or prefix + f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
    elif problem:
        verdict["failed"] += 1
        verdict["detail"] = verdict["detail"] or (prefix + problem)[:200]
    elif fell:
        verdict["fallback"] += 1
    else:
        verdict["passed"] += 1


def _run_out_case(op, dtype, case, device, label, make, verdict) -> None:
    case = _detached(case)
    try:
        want = op(case[0], *case[1], **case[2])
    except Exception:
        return  # not runnable on the CPU either
    if not isinstance(want, torch.Tensor) and not (
            isinstance(want, tuple) and want and all(isinstance(w, torch.Tensor) for w in want)):
        return
    if label == "int64 out" and not any(w.is_floating_point() or w.is_complex() for w in _flatten(want)):
        return
    out_cpu, base_cpu = _out_like(want, make)
    cpu_error = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ret_cpu = op(case[0], *case[1], **case[2], out=out_cpu)
    except Exception as e:
        cpu_error = e
    verdict["samples"] += 1
    dev_case = _to(case, device)
    if "device" in dev_case[2]:  # factories (zeros, arange, ...) make their result on the out's device
        dev_case[2]["device"] = device
    out_dev, base_dev = _out_like(want, _mirror(make, device))
    before = _fallbacks()
    problem, error = None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ret_dev = op(dev_case[0], *dev_case[1], **dev_case[2], out=out_dev)
        if cpu_error is not None:
            problem = f"the CPU raised ({type(cpu_error).__name__}: {str(cpu_error).splitlines()[0][:80]}), pjrt did not"
        else:
            problem = (_compare(out_dev, out_cpu, dtype) or _compare(base_dev, base_cpu, dtype)
                       or _compare(ret_dev, ret_cpu, dtype))
    except Exception as e:
        if cpu_error is None:
            error = e
    _count(verdict, problem, error, _fallbacks() > before, f"{label}: ")


def _run_inplace_case(op, dtype, case, device, verdict) -> None:
    case = _detached(case)
    fn = op.inplace_variant
    cpu = _detached(case)
    cpu_error = None
    try:
        ret_cpu = fn(cpu[0], *cpu[1], **cpu[2])
    except Exception as e:
        cpu_error = e
    if cpu_error is not None and not isinstance(cpu[0], torch.Tensor):
        return
    verdict["samples"] += 1
    dev = _to(case, device)
    before = _fallbacks()
    problem, error = None, None
    try:
        ret_dev = fn(dev[0], *dev[1], **dev[2])
        if cpu_error is not None:
            problem = f"the CPU raised ({type(cpu_error).__name__}: {str(cpu_error).splitlines()[0][:80]}), pjrt did not"
        else:
            problem = _compare(dev, cpu, dtype) or _compare(ret_dev, ret_cpu, dtype)
            if problem is None and isinstance(ret_cpu, torch.Tensor) and ret_cpu is cpu[0] and ret_dev is not dev[0]:
                problem = "the result is not self"
    except Exception as e:
        if cpu_error is None:
            error = e
    _count(verdict, problem, error, _fallbacks() > before, "inplace: ")


def _inputs_of(dev_sample) -> List[torch.Tensor]:
    return _flatten(dev_sample)


def status(v: dict) -> str:
    if v["samples"] == 0:
        return "skip"
    if v["errored"]:
        return "error"
    if v["failed"]:
        return "fail"
    if v["fallback"]:
        return "fallback"
    return "pass"


def op_db(names: Optional[Iterable[str]] = None):
    from torch.testing._internal.common_methods_invocations import op_db as db

    wanted = set(names) if names else None
    for op in db:
        name = _entry_name(op)
        if op.name in NOT_COMPARABLE or name in NOT_COMPARABLE:
            continue
        if wanted is not None and name not in wanted and op.name not in wanted:
            continue
        yield op


def run(names=None, dtypes=("float32",), max_samples=4, grads=True, out=sys.stdout, per_entry=True,
        special=False, entries=None, modes=("functional",)) -> List[dict]:
    """`entries`: a set of (name, dtype) pairs to run, None for all;
    `modes`: some of MODES."""
    device = torch_pjrt.device()
    results = []
    for op in op_db(names):
        supported = op.supported_dtypes("cpu")
        for dname in dtypes:
            dtype = DTYPES[dname]
            if dtype not in supported or (entries is not None and (_entry_name(op), dname) not in entries):
                continue
            for mode in modes:
                if not has_mode(op, mode):
                    continue
                torch_pjrt.sync()
                try:
                    v = run_entry(op, dtype, max_samples, grads, device, special=special, mode=mode)
                except Exception:  # a harness problem must not stop the run
                    v = {"op": _entry_name(op) + ("" if mode == "functional" else f"[{mode}]"), "dtype": dname,
                         "samples": 1, "passed": 0, "fallback": 0, "failed": 0, "errored": 1,
                         "detail": traceback.format_exc().strip().splitlines()[-1][:200]}
                v["status"] = status(v)
                results.append(v)
                if per_entry:
                    print(f"{v['status']:<8} {v['op']:<45} {v['dtype']:<9} samples {v['samples']:>2}  "
                          f"pass {v['passed']:>2} fallback {v['fallback']:>2} fail {v['failed']:>2} "
                          f"error {v['errored']:>2}"
                          + (f"  {v['detail']}" if v["detail"] and v["status"] in ("fail", "error") else ""), file=out)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.conformance", description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,int64,bool,bfloat16")
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    p.add_argument("--max-samples", type=int, default=3)
    p.add_argument("--no-grad", action="store_true", help="skip gradient checks")
    p.add_argument("--entries", default="", help="run only the (op dtype) entries this file lists, e.g. the pass list")
    p.add_argument("--special-values", action="store_true",
                   help="each sample again with NaN, +inf, -inf and -0.0 written into its floating-point inputs, "
                        "and with its inputs emptied along their last dimension")
    p.add_argument("--out", action="store_true", help="run the out= forms (entries op[out]) instead of the ops")
    p.add_argument("--inplace", action="store_true",
                   help="run the in-place variants (entries op[inplace]) instead of the ops; with --out, both")
    p.add_argument("--json", default="conformance.json")
    p.add_argument("--expected", default="", help="expected-failure file: fail only on failures it does not list")
    p.add_argument("--fail-on-stale", action="store_true",
                   help="with --expected: also fail when an entry it lists ran and passed (remove it from the file)")
    args = p.parse_args(argv)
    names = [n for n in args.ops.split(",") if n] or None
    if names:
        from torch.testing._internal.common_methods_invocations import op_db as db

        known = {_entry_name(op) for op in db} | {op.name for op in db}
        unknown = [n for n in names if n not in known]
        if unknown:  # they ran nothing and passed ("0 passed, 0 failed")
            def hint(n):
                near = sorted(k for k in known if k.endswith("." + n)) or difflib.get_close_matches(n, known, 3)
                return f"{n} (did you mean {', '.join(near)}?)" if near else n
            p.error("no OpInfo entry named " + "; ".join(hint(n) for n in unknown))
    entries = load_entries(args.entries) if args.entries else None
    t0 = time.time()
    modes = tuple(m for m, on in (("out", args.out), ("inplace", args.inplace)) if on) or ("functional",)
    results = run(names, [d for d in args.dtypes.split(",") if d], args.max_samples, not args.no_grad,
                  special=args.special_values, entries=entries, modes=modes)
    counts: Dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    native_f32 = sum(1 for r in results if r["dtype"] == "float32" and r["status"] == "pass")
    with open(args.json, "w") as f:
        json.dump({"results": results, "counts": counts, "native_float32_entries": native_f32,
                   "seconds": time.time() - t0}, f, indent=1)
    print(f"entries: {counts}; float32 entries passing natively: {native_f32}; {time.time() - t0:.0f} s")
    passed = counts.get("pass", 0) + counts.get("fallback", 0)
    failed = counts.get("fail", 0) + counts.get("error", 0)
    print(f"{passed} passed, {failed} failed")
    if args.expected:
        known = load_expected(args.expected)
        unknown = [r for r in results if r["status"] in ("fail", "error") and not is_expected(known, r["op"], r["dtype"])]
        for r in unknown:
            print(f"UNEXPECTED {r['status']}: {r['op']} {r['dtype']}: {r['detail']}")
        print(f"{len(unknown)} unexpected failure(s) (not in {args.expected})")
        stale = []
        for key in known:
            op, dtype = key.split(" ")
            ran = [r for r in results if r["op"] == op and dtype in (r["dtype"], "*")]
            if ran and all(r["status"] in ("pass", "fallback") for r in ran):
                stale.append(key)
                print(f"STALE: {key} is listed in {args.expected} but passes")
        if args.fail_on_stale and stale:
            print(f"{len(stale)} listed entries now pass: remove them from {args.expected}")
            return 1
        return 0 if not unknown else 1
    return 0 if failed == 0 else 1


def load_entries(path: str) -> set:
    """{(op, dtype)} from a file of `op dtype` lines (the pass list's format)."""
    out = set()
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            op, dtype = line.split()[:2]
            out.add((op, dtype))
    return out


def load_expected(path: str) -> Dict[str, str]:
    """{"op dtype": reason} from an expected-failure file (dtype may be *)."""
    out: Dict[str, str] = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, dtype, reason = line.split(" ", 2)
        out[f"{op} {dtype}"] = reason
    return out


def is_expected(known: Dict[str, str], op: str, dtype: str) -> bool:
    return f"{op} {dtype}" in known or f"{op} *" in known


if __name__ == "__main__":
    sys.exit(main())
