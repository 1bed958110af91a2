"""Capture a script's CUDA allocations in a child process and write the trace: ``capture(command, out_path)``.

The child (``allocsim.torch_capture.child``, started by path through ``bootstrap`` so the script sees
the user's environment only) runs in the user's interpreter with torch and the standard library,
and streams its records over a private pipe (``channel``); this side, with allocsim's dependencies,
checks each record (``records``), turns them into a ``Trace`` as they come, answers the script's
questions about the caching allocator (``torch.cuda.memory_reserved()``...) from a model of it fed
with the same requests (``PYTORCH_CUDA_ALLOC_CONF`` applies; with a card's memory, ``--gpu``, the
model decides when the script gets ``torch.cuda.OutOfMemoryError``), names each allocation's
category, and writes the trace at the end (``trace_file``), also when the script raised, was
interrupted, was killed or ran past ``timeout_s``: then with what it recorded up to there, the
records the child had not sent yet included (read from the channel's tail), and a note saying why.

How the script ended is this process's own observation (the child's wait status, the channel's
frames), never the child's word alone: a summary that claims success from a process that was killed
is not believed, the steps counted are the step markers received. Every way the capture ends has an
exit status: 0 complete; 2 it could not start; 3 the script raised, exited with an error, was killed
by a signal or ended without the capture's summary; 4 the capture refused what the script did (a
request over 1 PiB, a damaged channel, a record it cannot take, CUDA work in a process the script
started); 124 ``timeout_s``; 130 Ctrl-C; 143 SIGTERM to this process (passed on to the script). The
script's stdout and stderr pass through untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import mmap
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from array import array
from typing import Any, Iterator

from ..errors import OutOfMemory
from ..metrics.categories import CAPTURE_FILE, CAPTURE_PREFIX, CATEGORIES
from ..policies.base import Policy
from ..trace.inference.completeness import short_reason
from ..trace.reading.builder import TraceBuilder
from ..trace.reading.frames import FrameTable
from ..trace.schema import FRAME_DTYPES, STACK_DTYPES, frame_from_columns
from . import FORMAT
from .channel import ENV_CONFIG, ENV_FDS, TAIL_BYTES, FrameReader
from .command_line import child_command, script_of, script_problem, split_command  # noqa: F401  (this module's API)
from .distributed.relay import QUESTION as RELAY_QUESTION
from .distributed.roles import JobFacts
from .oom import oom_message
from .records import Refused, checked, plain, request_size

EXIT_OK, EXIT_CANNOT_START, EXIT_SCRIPT_FAILED, EXIT_REFUSED = 0, 2, 3, 4
EXIT_TIMEOUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 124, 130, 143
#: Seconds the script gets to end after SIGINT (Ctrl-C, --timeout) or SIGTERM before it is killed.
GRACE_S = 10.0
#: Answers the parent holds for a child that does not read them: past this, the capture ends.
MAX_PENDING_ANSWER_BYTES = 1 << 20
#: Distinct stacks and notes the parent keeps from one capture.
MAX_STACKS = 1_000_000
MAX_NOTES = 1000
#: Reports of processes the script started that used CUDA, read at the end.
MAX_OUTSIDE_REPORTS = 100
#: The folder a process the script starts finds on its PYTHONPATH (``outside/sitecustomize.py``).
HOOKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "outside")
_STEP = re.compile(r"ProfilerStep#([1-9][0-9]{0,18})")
_REPORT = re.compile(r"cuda-[0-9]{1,10}\.txt")
_CATEGORY_CODE = {name: i + 1 for i, name in enumerate(CATEGORIES)}


@dataclasses.dataclass
class CaptureResult:
    """How a capture ended and what it wrote."""

    status: int                          # EXIT_OK, EXIT_SCRIPT_FAILED, EXIT_REFUSED, EXIT_TIMEOUT, ...
    trace_path: str | None               # None: nothing was written
    summary: dict[str, Any]
    seconds: float
    message: str = ""                    # why the trace is incomplete or was not written
    #: The trace went elsewhere than ``out_path``: why (the script made ``out_path`` a FIFO, its own file...).
    moved: str = ""
    writes_line: str = ""                # where the script's writes went instead ("" when it wrote nothing)


class _AllocatorModel:
    """PyTorch's caching allocator fed with the capture's requests: what ``torch.cuda.memory_*`` would say.

    With ``capacity_bytes`` (the card's memory for tensors, ``gpus.allocator_capacity``) its device
    refuses segments beyond it, and the policy's own retry path (free the cache, try again) decides
    an out-of-memory error as PyTorch's does.
    """

    def __init__(self, capacity_bytes: int | None = None, total_bytes: int | None = None) -> None:
        self.note = ""
        self.capacity_bytes = capacity_bytes
        self.total_bytes = total_bytes if total_bytes is not None else capacity_bytes
        self.policy = self._build()
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.n_allocs = 0

    def _build(self) -> Policy:
        from ..device import SimulatedDevice  # noqa: PLC0415
        from ..policies.registry import build_policy  # noqa: PLC0415
        from ..settings.alloc_conf import env_alloc_conf  # noqa: PLC0415

        try:
            conf = env_alloc_conf()
            name, params = (conf.policy, conf.params) if conf is not None else ("pytorch", {})
            return build_policy(name, device=SimulatedDevice(self.capacity_bytes), params=params)
        except ValueError as exc:
            self.note = f"torch.cuda.memory_* answered with PyTorch's default allocator settings: {exc}"
            return build_policy("pytorch", device=SimulatedDevice(self.capacity_bytes))

    def malloc(self, alloc_id: int, size_bytes: int, stream: int) -> None:
        """Serve a request (``OutOfMemory`` when a card's memory cannot hold it, as the allocator's retry path decides)."""
        policy = self.policy
        policy.malloc(alloc_id, size_bytes, stream)
        self.n_allocs += 1
        self.peak_allocated = max(self.peak_allocated, policy.allocated_bytes)
        self.peak_reserved = max(self.peak_reserved, policy.reserved_bytes)
        self.peak_requested = max(self.peak_requested, policy.requested_bytes)

    def free(self, alloc_id: int) -> None:
        if alloc_id in self.policy.live:
            self.policy.free(alloc_id)

    def free_requested(self, alloc_id: int) -> None:
        if alloc_id in self.policy.live and alloc_id not in self.policy.pending:
            self.policy.free_requested(alloc_id)

    def free_completed(self, alloc_id: int) -> None:
        if alloc_id in self.policy.live:
            self.policy.free_completed(alloc_id)

    def headroom(self) -> int:
        """Bytes the allocator can still reserve on the card."""
        return max(0, (self.capacity_bytes or 0) - self.policy.reserved_bytes)

    def oom_text(self, size_bytes: int) -> str:
        """The message of the ``torch.cuda.OutOfMemoryError`` the script gets for ``size_bytes`` (``oom``).

        What ``cudaMemGetInfo`` calls free after the allocator released its cache is the card's
        memory for tensors less what it still reserves.
        """
        policy = self.policy
        return oom_message(size_bytes, self.total_bytes or 0, self.headroom(), policy.allocated_bytes,
                           policy.reserved_bytes)

    def stats(self) -> dict[str, int]:
        policy = self.policy
        return {
            "allocated_bytes.all.current": policy.allocated_bytes, "allocated_bytes.all.peak": self.peak_allocated,
            "reserved_bytes.all.current": policy.reserved_bytes, "reserved_bytes.all.peak": self.peak_reserved,
            "requested_bytes.all.current": policy.requested_bytes, "requested_bytes.all.peak": self.peak_requested,
            "active_bytes.all.current": policy.allocated_bytes, "active_bytes.all.peak": self.peak_allocated,
            "allocation.all.current": len(policy.live), "num_alloc_retries": 0, "num_ooms": policy.n_ooms,
            "num_device_alloc": policy.device.n_mallocs, "num_device_free": policy.device.n_frees,
        }

    def answer(self, name: str) -> Any:
        if name == "memory_stats":
            return self.stats()
        if name == "reset_peak_memory_stats":
            policy = self.policy
            self.peak_allocated, self.peak_reserved = policy.allocated_bytes, policy.reserved_bytes
            self.peak_requested = policy.requested_bytes
            return True
        if name == "reset_accumulated_memory_stats":
            return True
        return None


class _Converter:
    """The child's messages, as they come, into a ``TraceBuilder`` and the allocator model.

    ``feed(line)`` checks the line (``records``) and applies it; the first record it cannot take
    sets ``refused`` (the reason) and nothing after it is applied: the capture ends there.
    """

    def __init__(self, out_path: str, model: _AllocatorModel | None = None, relay: Any = None):
        self.relay = relay              # pipeline messages shared with the job's other captures (relay.Relay)
        self.builder = TraceBuilder(out_path, FORMAT)
        self.frames = FrameTable(out_path)
        self.model = model or _AllocatorModel()
        self.record = 0
        self.stacks: dict[int, tuple[int, list[dict[str, Any]]]] = {}   # child's id -> (table id, frames)
        self.live: dict[int, int] = {}                 # addr -> alloc_id
        # per alloc_id, column by column (bounded memory at 10^6 allocations): its event, the child's
        # stack, the phase it was made in, the category named for it (0: none), the event that freed it (-1)
        self.alloc_event = array("q")
        self.alloc_stack = array("q")
        self.alloc_phase = bytearray()
        self.alloc_category = bytearray()
        self.alloc_freed = array("q")
        self.header: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.writes: Any = None            # the write guard's journal, as sent (``scratch.ScriptWrites.read`` checks it)
        self.facts = JobFacts()            # a distributed job's facts (``X`` records: world, groups, stages...)
        # the request stream without times or addresses: equal for ranks that do the same work
        self.fingerprint = hashlib.blake2b(digest_size=16)
        self.notes: dict[str, None] = {}
        self.ended = ""                    # a ``Z`` record: why the capture ends without its summary
        self.refused = ""                  # the record the capture could not take, and why
        self.steps = 0                     # step markers received (the summary's count is not believed)
        self.ooms: list[str] = []          # the out-of-memory errors the script got
        self._oom_addrs: set[int] = set()
        self.unraised_ooms = 0
        #: The card the capture reported (this process's own argument; the child's summary is not used for it).
        self.gpu: dict[str, Any] = {}

    @property
    def n_allocs(self) -> int:
        return len(self.alloc_event)

    def feed(self, line: bytes) -> Any:
        """Apply one line; return the answer to send back (a question's), else None."""
        if self.refused:
            return None
        self.record += 1
        try:
            return self._apply(checked(line))
        except Refused as exc:
            self.refused = f"record {self.record}: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever an untrusted record does, it ends the capture, not allocsim
            # the builder's and the model's own checks (a time going back, a free of a block never made...)
            self.refused = f"record {self.record}: {type(exc).__name__}: {str(exc)[:300]}"
        return None

    def _apply(self, m: tuple) -> Any:
        kind = m[0]
        builder = self.builder
        if kind == "A":
            self._alloc(*m[1:])
        elif kind == "R":
            return [m[1], self._alloc(*m[2:], asked=True)]
        elif kind == "F":
            _, t_ns, addr, stream = m
            if addr in self._oom_addrs:                # a request the model refused: there is nothing to free
                self._oom_addrs.discard(addr)
                return None
            alloc_id = self.live.pop(addr, None)
            if alloc_id is None:
                raise Refused(f"a free of address {addr:#x}, which is not allocated")
            builder.free(self.record, t_ns, 0, stream, addr)
            self.alloc_freed[alloc_id] = builder.next_event_index - 1
            self.model.free(alloc_id)
            self.fingerprint.update(b"F%d;" % alloc_id)
        elif kind == "P":             # freed while other streams recorded uses: reusable at its "K"
            _, t_ns, addr, stream = m
            alloc_id = self.live.get(addr)
            if alloc_id is None:
                raise Refused(f"a free of address {addr:#x}, which is not allocated")
            builder.free_requested(self.record, t_ns, 0, stream, addr)
            self.alloc_freed[alloc_id] = builder.next_event_index - 1
            self.model.free_requested(alloc_id)
            self.fingerprint.update(b"P%d;" % alloc_id)
        elif kind == "K":
            _, t_ns, addr, stream = m
            alloc_id = self.live.pop(addr, None)
            if alloc_id is None:
                raise Refused(f"a completed free of address {addr:#x}, which is not allocated")
            builder.free_completed(self.record, t_ns, 0, stream, addr)
            self.model.free_completed(alloc_id)
            self.fingerprint.update(b"K%d;" % alloc_id)
        elif kind == "S":
            _, child_stack, frames = m
            if child_stack in self.stacks or len(self.stacks) >= MAX_STACKS:
                raise Refused(f"stack {child_stack} is defined twice, or past {MAX_STACKS:,} stacks")
            dicts = [{"filename": f, "line": line, "name": name} for f, line, name in frames]
            self.stacks[child_stack] = (self.frames.stack_id(dicts, f"stack {child_stack}"), dicts)
        elif kind == "C":
            _, addr, category = m
            if category not in _CATEGORY_CODE:
                raise Refused(f"unknown category {category!r}")
            alloc_id = self.live.get(addr)
            if alloc_id is not None:
                self.alloc_category[alloc_id] = _CATEGORY_CODE[category]
        elif kind == "M":
            _, t_ns, label = m
            builder.marker(self.record, t_ns, label)
            step = _STEP.fullmatch(label)
            if step is not None:
                self.steps = max(self.steps, int(step.group(1)))
        elif kind == "E":
            builder.empty_cache(self.record, m[1], 0)
            self.model.policy.empty_cache()
        elif kind == "N":
            if len(self.notes) < MAX_NOTES:
                self.notes[m[1]] = None
        elif kind == "Z":
            self.ended = m[1]
        elif kind == "X":
            kept = len(self.facts.messages)
            self.facts.add(m[1])
            if self.relay is not None and len(self.facts.messages) > kept:
                sent = self.facts.messages[-1]
                self.relay.put(sent["src_stage"], sent["dst_stage"], sent["payload"])
        elif kind == "Q":
            if self.relay is not None and m[2].startswith(RELAY_QUESTION):
                return [m[1], self.relay.answer(m[2], id(self))]
            return [m[1], self.model.answer(m[2])]
        elif kind == "H":
            self.header = plain(m[1])
        elif kind == "D":
            self.summary = plain(m[1])
            self.writes = m[1].get("writes")
        return None

    def _alloc(self, t_ns: int, addr: int, size_bytes: int, stream: int, child_stack: int, phase: str,
               asked: bool = False) -> Any:
        """A request; ``asked`` (an ``R``): the child waits for the model's word, ``{"ok": headroom}`` or ``{"oom": message}``.

        A request the modelled card cannot serve is, when asked, refused as PyTorch refuses it: the
        script gets the error, the trace a marker, and no allocation is recorded (there is none on
        the GPU). Without a card every request is checked against 1 PiB first.
        """
        model = self.model
        on_card = asked and model.capacity_bytes is not None
        if not on_card:
            size_bytes = request_size(size_bytes)
        alloc_id = self.n_allocs
        try:
            model.malloc(alloc_id, size_bytes, stream)
        except OutOfMemory:
            if on_card:
                text = model.oom_text(size_bytes)
                self.ooms.append(text)
                self._oom_addrs.add(addr)
                self.builder.marker(self.record, t_ns, f"out of memory: a request of {size_bytes:,} bytes")
                return {"oom": text}
            # sent without a question (the child's budget said it fits, or it was held back for the
            # in-place check): it stays in the trace, where replaying it on the card shows it
            self.unraised_ooms += 1
        size_bytes = request_size(size_bytes)
        table_stack = self.stacks.get(child_stack, (-1, []))[0]
        index = self.builder.next_event_index
        if self.builder.alloc(self.record, t_ns, 0, stream, addr, size_bytes, stack_id=table_stack) != alloc_id:
            raise Refused("the trace's allocation ids went out of step")
        self.live[addr] = alloc_id
        self.alloc_event.append(index)
        self.alloc_stack.append(child_stack)
        self.alloc_phase.append(ord(phase))
        self.alloc_category.append(0)
        self.alloc_freed.append(-1)
        self.fingerprint.update(b"A%d,%d;" % (size_bytes, stream))
        return {"ok": model.headroom()} if asked else None

    # ----------------------------------------------------------------- categories
    def _category_of(self, alloc_id: int) -> str:
        code = self.alloc_category[alloc_id]
        if code:
            return CATEGORIES[code - 1]
        # freed before the next request: it lived within the operator that made it
        freed_at = self.alloc_freed[alloc_id]
        next_index = self.alloc_event[alloc_id + 1] if alloc_id + 1 < self.n_allocs else None
        if freed_at >= 0 and (next_index is None or freed_at < next_index):
            return "temporary"
        return {ord("b"): "autograd_detail", ord("o"): "temporary"}.get(self.alloc_phase[alloc_id], "activation")

    def categorized_stacks(self) -> None:
        """Give every allocation a stack whose outermost frame names its category (``category: parameter``)."""
        restacked: dict[tuple[int, str], int] = {}
        for alloc_id in range(self.n_allocs):
            child_stack = self.alloc_stack[alloc_id]
            category = self._category_of(alloc_id)
            key = (child_stack, category)
            new_id = restacked.get(key)
            if new_id is None:
                frames = list(self.stacks.get(child_stack, (-1, []))[1])
                frames.append({"filename": CAPTURE_FILE, "line": 0, "name": CAPTURE_PREFIX + category})
                new_id = restacked[key] = self.frames.stack_id(frames, f"stack {child_stack} {category}")
            self.builder.set_stack_id(self.alloc_event[alloc_id], new_id)

    def finish(self, status: int, message: str, seconds: float) -> Any:
        """The ``Trace`` of everything received."""
        self.categorized_stacks()
        meta = self.builder.meta
        summary = self.summary
        script = self.header.get("script") or summary.get("script") or []
        script = [str(part) for part in script] if isinstance(script, list) else []
        meta.source = ("python -c" if script[:1] == ["-c"] else
                       os.path.basename(script[1] if script[:1] == ["-m"] and len(script) > 1 else
                                        (script[0] if script else "script")))
        torch_version = _of_type(summary.get("torch"), str) or _of_type(self.header.get("torch"), str) or ""
        # each hint has the type its readers expect, whatever the child's summary said
        meta.version_hints.update({
            "torch": torch_version, "capture": "cuda on meta",
            "optimizer_steps": self.steps,
            "cudnn_workspace_ratios": _of_type(summary.get("cudnn_workspace_ratios"), dict) or {},
            "cublas_workspaces": "in trace",
            "cublas_workspace_bytes": _of_type(summary.get("cublas_workspace_bytes"), int),
            "gpu": dict(self.gpu), "categories": "capture",
            "autocast": _of_type(summary.get("autocast"), dict) or {},
            "cudnn_flags": {k: v for k, v in (_of_type(summary.get("cudnn_flags"), dict) or {}).items()
                            if k in ("benchmark", "allow_tf32") and isinstance(v, bool)},
        })
        if self.model.capacity_bytes is not None:
            meta.version_hints["out_of_memory_errors"] = len(self.ooms)
        if self.facts.rank is not None:        # one rank of a distributed job
            meta.version_hints["distributed"] = {"rank": self.facts.rank, "world_size": self.facts.world_size,
                                                 "backend": self.facts.backend}
        ratios = summary.get("cudnn_workspace_ratios")
        ratios = ratios if isinstance(ratios, dict) else {}
        cublas_bytes = summary.get("cublas_workspace_bytes")
        meta.notes.append(
            f"allocsim capture of `{' '.join(script)[:1000]}` with torch {torch_version or '?'}: cuda mapped to the "
            "meta device; requests are the storages ATen operators create, frees are their release; cuBLAS "
            f"workspaces ({cublas_bytes if isinstance(cublas_bytes, int) else 0:,} B per handle and stream) and cuDNN "
            f"convolution workspaces ({summary.get('cudnn_workspaces', 0)} requests, ratios "
            f"{ratios.get('kernel', '?')}, {ratios.get('pointwise_data', '?')}) are requests in the trace")
        meta.notes.extend(self.notes)      # each fact once, however often it was met
        if self.model.note:
            meta.notes.append(self.model.note)
        if self.ooms:
            meta.notes.append(f"{len(self.ooms)} CUDA out-of-memory error(s) raised in the script, as the card would "
                              f"(markers 'out of memory: ...' in the trace); the first: {self.ooms[0][:300]}")
        if self.unraised_ooms:
            meta.notes.append(f"{self.unraised_ooms} request(s) the modelled card could not serve reached it where the "
                              "capture could not raise the error (held back for the in-place check); they are in the "
                              "trace, and replaying it on the card shows where")
        if status != EXIT_OK:
            meta.notes.append(f"incomplete: {message}")
            steps = self.steps
            meta.incomplete = short_reason(f"{message or f'the capture ended with status {status}'}; "
                                           f"{steps} optimizer step{'' if steps == 1 else 's'} recorded")
        trace = self.builder.finish()
        tables = self.frames.tables()
        trace.frames = frame_from_columns(tables["frames"], FRAME_DTYPES)
        trace.stacks = frame_from_columns(tables["stacks"], STACK_DTYPES)
        return trace


def check_script(command: list[str]) -> None:
    """Refuse (ValueError, one line) a command whose script cannot be run: a missing file, an option Python has not."""
    problem = script_problem(script_of(command))
    if problem:
        raise ValueError(problem)


def _of_type(value: Any, kind: type) -> Any:
    """``value`` when it is a ``kind`` (an ``int`` that is not a ``bool``), else None."""
    return value if type(value) is kind else None


class _Signals:
    """Counts SIGINTs (the child gets Ctrl-C from the terminal itself) and SIGTERMs while the child runs.

    Handlers are installed in the main thread only (``fit`` captures from worker threads: there the
    caller's own handling stays).
    """

    def __init__(self) -> None:
        self.interrupts = 0
        self.terminations = 0
        self.first_at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        def on_interrupt(_signum: int, _frame: Any) -> None:
            self.interrupts += 1
            if self.interrupts == 1:
                self.first_at = time.monotonic()

        def on_terminate(_signum: int, _frame: Any) -> None:
            self.terminations += 1

        for signum, handler in ((signal.SIGINT, on_interrupt), (signal.SIGTERM, on_terminate)):
            try:
                self._previous[signum] = signal.signal(signum, handler)
            except ValueError:           # not the main thread: leave the signals alone
                break
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


class _Answers:
    """Answers to the child's questions, written without ever blocking this process (the child may not read them)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pending = bytearray()
        self.overflow = False

    def put(self, answer: Any) -> None:
        self.pending += json.dumps(answer, separators=(",", ":")).encode("ascii") + b"\n"
        if len(self.pending) > MAX_PENDING_ANSWER_BYTES:
            self.overflow = True
        self.write()

    def write(self) -> None:
        while self.pending:
            try:
                written = os.write(self.fd, self.pending)
            except BlockingIOError:
                return
            except OSError:                # the child closed its end: nobody reads answers any more
                self.pending.clear()
                return
            del self.pending[:written]


def _outside_reports(folder: str) -> list[str]:
    """What processes the script started said of their CUDA use (``outside/sitecustomize.py``): ``pid N: command``."""
    try:
        with os.scandir(folder) as entries:       # the script can reach the folder: read a bounded part of it
            names = sorted(itertools.islice((e.name for e in entries if _REPORT.fullmatch(e.name)),
                                            MAX_OUTSIDE_REPORTS))
    except OSError:
        return []
    reports = []
    for name in names:
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                command = fh.read(1000).decode("utf-8", "replace")
        except OSError:
            command = "?"
        reports.append(f"pid {name[5:-4]}: {command}")
    return reports


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _ending(code: int, converter: _Converter, stopped: tuple[int, str] | None) -> tuple[int, str]:
    """The capture's status and why, from this process's own observations first (module doc)."""
    summary = converter.summary
    claimed = summary.get("exit")
    said = str(summary.get("status") or "")
    if converter.refused:
        return EXIT_REFUSED, f"the capture could not take what the script sent ({converter.refused})"
    if stopped is not None:
        return stopped
    if code < 0:
        return EXIT_SCRIPT_FAILED, (f"the script's process was {_exit_text(code)}"
                                    + (f" ({converter.ended})" if converter.ended else ""))
    if not summary:
        return EXIT_SCRIPT_FAILED, (converter.ended or
                                    f"the script's process ended ({_exit_text(code)}) before the capture finished")
    if code == 0:
        if said == "ok" and claimed in (0, None):
            return EXIT_OK, ""
        return EXIT_SCRIPT_FAILED, said if said != "ok" else f"the capture's summary claims exit status {claimed}"
    if code == EXIT_REFUSED and claimed == EXIT_REFUSED:
        return EXIT_REFUSED, said
    if claimed != code:
        return EXIT_SCRIPT_FAILED, f"the script's process ended with {_exit_text(code)} after the capture's summary"
    if code == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED, said
    return EXIT_SCRIPT_FAILED, said or _exit_text(code)


def capture(command: list[str], out_path: str, *, steps: int = 0, gpu: dict[str, Any] | None = None,
            memory_bytes: int | None = None, timeout_s: float | None = None, write: bool = True,
            stdout: Any = None, stderr: Any = None, keep_writes: str | None = None,
            env_extra: dict[str, str] | None = None,
            distributed: dict[str, Any] | None = None, relay: Any = None) -> tuple[CaptureResult, Any]:
    """Run ``command`` (``[python, script, args...]``) under the capture; return the result and the ``Trace``.

    ``out_path`` is written (Parquet, or CSV for ``.csv``) unless ``write`` is False; the trace is
    None when the child could not start (no torch in that interpreter). ``gpu``: the card
    ``torch.cuda`` reports; ``memory_bytes``: its memory for tensors (``gpus.allocator_capacity``),
    beyond which the script gets ``torch.cuda.OutOfMemoryError`` (None: no limit). ``stdout`` /
    ``stderr``: where the script's output goes (a file object or descriptor, as ``subprocess.Popen``
    takes them; None: this process's own). The script's own writes go to a scratch folder
    (``scratch``), deleted at the end unless ``keep_writes`` names a new folder for them.
    ``env_extra``: variables the script gets beside this process's (a launcher's ``RANK``,
    ``WORLD_SIZE``...); ``distributed``: the rank's settings for the child
    (``allocsim.torch_capture.distributed.rank``). The summary carries the job's ``facts`` and the
    request stream's ``fingerprint``. ``relay``: the pipeline messages this capture shares with the
    job's others running at the same time (``distributed.relay.Relay``).
    """
    from .scratch import scratch_folder  # noqa: PLC0415

    secret = secrets.token_hex(16).encode("ascii")
    total_bytes = int((gpu or {}).get("total_bytes") or 0) or memory_bytes
    converter = _Converter(out_path, _AllocatorModel(memory_bytes, total_bytes), relay)
    converter.gpu = dict(gpu or {})
    folder = scratch_folder(keep_writes)
    outside_dir = tempfile.mkdtemp(prefix="allocsim-capture-")
    tail_file = tempfile.TemporaryFile(prefix="allocsim-capture-")
    try:
        tail_file.truncate(TAIL_BYTES)
        tail = mmap.mmap(tail_file.fileno(), TAIL_BYTES, access=mmap.ACCESS_READ)
        return _run(command, out_path, converter, secret, tail, tail_file.fileno(), outside_dir, steps=steps,
                    gpu=gpu, memory_bytes=memory_bytes, timeout_s=timeout_s, write=write, stdout=stdout,
                    stderr=stderr, folder=folder, keep_writes=keep_writes, env_extra=env_extra,
                    distributed=distributed)
    finally:
        tail_file.close()
        shutil.rmtree(outside_dir, ignore_errors=True)
        if keep_writes is None:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _running(relay: Any, converter: _Converter) -> Iterator[None]:
    """The capture counts as running for the job's relay while its child runs (``distributed.relay``)."""
    if relay is None:
        yield
        return
    relay.started()
    try:
        yield
    finally:
        relay.finished(id(converter))


def _run(command: list[str], out_path: str, converter: _Converter, secret: bytes, tail: Any, tail_fd: int,
         outside_dir: str, *, steps: int, gpu: dict[str, Any] | None, memory_bytes: int | None,
         timeout_s: float | None, write: bool, stdout: Any, stderr: Any, folder: str, keep_writes: str | None,
         env_extra: dict[str, str] | None, distributed: dict[str, Any] | None) -> tuple[CaptureResult, Any]:
    from .scratch import ScriptWrites  # noqa: PLC0415

    events_r, events_w = os.pipe()
    answers_r, answers_w = os.pipe()
    os.write(answers_w, secret + b"\n")            # the child's first read; the pipe is empty, this never blocks
    os.set_blocking(answers_w, False)
    env = dict(os.environ)                          # the user's own PYTHONPATH, untouched (see ``bootstrap``)
    env.update(env_extra or {})
    env[ENV_FDS] = f"{events_w},{answers_r},{tail_fd}"
    env[ENV_CONFIG] = json.dumps({"steps": int(steps), "gpu": gpu or {}, "memory_bytes": memory_bytes,
                                  "outside_dir": outside_dir, "hooks_dir": HOOKS_DIR, "scratch": folder,
                                  "distributed": distributed or {}})
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(child_command(command), env=env, pass_fds=(events_w, answers_r, tail_fd),
                                stdout=stdout, stderr=stderr)
    except (OSError, ValueError) as exc:
        for fd in (events_r, events_w, answers_r, answers_w):
            os.close(fd)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return CaptureResult(EXIT_CANNOT_START, None, {}, 0.0, f"cannot start {command[0]!r}: {why}"), None
    os.close(events_w)
    os.close(answers_r)
    reader = FrameReader(secret)
    answers = _Answers(answers_w)
    stopped: tuple[int, str] | None = None          # (status, why) once this process decided to stop the script
    signalled_at = 0.0
    forwarded = killed = eof = False
    code: int | None = None
    with _Signals() as signals, _running(converter.relay, converter):
        while True:
            now = time.monotonic()
            code = proc.poll()
            alive = code is None
            if stopped is None:
                if converter.refused or reader.damaged or answers.overflow:
                    why = (converter.refused and f"the capture could not take what the script sent ({converter.refused})"
                           or reader.damaged and f"the capture's channel was damaged: {reader.damaged}"
                           or "the script asked the capture questions without reading the answers")
                    stopped, signalled_at, forwarded = (EXIT_REFUSED, why), now, True
                    if alive:
                        proc.kill()
                        killed = True
                elif timeout_s is not None and now - t0 > timeout_s:
                    stopped, signalled_at, forwarded = (EXIT_TIMEOUT, f"stopped after --timeout {timeout_s:g} s"), now, True
                    if alive:
                        proc.send_signal(signal.SIGINT)
                elif signals.terminations:
                    stopped, signalled_at, forwarded = (EXIT_TERMINATED, "terminated (SIGTERM)"), now, True
                    if alive:
                        proc.send_signal(signal.SIGTERM)
                elif signals.interrupts:
                    stopped, signalled_at = (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"), signals.first_at
            if stopped is not None and alive and not killed:
                # Ctrl-C in a terminal reaches the script too; a SIGINT sent to allocsim alone is passed on
                if not forwarded and now - signalled_at > 2.0:
                    proc.send_signal(signal.SIGINT)
                    forwarded = True
                if now - signalled_at > GRACE_S or signals.interrupts > 1 or signals.terminations > 1:
                    proc.kill()
                    killed = True
                    stopped = (stopped[0], stopped[1] + "; the script did not stop and was killed")
            try:
                ready, writable, _ = select.select([] if eof else [events_r], [answers_w] if answers.pending else [],
                                                   [], 0.25 if alive else 0)
            except InterruptedError:
                continue
            if writable:
                answers.write()
            if ready:
                chunk = os.read(events_r, 1 << 20)
                if not chunk:
                    eof = True
                for line in reader.feed(chunk):
                    answer = converter.feed(line)
                    if answer is not None:
                        answers.put(answer)
                continue
            if not alive:        # ended, and nothing more to read (a forked worker may still hold the pipe open)
                break
        code = proc.wait()
    os.close(events_r)
    os.close(answers_w)
    seconds = time.monotonic() - t0
    if not converter.summary and not converter.refused and not answers.overflow:
        # the child died before it wrote its last frame: its unsent records are in the tail
        lines, problem = reader.tail(tail)
        for line in lines:
            converter.feed(line)
        if problem:
            converter.notes[problem] = None
    summary = converter.summary
    if summary.get("status") == "no torch":
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds,
                             f"{command[0]!r} cannot import torch ({summary.get('error', '')}); install PyTorch "
                             "for that interpreter (the CPU build is enough) or name one that has it"), None
    if summary.get("status") == "bad settings":
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds, str(summary.get("error"))), None
    if not summary and not converter.record and stopped is None:
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds,
                             f"the capture child exited with {code} before recording anything "
                             f"(is {command[0]!r} a Python interpreter with torch?)"), None
    status, reason = _ending(code, converter, stopped)
    outside = _outside_reports(outside_dir)
    if outside:
        why = (f"{len(outside)} process(es) the script started ran CUDA work, which the capture does not follow "
               f"(it records the script's own process): {'; '.join(outside[:3])[:600]}")
        status, reason = (EXIT_REFUSED, why) if status == EXIT_OK else (status, f"{reason}; {why}")
    trace = converter.finish(status, reason, seconds)
    try:
        writes = ScriptWrites.read(converter.writes, folder, keep_writes is not None)
    except Exception:  # noqa: BLE001 - the child's account is untrusted: the folder's own files say it instead
        writes = ScriptWrites.read(None, folder, keep_writes is not None)
    writes_line = "" if writes.empty else writes.line(os.getcwd())
    if writes_line:
        trace.meta.notes.append(writes_line)
        trace.meta.version_hints["script_writes"] = writes.to_dict()
    written, moved = None, ""
    if write:
        from .trace_file import write_capture  # noqa: PLC0415

        written, moved = write_capture(trace, out_path)
    model = converter.model
    summary = dict(summary, allocs=model.n_allocs, peak_allocated_bytes=model.peak_allocated,
                   peak_reserved_bytes=model.peak_reserved, optimizer_steps=converter.steps,
                   out_of_memory_errors=len(converter.ooms), torch=summary.get("torch") or converter.header.get("torch"),
                   writes=writes.to_dict(), facts=converter.facts.to_dict(), groups=converter.facts.groups,
                   messages=converter.facts.messages, fingerprint=converter.fingerprint.hexdigest())
    return CaptureResult(status, written, summary, seconds, reason, moved, writes_line), trace
