"""Which allocsim code computed a result: cached sweep and advise rows are reused only by the same code.

The package version alone is not enough: it changes at releases, while a checkout or an editable
install changes its results with every edit, and a row journaled by older code (another verdict,
a missing caveat column) must be recomputed, not served. ``code_identity()`` is the version plus a
SHA-256 over the package's Python sources and compiled extensions, as installed.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from .version import __version__

#: The files whose bytes decide a result: the sources and the compiled kernels and readers.
_CODE_SUFFIXES = (".py", ".so", ".pyd")


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """``VERSION+HASH``: the version and the first 16 hex digits of the code's SHA-256 (computed once per process)."""
    return f"{__version__}+{package_digest(Path(__file__).resolve().parent)[:16]}"


def package_digest(package: Path) -> str:
    """Hex SHA-256 over the names and bytes of the code files under ``package`` (bytecode caches ignored)."""
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*")
                   if p.suffix in _CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file())
    for path in files:
        # The relative name too, so a file moved between rooms counts as a change.
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
