"""Fuzz rmm_scan (rmm_scan.c) with raw CSV text; diff both routes when it accepts.

``python -m tests.fuzz.fuzz_rmm --seconds 600`` on the sanitizer build (README.md here). Seeds: the
repository's RMM test logs and the attack suite's valid logs. The header is parsed in Python (as
the reader does), so the scan gets the body and the header's column indices; every input is also
scanned with column indices from -2 to 97, whatever the field count. When the scan accepts, the whole log is read on
both routes and must give the same trace or the same error.
"""

from __future__ import annotations

import zlib

from tests.fuzz import common, engine

from allocsim.trace.reading import compiled
from allocsim.errors import TraceFormatError
from allocsim.trace.formats.rmm.reader import _header_of, _parse_header

TOKENS = [b"allocate", b"free", b"allocate failure", b"Allocate", b"0x", b"(nil)", b"nullptr", b",", b"\n", b"\r\n",
          b"Thread,Time,Action,Pointer,Size,Stream\n", b"Action,Pointer,Size\n", b"23:59:60.999999999", b"00:00:00",
          b"0xffffffffffffffff", b"1125899906842624", b"999999999999999999", b" ", b"+", b"\t"]


def seeds():
    for path in sorted((common.ROOT / "tests" / "data" / "rmm").glob("*.csv")):
        yield path.read_bytes()
    yield from common.attack_seeds(["rmm"])


def _header(data: bytes) -> tuple[dict[str, int], int, int] | None:
    """The reader's own header parse (rmm._read_columnar): column indices, field count, body offset."""
    head = _header_of(data)
    if head is None:
        return None
    number, header_end, line = head
    text = line.decode("utf-8", "replace").strip()
    fields = [f.strip() for f in (text.lstrip("\ufeff") if number == 1 else text).split(",")]
    try:
        return _parse_header("fuzz.csv", f"line {number}", fields), len(fields), header_end
    except TraceFormatError:
        return None


def target(data: bytes) -> None:
    common.watchdog()
    head = _header(data)
    scan = None
    if head is not None:
        columns, n_columns, header_end = head
        body = memoryview(data)[header_end:]
        idx = [columns.get(k, -1) for k in ("action", "pointer", "size", "time", "stream", "thread")]
        if min(idx[:3]) >= 0:
            scan = compiled.ext.rmm_scan(body, n_columns, *idx)
        mix = zlib.crc32(data)
        wild = [(mix >> (5 * k)) % 100 - 2 for k in range(6)]      # indices from -2 to 97, whatever the header
        try:
            compiled.ext.rmm_scan(body, n_columns, *wild)
        except ValueError:      # an index outside the fields: refused, as a caller's mistake should be
            pass
    if scan is not None or zlib.crc32(data) % 32 == 0:
        common.compare_routes(data, ".csv", format="rmm-csv")


if __name__ == "__main__":
    engine.main("rmm", target, seeds, TOKENS)
