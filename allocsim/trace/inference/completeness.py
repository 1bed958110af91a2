"""Whether a trace records its program to the end: read ``trace.meta.incomplete`` ("" when it does).

Only ``allocsim capture`` can know that a recording stops early: it writes why in the trace's
metadata (the script raised, exited with an error, was interrupted, reached ``--timeout``, was
killed). A trace ``allocsim scale`` predicts from such captures inherits the reason. Kineto traces,
PyTorch snapshots and allocator logs hold what their recorder kept and are never incomplete in this
sense. Every command that judges a trace (``run``, ``scale``, ``advise``, ``report``, ``fit``) says
so in its verdict line and exits with ``EXIT_INCOMPLETE`` unless told ``--allow-incomplete``.
"""

from __future__ import annotations

from typing import Any

#: How the reason is said where captures written before ``TraceMeta.incomplete`` existed put it: a note.
NOTE_PREFIX = "incomplete: "
#: The reason is one phrase in a verdict line: longer ones (a script's whole error message) are cut.
MAX_REASON_CHARS = 300


def short_reason(text: str) -> str:
    """``text`` on one line and at most ``MAX_REASON_CHARS`` characters (what a verdict line quotes)."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 3] + "..."


def reason_from_header(incomplete: Any, notes: list[Any], version_hints: dict[str, Any]) -> str:
    """The checked reason of a trace file's metadata (``TypeError`` when it is not text).

    A capture written before the field existed said it only in a note (``incomplete: ...``): that
    note is the reason then, for captures alone (``version_hints["capture"]``).
    """
    if not isinstance(incomplete, str):
        raise TypeError("meta.incomplete is not a string")
    if incomplete.strip():
        return short_reason(incomplete)
    if version_hints.get("capture"):
        for note in notes:
            if isinstance(note, str) and note.startswith(NOTE_PREFIX):
                return short_reason(note[len(NOTE_PREFIX):])
    return ""


def predicted_reason(inputs: list[tuple[str, str]]) -> str:
    """The reason of a trace predicted from ``inputs`` (``(name, reason)``; "" for a complete input)."""
    stopped = [(name, reason) for name, reason in inputs if reason]
    if not stopped:
        return ""
    name, reason = stopped[0]
    more = f" and {len(stopped) - 1} more" if len(stopped) > 1 else ""
    return short_reason(f"predicted from {name}{more}, which stops early: {reason}")


__all__ = ["MAX_REASON_CHARS", "NOTE_PREFIX", "predicted_reason", "reason_from_header", "short_reason"]
