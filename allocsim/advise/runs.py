"""Run settings on the sweep machinery: ``Runs(...).run([(point, capacity, fast), ...]) -> rows``.

Every run is a sweep ``Task`` keyed like a sweep row, journaled beside ``output`` as it finishes
(``OUTPUT.parts/``): an interrupted ``advise`` reruns only what it had not finished, and a later
``advise`` on the same trace reuses every run it shares. The executor is the sweep's (in-process,
local process pool, Dask); one pool serves every stage. ``Runs.rows`` keeps each row once, in the
order first asked for; ``write()`` puts them all in ``output`` (a sweep results file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import AllocsimError
from ..sweep.driver import execute_tasks
from ..sweep.grid import make_config
from ..sweep.results import write_results
from ..sweep.tasks import Task, cost_model_json


@dataclass(frozen=True)
class Point:
    """One setting: its changes from the recorded settings, in the knobs' words, and their parameters."""

    changes: tuple[tuple[str, str], ...]
    params: tuple[tuple[str, Any], ...]       #: sorted (name, value) pairs, so points hash and compare
    order: int = 0

    @classmethod
    def of(cls, changes: list[tuple[str, str]], params: dict[str, Any], order: int = 0) -> "Point":
        return cls(tuple(changes), tuple(sorted(params.items())), order)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass
class Runs:
    """Where and how runs happen: one trace file, device, policy, cost model, executor, journal."""

    trace: str                       #: the path as the user gave it
    trace_sha256: str
    policy: str
    device: int | None
    executor: Any
    output: str
    cost_model: Any = None
    lenient: bool = False            #: how the trace is read (``--lenient``, ``--limits``)
    limits: Any = None
    progress: bool = False
    log: Callable[[str], None] = lambda message: None
    computed: int = 0                #: runs simulated by this invocation
    reused: int = 0                  #: runs found in the journal from an earlier (or interrupted) advise
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _task(self, point: Point, capacity_bytes: int | None, fast: bool, seq: int) -> Task:
        config = make_config(self.policy, point.param_dict, order=seq)
        return Task(trace=self.trace, trace_path=os.path.abspath(self.trace), trace_sha256=self.trace_sha256,
                    policy=self.policy, params=dict(config.params), params_json=config.params_json,
                    param_texts=dict(config.texts), capacity_bytes=capacity_bytes, device=self.device, fast=fast,
                    order=(0, seq), cost_model_json=cost_model_json(self.cost_model),
                    capacity_source="given" if capacity_bytes is not None else None,
                    lenient=self.lenient, limits=self.limits)

    def run(self, items: list[tuple[Point, int | None, bool]]) -> list[dict[str, Any]]:
        """The row of each (point, capacity, fast), running what the journal does not hold yet."""
        tasks = [self._task(point, capacity, fast, i) for i, (point, capacity, fast) in enumerate(items)]
        unique = list({task.row_key: task for task in tasks}.values())
        seen_here = sum(task.row_key in self.rows for task in unique)
        report = execute_tasks(unique, output=self.output, executor=self.executor, progress=self.progress,
                               log=lambda message: None)
        self.computed += report.computed
        self.reused += report.skipped - seen_here     # in the journal before this advise began
        if report.failed:
            raise AllocsimError(f"{len(report.failed)} of {len(unique)} runs did not finish (first: "
                                f"{report.failed[0]}); finished runs are kept in {report.journal}: rerun the "
                                "same command to retry the rest")
        found = {row["row_key"]: row for row in report.finished_rows}
        for task in unique:
            self.rows.setdefault(task.row_key, found[task.row_key])
        return [found[task.row_key] for task in tasks]

    def write(self) -> None:
        """Write every row this advise used to ``output`` (a sweep results file ``winners`` reads)."""
        rows = list(self.rows.values())
        write_results(rows, self.output, complete=True, expected_rows=len(rows))
