"""How deeply a JSON text nests, measured without parsing it: the ``depth`` cap on the reference route.

The compiled Chrome-trace scanner counts nesting as it reads and hands a too-deep file back; the
reference route decodes with msgspec or the standard library, which take any depth they can
recurse into. ``max_nesting`` gives the reference route the same cap, so both routes refuse the
same files. It works on the positions of the structural bytes only (brackets, quotes,
backslashes), with numpy, so its cost is a few passes over the bytes.
"""

from __future__ import annotations

import numpy as np

_CHUNK_BYTES = 64 << 20
_INTERESTING = np.zeros(256, dtype=bool)
_INTERESTING[[ord(c) for c in '[]{}"\\']] = True
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def max_nesting(data: bytes) -> int:
    """The deepest nesting of arrays and objects in ``data`` (brackets inside strings do not count)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    pos = np.concatenate([np.flatnonzero(_INTERESTING[raw[i:i + _CHUNK_BYTES]]) + i
                          for i in range(0, len(raw), _CHUNK_BYTES)] or [np.zeros(0, np.int64)])
    if not len(pos):
        return 0
    char = raw[pos]
    is_bs = char == ord("\\")
    # Length of the run of backslashes ending at each backslash (runs are contiguous positions).
    run_start = is_bs & ~np.concatenate(([False], is_bs[:-1] & (np.diff(pos) == 1)))
    count = np.cumsum(is_bs)
    base = np.maximum.accumulate(np.where(run_start, count - 1, 0))
    run_len = np.where(is_bs, count - base, 0)
    # A quote is escaped when an odd run of backslashes ends right before it.
    prev_is_bs = np.concatenate(([False], is_bs[:-1] & (np.diff(pos) == 1)))
    prev_run = np.concatenate(([0], run_len[:-1]))
    quote = (char == ord('"')) & ~(prev_is_bs & (prev_run % 2 == 1))
    outside = np.cumsum(quote) % 2 == 0
    delta = np.where(outside & ~quote, _OPEN[char], 0).astype(np.int64)
    return int(np.cumsum(delta).max(initial=0))
