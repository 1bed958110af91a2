"""Byte units and parsing: use ``parse_bytes("80GiB")`` to read sizes from users."""

from __future__ import annotations

import re

from .errors import quote

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
#: The largest ``size_t``: what "unlimited" is in the C++ allocators (``std::numeric_limits<size_t>::max()``).
SIZE_MAX = (1 << 64) - 1

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "kib": KiB,
    "mb": 1000**2, "mib": MiB,
    "gb": 1000**3, "gib": GiB,
    "tb": 1000**4, "tib": TiB,
}
#: A bare prefix is ambiguous: nvidia-smi, PyTorch (``_mb``) and most people mean 1024-based units
#: by it, disk vendors 1000-based ones; one GiB versus one GB is a 7 % error in a capacity.
_AMBIGUOUS = {"k": "K", "m": "M", "g": "G", "t": "T"}
#: Characters a size may take: more is never a size (and ``int`` refuses past 4,300 digits).
_SIZE_CHARS = 64
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, *, round_down: bool = False) -> int:
    """Turn ``"80GiB"``, ``"512MB"``, ``"1.5GiB"`` or ``4096`` into an integer byte count.

    ``KiB``/``MiB``/``GiB``/``TiB`` are 1024-based, ``KB``/``MB``/``GB``/``TB`` 1000-based (case is
    ignored); a bare ``16G`` is refused as ambiguous rather than guessed. A decimal that does not land
    on a whole byte is refused, or with ``round_down`` (a device's capacity: ``11.7GiB``) rounded
    down to the whole bytes below it (``bytes_rounding_note`` says so to a user).
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    if not str(text).isascii() or len(str(text)) > _SIZE_CHARS:
        raise ValueError(f"not a size: {quote(str(text))} (ASCII digits and a unit, such as 4096, 512MiB, 80GiB)")
    match = _SIZE_RE.match(str(text))
    if match and match.group(2).lower() in _AMBIGUOUS:
        number, prefix = match.group(1), _AMBIGUOUS[match.group(2).lower()]
        raise ValueError(f"{str(text).strip()!r} is ambiguous: say {number}{prefix}iB (1024-based) "
                         f"or {number}{prefix}B (1000-based)")
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 512MiB, 80GiB)")
    number, unit = match.groups()
    scale = _UNITS[unit.lower()]
    if "." in number:
        # A decimal is a whole number of bytes only when it lands on one: refused, or rounded down for a device.
        from fractions import Fraction

        value = Fraction(number) * scale          # exact: 11.7GiB is 12,562,779,340.8 bytes
        if value.denominator != 1 and not round_down:
            raise ValueError(f"{text!r} is not a whole number of bytes")
        return value.numerator // value.denominator
    return int(number) * scale


def bytes_rounding_note(text: str | int) -> str | None:
    """What ``parse_bytes(text, round_down=True)`` rounded away, in words (None: a whole number of bytes).

    ``"11.7GiB"`` is 12,562,779,340.8 bytes; a device has whole bytes, so it is rounded down, and the
    command says so.
    """
    from fractions import Fraction

    size_bytes = parse_bytes(text, round_down=True)          # refuses what is not a size
    if isinstance(text, int) or "." not in str(text):
        return None
    number, unit = _SIZE_RE.match(str(text)).groups()
    exact = Fraction(number) * _UNITS[unit.lower()]
    if exact == size_bytes:
        return None
    return f"{str(text).strip()} is {_decimal_text(exact)} bytes: rounded down to a whole number of bytes, {size_bytes:,}"


def _decimal_text(value) -> str:
    """A positive fraction with a power-of-ten denominator (a decimal times a unit) as decimal text with separators."""
    whole, rest = divmod(value.numerator, value.denominator)
    digits = ""
    while rest and len(digits) < 30:
        rest *= 10
        digit, rest = divmod(rest, value.denominator)
        digits += str(digit)
    return f"{whole:,}" + (f".{digits}" if digits else "")


def format_bytes(size_bytes: int) -> str:
    """Render a byte count for people: ``format_bytes(3 * GiB) == '3.00 GiB'``."""
    sign = "-" if size_bytes < 0 else ""
    value = abs(size_bytes)
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= scale:
            return f"{sign}{value / scale:.2f} {unit}"
    return f"{sign}{value} B"


def align_up(size_bytes: int, alignment_bytes: int) -> int:
    """Round ``size_bytes`` up to a multiple of ``alignment_bytes``."""
    return -(-size_bytes // alignment_bytes) * alignment_bytes
