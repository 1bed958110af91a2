"""What a recording proves about the real run: read it with ``recorded_run(trace, device)``.

A PyTorch snapshot records what the real caching allocator did (segment allocations and frees,
maps and unmaps, OOMs); a Kineto trace records the allocator's ``Total Allocated`` / ``Total
Reserved`` after every event. The trace layer infers from them, once, what every command needs to
start from what really happened: the real peaks and device-call counts, the program's
``empty_cache()`` calls (``EMPTY_CACHE`` events in ``Trace.events``), the segment releases that
the allocator made on its out-of-memory path and the device capacity they imply, and the OOMs the
run really hit. The facts live in ``trace.meta.recorded`` (JSON-able, kept by ``convert``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .schema import Trace


@dataclasses.dataclass
class RecordedOOM:
    """One out-of-memory the real run hit: the request failed and left no allocation."""

    event_index: int            #: index in ``Trace.events`` of the failed request (an ALLOC event)
    t_ns: int
    requested_bytes: int        #: the request as the allocator rounded it
    stream: int
    device_free_bytes: int      #: what cudaMemGetInfo reported free at the failure (-1 if unknown)
    reserved_bytes: int         #: the real allocator's reserved bytes at the failure


@dataclasses.dataclass
class RecordedRun:
    """The real run of one device as the recording shows it; ``None`` fields are not recorded."""

    device: int
    allocator: str                                  #: "pytorch" (snapshots, Kineto) or "unknown"
    settings: dict[str, Any] | None = None          #: the recorded allocator settings, if any
    start_reserved_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    final_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None         #: Kineto's Total Allocated (snapshots: None)
    segment_allocs: int | None = None               #: cudaMalloc calls (plain segments)
    segment_alloc_bytes: int | None = None
    segment_frees: int | None = None                #: cudaFree calls
    segment_free_bytes: int | None = None
    segment_maps: int | None = None                 #: expandable segments: page maps
    segment_map_bytes: int | None = None
    segment_unmaps: int | None = None
    segment_unmap_bytes: int | None = None
    empty_cache_calls: int = 0                      #: program empty_cache() calls found in the window
    oom_path_releases: int = 0                      #: release points on the allocator's OOM path
    ooms: list[RecordedOOM] = dataclasses.field(default_factory=list)
    #: Device memory the allocator could use, as the recording implies it (None: not inferable).
    capacity_bytes: int | None = None
    #: How the capacity was inferred, or why it could not be (one sentence for people).
    capacity_source: str = ""
    #: Every capacity in [lo, hi] explains the recording (hi None: no upper bound known).
    capacity_range: tuple[int, int | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (inverse of ``from_dict``)."""
        data = dataclasses.asdict(self)
        if self.capacity_range is not None:
            data["capacity_range"] = list(self.capacity_range)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RecordedRun":
        """Rebuild from ``to_dict`` output, ignoring keys this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["ooms"] = [RecordedOOM(**o) for o in kwargs.get("ooms") or []]
        if kwargs.get("capacity_range") is not None:
            kwargs["capacity_range"] = tuple(kwargs["capacity_range"])
        return cls(**kwargs)


def recorded_run(trace: Trace, device: int) -> RecordedRun | None:
    """The recorded facts of ``device`` in ``trace``, or None when the source records none."""
    data = trace.meta.recorded.get(str(device))
    return None if data is None else RecordedRun.from_dict(data)


def set_recorded_run(trace: Trace, run: RecordedRun) -> None:
    """Store ``run`` in ``trace.meta.recorded`` (readers call this once per device)."""
    trace.meta.recorded[str(run.device)] = run.to_dict()
