"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI must be deterministic); set
# ALLOCSIM_HYPOTHESIS=explore to let them search fresh random examples locally.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("ALLOCSIM_HYPOTHESIS") == "explore" else "deterministic")

#: ``../shared`` beside the repository root: real traces and research notes, not part of the repo.
SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"


def pytest_collection_modifyitems(config, items) -> None:
    """Skip every test marked ``shared`` where ``../shared`` is absent, so a fresh clone passes on its own.

    A test that opens a shared file by path (not through ``shared_dir``) would otherwise fail there
    with the reader's "no such file" instead of skipping.
    """
    if SHARED_DIR.is_dir():
        return
    skip = pytest.mark.skip(reason=f"shared data folder {SHARED_DIR} is absent (real traces live there)")
    for item in items:
        if item.get_closest_marker("shared") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``../shared`` folder; tests that use it skip cleanly when it is absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"shared data folder {SHARED_DIR} is absent (real traces live there)")
    return SHARED_DIR


#: The repository root: README.md, docs/, traces/.
ROOT = Path(__file__).resolve().parents[1]


def doc_pages() -> list[Path]:
    """README.md and the pages under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_quoting(marker: str) -> str:
    """The text of the one page (README.md or docs/*.md) that quotes ``marker``, for tests that check quoted output.

    Fails when no page or several do, so a moved or duplicated quote is found instead of silently unchecked.
    """
    pages = [(path, path.read_text(encoding="utf-8")) for path in doc_pages()]
    found = [(path, text) for path, text in pages if marker in text]
    names = [str(path.relative_to(ROOT)) for path, _ in found]
    assert len(found) == 1, f"{marker!r} should be quoted by exactly one of README.md and docs/*.md, found in {names}"
    return found[0][1]


@pytest.fixture
def cli(capsys):
    """Run ``allocsim ARGV...`` in this process; returns (exit status, stdout, stderr), arguments made strings."""
    from allocsim.cli import main as cli_main

    def run(*argv) -> tuple[int, str, str]:
        code = cli_main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run
