"""What compiled, what was served from the caches, what ran, what fell back
to the CPU, and why graphs recompiled.

Counters (``counters()``):

- ``compiles``: programs compiled by the plugin; ``cache_hits``: programs
  found in the in-memory cache; ``disk_cache_hits`` / ``disk_cache_corrupt``:
  the on-disk cache; ``executions``: programs launched;
- ``compiles_interrupted``: compiles whose wait Ctrl-C interrupted (the
  compile goes on in its thread); ``compiles_resumed``: syncs of the same
  program that then took such a compile over rather than starting anew;
- ``recompiles``: compiles of a graph whose structure was seen before with
  other shapes, dtypes or constants (see ``recompiles()`` for why; every
  compile, a new structure included, is counted where its sync ran in
  ``compile_sites()``);
- ``cpu_fallbacks`` and ``aten::<op>``: ops that ran on the CPU (where
  each was called from: ``fallback_sites()``);
- ``bytes_to_device`` / ``bytes_to_host``: transfers;
- ``traced_ops``: op lowerings run; ``ir_nodes_built``: IR nodes of the
  synced traces that were built rather than taken over from an earlier
  trace of the same ops (none in a steady training step; see
  ``docs/performance.md``);
- ``relayouts``: op results laid out anew to keep an input's memory format
  (channels_last in, channels_last out, as on the CPU; ``aten/layout.h``);
- ``replays``: calls of torch.compile graphs run from their recording,
  ``replays_joined`` of them by joining the device's lazy trace rather than
  launching their own program; ``replay_recordings``, ``replay_refused``
  (see ``torch_pjrt.dynamo`` and ``docs/dynamo.md``);
- ``program_peak_bytes`` / ``program_temp_bytes``: the most device memory,
  and the most temporary memory, that one compiled program plans for a run
  (the plugin's compiled memory statistics: its peak figure where it reports
  one, else arguments + outputs not aliasing an argument + temporaries);
  absent where the plugin does not offer the statistics.

``dynamo_recompiles()`` lists the recompilations of functions under
``torch.compile`` (Dynamo's guard failures: a Python value that changed,
an input of a new shape or dtype); each costs new graphs and programs
here.

Timers (``timers()``, seconds): ``compile``, ``execute_launch``,
``execute_wait``, ``graph_build``, ``sync``, ``trace``.

Every counter and timer named here is present from the start (0 until
counted), except the memory statistics.
"""

from __future__ import annotations

import sys
import weakref
from typing import Dict, List, Tuple

from torch_pjrt import _C

# torch.compile's recompilations seen by the pjrt backend since reset(), and
# how many of Dynamo's guard failures per code object are accounted for (with
# Dynamo's list of them: torch._dynamo.reset() starts new lists).
_dynamo_recompiles: List[dict] = []
_dynamo_seen: "weakref.WeakKeyDictionary[object, Tuple[list, int]]" = weakref.WeakKeyDictionary()


# Present in counters() and timers() from the start, 0 until counted (the
# memory statistics are absent where the plugin offers none).
_COUNTERS = ("compiles", "compiles_interrupted", "compiles_resumed", "recompiles", "cache_hits", "disk_cache_hits",
             "disk_cache_corrupt", "executions", "cpu_fallbacks", "bytes_to_device", "bytes_to_host", "traced_ops",
             "ir_nodes_built", "relayouts", "replays", "replays_joined", "replay_recordings", "replay_refused")
_TIMERS = ("compile", "execute_launch", "execute_wait", "graph_build", "sync", "trace")


def counters() -> Dict[str, int]:
    out = dict.fromkeys(_COUNTERS, 0)
    out.update(_C._metrics_counters())
    for op, n in _C._metrics_fallbacks().items():
        out[op] = n
    return out


def timers() -> Dict[str, float]:
    out = dict.fromkeys(_TIMERS, 0.0)
    out.update(_C._metrics_timers())
    return out


def fallbacks() -> Dict[str, int]:
    """Op name (``aten::<name>``) -> times it ran on the CPU."""
    return dict(_C._metrics_fallbacks())


def fallback_sites() -> Dict[str, Dict[str, int]]:
    """Op name -> {Python file:line that called it -> times it ran on the
    CPU there}. The location is the innermost frame outside torch and
    torch_pjrt (so a library model's own line, e.g. in transformers); up to
    16 locations are kept per op, "" when none was known."""
    return {op: dict(sites) for op, sites in _C._metrics_fallback_sites().items()}


def compile_sites() -> Dict[str, int]:
    """``{where: n}``: how many programs were compiled (not served by a
    cache) for syncs at each Python location (file:line; "" when unknown).
    A site that keeps compiling in a training loop names the line whose
    graphs change from step to step: with other shapes or constants (then
    ``recompiles()`` says what changed) or with other ops (a Python branch,
    a loop over lengths read on the host, packed sequences' batch sizes),
    which ``recompiles()`` does not list. Up to 64 sites are kept;
    ``report()`` lists those with three or more."""
    return dict(_C._metrics_compile_sites())


def recompiles() -> List[dict]:
    """Each recompilation: ``why`` (which input or constant changed from what
    to what) and ``where`` (Python file:line of the sync)."""
    return list(_C._metrics_recompiles())


def _dynamo_guard_failures() -> Dict[object, list]:
    # Read only where Dynamo is loaded: importing it takes a second.
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    failures = getattr(dynamo_utils, "guard_failures", None)
    return dict(failures) if failures else {}


def _note_dynamo_compile() -> None:
    """Called by the pjrt backend for each graph Dynamo hands it: the guard
    failures Dynamo recorded since the last call are one recompilation (one
    reason per cached entry of the function, newest first)."""
    for code, reasons in _dynamo_guard_failures().items():
        listed, seen = _dynamo_seen.get(code, (reasons, 0))
        if listed is not reasons:  # torch._dynamo.reset() cleared them
            seen = 0
        if len(reasons) > seen:
            function = f"{getattr(code, 'co_name', code)} ({getattr(code, 'co_filename', '?')}:" \
                       f"{getattr(code, 'co_firstlineno', '?')})"
            _dynamo_recompiles.append({"function": function, "why": " ".join(str(reasons[seen]).split("\n", 1)[0].split())})
        try:
            _dynamo_seen[code] = (reasons, len(reasons))
        except TypeError:  # not weakly referenceable: not remembered
            pass


def dynamo_recompiles() -> List[dict]:
    """Each recompilation by ``torch.compile(backend="pjrt")`` (Dynamo) since
    the last ``reset()``: ``function`` (name, file:line) and ``why`` (the
    guard that failed, e.g. ``G['model'].config.problem_type is None`` for
    a model that sets an attribute on its first call, or a tensor's new
    size)."""
    return list(_dynamo_recompiles)


def reset() -> None:
    _C._metrics_reset()
    _dynamo_recompiles.clear()


def report() -> str:
    c = counters()
    t = timers()
    lines = ["torch_pjrt metrics"]
    for key in _COUNTERS:
        if key not in ("relayouts", "replay_recordings", "replay_refused"):
            lines.append(f"  {key:<20} {c[key]}")
    ops = c["traced_ops"]
    for key in _TIMERS:
        lines.append(f"  {key + '_time':<20} {t[key]:.4f} s")
    if ops:
        lines.append(f"  {'trace_per_op':<20} {t.get('trace', 0.0) / ops * 1e6:.2f} us")
    fb = fallbacks()
    if fb:
        sites = fallback_sites()
        lines.append("  CPU fallbacks (op, count, where):")
        for op, n in sorted(fb.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {op:<40} {n}")
            for where, k in sorted(sites.get(op, {}).items(), key=lambda kv: -kv[1])[:5]:
                lines.append(f"      {k:>6}  {where or '(location unknown)'}")
    # a training loop's first two steps compile two programs (the first
    # creates the optimizer's state): three or more at one line is news
    sites = {w: n for w, n in compile_sites().items() if n > 2}
    if sites:
        lines.append("  programs compiled three or more times at one location (count, where):")
        for where, n in sorted(sites.items(), key=lambda kv: -kv[1])[:10]:
            lines.append(f"    {n:>6}  {where or '(location unknown)'}")
    rc = recompiles()
    if rc:
        lines.append("  recompilations:")
        for r in rc[-20:]:
            where = f" at {r['where']}" if r["where"] else ""
            lines.append(f"    {r['why']}{where}")
    dyn = dynamo_recompiles()
    if dyn:
        lines.append("  torch.compile (Dynamo) recompilations:")
        for r in dyn[-20:]:
            lines.append(f"    {r['function']}: {r['why']}")
    return "\n".join(lines)
