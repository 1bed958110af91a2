"""``advise(trace_path, ...)``: the whole answer to "which setting makes this fit?", as an ``Advice``.

1. The capacity: the given one, else the one the recording implies (``runner.resolve_capacity``),
   else ``ValueError`` asking for ``--capacity``.
2. When the program's peak live bytes alone exceed it, no setting can fit: the answer says so and
   shows what is live at that peak (``metrics.sites``); nothing is searched.
3. Otherwise ``search.grid_search`` runs the grid; ``rank.recommend`` orders the settings that fit;
   the best ``top`` get their smallest capacity (``search.smallest_capacities``), the line to paste
   and the ``allocsim run`` command that replays them, and the best one a "why"
   (``why.waste_removed``). When none fits, ``search.closest_misses`` says how far the nearest are.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import picked_device_note, select_device
from ..errors import AllocsimError
from ..metrics.sites.rule import SiteFilter
from ..metrics.sites.rows import DEFAULT_TOP, LiveAtPeak, SiteRows, live_at_peak, site_rows
from ..metrics.state import HOW_TO_RECORD, is_state_only
from ..metrics.summary import lower_bound_bytes
from ..metrics.verdict import is_lower_bound, proven_range_text
from ..runner import resolve_capacity
from ..units import format_bytes
from ..sweep.failures import ErrorGroup, error_groups
from ..sweep.tasks import file_sha256
from ..sweep.worker import cached_trace, clear_cache
from .capacity import STEP_BYTES, Bisection
from .knobs import PRESETS, Preset, preset_for
from .rank import Outcome, fits, recommend
from .runs import Runs
from .search import GridResult, Miss, closest_misses, grid_search, smallest_capacities
from .why import waste_removed

#: How the smallest capacity is found, in one sentence for people.
MIN_CAPACITY_RULE = ("smallest capacity: bisection over capacities in steps of {step}, between one where the setting "
                     "fails (at first the peak live bytes) and one where it fits, each probe a full replay (a "
                     "smaller device makes the allocator release its cache on the out-of-memory path, so it is not "
                     "simply the peak), assuming a setting that fits at one capacity fits at every larger one")


@dataclass
class Recommendation:
    """A setting that fits, said in the user's words, and where it stops fitting."""

    outcome: Outcome
    line: str                                #: what to paste (``PYTORCH_CUDA_ALLOC_CONF=...``)
    alloc_conf: str | None                   #: PyTorch's setting string (None for other allocators)
    command: str                             #: the ``allocsim run`` command that replays it
    min_capacity_bytes: int | None = None
    search: Bisection | None = None


@dataclass
class Advice:
    """Everything ``allocsim advise`` reports (``report.advice_to_dict`` / ``report.format_advice``)."""

    trace: str
    source: str
    device: int | None
    policy: str
    capacity_bytes: int
    capacity_source: str
    capacity_note: str
    lower_bound_bytes: int
    step_bytes: int
    fast: bool
    grid: GridResult | None = None
    preset: Preset | None = None
    #: Peak live bytes without the requests of recorded OOMs (what the real run held; below the lower bound
    #: only where such a request is in it).
    granted_bytes: int | None = None
    recommendations: list[Recommendation] = field(default_factory=list)
    why: dict[str, Any] | None = None
    misses: list[Miss] = field(default_factory=list)
    peak: LiveAtPeak | None = None
    sites: SiteRows | None = None
    site_filter: SiteFilter | None = None
    runs: Runs | None = None
    wall_seconds: float = 0.0
    #: for an inferred capacity: (least, most) the recording proves the device had (most None: no bound)
    capacity_range: tuple[int, int | None] | None = None
    #: No --device given and the trace's only GPU picked beside host memory (``engine.picked_device_note``).
    device_note: str | None = None
    #: Why the trace stops before its script's end ("" when complete: ``TraceMeta.incomplete``).
    incomplete: str = ""

    @property
    def assumption(self) -> str | None:
        """What advise assumed about the device when the recording proves only a lower bound (else None)."""
        if not is_lower_bound(self.capacity_source, self.capacity_range):
            return None
        return (f"assumed: the device had exactly {format_bytes(self.capacity_bytes)}, the least of the "
                f"{proven_range_text(self.capacity_range)} the recording proves; give --capacity SIZE for the "
                "real one")

    @property
    def fits_any(self) -> bool:
        return bool(self.recommendations)

    def error_groups(self) -> list[ErrorGroup]:
        """Each distinct error of the runs that failed, with the runs it hit (empty: none failed)."""
        return error_groups(self.runs.rows.values()) if self.runs is not None else []

    @property
    def lower_bound_fits(self) -> bool:
        return self.lower_bound_bytes <= self.capacity_bytes


def exact_size(size_bytes: int) -> str:
    """``20GiB``, ``512MiB`` when exact, else the plain byte count (what ``--capacity`` reads back exactly)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if size_bytes and size_bytes % (1 << shift) == 0:
            return f"{size_bytes >> shift}{unit}"
    return str(size_bytes)


def default_output(trace_sha256: str, policy: str, device: int | None, capacity_bytes: int, fast: bool) -> str:
    """Where runs are journaled without ``-o``: a cache folder per trace content and question, so the same
    advise resumes or reuses its runs and each journal stays the size of one search."""
    base = os.environ.get("ALLOCSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "allocsim")
    question = f"{policy}-device{'all' if device is None else device}-{capacity_bytes}-{'fast' if fast else 'timed'}"
    return os.path.join(base, "advise", trace_sha256[:24], question, "runs.parquet")


def run_command(trace: str, preset: Preset, outcome: Outcome, capacity_bytes: int, device: int | None,
                extra: tuple[str, ...] = ()) -> str:
    """The ``allocsim run`` command line that replays ``outcome`` at ``capacity_bytes`` (``extra``: the cost model)."""
    args = ["allocsim", "run", trace, *preset.run_args(outcome.params)]
    if device is not None:
        args += ["--device", str(device)]
    args += [*extra, "--capacity", exact_size(capacity_bytes)]
    return " ".join(shlex.quote(a) for a in args)


def _read(trace_path: str, lenient: bool = False, limits: Any = None) -> tuple[str, Any]:
    if not os.path.exists(trace_path):
        raise AllocsimError(f"{trace_path}: no such file")
    if os.path.isdir(trace_path):
        raise AllocsimError(f"{trace_path}: is a directory, not a trace file")
    sha = file_sha256(trace_path)
    return sha, cached_trace(os.path.abspath(trace_path), sha, lenient, limits)


def advise(trace_path: str, *, policy: str = "pytorch", capacity_bytes: int | None = None, device: int | None = None,
           executor: Any = None, output: str | None = None, cost_model: Any = None, fast: bool = False, top: int = 3,
           progress: bool = False, log: Callable[[str], None] = lambda message: None,
           command_args: tuple[str, ...] = (), lenient: bool = False, limits: Any = None,
           site_filter: SiteFilter | None = None, top_sites: int = DEFAULT_TOP, gpu: Any = None) -> Advice:
    """The ``Advice`` for ``trace_path`` (see the module doc); ``ValueError`` / ``AllocsimError`` on bad input.

    ``gpu`` (a ``gpus.GpuModel``, instead of ``capacity_bytes``): the memory that card leaves the
    allocator, as ``run --gpu`` resolves it for this trace (cuBLAS workspaces not taken off twice
    when the trace holds them), with the unknown terms (``gpu_ranges``) at the high end of their
    ranges, so a setting that fits fits whatever they are within them.

    ``command_args`` go into every printed ``allocsim run`` command (the ``--cost-model`` options that
    built ``cost_model``, so the command replays on the same device; the read options). ``lenient``
    and ``limits`` say how the trace is read (``read_trace``), here and in every run. ``site_filter``
    and ``top_sites`` shape the code sites shown when nothing can fit.
    """
    from ..sweep.executors import InProcessExecutor

    started = time.perf_counter()
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    if policy not in PRESETS:
        preset_for(policy, None, 0)   # raises the one-line refusal before the trace is read
    sha, trace = _read(trace_path, lenient, limits)
    device_note = picked_device_note(trace.devices) if device is None else None
    trace = select_device(trace, device)
    if gpu is not None:
        from ..gpu_ranges import is_capture, runs_cudnn
        from ..gpus import allocator_capacity
        from ..trace.inference.workspaces import cublas_workspaces_in_trace

        # A setting "fits" only with every unknown term at the high end of its range (gpu_ranges).
        capacity_bytes = allocator_capacity(gpu, cublas_workspaces_in_trace(trace.meta), end="high",
                                            cudnn=runs_cudnn(trace), capture=is_capture(trace))
    if is_state_only(trace):
        raise ValueError(f"{trace.meta.source} holds a final state and no history to replay: advise needs a "
                         f"recorded history ({HOW_TO_RECORD}); `allocsim info` reports the recorded state")
    capacity = resolve_capacity(trace, capacity_bytes)
    if capacity.bytes is None:
        raise ValueError(f"{trace.meta.source}: the recording implies no device capacity; give --capacity SIZE")
    preset = preset_for(policy, trace.meta.allocator_settings, capacity.bytes)
    step = _step(cost_model)
    advice = Advice(trace=trace_path, source=trace.meta.source, device=device, policy=policy,
                    capacity_bytes=capacity.bytes, capacity_source=capacity.source, capacity_note=capacity.note,
                    capacity_range=capacity.range,
                    lower_bound_bytes=lower_bound_bytes(trace), step_bytes=step, fast=fast, preset=preset,
                    granted_bytes=lower_bound_bytes(trace, granted_only=True), device_note=device_note,
                    incomplete=trace.meta.incomplete)
    if not advice.lower_bound_fits:
        advice.peak = live_at_peak(trace)
        advice.site_filter = site_filter or SiteFilter()
        if top_sites > 0:
            advice.sites = site_rows(trace, advice.peak.alloc_ids, advice.peak.size_bytes, top=top_sites,
                                     site_filter=advice.site_filter)
        advice.wall_seconds = time.perf_counter() - started
        return advice
    executor = executor or InProcessExecutor()
    runs = Runs(trace=trace_path, trace_sha256=sha, policy=policy, device=device, executor=executor,
                output=output or default_output(sha, policy, device, capacity.bytes, fast), cost_model=cost_model,
                lenient=lenient, limits=limits, progress=progress)
    advice.runs = runs
    workers = int(getattr(executor, "workers", 1) or 1)
    with executor:
        log("running the recorded settings and each knob alone, then every combination of the knobs that matter")
        advice.grid = grid = grid_search(preset, runs, capacity.bytes, fast=fast)
        best = recommend(grid.outcomes, capacity.bytes)[:top]
        if best:
            log(f"{len(best)} settings fit; searching the smallest capacity of each")
            found = smallest_capacities(best, runs, lower_bound_bytes=advice.lower_bound_bytes,
                                        capacity_bytes=capacity.bytes, workers=workers, step_bytes=step)
            for outcome in best:
                search = found[id(outcome)]
                advice.recommendations.append(Recommendation(
                    outcome, preset.paste_line(outcome.params), preset.alloc_conf(outcome.params),
                    run_command(trace_path, preset, outcome, capacity.bytes, device, tuple(command_args)),
                    search.fit_bytes, search))
        else:
            log("nothing fits; searching how much more the nearest settings need")
            advice.misses = closest_misses(grid.outcomes, runs, capacity_bytes=capacity.bytes, workers=workers,
                                           step_bytes=step)
    runs.write()
    if advice.recommendations and not advice.recommendations[0].outcome.recorded:
        advice.why = waste_removed(trace, policy, advice.grid.baseline.row, advice.recommendations[0].outcome.params,
                                   capacity.bytes, cost_model)
    if not isinstance(executor, InProcessExecutor):
        clear_cache()   # the runs happened elsewhere: this process need not keep the trace for later calls
    advice.wall_seconds = time.perf_counter() - started
    return advice


def _step(cost_model: Any) -> int:
    """The capacity step: the calibrated device granularity when a cost model has one, else 2 MiB."""
    provenance = cost_model.provenance if cost_model is not None else {}
    value = provenance.get("_granularity_bytes")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else STEP_BYTES


__all__ = ["Advice", "MIN_CAPACITY_RULE", "Recommendation", "advise", "default_output", "exact_size", "fits",
           "run_command"]
