"""The conservation check every sample must pass: active + cached free == reserved.

``ConservationObserver`` plugs into ``run_fast``/``run_simpy(observer=...)`` and asks the policy for
``cached_free_bytes()`` after every event (O(free blocks) for pools, so tests only); it also checks
that requested <= active <= reserved and that the pending bytes never go negative.
"""

from __future__ import annotations

from ..policies.base import Policy


class ConservationError(AssertionError):
    """A policy's byte accounting does not add up."""


def conservation_error(policy: Policy) -> str | None:
    """Return what is wrong with ``policy``'s accounting right now, or None if it adds up."""
    reserved = policy.reserved_bytes
    active = policy.allocated_bytes
    cached = policy.cached_free_bytes()
    if active + cached != reserved:
        return f"active {active} + cached free {cached} != reserved {reserved}"
    if not 0 <= policy.pending_free_bytes <= active:
        return f"pending free {policy.pending_free_bytes} outside [0, active {active}]"
    if policy.requested_bytes > active:
        return f"requested {policy.requested_bytes} > active {active}"
    if active > reserved:
        return f"active {active} > reserved {reserved}"
    return None


class ConservationObserver:
    """Observer that raises ``ConservationError`` at the first event whose accounting does not add up."""

    def __init__(self) -> None:
        self.samples = 0

    def __call__(self, event_index: int, policy: Policy) -> None:
        problem = conservation_error(policy)
        if problem is not None:
            raise ConservationError(f"after event {event_index}: {problem}")
        self.samples += 1
