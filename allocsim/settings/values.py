"""The number syntax every numeric setting shares: ``finite_number(key, token, low=0, high=1)`` reads one.

``--alloc-conf``, ``--flags``, ``--policy NAME:KEY:VALUE`` and ``--set`` read their numbers here:
ASCII decimal digits only (an optional sign, a decimal point, an exponent), so Arabic-Indic or
fullwidth digits, superscripts (``²``) and Python's ``1_0`` are refused instead of read as
numbers, each value is range-checked, and every refusal is one ``ValueError`` line naming the
setting (never Python's own message). PyTorch's ``strtod`` / Paddle's gflags read the same
numbers; the rules that really differ (PyTorch's ``True`` vs gflags' ``true``, whole MB) stay
with each reader.
"""

from __future__ import annotations

import math
import re

from ..errors import quote

#: The most memory a setting may name: 1 PiB (2**50 bytes), past any device's memory (and the
#: readers' cap on one allocation); a larger value is a typo, not a device.
LARGEST_SETTING_BYTES = 1 << 50
LARGEST_WHY = "1 PiB, more memory than any device has"
#: Characters a number may take: more is never a setting (and ``int`` refuses past 4,300 digits).
NUMBER_CHARS = 64
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_WHOLE = re.compile(r"\+?[0-9]+", re.ASCII)


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """``[0.0, 1.0]``, ``(0.0, 1.0)``, ``>= 20``, ``<= 1,048,576``: the range as the error says it."""
    shown = lambda v: f"{v:,}" if isinstance(v, int) else repr(v)
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{shown(low)}, {shown(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {shown(low)}"
    return f"{'<' if high_open else '<='} {shown(high)}"


def check_range(key: str, value: float, shown: str, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, why: str = "") -> None:
    """Raise one line naming ``key`` when ``value`` (written ``shown``) is outside the range; ``why`` says
    where the bound comes from."""
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{key} must be {_interval(low, high, low_open, high_open)}{reason}, got {shown}")


def finite_number(key: str, token: str, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False, high_open: bool = False, why: str = "") -> float:
    """``token`` as a float in the range, or one ``ValueError`` line naming ``key``.

    ASCII decimal only (``0.5``, ``-1``, ``1e-3``); NaN, infinities and numbers past a float's range
    are refused, since one would poison every later comparison.
    """
    text = token.strip()
    if len(text) > NUMBER_CHARS or not _DECIMAL.fullmatch(text):
        raise ValueError(f"{key} takes a number in ASCII digits (such as 0.5 or 1e-3), got {quote(token)}")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{key}: {quote(token)} is past the range of a number")
    check_range(key, value, text, low=low, high=high, low_open=low_open, high_open=high_open, why=why)
    return value


def whole_number(key: str, token: str, *, low: int = 0, high: int, unit: str = "", why: str = "") -> int:
    """``token`` as a whole number in ``[low, high]``, or one ``ValueError`` line naming ``key``.

    ASCII digits only (``"+"`` allowed in front, as ``strtol`` allows it); ``unit`` names what is
    counted in the message (``"MB (MiB)"``).
    """
    text = token.strip()
    if not _WHOLE.fullmatch(text):
        what = f"a whole number of {unit}" if unit else "a whole number"
        raise ValueError(f"{key} takes {what} in ASCII digits, got {quote(token)}")
    digits = text.lstrip("+").lstrip("0") or "0"
    if len(digits) > len(str(high)):
        raise ValueError(f"{key} must be {_interval(low, high, False, False)}{f' ({why})' if why else ''}, "
                         f"got {quote(token)}")
    value = int(digits)
    check_range(key, value, digits, low=low, high=high, why=why)
    return value


def size_in_range(key: str, size_bytes: int, shown: str) -> int:
    """``size_bytes`` if it is at most 1 PiB (past any device's memory), else one line naming ``key``."""
    check_range(key, size_bytes, shown, high=LARGEST_SETTING_BYTES, why=LARGEST_WHY)
    return size_bytes
