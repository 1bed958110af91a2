"""Attack suite: every CLI command on hostile and valid files, in a subprocess under a memory cap.

Each run must end with exit 0, 1, 2 or 3, no traceback, a one-line error naming the file when it
fails, peak RSS within the cap, and on valid files the numbers of an independent recount. CI runs
one file per class of attack; ``pytest -m slow tests/test_attack.py`` runs every generator with
several seeds plus a hypothesis search over valid files (see the README, "Limits and untrusted input").
"""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError
from allocsim.trace.limits import iter_chunks, open_binary, read_bytes
from tests.attack_files import HOSTILE, OUTPUT_TARGETS, VALID, _member, nested_ops_kineto

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CAP_BYTES = 4 << 30
TIME_LIMIT_S = 120
_CLI = "import sys; from allocsim.cli import main; sys.exit(main())"
_VALIDATE = "import sys, runpy; sys.argv[0] = 'validate'; runpy.run_module('validate', run_name='__main__')"


def commands(path: Path, out_dir: Path) -> dict[str, list[str]]:
    """Every command that reads a trace, as argv lists."""
    return {
        "info": ["-c", _CLI, "info", str(path), "--json"],
        "run pytorch": ["-c", _CLI, "run", str(path), "--policy", "pytorch", "--fast"],
        "run bestfit": ["-c", _CLI, "run", str(path), "--policy", "bestfit", "--fast"],
        "convert": ["-c", _CLI, "convert", str(path), "-o", str(out_dir / "out.parquet")],
        "validate snapshot": ["-c", _VALIDATE, "snapshot", str(path)],
    }


def run_capped(argv: list[str]) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS bytes of the process and its children)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=cap, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        timer = threading.Timer(TIME_LIMIT_S, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"), \
            usage.ru_maxrss * 1024


def check_run(name: str, path: Path, argv: list[str], expected: dict | None) -> None:
    code, out, err, rss = run_capped(argv)
    where = f"{name} on {path.name}"
    assert code in (0, 1, 2, 3), f"{where}: exit {code} (killed or crashed)\n{err[-2000:]}"
    assert "Traceback" not in err, f"{where}: traceback\n{err[-3000:]}"
    assert rss <= MEMORY_CAP_BYTES, f"{where}: peak RSS {rss} bytes"
    if code == 2:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1, f"{where}: error is not one line:\n{err[-2000:]}"
        assert path.name in lines[0], f"{where}: error does not name the file: {lines[0]}"
        assert len(lines[0]) < 1000, f"{where}: error line of {len(lines[0])} characters"
    if expected is not None and name == "info":
        assert code == 0, f"{where}: a valid file failed: {err}"
        summary = json.loads(out)
        for key, value in expected.items():
            assert summary[key] == value, f"{where}: {key} {summary[key]} != recount {value}"


def _cases(seeds: int):
    for cls, generators in HOSTILE.items():
        for gen_name, gen in generators.items():
            for seed in range(seeds):
                yield pytest.param(cls, gen_name, gen, seed, id=f"{cls}-{gen_name}-{seed}")


# One generator per class in CI (a few seconds per CLI run); all of them, several seeds, under -m slow.
_CI_PICK = {"decompression bomb": "json.gz", "amplification": "empty containers",
            "quadratic structure": "address collisions", "traceback": "settings types",
            "wrong numbers": "wrapping sums", "messages": "huge string"}
_CI_COMMANDS = ("info", "run pytorch")
#: Classes whose every generator runs in CI, with ``info`` only (their files carry the recount to match).
_CI_ALL_INFO = ("gzip members", "bombs round 2")


@pytest.mark.parametrize("cls, gen_name, gen, seed",
                         [c for c in _cases(1) if _CI_PICK.get(c.values[0]) == c.values[1]])
def test_hostile_files_ci(tmp_path, cls, gen_name, gen, seed):
    path, expected = gen(tmp_path, random.Random(seed))
    for name in _CI_COMMANDS:
        check_run(name, path, commands(path, tmp_path)[name], expected)


@pytest.mark.parametrize("cls, gen_name, gen, seed", [c for c in _cases(1) if c.values[0] in _CI_ALL_INFO])
def test_round2_files_ci(tmp_path, cls, gen_name, gen, seed):
    path, expected = gen(tmp_path, random.Random(seed))
    check_run("info", path, commands(path, tmp_path)["info"], expected)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_files_ci(tmp_path, kind):
    path, expected = VALID[kind](tmp_path, random.Random(1))
    for name, argv in commands(path, tmp_path).items():
        check_run(name, path, argv, expected)


@pytest.mark.slow
@pytest.mark.parametrize("cls, gen_name, gen, seed", list(_cases(3)))
def test_hostile_files_all_commands(tmp_path, cls, gen_name, gen, seed):
    path, expected = gen(tmp_path, random.Random(seed))
    for name, argv in commands(path, tmp_path).items():
        check_run(name, path, argv, expected)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(sorted(VALID)), seed=st.integers(0, 1 << 30))
def test_valid_files_recount(kind, seed):
    with tempfile.TemporaryDirectory() as folder:
        path, expected = VALID[kind](Path(folder), random.Random(seed))
        for name, argv in commands(path, Path(folder)).items():
            check_run(name, path, argv, expected)


# ------------------------------------------------------------------------------- the bounded gzip reader
_payloads = st.tuples(st.binary(min_size=1, max_size=48), st.integers(0, 60_000)).map(lambda t: t[0] * t[1])
_members = st.lists(st.tuples(_payloads, st.sampled_from([0, 0, 0, 1, 4096, (1 << 20) - 37]),
                              st.sampled_from([0, 0, 1, 7])), min_size=1, max_size=5)


def _gzip_file(members) -> bytes:
    """Concatenated members, some with a header comment (to move member ends across the 1 MiB read
    step) and some followed by zero padding, which ``gzip -d`` skips."""
    return b"".join(_member(payload, comment) + b"\0" * zeros for payload, comment, zeros in members)


def _read_three_ways(path: Path) -> list[bytes]:
    with open_binary(str(path)) as fh:
        small_reads = []
        while chunk := fh.read(65_521):
            small_reads.append(chunk)
    return [read_bytes(str(path)), b"".join(iter_chunks(str(path))), b"".join(small_reads)]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(members=_members, cut=st.one_of(st.none(), st.floats(0.05, 0.999)))
def test_gzip_reader_matches_gzip_decompress(members, cut):
    """The bounded reader inflates every member exactly once, as ``gzip.decompress`` does, and
    refuses a file cut short (member data or trailer missing) as ``gzip.decompress`` does."""
    data = _gzip_file(members)
    if cut is not None:
        data = data[:max(1, int(len(data) * cut))]
    try:
        expected = gzip.decompress(data)
    except (EOFError, OSError, zlib.error):
        expected = None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.gz"
        path.write_bytes(data)
        if expected is None or not expected:
            with pytest.raises(TraceFormatError):
                read_bytes(str(path))
            return
        assert _read_three_ways(path) == [expected] * 3


# ------------------------------------------------------------------------------- what -o names
def _output_commands(trace: str, target: str) -> dict[str, list[str]]:
    return {"sweep": ["sweep", trace, "--policy", "pytorch", "--fast", "-o", target],
            "advise": ["advise", trace, "--fast", "--capacity", "8GiB", "-o", target],
            "convert": ["convert", trace, "-o", target],
            "run": ["run", trace, "--policy", "pytorch", "--fast", "-o", target],
            "validate replay": ["replay", trace, "--policy", "pytorch", "--backend", "host", "-o", target]}


@pytest.mark.parametrize("target_name", sorted(OUTPUT_TARGETS))
@pytest.mark.parametrize("command", ["sweep", "advise", "convert", "run", "validate replay"])
def test_output_targets_are_refused_untouched(tmp_path, capsys, command, target_name):
    """Every ``-o`` refuses a device, FIFO, missing folder, unwritable folder or a file it did not write,
    with one line naming the path, before any work, and leaves the target as it was."""
    from allocsim.cli import main as cli_main
    from validate.__main__ import main as validate_main

    trace, _ = VALID["rmm"](tmp_path, random.Random(3))
    target, untouched = OUTPUT_TARGETS[target_name](tmp_path)
    if command == "run" and target_name == "foreign file":
        target = str(Path(target).with_suffix(""))      # run -o names a folder: a file in its place
        Path(target).write_bytes(b"precious")
        untouched = lambda: Path(target).read_bytes() == b"precious"  # noqa: E731
    argv = _output_commands(str(trace), target)[command]
    code = (validate_main if command == "validate replay" else cli_main)(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"-o {target}:" in lines[0], err
    assert untouched(), f"{command} changed {target}"


def test_results_file_is_replaced_only_when_ours(tmp_path):
    """The last check, at the rename: a results file may be replaced, anything else may not."""
    from allocsim.sweep.results import read_metadata, write_results

    path = tmp_path / "r.parquet"
    write_results([{"trace": "t", "x": 1}], path, complete=False, expected_rows=2)
    write_results([{"trace": "t", "x": 2}], path, complete=True, expected_rows=1)
    assert read_metadata(path)["complete"] is True
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), other)
    before = other.read_bytes()
    with pytest.raises(ValueError, match="not an allocsim results file"):
        write_results([{"trace": "t"}], other, complete=True, expected_rows=1)
    assert other.read_bytes() == before


# ------------------------------------------------------------------------------- convert reads back
def test_convert_of_deeply_nested_ops_reads_back(tmp_path, capsys):
    """4,400 nested ops make a stacks table of 9.7M rows: ``convert`` wrote 271 MB whose footer
    pyarrow refused. What ``convert`` writes must read back, equal to what it read."""
    from allocsim.cli import main as cli_main
    from allocsim.trace import read_trace

    source, expected = nested_ops_kineto(tmp_path, random.Random(0))
    out = tmp_path / "nested.parquet"
    assert cli_main(["convert", str(source), "-o", str(out)]) == 0, capsys.readouterr().err
    original, copy = read_trace(str(source)), read_trace(str(out))
    assert len(copy.events) == expected["allocs"]
    for name in ("events", "frames", "stacks"):
        a, b = getattr(original, name), getattr(copy, name)
        assert len(a) == len(b) and a.reset_index(drop=True).equals(b.reset_index(drop=True)), name
    assert len(copy.stacks) > 9_000_000
