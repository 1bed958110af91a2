"""What one sweep row needs, small enough to ship to any worker: ``Task`` (a path, never the trace itself).

A row is keyed by ``(allocsim code identity, trace_sha256, policy, params_json, capacity_bytes, device, fast)``
and, when the sweep has one, the cost model (``cost_model_json``), and ``"inferred"`` when the
capacity is the one the recording implies (the verdict then says so): ``Task.row_key`` is the
SHA-256 of that tuple as canonical JSON. The same key always gives the same
deterministic summary, which is what lets a sweep skip finished rows on resume and compare
executors row for row. The code identity (the version and a hash of the package's code,
``allocsim.code_identity``) is in the key because changed code may give new results: rows
journaled by other code are recomputed, never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..code_identity import code_identity
from .grid import Config

#: Read files in blocks of this size when hashing them.
HASH_BLOCK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (streamed: constant memory for any size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def row_key(trace_sha256: str, policy: str, params_json: str, capacity_bytes: int | None,
            device: int | None, fast: bool, cost_model_json: str | None = None,
            capacity_inferred: bool = False, lenient: bool = False) -> str:
    """Hex SHA-256 identifying a row; equal keys mean equal deterministic results."""
    parts: list = [code_identity(), trace_sha256, policy, params_json, capacity_bytes, device, bool(fast)]
    if cost_model_json is not None:   # absent for the default cost model: older journals keep their keys
        parts.append(cost_model_json)
    if capacity_inferred:             # the same for given capacities: older journals keep their keys
        parts.append("inferred")
    if lenient:                       # a repaired trace is another trace (limits change no result)
        parts.append("lenient")
    text = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cost_model_json(cost_model: Any) -> str | None:
    """The canonical JSON of what a ``CostModel`` changes in a run (its constants and the calibrated
    device footprint), None for no cost model; ``CostModel.from_overrides(json.loads(...))`` rebuilds it."""
    if cost_model is None:
        return None
    data = dict(cost_model.to_dict())
    for key in ("_granularity_bytes", "_small_granularity_bytes"):
        if cost_model.provenance.get(key) is not None:
            data[key] = cost_model.provenance[key]
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, eq=False)
class Task:
    """One simulation to run: trace file (+ its hash), policy and canonical params, run options."""

    trace: str                 # the path as the user gave it (the ``trace`` column)
    trace_path: str            # absolute path the worker opens
    trace_sha256: str
    policy: str
    params: dict[str, Any] = field(repr=False)
    params_json: str = "{}"
    param_texts: dict[str, str] = field(default_factory=dict, repr=False)
    capacity_bytes: int | None = None
    device: int | None = None
    fast: bool = False
    #: (trace position, config position): the row order of the results file.
    order: tuple[int, int] = (0, 0)
    #: ``cost_model_json`` of the sweep's ``--cost-model`` (None: the documented defaults).
    cost_model_json: str | None = None
    #: Where ``capacity_bytes`` came from: "given", "inferred" (from the recording) or None (unlimited).
    capacity_source: str | None = None
    #: For an inferred capacity: how the recording implies it (the verdict quotes it).
    capacity_note: str = ""
    #: How the worker reads the trace: ``--lenient`` repairs and the reader's caps (None: the defaults).
    lenient: bool = False
    limits: Any = None

    @property
    def row_key(self) -> str:
        """See ``row_key()``."""
        return row_key(self.trace_sha256, self.policy, self.params_json, self.capacity_bytes,
                       self.device, self.fast, self.cost_model_json,
                       capacity_inferred=self.capacity_source == "inferred", lenient=self.lenient)

    def key_columns(self) -> dict[str, Any]:
        """The identifying columns every row starts with (``param.<key>`` holds ``--set`` texts)."""
        cols: dict[str, Any] = {"trace": self.trace, "trace_sha256": self.trace_sha256, "policy": self.policy,
                                "params_json": self.params_json}
        cols.update({f"param.{k}": v for k, v in self.param_texts.items()})
        cols.update({"capacity_bytes": self.capacity_bytes, "device": self.device, "fast": self.fast,
                     "row_key": self.row_key})
        return cols


def make_tasks(traces: list[tuple[str, str]], configs: list[Config], *, capacity_bytes: int | None = None,
               device: int | None = None, fast: bool = False, cost_model: Any = None,
               capacities: dict[str, Any] | None = None, lenient: bool = False,
               limits: Any = None) -> list[Task]:
    """The trace-major product of ``traces`` ((path, sha256) pairs) and ``configs``.

    ``capacities`` maps a trace's sha256 to its own ``runner.Capacity`` (an inferred one); other
    traces get ``capacity_bytes`` (given, or None: unlimited).
    """
    cost_json = cost_model_json(cost_model)
    tasks = []
    for i, (path, sha) in enumerate(traces):
        absolute = os.path.abspath(path)
        own = (capacities or {}).get(sha)
        if own is not None:
            cap, source, note = own.bytes, own.source, own.note
        else:
            cap, source, note = capacity_bytes, ("given" if capacity_bytes is not None else None), ""
        for config in configs:
            tasks.append(Task(trace=path, trace_path=absolute, trace_sha256=sha, policy=config.policy,
                              params=dict(config.params), params_json=config.params_json,
                              param_texts=dict(config.texts), capacity_bytes=cap, device=device,
                              fast=fast, order=(i, config.order), cost_model_json=cost_json,
                              capacity_source=source, capacity_note=note, lenient=lenient, limits=limits))
    return tasks
