"""The README's test command on a fresh clone: tests that need ``../shared`` skip where it is absent.

.ci/run runs the whole fast suite once from a clone with no ``../shared`` beside it; this checks the
rule behind it in a second: a test marked ``shared`` that opens a shared file by path skips instead
of failing with the reader's "no such file".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHARED_TEST = textwrap.dedent('''
    from pathlib import Path

    import pytest

    from allocsim.trace import read_trace

    SNAPSHOTS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "pytorch-snapshots"


    @pytest.mark.shared
    def test_opens_a_shared_file_by_path():
        read_trace(SNAPSHOTS / "MAGMA27__memory_snapshot.pickle")


    def test_needs_nothing_shared():
        assert True
''')


def test_a_shared_test_skips_where_the_shared_folder_is_absent(tmp_path):
    clone = tmp_path / "clone"                 # tmp_path/shared does not exist
    (clone / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", clone / "tests" / "conftest.py")
    (clone / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (clone / "tests" / "test_uses_shared.py").write_text(SHARED_TEST, encoding="utf-8")
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")     # the markers and the default options
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=clone,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "shared data folder" in proc.stdout and "is absent" in proc.stdout
