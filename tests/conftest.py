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


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``../shared`` folder; tests that use it skip cleanly when it is absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"shared data folder {SHARED_DIR} is absent (real traces live there)")
    return SHARED_DIR
