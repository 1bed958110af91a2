"""Name each allocation by where it comes from, using the trace's stack frames: ``allocation_sites(trace)``.

A trace's frames are one of two things, told apart by where the trace came from (``frame_origin``):

* ``"code"`` -- real allocation stacks: PyTorch snapshots record the Python (and C++) frames of
  every allocation. The site is the stack, innermost ``MAX_CODE_FRAMES`` frames, with object
  addresses masked (``<built-in method ... at 0x7f..>`` differs from run to run).
* ``"operators"`` -- the Kineto reader's pseudo-frames: the CPU ops, annotations and Python
  functions that enclosed each ``[memory]`` event in time. The site is that chain of ops (e.g.
  ``aten::linear > aten::addmm``), innermost ``MAX_OP_DEPTH`` ops, with the frames of step markers
  (``ProfilerStep#N``) dropped: the step is the unit of alignment already, and their numbers
  differ from step to step.

Pseudo-frames name the enclosing ops, not which *instance* of each: two calls of one op with no
memory event between them look like one call. So a site is a chain of op names, not of op
instances, and allocations from one site are told apart by their order in the step (``keys``).

A site is one string (``site_text``): its hash is computed once and kept, and each site is looked
up once per allocation and candidate step.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.schema import EventKind, Trace
from .steps import STEP_LABEL_RE

#: Only the innermost this-many enclosing ops name an allocation (real chains are ~10 deep).
MAX_OP_DEPTH = 32
#: Only the innermost this-many frames of a real stack name an allocation (a file may hold deeper).
MAX_CODE_FRAMES = 256
#: Formats whose frames are Kineto's pseudo-frames (enclosing ops), not allocation stacks.
OPERATOR_FORMATS = frozenset({"kineto", "paddle"})
#: Object addresses and other per-run hex numbers in frame names and files.
_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]+")
#: Separates frames in a site. A frame name holding one could make two stacks read alike: that only
#: merges their sites (their allocations are then told apart by order), it never breaks anything.
SEPARATOR = "\n"

Frame = tuple  # (filename, line, name)


def frame_origin(trace: Trace) -> str:
    """``"operators"`` (Kineto pseudo-frames), ``"code"`` (real stacks) or ``"none"`` (nothing has frames).

    Any event or start-of-window block with frames counts: a snapshot recorded with Python stacks
    only has none for the allocations of the backward pass (made by the autograd engine's C++
    thread), and a window cut after the forward pass may hold only those -- it still comes from a
    recording with frames, and its frameless allocations form one site of their own.
    """
    has_frames = bool(np.any(trace.column("stack_id") >= 0)) or any(
        bool(np.any(frame["stack_id"].to_numpy() >= 0)) for frame in (trace.initial_allocs, trace.initial_blocks))
    if not has_frames:
        return "none"
    hints = trace.meta.version_hints or {}
    scale_hints = hints.get("scale") if isinstance(hints.get("scale"), dict) else {}
    if scale_hints.get("frames") in ("operators", "code"):
        return scale_hints["frames"]     # a scaled trace keeps the frames of its reference input
    source = hints.get("converted_from", trace.meta.format)
    return "operators" if source in OPERATOR_FORMATS or trace.meta.format in OPERATOR_FORMATS else "code"


def _is_step_frame(frame: Frame) -> bool:
    filename, line, name = frame
    return filename == "" and line == 0 and bool(STEP_LABEL_RE.search(name))


def frame_text(frame: Frame) -> str:
    """One frame as a site shows it: ``aten::addmm`` for an op, ``model.py:54:forward`` for code."""
    filename, line, name = frame
    name = _ADDRESS_RE.sub("0x?", name)
    if filename == "" and line == 0:
        return name
    return f"{_ADDRESS_RE.sub('0x?', filename)}:{line}:{name}"


def _frames_by_stack(trace: Trace, stack_ids: np.ndarray, max_depth: int) -> dict[int, list[Frame]]:
    """The innermost ``max_depth`` frames of each of ``stack_ids``, innermost first, read in one pass.

    (``Trace.stack`` reads one stack at a time; many stacks this way cost one pass over the tables.)
    """
    st = trace.stacks
    sid, depth, fid = (st[c].to_numpy() for c in ("stack_id", "depth", "frame_id"))
    keep = np.isin(sid, stack_ids) & (depth < max_depth)
    sid, depth, fid = sid[keep], depth[keep], fid[keep]
    order = np.lexsort((depth, sid))
    sid, fid = sid[order], fid[order]
    fr = trace.frames
    frame_ids = fr["frame_id"].to_numpy().astype(np.int64)
    row_of = np.full(int(frame_ids.max()) + 1 if len(frame_ids) else 0, -1, dtype=np.int64)
    row_of[frame_ids] = np.arange(len(frame_ids))
    valid = (fid >= 0) & (fid < len(row_of))
    rows = np.full(len(fid), -1, dtype=np.int64)
    rows[valid] = row_of[fid[valid]]
    files = fr["filename"].to_numpy(dtype=object)
    lines = fr["line"].to_numpy()
    names = fr["name"].to_numpy(dtype=object)
    out: dict[int, list[Frame]] = {int(s): [] for s in stack_ids}
    for s, r in zip(sid.tolist(), rows.tolist()):
        if r >= 0:        # a frame id the frames table lacks names nothing
            out[s].append((str(files[r]), int(lines[r]), str(names[r])))
    return out


def site_text(frames: list[Frame], origin: str) -> str:
    """The site of a stack (innermost first), as one string, innermost frame first (see module doc)."""
    if origin == "operators":
        frames = [f for f in frames if not _is_step_frame(f)][:MAX_OP_DEPTH]
    else:
        frames = frames[:MAX_CODE_FRAMES]
    return SEPARATOR.join(frame_text(f) for f in frames)


def allocation_sites(trace: Trace) -> tuple[str, list[str] | None]:
    """``(origin, site of each allocation in trace order)``; sites are None when the trace has no frames.

    An allocation without frames (outside every op, or made by C++ code in a Python-stacks
    recording) has the empty site ``""``. A Kineto trace whose pseudo-frames are only step markers
    has no operator to name anything by: ``("none", None)``.
    """
    origin = frame_origin(trace)
    if origin == "none":
        return origin, None
    kind = trace.column("kind")
    stack_ids = trace.column("stack_id")[kind == EventKind.ALLOC]
    distinct = np.unique(stack_ids[stack_ids >= 0])
    # Step frames are outermost: a few more rows than the depth cap leave room to drop them.
    max_depth = MAX_OP_DEPTH + 8 if origin == "operators" else MAX_CODE_FRAMES
    site_of: dict[int, str] = {-1: ""}
    for sid, frames in _frames_by_stack(trace, distinct, max_depth).items():
        site_of[sid] = site_text(frames, origin)
    if origin == "operators" and not any(site_of.values()):
        return "none", None
    return origin, [site_of[sid] for sid in stack_ids.tolist()]


def innermost(site: str) -> str:
    """The innermost frame of a site (``"(none)"`` for an allocation without frames)."""
    return site.split(SEPARATOR, 1)[0] if site else "(none)"
