"""Which code a stack of frames belongs to: ``SiteIndex(trace, SiteFilter.parse(["transformers/"]))``.

A *code site* is the innermost frame of the user's program: walking a stack from the innermost
frame outwards, the first frame whose file is Python source (``.py``, or a ``<...>`` pseudo-file
such as a notebook cell) and whose path matches none of the skipped paths. C, C++ and CUDA frames
(the caching allocator, the dispatcher, the interpreter) never are the program's. The skipped
paths are ``SiteFilter.skip``: by default the Python standard library (``<stdlib>``) and
``torch/``; ``--site-filter`` adds paths (``transformers/``) or, with ``none``, drops the defaults.

A stack with frames but no frame of the program still says what ran:

- in the autograd engine (the backward pass runs in a C++ thread with no Python frame):
  ``[backward] BmmBackward0``, the autograd node, or the operator it called;
- otherwise the operator: a Kineto trace's outermost enclosing CPU op (``[op] aten::layer_norm``,
  step annotations such as ``ProfilerStep#2`` only when nothing else encloses it), or a
  snapshot's outermost ``at::_ops`` call;
- else ``[native code]``.

Allocations whose stack is empty (-1) have no site: callers count them as ``unattributed``.
Everything is computed once per distinct frame and stack, never per event.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, NamedTuple

if TYPE_CHECKING:
    import numpy as np

    from ...trace.schema import Trace

#: Stand-in for the Python standard library in a filter.
STDLIB = "<stdlib>"
#: Paths skipped unless ``--site-filter none`` drops them.
DEFAULT_SKIP = (STDLIB, "torch/")
#: The longest path pattern accepted (a pattern is a path fragment, not a file).
MAX_PATTERN_CHARS = 256
#: Program frames a row shows at most (the site first, then its callers).
MAX_SHOWN_FRAMES = 12
#: Characters of a frame's file name, and of its function name, shown at most (``clip_text``): a
#: trace may hold frame strings of up to ``string_chars`` (65,536), and every site name, table row
#: and report line is built from them.
MAX_FRAME_PART_CHARS = 240

RULE = ("a code site is the innermost frame of the program: the first stack frame, innermost first, whose file "
        "is Python source (.py or a <...> pseudo-file) and whose path matches none of the skipped paths ({skip}); "
        "C/C++/CUDA frames (allocator, dispatcher, interpreter) never are; a stack with no such frame is named by "
        "its autograd node ([backward] ...) or operator ([op] ...); allocations without recorded frames are "
        "'unattributed'")
KINETO_NOTE = ("Kineto traces record no stack per allocation: sites come from what encloses each allocation in "
               "time on its thread, the Python functions (when profiled with with_stack=True) or else the "
               "operator (CPU op)")
PADDLE_NOTE = ("PaddlePaddle's profiler records no stack per allocation: sites are the Paddle operator "
               "(\"matmul dygraph\") that encloses each allocation in time on its thread, else the innermost "
               "enclosing API call or layer")
#: Formats whose frames are the ops enclosing each allocation in time, not allocation stacks.
OPERATOR_FRAME_FORMATS = frozenset({"kineto", "paddle"})
NO_FRAMES = "this trace records no stack frames, so no code sites: every allocation is unattributed"

_STDLIB_POSIX = re.compile(r"(^|/)lib(64)?/python\d+(\.\d+)?t?/(?!(site|dist)-packages/)")
# Windows paths are case-insensitive (``...\Lib\copy.py`` and ``...\lib\copy.py`` are one file), may carry
# the ``\\?\`` prefix, and the embeddable Python keeps its library in ``pythonXY.zip``. A ``lib`` folder is
# common in projects too, so there the first name after it must be a standard-library module.
_STDLIB_WINDOWS = re.compile(r"^(//\?/)?[A-Za-z]:/(.*/)?lib/(?!site-packages/)(?P<rest>.+)$", re.IGNORECASE)
_STDLIB_ZIP = re.compile(r"(^|/)python\d+\.zip/(?P<rest>.+)$", re.IGNORECASE)
#: Top-level modules of the standard library (``copy``, ``threading``, ``concurrent``, ...).
STDLIB_MODULES = frozenset(sys.stdlib_module_names)
_BACKWARD_NODE = re.compile(r"torch::autograd::(?:generated::)?(\w+)::apply\(|"
                            r"torch::autograd::generated::(\w+)_apply_functional\(|"
                            r"^autograd::engine::evaluate_function: (\S+)")
_AT_OP = re.compile(r"\bat::_ops::(\w+)::call\(")
_PADDLE_INNER = re.compile(r" (?:kernel launch|infer_meta|node_creation|compute|pybind_imperative_func)$")
_STEP = re.compile(r"^ProfilerStep#\d+$")


class SiteFilterError(ValueError):
    """A ``--site-filter`` value that is not a usable path pattern."""


@dataclass(frozen=True)
class SiteFilter:
    """The paths whose frames are not the program's (``<stdlib>`` stands for the standard library)."""

    skip: tuple[str, ...] = DEFAULT_SKIP

    @classmethod
    def parse(cls, items: Iterable[str] | None) -> "SiteFilter":
        """``--site-filter`` values (repeatable, comma-separated) added to the defaults; ``none`` drops them."""
        skip = list(DEFAULT_SKIP)
        for item in items or ():
            for part in str(item).split(","):
                part = part.strip().replace("\\", "/")
                if not part:
                    continue
                if part.lower() == "none":
                    skip = [p for p in skip if p not in DEFAULT_SKIP]
                    continue
                if len(part) > MAX_PATTERN_CHARS:
                    raise SiteFilterError(f"--site-filter: a path of {len(part):,} characters (at most "
                                          f"{MAX_PATTERN_CHARS})")
                if part not in skip:
                    skip.append(part)
        return cls(tuple(skip))

    def describe(self) -> str:
        """``<stdlib>, torch/`` (or ``nothing``)."""
        return ", ".join(self.skip) if self.skip else "nothing"

    def rule(self) -> str:
        """The rule in one sentence, with the skipped paths filled in."""
        return RULE.format(skip=self.describe())

    def skips(self, filename: str) -> bool:
        """True when a frame of ``filename`` matches a skipped path (a fragment starting at a directory)."""
        path = filename.replace("\\", "/")
        slashed = "/" + path
        for pattern in self.skip:
            if pattern == STDLIB:
                if is_stdlib(path):
                    return True
            elif ("/" + pattern.lstrip("/")) in slashed:
                return True
        return False

    def is_program(self, filename: str) -> bool:
        """True when a frame of ``filename`` belongs to the user's program under this filter."""
        return is_python_source(filename) and not self.skips(filename)


def is_python_source(filename: str) -> bool:
    """A Python frame: a ``.py`` file or a ``<...>`` pseudo-file (notebook cell, ``<string>``); not ``<built-in ...>``."""
    if filename.endswith(".py"):
        return True
    return filename.startswith("<") and filename.endswith(">") and not filename.startswith("<built-in")


def is_stdlib(path: str) -> bool:
    """The Python standard library on any platform (``path`` with ``/`` separators).

    ``lib/pythonX.Y/`` outside site- and dist-packages, ``<frozen ...>``; on Windows ``<drive>:/.../Lib/``
    (any case) or ``pythonXY.zip/`` followed by a standard-library module (``Lib/copy.py``,
    ``Lib/concurrent/futures/thread.py``); a bare file name of such a module (``threading.py``).
    """
    if path.startswith("<frozen"):
        return True
    if _STDLIB_POSIX.search(path):
        return True
    found = _STDLIB_WINDOWS.match(path) or _STDLIB_ZIP.search(path)
    if found:
        return _stdlib_module(found.group("rest"))
    return "/" not in path and _stdlib_module(path)


def _stdlib_module(relative: str) -> bool:
    """Whether ``relative`` (``copy.py``, ``asyncio/events.py``) starts with a standard-library module."""
    top = relative.split("/", 1)[0]
    return (top[:-3] if top.endswith(".py") else top) in STDLIB_MODULES


def clip_text(text: str, max_chars: int = MAX_FRAME_PART_CHARS) -> str:
    """``text``, or its start and end around a ``...[N characters cut]...`` mark when it is longer than ``max_chars``.

    Both ends are kept: a path's file name is at its end, a C++ signature's function name at its start.
    """
    if len(text) <= max_chars:
        return text
    keep = max_chars // 2
    return f"{text[:keep]}...[{len(text) - 2 * keep:,} characters cut]...{text[-keep:]}"


def frame_text(filename: str, line: int, name: str) -> str:
    """``path/to/file.py:123 in forward`` (an operator frame: its name), each part cut to
    ``MAX_FRAME_PART_CHARS`` (``clip_text``), so no frame a file holds makes a site name or a page line long."""
    if not filename and not line:
        return clip_text(name)
    return f"{clip_text(filename)}:{line} in {clip_text(name)}"


def source_format(trace: Trace) -> str:
    """The format the trace was recorded in (a converted file remembers it)."""
    return str(trace.meta.version_hints.get("converted_from") or trace.meta.format)


class _FrameFacts(NamedTuple):
    """One frame as the fallback naming rule sees it (``SiteIndex._facts``)."""

    name: str
    engine: bool             #: inside the autograd engine
    node: str | None         #: the autograd node it names
    at_op: str | None        #: ``aten::X`` of an ``at::_ops::X::call`` frame
    step: bool               #: a ``ProfilerStep#N`` annotation
    operator: bool           #: a Kineto operator frame (no file)
    dygraph: str | None      #: Paddle: the op of an ``<op> dygraph`` event
    paddle_op: str           #: Paddle: the name without its inner-event suffix


@dataclass
class SiteIndex:
    """Every distinct stack of ``trace`` mapped to a site: ``site_of(stack_ids)`` gives site numbers (-1: none).

    ``names[k]`` is site k's name; ``frames_of(stack_id)`` the program frames of a stack (the site first).
    """

    trace: Trace
    site_filter: SiteFilter = field(default_factory=SiteFilter)

    def __post_init__(self) -> None:
        import numpy as np

        self.kineto = source_format(self.trace) in OPERATOR_FRAME_FORMATS
        self.paddle = source_format(self.trace) == "paddle"
        self.names: list[str] = []
        self._number: dict[str, int] = {}
        self._frame_facts: dict[tuple[str, bool], _FrameFacts] = {}
        fr = self.trace.table("frames")
        self._files = fr["filename"]
        self._lines = fr["line"]
        self._names = fr["name"]
        frame_ids = fr["frame_id"]
        pos = np.full(int(frame_ids.max()) + 1 if len(frame_ids) else 0, -1, dtype=np.int64)
        pos[frame_ids] = np.arange(len(frame_ids))
        st = self.trace.table("stacks")
        sid = st["stack_id"].astype(np.int64)
        order = np.lexsort((st["depth"], sid))
        self._sid = sid[order]
        self._rows = pos[st["frame_id"][order]] if len(order) else np.empty(0, np.int64)
        n_stacks = int(self._sid[-1]) + 1 if len(self._sid) else 0
        self._starts = np.searchsorted(self._sid, np.arange(n_stacks + 1))
        self._program = self._program_frames()
        self.site_of_stack = self._label_stacks(n_stacks)

    # ------------------------------------------------------------------ per frame
    def _program_frames(self) -> np.ndarray:
        """Per frame row: does it belong to the program? (decided once per distinct file name)"""
        import numpy as np

        verdict: dict[str, bool] = {}
        out = np.zeros(len(self._files), dtype=bool)
        for i, name in enumerate(self._files.tolist()):
            name = name if isinstance(name, str) else ""
            known = verdict.get(name)
            if known is None:
                known = verdict[name] = self.site_filter.is_program(name)
            out[i] = known
        return out

    def _site(self, name: str) -> int:
        number = self._number.get(name)
        if number is None:
            number = self._number[name] = len(self.names)
            self.names.append(name)
        return number

    # ------------------------------------------------------------------ per stack
    def _label_stacks(self, n_stacks: int) -> np.ndarray:
        import numpy as np

        out = np.full(n_stacks, -1, dtype=np.int64)
        if not n_stacks:
            return out
        is_prog = self._program[self._rows]
        prog_rows = np.flatnonzero(is_prog)
        first_stack, first_at = np.unique(self._sid[prog_rows], return_index=True)
        first_row = self._rows[prog_rows[first_at]]
        by_frame: dict[int, int] = {}
        for stack, row in zip(first_stack.tolist(), first_row.tolist()):
            site = by_frame.get(row)
            if site is None:
                site = by_frame[row] = self._site(frame_text(str(self._files[row]), int(self._lines[row]),
                                                             str(self._names[row])))
            out[stack] = site
        lengths = np.diff(self._starts)
        for stack in np.flatnonzero((out < 0) & (lengths > 0)).tolist():
            out[stack] = self._site(self._fallback(stack))
        return out

    def _stack_rows(self, stack: int) -> np.ndarray:
        return self._rows[self._starts[stack]:self._starts[stack + 1]]

    def _facts(self, row: int) -> _FrameFacts:
        """What naming a stack without a program frame asks of frame ``row``, worked out once per distinct
        name: a file's frame strings may be long, and many frames and stacks share each one."""
        name, file = str(self._names[row]), str(self._files[row])
        key = (name, not file, file == "aten")
        facts = self._frame_facts.get(key)
        if facts is None:
            node = _BACKWARD_NODE.search(name)
            at_op = _AT_OP.search(name)
            # an allocsim capture names its operator frame ``aten::X`` in file ``aten``
            captured_op = name if file == "aten" and name.startswith("aten::") else None
            facts = self._frame_facts[key] = _FrameFacts(
                name=name, engine="torch::autograd::Engine::" in name,
                node=(node.group(1) or node.group(2) or node.group(3).rsplit("::", 1)[-1]) if node else None,
                at_op=f"aten::{at_op.group(1)}" if at_op else captured_op, step=_STEP.match(name) is not None,
                operator=not file and not name.startswith("<built-in"),
                dygraph=name[:-len(" dygraph")] if name.endswith(" dygraph") else None,
                paddle_op=_PADDLE_INNER.sub("", name) if self.paddle else name)
        return facts

    def _fallback(self, stack: int) -> str:
        """The name of a stack without a program frame: its autograd node, else its operator."""
        facts = [self._facts(row) for row in self._stack_rows(stack).tolist()]
        in_engine = any(f.engine for f in facts)
        if self.kineto or in_engine:
            for f in facts:
                if f.node is not None:
                    return f"[backward] {clip_text(f.node)}"
        op = self._operator(facts)
        op = clip_text(op) if op else op
        if in_engine:
            return f"[backward] {op}" if op else "[backward] autograd engine"
        return f"[op] {op}" if op else "[native code]"

    def _operator(self, facts: list[_FrameFacts]) -> str | None:
        """The outermost operator of a stack (Kineto: enclosing CPU op; snapshot: ``at::_ops::X::call``)."""
        if self.paddle:
            # Paddle's operator events are named "<op> dygraph"; inner events (kernel launch,
            # infer_meta) and outer ones (API calls, layers) name the same op less precisely.
            for f in facts:
                if f.dygraph is not None:
                    return f.dygraph
            real = [f.paddle_op for f in facts if not f.step]
            return (real or [None])[0]
        if self.kineto:
            ops = [f for f in facts if f.operator]
            real = [f.name for f in ops if not f.step]
            return (real or [f.name for f in ops] or [None])[-1]
        for f in reversed(facts):
            if f.at_op is not None:
                return f.at_op
        return None

    # ------------------------------------------------------------------ lookups
    def site_of(self, stack_ids: np.ndarray) -> np.ndarray:
        """Site number of each stack id (-1: no frames)."""
        import numpy as np

        ids = np.asarray(stack_ids, dtype=np.int64)
        out = np.full(len(ids), -1, dtype=np.int64)
        ok = (ids >= 0) & (ids < len(self.site_of_stack))
        out[ok] = self.site_of_stack[ids[ok]]
        return out

    def frames_of(self, stack_id: int) -> list[str]:
        """The program frames of one stack, innermost first (the site first); a fallback site: [] ."""
        if stack_id < 0 or stack_id >= len(self.site_of_stack):
            return []
        rows = self._stack_rows(stack_id)
        rows = rows[self._program[rows]][:MAX_SHOWN_FRAMES]
        return [frame_text(str(self._files[r]), int(self._lines[r]), str(self._names[r])) for r in rows.tolist()]

    @property
    def has_frames(self) -> bool:
        """True when the trace holds any stack at all."""
        return len(self.site_of_stack) > 0
