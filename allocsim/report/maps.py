"""The segment maps a report page draws for one run: ``segment_maps(trace, policy, params, capacity_bytes, summary)``.

A second replay of the run stops at its peak of reserved memory to take the segment map there, with
the allocation in every live block, and keeps the map at its end (the first OOM, if any).
"""

from __future__ import annotations

from typing import Any


class MapObserver:
    """Engine observer: the segment map and the owner of each live block after one event (and at the end)."""

    def __init__(self, target_event: int):
        self.target = target_event
        self.at_target: tuple[Any, dict[int, int]] | None = None
        self.policy = None
        self.last_event = -1

    @staticmethod
    def capture(policy: Any) -> tuple[Any, dict[int, int]]:
        from ..metrics.attribution import segment_table, stack_layers

        top = stack_layers(policy)[0]
        owners = {int(addr): int(aid) for aid, (addr, _req, alloc, _stream) in top.live.items() if alloc}
        return segment_table(policy), owners

    def __call__(self, event_index: int, policy: Any) -> None:
        self.policy, self.last_event = policy, event_index
        if event_index == self.target and self.at_target is None:
            self.at_target = self.capture(policy)


def segment_maps(trace: Any, name: str, params: dict[str, Any], capacity_bytes: int | None, summary: dict[str, Any]
          ) -> dict[str, tuple[int, Any, dict[int, int]]]:
    """Segment maps of one run: at its peak of reserved memory and at its end (the first OOM, if any)."""
    from ..engine import run_fast
    from ..policies.registry import build_policy
    from ..runner import device_for

    target = int((summary.get("at_peak_reserved") or {}).get("event_index", -1))
    observer = MapObserver(target)
    policy = build_policy(name, device=device_for(capacity_bytes), params=dict(params or {}),
                          allocator_settings=trace.meta.allocator_settings)
    run_fast(trace, policy, observer=observer)
    out = {}
    if observer.at_target is not None:
        out["peak_reserved"] = (target, *observer.at_target)
    if observer.policy is not None:
        out["end"] = (observer.last_event, *observer.capture(observer.policy))
    return out
