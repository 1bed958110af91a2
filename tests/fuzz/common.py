"""What the fuzz targets share: both routes read one input, and the seeds the targets start from."""

from __future__ import annotations

import faulthandler
import gzip
import os
import random
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

# The reference route parses snapshots in this process (no forked child per input).
os.environ.setdefault("ALLOCSIM_NO_ISOLATION", "1")

from allocsim.errors import TraceFormatError  # noqa: E402
from allocsim.policies import kernel  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.transport import TABLES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
REPO_TRACES = ROOT / "traces"
SCRATCH = Path(tempfile.mkdtemp(prefix="allocsim-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
HANG_SECONDS = 30
COMPARED = {"trace": 0, "error": 0}    # inputs read on both routes, by what both gave


class Divergence(AssertionError):
    """The compiled and the reference route read one input differently."""


def watchdog() -> None:
    """Dump every thread's stack and exit when one input runs past HANG_SECONDS (a hang is a finding)."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)


def outcome(path: Path, route: str, **kwargs) -> tuple:
    """("trace", Trace) or ("error", class name, message) of reading ``path`` on ``route``."""
    with kernel.route(route):
        try:
            return ("trace", read_trace(path, **kwargs))
        except TraceFormatError as exc:
            return ("error", type(exc).__name__, str(exc))


def _tables_equal(a, b) -> str | None:
    for name in TABLES:
        x, y = getattr(a, name).reset_index(drop=True), getattr(b, name).reset_index(drop=True)
        if list(x.columns) != list(y.columns) or list(x.dtypes) != list(y.dtypes) or len(x) != len(y):
            return f"{name}: shape or dtypes differ"
        for col in x.columns:
            if not np.array_equal(x[col].to_numpy(), y[col].to_numpy()):
                return f"{name}.{col} differs"
    if a.labels != b.labels:
        return "labels differ"
    if a.meta.to_dict() != b.meta.to_dict():
        return "meta differs"
    return None


def compare_routes(data: bytes, suffix: str, **kwargs) -> str:
    """Read ``data`` (written to a file named *suffix) on both routes; raise Divergence when they differ."""
    path = SCRATCH / f"input{suffix}"
    path.write_bytes(data)
    got, ref = outcome(path, "compiled", **kwargs), outcome(path, "reference", **kwargs)
    if got[0] != ref[0]:
        raise Divergence(f"compiled gave {got[0]} {got[1:3] if got[0] == 'error' else ''}, "
                         f"reference gave {ref[0]} {ref[1:3] if ref[0] == 'error' else ''}")
    if got[0] == "error" and got != ref:
        raise Divergence(f"different errors: {got[1:]} vs {ref[1:]}")
    if got[0] == "trace":
        why = _tables_equal(got[1], ref[1])
        if why:
            raise Divergence(why)
    COMPARED[got[0]] += 1
    return got[0]


def read_maybe_gz(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def shared_files(pattern: str) -> list[Path]:
    return sorted(SHARED_TRACES.glob(pattern)) if SHARED_TRACES.is_dir() else []


def attack_seeds(names: list[str], max_bytes: int = 256 << 10) -> Iterator[bytes]:
    """Files tests/attack_files.py makes (the named generators), decompressed, when small enough."""
    from tests.attack_files import HOSTILE, VALID

    generators = {name: gen for group in HOSTILE.values() for name, gen in group.items()}
    generators.update(VALID)
    folder = SCRATCH / "attack"
    folder.mkdir(exist_ok=True)
    for name in names:
        for seed in range(2):
            path, _ = generators[name](folder, random.Random(seed))
            if path.is_file() and path.stat().st_size <= max_bytes:
                data = read_maybe_gz(path)
                if len(data) <= max_bytes:
                    yield data
