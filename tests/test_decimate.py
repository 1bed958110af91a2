"""The per-pixel rule: thinning a series for a picture never loses a peak, however short."""

from __future__ import annotations

import numpy as np

from allocsim.metrics.decimate import bucket_starts, max_rows, pixel_max


def test_a_one_event_spike_among_a_million_survives():
    rng = np.random.default_rng(7)
    values = rng.integers(0, 1 << 30, size=1_000_000, dtype=np.int64)
    values[654_321] = 1 << 40                       # one event, far narrower than a pixel
    x = np.arange(len(values))
    left, peaks = pixel_max(x, values, columns=800)
    assert len(left) == 800 and peaks.dtype == np.int64
    assert int(peaks.max()) == 1 << 40
    # Each step spans its whole bucket: the spike is drawn one column wide, not one event wide.
    k = int(np.argmax(peaks))
    assert left[k] <= 654_321 < (left[k + 1] if k + 1 < len(left) else len(values))
    # Every bucket's value is the exact maximum of its events.
    starts = bucket_starts(x, 800)
    ends = np.append(starts[1:], len(values))
    assert all(int(values[a:b].max()) == int(p) for a, b, p in zip(starts[::97], ends[::97], peaks[::97]))


def test_max_rows_points_at_the_first_maximum_of_each_bucket():
    values = np.array([1, 5, 5, 2, 9, 0, 9, 3])
    starts = np.array([0, 3, 6])
    assert max_rows(values, starts).tolist() == [1, 4, 6]
    assert bucket_starts(np.arange(5), 10).tolist() == [0, 1, 2, 3, 4]     # short series: every row
