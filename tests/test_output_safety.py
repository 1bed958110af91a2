"""Every writer goes through the one output check and never follows a link (issue 40, round 4).

``run -o DIR`` and ``plot -o DIR`` replace only the files they write with the mark docs/output.md
promises (a table: ``allocsim.table``), not any allocsim Parquet: a user's capture named
``timeseries.parquet`` is left alone. No link inside an ``-o`` folder, dangling or not, is written
through (``run``, ``plot``, ``fit``, ``report``, ``convert``, ``capture``): the check refuses it, and
what appears while a command works (a link, a FIFO, a user's file at the name) is refused when the
output is moved into place (``output_file.open_output``), the finished output kept and named.
The ``validate`` tools follow the same rules, with one-line errors.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from allocsim.trace import read_trace, write_trace
from tests.attack_files import valid_snapshot


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    """A small allocsim trace (from a snapshot)."""
    folder = tmp_path_factory.mktemp("trace")
    path, _ = valid_snapshot(folder, random.Random(5))
    out = folder / "t.parquet"
    write_trace(read_trace(str(path)), out)
    return out


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------ marks: run -o and plot -o
@pytest.mark.parametrize("command", ["run", "plot"])
def test_folder_outputs_leave_a_users_allocsim_trace_and_sweep_file_alone(cli, tmp_path, trace_file, command):
    out = tmp_path / "out"
    out.mkdir()
    users = out / "timeseries.parquet"
    users.write_bytes(trace_file.read_bytes())           # the user's own capture, under that name
    argv = ["run", trace_file, "--policy", "pytorch", "-o", out] if command == "run" else \
        ["plot", trace_file, "-o", out]
    code, _, err = cli(*argv)
    assert code == 2 and "timeseries.parquet exists and is not a file allocsim wrote" in _one_line(err)
    assert users.read_bytes() == trace_file.read_bytes()
    # a sweep results file (allocsim.sweep) is not a table either
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({b"allocsim.sweep": b"{}"}), users)
    assert cli(*argv)[0] == 2
    if command == "plot":
        return              # (plot writes its tables as run does; drawing twice costs seconds)
    # the table allocsim wrote there is replaced
    users.unlink()
    assert cli(*argv)[0] in (0, 1)
    assert cli(*argv)[0] in (0, 1), "a second run replaces its own files"
    assert b"allocsim.table" in pq.read_schema(users).metadata


# ------------------------------------------------------------------------ links inside -o
def _dangling(tmp_path: Path, at: Path) -> Path:
    outside = tmp_path / "outside" / "victim.txt"
    outside.parent.mkdir(exist_ok=True)
    at.symlink_to(outside)
    return outside


def test_run_and_plot_never_write_through_a_link_in_their_folder(cli, tmp_path, trace_file):
    out = tmp_path / "out"
    out.mkdir()
    outside = _dangling(tmp_path, out / "summary.json")
    for argv in (["run", trace_file, "--policy", "pytorch", "-o", out], ["plot", trace_file, "-o", out]):
        code, _, err = cli(*argv)
        assert code == 2 and "summary.json is a symbolic link" in _one_line(err), err
        assert not outside.exists()
    # a link to a real file outside is not written through either
    (out / "summary.json").unlink()
    outside.write_text("keep")
    (out / "perf.json").symlink_to(outside)
    assert cli("run", trace_file, "--policy", "pytorch", "-o", out)[0] == 2
    assert outside.read_text() == "keep"


def test_plot_per_policy_folder_that_is_a_link_is_refused(cli, tmp_path, trace_file):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir(), elsewhere.mkdir()
    (out / "pytorch").symlink_to(elsewhere, target_is_directory=True)
    code, _, err = cli("plot", trace_file, "--policy", "pytorch", "--policy", "direct", "-o", out)
    assert code == 2 and "pytorch" in _one_line(err) and "link" in err
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("argv_of", [
    lambda t, o: ["report", t, "-o", o / "page.html"],
    lambda t, o: ["convert", t, "-o", o / "copy.parquet"],
    lambda t, o: ["capture", "-o", o / "copy.parquet", "--", "python", t.parent / "noop.py"],
], ids=["report", "convert", "capture"])
def test_file_outputs_refuse_a_link_at_their_name(cli, tmp_path, trace_file, argv_of):
    (trace_file.parent / "noop.py").write_text("pass\n")
    argv = argv_of(trace_file, tmp_path)
    target = Path(argv[argv.index("-o") + 1])
    outside = _dangling(tmp_path, target)
    code, _, err = cli(*argv)
    assert code == 2 and "is a symbolic link" in err and not outside.exists(), err


def test_fit_refuses_a_link_in_its_folder_before_any_capture(cli, tmp_path):
    out = tmp_path / "fit"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text("import sys\n")
    outside = _dangling(tmp_path, out / "train.B4.rtx-4090.parquet")
    code, _, err = cli("fit", "--gpu", "RTX 4090", "-o", out, "--", "python", script, "--batch", "{B}")
    assert code == 2 and "train.B4.rtx-4090.parquet: is a symbolic link" in _one_line(err)
    assert not outside.exists() and sorted(p.name for p in out.iterdir()) == ["train.B4.rtx-4090.parquet"]


# ------------------------------------------------------------------------ what appears while working
@pytest.mark.parametrize("appears", ["link", "fifo", "users file"])
def test_what_appears_at_the_name_while_writing_is_refused_and_the_output_kept(tmp_path, appears):
    from allocsim.output_file import OutputKept, open_output

    target, outside = tmp_path / "out.json", tmp_path / "outside.txt"
    with pytest.raises(OutputKept) as info:
        with open_output(target, ours=lambda p: False, text=True) as fh:
            fh.write("the output\n")
            if appears == "link":
                target.symlink_to(outside)
            elif appears == "fifo":
                os.mkfifo(target)
            else:
                target.write_text("the user's\n")
    kept = Path(str(info.value).rsplit("kept as ", 1)[1].rstrip(")"))
    assert kept.parent == tmp_path and kept.read_text() == "the output\n"
    assert not outside.exists()
    if appears == "users file":
        assert target.read_text() == "the user's\n"


def test_open_output_replaces_its_own_file_and_cleans_up_on_error(tmp_path):
    from allocsim.output_file import open_output, write_output

    target = tmp_path / "x.txt"
    write_output(target, "one")
    write_output(target, "two", ours=lambda p: Path(p).read_text() == "one")
    assert target.read_text() == "two"
    with pytest.raises(RuntimeError):
        with open_output(target) as fh:
            fh.write(b"partial")
            raise RuntimeError("stop")
    assert target.read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]
    (tmp_path / "sub").symlink_to(tmp_path.parent, target_is_directory=True)
    with pytest.raises(ValueError, match="symbolic link"):
        write_output(tmp_path / "sub" / "y.txt", "no", within=tmp_path)
    assert not (tmp_path.parent / "y.txt").exists()


# ------------------------------------------------------------------------ validate's writers
@pytest.fixture
def validate_cli(capsys):
    """``python -m validate ARGV`` / ``python -m validate.report ARGV`` in this process: (status, stderr)."""
    def run(module: str, *argv) -> tuple[int, str]:
        if module == "validate":
            from validate.__main__ import main
        else:
            from validate.report import main
        code = main([str(a) for a in argv])
        return code, capsys.readouterr().err

    return run


def test_validate_calibrate_output_is_checked_before_measuring(tmp_path, validate_cli, monkeypatch):
    from validate import calibrate_cmd

    monkeypatch.setattr(calibrate_cmd, "calibrate", lambda *a, **k: pytest.fail("measured before checking -o"))
    users = tmp_path / "notes.json"
    users.write_text('{"mine": 1}\n')
    os.mkfifo(tmp_path / "fifo.json")
    for target, why in ((users, "exists and is not a cost model"), (tmp_path / "fifo.json", "FIFO"),
                        (tmp_path / "missing" / "c.json", "does not exist"), (tmp_path, "is a directory")):
        code, err = validate_cli("validate", "calibrate", "--quick", "-o", target)
        assert code == 2 and why in _one_line(err), err
    assert users.read_text() == '{"mine": 1}\n' and not (tmp_path / "missing").exists()


def test_validate_calibrate_default_is_the_current_folder(tmp_path, monkeypatch):
    from allocsim.cost import CostModel
    from validate import calibrate_cmd

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(calibrate_cmd, "calibrate", lambda *a, **k: (
        CostModel(), {"_granularity_bytes": 4096, "_small_granularity_bytes": 4096, "_seconds": 0}))
    parser = __import__("validate.__main__", fromlist=["build_parser"]).build_parser()
    assert calibrate_cmd.main(parser.parse_args(["calibrate", "--quick"])) == 0
    written = tmp_path / "calibration-host.json"
    assert json.loads(written.read_text())["_format"].startswith("allocsim-cost-model")
    # its own file is replaced on a second run
    assert calibrate_cmd.main(parser.parse_args(["calibrate", "--quick"])) == 0


def test_validate_report_merge_refuses_and_explains(tmp_path, validate_cli):
    good = tmp_path / "good"
    good.mkdir()
    (good / "results.json").write_text(json.dumps({"schema": "allocsim-validate/1", "runs": []}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("my notes\n")

    def merge(*argv):
        return validate_cli("validate.report", "merge", *argv)

    code, err = merge(good, "-o", out)
    assert code == 2 and "report.md exists and is not a file allocsim wrote" in _one_line(err)
    assert (out / "report.md").read_text() == "my notes\n"
    cases = {"bad.json": ("{not json", "not valid JSON"),
             "runs.json": (json.dumps({"runs": {"a": 1}}), "'runs' is dict, not a list"),
             "record.json": (json.dumps({"runs": [{"trace": {"events": 1, "allocs": 1}}, 5]}), "runs[1]: not an object")}
    for name, (text, why) in cases.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / "results.json").write_text(text)
        code, err = merge(folder, "-o", tmp_path / "fresh")
        line = _one_line(err)
        assert code == 2 and str(folder / "results.json") in line and why in line, line
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert "is a file, not a result folder" in _one_line(merge(a_file, "-o", tmp_path / "fresh")[1])
    assert "does not exist" in _one_line(merge(good, "-o", tmp_path / "no" / "such")[1])
    assert not (tmp_path / "fresh").exists() and not (tmp_path / "no").exists()
    assert merge(good, "-o", tmp_path / "fresh")[0] == 0
    assert merge(good, "-o", tmp_path / "fresh")[0] == 0, "its own files are replaced"
    assert (tmp_path / "fresh" / "report.md").read_text().startswith("# allocsim validation")


def test_a_live_output_grows_at_its_name_and_never_through_a_link(tmp_path):
    """A log fit writes while the script runs: at its own name from the start, created anew."""
    from allocsim.output_file import open_output

    log, outside = tmp_path / "x.log", tmp_path / "outside.txt"
    with open_output(log, text=True, live=True) as fh:
        fh.write("line\n")
        fh.flush()
        assert log.read_text() == "line\n"            # followable while it is written
    with open_output(log, ours=lambda p: Path(p).read_text().startswith("line"), text=True, live=True) as fh:
        fh.write("again\n")
    assert log.read_text() == "again\n"
    log.unlink()
    log.symlink_to(outside)
    with pytest.raises(ValueError, match="symbolic link"):
        with open_output(log, text=True, live=True):
            pass
    assert not outside.exists()
