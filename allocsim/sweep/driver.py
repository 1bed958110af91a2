"""Run a sweep end to end: ``run_sweep(traces, configs, output=...) -> SweepReport``.

1. Hash every trace file (the row key uses the content, not the path) and build the tasks.
2. Load the journal beside ``output`` and skip every task whose row is already there (resume).
3. Run the rest on the executor; journal each row the moment it arrives (a kill loses no finished row).
4. Write ``output`` from the journaled rows of *this* sweep, in (trace, policy, grid) order, even
   when interrupted (marked incomplete in the file's metadata); compact the journal when complete.

``execute_tasks(tasks, output=...)`` does steps 2-4 for tasks built elsewhere (``allocsim advise``
runs its stages this way, each task with its own capacity). Without a given capacity, a sweep
with ``infer_capacity=True`` (the command line) replays each trace at the capacity its recording
implies, if any (``runner.resolve_capacity``), and says so in ``SweepReport.capacities``.

Test hooks: ``stop_after_rows=k`` raises ``SweepStopped`` after k new rows are journaled; the
environment variable ``ALLOCSIM_SWEEP_KILL_AFTER_ROWS=k`` SIGKILLs this process at the same point
(a real crash, for resume tests).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .executors import InProcessExecutor, make_executor
from .failures import ErrorGroup, error_groups
from .grid import Config
from .journal import Journal, journal_dir
from .results import write_results
from .tasks import Task, file_sha256, make_tasks
from .worker import cached_trace, clear_cache

KILL_ENV = "ALLOCSIM_SWEEP_KILL_AFTER_ROWS"


class SweepStopped(RuntimeError):
    """Raised by the ``stop_after_rows`` test hook once that many rows are journaled."""


@dataclass
class SweepReport:
    """What a sweep did: row counts, failures, where the results are and how long it took."""

    output: str
    journal: str
    executor: str
    expected: int                  # rows this sweep asks for
    rows: int = 0                  # rows in the results file
    computed: int = 0              # rows simulated by this invocation
    skipped: int = 0               # rows found finished in the journal
    errors: int = 0                # rows whose config failed (``error`` column set)
    failed: list[str] = field(default_factory=list)   # tasks that did not finish (retried on rerun)
    complete: bool = False
    wall_seconds: float = 0.0
    #: Per trace: the capacity its rows ran at and where it came from (``capacity_bytes``, ``source``,
    #: ``note``); ``source`` is "given", "inferred" or None (unlimited).
    capacities: list[dict[str, Any]] = field(default_factory=list)
    #: The finished rows of this sweep, in task order (not part of ``to_dict``: they are in ``output``).
    finished_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def error_groups(self) -> list[ErrorGroup]:
        """Each distinct error of the finished rows, with the rows it hit."""
        return error_groups(self.finished_rows)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``allocsim sweep --json`` prints)."""
        return {"output": self.output, "journal": self.journal, "executor": self.executor,
                "expected_rows": self.expected, "rows": self.rows, "computed": self.computed,
                "skipped": self.skipped, "errors": self.errors, "failed": len(self.failed),
                "failures": self.failed[:20], "complete": self.complete,
                "error_groups": [g.to_dict() for g in self.error_groups()],
                "wall_seconds": round(self.wall_seconds, 3), "capacities": list(self.capacities)}


def hash_traces(paths: list[str], log: Callable[[str], None]) -> list[tuple[str, str]]:
    """(path, sha256) for each existing trace file; the same content twice is swept once."""
    out, seen = [], {}
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"trace not found: {path}")
        sha = file_sha256(path)
        if sha in seen:
            log(f"{path} has the same content as {seen[sha]}; sweeping it once")
            continue
        seen[sha] = path
        out.append((path, sha))
    return out


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    from ..terminal import raw_stream

    # The bar redraws itself with CR and cursor moves of its own: it writes past the escaping.
    return tqdm(total=total, disable=not enabled, file=raw_stream(sys.stderr), unit="run", dynamic_ncols=True,
                desc="sweep", smoothing=0.1)


def _stderr(message: str) -> None:
    print(f"allocsim sweep: {message}", file=sys.stderr)


def run_sweep(traces: list[str], configs: list[Config], *, output: str | os.PathLike,
              capacity_bytes: int | None = None, device: int | None = None, fast: bool = False,
              executor: Any = None, retry_errors: bool = False, progress: bool = False,
              log: Callable[[str], None] = _stderr, stop_after_rows: int | None = None,
              cost_model: Any = None, infer_capacity: bool = False, lenient: bool = False,
              limits: Any = None) -> SweepReport:
    """Sweep ``configs`` over ``traces``; see the module docstring. ``executor`` defaults to in-process;
    ``cost_model`` (a ``CostModel``) replaces the documented defaults, device footprint included;
    ``infer_capacity`` (only without ``capacity_bytes``) uses the capacity each recording implies;
    ``lenient`` and ``limits`` say how every trace is read (``read_trace``)."""
    started = time.perf_counter()
    hashed = hash_traces(list(traces), log)
    executor = executor or InProcessExecutor()
    capacities = {}
    if infer_capacity and capacity_bytes is None:
        capacities = inferred_capacities(hashed, device, lenient=lenient, limits=limits)
        if not isinstance(executor, InProcessExecutor):
            clear_cache()   # the rows run elsewhere: do not hold the traces here meanwhile
    tasks = make_tasks(hashed, configs, capacity_bytes=capacity_bytes, device=device, fast=fast,
                       cost_model=cost_model, capacities=capacities, lenient=lenient, limits=limits)
    report = execute_tasks(tasks, output=output, executor=executor, retry_errors=retry_errors,
                           progress=progress, log=log, stop_after_rows=stop_after_rows, started=started)
    report.capacities = capacity_lines(hashed, capacities, capacity_bytes)
    return report


def inferred_capacities(traces: list[tuple[str, str]], device: int | None, *, lenient: bool = False,
                        limits: Any = None) -> dict[str, Any]:
    """sha256 -> ``runner.Capacity`` for each trace whose recording implies a capacity (read here once)."""
    from ..engine import select_device
    from ..runner import resolve_capacity
    out = {}
    for path, sha in traces:
        try:
            trace = cached_trace(os.path.abspath(path), sha, lenient, limits)
        except Exception:  # noqa: BLE001 - an unreadable trace: its rows say why, as without inference
            continue
        if device is not None and device not in trace.devices:
            continue   # every row of this trace will say so
        capacity = resolve_capacity(select_device(trace, device) if device is not None else trace, None)
        if capacity.bytes is not None:
            out[sha] = capacity
    return out


def capacity_lines(traces: list[tuple[str, str]], inferred: dict[str, Any],
                   capacity_bytes: int | None) -> list[dict[str, Any]]:
    """What ``SweepReport.capacities`` says for each trace."""
    out = []
    for path, sha in traces:
        own = inferred.get(sha)
        if own is not None:
            out.append({"trace": path, "capacity_bytes": own.bytes, "source": own.source, "note": own.note,
                        "range": list(own.range) if own.range is not None else None})
        else:
            out.append({"trace": path, "capacity_bytes": capacity_bytes,
                        "source": "given" if capacity_bytes is not None else None, "note": ""})
    return out


def execute_tasks(tasks: list[Task], *, output: str | os.PathLike, executor: Any = None,
                  retry_errors: bool = False, progress: bool = False, log: Callable[[str], None] = _stderr,
                  stop_after_rows: int | None = None, started: float | None = None) -> SweepReport:
    """Run ``tasks`` with the journal beside ``output`` (resume, then run the rest), write ``output``."""
    started = time.perf_counter() if started is None else started
    executor = executor or InProcessExecutor()
    output = os.fspath(output)
    tasks = sorted(tasks, key=lambda t: t.order)
    journal = Journal(journal_dir(output))
    finished = journal.load()
    if retry_errors:
        finished = {k: r for k, r in finished.items() if r.get("error") is None}
    wanted = {t.row_key for t in tasks}
    todo = [t for t in tasks if t.row_key not in finished]
    report = SweepReport(output=output, journal=str(journal.directory), executor=executor.name,
                         expected=len(tasks), skipped=len(wanted & finished.keys()))
    if report.skipped:
        log(f"resuming: {report.skipped} of {len(tasks)} rows already finished in {journal.directory}; "
            f"running {len(todo)}")
    kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
    try:
        if todo:
            with executor, _progress(len(todo), progress) as bar:
                for task, outcome in executor.run(todo):
                    bar.update(1)
                    if not isinstance(outcome, dict):
                        report.failed.append(f"{task.trace} {task.policy} {task.params_json}: "
                                             f"{type(outcome).__name__}: {outcome}")
                        continue
                    journal.write(outcome)
                    finished[task.row_key] = outcome
                    report.computed += 1
                    if kill_after and report.computed >= kill_after:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if stop_after_rows is not None and report.computed >= stop_after_rows:
                        raise SweepStopped(f"stopped after {report.computed} rows (test hook)")
    finally:
        rows = []
        for task in tasks:
            row = finished.get(task.row_key)
            if row is not None:
                rows.append({**row, "trace": task.trace})
        report.rows = len(rows)
        report.finished_rows = rows
        report.errors = sum(row.get("error") is not None for row in rows)
        report.complete = report.rows == len(tasks)
        write_results(rows, output, complete=report.complete, expected_rows=len(tasks))
        if report.complete:
            journal.compact()
        report.wall_seconds = time.perf_counter() - started
    return report


def executor_from_options(workers: int | None, scheduler: str | None, dask: str | None):
    """``--workers``, ``--scheduler``, ``--dask local`` -> an executor (``ValueError`` on bad combinations)."""
    if dask is not None and dask != "local":
        raise ValueError(f"--dask {dask}: only 'local' is supported (use --scheduler ADDRESS for a cluster)")
    return make_executor(workers=workers, scheduler=scheduler, dask_local=dask == "local")
