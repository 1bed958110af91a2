"""The notebooks are committed executed (they read on a code host without running) and run again here.

Each notebook asserts invariants that hold on any input (parts add up, its figures are ``allocsim run``'s,
orderings), so a change in allocsim that breaks one fails here; ``test_notebook_parameters.py`` runs them
on other real files. Each runs from a temporary copy (the committed file,
with its outputs, is never rewritten by the tests). The kernel is this interpreter (``sys.executable``),
registered under a private name in a temporary ``JUPYTER_PATH``, so the test works in a fresh CI venv
where ``pip install -e '.[test]'`` installed ipykernel and nbclient, whatever kernels the machine has.
Every notebook's defaults are files of the repository (a fresh clone runs them all); notebook 05's
section on real GPU series uses the shared snapshots (``../shared``) and says it is skipped without them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = ["01_where_did_my_memory_go.ipynb", "02_paddle_articles_checked.ipynb",
             "03_tuning_pytorch_on_a_snapshot.ipynb", "04_fixing_an_oom.ipynb", "05_will_it_fit.ipynb"]
KERNEL = "allocsim-test-python"
#: Seconds one cell may take; a whole notebook must stay under 2 minutes on 2 cores.
CELL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec that runs ipykernel on this very interpreter, found first through JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "allocsim tests", "language": "python",
            "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_executed(name):
    """Every code cell ran, in order, without error, and the committed outputs end with the claims holding."""
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), f"{name} is not executed in order"
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert "all claims hold" in printed(nb)


def execute(path: Path, cwd: Path, kernel_env: Path, monkeypatch) -> "nbformat.NotebookNode":
    """Run the notebook at ``path`` in ``cwd`` on the test kernel; return it with its outputs."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_env))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    return nb


def printed(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.full
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, kernel_env, monkeypatch, tmp_path):
    """Every cell of a temporary copy runs without error (their assertions check the conclusions the text states)."""
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS_DIR / name, copy)
    nb = execute(copy, NOTEBOOKS_DIR, kernel_env, monkeypatch)
    assert "all claims hold" in printed(nb)


@pytest.mark.full
def test_will_it_fit_without_the_shared_folder_skips_only_its_shared_section(kernel_env, monkeypatch, tmp_path):
    """On a fresh clone (no ../shared) notebook 05 runs on its shipped captures and says its GPU-series part is skipped.

    The other notebooks' defaults are files of the repository (``test_notebook_parameters.py`` checks that).
    """
    repo = tmp_path / "repo"                       # tmp_path/shared does not exist
    (repo / "notebooks").mkdir(parents=True)
    (repo / "traces").symlink_to(NOTEBOOKS_DIR.parent / "traces")
    text = printed(execute(NOTEBOOKS_DIR / NOTEBOOKS[4], repo / "notebooks", kernel_env, monkeypatch))
    assert text.startswith("batch 1: ") and "all claims hold" in text
    for part in ("MIXED_PAIR", "SERIES"):
        assert f"{part}: skipped (../../shared/traces/scale-series/" in text
    assert "is absent: ../shared is not beside the repository)" in text and "refused:" not in text
