"""The capture child's private line to ``allocsim capture``: ``Channel.from_env()`` sends events, asks questions.

The child (the user's script, in the user's interpreter) writes what it records as JSON lines on a
pipe the parent opened for it, never on stdout or stderr: the script's own output passes through
untouched and nothing it prints can be mistaken for a record. The parent answers questions the
script asks of the CUDA allocator (``torch.cuda.memory_reserved()``) on a second pipe, from its
model of the caching allocator fed with the same records.

Only the standard library is used here: the child must run in any interpreter that has torch.

Messages (a JSON array per line, the first item says which):

``["H", meta]``                 the capture's header: torch version, settings
``["S", stack_id, frames]``     a stack met for the first time: ``[[filename, line, name], ...]``, innermost first
``["A", t_ns, addr, size_bytes, stream, stack_id]``   a request of the caching allocator
``["F", t_ns, addr, stream]``   its free
``["P", t_ns, addr, stream]``   its free, while other streams recorded uses of it (``record_stream``)
``["K", t_ns, addr, stream]``   that block is reusable now (``stream_clock``)
``["X", fact]``                 a fact of a distributed job (``distributed.facts``)
``["C", addr, category]``       the live block at ``addr`` is a ``parameter``, ``gradient``, ... (see ``categories``)
``["M", t_ns, label]``          a marker (``ProfilerStep#N``, ``memory_history start``, ...)
``["E", t_ns]``                 the script called ``torch.cuda.empty_cache()``
``["N", text]``                 a note for the trace (something the capture could not do as the GPU does)
``["Q", name]``                 a question; the parent answers one JSON line on the answer pipe
``["D", summary]``              the end: steps, status, counts
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

#: Environment variable naming the two descriptors: "WRITE_FD,READ_FD".
ENV_FDS = "ALLOCSIM_CAPTURE_FDS"
#: Environment variable with the capture's settings (JSON), written by the parent.
ENV_CONFIG = "ALLOCSIM_CAPTURE_CONFIG"
#: Bytes buffered before a write: few system calls, and a killed child loses at most this much.
_FLUSH_BYTES = 1 << 16
_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, check_circular=False).encode


class Channel:
    """Buffered JSON-line writer to the parent plus a blocking question/answer; safe across threads and fork."""

    def __init__(self, write_fd: int, read_fd: int):
        self._write_fd = write_fd
        self._read_fd = read_fd
        self._buffer = bytearray()
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._pending_answer = bytearray()
        self.closed = False
        # A forked process (a DataLoader worker) inherits the buffer and the descriptor: it must
        # write neither, or the parent would read the records twice.
        os.register_at_fork(after_in_child=self._forked)

    @classmethod
    def from_env(cls) -> "Channel | None":
        """The channel the parent set up (``ALLOCSIM_CAPTURE_FDS``), or None when run by hand."""
        value = os.environ.pop(ENV_FDS, "")
        try:
            write_fd, read_fd = (int(part) for part in value.split(","))
        except ValueError:
            return None
        return cls(write_fd, read_fd)

    def _forked(self) -> None:
        self._buffer = bytearray()
        self.closed = True

    def send(self, message: list[Any]) -> None:
        """Queue one message; written when the buffer fills, at ``flush``, or before a question."""
        if self.closed or os.getpid() != self._pid:
            return
        line = _DUMPS(message).encode("ascii") + b"\n"
        with self._lock:
            self._buffer += line
            if len(self._buffer) >= _FLUSH_BYTES:
                self._write_buffer()

    def flush(self) -> None:
        """Write everything queued so far."""
        if self.closed or os.getpid() != self._pid:
            return
        with self._lock:
            self._write_buffer()

    def _write_buffer(self) -> None:
        view = memoryview(self._buffer)
        try:
            while view:
                written = os.write(self._write_fd, view)
                view = view[written:]
        except OSError:                   # the parent is gone: nobody reads the rest
            self.closed = True
        finally:
            view.release()
        self._buffer.clear()

    def ask(self, name: str) -> Any:
        """Ask the parent ``name`` (``memory_reserved`` ...) after everything sent so far; None if it cannot answer."""
        if self.closed or os.getpid() != self._pid:
            return None
        with self._lock:
            self._buffer += _DUMPS(["Q", name]).encode("ascii") + b"\n"
            self._write_buffer()
            return self._read_answer()

    def _read_answer(self) -> Any:
        data = self._pending_answer
        while b"\n" not in data:
            try:
                chunk = os.read(self._read_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            data += chunk
        line, _, rest = bytes(data).partition(b"\n")
        self._pending_answer = bytearray(rest)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def close(self) -> None:
        """Write what is queued and stop sending."""
        self.flush()
        self.closed = True


class NullChannel(Channel):
    """A channel that drops everything (the child run by hand, outside ``allocsim capture``)."""

    def __init__(self) -> None:  # noqa: D107  (no descriptors)
        self.closed = True
        self._lock = threading.RLock()

    def send(self, message: list[Any]) -> None:
        return

    def flush(self) -> None:
        return

    def ask(self, name: str) -> Any:
        return None
