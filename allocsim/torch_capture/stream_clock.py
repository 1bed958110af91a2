"""When a block freed with ``record_stream`` uses goes back to the allocator, on the capture's clock: ``StreamClock``.

PyTorch's caching allocator keeps a block freed while other streams recorded uses of it
(``Tensor.record_stream``, ``recordStream`` in c10/cuda/CUDACachingAllocator.cpp): at the free it
records an event on each of those streams (``insert_events``) and hands the block back once every
event has completed (``process_events``, at the start of each later ``malloc``). A CPU capture
cannot time the GPU, so the rule here is the latest moment that ordering allows: **the block goes
back when the host can know that the work those streams had queued before the free is done** —
the program synchronised the device (``torch.cuda.synchronize``), one of those streams
(``Stream.synchronize``), an event recorded on them after the free (``Event.synchronize`` /
``query``), or a stream that waited for them (``wait_stream`` / ``wait_event``, then that
stream's ``synchronize`` or a read-back on it: ``item()``, ``cpu()``...). Blocks still held when
the script ends go back then. A replay therefore never reuses such a block earlier than the GPU
run could; the GPU run may reuse it earlier, when its stream has already run that work.

The clock: every recorded request, free and stream operation advances a sequence number; each
stream knows, per other stream, the last sequence number that is ordered before its own work (a
vector clock), joined by ``wait_stream`` / ``wait_event``; the host knows per stream the last
sequence number known done.
"""

from __future__ import annotations

import threading
from typing import Callable


class StreamClock:
    """Vector clocks of the capture's streams and what the host knows is done (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seq = 0
        self._ordered: dict[int, dict[int, int]] = {}      # stream -> {stream: seq ordered before its work}
        self.done: dict[int, int] = {}                     # stream -> seq known done by the host
        # block address -> (its stream, {stream: seq its uses there had reached at the free})
        self._pending: dict[int, tuple[int, dict[int, int]]] = {}

    def tick(self) -> int:
        with self._lock:
            self.seq += 1
            return self.seq

    def _point(self, stream: int) -> dict[int, int]:
        """What is ordered before the current point of ``stream``: its own work so far and what it waited for."""
        point = dict(self._ordered.get(stream, {}))
        point[stream] = self.seq
        return point

    # ---------------------------------------------------------------- frees with recorded uses
    def defer(self, addr: int, stream: int, uses: set[int]) -> None:
        """The block at ``addr`` (of ``stream``) was freed while ``uses`` (other streams) recorded uses of it."""
        with self._lock:
            self.seq += 1
            self._pending[addr] = (stream, {u: self.seq for u in uses})

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _ready(self) -> list[tuple[int, int]]:
        out = []
        for addr, (stream, needs) in list(self._pending.items()):
            if all(self.done.get(u, 0) >= seq for u, seq in needs.items()):
                out.append((addr, stream))
                del self._pending[addr]
        return out

    def release_all(self) -> list[tuple[int, int]]:
        """Every held block (the script ended: the device is idle)."""
        with self._lock:
            out = [(addr, stream) for addr, (stream, _needs) in self._pending.items()]
            self._pending.clear()
            return out

    # ---------------------------------------------------------------- what the host learns
    def _learn(self, point: dict[int, int]) -> list[tuple[int, int]]:
        for stream, seq in point.items():
            if seq > self.done.get(stream, 0):
                self.done[stream] = seq
        return self._ready() if self._pending else []

    def device_synchronized(self) -> list[tuple[int, int]]:
        """``torch.cuda.synchronize()``: all work on every stream is done. Returns the blocks that go back."""
        with self._lock:
            self.seq += 1
            streams = set(self._ordered) | {u for _s, needs in self._pending.values() for u in needs} | {0}
            return self._learn({s: self.seq for s in streams})

    def stream_synchronized(self, stream: int) -> list[tuple[int, int]]:
        """``stream.synchronize()`` (or a read-back on it): its work and what it waited for are done."""
        with self._lock:
            self.seq += 1
            return self._learn(self._point(stream))

    def event_recorded(self, stream: int) -> dict[int, int]:
        """``event.record(stream)``: the event's point, to keep on the event."""
        with self._lock:
            self.seq += 1
            return self._point(stream)

    def event_synchronized(self, point: dict[int, int] | None) -> list[tuple[int, int]]:
        """``event.synchronize()`` / ``query()`` answered True: the work before its record is done."""
        if not point:
            return []
        with self._lock:
            return self._learn(point)

    def stream_waits(self, stream: int, point: dict[int, int] | None) -> None:
        """``stream.wait_event(event)`` / ``stream.wait_stream(other)``: its later work follows ``point``."""
        if not point:
            return
        with self._lock:
            ordered = self._ordered.setdefault(stream, {})
            for s, seq in point.items():
                if seq > ordered.get(s, 0):
                    ordered[s] = seq

    def stream_point(self, stream: int) -> dict[int, int]:
        with self._lock:
            self.seq += 1
            return self._point(stream)


def released(blocks: list[tuple[int, int]], send: Callable[[list], None], now_ns: Callable[[], int]) -> None:
    """Send the ``K`` (free completed) record of each block that goes back."""
    for addr, stream in blocks:
        send(["K", now_ns(), addr, stream])
