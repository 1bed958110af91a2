"""``allocsim.capture.capture_cupy``: a fake minimal ``cupy`` drives the same allocator and hook code paths.

The fake has what the capture touches: ``cuda.get_allocator``/``set_allocator``, ``cuda.memory``'s
``MemoryPointer`` and ``UnownedMemory`` (which keeps its owner alive, as CuPy's does), a pool whose
chunks go back when their memory object dies, ``cuda.get_current_stream().ptr``, and
``cuda.memory_hook.MemoryHook`` with the pool calling ``malloc_postprocess`` / ``free_preprocess`` /
``alloc_postprocess`` as CuPy's ``SingleDeviceMemoryPool`` does. The real-GPU test is marked ``gpu``.
"""

from __future__ import annotations

import gc
import sys
import types

import pytest

from allocsim.capture import capture_cupy
from allocsim.errors import AllocsimError
from allocsim.trace import EventKind, read_trace


# ---------------------------------------------------------------------- the fake cupy
def make_fake_cupy():
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "0.0-fake"
    cuda = types.ModuleType("cupy.cuda")
    memory = types.ModuleType("cupy.cuda.memory")
    memory_hook = types.ModuleType("cupy.cuda.memory_hook")
    cupy.cuda = cuda
    cuda.memory = memory
    cuda.memory_hook = memory_hook
    hooks: dict[str, object] = {}

    class MemoryHook:
        name = "base"

        def __enter__(self):
            if self.name in hooks:
                raise KeyError(self.name)
            hooks[self.name] = self
            return self

        def __exit__(self, *exc):
            del hooks[self.name]

        def malloc_postprocess(self, **kw):
            pass

        def free_preprocess(self, **kw):
            pass

        def alloc_postprocess(self, **kw):
            pass

    def call_hooks(method, **kw):
        for hook in list(hooks.values()):
            getattr(hook, method)(**kw)

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            state["stream"] = self
            return self

        def __exit__(self, *exc):
            state["stream"] = null

    null = Stream(0)
    state = {"stream": null}

    class PooledMemory:
        def __init__(self, pool, ptr, size):
            self.pool, self.ptr, self.size, self.device_id = pool, ptr, size, 0

        def __del__(self):
            call_hooks("free_preprocess", device_id=0, mem_size=self.size, mem_ptr=self.ptr, pmem_id=id(self))
            self.pool.free_chunks.append((self.ptr, self.size))
            self.pool.returned.append(self.ptr)

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, max(device_id, 0)

    class Pool:
        def __init__(self):
            self.next = 0x7000_0000_0000
            self.free_chunks: list[tuple[int, int]] = []
            self.returned: list[int] = []
            self.device_mallocs = 0

        def malloc(self, size):
            if size == 0:
                return _zero()
            rounded = -(-size // 512) * 512
            for i, (ptr, chunk) in enumerate(self.free_chunks):
                if chunk == rounded:
                    del self.free_chunks[i]
                    break
            else:
                ptr = self.next
                self.next += rounded
                self.device_mallocs += 1
                call_hooks("alloc_postprocess", device_id=0, mem_size=rounded, mem_ptr=ptr)
            mem = PooledMemory(self, ptr, rounded)
            call_hooks("malloc_postprocess", device_id=0, size=size, mem_size=rounded, mem_ptr=ptr,
                       pmem_id=id(mem))
            return MemoryPointer(mem, 0)

    class _ZeroMem:
        ptr, size, device_id = 0, 0, 0

    def _zero():
        return MemoryPointer(_ZeroMem(), 0)

    pool = Pool()
    current = {"alloc": pool.malloc}
    cuda.get_allocator = lambda: current["alloc"]

    def set_allocator(fn=None):
        current["alloc"] = fn or pool.malloc

    cuda.set_allocator = set_allocator
    cuda.get_current_stream = lambda: state["stream"]
    cuda.Stream = Stream
    memory.MemoryPointer = MemoryPointer
    memory.UnownedMemory = UnownedMemory
    memory_hook.MemoryHook = MemoryHook
    cupy.get_default_memory_pool = lambda: pool

    class ndarray:
        """What an array does with memory: ask the current allocator, hold the pointer."""

        def __init__(self, nbytes):
            self.data = current["alloc"](nbytes)

    cupy.ndarray = ndarray
    cupy._pool = pool
    cupy._hooks = hooks
    return cupy


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.memory", cupy.cuda.memory)
    monkeypatch.setitem(sys.modules, "cupy.cuda.memory_hook", cupy.cuda.memory_hook)
    return cupy


def _events(trace):
    ev = trace.events
    return list(zip(ev["kind"].tolist(), ev["alloc_id"].tolist(), ev["size_bytes"].tolist(), ev["stream"].tolist()))


# ---------------------------------------------------------------------- allocator mode
def test_allocator_mode_records_allocs_frees_streams_and_restores(fake_cupy, tmp_path):
    cp = fake_cupy
    original = cp.cuda.get_allocator()
    path = tmp_path / "cap.parquet"
    with capture_cupy(str(path)) as cap:
        a = cp.ndarray(1000)
        b = cp.ndarray(4096)
        with cp.cuda.Stream(0xABC):
            c = cp.ndarray(2048)
        z = cp.ndarray(0)
        real_a = a.data.ptr
        del a
        gc.collect()
        assert real_a in cp._pool.returned           # the real chunk went back to the pool ...
        d = cp.ndarray(1000)                         # ... and is reused at the same address
        assert d.data.ptr == real_a
        del b, c
    assert cp.cuda.get_allocator() is original       # the allocator is restored
    del d, z
    gc.collect()                                     # frees after the block are not recorded
    trace = cap.trace
    kinds = trace.column("kind").tolist()
    assert kinds.count(EventKind.ALLOC) == 4
    assert kinds.count(EventKind.FREE_REQUESTED) == kinds.count(EventKind.FREE_COMPLETED) == 3
    evs = _events(trace)
    allocs = [(aid, size, stream) for k, aid, size, stream in evs if k == EventKind.ALLOC]
    assert [s for _, s, _ in allocs] == [1000, 4096, 2048, 1000]   # requested sizes, zero bytes skipped
    assert [st for _, _, st in allocs] == [0, 0, 1, 0]              # streams numbered in order of use
    # the free of c is on c's stream; ids are distinct even though d reused a's address
    frees = [(aid, stream) for k, aid, _s, stream in evs if k == EventKind.FREE_COMPLETED]
    assert (allocs[2][0], 1) in frees
    assert len({aid for aid, _, _ in allocs}) == 4
    t = trace.column("t_ns")
    assert (t[1:] >= t[:-1]).all()
    assert trace.meta.format == "cupy-capture" and trace.meta.version_hints["capture_mode"] == "allocator"
    assert any("zero-byte" in n for n in trace.meta.notes)
    again = read_trace(path)
    assert again.events.equals(trace.events)


def test_allocator_mode_wrapped_pointer_keeps_memory_alive(fake_cupy):
    cp = fake_cupy
    with capture_cupy() as cap:
        a = cp.ndarray(512)
        view = a.data            # another reference to the same memory, like an array view
        del a
        gc.collect()
        assert cap.n_frees == 0 and cp._pool.returned == []
        del view
        gc.collect()
        assert cap.n_frees == 1 and len(cp._pool.returned) == 1


def test_capture_stops_even_if_the_block_raises(fake_cupy):
    cp = fake_cupy
    original = cp.cuda.get_allocator()
    with pytest.raises(RuntimeError):
        with capture_cupy() as cap:
            cp.ndarray(100)
            raise RuntimeError("boom")
    assert cp.cuda.get_allocator() is original
    assert cap.trace is not None and cap.n_allocs == 1


# ---------------------------------------------------------------------- hook mode
def test_hook_mode_records_pool_requests_and_segment_decisions(fake_cupy):
    cp = fake_cupy
    with capture_cupy(mode="hook") as cap:
        assert "allocsim_capture" in cp._hooks
        a = cp.ndarray(1000)
        del a
        gc.collect()
        b = cp.ndarray(1000)     # served from the pool: no new segment
        c = cp.ndarray(8192)
    assert cp._hooks == {}
    trace = cap.trace
    kinds = trace.column("kind").tolist()
    assert kinds.count(EventKind.ALLOC) == 3 and kinds.count(EventKind.FREE_COMPLETED) == 1
    assert list(trace.decisions["action"]) == ["segment_alloc", "segment_alloc"]
    assert cap.n_segment_allocs == cp._pool.device_mallocs == 2
    del b, c


def test_bad_mode_and_missing_cupy(monkeypatch):
    with pytest.raises(ValueError):
        capture_cupy(mode="nope").__enter__()
    monkeypatch.setitem(sys.modules, "cupy", None)   # import cupy -> ImportError
    with pytest.raises(AllocsimError, match="needs CuPy"):
        with capture_cupy():
            pass


# ---------------------------------------------------------------------- real GPU
@pytest.mark.gpu
def test_real_cupy_capture_replays(tmp_path):
    from validate.devices import gpu_available

    if not gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    import cupy as cp

    from allocsim.engine import simulate

    with capture_cupy(str(tmp_path / "mlp.parquet")) as cap:
        x = cp.random.rand(256, 512, dtype=cp.float32)
        w = cp.random.rand(512, 512, dtype=cp.float32)
        for _ in range(3):
            y = cp.maximum(x @ w, 0)
            g = y.T @ x
            w -= 1e-3 * g
        cp.cuda.Device().synchronize()
        del x, w, y, g
    trace = read_trace(tmp_path / "mlp.parquet")
    assert (trace.column("kind") == EventKind.ALLOC).sum() >= 8
    assert cap.n_frees >= 1
    summary = simulate(trace, "cupy", fast=True).summary
    assert summary["completed"]
