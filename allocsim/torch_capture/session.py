"""Capture a script's CUDA allocations in a child process and write the trace: ``capture(command, out_path)``.

The child (``allocsim.torch_capture.child``) runs in the user's interpreter with torch and the
standard library only, and streams its records over a private pipe; this side, with allocsim's
dependencies, turns them into a ``Trace`` as they come, answers the script's questions about the
caching allocator (``torch.cuda.memory_reserved()``...) from a model of it fed with the same
requests (``PYTORCH_CUDA_ALLOC_CONF`` applies), names each allocation's category, and writes the
trace at the end, also when the script raised, was interrupted or ran past ``timeout_s`` (then
with what it recorded up to there, and a note saying so). The script's stdout and stderr pass
through untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

from ..metrics.categories import CAPTURE_FILE, CAPTURE_PREFIX, CATEGORIES
from ..policies.base import Policy
from ..trace.inference.completeness import short_reason
from ..trace.reading.builder import TraceBuilder
from ..trace.reading.frames import FrameTable
from ..trace.schema import FRAME_DTYPES, STACK_DTYPES, frame_from_columns
from . import FORMAT
from .channel import ENV_CONFIG, ENV_FDS
from .distributed.relay import QUESTION as RELAY_QUESTION
from .distributed.roles import JobFacts

EXIT_OK, EXIT_CANNOT_START, EXIT_SCRIPT_FAILED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 2, 3, 124, 130
#: Seconds the script gets to end after SIGINT (Ctrl-C, --timeout) before it is killed.
GRACE_S = 10.0


@dataclasses.dataclass
class CaptureResult:
    """How a capture ended and what it wrote."""

    status: int                          # EXIT_OK, EXIT_SCRIPT_FAILED, EXIT_TIMEOUT, EXIT_INTERRUPTED, EXIT_CANNOT_START
    trace_path: str | None               # None: nothing was written
    summary: dict[str, Any]
    seconds: float
    message: str = ""                    # why the trace is incomplete or was not written
    writes_line: str = ""                # where the script's writes went instead ("" when it wrote nothing)


class _AllocatorModel:
    """PyTorch's caching allocator fed with the capture's requests: what ``torch.cuda.memory_*`` would say."""

    def __init__(self) -> None:
        self.note = ""
        self.policy = self._build()
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.n_allocs = 0

    def _build(self) -> Policy | None:
        from ..device import SimulatedDevice  # noqa: PLC0415
        from ..policies.registry import build_policy  # noqa: PLC0415
        from ..settings.alloc_conf import env_alloc_conf  # noqa: PLC0415

        try:
            conf = env_alloc_conf()
            name, params = (conf.policy, conf.params) if conf is not None else ("pytorch", {})
            return build_policy(name, device=SimulatedDevice(None), params=params)
        except ValueError as exc:
            self.note = f"torch.cuda.memory_* answered with PyTorch's default allocator settings: {exc}"
            return build_policy("pytorch", device=SimulatedDevice(None))

    def malloc(self, alloc_id: int, size_bytes: int, stream: int) -> None:
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
    """The child's messages, as they come, into a ``TraceBuilder`` and the allocator model."""

    def __init__(self, out_path: str, relay: Any = None):
        self.relay = relay              # pipeline messages shared with the job's other captures (relay.Relay)
        self.builder = TraceBuilder(out_path, FORMAT)
        self.frames = FrameTable(out_path)
        self.model = _AllocatorModel()
        self.record = 0
        self.stacks: dict[int, tuple[int, list[dict[str, Any]]]] = {}   # child's id -> (table id, frames)
        self.live: dict[int, int] = {}                 # addr -> alloc_id
        self.allocs: list[list[Any]] = []              # per alloc_id: [event index, stack, phase, category, freed_at]
        self.summary: dict[str, Any] = {}
        self.notes: list[str] = []
        self.bad_lines = 0
        self.first_bad = ""
        self.facts = JobFacts()
        # the request stream without times or addresses: equal for ranks that do the same work
        self.fingerprint = hashlib.blake2b(digest_size=16)

    def handle(self, message: list[Any]) -> Any:
        """Apply one message; return the answer to send back for a question (else None)."""
        kind = message[0]
        self.record += 1
        builder = self.builder
        if kind == "A":
            _, t_ns, addr, size_bytes, stream, child_stack, phase = message
            table_stack = self.stacks.get(child_stack, (-1, []))[0]
            index = builder.next_event_index
            alloc_id = builder.alloc(self.record, int(t_ns), 0, int(stream), int(addr), int(size_bytes),
                                     stack_id=table_stack)
            self.live[int(addr)] = alloc_id
            self.allocs.append([index, child_stack, phase, None, None])
            self.model.malloc(alloc_id, int(size_bytes), int(stream))
            self.fingerprint.update(b"A%d,%d;" % (int(size_bytes), int(stream)))
        elif kind == "F":
            _, t_ns, addr, stream = message
            alloc_id = self.live.pop(int(addr), None)
            builder.free(self.record, int(t_ns), 0, int(stream), int(addr))
            if alloc_id is not None:
                self.allocs[alloc_id][4] = builder.next_event_index - 1
                self.model.free(alloc_id)
                self.fingerprint.update(b"F%d;" % alloc_id)
        elif kind == "P":             # freed while other streams recorded uses: reusable at its "K"
            _, t_ns, addr, stream = message
            alloc_id = self.live.get(int(addr))
            builder.free_requested(self.record, int(t_ns), 0, int(stream), int(addr))
            if alloc_id is not None:
                self.allocs[alloc_id][4] = builder.next_event_index - 1
                self.model.free_requested(alloc_id)
                self.fingerprint.update(b"P%d;" % alloc_id)
        elif kind == "K":
            _, t_ns, addr, stream = message
            alloc_id = self.live.pop(int(addr), None)
            builder.free_completed(self.record, int(t_ns), 0, int(stream), int(addr))
            if alloc_id is not None:
                self.model.free_completed(alloc_id)
                self.fingerprint.update(b"K%d;" % alloc_id)
        elif kind == "S":
            _, child_stack, frames = message
            dicts = [{"filename": str(f), "line": int(line), "name": str(name)} for f, line, name in frames]
            self.stacks[int(child_stack)] = (self.frames.stack_id(dicts, f"stack {child_stack}"), dicts)
        elif kind == "C":
            _, addr, category = message
            alloc_id = self.live.get(int(addr))
            if alloc_id is not None and category in CATEGORIES:
                self.allocs[alloc_id][3] = category
        elif kind == "M":
            _, t_ns, label = message
            builder.marker(self.record, int(t_ns), str(label))
        elif kind == "E":
            builder.empty_cache(self.record, int(message[1]), 0)
            self.model.policy.empty_cache()
        elif kind == "N":
            self.notes.append(str(message[1]))
        elif kind == "Q":
            name = str(message[1])
            if self.relay is not None and name.startswith(RELAY_QUESTION):
                return self.relay.answer(name, id(self))
            return self.model.answer(name)
        elif kind == "X":
            kept = len(self.facts.messages)
            self.facts.add(message[1])
            if self.relay is not None and len(self.facts.messages) > kept:
                m = self.facts.messages[-1]
                self.relay.put(m["src_stage"], m["dst_stage"], m["payload"])
        elif kind == "D":
            self.summary = dict(message[1])
        return None

    def feed_line(self, line: bytes) -> Any:
        try:
            message = json.loads(line)
            if not isinstance(message, list) or not message:
                raise ValueError("not a message")
            return self.handle(message)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            self.bad_lines += 1
            if not self.first_bad:
                self.first_bad = f"{type(exc).__name__}: {exc}"[:200]
            return None

    # ----------------------------------------------------------------- categories
    def _category_of(self, alloc_id: int) -> str:
        index, _stack, phase, category, freed_at = self.allocs[alloc_id]
        if category:
            return category
        # freed before the next request: it lived within the operator that made it
        next_index = self.allocs[alloc_id + 1][0] if alloc_id + 1 < len(self.allocs) else None
        if freed_at is not None and (next_index is None or freed_at < next_index):
            return "temporary"
        return {"b": "autograd_detail", "o": "temporary"}.get(phase, "activation")

    def categorized_stacks(self) -> None:
        """Give every allocation a stack whose outermost frame names its category (``category: parameter``)."""
        restacked: dict[tuple[int, str], int] = {}
        for alloc_id, (index, child_stack, _phase, _category, _freed) in enumerate(self.allocs):
            category = self._category_of(alloc_id)
            key = (child_stack, category)
            new_id = restacked.get(key)
            if new_id is None:
                frames = list(self.stacks.get(child_stack, (-1, []))[1])
                frames.append({"filename": CAPTURE_FILE, "line": 0, "name": CAPTURE_PREFIX + category})
                new_id = restacked[key] = self.frames.stack_id(frames, f"stack {child_stack} {category}")
            self.builder.set_stack_id(index, new_id)

    def finish(self, status: int, message: str, seconds: float) -> Any:
        """The ``Trace`` of everything received."""
        self.categorized_stacks()
        meta = self.builder.meta
        summary = self.summary
        script = summary.get("script") or []
        meta.source = os.path.basename(script[1] if script[:1] == ["-m"] and len(script) > 1 else
                                       (script[0] if script else "script"))
        meta.version_hints.update({
            "torch": summary.get("torch", ""), "capture": "cuda on meta",
            "optimizer_steps": summary.get("optimizer_steps", 0),
            "cudnn_workspace_ratios": summary.get("cudnn_workspace_ratios", {}),
            "cublas_workspaces": "in trace", "cublas_workspace_bytes": summary.get("cublas_workspace_bytes"),
            "gpu": summary.get("gpu", {}), "categories": "capture",
            "autocast": summary.get("autocast", {}),
        })
        if self.facts.rank is not None:        # one rank of a distributed job
            meta.version_hints["distributed"] = {"rank": self.facts.rank, "world_size": self.facts.world_size,
                                                 "backend": self.facts.backend}
        ratios = summary.get("cudnn_workspace_ratios") or {}
        meta.notes.append(
            f"allocsim capture of `{' '.join(script)}` with torch {summary.get('torch', '?')}: cuda mapped to the "
            "meta device; requests are the storages ATen operators create, frees are their release; cuBLAS "
            f"workspaces ({summary.get('cublas_workspace_bytes', 0):,} B per handle and stream) and cuDNN "
            f"convolution workspaces ({summary.get('cudnn_workspaces', 0)} requests, ratios "
            f"{ratios.get('kernel', '?')}, {ratios.get('pointwise_data', '?')}) are requests in the trace")
        meta.notes.extend(dict.fromkeys(self.notes))      # each fact once, however often it was met
        if self.model.note:
            meta.notes.append(self.model.note)
        if self.bad_lines:
            meta.notes.append(f"{self.bad_lines} unreadable records from the capture were skipped "
                              f"(first: {self.first_bad})")
        if status != EXIT_OK:
            meta.notes.append(f"incomplete: {message}")
            steps = summary.get("optimizer_steps", 0)
            meta.incomplete = short_reason(f"{message or f'the capture ended with status {status}'}; "
                                           f"{steps} optimizer step{'' if steps == 1 else 's'} recorded")
        trace = self.builder.finish()
        tables = self.frames.tables()
        trace.frames = frame_from_columns(tables["frames"], FRAME_DTYPES)
        trace.stacks = frame_from_columns(tables["stacks"], STACK_DTYPES)
        return trace


def child_command(command: list[str]) -> list[str]:
    """The child's command line: the user's interpreter running ``allocsim.torch_capture.child``."""
    python, script = command[0], command[1:]
    if python.endswith(".py"):           # `-- train.py ARGS`: this interpreter runs it
        python, script = sys.executable, command
    return [python, "-m", "allocsim.torch_capture.child", "--", *script]


def check_script(command: list[str]) -> None:
    """Refuse (ValueError, one line) a command whose script cannot be run: a missing file, an interpreter option."""
    script = child_command(command)[4:]
    if not script:
        raise ValueError("give the script after the interpreter, e.g. python train.py")
    first = script[0]
    if first in ("-m", "-c"):
        if len(script) < 2:
            raise ValueError(f"python {first} needs {'a module' if first == '-m' else 'a command'} after it")
        return
    if first.startswith("-"):
        raise ValueError(f"interpreter option {first!r} before the script is not taken under capture: give the "
                         "script (or -m MODULE, or -c CODE) right after the interpreter; for -u, -W, -X use "
                         "PYTHONUNBUFFERED, PYTHONWARNINGS, PYTHONDEVMODE... in the environment")
    if not os.path.isfile(first):
        raise ValueError(f"no script {first!r}")


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Interrupts:
    """Counts SIGINTs while the child runs (the child gets Ctrl-C from the terminal itself)."""

    def __init__(self) -> None:
        self.count = 0
        self.first_at = 0.0
        self._previous: Any = None

    def __enter__(self) -> "_Interrupts":
        def handler(_signum: int, _frame: Any) -> None:
            self.count += 1
            if self.count == 1:
                self.first_at = time.monotonic()
        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:               # not the main thread: leave SIGINT alone
            self._previous = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def capture(command: list[str], out_path: str, *, steps: int = 0, gpu: dict[str, Any] | None = None,
            timeout_s: float | None = None, write: bool = True, stdout: Any = None,
            stderr: Any = None, keep_writes: str | None = None, env_extra: dict[str, str] | None = None,
            distributed: dict[str, Any] | None = None, relay: Any = None) -> tuple[CaptureResult, Any]:
    """Run ``command`` (``[python, script, args...]``) under the capture; return the result and the ``Trace``.

    ``out_path`` is written (Parquet, or CSV for ``.csv``) unless ``write`` is False; the trace is
    None when the child could not start (no torch in that interpreter). ``stdout`` / ``stderr``: where
    the script's output goes (a file object or descriptor, as ``subprocess.Popen`` takes them; None:
    this process's own). The script's own writes go to a scratch folder (``scratch``), deleted at
    the end unless ``keep_writes`` names a new folder for them. ``env_extra``: variables the script
    gets beside this process's (a launcher's ``RANK``, ``WORLD_SIZE``...); ``distributed``: the
    rank's settings for the child (``allocsim.torch_capture.distributed.rank``). The summary carries
    the job's ``facts`` and the request stream's ``fingerprint``. ``relay``: the pipeline messages this
    capture shares with the job's others running at the same time (``distributed.relay.Relay``).
    """
    from .scratch import scratch_folder  # noqa: PLC0415

    folder = scratch_folder(keep_writes)
    try:
        return _capture(command, out_path, steps, gpu, timeout_s, write, stdout, stderr, folder, keep_writes,
                        env_extra, distributed, relay)
    finally:
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


def _capture(command: list[str], out_path: str, steps: int, gpu: dict[str, Any] | None, timeout_s: float | None,
             write: bool, stdout: Any, stderr: Any, folder: str, keep_writes: str | None,
             env_extra: dict[str, str] | None = None,
             distributed: dict[str, Any] | None = None, relay: Any = None) -> tuple[CaptureResult, Any]:
    from ..trace import write_trace  # noqa: PLC0415
    from .scratch import ScriptWrites  # noqa: PLC0415

    events_r, events_w = os.pipe()
    answers_r, answers_w = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
    env[ENV_FDS] = f"{events_w},{answers_r}"
    env.update(env_extra or {})
    env[ENV_CONFIG] = json.dumps({"steps": int(steps), "gpu": gpu or {}, "scratch": folder,
                                  "distributed": distributed or {}})
    converter = _Converter(out_path, relay)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(child_command(command), env=env, pass_fds=(events_w, answers_r), stdout=stdout,
                                stderr=stderr)
    except OSError as exc:
        for fd in (events_r, events_w, answers_r, answers_w):
            os.close(fd)
        return CaptureResult(EXIT_CANNOT_START, None, {}, 0.0, f"cannot start {command[0]!r}: {exc.strerror or exc}"), None
    os.close(events_w)
    os.close(answers_r)
    reason = ""
    signalled_at = 0.0
    forwarded = False
    with _Interrupts() as interrupts, _running(relay, converter):
        pending = b""
        while True:
            now = time.monotonic()
            alive = proc.poll() is None
            if timeout_s is not None and not reason and now - t0 > timeout_s:
                reason, signalled_at, forwarded = f"stopped after --timeout {timeout_s:g} s", now, True
                if alive:
                    proc.send_signal(signal.SIGINT)
            if interrupts.count and not reason:
                reason, signalled_at = "interrupted (Ctrl-C)", interrupts.first_at
            # Ctrl-C in a terminal reaches the script too; a SIGINT sent to allocsim alone is passed on
            if reason and not forwarded and alive and now - signalled_at > 2.0:
                proc.send_signal(signal.SIGINT)
                forwarded = True
            if reason and alive and (now - signalled_at > GRACE_S or interrupts.count > 1):
                proc.kill()
                reason += "; the script did not stop and was killed"
            try:
                ready, _, _ = select.select([events_r], [], [], 0.5)
            except InterruptedError:
                continue
            if not ready:
                if not alive:                # ended; a forked worker may still hold the pipe open
                    break
                continue
            chunk = os.read(events_r, 1 << 20)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                answer = converter.feed_line(line)
                if line.startswith(b'["Q"'):
                    try:
                        os.write(answers_w, json.dumps(answer).encode("ascii") + b"\n")
                    except OSError:
                        pass
        if pending.strip():
            converter.bad_lines += 1
            converter.first_bad = converter.first_bad or "the last record was cut short"
        code = proc.wait()
    os.close(events_r)
    os.close(answers_w)
    seconds = time.monotonic() - t0
    summary = converter.summary
    if summary.get("status") == "no torch":
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds,
                             f"{command[0]!r} cannot import torch ({summary.get('error', '')}); install PyTorch "
                             "for that interpreter (the CPU build is enough) or name one that has it"), None
    if summary.get("status") == "bad settings":
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds, str(summary.get("error"))), None
    if not summary and not converter.record:
        return CaptureResult(EXIT_CANNOT_START, None, summary, seconds,
                             f"the capture child exited with {code} before recording anything "
                             f"(is {command[0]!r} a Python interpreter with torch?)"), None
    if reason.startswith("stopped"):
        status = EXIT_TIMEOUT
    elif reason:
        status = EXIT_INTERRUPTED
    elif not summary:
        status, reason = EXIT_SCRIPT_FAILED, f"the script's process ended ({_exit_text(code)}) before the capture finished"
    else:
        status = int(summary.get("exit", code))
        if status != EXIT_OK:
            reason = str(summary.get("status", ""))
    trace = converter.finish(status, reason, seconds)
    writes = ScriptWrites.read(summary.get("writes"), folder, keep_writes is not None)
    writes_line = "" if writes.empty else writes.line(os.getcwd())
    if writes_line:
        trace.meta.notes.append(writes_line)
        trace.meta.version_hints["script_writes"] = writes.to_dict()
    if write:
        write_trace(trace, out_path)
    summary = dict(summary, allocs=converter.model.n_allocs, peak_allocated_bytes=converter.model.peak_allocated,
                   peak_reserved_bytes=converter.model.peak_reserved, writes=writes.to_dict(),
                   facts=converter.facts.to_dict(), groups=converter.facts.groups, messages=converter.facts.messages,
                   fingerprint=converter.fingerprint.hexdigest())
    return CaptureResult(status, out_path if write else None, summary, seconds, reason, writes_line), trace


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
