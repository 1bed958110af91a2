"""Run the pool policies' hot path compiled when possible: ``status()`` says whether it is, ``route()`` switches.

The pool policies (``bestfit``, ``stream-bound``, ``cupy``, ``paddle``, ``cuda-async``,
``paddle-naive`` and the ``pytorch`` preset) have one readable Python implementation, the
*reference* (``Policy.malloc`` -> ``_do_malloc``, ``Policy.free_completed`` -> ``_do_free``, the
``FreeList`` in ``freelist.py``). The optional C extension ``allocsim.policies._kernel`` (built by
``pip install .`` when a C compiler is there; see ``csrc/kernel/``) holds a compiled ``FreeList`` with the
same contents and methods, a ``LiveTable`` that is the policy's ``live`` dict and ``pending`` set,
and a ``Kernel`` that serves a policy's ``malloc``, ``free_completed`` and ``replay_run`` with the
reference's exact decisions; misses, releases, garbage collection and page mapping stay in the
Python methods, which the kernel calls.

Which one new policies use is decided by the ``ALLOCSIM_KERNEL`` environment variable:

- unset or ``auto``: the compiled kernel when it loads, else the reference;
- ``reference``: the Python reference only;
- ``compiled``: the compiled kernel, or an error if it cannot be loaded (CI uses it so that a
  failed build cannot pass unnoticed).

``allocsim --version`` prints ``status()``; every ``RunResult.perf`` names the route a run took.
"""

from __future__ import annotations

import contextlib
import os
from types import MappingProxyType
from typing import Any, Iterator

from ..errors import AllocsimError

ENV_VAR = "ALLOCSIM_KERNEL"
MODES = ("auto", "compiled", "reference")
#: The extension's ABI_VERSION this module was written for.
ABI_VERSION = 2

try:
    from . import _kernel as compiled
except ImportError as exc:   # not built (no compiler), or built for another Python
    compiled = None
    LOAD_ERROR = f"the compiled kernel is not available ({exc})"
else:
    LOAD_ERROR = ""
    if getattr(compiled, "ABI_VERSION", None) != ABI_VERSION:
        LOAD_ERROR = (f"the compiled kernel is stale (ABI {getattr(compiled, 'ABI_VERSION', None)}, "
                      f"need {ABI_VERSION}): reinstall allocsim")
        compiled = None

_override: str | None = None   # set by route() for a block of code


class KernelUnavailable(AllocsimError):
    """``ALLOCSIM_KERNEL=compiled`` (or ``route("compiled")``) asked for the kernel and it cannot be loaded."""


def mode() -> str:
    """The requested mode: ``route()``'s while one is active, else ``ALLOCSIM_KERNEL`` (default ``auto``)."""
    if _override is not None:
        return _override
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise AllocsimError(f"{ENV_VAR}={value!r}: expected one of {', '.join(MODES)}")
    return value


def active() -> bool:
    """Tell whether policies built now use the compiled kernel; raise ``KernelUnavailable`` if required and absent."""
    return wants_compiled(compiled, LOAD_ERROR, KernelUnavailable)


def status() -> dict[str, str]:
    """Which route new policies take and why: ``{"route": "compiled" | "reference", "reason": ...}``."""
    return route_status(compiled, LOAD_ERROR)


def wants_compiled(ext: Any, load_error: str, unavailable: type[AllocsimError]) -> bool:
    """Whether code with the optional extension ``ext`` takes its compiled route now (``mode()`` decides).

    Raises ``unavailable`` when the mode is ``compiled`` and ``ext`` could not be loaded (``load_error`` says why).
    """
    wanted = mode()
    if wanted == "reference":
        return False
    if ext is None:
        if wanted == "compiled":
            raise unavailable(f"{ENV_VAR}=compiled but {load_error}")
        return False
    return True


def route_status(ext: Any, load_error: str) -> dict[str, str]:
    """``{"route": "compiled" | "reference" | "unavailable", "reason": ...}`` for code with the extension ``ext``."""
    try:
        wanted = mode()
    except AllocsimError as exc:
        return {"route": "reference", "reason": str(exc)}
    if wanted == "reference":
        return {"route": "reference", "reason": f"{ENV_VAR}=reference"}
    if ext is None:
        return {"route": "reference" if wanted == "auto" else "unavailable", "reason": load_error}
    return {"route": "compiled", "reason": f"C extension {os.path.basename(ext.__file__)}"}


def describe() -> str:
    """One line for ``allocsim --version``: the policy route and why."""
    state = status()
    return f"policy kernel: {state['route']} ({state['reason']})"


@contextlib.contextmanager
def route(name: str) -> Iterator[None]:
    """Build policies on route ``name`` (``auto``, ``compiled`` or ``reference``) inside the block."""
    global _override
    if name not in MODES:
        raise ValueError(f"route must be one of {MODES}, got {name!r}")
    previous, _override = _override, name
    try:
        yield
    finally:
        _override = previous


def route_of(policy: Any) -> str:
    """``compiled`` if any layer of a policy stack runs on the kernel, else ``reference``."""
    layer = policy
    while layer is not None and hasattr(layer, "upstream"):
        if getattr(layer, "_kernel", None) is not None:
            return "compiled"
        layer = layer.upstream
    return "reference"


# ---------------------------------------------------------------------------------------------- free lists
if compiled is not None:
    class CompiledFreeList(compiled.FreeList):
        """The compiled ``FreeList`` plus the reference's read-only views (``size_at``, ``by_stream``, ...) and ``check``.

        Views are snapshots (O(free blocks) each), for reports and tests; the policies themselves
        use the one-address methods (``block_size``, ``segment_size``, ...).
        """

        __slots__ = ()

        size_at = property(lambda self: MappingProxyType(dict(self._items("size_at"))))
        start_ending_at = property(lambda self: MappingProxyType(dict(self._items("start_ending_at"))))
        segment_size_at = property(lambda self: MappingProxyType(dict(self._items("segment_size_at"))))
        segment_stream_at = property(lambda self: MappingProxyType(dict(self._items("segment_stream_at"))))

        @property
        def inserted_at(self) -> MappingProxyType | None:
            return MappingProxyType(dict(self._items("inserted_at"))) if self.track_age else None

        @property
        def by_stream(self) -> MappingProxyType:
            return MappingProxyType({skey: self.keys(skey) for skey in self.stream_keys()})

        @property
        def free_bytes_by_stream(self) -> dict[int, int]:
            return {skey: self.stream_bytes(skey) for skey in self.stream_keys()}

        def check(self) -> None:
            """Raise ``AssertionError`` if the indexes disagree or free neighbours were left unmerged."""
            from .freelist import check_free_list

            check_free_list(self)
else:
    CompiledFreeList = None


def new_live_state(*, compiled_route: bool) -> tuple[Any, Any]:
    """A policy's ``(live, pending)`` of the route: the compiled live table, or a dict and a set."""
    if compiled_route:
        live = compiled.LiveTable()
        return live, live.pending_set()
    return {}, set()


def new_free_list(*, compiled_route: bool, track_age: bool = False) -> Any:
    """A ``FreeList`` of the route: compiled (``CompiledFreeList``) or the Python reference."""
    if compiled_route:
        return CompiledFreeList(track_age=track_age)
    from .freelist import FreeList

    return FreeList(track_age=track_age)


# ---------------------------------------------------------------------------------------------- policies
_SERVED = ("malloc", "free_completed", "replay_run")


def attach(policy: Any) -> Any:
    """Serve ``policy``'s hot path from a compiled ``Kernel``; return it, or None (the policy stays on the reference).

    ``policy._kernel_config()`` says what the kernel may serve (``serve_malloc``, ``serve_free``,
    ``serve_runs``) and gives the ``Kernel`` its rules and slow paths; None means nothing. The
    served methods become instance attributes, so callers reach the compiled code directly.
    """
    policy._kernel = None
    for name in _SERVED:   # a second attach (a subclass's __init__) starts from the class's methods
        policy.__dict__.pop(name, None)
    if not getattr(policy, "_compiled_route", False):
        return None
    config = policy._kernel_config()
    if config is None:
        return None
    serve_malloc, serve_free, serve_runs = (config.pop(name) for name in ("serve_malloc", "serve_free", "serve_runs"))
    if not (serve_malloc or serve_free):
        return None
    try:
        kernel = compiled.Kernel(policy, **config)
    except (ValueError, OverflowError):   # a setting outside the kernel's integer range: stay on the reference
        return None
    policy._kernel = kernel
    if serve_malloc:
        policy.malloc = kernel.malloc
    if serve_free:
        policy.free_completed = kernel.free_completed
    if serve_runs and serve_malloc and serve_free:
        policy.replay_run = kernel.replay_run
    return kernel
