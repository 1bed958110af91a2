"""The capture child's private line to ``allocsim capture``: ``Channel.from_env()`` sends records and asks questions, ``FrameReader`` reads them in the parent.

The child (the user's script, in the user's interpreter) writes what it records as JSON lines on a
pipe the parent opened for it, never on stdout or stderr: the script's own output passes through
untouched and nothing it prints can be mistaken for a record. The parent answers questions the
script asks of the CUDA allocator (``torch.cuda.memory_reserved()``) on a second pipe, from its
model of the caching allocator fed with the same records.

Only the standard library is used here: the child must run in any interpreter that has torch.

**Frames.** Lines travel in frames: a fixed 59-byte header ``SECRET SEQ LENGTH\\n`` (32 hex digits
of a per-capture secret, a 16-hex-digit sequence number from 0, an 8-hex-digit payload length),
then LENGTH bytes of whole lines. The secret is drawn by the parent for each capture and handed to
the child as the first line of the answer pipe, so it is in no environment variable, argument or
file. The parent (``FrameReader``) takes a frame only with the secret, the next number and a
length within ``MAX_FRAME_BYTES``: bytes written to the pipe by anything else (the script finding
the descriptor in ``/proc/self/fd``), frames taken off it, or a stream cut short are found at the
first frame they touch, and the capture ends there, incomplete. What this relies on: the secret
lives only in the two processes' memory. The script runs in the child process, so a script that
reads its own process's memory can find it; no in-process mechanism stops that, and the parent
therefore also validates every field of every record (``records``) and takes how the script ended
from its own wait status, never from the child's word.

**The tail.** The child builds each frame in a file mapping it shares with the parent (``TAIL``:
``seq`` and ``fill`` as two little-endian u64, then the payload) and updates ``fill`` after each
whole line. When the child dies before it writes the frame (a segfault, SIGKILL, ``--timeout``'s
kill, an ``exec``), the parent reads the unsent lines from the mapping: nothing recorded is lost
to the child's buffering.

Messages (a JSON array per line, the first item says which):

``["H", meta]``                 the capture's header: torch version, the script
``["S", stack_id, frames]``     a stack met for the first time: ``[[filename, line, name], ...]``, innermost first
``["A", t_ns, addr, size_bytes, stream, stack_id, phase]``   a request of the caching allocator
``["R", question_id, t_ns, addr, size_bytes, stream, stack_id, phase]``   the same, near the card's
                                memory: the parent answers ``[question_id, {"ok": headroom}]`` when the modelled
                                allocator served it, ``[question_id, {"oom": message}]`` when not
``["F", t_ns, addr, stream]``   its free
``["P", t_ns, addr, stream]``   its free while other streams recorded uses (``record_stream``): reusable at its ``K``
``["K", t_ns, addr, stream]``   that free completed (``stream_clock``)
``["P", t_ns, addr, stream]``   its free, while other streams recorded uses of it (``record_stream``)
``["K", t_ns, addr, stream]``   that block is reusable now (``stream_clock``)
``["X", fact]``                 a fact of a distributed job (``distributed.facts``)
``["C", addr, category]``       the live block at ``addr`` is a ``parameter``, ``gradient``, ... (see ``categories``)
``["M", t_ns, label]``          a marker (``ProfilerStep#N``, ``memory_history start``, ...)
``["E", t_ns]``                 the script called ``torch.cuda.empty_cache()``
``["N", text]``                 a note for the trace (something the capture could not do as the GPU does)
``["Z", reason]``               the capture ends here, incomplete (the process is replaced by ``exec``):
                                the reason, kept if no summary follows
``["X", fact]``                 a fact of a distributed job (``distributed.facts``: world, groups, stages...)
``["Q", question_id, name]``    a question; the parent answers ``[question_id, answer]`` on the answer pipe
``["D", summary]``              the end: status, settings
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import threading
from typing import Any

#: Environment variable naming the three descriptors: "EVENTS_WRITE_FD,ANSWERS_READ_FD,TAIL_FD".
ENV_FDS = "ALLOCSIM_CAPTURE_FDS"
#: Environment variable with the capture's settings (JSON), written by the parent.
ENV_CONFIG = "ALLOCSIM_CAPTURE_CONFIG"
#: Hex digits of the per-capture secret.
SECRET_CHARS = 32
#: A frame's header: secret, space, 16 hex digits of sequence, space, 8 of length, newline.
HEADER_BYTES = SECRET_CHARS + 1 + 16 + 1 + 8 + 1
_HEADER_REST = re.compile(rb" ([0-9a-f]{16}) ([0-9a-f]{8})\n")
#: Bytes the child gathers before it writes a frame: few system calls.
FLUSH_BYTES = 1 << 16
#: The largest frame either side accepts (the child's lines are bounded by ``MAX_TEXT_CHARS``).
MAX_FRAME_BYTES = 4 << 20
#: Characters of one string in a record (file, function, label, note): longer ones are cut.
MAX_TEXT_CHARS = 4096
#: Bytes of one answer line the child reads.
MAX_ANSWER_BYTES = 1 << 20
#: The tail mapping: two u64 (sequence number of the frame being built, bytes filled), then the payload.
TAIL_HEADER_BYTES = 16
TAIL_BYTES = TAIL_HEADER_BYTES + MAX_FRAME_BYTES
_U64 = struct.Struct("<Q")
_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, check_circular=False).encode


def text(value: Any) -> str:
    """``value`` as a record's string: at most ``MAX_TEXT_CHARS`` characters."""
    value = value if isinstance(value, str) else str(value)
    return value if len(value) <= MAX_TEXT_CHARS else value[:MAX_TEXT_CHARS - 3] + "..."


class Channel:
    """Framed JSON-line writer to the parent plus a blocking question/answer; safe across threads, signals and fork."""

    def __init__(self, write_fd: int, read_fd: int, tail_fd: int, secret: bytes):
        self._write_fd = write_fd
        self._read_fd = read_fd
        self._secret = secret
        self._tail = mmap.mmap(tail_fd, TAIL_BYTES)
        os.close(tail_fd)                 # the mapping stays; no descriptor is left to find
        self._seq = 0
        self._fill = 0
        self._lock = threading.RLock()
        self._busy = False                # a line is being appended (a signal handler or GC callback may nest)
        self._deferred: list[bytes] = []
        self._pid = os.getpid()
        self._pending_answer = bytearray()
        self._next_question = 0
        self.closed = False
        #: Called once when the parent is gone (a write fails): the child ends, nobody records.
        self.on_parent_gone: Any = None
        # A forked process (a DataLoader worker) inherits the mapping and the descriptors: it must
        # write neither, or the parent would read the records twice.
        os.register_at_fork(after_in_child=self._forked)

    @classmethod
    def from_env(cls) -> "Channel | None":
        """The channel the parent set up (``ALLOCSIM_CAPTURE_FDS``), or None when run by hand."""
        value = os.environ.pop(ENV_FDS, "")
        try:
            write_fd, read_fd, tail_fd = (int(part) for part in value.split(","))
        except ValueError:
            return None
        # Nothing the script starts (a subprocess, an exec) inherits the capture's descriptors.
        for fd in (write_fd, read_fd):
            os.set_inheritable(fd, False)
        secret = _read_secret(read_fd)
        if secret is None:
            return None
        return cls(write_fd, read_fd, tail_fd, secret)

    def _forked(self) -> None:
        self.closed = True

    def _usable(self) -> bool:
        return not self.closed and os.getpid() == self._pid

    def send(self, message: list[Any]) -> None:
        """Queue one message; written when a frame fills, at ``flush``, or before a question."""
        if self.closed:
            return
        self.send_line(_DUMPS(message).encode("ascii") + b"\n")

    def send_line(self, line: bytes) -> None:
        """Queue one encoded message (``line`` ends with a newline)."""
        if not self._usable():
            return
        with self._lock:
            if self._busy:              # a nested send (signal handler, weakref callback): after this one
                self._deferred.append(line)
                return
            self._busy = True
            try:
                self._append(line)
                while self._deferred:
                    self._append(self._deferred.pop(0))
            finally:
                self._busy = False

    def _append(self, line: bytes) -> None:
        n = len(line)
        if n > MAX_FRAME_BYTES:         # cannot happen with bounded strings; never write a frame the parent refuses
            return
        if self._fill + n > MAX_FRAME_BYTES:
            self._write_frame()
        pos = TAIL_HEADER_BYTES + self._fill
        self._tail[pos:pos + n] = line
        self._fill += n
        _U64.pack_into(self._tail, 8, self._fill)
        if self._fill >= FLUSH_BYTES:
            self._write_frame()

    def _write_frame(self) -> None:
        fill = self._fill
        if not fill or self.closed:
            return
        frame = b"%s %016x %08x\n" % (self._secret, self._seq, fill) + self._tail[TAIL_HEADER_BYTES:TAIL_HEADER_BYTES + fill]
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self._write_fd, view):]
        except OSError:                   # the parent is gone: nobody reads the rest
            self.closed = True
            if self.on_parent_gone is not None:
                self.on_parent_gone()
            return
        # fill first: dying between the two leaves (this seq, 0), which the parent knows it has read
        self._fill = 0
        _U64.pack_into(self._tail, 8, 0)
        self._seq += 1
        _U64.pack_into(self._tail, 0, self._seq)

    def flush(self) -> None:
        """Write everything queued so far."""
        if not self._usable():
            return
        with self._lock:
            if not self._busy:
                self._write_frame()

    def ask(self, name: str) -> Any:
        """Ask the parent ``name`` (``memory_stats`` ...) after everything sent so far; None if it cannot answer."""
        return self._ask(lambda qid: _DUMPS(["Q", qid, name]).encode("ascii") + b"\n")

    def ask_request(self, fields: tuple) -> Any:
        """Send a request (``A``'s fields) the parent must answer: ``{"ok": headroom}`` or ``{"oom": message}``."""
        return self._ask(lambda qid: b'["R",%d,%d,%d,%d,%d,%d,"%s"]\n' % (qid, *fields))

    def _ask(self, line_for: Any) -> Any:
        if not self._usable():
            return None
        with self._lock:
            if self._busy:              # asked from inside a send (a signal handler): no answer
                return None
            qid = self._next_question
            self._next_question += 1
            self._busy = True
            try:
                self._append(line_for(qid))
                self._write_frame()
            finally:
                self._busy = False
            return self._read_answer(qid)

    def _read_answer(self, qid: int) -> Any:
        while True:
            line = self._read_line()
            if line is None:
                return None
            try:
                answer = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(answer, list) and len(answer) == 2 and answer[0] == qid:
                return answer[1]

    def _read_line(self) -> bytes | None:
        data = self._pending_answer
        while b"\n" not in data:
            if len(data) > MAX_ANSWER_BYTES:
                self.closed = True
                return None
            try:
                chunk = os.read(self._read_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            data += chunk
        end = data.index(b"\n")
        line = bytes(data[:end])
        del data[:end + 1]
        return line

    def close(self) -> None:
        """Write what is queued and stop sending."""
        self.flush()
        self.closed = True


def _read_secret(fd: int) -> bytes | None:
    """The first line of the answer pipe: the capture's secret (read byte by byte, so no answer is taken)."""
    data = b""
    while len(data) <= SECRET_CHARS:
        try:
            byte = os.read(fd, 1)
        except OSError:
            return None
        if not byte:
            return None
        if byte == b"\n":
            break
        data += byte
    return data if len(data) == SECRET_CHARS else None


class NullChannel(Channel):
    """A channel that drops everything (the child run by hand, outside ``allocsim capture``)."""

    def __init__(self) -> None:  # noqa: D107  (no descriptors)
        self.closed = True
        self._lock = threading.RLock()
        self.on_parent_gone = None

    def send(self, message: list[Any]) -> None:
        return

    def send_line(self, line: bytes) -> None:
        return

    def flush(self) -> None:
        return

    def ask(self, name: str) -> Any:
        return None

    def ask_request(self, fields: tuple) -> Any:
        return None

    def close(self) -> None:
        return


class FrameReader:
    """The parent's end: bytes from the pipe in, whole frames' lines out, in order; ``damaged`` says why it stopped.

    Work is linear in the bytes read and memory is bounded by one frame: a header is a fixed 59
    bytes, a payload at most ``MAX_FRAME_BYTES``, and nothing is searched for a newline that may
    never come.
    """

    def __init__(self, secret: bytes):
        self._secret = secret
        self._buffer = bytearray()
        self._payload_bytes = 0           # > 0: the header is read, this many payload bytes come next
        self.seq = 0                      # the sequence number of the next frame
        self.damaged = ""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines of every frame ``chunk`` completes (empty once the stream is damaged)."""
        if self.damaged:
            return []
        buffer = self._buffer
        buffer += chunk
        lines: list[bytes] = []
        pos = 0
        while True:
            if self._payload_bytes:
                end = pos + self._payload_bytes
                if len(buffer) < end:
                    break
                payload = bytes(buffer[pos:end])
                pos = end
                self._payload_bytes = 0
                if not payload.endswith(b"\n"):
                    self.damaged = f"frame {self.seq} does not end with a whole line"
                    break
                lines.extend(payload[:-1].split(b"\n"))
                self.seq += 1
                continue
            if len(buffer) - pos < HEADER_BYTES:
                break
            length, why = self._header(bytes(buffer[pos:pos + HEADER_BYTES]))
            if why:
                self.damaged = why
                break
            self._payload_bytes = length
            pos += HEADER_BYTES
        del buffer[:pos]
        if self.damaged:
            buffer.clear()
        return lines

    def _header(self, header: bytes) -> tuple[int, str]:
        """The payload length a frame header announces, or why the header is refused."""
        if header[:SECRET_CHARS] != self._secret:
            return 0, (f"bytes without the capture's secret where frame {self.seq} should begin (something other "
                       "than the capture wrote to its pipe)")
        match = _HEADER_REST.fullmatch(header, SECRET_CHARS)
        if match is None:
            return 0, f"a damaged header for frame {self.seq}"
        seq, length = int(match.group(1), 16), int(match.group(2), 16)
        if seq != self.seq:
            return 0, (f"frame {seq} where frame {self.seq} was due (frames were taken off the capture's pipe or "
                       "written twice)")
        if not 0 < length <= MAX_FRAME_BYTES:
            return 0, f"frame {seq} announces {length} bytes (at most {MAX_FRAME_BYTES} are taken)"
        return length, ""

    @property
    def mid_frame(self) -> bool:
        """Whether the stream stopped inside a frame (the child died while writing it)."""
        return bool(self._payload_bytes or self._buffer)

    def tail(self, tail: Any) -> tuple[list[bytes], str]:
        """The lines the child gathered but never wrote (read from the tail mapping once it is gone), and a problem if any.

        Also after the stream was damaged, when the child had written no frame since the last one
        read (the tail is then the very next frame, and nothing between is missing).
        """
        seq, fill = _U64.unpack_from(tail, 0)[0], _U64.unpack_from(tail, 8)[0]
        if fill == 0 or seq == self.seq - 1 or (self.damaged and seq != self.seq):
            return [], ""                 # nothing unsent, the frame it sent just before it died, or frames lost
        if seq != self.seq or fill > MAX_FRAME_BYTES:
            return [], f"the capture's unsent records are inconsistent (frame {seq}, {fill} bytes; frame {self.seq} was due)"
        payload = bytes(tail[TAIL_HEADER_BYTES:TAIL_HEADER_BYTES + fill])
        end = payload.rfind(b"\n")
        if end < 0:
            return [], ""
        self.seq += 1
        return payload[:end].split(b"\n"), ""
