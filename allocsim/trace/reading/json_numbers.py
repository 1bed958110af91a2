"""Exact integers and nanoseconds from the numbers a JSON trace writes: ``as_int(value)``, ``ts_to_ns(ts)``.

Chrome traces (Kineto, Paddle) write sizes and addresses as JSON integers or as text, and times in
microseconds as integers, floats or decimal text; these read each exactly, never through binary
floating point, and answer None for anything that is not such a number (ASCII digits only).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")
_HEX_RE = re.compile(r"[+-]?0[xX][0-9a-fA-F]+")
_DEC_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")


def _plain_ascii(text: str) -> bool:
    """Whether number text is ASCII without ``_``: ``int`` and ``Decimal`` would read Arabic-Indic or
    fullwidth digits and ``1_0``, which no JSON writer produces and the compiled scanners refuse."""
    return text.isascii() and "_" not in text


def as_int(value: Any) -> int | None:
    """An integer from a JSON int or an integral number text (``"8192"``, ``"8192.0"``, ``"0x1f"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 40 or not _plain_ascii(text):
            return None
        if _INT_RE.fullmatch(text):
            return int(text)
        if _HEX_RE.fullmatch(text):
            return int(text, 16)
        try:
            dec = Decimal(text)
        except (InvalidOperation, ValueError):
            return None
        if dec.is_finite() and dec == dec.to_integral_value() and abs(dec.adjusted()) < 40:
            return int(dec)
    return None


def ts_to_ns(value: Any) -> int | None:
    """Exact integer nanoseconds from a Chrome-trace ``ts`` in microseconds, or None if it is not a number.

    Accepts ints, floats and decimal text (``"5093554565374.3"`` -> 5093554565374300).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        # repr() is the shortest text that round-trips, i.e. what the file said.
        value = repr(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) > 60 or not _plain_ascii(text):
        return None
    m = _DEC_RE.fullmatch(text)
    if m and (m.group(2) or m.group(3)):
        sign, whole, frac = m.group(1), m.group(2) or "0", m.group(3) or ""
        frac_ns = (frac + "000")[:3]
        ns = int(whole) * 1000 + int(frac_ns)
        rest = frac[3:]
        if rest and rest.strip("0"):
            # Round half to even on the digits below 1 ns.
            first, tail = rest[0], rest[1:]
            if first > "5" or (first == "5" and (tail.strip("0") or ns % 2 == 1)):
                ns += 1
        return -ns if sign == "-" else ns
    try:
        dec = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    if not dec.is_finite() or abs(dec.adjusted()) > 30:
        return None
    return int((dec * 1000).to_integral_value())
