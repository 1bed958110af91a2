"""Fuzz every compiled reader function with odd arguments, as a buggy caller could pass them.

``python -m tests.fuzz.fuzz_api --seconds 600`` on the sanitizer build (README.md here). The fuzzer's
bytes choose a function and its arguments: columns of the right width and length (mostly), of the
wrong width, one item short or long, strided, two-dimensional, or plain bytes; values from small
ranges (so that life cycles are often valid) or from the int64 extremes; limits and indices that
are negative, zero or huge. A caller's mistake may raise ValueError, TypeError, BufferError,
OverflowError or MemoryError, never corrupt memory; any other exception is a finding. Where the
columns are well formed, build_records must also equal columnar.build_columns_reference.
"""

from __future__ import annotations

import numpy as np

from tests.fuzz import common, engine

from allocsim.policies import kernel
from allocsim.trace.reading import compiled
from allocsim.trace.reading.columnar import Records, build_columns, build_columns_reference

EXPECTED = (ValueError, TypeError, BufferError, OverflowError, MemoryError)
EXTREMES = [0, 1, -1, 2, 3, 511, 512, 1 << 31, -(1 << 31), (1 << 50), (1 << 50) + 1, (1 << 62), (1 << 63) - 1,
            -(1 << 63), (1 << 63) - 1000, 32767, 32768, -32769, 65535]


class Provider:
    """Values read off the fuzzer's bytes (zeros once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1] if self.pos <= len(self.data) else 0

    def int_below(self, n: int) -> int:
        return (self.byte() | self.byte() << 8) % n if n > 1 else 0

    def number(self) -> int:
        """A small number most of the time, an extreme one otherwise."""
        kind = self.byte() % 4
        if kind < 2:
            return self.int_below(8) - 1
        if kind == 2:
            return EXTREMES[self.int_below(len(EXTREMES))]
        return int.from_bytes(bytes(self.byte() for _ in range(8)), "little", signed=True)

    def column(self, dtype, n: int):
        """A column meant to be `n` items of `dtype`, sometimes malformed."""
        shape = self.byte() % 16
        length = n if shape < 12 else max(0, n + (1 if shape == 12 else -1))
        info = np.iinfo(dtype)
        values = np.array([min(max(self.number(), info.min), info.max) for _ in range(length)], dtype=np.int64)
        column = values.astype(dtype)
        if shape == 13:
            return column.astype(np.int16 if np.dtype(dtype).itemsize != 2 else np.int64)     # the wrong width
        if shape == 14:
            return np.repeat(column, 2)[::2] if length else column[::-1]                     # strided
        if shape == 15:
            return column.tobytes() if self.byte() % 2 else column.reshape(1, -1)
        return column


def _records(p: Provider, n: int) -> list:
    t = np.cumsum([p.int_below(3) - (p.byte() % 32 == 0) for _ in range(n)]).astype(np.int64)
    op = np.array([1 + p.int_below(7) for _ in range(n)], dtype=np.uint8)
    cols = [t, op] + [p.column(np.int64, n) for _ in range(4)] + [p.column(np.int32, n), p.column(np.int64, n)]
    if p.byte() % 4 == 0:
        cols[0] = p.column(np.int64, n)
    if p.byte() % 4 == 0:
        cols[1] = p.column(np.uint8, n)
    return cols


def _build_records(p: Provider) -> None:
    n = p.int_below(40)
    cols = _records(p, n)
    first, memory = p.number(), p.number() if p.byte() % 4 == 0 else 1 << 46
    compiled.ext.build_records(*cols, first, memory)
    well_formed = all(isinstance(c, np.ndarray) and c.ndim == 1 and len(c) == n for c in cols) and \
        [c.dtype for c in cols] == [np.int64, np.uint8, np.int64, np.int64, np.int64, np.int64, np.int32, np.int64]
    # the contract: record kinds readers make (OP_ALLOC .. OP_NONE), devices that fit int16
    if well_formed and 0 <= first < 1 << 40 and ((cols[1] >= 1) & (cols[1] <= 7)).all() \
            and ((cols[2] >= -(1 << 15)) & (cols[2] < 1 << 15)).all():
        rec = Records(*cols)
        ref = build_columns_reference(rec, first_alloc_id=first)
        with kernel.route("compiled"):
            got = build_columns(rec, first_alloc_id=first)
        if (got is None) != (ref is None):
            raise common.Divergence(f"build_records: compiled {'None' if got is None else 'columns'}, "
                                    f"reference {'None' if ref is None else 'columns'}")
        if ref is not None:
            for table in ("events", "initial"):
                for col, values in getattr(ref, table).items():
                    if not np.array_equal(getattr(got, table)[col], values):
                        raise common.Divergence(f"build_records: {table}.{col} differs")
            for name in ("row_event", "row_alloc_id", "row_alloc_size"):
                if not np.array_equal(getattr(got, name), getattr(ref, name)):
                    raise common.Divergence(f"build_records: {name} differs")


def _events_check(p: Provider) -> None:
    n = p.int_below(40)
    compiled.ext.events_check(p.column(np.int64, n), p.column(np.uint8, n), p.column(np.int64, n),
                              p.column(np.int64, n), p.column(np.int16, n), p.column(np.int64, p.int_below(5)),
                              p.number())


def _live_bytes(p: Provider) -> None:
    n = p.int_below(40)
    compiled.ext.live_bytes(p.column(np.uint8, n), p.column(np.int64, n), p.column(np.int64, n),
                            p.column(np.int64, p.int_below(5)), p.number())


def _op_sweep(p: Provider) -> None:
    n_ops, n_mem, n_groups = p.int_below(20), p.int_below(20), p.int_below(4)
    og = np.sort(np.array([p.int_below(n_ops + 2) for _ in range(n_groups + 1)], dtype=np.int64))
    mg = np.sort(np.array([p.int_below(n_mem + 2) for _ in range(n_groups + 1)], dtype=np.int64))
    if p.byte() % 4 == 0:
        og, mg = p.column(np.int64, n_groups + 1), p.column(np.int64, n_groups + 1)
    start = np.sort(p.column(np.int64, n_ops)) if p.byte() % 2 else p.column(np.int64, n_ops)
    compiled.ext.op_sweep(start, p.column(np.int64, n_ops), og, p.column(np.int64, n_mem), mg)


def _intern_stacks(p: Provider) -> None:
    n = p.int_below(40)
    parent = np.array([p.int_below(i + 1) - 1 for i in range(n)], dtype=np.int64)
    if p.byte() % 4 == 0:
        parent = p.column(np.int64, n)
    compiled.ext.intern_stacks(parent, p.column(np.int64, n), p.number(), p.number())


def _text(p: Provider) -> bytes:
    return p.data[p.pos:p.pos + p.int_below(4096)]


def _scans(p: Provider) -> None:
    which = p.byte() % 3
    limits = [p.number() for _ in range(8)]
    data = _text(p)
    if which == 0:
        compiled.ext.snapshot_scan(data, *limits, bool(p.byte() % 2))
    elif which == 1:
        compiled.ext.chrome_scan(data, *limits[:3])
    else:
        compiled.ext.rmm_scan(data, *[max(-(1 << 31), min(v, (1 << 31) - 1)) for v in limits[:7]])


CALLS = [_build_records, _events_check, _live_bytes, _op_sweep, _intern_stacks, _scans]


def target(data: bytes) -> None:
    common.watchdog()
    p = Provider(data)
    try:
        CALLS[p.byte() % len(CALLS)](p)
    except EXPECTED:
        pass


def seeds():
    rng = np.random.default_rng(0)
    for k in range(64):
        yield bytes([k % len(CALLS)]) + rng.integers(0, 256, 64 + 8 * k, dtype=np.uint8).tobytes()


if __name__ == "__main__":
    engine.main("api", target, seeds)
