"""Measure where the CUDA driver put cudaMalloc segments in real snapshots: ``python -m validate addresses FILES``.

The ``pytorch`` preset places new segments by the rule in ``allocsim.driver_addresses`` (see
docs/addresses.md). This module counts the evidence for it in PyTorch snapshots, per file and device:

* **placements**: each recorded ``segment_alloc`` (cudaMalloc; expandable segments are left out)
  against the segments live just before it, walking from the start-of-window state: below every
  live segment, above every one, or between two; inside a range freed earlier in the window; right
  at the end of a live segment (packed into the rest of its chunk); at a 32 MiB boundary. Small
  (2 MiB, the small pool's) and large segments are counted apart;
* **layout**: the final segments' alignment, and whether each starts right where another ends;
* **series**: files of one process (they share segments at the same addresses) compared in pairs:
  where the later file's new segments lie against the earlier file's;
* **replays**: the recording replayed through the ``pytorch`` preset with the segments placed by
  the simulated device instead of at their recorded addresses (``validate.fidelity``,
  ``recorded_addresses=False``), in each address order: decisions matched and the peak reserved
  error. This is the test of the rule that matters: PyTorch breaks best-fit ties by address.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from allocsim.device import ADDRESS_ORDERS
from allocsim.driver_addresses import CHUNK_BYTES, SMALL_SEGMENT_BYTES, FreeRanges
from allocsim.trace import read_trace
from allocsim.trace.schema import Trace

from .fidelity import check_trace

#: Segment addresses at or above this are in the mmap area near the top of Linux's 47-bit user
#: space (0x7f...); the rest (0x3..., 0xb...) came from drivers that hand out low addresses.
HIGH_ADDRESS = 1 << 44
PLACES = ("below_all", "between", "above_all")
#: Segments two files must share (same address and size) to count as one process's.
SERIES_MIN_SHARED = 8


def _segments(trace: Trace, device: int) -> dict[int, int]:
    segs = trace.initial_segments
    segs = segs[(segs["device"] == device) & ~segs["is_expandable"].astype(bool)]
    return {int(a): int(s) for a, s in zip(segs["addr"].tolist(), segs["size_bytes"].tolist())}


def _class(size_bytes: int) -> str:
    return "small" if size_bytes <= SMALL_SEGMENT_BYTES else "large"


def placements(trace: Trace, device: int) -> dict[str, Any]:
    """Count where each recorded cudaMalloc of ``device`` landed against the segments live before it."""
    live = _segments(trace, device)
    ends = {a + s for a, s in live.items()}
    freed = FreeRanges()   # ranges freed in the window and not reused since
    counts: dict[str, dict[str, int]] = {}
    dec = trace.decisions
    dec = dec[(dec["device"] == device) & dec["action"].isin(["segment_alloc", "segment_free"])]
    for action, addr, size in zip(dec["action"].tolist(), dec["addr"].tolist(), dec["size_bytes"].tolist()):
        addr, size = int(addr), int(size)
        if action == "segment_free":
            if live.pop(addr, None) is not None:
                ends.discard(addr + size)
                freed.add(addr, size)
            continue
        row = counts.setdefault(_class(size), {"segments": 0, **{p: 0 for p in PLACES}, "in_freed_range": 0,
                                              "right_after_a_segment": 0, "at_32MiB_boundary": 0})
        row["segments"] += 1
        if live:
            low = min(live)
            high = max(a + s for a, s in live.items())
            row["below_all" if addr + size <= low else "above_all" if addr >= high else "between"] += 1
        if freed.containing(addr) is not None:
            row["in_freed_range"] += 1
        freed.carve(addr, size)
        row["right_after_a_segment"] += addr in ends
        row["at_32MiB_boundary"] += addr % CHUNK_BYTES == 0
        live[addr] = size
        ends.add(addr + size)
    return counts


def final_segments(trace: Trace, device: int) -> dict[int, int]:
    """The segments of ``device`` at the end of the recording (start state walked through the window)."""
    live = _segments(trace, device)
    dec = trace.decisions
    dec = dec[(dec["device"] == device) & dec["action"].isin(["segment_alloc", "segment_free"])]
    for action, addr, size in zip(dec["action"].tolist(), dec["addr"].tolist(), dec["size_bytes"].tolist()):
        if action == "segment_alloc":
            live[int(addr)] = int(size)
        else:
            live.pop(int(addr), None)
    return live


def layout(segments: dict[int, int]) -> dict[str, Any]:
    """Alignment and packing of a set of segments, small and large apart."""
    ends = {a + s for a, s in segments.items()}
    out: dict[str, Any] = {"family": ("high" if segments and min(segments) >= HIGH_ADDRESS else "low")
                           if segments else None}
    for cls in ("small", "large"):
        addrs = [a for a, s in segments.items() if _class(s) == cls]
        out[cls] = {"segments": len(addrs), "at_32MiB_boundary": sum(a % CHUNK_BYTES == 0 for a in addrs),
                    "right_after_a_segment": sum(a in ends for a in addrs)}
    return out


def series(named: Iterable[tuple[str, dict[str, int] | dict[int, int]]]) -> list[dict[str, Any]]:
    """Files of one process compared in pairs: where the later file's new segments lie against the earlier's.

    Two files are of one process when they share at least ``SERIES_MIN_SHARED`` segments (same
    address and size) and a tenth of the smaller file's; the later is the one that reserves more (a
    process running sizes in turn keeps what it cached).
    """
    items = [(name, segs) for name, segs in named if segs]
    rows = []
    for i, (name_a, a) in enumerate(items):
        for name_b, b in items[i + 1:]:
            shared = set(a.items()) & set(b.items())
            if len(shared) < max(SERIES_MIN_SHARED, min(len(a), len(b)) / 10):
                continue   # a few equal (address, size) pairs happen between unrelated runs
            (early_name, early), (late_name, late) = sorted(((name_a, a), (name_b, b)),
                                                           key=lambda item: sum(item[1].values()))
            low, high = min(early), max(x + s for x, s in early.items())
            new = [(x, s) for x, s in late.items() if (x, s) not in shared]
            rows.append({"earlier": early_name, "later": late_name, "shared_segments": len(shared),
                         "new_segments": len(new),
                         "below_all": sum(x + s <= low for x, s in new),
                         "above_all": sum(x >= high for x, s in new),
                         "between": sum(x + s > low and x < high for x, s in new)})
    return rows


def replays(trace: Trace, device: int) -> dict[str, Any]:
    """Decisions matched with the segments placed by the device, per address order (no recorded addresses)."""
    out = {}
    for order in ADDRESS_ORDERS:
        rep = check_trace(trace, device, address_order=order, recorded_addresses=False)
        out[order] = {"decisions": rep["decisions"], "matched": rep["matched"],
                      "peak_reserved_error_bytes": rep["predicted_peak_reserved_bytes"] - rep["real_peak_reserved_bytes"]}
    return out


def measure(paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """Every measurement above for each file (and device); ``totals`` adds the placements and replays up."""
    files = []
    finals = []
    totals: dict[str, Any] = {"placements": {}, "replays": {o: {"decisions": 0, "matched": 0} for o in ADDRESS_ORDERS}}
    for path in paths:
        trace = read_trace(path)
        name = os.path.basename(os.fspath(path))
        for device in trace.devices:
            row: dict[str, Any] = {"file": name, "device": device}
            final = final_segments(trace, device)
            row["layout"] = layout(final)
            finals.append((f"{name}:{device}", final))
            counts = placements(trace, device)
            if counts:
                row["placements"] = counts
                row["replays"] = replays(trace, device)
                for cls, c in counts.items():
                    tot = totals["placements"].setdefault(cls, dict.fromkeys(c, 0))
                    for key, value in c.items():
                        tot[key] += value
                for order, r in row["replays"].items():
                    totals["replays"][order]["decisions"] += r["decisions"]
                    totals["replays"][order]["matched"] += r["matched"]
            files.append(row)
    return {"files": files, "series": series(finals), "totals": totals}


def format_measure(report: dict[str, Any]) -> str:
    """The measurements as text tables."""
    lines = ["cudaMalloc placements (walked from the start-of-window state):",
             "file | dev | class | segments | below all | between | above all | in freed range | "
             "right after a segment | at 32 MiB"]
    for row in report["files"]:
        for cls, c in sorted(row.get("placements", {}).items()):
            lines.append(f"{row['file']} | {row['device']} | {cls} | {c['segments']} | {c['below_all']} | "
                         f"{c['between']} | {c['above_all']} | {c['in_freed_range']} | "
                         f"{c['right_after_a_segment']} | {c['at_32MiB_boundary']}")
    for cls, c in sorted(report["totals"]["placements"].items()):
        lines.append(f"all | - | {cls} | {c['segments']} | {c['below_all']} | {c['between']} | {c['above_all']} | "
                     f"{c['in_freed_range']} | {c['right_after_a_segment']} | {c['at_32MiB_boundary']}")
    lines += ["", "replays with the segments placed by the device (decisions matched, peak reserved error):",
              "file | dev | " + " | ".join(ADDRESS_ORDERS)]
    for row in report["files"]:
        if "replays" in row:
            lines.append(f"{row['file']} | {row['device']} | " + " | ".join(
                f"{r['matched']:,}/{r['decisions']:,} ({r['peak_reserved_error_bytes']:+,} B)"
                for r in row["replays"].values()))
    lines.append("all | - | " + " | ".join(f"{r['matched']:,}/{r['decisions']:,}"
                                          for r in report["totals"]["replays"].values()))
    lines += ["", "final segments (family: high = 0x7f... mmap area, low = below 2**44):",
              "file | dev | family | small: segments, at 32 MiB, right after one | large: segments, at 32 MiB, right after one"]
    for row in report["files"]:
        lay = row["layout"]
        if lay["family"] is None:
            continue
        s, g = lay["small"], lay["large"]
        lines.append(f"{row['file']} | {row['device']} | {lay['family']} | {s['segments']}, {s['at_32MiB_boundary']}, "
                     f"{s['right_after_a_segment']} | {g['segments']}, {g['at_32MiB_boundary']}, {g['right_after_a_segment']}")
    if report["series"]:
        lines += ["", "files of one process (later file's new segments against the earlier file's range):",
                  "earlier | later | shared | new | below all | between | above all"]
        for r in report["series"]:
            lines.append(f"{r['earlier']} | {r['later']} | {r['shared_segments']} | {r['new_segments']} | "
                         f"{r['below_all']} | {r['between']} | {r['above_all']}")
    return "\n".join(lines)
