"""Real devices under the policies: ``HostDevice`` (host memory) and ``CupyDevice`` (a CUDA GPU via CuPy).

Both have ``SimulatedDevice``'s interface (``malloc``/``free``/``footprint``/``map``/``unmap``/
``reserve_address_space``/``release_address_space``, the same counters, ``reserved_bytes``,
``peak_reserved_bytes``, ``capacity_bytes`` → ``DeviceOutOfMemory``), so any policy from
``allocsim.policies.registry.build_policy`` runs on them unchanged. On top of that they

* really allocate: ``HostDevice`` maps anonymous memory (``mmap``), ``CupyDevice`` calls
  ``cudaMalloc``/``cudaFree`` through ``cupy.cuda.runtime``;
* time every device call with ``time.perf_counter_ns`` (``call_ops``/``call_bytes``/``call_ns``);
* measure the memory really held at every device call, independently of the footprint rule:
  ``measured_bytes``/``peak_measured_bytes`` are ``cudaMemGetInfo``'s drop since the device was
  created (CuPy) or the bytes of live mappings as the kernel sizes them (whole pages, host), and
  ``peak_rss_bytes`` the growth of the process's resident set (host, meaningful with ``touch``);
* count the time spent measuring in ``overhead_ns`` so callers can take it out of latencies.

Addresses. By default a device hands policies the same *virtual* addresses ``SimulatedDevice``
would (in the order the policy asks for: the driver's for the ``pytorch`` preset, creation order
for the others; see ``allocsim.driver_addresses``) and keeps the real pointer of each allocation
(``real_pointer(addr)``). Policies break best-fit ties by address; with real pointers those
tie-breaks would follow where the kernel or driver happened to place each segment, which is
run-to-run noise rather than policy behaviour, and a simulated run could not reproduce them.
``real_addresses=True`` passes the real pointers through instead (to measure that effect).

Expandable segments. ``HostDevice`` emulates cuMemAddressReserve/cuMemMap/cuMemUnmap with
``mmap(PROT_NONE, MAP_NORESERVE)`` / ``mprotect`` (+ populate) / ``madvise(MADV_DONTNEED)``:
mapped pages really become usable memory and unmapped ones really go back. ``CupyDevice`` raises
``NotImplementedError`` for them (the CUDA VMM driver calls are not wired up; use
``expandable_segments=false`` on a GPU, or the host backend).

The footprint rule (``granularity_bytes``, ``small_granularity_bytes``) is the one
``SimulatedDevice`` uses; it drives the counters (``reserved_bytes``), never the measurement. A
calibration file records the rule measured on a device (``_granularity_bytes``,
``_small_granularity_bytes``). With the host's page size as both, the counters equal the
kernel's real mapping sizes.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from typing import Any

from allocsim.device import DEFAULT_GRANULARITY_BYTES, DeviceOutOfMemory, SimulatedDevice
from allocsim.errors import AllocsimError
from allocsim.units import MiB, align_up

#: Kinds of device call in ``RealDevice.call_ops``.
OP_MALLOC, OP_FREE, OP_MAP, OP_UNMAP = 0, 1, 2, 3
OP_NAMES = {OP_MALLOC: "malloc", OP_FREE: "free", OP_MAP: "map", OP_UNMAP: "unmap"}

PAGE_BYTES = mmap.PAGESIZE
#: First virtual address handed to policies (same as ``SimulatedDevice``).
FIRST_VIRTUAL_ADDR = 1 << 40

_perf_ns = time.perf_counter_ns


class GpuUnavailable(AllocsimError):
    """CuPy (or a CUDA device) is not available here."""


def import_cupy():
    """Import CuPy lazily; raise ``GpuUnavailable`` with a one-line reason when it is missing or has no GPU."""
    try:
        import cupy  # noqa: PLC0415
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise GpuUnavailable(f"CuPy is not importable ({type(exc).__name__}: {exc}); install cupy-cuda12x "
                             "or cupy-cuda13x on a machine with an NVIDIA GPU, or use --backend host") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise GpuUnavailable(f"CuPy found no usable CUDA device ({type(exc).__name__}: {exc})") from None
    if count < 1:
        raise GpuUnavailable("CuPy found no CUDA device")
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import_cupy()
    except GpuUnavailable:
        return False
    return True


class RealDevice(SimulatedDevice):
    """What ``HostDevice`` and ``CupyDevice`` share: real memory and timing under ``SimulatedDevice``'s books.

    The footprint rule, capacity checks, counters, addresses and the recorded-run aids are
    ``SimulatedDevice``'s own (so the two cannot drift); this class only backs each call with real
    memory (``_back_*``), times it and measures what the device really holds after it.
    Subclasses write ``_raw_malloc(size) -> (handle, pointer)``, ``_raw_free(handle)`` and
    ``_measure() -> bytes held now`` (and, for expandable segments, ``_raw_reserve``/``_raw_release``/
    ``_raw_map``/``_raw_unmap``).
    """

    backend = "base"

    def __init__(self, capacity_bytes: int | None = None, *, granularity_bytes: int = DEFAULT_GRANULARITY_BYTES,
                 small_granularity_bytes: int | None = None, real_addresses: bool = False):
        if granularity_bytes <= 0 or (small_granularity_bytes is not None and small_granularity_bytes <= 0):
            raise ValueError("granularities must be > 0")
        # Real pointers are the driver's own placement: the simulated one would only shadow them.
        super().__init__(capacity_bytes, granularity_bytes=granularity_bytes,
                         small_granularity_bytes=small_granularity_bytes,
                         address_order="creation" if real_addresses else None)
        self._next_addr = FIRST_VIRTUAL_ADDR
        self.real_addresses = real_addresses
        # Timing and measurement.
        self.call_ops: list[int] = []
        self.call_bytes: list[int] = []
        self.call_ns: list[int] = []
        self.overhead_ns = 0
        self.measured_bytes = 0
        self.peak_measured_bytes = 0
        self.n_samples = 0

    # ------------------------------------------------------------------ real memory behind the books
    def _back_malloc(self, size_bytes: int) -> tuple[Any, int]:
        t0 = _perf_ns()
        try:
            handle, pointer = self._raw_malloc(max(size_bytes, 1))
        finally:
            self._log(OP_MALLOC, size_bytes, _perf_ns() - t0)
        self._on_malloc(size_bytes)
        return handle, pointer

    def _fresh_address(self, footprint: int, backing: object) -> int:
        if self.real_addresses and backing is not None:
            return backing[1]
        return super()._fresh_address(footprint, backing)

    def _back_free(self, backing: object, footprint: int) -> None:
        t0 = _perf_ns()
        self._raw_free(backing[0])
        self._log(OP_FREE, footprint, _perf_ns() - t0)

    def _back_adopt(self, size_bytes: int) -> tuple[Any, int]:
        handle, pointer = self._raw_malloc(size_bytes)   # untimed: not a call the policy made
        self._on_malloc(size_bytes)
        return handle, pointer

    def _back_reserve(self, size_bytes: int, timed: bool = True) -> tuple[Any, int]:
        return self._raw_reserve(size_bytes)

    def _back_release(self, backing: object) -> None:
        self._raw_release(backing[0])

    def _back_map(self, addr: int, size_bytes: int, timed: bool = True) -> None:
        pointer = self.real_pointer(addr)
        if not timed:
            self._raw_map(pointer, size_bytes)
            return
        t0 = _perf_ns()
        try:
            self._raw_map(pointer, size_bytes)
        finally:
            self._log(OP_MAP, size_bytes, _perf_ns() - t0)

    def _back_unmap(self, addr: int, size_bytes: int) -> None:
        pointer = self.real_pointer(addr)
        t0 = _perf_ns()
        self._raw_unmap(pointer, size_bytes)
        self._log(OP_UNMAP, size_bytes, _perf_ns() - t0)

    def _after_call(self) -> None:
        self._sample()

    def real_pointer(self, addr: int) -> int:
        """The real pointer behind an address this device handed out (a segment start or a mapped page)."""
        if addr in self._sizes:
            return self._backing[addr][1]
        for base, size in self._address_spaces.items():
            if base <= addr < base + size:
                return self._backing[base][1] + (addr - base)
        raise KeyError(f"address {addr:#x} was not handed out by this device")

    # ------------------------------------------------------------------ measurement
    def _log(self, op: int, size_bytes: int, ns: int) -> None:
        self.call_ops.append(op)
        self.call_bytes.append(size_bytes)
        self.call_ns.append(ns)

    def _sample(self) -> None:
        t0 = _perf_ns()
        measured = self._measure()
        self.measured_bytes = measured
        if measured > self.peak_measured_bytes:
            self.peak_measured_bytes = measured
        self.n_samples += 1
        self.overhead_ns += _perf_ns() - t0

    def device_call_ns(self) -> int:
        """Total time spent inside device calls so far."""
        return sum(self.call_ns)

    def calls_by_op(self, op: int) -> tuple[list[int], list[int]]:
        """(sizes, latencies) of every call of one kind."""
        pairs = [(b, ns) for o, b, ns in zip(self.call_ops, self.call_bytes, self.call_ns) if o == op]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def close(self) -> None:
        """Free everything still allocated, mapped or reserved (the policy's cache included)."""
        for start in list(self._mapped):
            length = self._drop_mapped(start)
            self._raw_unmap(self.real_pointer(start), length)
            self.reserved_bytes -= length
        for base in list(self._address_spaces):
            del self._address_spaces[base]
            self._occupied_starts.remove(base)
            self._raw_release(self._backing.pop(base)[0])
        for addr in list(self._sizes):
            footprint = self._sizes.pop(addr)
            self._occupied_starts.remove(addr)
            self._raw_free(self._backing.pop(addr)[0])
            self.reserved_bytes -= footprint
        self._sample()

    def describe(self) -> dict[str, Any]:
        """The device's settings, for reports."""
        return {"backend": self.backend, "capacity_bytes": self.capacity_bytes,
                "granularity_bytes": self.granularity_bytes,
                "small_granularity_bytes": self.small_granularity_bytes,
                "real_addresses": self.real_addresses}

    # ------------------------------------------------------------------ what subclasses write
    def _raw_malloc(self, size_bytes: int) -> tuple[Any, int]:
        raise NotImplementedError

    def _raw_free(self, handle: Any) -> None:
        raise NotImplementedError

    def _measure(self) -> int:
        raise NotImplementedError

    def _on_malloc(self, size_bytes: int) -> None:
        """Hook after a successful malloc (measurement bookkeeping)."""

    def _raw_reserve(self, size_bytes: int) -> tuple[Any, int]:
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")

    def _raw_release(self, handle: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")

    def _raw_map(self, pointer: int, size_bytes: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")

    def _raw_unmap(self, pointer: int, size_bytes: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no expandable segments")


# ====================================================================== host memory
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
_PROT_NONE = 0
_MADV_POPULATE_WRITE = 23   # Linux >= 5.14; older kernels answer EINVAL and we write the pages instead
_libc = None


def _get_libc():
    """libc's mmap/mprotect/madvise/munmap through ctypes (for expandable segments on the host)."""
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            for name in ("mprotect", "madvise"):
                getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                getattr(libc, name).restype = ctypes.c_int
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.munmap.restype = ctypes.c_int
        except (OSError, AttributeError) as exc:
            raise NotImplementedError(f"host expandable segments need libc mmap/mprotect/madvise: {exc}") from None
        _libc = libc
    return _libc


def _rss_reader():
    """Return a function giving the process's resident bytes (``/proc/self/statm``), or None."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None

    def read() -> int:
        return int(os.pread(fd, 128, 0).split()[1]) * PAGE_BYTES

    try:
        read()
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None
    return read


class HostDevice(RealDevice):
    """Host memory as a device: one anonymous ``mmap`` per allocation, measured as the kernel sizes it.

    ``measured_bytes`` is the sum of live mapping lengths rounded up to the page size (what the
    kernel really maps), plus mapped expandable pages. With ``touch=True`` every allocation is
    populated (``MAP_POPULATE``, so it is resident memory, and costs page faults like first use
    would); then ``peak_rss_bytes`` (growth of the process's resident set, read at every device
    call) is an independent measurement. Defaults: both granularities are the page size.
    """

    backend = "host"

    def __init__(self, capacity_bytes: int | None = None, *, granularity_bytes: int = PAGE_BYTES,
                 small_granularity_bytes: int | None = None, real_addresses: bool = False,
                 touch: bool = False, sample_rss: bool | None = None):
        super().__init__(capacity_bytes, granularity_bytes=granularity_bytes,
                         small_granularity_bytes=small_granularity_bytes or granularity_bytes,
                         real_addresses=real_addresses)
        self.touch = touch
        self._flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if touch else 0)
        self._mapped_real = 0    # page-rounded lengths of live mmaps
        self._mapped_pages = 0   # bytes of mapped expandable-segment pages
        self._rss = _rss_reader() if (touch if sample_rss is None else sample_rss) else None
        self.rss_baseline_bytes = self._rss() if self._rss else 0
        self.peak_rss_bytes = 0

    def _raw_malloc(self, size_bytes: int) -> tuple[Any, int]:
        try:
            region = mmap.mmap(-1, size_bytes, flags=self._flags)
        except (OSError, MemoryError, OverflowError, ValueError) as exc:
            raise DeviceOutOfMemory(f"host mmap of {size_bytes} bytes failed: {exc}") from None
        view = ctypes.c_char.from_buffer(region)
        pointer = ctypes.addressof(view)
        del view   # an exported buffer would stop close()
        return region, pointer

    def _raw_free(self, handle: Any) -> None:
        self._mapped_real -= align_up(len(handle), PAGE_BYTES)
        handle.close()

    def _on_malloc(self, size_bytes: int) -> None:
        self._mapped_real += align_up(max(size_bytes, 1), PAGE_BYTES)

    def _measure(self) -> int:
        if self._rss is not None:
            rss = self._rss() - self.rss_baseline_bytes
            if rss > self.peak_rss_bytes:
                self.peak_rss_bytes = rss
        return self._mapped_real + self._mapped_pages

    # expandable segments: PROT_NONE reservation, mprotect + populate to map, MADV_DONTNEED to unmap
    def _raw_reserve(self, size_bytes: int) -> tuple[Any, int]:
        libc = _get_libc()
        base = libc.mmap(None, size_bytes, _PROT_NONE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise DeviceOutOfMemory(f"host address reservation of {size_bytes} bytes failed "
                                    f"(errno {ctypes.get_errno()})")
        return (base, size_bytes), base

    def _raw_release(self, handle: Any) -> None:
        base, size_bytes = handle
        _get_libc().munmap(base, size_bytes)

    def _raw_map(self, pointer: int, size_bytes: int) -> None:
        libc = _get_libc()
        if libc.mprotect(pointer, size_bytes, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            raise DeviceOutOfMemory(f"host map of {size_bytes} bytes failed (errno {ctypes.get_errno()})")
        if self.touch and libc.madvise(pointer, size_bytes, _MADV_POPULATE_WRITE) != 0:
            ctypes.memset(pointer, 0, size_bytes)
        self._mapped_pages += size_bytes

    def _raw_unmap(self, pointer: int, size_bytes: int) -> None:
        libc = _get_libc()
        libc.madvise(pointer, size_bytes, _MADV_DONTNEED)
        libc.mprotect(pointer, size_bytes, _PROT_NONE)
        self._mapped_pages -= size_bytes

    def verify_mappings(self) -> int:
        """Check every live allocation against ``/proc/self/maps``; return how many were checked.

        Raises ``AssertionError`` when a live allocation is not covered by a kernel mapping of at
        least its page-rounded length (a check that the harness really holds what it counts).
        """
        spans: list[tuple[int, int]] = []
        with open("/proc/self/maps", encoding="ascii", errors="replace") as fh:
            for line in fh:
                lo, hi = line.split(None, 1)[0].split("-")
                spans.append((int(lo, 16), int(hi, 16)))
        spans.sort()
        import bisect

        starts = [s for s, _ in spans]
        checked = 0
        for addr in self._sizes:
            handle, pointer = self._backing[addr]
            need_end = pointer + align_up(len(handle), PAGE_BYTES)
            i = bisect.bisect_right(starts, pointer) - 1
            assert i >= 0 and spans[i][0] <= pointer and spans[i][1] >= need_end, \
                f"allocation at {pointer:#x} ({len(handle)} B) is not mapped by the kernel"
            checked += 1
        return checked

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(page_bytes=PAGE_BYTES, touch=self.touch)
        return out


# ====================================================================== CUDA through CuPy
class CupyDevice(RealDevice):
    """A CUDA GPU: ``cudaMalloc``/``cudaFree`` via ``cupy.cuda.runtime``, measured with ``cudaMemGetInfo``.

    ``measured_bytes`` is how far the device's free memory has dropped since this object was
    created (sampled after every device call), so it includes whatever the driver really
    reserves: page rounding and the packing of small allocations. The footprint rule only drives
    the counters; take it from a calibration file to make them comparable. Expandable segments
    (``map``/``unmap``) raise ``NotImplementedError``.
    """

    backend = "cupy"

    def __init__(self, capacity_bytes: int | None = None, *, granularity_bytes: int = DEFAULT_GRANULARITY_BYTES,
                 small_granularity_bytes: int | None = None, real_addresses: bool = False, device_id: int = 0):
        super().__init__(capacity_bytes, granularity_bytes=granularity_bytes,
                         small_granularity_bytes=small_granularity_bytes, real_addresses=real_addresses)
        cp = import_cupy()
        self._cp = cp
        self._rt = cp.cuda.runtime
        self.device_id = device_id
        cp.cuda.Device(device_id).use()
        self._rt.deviceSynchronize()   # the context exists before the baseline is taken
        self._oom_status = getattr(self._rt, "errorMemoryAllocation", 2)
        free, total = self._rt.memGetInfo()
        self.total_device_bytes = int(total)
        self.baseline_free_bytes = int(free)

    def rebaseline(self) -> None:
        """Take the current free memory as the zero of ``measured_bytes`` (nothing of ours may be live)."""
        self.baseline_free_bytes = int(self._rt.memGetInfo()[0])
        self.measured_bytes = self.peak_measured_bytes = 0

    def _raw_malloc(self, size_bytes: int) -> tuple[Any, int]:
        try:
            pointer = self._rt.malloc(size_bytes)
        except self._rt.CUDARuntimeError as exc:
            if getattr(exc, "status", None) == self._oom_status:
                raise DeviceOutOfMemory(f"cudaMalloc({size_bytes}) failed: {exc}") from None
            raise
        return pointer, pointer

    def _raw_free(self, handle: Any) -> None:
        self._rt.free(handle)

    def _measure(self) -> int:
        return self.baseline_free_bytes - int(self._rt.memGetInfo()[0])

    def _raw_reserve(self, size_bytes: int) -> tuple[Any, int]:
        raise NotImplementedError("CupyDevice does not implement expandable segments (CUDA VMM: "
                                  "cuMemAddressReserve/cuMemCreate/cuMemMap); replay with "
                                  "--set expandable_segments=false, or on the host backend")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(device_id=self.device_id, total_device_bytes=self.total_device_bytes)
        return out


# ====================================================================== backends
class HostBackend:
    """Host memory, host time: streams are ignored and compute is a busy-wait on this thread."""

    name = "host"

    def __init__(self, *, touch: bool = False):
        self.touch = touch

    def default_granularity(self) -> tuple[int, int]:
        """(granularity, small granularity) of the footprint rule without a calibration file."""
        return PAGE_BYTES, PAGE_BYTES

    def make_device(self, capacity_bytes: int | None = None, *, granularity_bytes: int | None = None,
                    small_granularity_bytes: int | None = None, real_addresses: bool = False) -> HostDevice:
        g, sg = self.default_granularity()
        return HostDevice(capacity_bytes, granularity_bytes=granularity_bytes or g,
                          small_granularity_bytes=small_granularity_bytes or sg,
                          real_addresses=real_addresses, touch=self.touch)

    def prepare_streams(self, stream_ids) -> None:
        """Nothing to create on the host."""

    def use_stream(self, stream: int) -> None:
        """Streams do not exist on the host."""

    def launch_work(self, stream: int, ns: int) -> None:
        """Device-side work does not exist on the host (the host busy-waits the gaps itself)."""

    def synchronize(self) -> None:
        """Nothing runs asynchronously on the host."""

    def close(self) -> None:
        """Nothing to release."""


_SPIN_SOURCE = r"""
extern "C" __global__ void allocsim_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""

#: Gaps shorter than this are not worth a kernel launch (a launch costs a few microseconds).
MIN_KERNEL_NS = 5_000


class CupyBackend:
    """A CUDA GPU through CuPy: one non-blocking ``cupy.cuda.Stream`` per trace stream, spin kernels as work."""

    name = "cupy"

    def __init__(self, *, device_id: int = 0):
        self.cp = import_cupy()
        self.device_id = device_id
        self.cp.cuda.Device(device_id).use()
        self.streams: dict[int, Any] = {}
        self._current: int | None = None
        self._spin = None

    def default_granularity(self) -> tuple[int, int]:
        return DEFAULT_GRANULARITY_BYTES, DEFAULT_GRANULARITY_BYTES

    def make_device(self, capacity_bytes: int | None = None, *, granularity_bytes: int | None = None,
                    small_granularity_bytes: int | None = None, real_addresses: bool = False) -> CupyDevice:
        g, sg = self.default_granularity()
        return CupyDevice(capacity_bytes, granularity_bytes=granularity_bytes or g,
                          small_granularity_bytes=small_granularity_bytes or sg,
                          real_addresses=real_addresses, device_id=self.device_id)

    def spin_kernel(self):
        """The compiled spin kernel (compiled once, before any baseline is taken)."""
        if self._spin is None:
            self._spin = self.cp.RawKernel(_SPIN_SOURCE, "allocsim_spin")
            self._spin((1,), (1,), (self.cp.uint64(1000),))
            self.cp.cuda.runtime.deviceSynchronize()
        return self._spin

    def prepare_streams(self, stream_ids) -> None:
        """Create one stream per trace stream (and the spin kernel) before measuring anything."""
        for sid in stream_ids:
            if int(sid) not in self.streams:
                self.streams[int(sid)] = self.cp.cuda.Stream(non_blocking=True)
        self.spin_kernel()

    def use_stream(self, stream: int) -> None:
        """Make the trace stream's CuPy stream current (allocators that are stream-aware read it)."""
        if stream != self._current:
            s = self.streams.get(stream)
            if s is None:
                self.prepare_streams([stream])
                s = self.streams[stream]
            s.use()
            self._current = stream

    def launch_work(self, stream: int, ns: int) -> None:
        """Queue ``ns`` of GPU work on the trace stream (asynchronous: the host does not wait)."""
        if ns < MIN_KERNEL_NS:
            return
        s = self.streams.get(stream)
        if s is None:
            self.prepare_streams([stream])
            s = self.streams[stream]
        with s:
            self.spin_kernel()((1,), (1,), (self.cp.uint64(int(ns)),))

    def synchronize(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def close(self) -> None:
        self.synchronize()
        self.cp.cuda.Stream.null.use()
        self._current = None


def get_backend(name: str, **kwargs: Any):
    """``host`` or ``cupy`` (``GpuUnavailable`` when CuPy or the GPU is missing)."""
    if name == "host":
        return HostBackend(touch=bool(kwargs.get("touch", False)))
    if name == "cupy":
        return CupyBackend(device_id=int(kwargs.get("device_id", 0)))
    raise ValueError(f"unknown backend {name!r}; known: host, cupy")


def busy_wait_ns(ns: int) -> None:
    """Spin this thread for ``ns`` nanoseconds (host-side 'compute')."""
    if ns <= 0:
        return
    deadline = _perf_ns() + ns
    while _perf_ns() < deadline:
        pass


__all__ = ["RealDevice", "HostDevice", "CupyDevice", "HostBackend", "CupyBackend", "GpuUnavailable",
           "import_cupy", "gpu_available", "get_backend", "busy_wait_ns", "PAGE_BYTES", "MiB",
           "OP_MALLOC", "OP_FREE", "OP_MAP", "OP_UNMAP", "OP_NAMES"]
