"""No verdict from a partial trace: a trace whose script stopped early says so in every verdict, and exits 4.

The traces here are small programs (``tests.test_scale.program_events``) marked incomplete the way
``allocsim capture`` marks one (``TraceMeta.incomplete``); ``test_capture_incomplete.py`` makes the
marks with real captures of every way a script can stop early.
"""

from __future__ import annotations

import json

import pytest

from allocsim.cli import main
from allocsim.errors import TraceFormatError
from allocsim.metrics.verdict import EXIT_INCOMPLETE
from allocsim.trace import read_trace, write_trace
from allocsim.trace.inference.completeness import MAX_REASON_CHARS
from tests.test_scale import program_events, write_kineto

REASON = "the script raised ValueError: bad batch; 1 optimizer step recorded"


def _marked(tmp_path, value: int, reason: str = REASON, suffix: str = ".parquet") -> str:
    trace = read_trace(write_kineto(tmp_path / f"p{value}.json.gz", program_events(value)))
    trace.meta.incomplete = reason
    out = str(tmp_path / f"p{value}.stopped{suffix}")
    write_trace(trace, out)
    return out


@pytest.fixture
def stopped(tmp_path) -> str:
    return _marked(tmp_path, 2)


@pytest.fixture
def complete(tmp_path) -> str:
    trace = read_trace(write_kineto(tmp_path / "c2.json.gz", program_events(2)))
    out = str(tmp_path / "c2.parquet")
    write_trace(trace, out)
    return out


# ------------------------------------------------------------------------------------ trace layer
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_the_reason_travels_in_the_file(tmp_path, suffix):
    assert read_trace(_marked(tmp_path, 2, suffix=suffix)).meta.incomplete == REASON


def test_a_kineto_trace_is_complete(tmp_path):
    assert read_trace(write_kineto(tmp_path / "k.json.gz", program_events(2))).meta.incomplete == ""


def test_a_capture_written_before_the_field_is_read_from_its_note(tmp_path):
    trace = read_trace(write_kineto(tmp_path / "k.json.gz", program_events(2)))
    trace.meta.version_hints["capture"] = "cuda on meta"
    trace.meta.notes.append("incomplete: stopped after --timeout 5 s")
    write_trace(trace, str(tmp_path / "old.parquet"))
    assert read_trace(str(tmp_path / "old.parquet")).meta.incomplete == "stopped after --timeout 5 s"
    # the same note in a trace that is not a capture is a note, not a verdict
    del trace.meta.version_hints["capture"]
    write_trace(trace, str(tmp_path / "other.parquet"))
    assert read_trace(str(tmp_path / "other.parquet")).meta.incomplete == ""


def test_a_reason_that_is_not_text_is_a_format_error_and_a_long_one_is_cut(tmp_path):
    trace = read_trace(write_kineto(tmp_path / "k.json.gz", program_events(2)))
    trace.meta.incomplete = ["not", "text"]
    write_trace(trace, str(tmp_path / "bad.parquet"))
    with pytest.raises(TraceFormatError, match="incomplete"):
        read_trace(str(tmp_path / "bad.parquet"))
    long = read_trace(_marked(tmp_path, 2, "x\n" * 5000)).meta.incomplete
    assert len(long) == MAX_REASON_CHARS and "\n" not in long


# ------------------------------------------------------------------------------------ commands
def test_run_says_so_in_the_verdict_and_exits_4(cli, stopped, complete):
    code, out, err = cli("run", stopped, "--policy", "pytorch", "--fast", "--capacity", "80GiB")
    last = out.strip().splitlines()[-1]
    assert code == EXIT_INCOMPLETE
    assert last.startswith(f"INCOMPLETE TRACE ({REASON}); judged on the part recorded: FITS in 80.00 GiB")
    assert "--allow-incomplete" in err
    code, out, _ = cli("run", stopped, "--policy", "pytorch", "--fast", "--capacity", "80GiB", "--allow-incomplete")
    assert code == 0 and out.strip().splitlines()[-1].startswith("INCOMPLETE TRACE (")
    code, out, _ = cli("run", complete, "--policy", "pytorch", "--fast", "--capacity", "80GiB")
    assert code == 0 and out.strip().splitlines()[-1].startswith("FITS in 80.00 GiB")


def test_run_json_carries_incomplete_and_the_reason(cli, stopped, complete):
    code, out, _ = cli("run", stopped, "--policy", "pytorch", "--fast", "--json")
    data = json.loads(out)
    assert code == EXIT_INCOMPLETE
    assert data["incomplete"] is True and data["incomplete_reason"] == REASON
    assert data["verdict"]["incomplete"] is True and data["verdict"]["line"].startswith("INCOMPLETE TRACE (")
    code, out, _ = cli("run", complete, "--policy", "pytorch", "--fast", "--json")
    assert code == 0 and "incomplete" not in json.loads(out) and "incomplete" not in json.loads(out)["verdict"]


def test_run_out_of_memory_on_a_partial_trace(cli, stopped):
    code, out, _ = cli("run", stopped, "--policy", "pytorch", "--fast", "--capacity", "8KiB")
    assert code == EXIT_INCOMPLETE and "judged on the part recorded: " in out.strip().splitlines()[-1]
    code, _, _ = cli("run", stopped, "--policy", "pytorch", "--fast", "--capacity", "8KiB", "--allow-incomplete")
    assert code == 3


def test_run_gpu_verdict_says_so_first(cli, stopped):
    code, out, _ = cli("run", stopped, "--policy", "pytorch", "--fast", "--gpu", "H100")
    assert code == EXIT_INCOMPLETE
    assert out.strip().splitlines()[-1].startswith(f"INCOMPLETE TRACE ({REASON}); judged on the part recorded: FITS on H100")


def test_advise_says_so_in_its_last_line(cli, stopped, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSIM_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = cli("advise", stopped, "--capacity", "80GiB", "--fast", "--workers", "1")
    assert code == EXIT_INCOMPLETE and "--allow-incomplete" in err
    assert out.strip().splitlines()[-1].startswith(f"INCOMPLETE TRACE ({REASON}); judged on the part recorded: FITS")
    code, out, _ = cli("advise", stopped, "--capacity", "80GiB", "--fast", "--workers", "1", "--json",
                       "--allow-incomplete")
    data = json.loads(out)
    assert code == 0 and data["incomplete"] is True and data["incomplete_reason"] == REASON


def test_report_writes_the_page_with_marked_verdicts_and_exits_4(cli, stopped, tmp_path):
    page = tmp_path / "r.html"
    code, out, _ = cli("report", stopped, "--capacity", "80GiB", "-o", page)
    assert code == EXIT_INCOMPLETE
    assert out.splitlines()[0].startswith(f"pytorch: INCOMPLETE TRACE ({REASON})")
    assert "INCOMPLETE TRACE" in page.read_text()
    code, _, _ = cli("report", stopped, "--capacity", "80GiB", "-o", page, "--allow-incomplete")
    assert code == 0


def test_scale_from_a_partial_input_predicts_a_partial_trace(cli, tmp_path):
    a = write_kineto(tmp_path / "p1.json.gz", program_events(1))
    b = _marked(tmp_path, 2)
    out = tmp_path / "p8.parquet"
    code, text, err = cli("scale", f"{a}@1", f"{b}@2", "--to", "8", "-o", out)
    assert code == EXIT_INCOMPLETE and "--allow-incomplete" in err
    assert text.strip().splitlines()[-1].startswith("INCOMPLETE TRACE (predicted from ")
    predicted = read_trace(str(out)).meta.incomplete
    assert predicted.startswith(f"predicted from {b}@2, which stops early: ") and REASON in predicted
    # the prediction carries it on: run on it says so too
    code, text, _ = cli("run", out, "--policy", "pytorch", "--fast", "--capacity", "80GiB")
    assert code == EXIT_INCOMPLETE and text.strip().splitlines()[-1].startswith("INCOMPLETE TRACE (predicted from ")
    code, text, _ = cli("scale", f"{a}@1", f"{b}@2", "--to", "8", "-o", out, "--json", "--allow-incomplete")
    assert code == 0 and json.loads(text)["incomplete"] is True


def test_scale_find_max_from_a_partial_input(cli, tmp_path):
    a = write_kineto(tmp_path / "p1.json.gz", program_events(1))
    b = _marked(tmp_path, 2)
    code, text, _ = cli("scale", f"{a}@1", f"{b}@2", "--capacity", "1GiB", "--find-max", "--no-advise",
                        "--max-value", "64")
    assert code == EXIT_INCOMPLETE
    assert text.strip().splitlines()[-1].startswith("INCOMPLETE TRACE (predicted from ")
    assert "judged on the part recorded: the largest batch that fits is " in text


def test_info_names_the_reason(cli, stopped):
    code, out, _ = cli("info", stopped)
    assert code == 0 and f"incomplete                     {REASON}" in out
    code, out, _ = cli("info", stopped, "--json")
    assert json.loads(out)["incomplete"] == REASON
