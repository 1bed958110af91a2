"""Name the runs that failed: ``error_groups(rows)`` gives each distinct error once, with the rows it hit.

A sweep or ``advise`` row whose run raised keeps the message in its ``error`` column. A count alone
("3 with errors") tells a user nothing to act on, so both commands print every distinct message
with the rows that ended in it (trace, policy, settings, device, capacity), enough to rerun one
with ``allocsim run``, and exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

#: Rows named per distinct error (the count says how many more).
EXAMPLE_ROWS = 3


@dataclass(frozen=True)
class ErrorGroup:
    """One distinct error message, how many rows ended in it, and the first few of them."""

    error: str
    count: int
    rows: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "rows": self.count, "examples": list(self.rows)}


def _present(value: Any) -> bool:
    return value is not None and value == value   # NaN (a Parquet null read back) is absent too


def row_text(row: dict[str, Any]) -> str:
    """The row in a user's words: trace, policy, the settings it changed, device and capacity."""
    settings = " ".join(f"{key[len('param.'):]}={row[key]}" for key in sorted(row)
                        if key.startswith("param.") and _present(row[key]))
    parts = [f"trace {row.get('trace')}", f"policy {row.get('policy')}", f"settings {settings or '(defaults)'}"]
    if _present(row.get("device")):
        parts.append(f"device {int(row['device'])}")
    if _present(row.get("capacity_bytes")):
        parts.append(f"capacity {int(row['capacity_bytes']):,} bytes")
    return ", ".join(parts)


def error_groups(rows: Iterable[dict[str, Any]]) -> list[ErrorGroup]:
    """Every distinct ``error`` of ``rows``, in the order first met, with its count and first rows."""
    found: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        error = row.get("error")
        if not _present(error):
            continue
        counts[error] = counts.get(error, 0) + 1
        examples = found.setdefault(error, [])
        if len(examples) < EXAMPLE_ROWS:
            examples.append(row_text(row))
    return [ErrorGroup(error, counts[error], tuple(examples)) for error, examples in found.items()]


def format_error_groups(groups: list[ErrorGroup], what: str = "rows") -> list[str]:
    """Text lines: a head line, then each error with the rows it hit (empty when nothing failed)."""
    if not groups:
        return []
    total = sum(g.count for g in groups)
    lines = [f"{total} {what} ended in an error ({len(groups)} distinct; these {what} have no results):"]
    for group in groups:
        lines.append(f"  error: {group.error}")
        more = group.count - len(group.rows)
        for text in group.rows:
            lines.append(f"    in {text}")
        if more:
            lines.append(f"    and {more} more {what}")
    return lines


__all__ = ["ErrorGroup", "error_groups", "format_error_groups", "row_text"]
