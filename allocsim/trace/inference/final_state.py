"""Refuse a snapshot whose final segments no PyTorch caching allocator could have left behind.

The replay starts from the segments and blocks a snapshot records, and every later number
(reserved bytes, the waste attribution, the code sites) leans on them obeying the allocator's
rules. A file that breaks one of these rules was not written by PyTorch (or was edited), so it
is refused here, once, with the record that breaks the rule, instead of failing deep inside a
policy or a metric. The rules (see ``CUDACachingAllocator.cpp``):

- every segment is a whole number of 2 MiB (``kSmallBuffer`` for the small pool, rounded to
  ``kRoundLarge`` or mapped in 2 MiB pages in the large pool);
- a live block is a multiple of 512 B (``kMinBlockSize``: ``round_size`` never gives less);
- a live block's ``requested_size`` is at most its size (the block is the rounded request);
- a live block of at most 1 MiB (``kSmallSize``) lives in the small pool, a bigger one in the large.

Inactive blocks keep a stale ``requested_size`` in real files, so only live blocks are held to
the last three rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import TraceFormatError

_SEGMENT_UNIT_BYTES = 2 << 20
_MIN_BLOCK_BYTES = 512
_SMALL_SIZE_BYTES = 1 << 20


def check_final_state(path: str, segments: Any, n_live_states: int, small_pool: int) -> None:
    """Raise ``TraceFormatError`` naming the first segment or live block that breaks PyTorch's rules.

    ``segments`` is a ``SegmentColumns``; block states below ``n_live_states`` are live and pool
    index ``small_pool`` is the small pool.
    """
    bad_seg = np.flatnonzero(segments.size % _SEGMENT_UNIT_BYTES != 0)
    if len(bad_seg):
        i = int(bad_seg[0])
        raise TraceFormatError(path, f"segment {i}", f"total_size {int(segments.size[i]):,} bytes is not a "
                               "multiple of 2 MiB: a PyTorch CUDA segment always is")
    live = segments.block_state < n_live_states
    size = segments.block_size
    in_small = segments.pool[segments.block_segment] == small_pool if len(size) else np.zeros(0, bool)
    rules = (
        (size % _MIN_BLOCK_BYTES != 0, "size {size:,} bytes is not a multiple of 512: PyTorch rounds every "
                                       "block to one"),
        (segments.block_requested > size, "requested_size {requested:,} bytes is more than the block's "
                                          "size {size:,}: a block holds its whole request"),
        (in_small & (size > _SMALL_SIZE_BYTES), "a live block of {size:,} bytes is in the small pool, "
                                                "which holds blocks of at most 1 MiB"),
        (~in_small & (size <= _SMALL_SIZE_BYTES), "a live block of {size:,} bytes is in the large pool, "
                                                  "which holds blocks of more than 1 MiB"),
    )
    for broken, reason in rules:
        hits = np.flatnonzero(live & broken)
        if len(hits):
            raise TraceFormatError(path, _block_record(segments, int(hits[0])),
                                   reason.format(size=int(size[hits[0]]),
                                                 requested=int(segments.block_requested[hits[0]])))


def _block_record(segments: Any, k: int) -> str:
    """``segment I block J`` of the ``k``-th block (blocks are stored segment by segment)."""
    seg = int(segments.block_segment[k])
    first = int(np.searchsorted(segments.block_segment, seg, side="left"))
    return f"segment {seg} block {k - first}"
