"""Check a snapshot's recorded ``allocator_settings`` where they enter: ``checked_allocator_settings``.

The settings become policy arguments later (``allocator_settings_to_kwargs``, below), so a wrong type or
an out-of-range value must be caught here, named by file and key: an error, or under ``--lenient``
a warning in ``meta.notes`` and the key dropped.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from ..errors import TraceFormatError, quote
from ..units import SIZE_MAX
from .divisions import parse_roundup_power2_divisions
from .pytorch_sizes import K_LARGE_BUFFER


def setting_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is not a valid recorded ``key``, or None when it is (unknown keys are not checked)."""
    if key == "max_split_size":
        if type(value) is not int:
            return f"is not an integer (got {type(value).__name__} {quote(value)})"
        if value != -1 and not K_LARGE_BUFFER <= value <= SIZE_MAX:
            return f"{quote(value)} is out of range (-1 for unlimited, or 20 MiB .. 2**64-1 bytes)"
    elif key == "garbage_collection_threshold":
        if type(value) not in (int, float):
            return f"is not a number (got {type(value).__name__} {quote(value)})"
        if not math.isfinite(value) or not 0 <= value < 1:
            return f"{quote(value)} is out of range (0 = off, else between 0 and 1)"
    elif key == "expandable_segments":
        if type(value) is not bool:
            return f"is not a boolean (got {type(value).__name__} {quote(value)})"
    elif key == "roundup_power2_divisions":
        if isinstance(value, dict):
            for k, v in value.items():
                if type(v) is not int or (type(k) is not int and not (isinstance(k, str) and k.isdigit()
                                                                        and len(k) <= 12)):
                    return f"entry {quote(k)}: {quote(v)} is not an integer count of divisions"
        elif type(value) is not int and not (isinstance(value, (list, tuple))
                                              and all(type(v) is int for v in value)):
            return f"is not an integer, a list of integers or a mapping (got {type(value).__name__})"
        try:
            parse_roundup_power2_divisions(value)
        except (ValueError, TypeError, OverflowError) as exc:
            return quote(str(exc), 160)
    return None


def checked_allocator_settings(value: Any, path: str, lenient: bool, notes: list[str],
                               plain: Callable[[Any], Any]) -> dict[str, Any] | None:
    """The settings as plain JSON-able data, each modelled key validated (see module doc)."""
    record = "allocator_settings"
    if not isinstance(value, dict):
        reason = f"is not a mapping (got {type(value).__name__} {quote(value)})"
        if not lenient:
            raise TraceFormatError(path, record, reason)
        notes.append(f"{record} {reason}; ignored")
        return None
    for key in list(value):
        if not isinstance(key, str):
            continue
        problem = setting_problem(key, value[key])
        if problem is None:
            continue
        if not lenient:
            raise TraceFormatError(path, f"{record}.{key}", f"recorded setting {problem}")
        notes.append(f"{record}.{key}: recorded setting {problem}; ignored (the default applies)")
        value = {k: v for k, v in value.items() if k != key}
    return plain(value)


def allocator_settings_to_kwargs(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Turn a snapshot's ``allocator_settings`` into ``PyTorchPolicy`` keyword arguments.

    Reads ``max_split_size`` (bytes, -1 = unlimited), ``garbage_collection_threshold``,
    ``expandable_segments`` and ``roundup_power2_divisions``; other keys (pinned-memory and locking
    options) do not change placement and are ignored.
    """
    if not settings:
        return {}
    for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments",
                "roundup_power2_divisions"):
        if key in settings:
            problem = setting_problem(key, settings[key])
            if problem is not None:
                raise ValueError(f"allocator setting {key} {problem}")
    kwargs: dict[str, Any] = {}
    if "max_split_size" in settings:
        value = int(settings["max_split_size"])
        kwargs["max_split_size_bytes"] = None if value < 0 or value >= SIZE_MAX else value
    if "garbage_collection_threshold" in settings:
        kwargs["garbage_collection_threshold"] = float(settings["garbage_collection_threshold"])
    if "expandable_segments" in settings:
        kwargs["expandable_segments"] = bool(settings["expandable_segments"])
    if "roundup_power2_divisions" in settings:
        kwargs["roundup_power2_divisions"] = parse_roundup_power2_divisions(settings["roundup_power2_divisions"])
    return kwargs
