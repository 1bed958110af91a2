"""Where sweep tasks run: in-process, a local process pool, or a Dask distributed cluster.

Pick one with ``make_executor(workers=N, scheduler=ADDRESS, dask_local=False)``; each is a context
manager whose ``run(tasks)`` yields ``(task, outcome)`` as tasks finish (any order), where outcome is
the row dict or the exception that stopped the task *outside* the config (a dead worker, a Dask
``KilledWorker``, a ``MemoryError``, a trace the worker cannot read): such a task is not journaled, so a rerun retries it.

Tasks carry a trace path, never the trace: every worker process loads a trace once and keeps it
(``worker.cached_trace``). For a remote ``--scheduler``, the trace paths must exist on the workers
(a shared file system) and allocsim must be installed there.

- ``InProcessExecutor`` (``--workers 1``): runs tasks one after the other in this process.
- ``ProcessPoolExecutor`` (``--workers N``): N forkserver processes (safe with threads, fast start);
  each exits by itself if the driver dies (SIGKILL), so no orphan keeps a trace in memory.
- ``DaskExecutor`` (``--scheduler tcp://HOST:PORT``, or ``--dask local`` for a
  ``LocalCluster(n_workers=N, threads_per_worker=1)``): one task per Dask task, pure=False.

Executors nest: entering one that is already open reuses its pool (and its workers' cached
traces), and only the outermost exit closes it. A caller that runs several sweeps in a row
(``allocsim advise``) opens the executor once around all of them.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
from typing import Any, Iterator

from .tasks import Task
from .worker import clear_cache, exit_with_driver, run_task

Outcome = tuple[Task, Any]


class InProcessExecutor:
    """Run tasks sequentially here (no pool): the simplest, and what ``--workers 1`` uses."""

    name = "in-process"
    workers = 1

    def __init__(self) -> None:
        self._depth = 0

    def __enter__(self) -> "InProcessExecutor":
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            clear_cache()   # this process lives on after the sweep: do not keep its traces

    def run(self, tasks: list[Task]) -> Iterator[Outcome]:
        for task in tasks:
            try:
                row = run_task(task)
            except Exception as exc:  # noqa: BLE001 - MemoryError, TraceUnavailable: not a row
                yield task, exc
            else:
                yield task, row


class ProcessPoolExecutor:
    """A pool of ``workers`` local processes; each caches the traces it has read."""

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self.name = f"process pool ({self.workers} workers)"
        self._pool: cf.ProcessPoolExecutor | None = None
        self._depth = 0

    def __enter__(self) -> "ProcessPoolExecutor":
        self._depth += 1
        if self._pool is not None:
            return self
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["allocsim.sweep.worker"])
        self._pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                            initializer=exit_with_driver, initargs=(os.getpid(),))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, tasks: list[Task]) -> Iterator[Outcome]:
        assert self._pool is not None, "use the executor as a context manager"
        futures = {self._pool.submit(run_task, task): task for task in tasks}
        try:
            for future in cf.as_completed(futures):
                task = futures[future]
                try:
                    yield task, future.result()
                except Exception as exc:  # noqa: BLE001 - a dead worker (BrokenProcessPool) or MemoryError
                    yield task, exc
        finally:
            for future in futures:
                future.cancel()


class DaskExecutor:
    """Tasks on a Dask cluster: an existing one (``address``) or a ``LocalCluster`` of ``workers`` processes."""

    def __init__(self, address: str | None = None, workers: int | None = None):
        self.address = address
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.name = f"dask {address}" if address else f"dask LocalCluster ({self.workers} workers)"
        self._cluster = None
        self._client = None
        self._depth = 0

    def __enter__(self) -> "DaskExecutor":
        if self._client is not None:
            self._depth += 1
            return self
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError as exc:
            raise ValueError(f"Dask executor needs dask[distributed] (pip install 'allocsim[dask]'): {exc}") from None
        if self.address:
            try:
                self._client = Client(self.address, timeout="30s")
            except (OSError, TimeoutError) as exc:
                raise ValueError(f"cannot connect to the Dask scheduler at {self.address}: {exc}") from None
        else:
            self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                         dashboard_address=None, silence_logs=logging.ERROR)
            self._client = self._cluster.get_client()
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def run(self, tasks: list[Task]) -> Iterator[Outcome]:
        from dask.distributed import as_completed

        assert self._client is not None, "use the executor as a context manager"
        futures = self._client.map(run_task, tasks, pure=False,
                                   key=[f"allocsim-sweep-{task.row_key}" for task in tasks])
        by_key = {future.key: task for future, task in zip(futures, tasks)}
        try:
            for future in as_completed(futures):
                task = by_key[future.key]
                try:
                    yield task, future.result()
                except Exception as exc:  # noqa: BLE001 - KilledWorker, a lost connection, MemoryError
                    yield task, exc
                future.release()
        finally:
            self._client.cancel([f for f in futures if not f.done()])


def make_executor(workers: int | None = None, scheduler: str | None = None, dask_local: bool = False):
    """The executor the command line asks for; ``workers`` defaults to ``os.cpu_count()``."""
    if scheduler and dask_local:
        raise ValueError("give --scheduler ADDRESS or --dask local, not both")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if scheduler:
        return DaskExecutor(address=scheduler)
    if dask_local:
        return DaskExecutor(workers=workers)
    n = workers or os.cpu_count() or 1
    return InProcessExecutor() if n == 1 else ProcessPoolExecutor(n)
