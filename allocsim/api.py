"""Call what the commands do from Python: ``allocsim.run(trace, "pytorch", capacity="20GiB")``.

The public API, for notebooks and scripts (``import allocsim``), each the counterpart of a command:

- ``read_trace(path)`` -> ``Trace`` (``allocsim info`` reads it the same way);
- ``run(trace, policy, ...)`` -> ``RunResult``, what ``allocsim run --json`` prints (``result.summary``:
  peaks, ``verdict``, ``recorded``, ``reproduction``, with ``sites=N`` the code sites);
- ``advise(path, ...)`` -> ``Advice``; ``format_advice(advice)`` is the text ``allocsim advise`` prints;
- ``recorded_run(trace)`` -> ``RecordedRun``: what the recording proves about the real run;
- ``parse_alloc_conf(text)``: a ``PYTORCH_CUDA_ALLOC_CONF`` value as ``--alloc-conf`` reads it;
- ``site_timeline(trace, top)``, ``format_sites(sites)``, ``short_site(name)``: code sites;
- ``format_bytes``, ``parse_bytes``, ``MiB``, ``GiB``; plots in ``allocsim.plots``.

Everything else (``allocsim.commands``, ``allocsim.runner``, ...) may change without notice.
"""

from __future__ import annotations

from typing import Any, Mapping

from .settings.alloc_conf import parse_alloc_conf
from .metrics.sites.report import format_sites, short_site
from .metrics.sites.timeline import site_timeline
from .result import RunResult
from .trace import Trace, read_trace
from .trace.inference.recorded import RecordedRun
from .units import GiB, MiB, format_bytes, parse_bytes


def run(trace: Trace | str, policy: str = "pytorch", params: Mapping[str, Any] | None = None, *,
        alloc_conf: str | None = None, capacity: int | str | None = None, device: int | None = None,
        fast: bool = True, sites: int = 0, site_filter: list[str] | None = None,
        continue_on_oom: bool = False) -> RunResult:
    """Replay ``trace`` (a ``Trace`` or a path) as ``allocsim run`` does and return the ``RunResult``.

    ``policy`` takes specs (``pytorch:expandable_segments:True``); ``params`` are ``--set`` values,
    ``alloc_conf`` a ``PYTORCH_CUDA_ALLOC_CONF`` value; ``capacity`` bytes or a size (``"20GiB"``),
    else the one the recording implies (``summary["verdict"]`` says which); ``device`` picks one of
    several; ``sites=N`` adds the N top code sites (``summary["sites"]``). ``fast`` (the default
    here) leaves out timing. Bad input raises ``ValueError`` with the command's one-line message.
    """
    from .commands.common import select_device
    from .commands.run import add_sites, resolve_policy
    from .metrics.sites.rule import SiteFilter
    from .runner import check_capacity, resolve_capacity, simulate_trace

    name, merged = resolve_policy(policy, [], alloc_conf)
    merged.update(params or {})
    trace = select_device(read_trace(trace) if isinstance(trace, str) else trace, device)
    given = parse_bytes(capacity) if capacity is not None else None
    resolved = resolve_capacity(trace, given)
    check_capacity(trace, resolved)
    result = simulate_trace(trace, name, merged, capacity=resolved, fast=fast, continue_on_oom=continue_on_oom)
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

    return _advise(trace_path, policy=policy, capacity_bytes=parse_bytes(capacity) if capacity is not None else None,
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


__all__ = ["GiB", "MiB", "RecordedRun", "RunResult", "Trace", "advise", "format_advice", "format_bytes",
           "format_sites", "parse_alloc_conf", "parse_bytes", "read_trace", "recorded_run", "run", "short_site",
           "site_timeline"]
