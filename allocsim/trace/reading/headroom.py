"""How much more memory this process may take: raise ``ulimit -v`` or the cgroup's ``memory.max`` if it is too little.

The compiled readers hold their work in a budget of bytes (``--limits memory_bytes``). Under a
process limit lower than that budget, an allocation the budget allows fails anyway, and the file
went to the reference route, which needs several times more memory and minutes, and then blamed
``memory_bytes``. ``headroom()`` gives what the process can still take under its address-space
limit (``RLIMIT_AS``, ``ulimit -v``) and its cgroup's ``memory.max``, so readers size their budget
from the real limit and name it when a file does not fit.
"""

from __future__ import annotations

import dataclasses
import os

from ...errors import TraceFormatError
from ...units import format_bytes

_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_CGROUP = "/proc/self/cgroup"


@dataclasses.dataclass(frozen=True)
class Headroom:
    """Bytes this process may still take, and the limit that says so (for messages)."""

    bytes: int
    limit: str          #: e.g. "the address-space limit of 4.00 GiB (ulimit -v)"


def vm_size_bytes() -> int:
    """This process's address space in bytes (``VmSize``; 0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _address_space() -> Headroom | None:
    try:
        import resource
    except ImportError:       # not on this platform
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return Headroom(max(0, soft - vm_size_bytes()),
                    f"the process's address-space limit of {format_bytes(soft)} (ulimit -v)")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None     # "max": no limit


def _inactive_file_bytes(folder: str, key: str) -> int:
    """Page cache the kernel reclaims before it fails an allocation (``memory.stat``), 0 if unknown."""
    try:
        with open(os.path.join(folder, "memory.stat")) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def _cgroup_memory() -> Headroom | None:
    """What this process's cgroup and its ancestors leave: ``memory.max`` minus what they use, less
    reclaimable page cache (cgroup v2; v1: ``memory.limit_in_bytes`` minus ``usage_in_bytes``)."""
    try:
        with open(_PROC_CGROUP) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            root, files, cache = _CGROUP_ROOT, ("memory.max", "memory.current"), "inactive_file"
        elif "memory" in controllers.split(","):
            root = os.path.join(_CGROUP_ROOT, "memory")
            files, cache = ("memory.limit_in_bytes", "memory.usage_in_bytes"), "total_inactive_file"
        else:
            continue
        parts = [p for p in group.split("/") if p and p not in (".", "..")]
        for depth in range(len(parts), -1, -1):         # the group, then each ancestor: the tightest wins
            folder = os.path.join(root, *parts[:depth])
            limit, used = (_read_int(os.path.join(folder, name)) for name in files)
            if limit is None or used is None or limit >= 1 << 60:   # v1 writes "no limit" as ~2**63
                continue
            left = max(0, limit - max(0, used - _inactive_file_bytes(folder, cache)))
            if tightest is None or left < tightest.bytes:
                tightest = Headroom(left, f"the cgroup's memory limit of {format_bytes(limit)} (memory.max)")
    return tightest


def headroom() -> Headroom | None:
    """The tighter of the address-space and cgroup limits, or None when neither limits this process."""
    found = [h for h in (_address_space(), _cgroup_memory()) if h is not None]
    return min(found, key=lambda h: h.bytes) if found else None



def over_room(path: str, room: Headroom) -> TraceFormatError:
    """The one line for a file this process cannot read under its memory limit ``room``: it names
    the limit to raise, and is the same on every route."""
    return TraceFormatError(path, None, f"reading it needs more memory than this process may take under "
                            f"{room.limit}; raise that limit")


def out_of_memory_line(what: str) -> str:
    """The one line for a ``MemoryError`` met while working on ``what`` (a trace, after reading it):
    the limit that stopped the process, to raise, or that no limit was set."""
    room = headroom()
    if room is not None:
        return (f"ran out of memory working on {what}: the process may take no more under {room.limit}; "
                "raise that limit")
    return f"ran out of memory working on {what} (no process limit is set: the machine's memory is used up)"
