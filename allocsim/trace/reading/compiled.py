"""Run the readers' hot loops compiled when possible: ``active()`` says whether they do.

Every reader has one readable Python implementation, the *reference*. The optional C extension
``allocsim.trace._readers`` (built by ``pip install .`` when a C compiler is there; sources in
``csrc/readers/``) holds compiled twins of the reference's hot parts: a data-only pickle
interpreter that reads a snapshot into columns without unpickling it, and the records builder
shared by every reader. A compiled part either returns exactly what the reference returns or hands
the input back (``None``), and the reader then takes the reference route; the differential tests
hold the two routes to identical traces. (The snapshot scan out of memory returns the bytes it
needed instead: under a process limit the reader refuses the file rather than need more.)

The route follows the policy kernel's switch, ``ALLOCSIM_KERNEL`` (see ``allocsim.policies.kernel``):
``auto`` (default) uses the compiled readers when they load, ``reference`` never does, and
``compiled`` requires them (an error if they cannot be loaded). ``kernel.route(...)`` switches both.
"""

from __future__ import annotations

from typing import Any

from ...errors import AllocsimError
from ...policies import kernel

#: The extension's ABI_VERSION this module was written for.
ABI_VERSION = 1

try:
    from .. import _readers as ext
except ImportError as exc:   # not built (no compiler), or built for another Python
    ext: Any = None
    LOAD_ERROR = f"the compiled readers are not available ({exc})"
else:
    LOAD_ERROR = ""
    if getattr(ext, "ABI_VERSION", None) != ABI_VERSION:
        LOAD_ERROR = (f"the compiled readers are stale (ABI {getattr(ext, 'ABI_VERSION', None)}, "
                      f"need {ABI_VERSION}): reinstall allocsim")
        ext = None


class ReadersUnavailable(AllocsimError):
    """``ALLOCSIM_KERNEL=compiled`` asked for the compiled readers and they cannot be loaded."""


def active() -> bool:
    """Tell whether readers take their compiled route now; raise ``ReadersUnavailable`` if required and absent."""
    return kernel.wants_compiled(ext, LOAD_ERROR, ReadersUnavailable)


def status() -> dict[str, str]:
    """Which route readers take and why: ``{"route": "compiled" | "reference" | "unavailable", "reason": ...}``."""
    return kernel.route_status(ext, LOAD_ERROR)


def describe() -> str:
    """One line for ``allocsim --version``: the readers' route and why."""
    state = status()
    return f"readers: {state['route']} ({state['reason']})"
