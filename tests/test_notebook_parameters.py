"""Notebook 04 takes its snapshot as one papermill-style parameter and holds on another real snapshot too."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS_DIR / "04_fixing_an_oom.ipynb"
KERNEL = "allocsim-test-params"


def parameters_cell(nb) -> int:
    [index] = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    return index


def test_the_input_file_is_the_one_parameter_at_the_top_and_only_the_public_api_is_used():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    index = parameters_cell(nb)
    assert [c.cell_type for c in nb.cells[:index]] == ["markdown"]           # the first code cell
    assignments = re.findall(r"^(\w+)\s*=", nb.cells[index].source, flags=re.M)
    assert assignments == ["TRACE_PATH"]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    modules = set(re.findall(r"^\s*(?:from|import) (allocsim[\w.]*)", code, flags=re.M))
    assert modules == {"allocsim.api", "allocsim.plots"}


@pytest.mark.slow          # a whole notebook run (CI's full suite runs it on its own snapshot already)
@pytest.mark.shared
def test_notebook_04_runs_on_another_snapshot(shared_dir, tmp_path, monkeypatch):
    """Its assertions are invariants, so they hold on a snapshot the text never quotes (papermill's injection)."""
    snapshot = shared_dir / "traces" / "pytorch-snapshots" / "silmont2000__mem_snapshot.pickle"
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "allocsim tests", "language": "python",
        "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.insert(parameters_cell(nb) + 1, nbformat.v4.new_code_cell(f"TRACE_PATH = {str(snapshot)!r}"))
    nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert out.startswith("silmont2000__mem_snapshot.pickle: ") and "all claims hold" in out
    assert "Maphsge4" not in out
