"""The smallest capacity at which a setting still fits: ``Bisection`` over capacities, several at a time.

Not simply the peak reserved: on a smaller device the allocator releases its cache on the
out-of-memory path and retries, so a setting often fits below its own peak at a larger capacity.
Each ``Bisection`` keeps a capacity known to fail (``fail_bytes``) and one known to fit
(``fit_bytes``) and probes multiples of ``step_bytes`` between them (the device's allocation
granularity, 2 MiB: reservations are whole multiples of it, so a capacity between two multiples
behaves like the lower one); ``probes(k)`` gives k capacities spread over the open interval (k = 1
is plain bisection; with more workers several run at once). The search assumes that a setting
that fits at one capacity fits at every larger one; a probe that contradicts it is recorded in
``contradictions`` and the smallest fitting capacity seen is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The device's allocation granularity (cudaMalloc rounds segments to 2 MiB pages).
STEP_BYTES = 2 << 20


@dataclass
class Bisection:
    """Search ``(fail_bytes, fit_bytes]`` for the smallest fitting capacity, in multiples of ``step_bytes``."""

    key: Any                     #: what is searched (the caller's handle)
    fail_bytes: int              #: a capacity at which it does not fit (or below which nothing can)
    fit_bytes: int               #: a capacity at which it fits
    step_bytes: int = STEP_BYTES
    probed: int = 0
    contradictions: list[tuple[int, int]] = field(default_factory=list)   #: (fits at, fails at above it)

    def _range(self) -> tuple[int, int]:
        """First and last multiple of the step strictly inside (fail, fit)."""
        first = self.fail_bytes // self.step_bytes + 1
        last = -(-self.fit_bytes // self.step_bytes) - 1
        return first, last

    @property
    def done(self) -> bool:
        first, last = self._range()
        return first > last

    def probes(self, k: int = 1) -> list[int]:
        """Up to ``k`` capacities to try next, evenly spread over the open interval (empty when done)."""
        first, last = self._range()
        if first > last:
            return []
        n = last - first + 1
        picks = sorted({first + (j * n) // (k + 1) for j in range(1, k + 1)})
        return [m * self.step_bytes for m in picks]

    def update(self, results: dict[int, bool]) -> None:
        """Take the fit / fail answers of probed capacities."""
        self.probed += len(results)
        fitting = [c for c, ok in results.items() if ok]
        if fitting:
            self.fit_bytes = min(self.fit_bytes, min(fitting))
        for capacity, ok in results.items():
            if not ok and capacity >= self.fit_bytes:
                self.contradictions.append((self.fit_bytes, capacity))
        failing = [c for c, ok in results.items() if not ok and c < self.fit_bytes]
        if failing:
            self.fail_bytes = max(self.fail_bytes, max(failing))


def probes_per_search(workers: int, active: int) -> int:
    """How many capacities each of ``active`` searches probes per round so ``workers`` stay busy."""
    return max(1, workers // max(active, 1))
