"""Adaptors: policies that wrap another policy; start with ``DeferredGC(policy, threshold_bytes=...)``.

An adaptor is a ``Policy`` whose ``upstream`` is a policy, so stacks read like a sentence:
``DeferredGC(PaddlePolicy(SimulatedDevice(80 * GiB)), threshold_bytes=1 * GiB)``.
"""

from __future__ import annotations

from typing import Any

from .base import Policy


class DeferredGC(Policy):
    """PaddlePaddle's eager-deletion GC (``FLAGS_eager_delete_tensor_gb``) over any policy.

    Completed frees are queued instead of being handed to the upstream until the queued block
    bytes reach ``threshold_bytes``; then the whole batch is freed together (``n_gc_batches``
    counts batches). ``threshold_bytes`` <= 1 frees at once, as Paddle's fast path does
    (``max_memory_size_ <= 1``), and counts no batch. Queued memory is still allocated for the
    upstream (``queued_bytes``), so a higher threshold holds more memory and raises the peak.
    ``empty_cache`` flushes the queue, then empties the upstream's cache. An OutOfMemory does not
    flush the queue: Paddle's allocator cannot reach the GC's pending garbage either.

    Counters count what happens in this layer only (``n_gc_batches`` here, pool hits and splits in
    the upstream); stack-wide figures sum the layers (``allocsim.cost.stack_counter``).
    """

    name = "deferred-gc"

    def __init__(self, upstream: Policy, *, threshold_bytes: int = 0):
        if threshold_bytes < 0:
            raise ValueError(f"threshold_bytes must be >= 0, got {threshold_bytes}")
        super().__init__(upstream)
        self.threshold_bytes = threshold_bytes
        self.address_alignment_bytes = upstream.address_alignment_bytes
        self.queued_bytes = 0
        self.n_deferred_frees = 0
        self._queue: list[int] = []            # upstream ids waiting for the batch
        self._upstream_id: dict[int, int] = {}  # our alloc_id -> upstream alloc_id
        self.queued_alloc_id: dict[int, int] = {}  # upstream id of a queued block -> the alloc_id it had
        # Fresh upstream ids: the program may reuse an id while its old block still sits in the queue.
        self._next_upstream_id = 0

    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        upstream_id = self._next_upstream_id
        self._next_upstream_id += 1
        addr = self.upstream.malloc(upstream_id, size_bytes, stream)
        self._upstream_id[alloc_id] = upstream_id
        return addr, self.upstream.live[upstream_id][2]

    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        upstream_id = self._upstream_id.pop(alloc_id)
        if self.threshold_bytes <= 1:
            self.upstream.free(upstream_id)
            return
        self._queue.append(upstream_id)
        self.queued_alloc_id[upstream_id] = alloc_id
        self.queued_bytes += allocated_bytes
        self.n_deferred_frees += 1
        if self.queued_bytes >= self.threshold_bytes:
            self.flush()

    def flush(self) -> None:
        """Free every queued block in the upstream now (one GC batch)."""
        if not self._queue:
            return
        queue, self._queue = self._queue, []
        self.queued_bytes = 0
        self.queued_alloc_id.clear()
        for upstream_id in queue:
            self.upstream.free(upstream_id)
        self.n_gc_batches += 1

    def empty_cache(self) -> None:
        """Flush the queue, then release the upstream's cache."""
        self.flush()
        self.upstream.empty_cache()

    # ------------------------------------------------------------------ reporting
    def cached_free_bytes(self) -> int:
        """Upstream's cached free bytes plus the queue: memory the program no longer uses."""
        return self.upstream.cached_free_bytes() + self.queued_bytes

    def largest_free_block_bytes(self) -> int:
        return self.upstream.largest_free_block_bytes()

    def stranded_bytes(self, stream: int | None = None) -> int:
        """The upstream's stranded bytes (0 when it has no per-stream pools)."""
        inner = getattr(self.upstream, "stranded_bytes", None)
        return inner(stream) if inner is not None else 0

    def params(self) -> dict[str, Any]:
        return {"threshold_bytes": self.threshold_bytes,
                "inner": {"name": self.upstream.name, **self.upstream.params()}}

    def check_invariants(self) -> None:
        """Check the queue against the upstream: queued blocks are still allocated there."""
        super().check_invariants()
        self.upstream.check_invariants()
        assert len(self.upstream.live) == len(self.live) + len(self._queue), "upstream live set drifted"
        assert self.upstream.allocated_bytes == self.allocated_bytes + self.queued_bytes, "queued bytes drifted"
        assert self.queued_bytes == sum(self.upstream.live[i][2] for i in self._queue), "queued_bytes drifted"
