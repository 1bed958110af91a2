"""Decode a Chrome trace at C speed, keeping only what the Kineto reader uses: ``decode_events``.

``msgspec`` decodes the ``traceEvents`` array into small structs and leaves every event's ``args``
(and its ``ts`` / ``dur`` numbers) as raw JSON text, so the reader pays for ``args`` only on the
few ``[memory]`` / ``[OutOfMemory]`` / step events and converts times exactly from their text.
Anything the schema does not expect (a name that is not a string, a top level that is neither an
object nor a list, broken JSON) makes ``decode_events`` return None; the reader then parses the
file with the standard library, which names the problem.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
import numpy as np

_Scalar = Union[str, int, float, bool, None]


class Event(msgspec.Struct):
    """One trace event; numbers and ``args`` stay raw JSON text."""

    name: _Scalar = None
    ph: _Scalar = None
    cat: _Scalar = None
    ts: msgspec.Raw = msgspec.Raw(b"null")
    dur: msgspec.Raw = msgspec.Raw(b"null")
    pid: _Scalar = None
    tid: _Scalar = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class _TorchEnv(msgspec.Struct):
    torch_version: _Scalar = None


class _System(msgspec.Struct):
    torch_env_info: Union[_TorchEnv, None] = None


class _Metadata(msgspec.Struct):
    """What the profiler's caller recorded beside the trace (TraceLens: ``system.torch_env_info``)."""

    torch_env_info: Union[_TorchEnv, None] = None
    system: Union[_System, None] = None


_METADATA = msgspec.json.Decoder(_Metadata)


def recorded_torch(raw: Any) -> str | None:
    """``metadata[.system].torch_env_info.torch_version`` (raw JSON text or an already decoded object), or None."""
    try:
        if isinstance(raw, (bytes, msgspec.Raw)):
            if bytes(raw) == b"null":
                return None
            meta = _METADATA.decode(bytes(raw))
            env = meta.torch_env_info or (meta.system.torch_env_info if meta.system is not None else None)
            version = env.torch_version if env is not None else None
        else:
            version = None
            for owner in (raw, raw.get("system") if isinstance(raw, dict) else None):
                env = owner.get("torch_env_info") if isinstance(owner, dict) else None
                if isinstance(env, dict) and env.get("torch_version"):
                    version = env["torch_version"]
                    break
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None
    return version[:80] if isinstance(version, str) and version else None


class _MetadataOnly(msgspec.Struct):
    metadata: msgspec.Raw = msgspec.Raw(b"null")


_METADATA_ONLY = msgspec.json.Decoder(_MetadataOnly)


def document_torch(data: bytes) -> str | None:
    """The torch version a Chrome trace object's ``metadata`` names, found without building its events."""
    if b'"torch_env_info"' not in data:           # most traces: no metadata to look at
        return None
    try:
        return recorded_torch(_METADATA_ONLY.decode(data).metadata)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None


class Document(msgspec.Struct):
    """The top level of a Chrome trace object."""

    traceEvents: Union[list[Event], None] = None
    schemaVersion: _Scalar = None
    profile_memory: _Scalar = None
    displayTimeUnit: _Scalar = None
    baseTimeNanoseconds: _Scalar = None
    deviceProperties: msgspec.Raw = msgspec.Raw(b"null")
    metadata: msgspec.Raw = msgspec.Raw(b"null")


_DOC = msgspec.json.Decoder(Document)
_LIST = msgspec.json.Decoder(list[Event])
_EVENT = msgspec.json.Decoder(Event)
_ANY = msgspec.json.Decoder()


def decode_event(text: bytes) -> Event:
    """One event object (the text of an element of ``traceEvents``) as ``decode_events`` decodes it."""
    return _EVENT.decode(text)


def decode_events(data: bytes) -> tuple[list[Event], dict[str, Any], bool] | None:
    """(events, top-level keys, is an object) or None when the standard parser must decide."""
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    try:
        if head == b"{":
            doc = _DOC.decode(data)
            if doc.traceEvents is None:
                return None
            top = {k: getattr(doc, k) for k in ("schemaVersion", "profile_memory", "displayTimeUnit",
                                                  "baseTimeNanoseconds") if getattr(doc, k) is not None}
            if bytes(doc.deviceProperties) != b"null":
                top["deviceProperties"] = _ANY.decode(doc.deviceProperties)
            torch_version = recorded_torch(doc.metadata)
            if torch_version:
                top["torch"] = torch_version
            return doc.traceEvents, top, True
        if head == b"[":
            return _LIST.decode(data), {}, False
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None
    return None


def raw_value(raw: msgspec.Raw) -> Any:
    """A raw JSON scalar as the standard reader sees it: ints as int, other numbers as their text."""
    text = bytes(raw)
    if not text or text == b"null":
        return None
    first = text[:1]
    if first == b'"' or first in b"[{tn f":
        try:
            value = _ANY.decode(text)
        except (msgspec.DecodeError, RecursionError, ValueError):
            return None
        return value if not isinstance(value, float) else repr(value)
    if b"." in text or b"e" in text or b"E" in text:
        return text.decode("ascii", "replace")
    try:
        return int(text)
    except ValueError:
        return text.decode("ascii", "replace")


def raw_args(raw: msgspec.Raw) -> Any:
    """An event's ``args`` object, floats kept as their text (as the standard reader keeps them)."""
    try:
        return _ANY.decode(bytes(raw))
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None


def ns_from_raw(raw: msgspec.Raw) -> int | None:
    """Exact integer ns from a raw ``ts`` / ``dur`` in microseconds; None when not a plain number."""
    text = bytes(raw)
    if not text or len(text) > 40 or text[:1] in b'"n[{tf':
        return None
    whole, dot, frac = text.partition(b".")
    if b"e" in text or b"E" in text or not whole.lstrip(b"-").isdigit():
        return None
    ns = int(whole) * 1000
    if dot:
        if not frac.isdigit():
            return None
        extra = int((frac + b"000")[:3])
        ns = ns - extra if whole.startswith(b"-") else ns + extra
        rest = frac[3:]
        if rest.strip(b"0"):
            return None   # digits below 1 ns: leave the rounding to the exact reference parser
    return ns


class MemoryArgs(msgspec.Struct, rename={"addr": "Addr", "nbytes": "Bytes", "device_type": "Device Type",
                                         "device_index": "Device Id", "total_allocated": "Total Allocated",
                                         "total_reserved": "Total Reserved"}):
    """The ``args`` of a well-formed ``[memory]`` event (anything else takes the checked path)."""

    addr: int
    nbytes: int
    device_type: int
    device_index: int
    total_allocated: Union[int, None] = None
    total_reserved: Union[int, None] = None


_MEMORY_ARGS = msgspec.json.Decoder(MemoryArgs)


def memory_args(raw: msgspec.Raw) -> MemoryArgs | None:
    """Typed ``args`` of a ``[memory]`` event, or None when they need the checked path."""
    try:
        return _MEMORY_ARGS.decode(bytes(raw))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None


def ns_list(raws: list) -> list[int | None]:
    """``ns_from_raw`` of each raw number, with a fast path for Kineto's ``123.456`` microseconds."""
    out: list[int | None] = []
    append = out.append
    for r in raws:
        text = bytes(r)
        whole, dot, frac = text.partition(b".")
        if dot and len(frac) <= 3 and whole.isdigit() and frac.isdigit() and len(whole) < 30:
            append(int(whole + frac + b"000"[len(frac):]))
        elif not dot and whole.isdigit() and len(whole) < 30:
            append(int(whole) * 1000)
        else:
            append(ns_from_raw(r))
    return out


def float_array(raws: list) -> np.ndarray:
    """Each raw number as a float (NaN where it is not one): a cheap first look at op times."""
    try:
        return np.array(list(map(float, map(bytes, raws))), dtype=np.float64)
    except ValueError:
        out = np.full(len(raws), np.nan)
        for i, r in enumerate(raws):
            try:
                out[i] = float(bytes(r))
            except ValueError:
                pass
        return out
