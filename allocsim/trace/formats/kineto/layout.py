"""Infer where a Kineto trace's allocator held memory when recording began: call ``start_layout(window)``.

A Kineto trace records ``Total Reserved`` but not the segments behind it. A replay that starts
from nothing must ``cudaMalloc`` what the real allocator already had cached, and it lays that
memory out differently, so its peaks drift from the recording (on one H100 trace +41% reserved).
The addresses the window uses tell most of the layout, by PyTorch's caching-allocator rules
(``c10/cuda/CUDACachingAllocator.cpp``, research notes ``pytorch.md`` §1):

1. **Segments made in the window.** ``Total Reserved`` grows only by a ``cudaMalloc`` of a whole
   segment, and the request that caused it gets the *start* of that segment (``alloc_block`` then
   splits the rest off). So a growth of D bytes at an allocation at address A is the segment
   ``[A, A + D)``; it did not exist when recording began.
2. **Memory free at the start.** Every other address an allocation of the window covers was free
   when recording began, or held by a block the window frees (an orphan free, already a start
   allocation); a block alive at the start and never freed cannot be handed out again.
3. **Pools.** Blocks of at most ``kSmallSize`` (1 MiB) live in 2 MiB small-pool segments
   (``kSmallBuffer``); the driver returns them 2 MiB-aligned, so the 2 MiB window holding a small
   block is its segment. Larger blocks live in large-pool segments, whose sizes are multiples of
   ``kRoundLarge`` (2 MiB): the span the window's large blocks cover is widened to 2 MiB bounds.
4. **The rest.** ``Total Reserved`` at the start minus the segments above was cached but never
   touched by the window. The bytes allocated before the window that it never frees (``Total
   Allocated`` at the first event minus that event's ``Bytes``, less the orphan frees) have no
   address: they become one live block in one more segment, with the untouched cached bytes free
   beside it. The file cannot tell that part's layout; a note says so.

When the evidence contradicts these rules (reserved shrinks in the window, pools overlap, the
inferred segments exceed ``Total Reserved``) no layout is returned and the reason is given, so the
replay falls back to placing the start allocations anew.
"""

from __future__ import annotations

import dataclasses

# PyTorch's sizes: blocks up to K_SMALL_SIZE are small-pool blocks, a small-pool segment is
# K_SMALL_BUFFER (its driver alignment too), large-pool segment sizes are multiples of
# K_ROUND_LARGE, every block size and address is a multiple of K_MIN_BLOCK_SIZE.
from ....settings.pytorch_sizes import K_MIN_BLOCK_SIZE, K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE
#: Free blocks and findings the other-pool check follows at most (real traces: hundreds).
_MAX_TRACKED = 1_000


@dataclasses.dataclass
class DeviceWindow:
    """What one GPU device's [memory] events show, in feed order (sizes are block sizes)."""

    device: int
    start_reserved_bytes: int               #: Total Reserved after the first event
    baseline_bytes: int                     #: held before the window (``reading.running_total``)
    addr: list[int]                         #: per [memory] event
    nbytes: list[int]                       #: per [memory] event: > 0 alloc, < 0 free
    reserved: list[int]                     #: per [memory] event: Total Reserved after it (-1: none)
    orphans: list[tuple[int, int, int]]     #: (alloc_id, addr, size) of start allocations the window frees


@dataclasses.dataclass
class Layout:
    """Start-of-window segments and the blocks that tile them."""

    segments: list[tuple[int, int, str]]            #: (addr, size_bytes, pool)
    blocks: list[tuple[int, int, int, int]]         #: (segment_addr, addr, size_bytes, alloc_id or -1)
    baseline_alloc_addr: int                        #: where the unaddressed start allocation was put (-1: none)
    window_segments: int                            #: segments the window itself made
    untouched_free_bytes: int                       #: cached bytes the window never touched, laid out free
    widened_bytes: int                              #: free bytes added by widening spans to 2 MiB bounds
    note: str
    #: Segments the window made for requests that a free block of the laid-out cache could have
    #: served: (position in the window's events, request bytes, largest free block of its pool).
    other_pool_growths: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    #: Segments laid out for the reserved bytes the window never touches (their layout is a guess).
    guessed_segment_addrs: list[int] = dataclasses.field(default_factory=list)

    def other_pool_sentence(self) -> str:
        """Why a one-pool replay makes fewer segments than the recording ("" when nothing shows it)."""
        if not self.other_pool_growths:
            return ""
        first_request, first_free = self.other_pool_growths[0][1:]
        return (f"the real allocator made {self.window_segments} segment(s) in the window, "
                f"{len(self.other_pool_growths)} of them for requests that a free cached block of the same pool "
                f"could have served (the first: {first_request:,} bytes while a {first_free:,}-byte block was free): "
                "those requests went to another pool or stream (a CUDA graph's private pool, a torch.cuda.MemPool, "
                "another stream's blocks), which Kineto does not record, so a one-pool replay serves them from its "
                "cache")


def start_layout(window: DeviceWindow, baseline_alloc_id: int) -> Layout | str:
    """The start-of-window layout of one device, or why the evidence admits none (one clause)."""
    made, reason = _window_segments(window)
    if reason:
        return reason
    touched = _start_blocks(window, made)
    if isinstance(touched, str):
        return touched
    small_chunks = sorted({a // K_SMALL_BUFFER for a, s in touched if s <= K_SMALL_SIZE})
    for a, s in touched:
        if s <= K_SMALL_SIZE and (a + s - 1) // K_SMALL_BUFFER != a // K_SMALL_BUFFER:
            return f"a small block at {a:#x} crosses a 2 MiB boundary"
    small = [(c * K_SMALL_BUFFER, (c + 1) * K_SMALL_BUFFER) for c in small_chunks]
    if _overlaps(small, made):
        return "a small-pool segment overlaps a segment made in the window"
    spans = _merge([(a, a + s) for a, s in touched if s > K_SMALL_SIZE])
    if _overlaps(spans, small):
        return "a large block lies in a 2 MiB range that holds small blocks"
    baseline_live = window.baseline_bytes - sum(s for _, _, s in window.orphans)
    if baseline_live < 0:
        return "the window frees more than was allocated when it began"
    for widen in (True, False):
        large = _widen(spans, small + made) if widen else spans
        laid = sum(b - a for a, b in small + large)
        untouched = window.start_reserved_bytes - laid
        in_gap = -1
        if 0 <= untouched < baseline_live:
            # Not enough untouched reserve: the start allocation shared segments with the window's blocks.
            in_gap = _gap_for(baseline_live, small if baseline_live <= K_SMALL_SIZE else large, touched)
        if untouched >= baseline_live or in_gap >= 0:
            break
    else:
        return (f"the segments the window uses ({laid:,} bytes) leave no room for the {baseline_live:,} bytes "
                f"allocated before it within Total Reserved ({window.start_reserved_bytes:,} bytes)")
    widened = sum(b - a for a, b in large) - sum(b - a for a, b in spans)
    segments = [(a, b - a, "small") for a, b in small] + [(a, b - a, "large") for a, b in large]
    top = max([b for _, b in small + large + made], default=0)
    extra_addr = -(-top // K_ROUND_LARGE) * K_ROUND_LARGE + K_ROUND_LARGE   # past every address seen
    if min([a for a, _ in small + large + made], default=0) < 0 or extra_addr + untouched >= 1 << 63:
        return "its addresses leave no room in the 64-bit address space for the memory the window never touches"
    extra, baseline_addr = _untouched_segments(extra_addr, untouched, 0 if in_gap >= 0 else baseline_live)
    if in_gap >= 0:
        baseline_addr = in_gap
    segments += extra
    live = [(aid, a, s) for aid, a, s in window.orphans]
    if baseline_addr >= 0 and baseline_live > 0:
        live.append((baseline_alloc_id, baseline_addr, baseline_live))
    blocks = _tile(segments, live)
    if isinstance(blocks, str):
        return blocks
    note = (f"device {window.device}: start-of-window layout inferred from the addresses the window uses "
            f"(no segment is recorded): {len(small)} small and {len(large)} large segments "
            f"({laid:,} bytes) that the window allocates in")
    if widened:
        note += f", widened by {widened:,} free bytes to the 2 MiB multiples segments come in"
    if made:
        note += f"; {len(made)} segments the window makes itself are left to the replay"
    if in_gap >= 0:
        note += (f"; the {baseline_live:,} bytes allocated before the window are one block in the first free gap "
                 "of those segments the window never allocates in (where they really lay, the file does not say)")
    if untouched:
        note += f"; the {untouched:,} reserved bytes the window never touches form {len(extra)} more segment(s)"
        if in_gap < 0 and baseline_live > 0:
            note += f" holding the {baseline_live:,} bytes allocated before the window as one block and"
        else:
            note += " holding"
        note += (f" {untouched - (0 if in_gap >= 0 else baseline_live):,} bytes free (where they really lay, "
                 "the file does not say)")
    layout = Layout(segments=sorted(segments), blocks=blocks, baseline_alloc_addr=baseline_addr,
                    window_segments=len(made), untouched_free_bytes=untouched - (0 if in_gap >= 0 else baseline_live),
                    widened_bytes=widened, note=note)
    layout.guessed_segment_addrs = [a for a, _, _ in extra]
    if made:
        layout.other_pool_growths = _other_pool_growths(window, layout, made)
    return layout


def _other_pool_growths(window: DeviceWindow, layout: Layout, made: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Growths of reserved while a free block of the request's pool was big enough (see ``Layout``).

    Follows the free blocks of the laid-out segments and of the segments the window makes through
    the window's allocations and frees (free neighbours in one segment merge, as in PyTorch). Gives
    up (returns []) if an allocation lands outside every free block: then the layout is not exact.
    """
    import bisect

    pool_of = {a: pool for a, _, pool in layout.segments}
    guessed = set(layout.guessed_segment_addrs)
    segments = sorted([(a, a + s) for a, s, _ in layout.segments] + made)
    segment_starts = [a for a, _ in segments]
    free: list[list[int]] = [[a, a + s, seg] for seg, a, s, aid in layout.blocks if aid < 0]
    free.sort()
    starts = [f[0] for f in free]
    found = []
    checked = 0
    previous = window.start_reserved_bytes
    for pos, (addr, nbytes, reserved) in enumerate(zip(window.addr, window.nbytes, window.reserved)):
        if len(free) > _MAX_TRACKED or checked > _MAX_TRACKED:
            return found      # a crafted file: stop before the list work turns quadratic
        pool = "small" if abs(nbytes) <= K_SMALL_SIZE else "large"
        if reserved > previous:
            checked += 1
            # Only blocks the window's addresses prove: the untouched segments' layout is a guess.
            best = max((b - a for a, b, seg in free if pool_of[seg] == pool and seg not in guessed), default=0)
            if best >= nbytes:
                found.append((pos, nbytes, best))
            # The new segment: the request takes its start, the rest is a free block of it.
            pool_of[addr] = "small" if reserved - previous == K_SMALL_BUFFER and nbytes <= K_SMALL_SIZE else "large"
            if reserved - previous > nbytes:
                k = bisect.bisect_left(starts, addr + nbytes)
                free.insert(k, [addr + nbytes, addr + reserved - previous, addr])
                starts.insert(k, addr + nbytes)
            previous = reserved
            continue
        previous = reserved
        if nbytes > 0:
            k = bisect.bisect_right(starts, addr) - 1
            if k < 0 or free[k][1] < addr + nbytes:
                return []
            a, b, seg = free[k]
            del free[k], starts[k]
            for lo, hi in ((addr + nbytes, b), (a, addr)):
                if hi > lo:
                    free.insert(k, [lo, hi, seg])
                    starts.insert(k, lo)
        else:
            j = bisect.bisect_right(segment_starts, addr) - 1
            if j < 0 or addr - nbytes > segments[j][1]:
                return []
            seg = segments[j][0]
            lo, hi = addr, addr - nbytes
            k = bisect.bisect_left(starts, lo)
            if k < len(free) and free[k][0] == hi and free[k][2] == seg:
                hi = free[k][1]
                del free[k], starts[k]
            if k > 0 and free[k - 1][1] == lo and free[k - 1][2] == seg:
                lo = free[k - 1][0]
                del free[k - 1], starts[k - 1]
                k -= 1
            free.insert(k, [lo, hi, seg])
            starts.insert(k, lo)
    return found


def _window_segments(window: DeviceWindow) -> tuple[list[tuple[int, int]], str]:
    """Segments the window's reserved growth made, as [start, end) ranges; or why none can be told."""
    made: list[tuple[int, int]] = []
    previous = window.start_reserved_bytes
    for addr, nbytes, reserved in zip(window.addr, window.nbytes, window.reserved):
        if reserved < 0:
            return [], "an event has no Total Reserved"
        if reserved < previous:
            return [], "Total Reserved shrinks in the window (segments released: which ones, the file does not say)"
        if reserved > previous:
            grown = reserved - previous
            if nbytes <= 0 or grown < nbytes:
                return [], f"Total Reserved grows by {grown:,} bytes at an event that cannot have caused it"
            made.append((addr, addr + grown))
        previous = reserved
    return sorted(made), ""


def _start_blocks(window: DeviceWindow, made: list[tuple[int, int]]) -> list[tuple[int, int]] | str:
    """(addr, size) of every block the window places in memory that existed when it began."""
    import bisect

    starts = [a for a, _ in made]
    out = []
    blocks = [(a, n) for a, n in zip(window.addr, window.nbytes) if n > 0]
    blocks += [(a, s) for _, a, s in window.orphans]
    for a, s in blocks:
        if a % K_MIN_BLOCK_SIZE or s % K_MIN_BLOCK_SIZE:
            return f"a block at {a:#x} of {s:,} bytes is not on PyTorch's 512-byte grid"
        k = bisect.bisect_right(starts, a) - 1
        if k >= 0 and a < made[k][1]:
            if a + s > made[k][1]:
                return f"a block at {a:#x} runs past the end of the segment made for it"
            continue
        if k + 1 < len(made) and a + s > made[k + 1][0]:
            return f"a block at {a:#x} runs into a segment made in the window"
        out.append((a, s))
    return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlaps(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> bool:
    merged = sorted([(a, b, 0) for a, b in xs] + [(a, b, 1) for a, b in ys])
    end, owner = None, None
    for a, b, who in merged:
        if end is not None and a < end and who != owner:
            return True
        if end is None or b > end:
            end, owner = b, who
    return False


def _widen(spans: list[tuple[int, int]], fixed: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each large span widened to 2 MiB bounds, never into a fixed range or a neighbouring span."""
    import bisect

    fixed = sorted(fixed)
    fixed_starts, fixed_ends = [a for a, _ in fixed], sorted(b for _, b in fixed)
    out: list[tuple[int, int]] = []
    for k, (a, b) in enumerate(spans):
        lo = a - a % K_ROUND_LARGE
        hi = -(-b // K_ROUND_LARGE) * K_ROUND_LARGE
        j = bisect.bisect_right(fixed_ends, a)
        if j:
            lo = max(lo, fixed_ends[j - 1])
        if out:
            lo = max(lo, out[-1][1])
        j = bisect.bisect_left(fixed_starts, b)
        if j < len(fixed_starts):
            hi = min(hi, fixed_starts[j])
        if k + 1 < len(spans):
            hi = min(hi, spans[k + 1][0])
        out.append((lo, hi))
    return out


def _gap_for(size: int, segments: list[tuple[int, int]], touched: list[tuple[int, int]]) -> int:
    """Address of the first gap of at least ``size`` bytes in ``segments`` that no touched block covers (-1: none)."""
    import bisect

    covered = _merge([(a, a + s) for a, s in touched])
    ends = [b for _, b in covered]
    for lo, hi in sorted(segments):
        cursor = lo
        for k in range(bisect.bisect_right(ends, lo), len(covered)):
            a, b = covered[k]
            if a >= hi:
                break
            if a - cursor >= size:
                return cursor
            cursor = max(cursor, b)
        if hi - cursor >= size:
            return cursor
    return -1


def _untouched_segments(addr: int, untouched: int, baseline_live: int) -> tuple[list[tuple[int, int, str]], int]:
    """Segments for the reserved bytes the window never touches, from ``addr`` up; and where the
    unaddressed start allocation lies in them (-1: there is none)."""
    if untouched <= 0:
        return [], -1
    if baseline_live <= 0:
        return [(addr, untouched, "large")], -1
    if baseline_live > K_SMALL_SIZE:
        return [(addr, untouched, "large")], addr
    small = min(untouched, K_SMALL_BUFFER)
    segments = [(addr, small, "small")]
    if untouched > small:
        segments.append((addr + small, untouched - small, "large"))
    return segments, addr


def _tile(segments: list[tuple[int, int, str]], live: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]] | str:
    """Blocks tiling every segment: the live start allocations, free blocks in the gaps."""
    import bisect

    segments = sorted(segments)
    starts = [a for a, _, _ in segments]
    inside: dict[int, list[tuple[int, int, int]]] = {a: [] for a in starts}
    for aid, a, s in live:
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or a + s > starts[k] + segments[k][1]:
            return f"a start allocation at {a:#x} lies outside every inferred segment"
        if (segments[k][2] == "small") != (s <= K_SMALL_SIZE):
            return f"a start allocation at {a:#x} of {s:,} bytes lies in the wrong pool's segment"
        inside[starts[k]].append((a, s, aid))
    blocks = []
    for seg_addr, size, _pool in segments:
        cursor = seg_addr
        for a, s, aid in sorted(inside[seg_addr]):
            if a < cursor:
                return f"start allocations overlap at {a:#x}"
            if a > cursor:
                blocks.append((seg_addr, cursor, a - cursor, -1))
            blocks.append((seg_addr, a, s, aid))
            cursor = a + s
        if cursor < seg_addr + size:
            blocks.append((seg_addr, cursor, seg_addr + size - cursor, -1))
    return blocks
