"""The notebooks are committed executed (they read on a code host without running) and run again here.

Each notebook asserts invariants that hold on any input (parts add up, its figures are ``allocsim run``'s,
orderings), so a change in allocsim that breaks one fails here; ``test_notebook_parameters.py`` runs them
on other real files. Each runs from a temporary copy (the committed file,
with its outputs, is never rewritten by the tests). The kernel is this interpreter (``sys.executable``),
registered under a private name in a temporary ``JUPYTER_PATH``, so the test works in a fresh CI venv
where ``pip install -e '.[test]'`` installed ipykernel and nbclient, whatever kernels the machine has.
Notebooks 04 and 05 need the shared snapshots (``../shared``) and are skipped without them.
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
#: Notebooks that need ../shared (the others fall back to the project's own traces).
NEEDS_SHARED = {"04_fixing_an_oom.ipynb", "05_will_it_fit.ipynb"}
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
def test_notebook_runs_top_to_bottom(name, kernel_env, monkeypatch, tmp_path, request):
    """Every cell of a temporary copy runs without error (their assertions check the conclusions the text states)."""
    if name in NEEDS_SHARED:
        request.getfixturevalue("shared_dir")      # skips cleanly where ../shared is absent
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS_DIR / name, copy)
    nb = execute(copy, NOTEBOOKS_DIR, kernel_env, monkeypatch)
    assert "all claims hold" in printed(nb)


@pytest.mark.full
def test_tuning_notebook_without_the_shared_folder(kernel_env, monkeypatch, tmp_path):
    """Where ../shared is absent, notebook 03 says so and tunes on the project's BERT trace instead."""
    repo = tmp_path / "repo"
    (repo / "traces").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    for name in ("bert_fp32.json.gz", "bert_fp32.meta.json"):
        (repo / "traces" / name).symlink_to(NOTEBOOKS_DIR.parent / "traces" / name)
    nb = execute(NOTEBOOKS_DIR / NOTEBOOKS[2], repo / "notebooks", kernel_env, monkeypatch)
    text = printed(nb)
    assert "is absent: using the project's BERT-base trace instead" in text
    assert "bert_fp32.json.gz: " in text and "all claims hold" in text
