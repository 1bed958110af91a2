"""Check every record the capture child sends before the parent uses it: ``checked(line)`` gives the message or raises ``Refused``.

Nothing from the script's side of the pipe is trusted (see ``channel``): each line must be one JSON
array of a known kind with exactly its fields, each of the right type (an ``int`` is never a
``bool`` or a float) and within its range; strings are bounded. A line that breaks any rule is
refused with the rule it broke, and the capture ends there (``session``): a record the capture
cannot take is never dropped silently, and no field reaches the trace builder, the allocator model
or a message unchecked. ``MAX_REQUEST_BYTES`` is the trace builder's own limit (1 PiB): no device
has that much memory, and a request above it is a bug in the script (``torch.empty(n * n)``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..trace.reading.builder import MAX_SIZE_BYTES
from .channel import MAX_FRAME_BYTES, MAX_TEXT_CHARS

#: The largest request the capture takes: the trace builder's limit.
MAX_REQUEST_BYTES = MAX_SIZE_BYTES
#: Times, addresses and stream numbers stay below this (later sums cannot wrap an int64).
MAX_INT = 1 << 62
#: Frames one stack may carry (the child keeps 24 of the script's, plus a few of its own).
MAX_STACK_FRAMES = 64
#: Stack ids and question ids the child may use.
MAX_ID = 1 << 31
PHASES = frozenset({"f", "b", "o"})
#: Bytes of a summary, header or fact (a JSON object: the summary carries the write guard's journal).
MAX_SUMMARY_BYTES = MAX_FRAME_BYTES
_DECODE = json.JSONDecoder().decode


class Refused(ValueError):
    """A record the capture cannot take; the message says which rule it broke."""


def _int(value: Any, what: str, low: int = 0, high: int = MAX_INT) -> int:
    if type(value) is not int:
        raise Refused(f"{what} is {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise Refused(f"{what} {value} is outside {low}..{high}")
    return value


def _str(value: Any, what: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    if type(value) is not str:
        raise Refused(f"{what} is {type(value).__name__}, not a string")
    if len(value) > max_chars:
        raise Refused(f"{what} has {len(value)} characters (at most {max_chars})")
    return value


def request_size(value: Any) -> int:
    """A request's size: a positive integer of at most 1 PiB (else ``Refused`` naming it)."""
    size = _int(value, "the request's size", 1, MAX_INT)
    if size > MAX_REQUEST_BYTES:
        raise Refused(f"a request of {size:,} bytes, over the {MAX_REQUEST_BYTES:,} bytes (1 PiB) the capture takes "
                      "(no device has that much memory: a size computed wrong in the script?)")
    return size


def _request(m: list[Any], first: int) -> tuple:
    """``A`` and ``R``'s request fields from ``m[first]`` on: (t_ns, addr, size, stream, stack, phase).

    The size is checked against 1 PiB by the caller (a card's out-of-memory error comes first).
    """
    _arity(m, first + 6)
    t_ns, addr, size, stream, stack, phase = m[first:]
    phase = _str(phase, "the phase", 1)
    if phase not in PHASES:
        raise Refused(f"unknown phase {phase!r}")
    return (_int(t_ns, "the time"), _int(addr, "the address"), _int(size, "the request's size", 1, MAX_INT),
            _int(stream, "the stream", 0, MAX_ID), _int(stack, "the stack id", -1, MAX_ID), phase)


def _arity(m: list[Any], n: int) -> None:
    if len(m) != n:
        raise Refused(f"a {m[0]!r} record has {len(m)} fields, not {n}")


def _frames(value: Any) -> list[tuple[str, int, str]]:
    if type(value) is not list or len(value) > MAX_STACK_FRAMES:
        raise Refused(f"a stack's frames must be a list of at most {MAX_STACK_FRAMES}")
    frames = []
    for frame in value:
        if type(frame) is not list or len(frame) != 3:
            raise Refused("a frame must be [filename, line, name]")
        frames.append((_str(frame[0], "a frame's file"), _int(frame[1], "a frame's line", 0, MAX_ID),
                       _str(frame[2], "a frame's name")))
    return frames


def _object(value: Any, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise Refused(f"{what} is {type(value).__name__}, not an object")
    return value


def checked(line: bytes) -> tuple:
    """The message on ``line`` as a tuple whose first item is its kind, every field checked (else ``Refused``)."""
    try:
        m = _DECODE(line.decode("utf-8"))
    except (ValueError, RecursionError) as exc:     # not UTF-8 or JSON, a number past int's digit limit, too deep
        raise Refused(f"not a JSON record ({type(exc).__name__})") from None
    if type(m) is not list or not m or type(m[0]) is not str:
        raise Refused("a record must be a JSON array whose first item names its kind")
    kind = m[0]
    if kind == "A":
        return (kind, *_request(m, 1))
    if kind == "R":
        if len(m) < 2:
            raise Refused("an 'R' record has no question id")
        return (kind, _int(m[1], "the question id", 0, MAX_ID), *_request(m, 2))
    if kind in ("F", "P", "K"):
        _arity(m, 4)
        return kind, _int(m[1], "the time"), _int(m[2], "the address"), _int(m[3], "the stream", 0, MAX_ID)
    if kind == "S":
        _arity(m, 3)
        return kind, _int(m[1], "the stack id", 0, MAX_ID), _frames(m[2])
    if kind == "C":
        _arity(m, 3)
        return kind, _int(m[1], "the address"), _str(m[2], "the category", 64)
    if kind == "M":
        _arity(m, 3)
        return kind, _int(m[1], "the time"), _str(m[2], "the marker")
    if kind == "E":
        _arity(m, 2)
        return kind, _int(m[1], "the time")
    if kind in ("N", "Z"):
        _arity(m, 2)
        return kind, _str(m[1], "the note")
    if kind == "Q":
        _arity(m, 3)
        return kind, _int(m[1], "the question id", 0, MAX_ID), _str(m[2], "the question", 64)
    if kind in ("H", "D", "X"):
        _arity(m, 2)
        if len(line) > MAX_SUMMARY_BYTES:
            raise Refused(f"a {kind!r} record of {len(line):,} bytes (at most {MAX_SUMMARY_BYTES:,})")
        return kind, _object(m[1], "the summary")
    raise Refused(f"unknown record kind {kind[:20]!r}")


def plain(value: Any, depth: int = 3) -> Any:
    """``value`` cut down to what a trace's metadata may hold: JSON scalars, short strings, small lists and objects."""
    if value is None or type(value) is bool:
        return value
    if type(value) is int:
        return value if -MAX_INT <= value <= MAX_INT else None
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is str:
        return value[:MAX_TEXT_CHARS]
    if depth <= 0:
        return None
    if type(value) is list:
        return [plain(v, depth - 1) for v in value[:64]]
    if type(value) is dict:
        return {str(k)[:200]: plain(v, depth - 1) for k, v in list(value.items())[:64]}
    return None
