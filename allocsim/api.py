"""Call what the commands do from Python: ``allocsim.run(trace, "pytorch", capacity="20GiB")``.

The public API, for notebooks and scripts (``import allocsim``), each the counterpart of a command:

- ``read_trace(path)`` -> ``Trace`` (``allocsim info`` reads it the same way);
- ``run(trace, policy, ...)`` -> ``RunResult``, what ``allocsim run --json`` prints (``result.summary``:
  peaks, ``verdict``, ``recorded``, ``reproduction``, with ``sites=N`` the code sites);
- ``advise(path, ...)`` -> ``Advice``; ``format_advice(advice)`` is the text ``allocsim advise`` prints;
- ``recorded_run(trace)`` -> ``RecordedRun``: what the recording proves about the real run;
- ``parse_alloc_conf(text)``: a ``PYTORCH_CUDA_ALLOC_CONF`` value as ``--alloc-conf`` reads it;
- ``site_timeline(trace, top)``, ``format_sites(sites)``, ``short_site(name)``: code sites;
- ``attribute_run(trace, policy, ...)`` -> ``(RunResult, observer, table)``: reserved memory split exactly
  into ``ATTRIBUTION_PARTS`` (``ATTRIBUTION_LABELS`` name them) over time and at the peak;
- ``sweep(traces, policies, grid, ...)`` -> the rows ``allocsim sweep`` writes (a DataFrame);
  ``winners(rows, ...)`` -> the Pareto front and the winner ``allocsim winners`` picks;
- ``scale(inputs, name)`` -> a ``Scaler`` (``allocsim scale``: ``.at(value)`` is the trace there, with its
  report); ``find_max(scaler, capacity)`` (``--find-max``); ``write_trace(trace, path)`` saves any trace;
- ``fit(command, gpus)`` -> ``FitResult`` (``allocsim fit``: a script captured at two values of its
  ``{B}``, scaled, and the largest value that fits each GPU searched; ``.answers``, ``.format_text()``);
- ``format_bytes``, ``parse_bytes``, ``MiB``, ``GiB``; plots in ``allocsim.plots``.

Everything else (``allocsim.commands``, ``allocsim.runner``, ...) may change without notice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from .settings.alloc_conf import parse_alloc_conf
from .metrics.attribution import CATEGORIES as ATTRIBUTION_PARTS
from .metrics.attribution import LABELS as ATTRIBUTION_LABELS
from .metrics.sites.report import format_sites, short_site
from .metrics.sites.timeline import site_timeline
from .result import RunResult
from .trace import Trace, read_trace, write_trace
from .trace.inference.recorded import RecordedRun
from .units import GiB, MiB, format_bytes, parse_bytes


def _prepare(trace: Trace | str | os.PathLike, policy: str, params: Mapping[str, Any] | None, alloc_conf: str | None,
             capacity: int | str | None, device: int | None):
    """(one-device trace, policy name, merged parameters, resolved ``Capacity``) exactly as ``run`` takes them."""
    from .commands.common import select_device
    from .commands.run import resolve_policy
    from .runner import check_capacity, resolve_capacity

    name, merged = resolve_policy(policy, [], alloc_conf)
    merged.update(params or {})
    trace = select_device(trace if isinstance(trace, Trace) else read_trace(os.fspath(trace)), device)
    given = parse_bytes(capacity, round_down=True) if capacity is not None else None
    resolved = resolve_capacity(trace, given)
    check_capacity(trace, resolved)
    return trace, name, merged, resolved


def run(trace: Trace | str | os.PathLike, policy: str = "pytorch", params: Mapping[str, Any] | None = None, *,
        alloc_conf: str | None = None, capacity: int | str | None = None, device: int | None = None,
        fast: bool = True, sites: int = 0, site_filter: list[str] | None = None,
        continue_on_oom: bool = False) -> RunResult:
    """Replay ``trace`` (a ``Trace`` or a path) as ``allocsim run`` does and return the ``RunResult``.

    ``policy`` takes specs (``pytorch:expandable_segments:True``); ``params`` are ``--set`` values,
    ``alloc_conf`` a ``PYTORCH_CUDA_ALLOC_CONF`` value; ``capacity`` bytes or a size (``"20GiB"``),
    else the one the recording implies (``summary["verdict"]`` says which); ``device`` picks one of
    several; ``sites=N`` adds the N top code sites (``summary["sites"]``). ``fast`` (the default
    here) leaves out timing. A trace ``scale`` predicted with an open range gets both ends replayed
    (``summary["prediction_range"]``: ``fits``, ``line``). Bad input raises ``ValueError`` with the
    command's one-line message.
    """
    from .commands.run import add_sites
    from .metrics.sites.rule import SiteFilter
    from .runner import simulate_trace
    from .scale.ranges import judge_ends

    trace, name, merged, resolved = _prepare(trace, policy, params, alloc_conf, capacity, device)
    result = simulate_trace(trace, name, merged, capacity=resolved, fast=fast, continue_on_oom=continue_on_oom)
    # A trace predicted by `allocsim scale` carries a range: both ends replayed, as `run` does.
    ends = judge_ends(lambda end: simulate_trace(end, name, merged, capacity=resolved, fast=fast,
                                                 continue_on_oom=continue_on_oom).summary, trace)
    if ends is not None:
        result.summary["prediction_range"] = ends
    if sites > 0:
        add_sites(result, trace, name, merged, resolved.bytes, None, SiteFilter.parse(site_filter), sites,
                  continue_on_oom)
    return result


def advise(trace_path: str, *, policy: str = "pytorch", capacity: int | str | None = None,
           device: int | None = None, fast: bool = True, top: int = 3, output: str | None = None) -> Any:
    """Search the allocator's settings on a trace file as ``allocsim advise`` does; return the ``Advice``.

    ``advice.recommendations`` (best first: ``line`` to paste, ``alloc_conf``, ``command``,
    ``min_capacity_bytes``, ``outcome.peak_reserved_bytes``), ``advice.fits_any``,
    ``advice.error_groups()``; ``output`` is where the runs are journaled (default: a cache folder).
    """
    from .advise.advice import advise as _advise

    return _advise(trace_path, policy=policy, capacity_bytes=parse_bytes(capacity, round_down=True) if capacity is not None else None,
                   device=device, fast=fast, top=top, output=output)


def format_advice(advice: Any) -> str:
    """The text ``allocsim advise`` prints for ``advice``."""
    from .advise.report import format_advice as _format

    return _format(advice)


def recorded_run(trace: Trace, device: int | None = None) -> RecordedRun | None:
    """What the recording proves about the real run on ``device`` (the only one when None), or None."""
    from .trace.inference.recorded import recorded_run as _recorded

    if device is None:
        devices = trace.devices
        if len(devices) != 1:
            raise ValueError(f"{trace.meta.source} has devices {devices}; pass device=N")
        device = devices[0]
    return _recorded(trace, device)


def attribute_run(trace: Trace | str | os.PathLike, policy: str = "pytorch", params: Mapping[str, Any] | None = None,
                  *, alloc_conf: str | None = None, capacity: int | str | None = None, device: int | None = None,
                  every: int | None = 1000, resolution: float | None = 0.01, segments_at_peak: bool = True,
                  fast: bool = True) -> tuple[RunResult, Any, pd.DataFrame]:
    """Replay ``trace`` as ``run`` does and split reserved memory into its causes; return ``(result, observer, table)``.

    The parts (``ATTRIBUTION_PARTS``) add up to reserved memory to the byte: ``observer.peak`` at the
    reserved peak, each row of ``table`` every ``every`` events, whenever reserved moves by
    ``resolution`` of its peak and at each new peak (``None`` turns either off);
    ``observer.peak_segments`` is the segment map at the peak (``segments_at_peak``). Policy,
    parameters, capacity and device as in ``run``; ``fast=False`` times the replay (the default cost
    model), which on a trace of several streams may order memory differently from ``run``'s figures.
    """
    from .runner import attribute_run as _attribute

    trace, name, merged, resolved = _prepare(trace, policy, params, alloc_conf, capacity, device)
    return _attribute(trace, name, every=every, resolution=resolution, fast=fast, segments_at_peak=segments_at_peak,
                      params=merged, capacity_bytes=resolved.bytes)


def sweep(traces: Sequence[str | os.PathLike] | str | os.PathLike, policies: Sequence[str] = ("pytorch",),
          grid: Iterable[str] = (), sets: Iterable[str] = (), *, capacity: int | str | None = None,
          device: int | None = None, fast: bool = False, output: str | os.PathLike | None = None) -> pd.DataFrame:
    """Run every setting of a grid on trace files as ``allocsim sweep`` does; return its rows, one per run.

    ``grid`` and ``sets`` are ``--grid KEY=V1,V2`` and ``--set KEY=VALUE`` texts; without ``capacity``
    each trace runs at the capacity its recording implies, as the command does. The rows are the
    results file's (``peak_reserved_bytes``, ``alloc_latency_ns.p99``, ``param.<key>``, ``error``, ...);
    ``output`` keeps that file (default: a temporary folder, removed). A bad grid raises ``ValueError``
    before anything runs; a failed run is a row whose ``error`` says why.
    """
    import tempfile

    from .sweep import build_configs, run_sweep

    paths = [os.fspath(traces)] if isinstance(traces, (str, os.PathLike)) else [os.fspath(t) for t in traces]
    configs = build_configs(list(policies), list(grid), list(sets))
    given = parse_bytes(capacity, round_down=True) if capacity is not None else None
    with tempfile.TemporaryDirectory(prefix="allocsim-sweep-") as tmp:
        out = Path(output) if output is not None else Path(tmp) / "results.parquet"
        run_sweep(paths, configs, output=out, capacity_bytes=given, device=device, fast=fast,
                  infer_capacity=given is None, log=lambda message: None)
        return pd.read_parquet(out)


def winners(rows: pd.DataFrame, minimise: Sequence[str] = ("peak_reserved_bytes", "alloc_latency_ns.p99"), *,
            capacity: int | str | None = None) -> Any:
    """Pick from sweep rows as ``allocsim winners`` does: ``.pareto`` (the front), ``.winner`` (a row or None).

    The winner is the best row by ``minimise`` in order (first the lowest peak, then the lowest p99 by
    default) among those that ran with no OOM and, given ``capacity``, fit it; ``.fits`` lists them all.
    """
    from .sweep.pareto import select

    return select(rows, list(minimise), parse_bytes(capacity, round_down=True) if capacity is not None else None)


def scale(inputs: Mapping[Any, str | os.PathLike] | Sequence[tuple[str | os.PathLike, Any]], name: str = "batch", *,
          device: int | None = None, allow_mixed: bool = False) -> Any:
    """Align traces of one program recorded at several values of one scale parameter, as ``allocsim scale`` does.

    ``inputs`` maps each value to its trace file (``{1: "b1.json.gz", 2: "b2.json.gz"}``) or lists
    ``(path, value)`` pairs. Returns a ``Scaler``: ``.at(value)`` is the ``ScaleResult`` there
    (``.trace`` to replay, ``.report`` with ``prediction_range``, ``checks``, ``limits``);
    ``.inputs`` are the inputs read. Inputs that are not one configuration (another precision,
    other settings) raise ``ValueError`` with the command's one line, unless ``allow_mixed``.
    """
    from fractions import Fraction

    from .errors import AllocsimError
    from .scale import load_input, parse_value
    from .scale.build import Scaler

    pairs = [(path, value) for value, path in inputs.items()] if isinstance(inputs, Mapping) else list(inputs)
    try:
        loaded = [load_input(os.fspath(path), parse_value(value) if isinstance(value, str) else Fraction(value),
                             device=device) for path, value in pairs]
        return Scaler(loaded, name, allow_mixed=allow_mixed)
    except AllocsimError as exc:
        raise ValueError(str(exc)) from None


def find_max(scaler: Any, capacity: int | str, *, policy: str = "pytorch", advise: bool = True) -> Any:
    """The largest scale value that fits ``capacity``, as ``allocsim scale --find-max`` searches it.

    Returns a ``FindMax``: ``.bound`` (the largest whose peak live bytes fit), ``.recorded`` (with
    the recorded settings), ``.advised`` (with some setting, by ``advise``; ``advise=False`` skips
    it), each with ``.value``; ``.format_text()`` is the command's report.
    """
    from .scale.findmax import find_max as _find_max

    return _find_max(scaler, parse_bytes(capacity, round_down=True), policy=policy, advise=advise)


def fit(command: Sequence[str], gpus: Sequence[str] | None = None, **options: Any) -> Any:
    """The largest value of ``command``'s one ``{NAME}`` that fits each GPU, as ``allocsim fit`` finds it.

    ``command`` is the script's command line (``["python", "train.py", "--batch", "{B}"]``); ``gpus``
    names GPUs (``allocsim gpus``; default RTX 4090, A100 80GB, H100). ``options``: ``values=(2, 4)``,
    ``steps=2``, ``out_dir=`` (keep the captures), ``scale_name=``, ``multiple=``, ``max_value=``,
    ``advise=True``, ``workers=``, ``timeout_s=``, ``per_gpu=False``. Returns a ``FitResult``
    (``.answers``: per GPU ``.value``, ``.setting``, ``.estimate``, ``.range_low`` / ``.range_high``;
    ``.to_dict()``, ``.format_text()``). Bad input raises ``ValueError``; a capture that did not
    finish raises ``allocsim.fit.ScriptFailed`` (``.status``: its exit status).
    """
    from .errors import AllocsimError
    from .fit import ScriptFailed, fit as _fit

    try:
        return _fit(command, gpus, **options)
    except ScriptFailed:
        raise
    except AllocsimError as exc:
        raise ValueError(str(exc)) from None


__all__ = ["ATTRIBUTION_LABELS", "ATTRIBUTION_PARTS", "GiB", "MiB", "RecordedRun", "RunResult", "Trace", "advise",
           "attribute_run", "find_max", "fit", "format_advice", "format_bytes", "format_sites", "parse_alloc_conf",
           "parse_bytes", "read_trace", "recorded_run", "run", "scale", "short_site", "site_timeline", "sweep",
           "winners", "write_trace"]
