"""User-facing errors found by trying the CLI as a new user would: each is one clear line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.cli import main as cli_main
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder
from allocsim.units import MiB

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def trace_file(tmp_path) -> Path:
    b = TraceBuilder("t", "test")
    b.alloc(0, 1000, 0, 0, 0x1000, 3 * MiB)
    b.free(1, 2000, 0, 0, 0x1000)
    path = tmp_path / "t.parquet"
    write_trace(b.finish(), path)
    return path


def one_line_error(capsys, *argv) -> str:
    code = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("target, message", [
    ("missing/out.parquet", "folder {tmp}/missing does not exist; create it first"),
    ("out.txt", "unknown extension; name the output .parquet, .csv or .csv.gz"),
    (".", "unknown extension"),
])
def test_convert_refuses_an_output_it_cannot_write(tmp_path, capsys, trace_file, target, message):
    err = one_line_error(capsys, "convert", trace_file, "-o", tmp_path / target)
    assert message.replace("{tmp}", str(tmp_path)) in err
    assert not (tmp_path / "out.txt").exists()


def test_convert_into_a_directory_named_like_a_file(tmp_path, capsys, trace_file):
    (tmp_path / "d.parquet").mkdir()
    assert "is a directory" in one_line_error(capsys, "convert", trace_file, "-o", tmp_path / "d.parquet")


def test_convert_still_writes_every_supported_extension(tmp_path, capsys, trace_file):
    for name in ("a.parquet", "b.csv", "c.csv.gz"):
        assert cli_main(["convert", str(trace_file), "-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 0
    capsys.readouterr()


def test_winners_on_a_missing_damaged_or_directory_results_file(tmp_path, capsys):
    err = one_line_error(capsys, "winners", tmp_path / "nope.parquet")
    assert "nope.parquet: no such file" in err
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"junk")
    assert "not a Parquet results file" in one_line_error(capsys, "winners", junk)
    assert "is a directory" in one_line_error(capsys, "winners", tmp_path)


def test_policies_never_prints_none_bytes(capsys):
    assert cli_main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "max_split_size                 = none  (int)" in out
    assert "max_non_split_rounding         = 20MiB" in out and "alignment                      = 512 bytes" in out
    assert cli_main(["policies", "--json"]) == 0
    params = {p["name"]: p for spec in json.loads(capsys.readouterr().out)["policies"] for p in spec["params"]}
    assert params["max_split_size"]["default"] is None   # JSON keeps null


@pytest.mark.full
def test_python_dash_m_convert_never_prints_a_traceback(tmp_path, trace_file):
    proc = subprocess.run([sys.executable, "-m", "allocsim", "convert", str(trace_file), "-o",
                           str(tmp_path / "no" / "dir" / "x.parquet")], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
