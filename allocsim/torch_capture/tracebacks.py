"""Print a failing script's traceback as ``python train.py`` would: ``print_script_traceback(exc)``.

The script runs inside ``allocsim.torch_capture.child`` through ``runpy``, so a plain
``traceback.print_exc()`` opens with the capture's own frames (``child.py``, ``runpy``) and, below
the script's last frame, shows the capture's modes and the meta kernels they call. Here the
capture's frames are left out, and so is everything below the point where the capture took over
from the script's last frame (the first allocsim frame after it): what remains is what ``python
SCRIPT`` prints on a GPU, down to the call that failed, then the error. Chained exceptions
(``raise ... from``, "During handling of ...") are trimmed the same way.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

#: Frames from these files are the capture's, not the script's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if torch is not None else "\0"


def _is_capture_frame(frame: traceback.FrameSummary) -> bool:
    filename = frame.filename or ""
    if filename.startswith(_PACKAGE_DIR):
        return True
    return filename == "<frozen runpy>" or os.path.basename(filename) == "runpy.py"


def _script_frames(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """``frames`` (outermost first) without the capture's, cut where the capture took over below the script's last frame."""
    torch_dir = _torch_dir()
    users = [i for i, f in enumerate(frames)
             if not _is_capture_frame(f) and not (f.filename or "").startswith(torch_dir)]
    if users:
        takeover = next((i for i in range(users[-1] + 1, len(frames))
                         if (frames[i].filename or "").startswith(_PACKAGE_DIR)), len(frames))
        frames = frames[:takeover]
    return [f for f in frames if not _is_capture_frame(f)]


def _strip(summary: traceback.TracebackException, seen: set[int]) -> None:
    if id(summary) in seen:
        return
    seen.add(id(summary))
    summary.stack = traceback.StackSummary.from_list(_script_frames(list(summary.stack)))
    for chained in (summary.__cause__, summary.__context__):
        if chained is not None:
            _strip(chained, seen)


def script_traceback(exc: BaseException) -> str:
    """The text of ``exc``'s traceback without the capture's frames."""
    summary = traceback.TracebackException.from_exception(exc)
    _strip(summary, set())
    return "".join(summary.format())


def print_script_traceback(exc: BaseException, file: Any = None) -> None:
    """Print ``exc``'s traceback without the capture's frames to ``file`` (stderr)."""
    print(script_traceback(exc), end="", file=file or sys.stderr)
