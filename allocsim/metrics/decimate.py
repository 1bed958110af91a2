"""Thin a long series to one sample per pixel column without losing a peak: ``pixel_max`` and friends.

A figure a few thousand pixels wide cannot show a million events; dropping events loses exactly the
short spikes a memory question is about, and even a kept spike narrower than a pixel vanishes when
a filled area is rasterised. The rule used by every picture here (``plot``'s PNG/SVG and the
``report`` page): split the x range into ``columns`` equal buckets (pixel columns) and draw each
bucket as one flat step, as wide as the bucket, at the bucket's maximum. A stacked picture takes
the row where the stack's total is largest in the bucket, so the drawn stack reaches the peak it
names, to the byte, and is at least one column wide.
"""

from __future__ import annotations

import numpy as np

#: Pixel columns of a wide figure (and of the report's timelines before zooming in).
DEFAULT_COLUMNS = 2000


def bucket_starts(x: np.ndarray, columns: int = DEFAULT_COLUMNS) -> np.ndarray:
    """First row of each non-empty bucket when sorted ``x`` is cut into ``columns`` equal ranges."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n <= columns:
        return np.arange(n, dtype=np.int64)
    span = x[-1] - x[0]
    if span > 0:
        bucket = np.minimum(((x - x[0]) / span * columns).astype(np.int64), columns - 1)
    else:
        bucket = np.arange(n, dtype=np.int64) * columns // n
    return np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]]).astype(np.int64)


def max_rows(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The first row of each bucket's maximum of ``values`` (buckets begin at ``starts``)."""
    values = np.asarray(values)
    n = len(values)
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    # Sorted by (bucket, -value, row), each bucket's first entry is the first row of its maximum.
    order = np.lexsort((np.arange(n), -values.astype(float) if values.dtype.kind == "f" else -values, bucket))
    return order[starts].astype(np.int64)


def bucket_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each bucket's maximum of ``values`` (exact: integers stay integers)."""
    values = np.asarray(values)
    return np.maximum.reduceat(values, starts) if len(starts) else values[:0]


def pixel_max(x: np.ndarray, values: np.ndarray, columns: int = DEFAULT_COLUMNS) -> tuple[np.ndarray, np.ndarray]:
    """(left edge of each bucket, its maximum): draw as a step plot (``where="post"``) to keep every peak."""
    starts = bucket_starts(x, columns)
    return np.asarray(x)[starts], bucket_max(values, starts)
