"""Load untrusted pickles as plain data: ``load_pickle(path)`` refuses every global, so nothing can run.

PyTorch's ``_dump_snapshot`` writes pickles of builtin types only (dict, list, str, int, float, bool,
tuple, None). Here a pickle that names any global (``os.system``, ``builtins.eval``, a class to
rebuild) or a persistent id is refused with ``UnsafePickleError`` before anything is called:
``find_class`` is the only way a pickle can reach code, and it always raises. The opcodes that call
objects (REDUCE, BUILD, NEWOBJ, OBJ) are refused as well, so the guarantee does not rest on one hook.

Resources are bounded too. Files (and decompressed gzip data) over ``max_bytes`` are refused. The
pure-Python unpickler is used on purpose: CPython's C unpickler pre-sizes and zeroes its memo table
to the largest ``LONG_BINPUT`` index, so a 12-byte pickle can make it touch 32 GiB; the Python one
keeps the memo in a dict. Dict keys must be scalars (hashing a tuple that nests shared tuples takes
time exponential in its depth); sets are refused at their first opcode (PyTorch writes none, and one
opcode byte makes a 216-byte empty set: a 9.5 MB file of them held 2.3 GB); out-of-band buffer
opcodes are refused (``bytearray(n)`` would zero ``n`` bytes). Everything else that can go wrong becomes ``TraceFormatError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import reprlib
import sys
from typing import Any

from ...errors import TraceFormatError, UnsafePickleError

#: Files (and decompressed gzip streams) larger than this are refused unless the caller allows more.
DEFAULT_MAX_BYTES = 4 << 30

_SCALARS = (str, int, float, bool, type(None), bytes)
#: Why a pickle holding a set is refused (the data-only unpickler, at the set's first opcode).
SET_REASON = "corrupt pickle: it holds a set; a snapshot holds dicts, lists, tuples, strings and numbers only"

_short = reprlib.Repr()
_short.maxlevel = 2
_short.maxstring = _short.maxother = _short.maxlong = 40


def short_repr(value: Any) -> str:
    """A bounded repr: safe on huge or deeply shared structures from untrusted input."""
    if type(value) is int and not -(1 << 128) < value < (1 << 128):
        return f"<{value.bit_length()}-bit integer>"
    try:
        return _short.repr(value)
    except Exception:  # noqa: BLE001 - e.g. ints too long for str() nested in a container
        return f"<{type(value).__name__}>"


def _check_scalars(path: str, values: Any, what: str) -> None:
    for v in values:
        if type(v) not in _SCALARS:
            raise TraceFormatError(path, None, f"corrupt pickle: {what} of type {type(v).__name__} "
                                   "(a snapshot uses plain keys only)")


#: Integer keys hash to themselves within this range, so distinct ones never collide; past it (and
#: for fractional floats) a file can choose 100,000 keys with one hash and make a dict quadratic.
_PLAIN_HASH_LIMIT = (1 << 61) - 2


class _KeyedInt(int):
    """A big integer key, equal to its value but hashed through its text (randomised per process)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(int.__repr__(self))


class _KeyedFloat(float):
    """A fractional float key, equal to its value but hashed through its text (randomised per process)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(float.__repr__(self))


def _keyed(v: Any) -> Any:
    """``v`` as a dict or set key whose hash no file can choose (snapshots never use such keys;
    they are kept, not refused, so both routes read the same files)."""
    kind = type(v)
    if kind is int and not -_PLAIN_HASH_LIMIT <= v <= _PLAIN_HASH_LIMIT:
        return _KeyedInt(v)
    if kind is float and not (v.is_integer() and abs(v) <= _PLAIN_HASH_LIMIT):
        return _KeyedFloat(v)
    return v


def _key_slots(stack: list, start: int, step: int) -> None:
    """Wrap every risky key in ``stack[start::step]`` in place (see ``_keyed``)."""
    for i in range(start, len(stack), step):
        if type(stack[i]) in (int, float):
            stack[i] = _keyed(stack[i])


class _RefusesGlobals:
    """What both unpicklers share: every global and persistent id is refused, naming the file."""

    def __init__(self, file: Any, path: str):
        super().__init__(file)  # type: ignore[call-arg]
        self._path = path

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle API
        raise UnsafePickleError(
            self._path, None,
            f"refused to load global {str(module)[:100]}.{str(name)[:100]}: a snapshot holds plain "
            "data only, so this pickle may be hostile; nothing in it was run")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(self._path, None,
                                f"refused persistent id {short_repr(pid)}: a snapshot holds plain data only")


class _DataOnlyUnpickler(_RefusesGlobals, pickle._Unpickler):  # type: ignore[name-defined]
    """An unpickler that builds builtin containers and scalars only, and calls nothing."""

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    # -- opcodes that would call an object: never legitimate in a snapshot
    def _refuse_call(self) -> None:
        raise UnsafePickleError(self._path, None,
                                "refused an opcode that calls an object: a snapshot holds plain data only")

    def _refuse_buffer(self) -> None:
        raise TraceFormatError(self._path, None,
                               "corrupt pickle: bytearray / out-of-band buffer opcodes are not snapshot data")

    # -- containers whose keys get hashed: scalars only
    def _load_setitem(self) -> None:
        _check_scalars(self._path, (self.stack[-2],), "dict key")
        _key_slots(self.stack, len(self.stack) - 2, 2)
        pickle._Unpickler.load_setitem(self)  # type: ignore[attr-defined]

    def _load_setitems(self) -> None:
        _check_scalars(self._path, self.stack[::2], "dict key")
        _key_slots(self.stack, 0, 2)
        pickle._Unpickler.load_setitems(self)  # type: ignore[attr-defined]

    def _load_dict(self) -> None:
        _check_scalars(self._path, self.stack[::2], "dict key")
        _key_slots(self.stack, 0, 2)
        pickle._Unpickler.load_dict(self)  # type: ignore[attr-defined]

    # -- sets: PyTorch never writes one, and an empty set is 216 bytes made from one opcode byte
    def _refuse_set(self) -> None:
        raise TraceFormatError(self._path, None, SET_REASON)


for _op in (pickle.REDUCE, pickle.BUILD, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.OBJ):
    _DataOnlyUnpickler.dispatch[_op[0]] = _DataOnlyUnpickler._refuse_call
for _op in (pickle.BYTEARRAY8, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER):
    _DataOnlyUnpickler.dispatch[_op[0]] = _DataOnlyUnpickler._refuse_buffer
_DataOnlyUnpickler.dispatch[pickle.SETITEM[0]] = _DataOnlyUnpickler._load_setitem
_DataOnlyUnpickler.dispatch[pickle.SETITEMS[0]] = _DataOnlyUnpickler._load_setitems
_DataOnlyUnpickler.dispatch[pickle.DICT[0]] = _DataOnlyUnpickler._load_dict
for _op in (pickle.EMPTY_SET, pickle.ADDITEMS, pickle.FROZENSET):
    _DataOnlyUnpickler.dispatch[_op[0]] = _DataOnlyUnpickler._refuse_set
del _op


#: Magic numbers of files people rename by mistake, and what to call them.
_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
          (b"%PDF", "a PDF document"), (b"PAR1", "a Parquet file"), (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
          (b"BZh", "bzip2-compressed data"), (b"\xfd7zXZ", "xz-compressed data"), (b"\x7fELF", "an executable"),
          (b"PK\x03\x04", "a zip archive (torch.save writes these; a memory snapshot comes from "
                           "torch.cuda.memory._dump_snapshot)"))
#: First bytes a pickle of a dict or list can start with: PROTO (protocol 2+) or a protocol 0/1 opener.
_PICKLE_STARTS = b"\x80(}]ld"


def not_a_pickle(head: bytes) -> str | None:
    """What the file is instead of a pickle, from its first bytes (``head``); None when it may be one."""
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"not a pickle: it is {what}"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"{" or text[:1] == b"[":
        return "not a pickle: it looks like JSON (a Kineto trace? name it .json)"
    if head[:1] and head[:1] not in [bytes([c]) for c in _PICKLE_STARTS]:
        return f"not a pickle: it starts with {short_repr(head[:8])}, not a pickle opcode"
    return None


def read_bounded(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Return the bytes of ``path``, gunzipped when it starts with the gzip magic, at most ``max_bytes``."""
    from .limits import DEFAULT_LIMITS, read_bytes

    return read_bytes(os.fspath(path), dataclasses.replace(DEFAULT_LIMITS, decompressed_bytes=max_bytes))


class _RefusingCUnpickler(_RefusesGlobals, pickle.Unpickler):
    """CPython's C unpickler with every global and persistent id refused: only plain data loads.

    Safe from code execution (every way a pickle reaches a callable goes through ``find_class``
    or ``persistent_load``), but not from resource bombs (a huge memo index, hashing a key built
    from shared tuples): run it only where memory and time are capped (``isolate``).
    """


def loads_fast(data: bytes, path: str | os.PathLike = "<bytes>") -> object:
    """Unpickle ``data`` with the C unpickler, refusing globals; only under memory and time caps."""
    # A BYTEARRAY8 opcode whose length runs past the data makes CPython free a bytearray it still
    # exports, and it prints a stray "SystemError" line through sys.excepthook; the failure itself
    # is raised and reported, so that line is kept off the user's terminal.
    hook = sys.excepthook
    sys.excepthook = _quiet_hook
    try:
        return _RefusingCUnpickler(io.BytesIO(data), os.fspath(path)).load()
    finally:
        sys.excepthook = hook


def _quiet_hook(*_args: Any) -> None:
    """An ``excepthook`` that prints nothing (see ``loads_fast``)."""


def loads_data(data: bytes, path: str | os.PathLike = "<bytes>") -> object:
    """Unpickle ``data`` as plain data (see module doc); ``path`` only names the source in errors."""
    path = os.fspath(path)
    try:
        return _DataOnlyUnpickler(io.BytesIO(data), path).load()
    except TraceFormatError:
        raise  # includes UnsafePickleError
    except RecursionError:
        raise TraceFormatError(path, None, "corrupt pickle: nesting too deep") from None
    except MemoryError:
        raise TraceFormatError(path, None, "corrupt pickle: it asks for more memory than is available") from None
    except EOFError:
        raise TraceFormatError(path, None, "truncated pickle (data ends before the STOP opcode)") from None
    except KeyError as exc:
        # The pure-Python unpickler reports a GET of a memo slot that was never PUT as a bare KeyError.
        raise TraceFormatError(path, None, f"corrupt pickle: refers back to object {short_repr(str(exc))} "
                               "that was never stored") from None
    except Exception as exc:  # noqa: BLE001 - any other unpickling failure means corrupt input
        # pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
        # OverflowError, UnicodeDecodeError, struct.error ...: the bytes are not a well-formed pickle.
        reason = short_repr(str(exc))
        raise TraceFormatError(path, None, f"corrupt pickle: {type(exc).__name__}: {reason}") from None


def load_pickle(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> object:
    """Return the object in the pickle at ``path`` (gzip-compressed or not) without running any code.

    Raises ``UnsafePickleError`` for a pickle that references a global or persistent id, and
    ``TraceFormatError`` for a file that is missing, too large, empty, truncated or otherwise corrupt.
    """
    return loads_data(read_bounded(path, max_bytes=max_bytes), path)
