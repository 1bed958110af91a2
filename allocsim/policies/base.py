"""The contract every allocator policy meets: subclass ``Policy`` and write ``_do_malloc`` / ``_do_free``.

A policy is plain synchronous state (no SimPy, no clock). The engine calls, per trace event:

- ``malloc(alloc_id, size_bytes, stream) -> addr`` for an allocation request;
- ``free_requested(alloc_id)`` when the program frees it (its stream may still be using it);
- ``free_completed(alloc_id)`` when the memory may be reused (stream-ordered free done);
- ``empty_cache()`` for the program's explicit cache release.

The base class does the bookkeeping once (live ids, requested/allocated bytes, double-free and
unknown-id checks), so no policy can forget to report. Adaptors (deferred GC, limits) are policies
whose ``upstream`` is another policy; the bottom of every stack is a ``SimulatedDevice``.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from ..errors import InvalidFree, OutOfMemory


class ReplayRun:
    """A stretch of trace events a policy may replay in one call (``Policy.replay_run``), and where to write.

    The engine fills it, calls ``policy.replay_run(run)``, and the policy executes events
    ``pos, pos + 1, ...`` of the columns itself for as long as each is one it can do without
    the device and without anything the engine must see (see ``Policy.replay_run``), advancing
    ``pos`` and ``row`` and writing each event's sample row. It stops at (and leaves) the first
    other event; the engine runs that one through the per-event methods and calls again.

    Untimed (fast mode) it writes ``requested``/``active``/``pending`` where the event changes
    them, exactly as the engine's loop would (``reserved`` cannot change, so it stays unwritten and
    is forward-filled). Timed (SimPy mode, ``timed`` True) it also plays the stream's clock: it
    stops before an event in ``special`` (a cross-stream dependency) or one whose issue time
    ``t_ns + delay_ns`` is not before ``due_ns`` (another SimPy event is due first); each event it
    runs is issued at ``max(now_ns, t_ns + delay_ns)``, costs ``quiet_ns[kind]`` (no device call)
    and fills ``event_index``/``sim_t_ns``/``latency_ns``; it leaves ``delay_ns``/``now_ns`` updated.
    """

    __slots__ = ("kind", "alloc_id", "size_bytes", "stream", "pos", "row", "requested", "active", "pending",
                 "timed", "index", "t_ns", "special", "due_ns", "delay_ns", "now_ns", "quiet_ns",
                 "event_index", "sim_t_ns", "latency_ns")

    def __init__(self, requested: Any, active: Any, pending: Any) -> None:
        self.requested, self.active, self.pending = requested, active, pending   # writable int64 views
        # The columns: sequences of ints indexed by position (lists, or integer memoryviews that a
        # compiled replay_run reads in place).
        self.kind: Any = []
        self.alloc_id: Any = []
        self.size_bytes: Any = []
        self.stream: Any = []
        self.pos = 0                       # next event of the chunk to run
        self.row = 0                       # its sample row
        self.timed = False
        self.index: Any = []               # timed only: trace event index and time of each chunk event
        self.t_ns: Any = []
        self.special: frozenset[int] | set[int] = frozenset()
        self.due_ns: float = float("inf")
        self.delay_ns = 0
        self.now_ns = 0
        self.quiet_ns: list[int] = []
        self.event_index: Any = None
        self.sim_t_ns: Any = None
        self.latency_ns: Any = None


class Policy:
    """Base class of allocator policies and adaptors; ``upstream`` is a policy or a ``SimulatedDevice``."""

    #: Registry name (``allocsim run --policy NAME``).
    name: ClassVar[str] = "base"
    #: Every address this policy hands out is a multiple of this (the conformance battery checks it).
    address_alignment_bytes: int = 512
    #: Optional batch fast path, ``replay_run(run: ReplayRun) -> None``: execute the run's events from
    #: ``run.pos`` on while each is one that makes no device call and changes no counter the cost
    #: model reads, with exactly the state changes the per-event methods would make (a pool hit, a
    #: free request, a completed free). None: the engine calls the per-event methods. The pool
    #: policies get one from the compiled kernel (``kernel.attach``); their reference route has none.
    replay_run: Callable[[ReplayRun], None] | None = None

    def __init__(self, upstream: Any):
        self.upstream = upstream
        self.device = upstream.device
        # alloc_id -> (addr, requested_bytes, allocated_bytes, stream)
        self.live: dict[int, tuple[int, int, int, int]] = {}
        self.pending: set[int] = set()   # free requested, not completed
        self.requested_bytes = 0          # sum of requested sizes of live + pending allocations
        self.allocated_bytes = 0          # sum of block sizes handed out (after rounding), live + pending
        self.pending_free_bytes = 0       # block bytes freed by the program but not yet reusable
        self.n_mallocs = 0
        self.n_ooms = 0
        # Counters policies increment where the event happens (read by metrics, never reset).
        self.n_pool_hits = 0      # requests served from cached memory without a device call
        self.n_splits = 0         # blocks split to serve a request
        self.n_merges = 0         # coalescings of a freed block with a free neighbour
        self.n_gc_batches = 0     # batched releases (deferred GC, garbage_collection_threshold)
        # Skip the call to the empty default hook (free_requested runs once per trace event in three).
        self._hooks_free_requested = type(self)._on_free_requested is not Policy._on_free_requested

    # ------------------------------------------------------------------ program-facing API
    def malloc(self, alloc_id: int, size_bytes: int, stream: int = 0) -> int:
        """Allocate ``size_bytes`` for ``alloc_id`` on ``stream``; return its address or raise ``OutOfMemory``."""
        if alloc_id in self.live:
            raise InvalidFree(f"allocation id {alloc_id} is already live")
        try:
            addr, allocated = self._do_malloc(alloc_id, size_bytes, stream)
        except OutOfMemory:
            self.n_ooms += 1
            raise
        self.live[alloc_id] = (addr, size_bytes, allocated, stream)
        self.requested_bytes += size_bytes
        self.allocated_bytes += allocated
        self.n_mallocs += 1
        return addr

    def free_requested(self, alloc_id: int) -> None:
        """The program freed ``alloc_id``; its memory is reusable only after ``free_completed``."""
        entry = self.live.get(alloc_id)
        pending = self.pending
        if entry is None or alloc_id in pending:
            raise InvalidFree(f"free of allocation id {alloc_id} which is not allocated")
        pending.add(alloc_id)
        self.pending_free_bytes += entry[2]
        if self._hooks_free_requested:
            self._on_free_requested(alloc_id)

    def free_completed(self, alloc_id: int) -> None:
        """The stream-ordered free of ``alloc_id`` finished: hand the block back to the policy."""
        pending = self.pending
        if alloc_id not in pending:
            if alloc_id not in self.live:
                raise InvalidFree(f"free of allocation id {alloc_id} which is not allocated")
            self.free_requested(alloc_id)
        pending.discard(alloc_id)
        addr, requested, allocated, stream = self.live.pop(alloc_id)
        self.pending_free_bytes -= allocated
        self.requested_bytes -= requested
        self.allocated_bytes -= allocated
        self._do_free(alloc_id, addr, allocated, stream)

    def free(self, alloc_id: int) -> None:
        """Free that is requested and completed at once."""
        self.free_requested(alloc_id)
        self.free_completed(alloc_id)

    def empty_cache(self) -> None:
        """Release every cached, fully free device allocation (``torch.cuda.empty_cache()``)."""

    # ------------------------------------------------------------------ what subclasses write
    def _do_malloc(self, alloc_id: int, size_bytes: int, stream: int) -> tuple[int, int]:
        """Return ``(addr, allocated_bytes)`` or raise ``OutOfMemory`` after the policy's retry path."""
        raise NotImplementedError

    def _do_free(self, alloc_id: int, addr: int, allocated_bytes: int, stream: int) -> None:
        """Take back the block at ``addr`` (its free has completed)."""
        raise NotImplementedError

    def _on_free_requested(self, alloc_id: int) -> None:
        """Hook for policies that act when a free is requested (default: nothing)."""

    # ------------------------------------------------------------------ reporting
    @property
    def reserved_bytes(self) -> int:
        """Bytes held from the device by this stack."""
        return self.device.reserved_bytes

    def largest_free_block_bytes(self) -> int:
        """Largest cached free block (0 for policies that cache nothing); may be O(blocks)."""
        return 0

    def cached_free_bytes(self) -> int:
        """Bytes reserved from the device but not handed out (reserved - allocated, for this stack)."""
        return self.reserved_bytes - self.allocated_bytes

    def params(self) -> dict[str, Any]:
        """The policy's parameters as a JSON-ready dict (what ``allocsim policies`` prints)."""
        return {}

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the bookkeeping is inconsistent (O(live blocks): for tests).

        Subclasses extend it with their own structures and call ``super().check_invariants()``.
        """
        assert self.requested_bytes == sum(v[1] for v in self.live.values()), "requested_bytes drifted"
        assert self.allocated_bytes == sum(v[2] for v in self.live.values()), "allocated_bytes drifted"
        assert self.pending <= self.live.keys(), "a pending free is not live"
        assert self.pending_free_bytes == sum(self.live[i][2] for i in self.pending), "pending_free_bytes drifted"
