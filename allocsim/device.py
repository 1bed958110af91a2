"""The bottom of every policy stack: a simulated GPU that hands out address ranges and counts calls.

``SimulatedDevice(capacity_bytes=80 * GiB)`` models cudaMalloc/cudaFree: each allocation is rounded
up to the driver's granularity, addresses never overlap, and the device keeps the counters a cost
model needs (calls and bytes). It knows nothing about time; the engine turns counter deltas into
latency with a ``CostModel``. The validation harness replaces it with a real CUDA device.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from .driver_addresses import TOP_ADDR, DriverAddresses
from .errors import AllocsimError
from .units import MiB, align_up

#: cudaMalloc hands out whole 2 MiB GPU pages for large allocations on current NVIDIA GPUs.
DEFAULT_GRANULARITY_BYTES = 2 * MiB
#: Address alignment of every device allocation (cudaMalloc guarantees at least 256 B).
DEVICE_ALIGNMENT_BYTES = 512
#: Orders a device can hand out fresh cudaMalloc addresses in: ``creation`` (each above every
#: earlier one, never reused) or ``driver`` (as the CUDA driver places segments on Linux, learned
#: from real snapshots: ``allocsim.driver_addresses``, docs/addresses.md).
ADDRESS_ORDERS = ("creation", "driver")


class DeviceOutOfMemory(AllocsimError):
    """The simulated device cannot back this allocation; policies catch it to run their retry path."""


class SimulatedDevice:
    """A device of ``capacity_bytes`` (None = unlimited) that rounds allocations to its granularity.

    ``small_granularity_bytes`` applies to requests below ``granularity_bytes``: the default rounds
    every allocation to whole 2 MiB pages; set it lower to model a driver that packs small
    allocations (calibration measures what the real one does).

    ``address_order`` says where fresh cudaMallocs land (``ADDRESS_ORDERS``); None leaves it to
    the policy on top (``prefer_address_order``: the ``pytorch`` preset asks for ``driver``, every
    other policy keeps ``creation``). Recorded addresses (``follow_addresses``, ``hint_addresses``)
    come first either way.
    """

    def __init__(self, capacity_bytes: int | None = None, *,
                 granularity_bytes: int = DEFAULT_GRANULARITY_BYTES,
                 small_granularity_bytes: int | None = None, address_order: str | None = None):
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if address_order is not None and address_order not in ADDRESS_ORDERS:
            raise ValueError(f"address_order must be one of {ADDRESS_ORDERS}, got {address_order!r}")
        self.capacity_bytes = capacity_bytes
        self.granularity_bytes = granularity_bytes
        self.small_granularity_bytes = small_granularity_bytes or granularity_bytes
        self._next_addr = 1 << 40          # fake device virtual addresses above every range handed out
        self._address_order_given = address_order is not None
        self._driver: DriverAddresses | None = None
        self.address_order = "creation"
        if address_order is not None:
            self._set_address_order(address_order)
        self._sizes: dict[int, int] = {}   # addr -> bytes actually reserved
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.n_mallocs = 0
        self.malloc_bytes = 0
        self.n_frees = 0
        self.freed_bytes = 0
        self.n_failed_mallocs = 0
        # Expandable segments (cuMemAddressReserve + cuMemCreate/cuMemMap): virtual ranges cost no
        # memory; mapped pages count in ``reserved_bytes`` exactly like cudaMalloc'd bytes.
        self._address_spaces: dict[int, int] = {}   # base addr -> reserved virtual bytes
        self._mapped: dict[int, int] = {}           # mapped range start -> bytes
        self.n_maps = 0
        self.map_bytes = 0
        self.n_unmaps = 0
        self.unmapped_bytes = 0
        self.n_failed_maps = 0
        # Replay aids (fidelity checks against a recorded run; unused otherwise): addresses the next
        # cudaMallocs should get, and a count of device calls to refuse as if the GPU were full.
        self._address_hints: list[tuple[int, int]] = []
        self._address_plan: list[tuple[int, int]] = []   # reversed: the next planned address is last
        # Start addresses of every occupied range (cudaMalloc'd, adopted, reserved virtual) and of
        # every mapped range, sorted: overlap and containment checks cost O(log n), whatever
        # addresses a recorded trace holds.
        self._occupied_starts = SortedList()
        self._mapped_starts = SortedList()
        self._refuse: int | None = 0
        self.n_adopted = 0
        self.adopted_bytes = 0
        # Whatever really backs an address (a real device's handle and pointer); empty here.
        self._backing: dict[int, object] = {}

    @property
    def device(self) -> "SimulatedDevice":
        """A device is its own device (so adaptors can always ask ``upstream.device``)."""
        return self

    def prefer_address_order(self, order: str) -> None:
        """Use ``order`` for fresh addresses unless the device was built with one (a policy's default).

        Only before the device has handed out an address: a policy calls it from its constructor.
        """
        if order not in ADDRESS_ORDERS:
            raise ValueError(f"address_order must be one of {ADDRESS_ORDERS}, got {order!r}")
        if self._address_order_given or self.n_mallocs or self._address_spaces:
            return
        self._set_address_order(order)

    def _set_address_order(self, order: str) -> None:
        self.address_order = order
        self._driver = DriverAddresses() if order == "driver" else None
        if self._driver is not None:
            # The driver's chunks lie below TOP_ADDR; bump addresses (its fallback, reserved virtual
            # ranges) start above it, so the two never meet however many of either a trace makes.
            self._next_addr = max(self._next_addr, TOP_ADDR)

    def footprint(self, size_bytes: int) -> int:
        """Bytes the device really reserves for a ``size_bytes`` request."""
        if size_bytes >= self.granularity_bytes:
            return align_up(size_bytes, self.granularity_bytes)
        return align_up(max(size_bytes, 1), self.small_granularity_bytes)

    def free_capacity_bytes(self) -> int | None:
        """What cudaMemGetInfo would report free, or None for an unlimited device."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.reserved_bytes

    def malloc(self, size_bytes: int) -> int:
        """cudaMalloc: return the address of a fresh range, or raise ``DeviceOutOfMemory``."""
        footprint = self.footprint(size_bytes)
        if self._refused():
            self.n_failed_mallocs += 1
            raise DeviceOutOfMemory(f"cannot reserve {footprint} bytes: the device refuses (replay)")
        if self.capacity_bytes is not None and self.reserved_bytes + footprint > self.capacity_bytes:
            self.n_failed_mallocs += 1
            raise DeviceOutOfMemory(f"cannot reserve {footprint} bytes: {self.reserved_bytes} of "
                                    f"{self.capacity_bytes} in use")
        try:
            backing = self._back_malloc(size_bytes)
        except DeviceOutOfMemory:
            self.n_failed_mallocs += 1
            raise
        addr = self._hinted_address(footprint)
        if addr is None:
            addr = self._fresh_address(footprint, backing)
        self._sizes[addr] = footprint
        if backing is not None:
            self._backing[addr] = backing
        self._occupied_starts.add(addr)
        self.reserved_bytes += footprint
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        self.n_mallocs += 1
        self.malloc_bytes += footprint
        self._after_call()
        return addr

    def _fresh_address(self, footprint: int, backing: object) -> int:
        """The address of a new range: the driver's placement, else above everything (a real device may
        hand out its real pointer)."""
        if self._driver is not None:
            starts = self._occupied_starts
            addr = self._driver.place(footprint, starts[0] if starts else None, self._overlaps)
            if addr is not None:
                return addr
        return self._bump_address(footprint)

    def _bump_address(self, footprint: int) -> int:
        addr = self._next_addr
        self._next_addr = align_up(addr + footprint, DEVICE_ALIGNMENT_BYTES)
        return addr

    def _in_use(self, addr: int, size_bytes: int) -> None:
        """A range the device did not place itself (adopted, recorded) is no longer free for placement."""
        if self._driver is not None:
            self._driver.carve(addr, size_bytes)

    # ------------------------------------------------------------------ what a real device adds
    # A simulated device holds no memory: these do nothing. ``validate.devices.RealDevice`` backs
    # every call with real memory (and times it); the bookkeeping above and below stays shared.
    def _back_malloc(self, size_bytes: int) -> object:
        """Really allocate (raise ``DeviceOutOfMemory`` if the device cannot); return the backing."""
        return None

    def _back_free(self, backing: object, footprint: int) -> None:
        """Really free what ``_back_malloc`` returned."""

    def _back_adopt(self, size_bytes: int) -> object:
        """Really allocate a range taken over from a recorded or inferred start state (not a timed call)."""
        return None

    def _back_reserve(self, size_bytes: int, timed: bool = True) -> object:
        """Really reserve a virtual range; return its backing."""
        return None

    def _back_release(self, backing: object) -> None:
        """Really release a virtual range."""

    def _back_map(self, addr: int, size_bytes: int, timed: bool = True) -> None:
        """Really map pages (raise ``DeviceOutOfMemory`` if the device cannot)."""

    def _back_unmap(self, addr: int, size_bytes: int) -> None:
        """Really unmap pages."""

    def _after_call(self) -> None:
        """Runs after every device call and adoption (a real device measures what it holds)."""

    # ------------------------------------------------------------------ replaying a recorded run
    def adopt(self, addr: int, size_bytes: int) -> None:
        """Take over a device allocation that already exists at ``addr`` (the start of a recorded window).

        It counts in ``reserved_bytes`` (and the peak) like a cudaMalloc'd range but not as a call;
        fresh addresses are handed out above every adopted range, so later allocations never collide.
        """
        if size_bytes <= 0 or addr < 0:
            raise ValueError(f"cannot adopt [{addr:#x}, +{size_bytes})")
        if self._overlaps(addr, size_bytes):
            raise ValueError(f"adopted range [{addr:#x}, +{size_bytes}) overlaps device memory in use")
        backing = self._back_adopt(size_bytes)
        self._sizes[addr] = size_bytes
        if backing is not None:
            self._backing[addr] = backing
        self._occupied_starts.add(addr)
        self._in_use(addr, size_bytes)
        self._grow_reserved(size_bytes)
        self._next_addr = max(self._next_addr, align_up(addr + size_bytes, DEVICE_ALIGNMENT_BYTES))
        self.n_adopted += 1
        self.adopted_bytes += size_bytes
        self._after_call()

    def adopt_address_space(self, addr: int, size_bytes: int) -> None:
        """Take over a reserved virtual range (an expandable segment existing at the window's start)."""
        if size_bytes <= 0 or addr < 0 or self._overlaps(addr, size_bytes):
            raise ValueError(f"cannot adopt the address range [{addr:#x}, +{size_bytes})")
        backing = self._back_reserve(size_bytes, timed=False)
        self._address_spaces[addr] = size_bytes
        if backing is not None:
            self._backing[addr] = backing
        self._occupied_starts.add(addr)
        self._in_use(addr, size_bytes)
        self._next_addr = max(self._next_addr, align_up(addr + size_bytes, DEVICE_ALIGNMENT_BYTES))

    def adopt_mapped(self, addr: int, size_bytes: int) -> None:
        """Take over mapped pages inside an adopted virtual range; they count in ``reserved_bytes``."""
        if size_bytes <= 0:
            raise ValueError(f"cannot adopt a mapping of {size_bytes} bytes")
        base = self._range_before(self._occupied_starts, addr + 1)
        if base is None or base not in self._address_spaces or addr + size_bytes > base + self._address_spaces[base]:
            raise ValueError(f"mapping [{addr:#x}, +{size_bytes}) lies in no reserved address range")
        start = self._range_before(self._mapped_starts, addr + size_bytes)
        if start is not None and start + self._mapped[start] > addr:
            raise ValueError(f"mapping [{addr:#x}, +{size_bytes}) overlaps mapped pages")
        self._back_map(addr, size_bytes, timed=False)
        self._set_mapped(addr, size_bytes)
        self._grow_reserved(size_bytes)
        self.adopted_bytes += size_bytes
        self._after_call()

    def hint_addresses(self, hints: list[tuple[int, int]]) -> None:
        """Ask the next cudaMallocs to return these ``(addr, size_bytes)`` (replaying a recorded run).

        A malloc takes the first hint of its size whose range is free, else a fresh address; the
        driver's choice of address is outside any allocator policy, so a replay may impose it.
        ``hint_addresses([])`` drops the hints left over.
        """
        self._address_hints = list(hints)

    def follow_addresses(self, plan: list[tuple[int, int]]) -> None:
        """Give the k-th cudaMalloc the k-th ``(addr, size_bytes)`` of a recorded run while the two agree.

        A replay of a recording hands the device the addresses the real driver returned, in order,
        because PyTorch breaks best-fit ties by address. The first cudaMalloc whose size differs
        from the plan's next entry (or whose planned range is in use) ends the plan: from there on
        the run is no longer the recorded one and gets fresh addresses.
        """
        self._address_plan = list(reversed(plan))

    def refuse(self, count: int | None) -> None:
        """Make the next ``count`` device calls (cudaMalloc or map) fail as if the GPU were full.

        ``None`` refuses every call until ``refuse(0)``; replays use it to reproduce a recorded
        out-of-memory where the device's capacity is unknown.
        """
        if count is not None and count < 0:
            raise ValueError("count must be >= 0 or None")
        self._refuse = count

    def _refused(self) -> bool:
        if self._refuse is None:
            return True
        if self._refuse > 0:
            self._refuse -= 1
            return True
        return False

    @staticmethod
    def _range_before(starts: SortedList, end: int) -> int | None:
        """The largest start below ``end`` (ranges are disjoint, so the only one that can overlap)."""
        k = starts.bisect_left(end) - 1
        return starts[k] if k >= 0 else None

    def _set_mapped(self, addr: int, size_bytes: int) -> None:
        if addr not in self._mapped:
            self._mapped_starts.add(addr)
        self._mapped[addr] = size_bytes

    def _drop_mapped(self, addr: int) -> int:
        self._mapped_starts.remove(addr)
        return self._mapped.pop(addr)

    def _hinted_address(self, footprint: int) -> int | None:
        plan = self._address_plan
        if plan:
            addr, size = plan.pop()
            if size == footprint and not self._overlaps(addr, footprint):
                self._next_addr = max(self._next_addr, align_up(addr + footprint, DEVICE_ALIGNMENT_BYTES))
                self._in_use(addr, footprint)
                return addr
            plan.clear()   # diverged from the recording
        hints = self._address_hints
        for k, (addr, size) in enumerate(hints):
            if size == footprint and not self._overlaps(addr, footprint):
                del hints[k]
                self._next_addr = max(self._next_addr, align_up(addr + footprint, DEVICE_ALIGNMENT_BYTES))
                self._in_use(addr, footprint)
                return addr
        return None

    def _overlaps(self, addr: int, size_bytes: int) -> bool:
        start = self._range_before(self._occupied_starts, addr + size_bytes)
        if start is None:
            return False
        length = self._sizes.get(start)
        if length is None:
            length = self._address_spaces[start]
        return start + length > addr

    def _grow_reserved(self, size_bytes: int) -> None:
        self.reserved_bytes += size_bytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes

    def free(self, addr: int) -> None:
        """cudaFree: release the range at ``addr`` (device-wide synchronisation is the cost model's)."""
        footprint = self._sizes.pop(addr)
        self._back_free(self._backing.pop(addr, None), footprint)
        self._occupied_starts.remove(addr)
        if self._driver is not None:
            self._driver.release(addr, footprint)
        self.reserved_bytes -= footprint
        self.n_frees += 1
        self.freed_bytes += footprint
        self._after_call()

    # ------------------------------------------------------------------ expandable segments
    def reserve_address_space(self, size_bytes: int) -> int:
        """cuMemAddressReserve: return the base of a fresh virtual range; it holds no memory until mapped."""
        size_bytes = align_up(max(size_bytes, 1), self.granularity_bytes)
        backing = self._back_reserve(size_bytes)
        # cuMemAddressReserve is not cudaMalloc: ranges come above everything in either address
        # order (their order decides no tie: each (stream, pool) has its own range).
        addr = self._bump_address(size_bytes)
        self._address_spaces[addr] = size_bytes
        if backing is not None:
            self._backing[addr] = backing
        self._occupied_starts.add(addr)
        return addr

    def release_address_space(self, addr: int) -> None:
        """cuMemAddressFree: drop a virtual range; every page in it must already be unmapped."""
        size_bytes = self._address_spaces[addr]
        k = self._mapped_starts.bisect_left(addr)
        if k < len(self._mapped_starts) and self._mapped_starts[k] < addr + size_bytes:
            raise ValueError(f"address range {addr:#x} still has mapped pages")
        del self._address_spaces[addr]
        self._occupied_starts.remove(addr)
        self._back_release(self._backing.pop(addr, None))

    def map(self, addr: int, size_bytes: int) -> None:
        """cuMemCreate + cuMemMap ``size_bytes`` at ``addr``, or raise ``DeviceOutOfMemory``.

        The caller maps whole pages of its own size (PyTorch: 2 MiB small, 20 MiB large). All or nothing: like PyTorch's ``ExpandableSegment::map``, a failed map leaves nothing mapped.
        """
        if size_bytes <= 0:
            raise ValueError(f"map size must be > 0, got {size_bytes}")
        if self._refused():
            self.n_failed_maps += 1
            raise DeviceOutOfMemory(f"cannot map {size_bytes} bytes: the device refuses (replay)")
        if self.capacity_bytes is not None and self.reserved_bytes + size_bytes > self.capacity_bytes:
            self.n_failed_maps += 1
            raise DeviceOutOfMemory(f"cannot map {size_bytes} bytes: {self.reserved_bytes} of "
                                    f"{self.capacity_bytes} in use")
        try:
            self._back_map(addr, size_bytes)
        except DeviceOutOfMemory:
            self.n_failed_maps += 1
            raise
        self._set_mapped(addr, size_bytes)
        self.reserved_bytes += size_bytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        self.n_maps += 1
        self.map_bytes += size_bytes
        self._after_call()

    def unmap(self, addr: int, size_bytes: int) -> None:
        """cuMemUnmap + cuMemRelease the pages of ``[addr, addr + size_bytes)``; they must be mapped.

        Mapped ranges are tracked per map call; unmapping part of one splits it, so any whole-page
        sub-range of mapped memory can be released (what PyTorch does with fully free pages).
        """
        end = addr + size_bytes
        if size_bytes <= 0:
            raise ValueError(f"unmap size must be > 0, got {size_bytes}")
        cursor = addr
        while cursor < end:
            start = self._mapped_range_containing(cursor)
            length = self._drop_mapped(start)
            if start < cursor:
                self._set_mapped(start, cursor - start)
            range_end = start + length
            if range_end > end:
                self._set_mapped(end, range_end - end)
            cursor = min(range_end, end)
        self._back_unmap(addr, size_bytes)
        self.reserved_bytes -= size_bytes
        self.n_unmaps += 1
        self.unmapped_bytes += size_bytes
        self._after_call()

    def _mapped_range_containing(self, addr: int) -> int:
        start = self._range_before(self._mapped_starts, addr + 1)
        if start is not None and addr < start + self._mapped[start]:
            return start
        raise ValueError(f"address {addr:#x} is not mapped")
