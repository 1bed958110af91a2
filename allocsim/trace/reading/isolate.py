"""Run a parser of untrusted input in a child process with a memory cap and a deadline: ``run_isolated``.

The child is a ``fork`` of this process (no start-up cost beyond the fork) with ``RLIMIT_AS`` set
to its current address space plus ``limits.memory_bytes`` and an alarm at ``limits.seconds``:
whatever the input makes the parser do, this process neither runs out of memory nor hangs. The
child sends back plain columns in a format that cannot carry code (a JSON header, then raw numeric
arrays whose dtypes the header names from a fixed list); errors come back as their fields.

Only on Linux (where ``RLIMIT_AS`` is enforced and fork is safe for this use); elsewhere, or with
``ALLOCSIM_NO_ISOLATION=1`` in the environment (to debug a parser), ``available()`` is False and
callers parse in-process with the pure-Python unpickler.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import struct
import sys
from typing import Any, Callable

import numpy as np

from ...errors import TraceFormatError, UnsafePickleError
from .headroom import vm_size_bytes
from .limits import Limits, LimitExceeded

_ALLOWED_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "bool"}
_ERROR_CLASSES = {"TraceFormatError": TraceFormatError, "UnsafePickleError": UnsafePickleError,
                  "LimitExceeded": LimitExceeded}
#: Message kinds on the pipe.
_PHASE, _RESULT, _ERROR = b"P", b"R", b"E"


def available() -> bool:
    """True where parsing can run in a capped child process."""
    if os.environ.get("ALLOCSIM_NO_ISOLATION"):
        return False
    return sys.platform.startswith("linux") and hasattr(os, "fork")


# ------------------------------------------------------------------------------- payload codec
def encode_payload(payload: dict[str, Any]) -> bytes:
    """``{"tables": {name: {col: ndarray | list[str]}}, ...json-able}`` -> bytes."""
    header: dict[str, Any] = {k: v for k, v in payload.items() if k != "tables"}
    blobs: list[bytes] = []
    table_head: dict[str, dict[str, Any]] = {}
    for name, cols in payload.get("tables", {}).items():
        th = table_head[name] = {}
        for col, values in cols.items():
            if isinstance(values, np.ndarray) and values.dtype.name in _ALLOWED_DTYPES and values.ndim == 1:
                data = np.ascontiguousarray(values).tobytes()
                th[col] = {"dtype": values.dtype.name, "n": int(len(values)), "nbytes": len(data)}
                blobs.append(data)
            else:
                th[col] = {"json": [None if v is None else str(v) for v in values]}
    header["tables"] = table_head
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def decode_payload(blob: bytes) -> dict[str, Any]:
    """Inverse of ``encode_payload``; raises ValueError on anything malformed."""
    (head_len,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + head_len])
    offset = 8 + head_len
    tables: dict[str, dict[str, Any]] = {}
    for name, cols in header.pop("tables").items():
        out = tables[name] = {}
        for col, spec in cols.items():
            if "json" in spec:
                out[col] = list(spec["json"])
                continue
            dtype = spec["dtype"]
            if dtype not in _ALLOWED_DTYPES:
                raise ValueError(f"column {name}.{col} has dtype {dtype}")
            nbytes = int(spec["nbytes"])
            arr = np.frombuffer(blob, dtype=np.dtype(dtype), count=int(spec["n"]), offset=offset)
            if arr.nbytes != nbytes:
                raise ValueError(f"column {name}.{col} length mismatch")
            out[col] = arr.copy()
            offset += nbytes
    header["tables"] = tables
    return header


# ------------------------------------------------------------------------------- the child
#: The child's address-space cap (set by ``_cap_child``; ``cap_phase`` lowers it for one phase).
_child_cap: int | None = None


def _cap_child(limits: Limits) -> None:
    import resource

    global _child_cap
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm_size_bytes() + limits.memory_bytes
    if soft != resource.RLIM_INFINITY:
        want = min(want, soft)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    _child_cap = want


def cap_phase(more_bytes: int | None) -> None:
    """In the child: allow the next phase ``more_bytes`` beyond what the process holds now (never more
    than the child's cap); None puts the child's cap back. Outside a child: nothing."""
    if _child_cap is None:
        return
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = _child_cap if more_bytes is None else min(_child_cap, vm_size_bytes() + more_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)    # the alarm kills, even inside C code
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _send(fd: int, kind: bytes, data: bytes) -> None:
    msg = kind + struct.pack("<Q", len(data)) + data
    view = memoryview(msg)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _error_fields(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, TraceFormatError):
        return {"class": type(exc).__name__ if type(exc).__name__ in _ERROR_CLASSES else "TraceFormatError",
                "record": exc.record, "reason": exc.reason,
                "limit_name": getattr(exc, "limit_name", None)}
    if isinstance(exc, MemoryError):
        return {"class": "memory"}
    return {"class": "TraceFormatError", "record": None,
            "reason": f"malformed data: {type(exc).__name__}: {str(exc)[:200]}"}


def run_isolated(path: str, limits: Limits, work: Callable[[Callable[[str], None]], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work(phase)`` in a capped child; return its payload or raise the error it met.

    ``work`` calls ``phase(name)`` to say where it is; when the child is killed (memory or time),
    the error names that phase. Raises ``ChildFailed`` (with ``phase``) for a killed child.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child; its result is what the tests check
        status = 0
        try:
            os.close(read_fd)
            # The child lives for one parse and then exits: no cycle collection, whose full passes
            # would also touch (and copy) every page inherited from the parent.
            gc.disable()
            _cap_child(limits)
            signal.alarm(max(1, int(limits.seconds)))

            def phase(name: str) -> None:
                _send(write_fd, _PHASE, name.encode())

            try:
                payload = work(phase)
                _send(write_fd, _RESULT, encode_payload(payload))
            except BaseException as exc:  # noqa: BLE001 - everything goes back as one error
                _send(write_fd, _ERROR, json.dumps(_error_fields(exc)).encode())
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks = []
    try:
        while True:
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, wait_status = os.waitpid(pid, 0)
    return _interpret(path, limits, b"".join(chunks), wait_status)


class ChildFailed(Exception):
    """The child was killed or ran out of memory; ``phase`` is the last phase it reported."""

    def __init__(self, phase: str, why: str):
        super().__init__(f"{why} during {phase}")
        self.phase = phase
        self.why = why   # "memory" or "time"


def _interpret(path: str, limits: Limits, stream: bytes, wait_status: int) -> dict[str, Any]:
    phase = "start"
    pos = 0
    while pos + 9 <= len(stream):
        kind = stream[pos:pos + 1]
        (n,) = struct.unpack_from("<Q", stream, pos + 1)
        data = stream[pos + 9:pos + 9 + n]
        if len(data) < n:
            break
        pos += 9 + n
        if kind == _PHASE:
            phase = data.decode()
        elif kind == _RESULT:
            return decode_payload(data)
        elif kind == _ERROR:
            fields = json.loads(data)
            cls = fields.get("class")
            if cls == "memory":
                raise ChildFailed(phase, "memory")
            if cls == "LimitExceeded" and fields.get("limit_name"):
                exc = TraceFormatError(path, fields.get("record"), fields["reason"])
                exc.__class__ = LimitExceeded
                exc.limit_name = fields["limit_name"]
                raise exc
            raise _ERROR_CLASSES.get(cls, TraceFormatError)(path, fields.get("record"), fields["reason"])
    if os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGALRM:
        raise ChildFailed(phase, "time")
    raise ChildFailed(phase, "memory")
