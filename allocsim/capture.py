"""Record a real CuPy workload's allocations as an allocsim ``Trace``: ``with capture_cupy("run.parquet") as cap:``.

Two ways to listen, both installed only inside the ``with`` block and removed after it:

``mode="allocator"`` (default)
    ``cupy.cuda.set_allocator`` gets a function that calls the allocator that was current (the
    default ``MemoryPool``, a ``MemoryAsyncPool``, or anything else), records the request, and
    hands CuPy a ``MemoryPointer`` over ``UnownedMemory`` whose owner is a small object holding the
    real pointer. When CuPy drops the last reference to the memory, the owner is collected: its
    ``__del__`` records the free, then lets the real pointer go back to its allocator. Works with any
    allocator; sees what the program asks for (sizes as requested).
``mode="hook"``
    a ``cupy.cuda.memory_hook.MemoryHook`` (``malloc_postprocess`` = a request served by the
    pool, ``free_preprocess`` = a chunk returned to the pool, ``alloc_postprocess`` = the pool's
    own cudaMalloc, kept as a ``segment_alloc`` decision). Works only with CuPy's ``MemoryPool``
    (the hooks are not called by ``MemoryAsyncPool`` or the raw allocator) and only in the thread
    that entered the block (CuPy keeps hooks per thread).

Each record carries ``time.perf_counter_ns()`` since the block began, the current stream at
allocation (``cupy.cuda.get_current_stream().ptr``, numbered 0, 1, ... in order of first use,
the legacy default stream being 0; a free is recorded on its allocation's stream, which is the
arena CuPy returns it to), and the device. Zero-byte requests are not recorded (CuPy serves them
without memory). Allocations still alive when the block ends stay live in the trace.

CuPy is imported when a capture starts, never at module import; without it ``capture_cupy``
raises ``AllocsimError``. After the block, ``cap.trace`` is the ``Trace`` (format
``cupy-capture``), also written to ``path`` (Parquet, or CSV for ``.csv``) when one was given.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

from .errors import AllocsimError
from .trace.reading.builder import TraceBuilder
from .trace.schema import Trace

FORMAT = "cupy-capture"
_HOOK_NAME = "allocsim_capture"


def _import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415
    except ImportError as exc:
        raise AllocsimError(f"capture_cupy needs CuPy (pip install cupy-cuda12x or cupy-cuda13x): {exc}") from None
    return cupy


class _Owner:
    """Holds the real pointer of one captured allocation; its collection is the allocation's free."""

    __slots__ = ("capture", "inner", "key", "__weakref__")

    def __init__(self, capture: "CupyCapture", inner: Any, key: tuple[int, int, int]):
        self.capture = capture
        self.inner = inner
        self.key = key

    def __del__(self) -> None:
        capture = self.capture
        if capture is not None:
            capture._record_free(self.key)
        self.capture = None
        self.inner = None   # now the real pointer goes back to its allocator


class CupyCapture:
    """The state of one capture; ``trace`` is set when the ``with`` block ends."""

    def __init__(self, path: str | None = None, *, mode: str = "allocator"):
        if mode not in ("allocator", "hook"):
            raise ValueError(f"mode must be 'allocator' or 'hook', got {mode!r}")
        self.path = path
        self.mode = mode
        self.trace: Trace | None = None
        self.builder = TraceBuilder(path or FORMAT, FORMAT)
        self._lock = threading.RLock()
        self._t0 = 0
        self._record = 0
        self._streams: dict[int, int] = {}
        self._active = False
        self._cupy: Any = None
        self._previous_allocator: Any = None
        self._hook: Any = None
        self._alloc_stream: dict[tuple[int, int], int] = {}   # (device, ptr) -> stream of live allocations
        self.n_allocs = 0
        self.n_frees = 0
        self.n_zero_byte = 0
        self.n_segment_allocs = 0

    # ------------------------------------------------------------------ recording
    def _now(self) -> int:
        return time.perf_counter_ns() - self._t0

    def _stream_id(self) -> int:
        try:
            ptr = int(self._cupy.cuda.get_current_stream().ptr)
        except Exception:
            ptr = 0
        sid = self._streams.get(ptr)
        if sid is None:
            sid = 0 if ptr == 0 else len([p for p in self._streams if p != 0]) + 1
            self._streams[ptr] = sid
        return sid

    def _record_alloc(self, device: int, ptr: int, size: int) -> None:
        with self._lock:
            if not self._active:
                return
            stream = self._stream_id()
            self._record += 1
            self.builder.alloc(self._record, self._now(), device, stream, ptr, size)
            self._alloc_stream[(device, ptr)] = stream
            self.n_allocs += 1

    def _record_free(self, key: tuple[int, int, int]) -> None:
        device, ptr, _size = key
        with self._lock:
            if not self._active:
                return
            stream = self._alloc_stream.pop((device, ptr), None)
            if stream is None:
                return
            self._record += 1
            self.builder.free(self._record, self._now(), device, stream, ptr)
            self.n_frees += 1

    # ------------------------------------------------------------------ allocator mode
    def _make_allocator(self):
        cupy = self._cupy
        memory = cupy.cuda.memory
        inner_alloc = self._previous_allocator
        unowned, pointer_cls = memory.UnownedMemory, memory.MemoryPointer

        def allocsim_capture_malloc(size: int):
            inner = inner_alloc(size) if inner_alloc is not None else memory._malloc(size)
            if size == 0 or int(inner.ptr) == 0:
                self.n_zero_byte += size == 0
                return inner
            device = int(getattr(inner, "device_id", 0))
            ptr = int(inner.ptr)
            key = (device, ptr, int(size))
            self._record_alloc(device, ptr, int(size))
            owner = _Owner(self, inner, key)
            return pointer_cls(unowned(ptr, size, owner, device), 0)

        return allocsim_capture_malloc

    # ------------------------------------------------------------------ hook mode
    def _make_hook(self):
        cupy = self._cupy
        base = cupy.cuda.memory_hook.MemoryHook
        capture = self

        class _CaptureHook(base):
            name = _HOOK_NAME

            def malloc_postprocess(self, **kw: Any) -> None:
                ptr, size = int(kw.get("mem_ptr") or 0), int(kw.get("size") or 0)
                if ptr == 0 or size == 0:
                    capture.n_zero_byte += size == 0
                    return
                capture._record_alloc(int(kw.get("device_id", 0)), ptr, size)

            def free_preprocess(self, **kw: Any) -> None:
                ptr = int(kw.get("mem_ptr") or 0)
                if ptr:
                    capture._record_free((int(kw.get("device_id", 0)), ptr, int(kw.get("mem_size") or 0)))

            def alloc_postprocess(self, **kw: Any) -> None:
                ptr = int(kw.get("mem_ptr") or 0)
                if not ptr:
                    return
                with capture._lock:
                    if capture._active:
                        capture.n_segment_allocs += 1
                        capture.builder.decision(capture.builder.next_event_index, capture._now(),
                                                 "segment_alloc", ptr, int(kw.get("mem_size") or 0),
                                                 capture._stream_id(), int(kw.get("device_id", 0)))

        return _CaptureHook()

    # ------------------------------------------------------------------ start / stop
    def start(self) -> "CupyCapture":
        self._cupy = _import_cupy()
        self._t0 = time.perf_counter_ns()
        self._active = True
        if self.mode == "allocator":
            get_allocator = getattr(self._cupy.cuda, "get_allocator", None)
            self._previous_allocator = (get_allocator() if get_allocator is not None
                                        else self._cupy.get_default_memory_pool().malloc)
            self._cupy.cuda.set_allocator(self._make_allocator())
        else:
            self._hook = self._make_hook()
            self._hook.__enter__()
        return self

    def stop(self) -> Trace:
        with self._lock:
            self._active = False
        if self.mode == "allocator":
            self._cupy.cuda.set_allocator(self._previous_allocator)
        elif self._hook is not None:
            self._hook.__exit__(None, None, None)
        meta = self.builder.meta
        meta.version_hints.update({"cupy": str(getattr(self._cupy, "__version__", "?")), "capture_mode": self.mode})
        meta.notes.append(f"captured with allocsim.capture.capture_cupy(mode={self.mode!r}); times are "
                          "perf_counter_ns since the capture began")
        if self._streams:
            meta.notes.append("streams: " + ", ".join(f"{sid} = {ptr:#x}" for ptr, sid in
                                                      sorted(self._streams.items(), key=lambda kv: kv[1])))
        if self.n_zero_byte:
            meta.notes.append(f"{self.n_zero_byte} zero-byte requests were not recorded")
        if self.mode == "hook":
            meta.notes.append(f"{self.n_segment_allocs} pool cudaMallocs kept as segment_alloc decisions")
        self.trace = self.builder.finish()
        if self.path:
            from .trace import write_trace

            write_trace(self.trace, self.path)
        return self.trace


@contextlib.contextmanager
def capture_cupy(path: str | None = None, *, mode: str = "allocator") -> Iterator[CupyCapture]:
    """Record every CuPy allocation made inside the block; ``cap.trace`` holds the result afterwards."""
    cap = CupyCapture(path, mode=mode)
    cap.start()
    try:
        yield cap
    finally:
        cap.stop()


__all__ = ["capture_cupy", "CupyCapture", "FORMAT"]
