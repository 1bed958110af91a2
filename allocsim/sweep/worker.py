"""Run one sweep ``Task`` where it lands (driver, pool process or Dask worker): ``run_task(task) -> row``.

Traces are loaded once per worker process, not shipped with tasks: ``cached_trace`` keeps the last
``TRACE_CACHE_SIZE`` traces read in this process, keyed by (absolute path, sha256), and checks the
file still has the hash the driver saw. Only the summary leaves the worker: the per-event time
series of the run is dropped here, so results stay small whatever the trace size.

Errors: anything a config or trace raises (bad value, unknown key, unreadable trace, wrong device)
becomes the row's ``error`` text; such a row is finished and journaled like any other. A
``MemoryError`` that is not a simulated ``OutOfMemory`` is re-raised: it says nothing about the
config, so the driver leaves the row unfinished and a rerun retries it. So is ``TraceUnavailable``
(the file is missing on this worker, or changed since the driver hashed it).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from ..errors import OutOfMemory
from .flatten import flatten
from .tasks import Task, file_sha256

#: Traces kept in memory per worker process (tasks are trace-major, so 2 covers a trace switch).
TRACE_CACHE_SIZE = 2

class TraceUnavailable(RuntimeError):
    """This worker cannot read the trace the driver hashed (missing, unreadable or changed)."""


_TRACES: "OrderedDict[tuple[str, str], Any]" = OrderedDict()
_LOCK = threading.Lock()
#: Traces this process has read from disk (tests use it to check "once per worker").
LOADS: list[str] = []


def cached_trace(path: str, sha256: str, lenient: bool = False, limits: Any = None) -> Any:
    """The trace at ``path`` from this process's cache, reading it (and checking its hash) on a miss.

    ``lenient`` and ``limits`` (``allocsim.trace.reading.limits.Limits``; None: the defaults) are how the
    user asked for the file to be read (``--lenient``, ``--limits``); they are part of the cache key.
    """
    from ..trace import read_trace

    key = (path, sha256, lenient, limits)
    with _LOCK:
        if key in _TRACES:
            _TRACES.move_to_end(key)
            return _TRACES[key]
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise TraceUnavailable(f"cannot read {path} on this worker: {exc.strerror or exc}") from None
        if actual != sha256:
            raise TraceUnavailable(f"{path} changed since the sweep started (sha256 {actual[:12]}, "
                                   f"expected {sha256[:12]}); rerun the sweep")
        while len(_TRACES) >= TRACE_CACHE_SIZE:
            _TRACES.popitem(last=False)
        trace = read_trace(path, lenient=lenient, limits=limits)
        LOADS.append(path)
        _TRACES[key] = trace
        return trace


def exit_with_driver(driver_pid: int, interval_s: float = 1.0) -> None:
    """Pool initializer: end this worker once the driver process is gone (a SIGKILLed sweep leaves no
    orphans holding traces in memory)."""

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(driver_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:   # alive, owned by someone else (cannot happen for our parent)
                pass

    threading.Thread(target=watch, name="allocsim-driver-watch", daemon=True).start()


def clear_cache() -> None:
    """Forget every cached trace (frees their memory)."""
    with _LOCK:
        _TRACES.clear()


def simulate_summary(task: Task, trace: Any) -> dict[str, Any]:
    """Run ``task`` on ``trace`` as ``allocsim run`` would; return its summary plus the engine's wall-clock
    figures (no time series)."""
    import json

    from ..cost import CostModel
    from ..engine import select_device
    from ..runner import Capacity, resolve_capacity, simulate_trace

    cost_model = (CostModel.from_overrides(json.loads(task.cost_model_json))
                  if task.cost_model_json is not None else None)
    source = task.capacity_source or ("given" if task.capacity_bytes is not None else None)
    trace = select_device(trace, task.device)
    # An inferred capacity carries the range the recording proves (the same inference as run's).
    proven = resolve_capacity(trace, None).range if source == "inferred" else None
    capacity = Capacity(task.capacity_bytes, source if task.capacity_bytes is not None else None,
                        task.capacity_note, proven)
    result = simulate_trace(trace, task.policy, dict(task.params),
                            capacity=capacity, cost_model=cost_model, fast=task.fast)
    return result.to_dict(include_perf=True)


def run_task(task: Task) -> dict[str, Any]:
    """The finished row of ``task``: key columns, ``error``, the flattened summary, ``wall_seconds``.

    ``wall_seconds`` covers building the policy, the replay and the summary, not reading the trace.
    """
    row = task.key_columns()
    row["error"] = None
    started = time.perf_counter()
    try:
        trace = cached_trace(task.trace_path, task.trace_sha256, task.lenient, task.limits)
        started = time.perf_counter()
        summary = simulate_summary(task, trace)
    except TraceUnavailable:
        raise
    except OutOfMemory as exc:   # the engine records OOMs; one escaping is still a config result
        row["error"] = f"{type(exc).__name__}: {exc}"
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing config is a row, not a crash
        row["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    else:
        for key, value in flatten(summary).items():
            row.setdefault(key, value)
        # The key column ``device`` is the --device option (the row's identity, None when not given);
        # this one is the device the row replayed, as ``run --json``'s ``device`` (-1: host memory).
        row["replayed_device"] = summary.get("device")
    row["wall_seconds"] = round(time.perf_counter() - started, 6)
    return row
