"""Every notebook takes its input file(s) as one papermill-style parameter cell and holds on other real files too.

The first code cell of each notebook is tagged ``parameters`` and assigns only the inputs; the code uses the
public API only (``allocsim.api``, plots from ``allocsim.plots``). Each notebook's assertions are invariants,
so they hold on a real file its text never quotes: papermill's injection (a cell right after the parameters)
gives it one from ``../shared/traces``.
"""

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
KERNEL = "allocsim-test-params"
SNAPSHOTS = "traces/pytorch-snapshots"
SERIES = "traces/scale-series"

#: notebook -> its parameters, in order
PARAMETERS = {
    "01_where_did_my_memory_go.ipynb": ["TRACE_PATH"],
    "02_paddle_articles_checked.ipynb": ["TRACES", "PADDLE_TRACES"],
    "03_tuning_pytorch_on_a_snapshot.ipynb": ["TRACE_PATH"],
    "04_fixing_an_oom.ipynb": ["TRACE_PATH"],
    "05_will_it_fit.ipynb": ["CAPTURES", "SCALE_NAME", "DEVICE", "MIXED_PAIR", "SERIES"],
}


def parameters_cell(nb) -> int:
    [index] = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    return index


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_the_inputs_are_one_parameter_cell_at_the_top_and_only_the_public_api_is_used(name):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    index = parameters_cell(nb)
    assert [c.cell_type for c in nb.cells[:index]] == ["markdown"]           # the first code cell
    assignments = re.findall(r"^(\w+)\s*=", nb.cells[index].source, flags=re.M)
    assert assignments == PARAMETERS[name]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    modules = set(re.findall(r"^\s*(?:from|import) (allocsim[\w.]*)", code, flags=re.M))
    assert "allocsim.api" in modules and modules <= {"allocsim.api", "allocsim.plots"}, modules
    assert "allocsim." not in re.sub(r"(?:from|import) allocsim\.(?:api|plots)\b", "", code)


#: Parameters whose defaults are the shared snapshots: optional parts, skipped with a note where ../shared is absent.
SHARED_PARTS = {"05_will_it_fit.ipynb": {"MIXED_PAIR", "SERIES"}}


def default_files(name: str) -> dict[str, list[str]]:
    """Each parameter of ``name`` -> the file paths its default names (the parameter cell run on its own)."""
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    values: dict = {}
    exec(nb.cells[parameters_cell(nb)].source, values)          # assignments only (checked above)
    out = {}
    for key in PARAMETERS[name]:
        value = values[key]
        paths = value.values() if isinstance(value, dict) else [value]
        out[key] = [p for p in paths if isinstance(p, str) and "/" in p]
    return out


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_every_default_input_is_a_file_of_the_repository(name):
    """A fresh clone runs every notebook as committed: the defaults are shipped traces, not ../shared."""
    root = NOTEBOOKS_DIR.parent.resolve()
    for key, paths in default_files(name).items():
        if key in SHARED_PARTS.get(name, set()):
            continue
        for path in paths:
            full = (NOTEBOOKS_DIR / path).resolve()
            assert full.is_relative_to(root) and full.is_file(), f"{name}: {key} defaults to {path}, not a file of the repository"


#: A figure the text would quote from one file: a decimal with a unit, a percentage, a bold number.
QUOTED_FIGURE = re.compile(r"\d+\.\d+\s?(?:[KMGT]i?B|ms|µs|s\b)|\d\s?%|\*\*[^*\n]*?\d[^*\n]*?\*\*|\d,\d{3}")


@pytest.mark.parametrize("name", ["03_tuning_pytorch_on_a_snapshot.ipynb", "04_fixing_an_oom.ipynb"])
def test_the_text_quotes_no_figures_of_one_file(name):
    """Run on a user's file, the text must not show the default file's numbers beside theirs: the cells print them."""
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    quoted = [m.group(0) for c in nb.cells if c.cell_type == "markdown" for m in QUOTED_FIGURE.finditer(c.source)]
    assert not quoted, f"{name} quotes {quoted}"


def execute_with(name: str, values: dict, tmp_path: Path, monkeypatch) -> str:
    """Run ``name`` with ``values`` injected after its parameter cell; return what it printed."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "allocsim tests", "language": "python",
        "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    injected = "\n".join(f"{key} = {value!r}" for key, value in values.items())
    nb.cells.insert(parameters_cell(nb) + 1, nbformat.v4.new_code_cell(injected))
    nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300,     # per cell: find-max on GPU series takes a while
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name,snapshot", [("03_tuning_pytorch_on_a_snapshot.ipynb", "MercuryB1__cuda_memory_snapshot.pickle"),
                                           ("04_fixing_an_oom.ipynb", "Maphsge4__snapshot.pickle")])
def test_notebooks_03_and_04_on_a_snapshot_with_history(name, snapshot, shared_dir, tmp_path, monkeypatch):
    """Their defaults are a profiler trace (no recorded decisions); a snapshot with history takes the other branches."""
    out = execute_with(name, {"TRACE_PATH": str(shared_dir / SNAPSHOTS / snapshot)}, tmp_path, monkeypatch)
    assert out.startswith(f"{snapshot}: ") and "all claims hold" in out and "bert_fp32" not in out
    if name.startswith("04"):
        assert "reproduces the recording" in out and "OUT OF MEMORY" in out


@pytest.mark.slow          # a whole notebook run (the default suite runs it on its own snapshot already)
@pytest.mark.shared
def test_notebook_04_runs_on_another_snapshot(shared_dir, tmp_path, monkeypatch):
    """Its assertions are invariants, so they hold on a snapshot the text never quotes (papermill's injection)."""
    snapshot = shared_dir / SNAPSHOTS / "silmont2000__mem_snapshot.pickle"
    out = execute_with("04_fixing_an_oom.ipynb", {"TRACE_PATH": str(snapshot)}, tmp_path, monkeypatch)
    assert out.startswith("silmont2000__mem_snapshot.pickle: ") and "all claims hold" in out
    assert "bert_fp32" not in out


@pytest.mark.slow
@pytest.mark.shared
def test_notebook_01_runs_on_a_gpu_snapshot(shared_dir, tmp_path, monkeypatch):
    """A real GPU snapshot with a start state (the default is a CPU profiler trace without one)."""
    snapshot = shared_dir / SNAPSHOTS / "Wedsonlin__medium_128_inference_memory_snapshot.pickle"
    out = execute_with("01_where_did_my_memory_go.ipynb", {"TRACE_PATH": str(snapshot)}, tmp_path, monkeypatch)
    assert out.startswith("Wedsonlin__medium_128_inference_memory_snapshot.pickle: ") and "all claims hold" in out
    assert "resident before the window" not in out and "bert" not in out


@pytest.mark.slow
@pytest.mark.shared
def test_notebook_03_runs_on_another_snapshot(shared_dir, tmp_path, monkeypatch):
    snapshot = shared_dir / SNAPSHOTS / "Wedsonlin__medium_128_training_memory_snapshot.pickle"
    out = execute_with("03_tuning_pytorch_on_a_snapshot.ipynb", {"TRACE_PATH": str(snapshot)}, tmp_path, monkeypatch)
    assert out.startswith("Wedsonlin__medium_128_training_memory_snapshot.pickle: ") and "all claims hold" in out
    assert "bert_fp32" not in out


@pytest.mark.slow
@pytest.mark.shared
def test_notebook_05_runs_on_other_series(shared_dir, tmp_path, monkeypatch):
    """GPU snapshots of a 2.7B model at three sequence lengths, another mixed pair and another series."""
    series = shared_dir / SERIES
    charlie = "charliesabino_cs336-assignment2_2.7B-{}-fwd-memory-snapshot{}.pickle"
    values = {"CAPTURES": {v: str(series / charlie.format(v, "")) for v in (128, 256, 512)},
              "SCALE_NAME": "seq", "DEVICE": "40GiB",
              "MIXED_PAIR": {256: str(series / charlie.format(256, "")),
                             512: str(series / charlie.format(512, "_mixed"))},
              "SERIES": {v: str(series / f"yyin-dev_cs336-a2_xl_b4_fwd_ctx_{v}.pickle") for v in (128, 256, 512)}}
    out = execute_with("05_will_it_fit.ipynb", values, tmp_path, monkeypatch)
    assert out.startswith("seq 128: ") and "all claims hold" in out
    assert "the largest seq that fits in 40.00 GiB" in out
    assert "refused: inputs are not one configuration" in out and "512-fwd-memory-snapshot_mixed.pickle" in out
    # The report's limits name every checked series, the default one too; the notebook's own output must not.
    from allocsim.scale.report import LIMITS

    for limit in LIMITS:
        out = out.replace(limit, "")
    assert "bert" not in out and "Hyperion" not in out


@pytest.mark.slow
@pytest.mark.shared
def test_notebook_02_runs_on_gpu_snapshots(shared_dir, tmp_path, monkeypatch):
    """A GPU forward pass recorded in fp32 and bf16 as the PyTorch program; no recompute or accumulation run."""
    snapshots = shared_dir / SNAPSHOTS
    values = {"TRACES": {"fp32": str(snapshots / "silmont2000__memory_forward_fp32_128.pickle"),
                         "bf16": str(snapshots / "silmont2000__memory_forward_bf16_128.pickle"),
                         "recompute": None, "accum": None,
                         "other": str(snapshots / "MAGMA27__memory_snapshot.pickle")}}
    out = execute_with("02_paddle_articles_checked.ipynb", values, tmp_path, monkeypatch)
    assert out.startswith("silmont2000__memory_forward_fp32_128: ") and "all claims hold" in out
    assert "bf16: peak live" in out and "recompute: peak live" not in out and "bert" not in out


@pytest.mark.full
def test_notebook_05_takes_papermill_string_keys_and_an_answer_within_2x(tmp_path, monkeypatch):
    """``papermill -f params.yaml`` gives dict keys as strings; an answer 1.5x the largest input needs no advice.

    Sorted as strings, "64" would be the largest sequence length; the notebook reads the keys as numbers.
    The answer (383 on 1.31 GiB) is past the largest input (256) but within the 2x the leave-one-out
    check covers: the report says how far, without "record an input nearer" (docs/scale.md).
    """
    values = {"CAPTURES": {str(v): f"../traces/scales/bert_b2_s{v}.json.gz" for v in (64, 128, 192, 256)},
              "SCALE_NAME": "seq", "DEVICE": "2600MiB", "MIXED_PAIR": None, "SERIES": None}
    out = execute_with("05_will_it_fit.ipynb", values, tmp_path, monkeypatch)
    assert out.startswith("seq 64: ") and "all claims hold" in out
    assert "seq 383 is 1.5x the largest input (256)\n" in out and "record an input nearer" not in out
    assert "MIXED_PAIR: skipped (not given)" in out and "SERIES: skipped (not given)" in out
