"""Fuzz chrome_scan (chrome_scan.c) with raw JSON text; diff both routes when it accepts.

``python -m tests.fuzz.fuzz_chrome --seconds 600`` on the sanitizer build (README.md here). Seeds:
the shared and repository Kineto traces cut down to a few events of every name (their [memory]
events, CPU ops, steps and OOMs kept), the test data and the attack suite's Kineto files. Every
input is scanned with the default limits, with a nesting limit far past any real file, and with a
budget of a few bytes per input byte; when the scan accepts it, the whole file is read on both
routes (op_sweep, intern_stacks, build_records, events_check and live_bytes run on it too) and must
give the same trace or the same error.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter

from tests.fuzz import common, engine

from allocsim.trace.reading import compiled
from allocsim.trace.reading.limits import DEFAULT_LIMITS as L

TOKENS = [b'"traceEvents"', b'"[memory]"', b'"args"', b'"Addr"', b'"Bytes"', b'"Device Type"', b'"Device Id"',
          b'"Total Allocated"', b'"Total Reserved"', b'"ph"', b'"X"', b'"cat"', b'"cpu_op"', b'"python_function"',
          b'"name"', b'"ts"', b'"dur"', b'"pid"', b'"tid"', b'"ProfilerStep#1"', b'"[OutOfMemory]"', b"\\u0000",
          b"\\ud83d\\ude00", b"\\udc00", b"\\\\", b"null", b"true", b"false", b"{}", b"[]", b"1e999", b"-0.5",
          b'"schemaVersion"', b'"displayTimeUnit"', b'"baseTimeNanoseconds"', b"\xc3\xa9", b"\xed\xa0\x80"]


def _cut(doc, per_name: int = 6):
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return doc
    seen: Counter = Counter()
    kept = []
    for ev in events:
        name = ev.get("name") if isinstance(ev, dict) else None
        key = name if name in ("[memory]", "[OutOfMemory]") else (ev.get("cat") if isinstance(ev, dict) else None)
        seen[key] += 1
        if seen[key] <= (40 if name == "[memory]" else per_name):
            kept.append(ev)
    return dict(doc, traceEvents=kept) if isinstance(doc, dict) else kept


def seeds():
    paths = [*common.shared_files("kineto-gpu/*.json*"), *sorted(common.REPO_TRACES.glob("*.json.gz")),
             *sorted((common.ROOT / "tests" / "data" / "kineto").glob("*.json*"))]
    for path in paths:
        text = common.read_maybe_gz(path)
        yield json.dumps(_cut(json.loads(text))).encode()
    yield from common.attack_seeds(["kineto", "huge number"])


def target(data: bytes) -> None:
    common.watchdog()
    scan = compiled.ext.chrome_scan(data, L.memory_bytes, L.depth, L.events)
    compiled.ext.chrome_scan(data, L.memory_bytes, 1 << 40, L.events)
    compiled.ext.chrome_scan(data, 4 * len(data), L.depth, 50)
    if scan is not None or zlib.crc32(data) % 32 == 0:
        common.compare_routes(data, ".json", format="kineto")


if __name__ == "__main__":
    engine.main("chrome", target, seeds, TOKENS)
