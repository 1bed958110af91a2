"""Standard-library frames (``threading.py``, ``copy.py``, ...) are never a user's code site, on any platform."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from allocsim.metrics.sites.rule import SiteFilter, SiteIndex, is_stdlib
from allocsim.trace import read_trace

SNAPSHOT = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots" / \
    "Constructor-Sun__memory_snapshot.pickle"
ENV = "/home/haoyangsun/anaconda3/envs/gnn/lib/python3.11/"


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):   # a snapshot is plain data: refuse every global
        raise pickle.UnpicklingError(f"global {module}.{name}")


def windows_path(path: str) -> str:
    """The path the same conda environment has on Windows (``envs\\gnn\\lib\\threading.py``, lower-case ``lib``)."""
    if path.startswith(ENV + "site-packages/"):
        path = "C:/Users/haoyangsun/anaconda3/envs/gnn/Lib/site-packages/" + path[len(ENV + "site-packages/"):]
    elif path.startswith(ENV):
        path = "C:/Users/haoyangsun/anaconda3/envs/gnn/lib/" + path[len(ENV):]
    elif path.startswith("/home/haoyangsun/"):
        path = "D:/work/" + path[len("/home/haoyangsun/"):]
    return path.replace("/", "\\")


def _frames(snapshot: dict):
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            yield from entry.get("frames") or []
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            yield from block.get("frames") or []


def _site_key(name: str) -> str:
    """A site without its directories: ``threading.py:982 in run``."""
    return re.split(r"[\\\\/]", name)[-1]


@pytest.mark.full
@pytest.mark.shared
def test_a_windows_recording_has_the_same_sites_as_the_linux_one(tmp_path):
    """The real snapshot's paths rewritten as Windows writes them: threading.py must not become a site."""
    if not SNAPSHOT.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    with open(SNAPSHOT, "rb") as fh:
        snapshot = _PlainUnpickler(fh).load()
    stdlib_frames = 0
    for frame in _frames(snapshot):
        stdlib_frames += frame["filename"].startswith(ENV + "threading.py")
        frame["filename"] = windows_path(frame["filename"])
    assert stdlib_frames > 0                      # the recording does pass through threading.py
    windows = tmp_path / "windows.pickle"
    windows.write_bytes(pickle.dumps(snapshot))
    linux_sites = SiteIndex(read_trace(SNAPSHOT)).names
    windows_sites = SiteIndex(read_trace(windows)).names
    assert not [n for n in windows_sites if "threading.py" in n or "lib\\copy.py" in n]
    assert sorted(map(_site_key, windows_sites)) == sorted(map(_site_key, linux_sites))


@pytest.mark.parametrize("path,stdlib", [
    ("/usr/lib/python3.11/copy.py", True),
    ("/opt/conda/lib/python3.10/threading.py", True),
    ("<frozen runpy>", True),
    ("C:/Users/me/AppData/Local/Programs/Python/Python311/Lib/copy.py", True),
    ("c:/users/me/anaconda3/envs/gnn/lib/threading.py", True),
    ("//?/C:/Python312/Lib/concurrent/futures/thread.py", True),
    ("C:/Python311/python311.zip/copy.py", True),
    ("copy.py", True),
    ("C:/Users/me/proj/lib/utils.py", False),            # a project's own lib folder
    ("C:/Users/me/proj/.venv/Lib/site-packages/transformers/trainer.py", False),
    ("/home/me/proj/copy_utils.py", False),
    ("train.py", False),
])
def test_stdlib_paths_on_every_platform(path, stdlib):
    assert is_stdlib(path) is stdlib
    assert SiteFilter().is_program(path.replace("/", "\\")) is (not stdlib)
