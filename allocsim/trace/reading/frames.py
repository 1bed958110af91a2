"""Intern stack frames as they are read: ``FrameTable.stack_id(frames)`` gives each distinct stack one id.

A PyTorch snapshot stores a list of ``{filename, line, name}`` frames with every trace entry and
every block, and the pickle shares identical frame dicts and lists through its memo. The table
keeps each distinct frame once and each distinct stack once (a run of frame ids, innermost first),
so a trace of millions of events carries one 4-byte stack id per event.

Lookups are keyed first by object identity (the pickle's sharing makes most lookups one dict
probe), then by content: frame text is hashed as ``str`` (randomised per process), stacks as the
bytes of their frame-id array, so no file can choose keys that collide.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from typing import Any

import numpy as np

from ...errors import TraceFormatError, quote
from .limits import DEFAULT_LIMITS, Limits, LimitExceeded

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_CHUNK = 8192
#: Stacks remembered per (length, three sampled frames): bounds the comparisons per list.
_BUCKET = 8
#: Frame text below this is never refused as out of proportion to the input (as for gzip data).
_TEXT_FLOOR_CHARS = 64 << 20


class FrameTable:
    """Distinct frames and stacks met so far; ``tables()`` returns them as schema columns."""

    def __init__(self, path: str, limits: Limits = DEFAULT_LIMITS, input_bytes: int | None = None):
        self.path = path
        self.limits = limits
        # Frames share strings (one memoised filename for thousands of frames), but every table,
        # copy and report downstream holds each frame's text: it is counted once per distinct frame.
        self.text_chars = 0
        self.max_text_chars = frame_text_cap(limits, input_bytes)
        self._input_bytes = input_bytes
        self._frame_by_obj: dict[int, int] = {}
        self._frame_by_value: dict[tuple[str, int, str], int] = {}
        self._stack_by_obj: dict[int, int] = {}
        self._stack_by_value: dict[bytes, int] = {}
        self._stack_by_ids: dict[tuple[int, ...], int] = {}
        self._child: dict[tuple[int, int], int] = {}
        self._stack_buckets: dict[tuple[int, int, int, int], list[tuple[list, int]]] = {}
        self._keep_alive: list[Any] = []    # ids are only unique while their objects live
        self.filenames: list[str] = []
        self.lines: list[int] = []
        self.names: list[str] = []
        self._stack_frames = array("i")
        self._stack_starts = array("q", [0])

    def __len__(self) -> int:
        return len(self.names)

    @property
    def n_stacks(self) -> int:
        """Number of distinct stacks."""
        return len(self._stack_starts) - 1

    def stack_ids(self, frame_lists: list, record: str) -> list[int]:
        """``stack_id`` of each element of ``frame_lists`` (None or [] for no frames).

        Lists already met are found by identity in one C-level pass. The pickle shares frame dicts,
        so an equal stack is mostly a list of the same objects: each other list is compared (a
        C-level, mostly pointer comparison) with the few stacks seen with its length and three
        sampled frames; only a new stack, or one whose bucket is full, takes the per-frame path.
        """
        by_obj = self._stack_by_obj
        by_obj[id(None)] = -1
        sids = list(map(by_obj.get, map(id, frame_lists)))
        buckets = self._stack_buckets
        stack_id = self.stack_id
        for i in [i for i, sid in enumerate(sids) if sid is None]:
            f = frame_lists[i]
            if type(f) is not list or not f:
                sids[i] = stack_id(f, record)
                continue
            n = len(f)
            key = (n, id(f[n // 3]), id(f[n // 2]), id(f[(2 * n) // 3]))
            seen = buckets.get(key)
            sid = None
            if seen is not None:
                for rep, rep_sid in seen:
                    if rep == f:
                        sid = rep_sid
                        break
            if sid is None:
                sid = stack_id(f, record)
                if seen is None:
                    buckets[key] = [(f, sid)]
                elif len(seen) < _BUCKET:     # a full bucket: later lists go the per-frame way
                    seen.append((f, sid))
            sids[i] = sid
        self._keep_alive.append(frame_lists)
        return sids

    def forget_objects(self) -> None:
        """Drop the identity caches (and the objects they keep alive) once the source is read."""
        self._frame_by_obj.clear()
        self._stack_by_obj.clear()
        self._stack_by_ids.clear()
        self._child.clear()
        self._stack_buckets.clear()
        self._keep_alive.clear()

    def stack_id(self, frames: Any, record: str) -> int:
        """The id of the stack ``frames`` (a list of frame dicts, innermost first); -1 for none."""
        sid = self._stack_by_obj.get(id(frames))
        if sid is not None:
            return sid
        if not frames:
            if frames is None or isinstance(frames, list):
                return -1
        if not isinstance(frames, list):
            raise TraceFormatError(self.path, record, f"'frames' is not a list (got {type(frames).__name__})")
        if len(frames) > self.limits.frames:
            raise LimitExceeded(self.path, record, "frames", self.limits.frames, f"a stack of {len(frames):,} frames")
        # Same frame objects in another list: one lookup (ids of live objects are not file-chosen).
        obj_key = tuple(map(id, frames))
        sid = self._stack_by_ids.get(obj_key)
        if sid is not None:
            self._stack_by_obj[id(frames)] = sid
            self._keep_alive.append(frames)
            return sid
        by_obj = self._frame_by_obj
        ids = array("i", map(by_obj.get, obj_key, repeat(-1)))
        if -1 in ids:
            for i, f in enumerate(frames):
                if ids[i] < 0:
                    ids[i] = self._frame_id(f, record)
        key = ids.tobytes()
        sid = self._stack_by_value.get(key)
        if sid is None:
            sid = self.n_stacks
            self._stack_by_value[key] = sid
            self._stack_frames.extend(ids)
            self._stack_starts.append(len(self._stack_frames))
            if len(self._stack_frames) > self.limits.frames * 8:
                raise LimitExceeded(self.path, record, "frames", self.limits.frames,
                                    f"{len(self._stack_frames):,} frames in distinct stacks")
        self._stack_by_obj[id(frames)] = sid
        self._stack_by_ids[obj_key] = sid
        self._keep_alive.append(frames)
        return sid

    def _frame_id(self, frame: Any, record: str) -> int:
        if not isinstance(frame, dict):
            raise TraceFormatError(self.path, record, f"a frame is not a dict (got {type(frame).__name__})")
        filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
        if not isinstance(filename, str) or not isinstance(name, str):
            raise TraceFormatError(self.path, record, f"frame filename/name is not a string "
                                   f"(got {quote(filename)}, {quote(name)})")
        if type(line) is not int or not _INT64_MIN <= line <= _INT64_MAX:
            raise TraceFormatError(self.path, record, f"frame line is not an integer (got {quote(line)})")
        cap = self.limits.string_chars
        if len(filename) > cap or len(name) > cap:
            raise LimitExceeded(self.path, record, "string_chars", cap,
                                f"a frame string of {max(len(filename), len(name)):,} characters")
        key = (filename, line, name)
        fid = self._frame_by_value.get(key)
        if fid is None:
            fid = len(self.names)
            if fid >= self.limits.frames:
                raise LimitExceeded(self.path, record, "frames", self.limits.frames, "distinct frames")
            self.text_chars += len(filename) + len(name)
            if self.text_chars > self.max_text_chars:
                self._refuse_text(record)
            self._frame_by_value[key] = fid
            self.filenames.append(filename)
            self.lines.append(line)
            self.names.append(name)
        self._frame_by_obj[id(frame)] = fid
        self._keep_alive.append(frame)
        return fid

    def _refuse_text(self, record: str) -> None:
        if self._input_bytes is not None and self.max_text_chars < self.limits.decompressed_bytes:
            raise LimitExceeded(self.path, record, "compression_ratio", self.limits.compression_ratio,
                                f"distinct frames hold over {self.max_text_chars:,} characters of text "
                                f"(shared strings counted once per frame) from {self._input_bytes:,} bytes")
        raise LimitExceeded(self.path, record, "decompressed_bytes", self.limits.decompressed_bytes,
                            f"distinct frames hold over {self.max_text_chars:,} characters of text")

    def child_stack(self, parent: int, frame: dict, record: str) -> int:
        """The stack ``frame`` (innermost) on top of stack ``parent`` (-1: none), interned.

        For sources that build stacks outermost first (enclosing ops in a timeline): each push costs
        one lookup, whatever the depth.
        """
        key = (parent, id(frame))
        sid = self._child.get(key)
        if sid is not None:
            return sid
        fid = self._frame_by_obj.get(id(frame))
        if fid is None:
            fid = self._frame_id(frame, record)
        starts = self._stack_starts
        inner = array("i", [fid])
        if parent >= 0:
            inner.extend(self._stack_frames[starts[parent]:starts[parent + 1]])
        if len(inner) > self.limits.frames:
            raise LimitExceeded(self.path, record, "frames", self.limits.frames, f"a stack of {len(inner):,} frames")
        by_value = inner.tobytes()
        sid = self._stack_by_value.get(by_value)
        if sid is None:
            sid = self.n_stacks
            self._stack_by_value[by_value] = sid
            self._stack_frames.extend(inner)
            starts.append(len(self._stack_frames))
            if len(self._stack_frames) > self.limits.frames * 8:
                raise LimitExceeded(self.path, record, "frames", self.limits.frames,
                                    f"{len(self._stack_frames):,} frames in distinct stacks")
        self._child[key] = sid
        self._keep_alive.append(frame)
        return sid

    def tables(self) -> dict[str, dict[str, Any]]:
        """``{"frames": columns, "stacks": columns}`` in the schema's column names."""
        starts = np.frombuffer(self._stack_starts, dtype=np.int64) if len(self._stack_starts) else np.zeros(1, np.int64)
        frame_ids = np.frombuffer(self._stack_frames, dtype=np.int32) if len(self._stack_frames) else np.empty(0, np.int32)
        return frame_tables(list(self.filenames), np.asarray(self.lines, dtype=np.int64), list(self.names),
                            frame_ids.copy(), starts)


def frame_text_cap(limits: Limits, input_bytes: int | None) -> int:
    """Characters of text all distinct frames may hold together: the decoded-size caps, applied to
    the frames table (``compression_ratio`` times the input, at least 64 MiB)."""
    if input_bytes is None:
        return limits.decompressed_bytes
    return min(limits.decompressed_bytes, max(_TEXT_FLOOR_CHARS, limits.compression_ratio * input_bytes))


def frame_tables(filenames: list[str], lines: np.ndarray, names: list[str], stack_frames: np.ndarray,
                 stack_starts: np.ndarray) -> dict[str, dict[str, Any]]:
    """The frames and stacks tables of interned frames (``stack_starts``: each stack's first row, then the end)."""
    starts = stack_starts if len(stack_starts) else np.zeros(1, np.int64)
    lengths = np.diff(starts)
    stack_ids = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    depth = (np.arange(len(stack_frames), dtype=np.int64) - np.repeat(starts[:-1], lengths)).astype(np.int32)
    return {
        "frames": {"frame_id": np.arange(len(names), dtype=np.int32), "filename": filenames,
                   "line": lines, "name": names},
        "stacks": {"stack_id": stack_ids, "depth": depth, "frame_id": stack_frames},
    }
