"""Hypothesis state machine: each policy against a naive reference model of the program's allocations.

The model is a dict ``alloc_id -> (size, stream, state)``. After every step the policy must agree
with it exactly: same live and pending ids, the same requested-bytes sum, no overlapping live
blocks, consistent internal structures (``check_invariants``). An ``OutOfMemory`` is allowed only
when the device really refused memory during that call (a failed cudaMalloc or map) or a
configured cap refused it; and with nothing live at all, a request that fits the device with room
for one growth step must succeed (except paddle-naive, which by design never returns its chunk on
OOM, and a deferred GC that still holds queued blocks).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from allocsim.device import SimulatedDevice
from allocsim.errors import OutOfMemory
from allocsim.policies import build_policy
from allocsim.units import MiB

from .test_policies_conformance import BASE_CASES, DEFERRED_CASES, case_id

CAPACITY_BYTES = 96 * MiB
#: Largest growth step of any policy: cuda-async grows in 32 MiB steps, PyTorch uses 20 MiB segments.
GROWTH_SLACK_BYTES = 32 * MiB

MACHINE_CASES = BASE_CASES + DEFERRED_CASES + [
    ("pytorch", {"expandable_segments": "true"}),
    ("pytorch", {"max_split_size": "20MiB"}),
    ("stream-bound", {"cross_stream_reuse": "true"}),
]

SIZES = st.one_of(
    st.integers(0, 4096),
    st.integers(4097, 1 * MiB),
    st.integers(1 * MiB + 1, 10 * MiB),
    st.integers(10 * MiB, 40 * MiB),
)
LIVE, PENDING = "live", "pending"


def machine_for(case: tuple[str, dict]) -> type[RuleBasedStateMachine]:
    """Return a state machine class that drives the policy of ``case``."""

    class PolicyMachine(RuleBasedStateMachine):
        @initialize()
        def build(self) -> None:
            self.device = SimulatedDevice(CAPACITY_BYTES)
            self.policy = build_policy(case[0], device=self.device, params=case[1])
            self.model: dict[int, tuple[int, int, str]] = {}
            self.next_id = 0

        def _refusals(self) -> int:
            return self.device.n_failed_mallocs + self.device.n_failed_maps

        @rule(size=SIZES, stream=st.integers(0, 2))
        def malloc(self, size: int, stream: int) -> None:
            alloc_id = self.next_id
            self.next_id += 1
            refusals = self._refusals()
            nothing_held = not self.model and getattr(self.policy, "queued_bytes", 0) == 0
            try:
                self.policy.malloc(alloc_id, size, stream)
            except OutOfMemory:
                assert self._refusals() > refusals, "OutOfMemory without the device refusing anything"
                if nothing_held and case[0] != "paddle-naive" and case[1].get("inner") != "paddle-naive":
                    assert size + GROWTH_SLACK_BYTES > CAPACITY_BYTES, "OOM on an empty device with room to spare"
                return
            self.model[alloc_id] = (size, stream, LIVE)

        def _ids(self, state: str) -> list[int]:
            return sorted(i for i, (_, _, s) in self.model.items() if s == state)

        @precondition(lambda self: any(s == LIVE for _, _, s in self.model.values()))
        @rule(data=st.data())
        def free_requested(self, data) -> None:
            alloc_id = data.draw(st.sampled_from(self._ids(LIVE)))
            self.policy.free_requested(alloc_id)
            size, stream, _ = self.model[alloc_id]
            self.model[alloc_id] = (size, stream, PENDING)

        @precondition(lambda self: any(s == PENDING for _, _, s in self.model.values()))
        @rule(data=st.data())
        def free_completed(self, data) -> None:
            alloc_id = data.draw(st.sampled_from(self._ids(PENDING)))
            self.policy.free_completed(alloc_id)
            del self.model[alloc_id]

        @precondition(lambda self: any(s == LIVE for _, _, s in self.model.values()))
        @rule(data=st.data())
        def free(self, data) -> None:
            alloc_id = data.draw(st.sampled_from(self._ids(LIVE)))
            self.policy.free(alloc_id)
            del self.model[alloc_id]

        @rule()
        def empty_cache(self) -> None:
            self.policy.empty_cache()

        @invariant()
        def agrees_with_the_model(self) -> None:
            policy = self.policy
            assert set(policy.live) == set(self.model)
            assert policy.pending == {i for i, (_, _, s) in self.model.items() if s == PENDING}
            assert policy.requested_bytes == sum(size for size, _, _ in self.model.values())
            blocks = sorted((addr, addr + allocated) for addr, _, allocated, _ in policy.live.values() if allocated)
            for (_, end), (start, _) in zip(blocks, blocks[1:]):
                assert end <= start, "two live blocks overlap"
            assert policy.allocated_bytes + policy.cached_free_bytes() == policy.reserved_bytes
            assert policy.reserved_bytes <= CAPACITY_BYTES
            policy.check_invariants()

    PolicyMachine.__name__ = f"PolicyMachine_{case_id(case)}"
    return PolicyMachine


@pytest.mark.full
@pytest.mark.parametrize("case", MACHINE_CASES, ids=case_id)
def test_policy_matches_the_reference_model(case):
    run_state_machine_as_test(
        machine_for(case),
        settings=settings(max_examples=25, stateful_step_count=50, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck)),
    )
