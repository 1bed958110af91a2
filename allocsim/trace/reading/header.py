"""Check the metadata of an allocsim trace file (its header) before anything uses it: ``check_meta(data)``.

A header is JSON anyone can edit, and every command reads parts of it (``info`` the notes,
``run --gpu`` the card a capture was made for, ``report`` the recorded run, ``scale`` its hints):
a value of the wrong type there used to surface as an ``AttributeError`` deep in one of them.
So the header is held, once, where the trace is read, against the types allocsim's own code gives
each field: ``TraceMeta``'s annotations, ``RecordedRun`` and ``RecordedOOM``'s for ``recorded``,
and ``VERSION_HINTS`` / ``DEVICE_PROPERTIES`` for the keys of those free-form objects that
allocsim reads. A key allocsim does not read may hold anything (files from other versions load);
one it reads must hold its type. The first mismatch is a ``HeaderTypeError`` naming the field
(``meta.recorded.0.peak_reserved_bytes``), what it holds and what it should hold.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

#: Integers in a header are byte counts, ids and counters: they must fit the int64 columns they meet.
INT_BITS = 63


class HeaderTypeError(ValueError):
    """One header field holds a value of the wrong type: ``field`` (dotted path) and ``reason``."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


_ANY_OBJECT = dict[str, Any]

#: The keys of ``meta.version_hints`` that allocsim reads, and their types (others may hold anything).
VERSION_HINTS: dict[str, Any] = {
    "converted_from": str, "converted_from_file": str, "source_format": str, "size_bytes": str,
    "cublas_workspaces": str, "cublas_workspace_bytes": int | None, "device_types_seen": _ANY_OBJECT,
    "torch": str, "capture": str, "optimizer_steps": int, "categories": str,
    "cudnn_workspace_ratios": _ANY_OBJECT, "autocast": _ANY_OBJECT,
    # the card a capture was made for (``GpuModel.capture_properties``)
    "gpu": {"name": str, "total_bytes": int, "major": int, "minor": int, "sm_count": int,
            "max_threads_per_sm": int, "context_bytes": int},
    # a scaled trace (``scale.build``); its range's lengths and sizes are checked where it is read (``scale.ranges``)
    "scale": {"scale_name": str, "target": str, "frames": str, "start_layout": str,
              "range": {"alloc_id": list[int], "low": list[int], "high": list[int]}},
}
#: The keys of each ``meta.device_properties`` entry that allocsim reads (Kineto's ``deviceProperties``).
DEVICE_PROPERTIES: dict[str, Any] = {"name": str, "total_bytes": int}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _spec_name(spec: Any) -> str:
    if spec is Any:
        return "anything"
    if spec is type(None):
        return "null"
    if isinstance(spec, dict):
        return "an object"
    if dataclasses.is_dataclass(spec):
        return "an object"
    origin = typing.get_origin(spec)
    if origin in (typing.Union, _UnionType):
        return " or ".join(_spec_name(arg) for arg in typing.get_args(spec))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}.get(spec, str(spec))


try:
    from types import UnionType as _UnionType
except ImportError:  # pragma: no cover - Python < 3.10
    _UnionType = typing.Union  # type: ignore[assignment,misc]


def _fail(where: str, value: Any, spec: Any) -> HeaderTypeError:
    return HeaderTypeError(where, f"holds {_type_name(value)}, expected {_spec_name(spec)}")


def check_value(value: Any, spec: Any, where: str) -> None:
    """Raise ``HeaderTypeError`` unless ``value`` (parsed JSON) has type ``spec``.

    ``spec``: ``int``, ``float``, ``str``, ``bool``, ``Any``, ``X | None``, ``list[X]``,
    ``tuple[X, ...]``, ``dict[str, X]``, a dataclass (its fields' annotations, missing keys allowed),
    or a dict of known keys to specs (other keys may hold anything).
    """
    if spec is Any:
        return
    if spec is type(None):
        if value is not None:
            raise _fail(where, value, spec)
        return
    origin = typing.get_origin(spec)
    if origin in (typing.Union, _UnionType):
        errors = []
        for arg in typing.get_args(spec):
            try:
                check_value(value, arg, where)
                return
            except HeaderTypeError as exc:
                errors.append(exc)
        deeper = [e for e in errors if e.field != where]     # the branch that got furthest says why
        if deeper and isinstance(value, (dict, list)):
            raise deeper[0]
        raise _fail(where, value, spec)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise _fail(where, value, spec)
        for key, sub in spec.items():
            if key in value:
                check_value(value[key], sub, f"{where}.{key}")
        return
    if dataclasses.is_dataclass(spec):
        if not isinstance(value, dict):
            raise _fail(where, value, spec)
        hints = _hints(spec)
        for key, sub in hints.items():
            if key in value:
                check_value(value[key], sub, f"{where}.{key}")
        return
    if origin is list or origin is tuple:
        if not isinstance(value, list):
            raise _fail(where, value, spec)
        args = typing.get_args(spec)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise HeaderTypeError(where, f"holds a list of {len(value)}, expected {len(args)} items")
            for i, (item, sub) in enumerate(zip(value, args)):
                check_value(item, sub, f"{where}[{i}]")
            return
        item_spec = args[0] if args else Any
        for i, item in enumerate(value):
            check_value(item, item_spec, f"{where}[{i}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(where, value, spec)
        _, item_spec = typing.get_args(spec) or (str, Any)
        for key, item in value.items():
            check_value(item, item_spec, f"{where}.{key}")
        return
    if spec is bool:
        if not isinstance(value, bool):
            raise _fail(where, value, spec)
        return
    if spec is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, value, spec)
        if not -(1 << INT_BITS) <= value < (1 << INT_BITS):
            raise HeaderTypeError(where, f"{value} does not fit a 64-bit integer")
        return
    if spec is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(where, value, spec)
        return
    if spec is str:
        if not isinstance(value, str):
            raise _fail(where, value, spec)
        return
    raise TypeError(f"no rule for {spec!r}")    # a spec this module does not know: a bug here, not in the file


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _device_keys(value: dict, where: str) -> None:
    for key in value:
        text = key.lstrip("-")
        if not text.isdigit() or len(text) > 6:
            raise HeaderTypeError(f"{where}.{key}", "is not a device number")


def meta_spec() -> dict[str, Any]:
    """The type of each ``TraceMeta`` field in a header, with the refinements of the module doc."""
    from ..inference.recorded import RecordedRun
    from ..schema import TraceMeta

    spec: dict[str, Any] = dict(_hints(TraceMeta))
    spec["version_hints"] = VERSION_HINTS
    spec["recorded"] = dict[str, RecordedRun]
    spec["device_properties"] = _ANY_OBJECT          # each entry: ``DEVICE_PROPERTIES`` (``check_meta``)
    return spec


def check_meta(data: Any) -> None:
    """Raise ``HeaderTypeError`` (naming the field) unless the header's ``meta`` object has allocsim's types."""
    if not isinstance(data, dict):
        raise HeaderTypeError("meta", f"holds {_type_name(data)}, expected an object")
    for name, spec in meta_spec().items():
        if name in data:
            check_value(data[name], spec, f"meta.{name}")
    for name in ("recorded", "device_properties"):
        if isinstance(data.get(name), dict):
            _device_keys(data[name], f"meta.{name}")
    for device, props in (data.get("device_properties") or {}).items():
        check_value(props, DEVICE_PROPERTIES, f"meta.device_properties.{device}")
    devices = data.get("devices") or []
    if any(not -(1 << 15) <= d < (1 << 15) for d in devices):
        raise HeaderTypeError("meta.devices", "holds a device id outside int16")
