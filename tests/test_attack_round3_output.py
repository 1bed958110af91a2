"""Round 3 of the attack suite: output files, what reaches the terminal, and bounded work.

Each test holds one class of hostile input (``tests/attack_files_round3_output.py`` writes the
files) to the rule it broke: every ``-o`` checked before any work, no control or bidi character
from a trace printed raw, a lone surrogate decided once at read time, and work and memory that
follow the file's real content (see docs/security.md).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from allocsim.policies import kernel
from allocsim.trace import read_trace
from allocsim.trace.reading import compiled
from tests.attack_files_round3_output import (
    SPARSE_HEADS,
    distinct_stacks_snapshot,
    empty_sets_pickle,
    long_frames_snapshot,
    many_ooms_snapshot,
    page_bomb_snapshot,
    sparse_file,
)
from tests.test_attack import MEMORY_CAP_BYTES, _CLI, run_capped

ROUTES = ["compiled", "reference"]
#: ``allocsim`` that writes, at exit, its peak resident memory and its children's (a reader's forked
#: child) to $PEAK_FILE: the rusage a parent gets counts the parent's own size too (Linux keeps the
#: high-water mark of the memory a child had before its exec, that is the test process's).
_MEASURED_CLI = """import atexit, os, resource, sys
def _peak():
    with open("/proc/self/status") as fh:
        own = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    with open(os.environ["PEAK_FILE"], "w") as fh:
        fh.write(str(max(own, children)))
atexit.register(_peak)
from allocsim.cli import main
sys.exit(main())"""


def run_measured(argv: list[str], folder: Path, route: str | None = None) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak resident bytes of the command and its children) under the
    attack suite's 4 GiB cap and time limit; a killed command has no peak (-1)."""
    peak_file = folder / "peak.txt"
    env = {"PEAK_FILE": str(peak_file), **({"ALLOCSIM_KERNEL": route} if route else {})}
    code, out, err, _rss = run_capped(["-c", _MEASURED_CLI, *map(str, argv)], env=env)
    peak = int(peak_file.read_text()) if peak_file.exists() else -1
    peak_file.unlink(missing_ok=True)
    return code, out, err, peak


def _route(route: str) -> None:
    if route == "compiled" and compiled.ext is None:
        pytest.skip("compiled readers not built")


def _page_data(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))


# ------------------------------------------------------------------------------- report: linear, bounded page
def test_report_reads_the_frame_columns_once_not_per_stack(tmp_path, monkeypatch):
    """The page's stack table converted the frames table once per new stack: quadratic in a trace
    where every allocation has its own stack (5k/10k/20k/40k: 3.5/10.1/42.8/183.2 s)."""
    from allocsim.report.data import StackTable
    from allocsim.trace.schema import Trace

    trace = read_trace(distinct_stacks_snapshot(tmp_path, 300))
    trace.frames        # the DataFrame, as the old page code read it
    reads = []
    frames_property, table = Trace.frames, Trace.table
    monkeypatch.setattr(Trace, "frames", property(lambda t: reads.append("frames") or frames_property.fget(t),
                                                  frames_property.fset))
    monkeypatch.setattr(Trace, "table", lambda t, name: (reads.append(name) if name == "frames" else None)
                        or table(t, name))
    stacks = StackTable(trace, np.ones(len(trace.table("frames")), dtype=bool))
    reads.clear()
    numbers = [stacks.add(sid) for sid in range(int(trace.table("stacks")["stack_id"].max()) + 1)]
    assert len(set(numbers)) > 300 and reads.count("frames") <= 2, reads[:5]


@pytest.mark.slow
def test_report_of_40k_distinct_stacks_is_linear(tmp_path):
    path = distinct_stacks_snapshot(tmp_path, 40_000)
    started = time.perf_counter()
    code, out, err, _rss = run_capped(["-c", _CLI, "report", str(path), "-o", str(tmp_path / "r.html")])
    assert code == 0, err
    assert time.perf_counter() - started < 60      # 183 s before, 4.3 s after (a 2-core machine)


def test_report_page_cuts_long_frames_and_says_so(tmp_path, cli):
    """Frames of 32,000-character names in every stack made a 41 MiB page from a 400 kB trace: each
    frame is cut in its middle now, and the page says how many were."""
    from allocsim.metrics.sites.rule import MAX_FRAME_PART_CHARS

    path = page_bomb_snapshot(tmp_path, 100, 600)
    out = tmp_path / "page.html"
    code, _, err = cli("report", path, "-o", out)
    assert code == 0, err
    assert out.stat().st_size < 2 * (1 << 20)
    data = _page_data(out.read_text(encoding="utf-8"))
    assert max(map(len, data["frames"])) < 2 * MAX_FRAME_PART_CHARS + 80
    assert any("frames have a file or function name longer than" in c for c in data["cuts"]), data["cuts"]
    assert 'id="cuts"' in out.read_text(encoding="utf-8")


def test_report_page_holds_a_bounded_amount_of_frame_text(tmp_path, cli, monkeypatch):
    """Past the page's budget of frame text, a stack shows one line saying its frames are not shown."""
    from allocsim.report import data as report_data

    monkeypatch.setattr(report_data, "MAX_PAGE_FRAME_CHARS", 2000)
    path = distinct_stacks_snapshot(tmp_path, 200)
    out = tmp_path / "page.html"
    assert cli("report", path, "-o", out)[0] == 0
    data = _page_data(out.read_text(encoding="utf-8"))
    assert sum(map(len, data["frames"])) < 2000 + 1000
    assert any("stacks are shown without their frames" in c for c in data["cuts"]), data["cuts"]
    assert any(f.startswith("(frames not shown") for f in data["frames"])


# ------------------------------------------------------------------------------- long frames, site index
def test_site_names_are_cut_however_long_the_frame(tmp_path):
    """A site name is built from its frame: 65,000-character names made 130,000-character sites
    (and a MemoryError under a 4 GiB limit once thousands of frames shared them)."""
    from allocsim.metrics.sites.rule import MAX_FRAME_PART_CHARS, SiteFilter, SiteIndex

    trace = read_trace(long_frames_snapshot(tmp_path, 50, 200))
    index = SiteIndex(trace, SiteFilter())
    assert len(index.names) == 50
    assert max(map(len, index.names)) < 2 * MAX_FRAME_PART_CHARS + 80
    assert "characters cut]" in index.names[0] and index.names[0].endswith("y" * 20)


def test_frame_tests_run_once_per_distinct_string(tmp_path, monkeypatch):
    """The category rules searched every frame's 65,000-character name though 4,500 frames share one
    string: 23 s of regular expressions for a 3.4 MB file. Each distinct string is searched once."""
    from allocsim.metrics import categories

    searched = []

    class Counting:
        def __init__(self, pattern):
            self.pattern = pattern

        def search(self, text):
            searched.append(len(text))
            return self.pattern.search(text)

    monkeypatch.setattr(categories, "_WORKSPACE", Counting(categories._WORKSPACE))
    trace = read_trace(long_frames_snapshot(tmp_path, 300, 600))
    categories.categorize(trace)
    assert len(searched) == 1, len(searched)


@pytest.mark.full
@pytest.mark.parametrize("route", ROUTES)
def test_long_frames_under_a_4gib_limit(tmp_path, route):
    """The 3.4 MB file of long frames: MemoryError traceback from the site index under ``ulimit -v
    4194304``; now info and run finish within the cap."""
    _route(route)
    path = long_frames_snapshot(tmp_path, 4500, 65_000)
    for argv in (["info", path], ["run", path, "--policy", "pytorch", "--fast"]):
        code, out, err, peak = run_measured(argv, tmp_path, route)
        assert code == 0 and "Traceback" not in err, err[-2000:]
        assert 0 < peak < MEMORY_CAP_BYTES // 8, peak


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_long_frames_report_under_a_4gib_limit(tmp_path, route):
    _route(route)
    path = long_frames_snapshot(tmp_path, 4500, 65_000)
    code, out, err, rss = run_capped(["-c", _CLI, "report", str(path), "-o", str(tmp_path / "r.html")],
                                     env={"ALLOCSIM_KERNEL": route})
    assert code == 0 and "Traceback" not in err, err[-2000:]


def test_memory_error_after_reading_is_one_line_naming_the_limit(tmp_path, cli, monkeypatch):
    """A MemoryError after the trace is read (the site index, a replay) was a traceback."""
    from allocsim.metrics.sites import rule
    from allocsim.trace.reading import headroom

    path = distinct_stacks_snapshot(tmp_path, 10)

    def no_memory(self):
        raise MemoryError()

    monkeypatch.setattr(rule.SiteIndex, "__post_init__", no_memory)
    monkeypatch.setattr(headroom, "headroom", lambda: headroom.Headroom(1 << 30, "the test's limit of 1 GiB"))
    for argv in (["info", path], ["run", path, "--policy", "pytorch", "--fast"], ["report", path, "-o", tmp_path / "r.html"]):
        code, out, err = cli(*argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert "ran out of memory" in lines[0] and "the test's limit of 1 GiB; raise that limit" in lines[0]
        assert str(path) in lines[0]
    monkeypatch.setattr(headroom, "headroom", lambda: None)
    code, out, err = cli("info", path)
    assert code == 2 and "no process limit is set" in err


# ------------------------------------------------------------------------------- older corpus classes
@pytest.mark.parametrize("route", ROUTES)
def test_a_pickle_of_empty_sets_is_refused_early(tmp_path, route):
    """3 million one-byte empty sets (a 3 MB file): each set is 216 bytes, and 9.5 million of them held
    2.3 GB before the reader said a segment is not a dict. The C unpickler now gets memory in
    proportion to the file, and the data-only unpickler refuses a set at its first opcode."""
    _route(route)
    path = empty_sets_pickle(tmp_path, 3_000_000)
    code, out, err, peak = run_measured(["info", path], tmp_path, route)
    assert code == 2 and err.strip().splitlines() == [
        f"allocsim info: error: {path}: corrupt pickle: it holds a set; a snapshot holds dicts, lists, tuples, "
        "strings and numbers only"], err
    assert 0 < peak < 600 * (1 << 20), peak


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_the_9_5_mb_pickle_of_empty_sets(tmp_path, route):
    _route(route)
    path = empty_sets_pickle(tmp_path, 9_500_000)
    code, out, err, peak = run_measured(["info", path], tmp_path, route)
    assert code == 2 and "holds a set" in err and 0 < peak < 700 * (1 << 20), (err, peak)


def _refused_from_first_bytes(path: Path, route: str | None = None) -> str:
    started = time.perf_counter()
    code, out, err, peak = run_measured(["info", path], path.parent, route)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(path) in lines[0], err[-2000:]
    assert 0 < peak < 256 * (1 << 20) and time.perf_counter() - started < 30, peak
    return lines[0]


@pytest.mark.parametrize("name", sorted(SPARSE_HEADS))
def test_sparse_files_are_refused_from_their_first_bytes(tmp_path, name):
    """``truncate -s 4G f.json``: files of zeros after a valid first line were read to the memory
    limit (a 4 GiB one under ``ulimit -v 4194304`` peaked at 3.9 GB): no trace format starts or ends
    with zero bytes, nor holds one in its text, so they are refused before reading."""
    path = sparse_file(tmp_path, name, 4 << 30)
    try:
        line = _refused_from_first_bytes(path)
        assert "zero bytes" in line or "zero byte" in line, line
    finally:
        path.unlink()


def test_a_real_trace_extended_with_zeros_is_refused(tmp_path):
    """A valid trace whose copy was extended by a hole (its end is zeros) is refused by its last bytes."""
    source = Path(__file__).resolve().parents[1] / "traces" / "bert_fp32.json.gz"
    import gzip

    head = gzip.decompress(source.read_bytes())
    path = sparse_file(tmp_path, "kineto.json", len(head) + (1 << 30), head=head)
    try:
        assert "ends in at least 4,096 zero bytes" in _refused_from_first_bytes(path)
    finally:
        path.unlink()


@pytest.mark.full
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(SPARSE_HEADS))
def test_8gib_sparse_files_on_both_routes(tmp_path, name, route):
    _route(route)
    path = sparse_file(tmp_path, name, 8 << 30)
    try:
        _refused_from_first_bytes(path, route)
    finally:
        path.unlink()


@pytest.mark.full
@pytest.mark.parametrize("route", ROUTES)
def test_100k_recorded_ooms_read_in_linear_time(tmp_path, route):
    """100,000 OOM entries before one request: ``info`` took 22.7 s (each OOM cut the list of the
    rest, and read one time from the events DataFrame); 3.9 s now."""
    _route(route)
    path = many_ooms_snapshot(tmp_path, 100_000)
    with kernel.route(route):
        started = time.perf_counter()
        trace = read_trace(path)
        seconds = time.perf_counter() - started
    assert len(trace.meta.recorded["0"]["ooms"]) == 100_000
    assert seconds < 15, seconds


# ------------------------------------------------------------------------------- terminal text
def _raw_controls(text: str) -> list[str]:
    """The characters of ``text`` that would drive a terminal (newline and tab are ours)."""
    from allocsim.terminal import _UNSAFE

    return sorted(set(_UNSAFE.findall(text)))


@pytest.mark.parametrize("char", ["\x1b", "\x07", "\r", "\x08", "\x7f", "\x9b", "\x85", "\u202a", "\u202e",
                                  "\u2066", "\u2069", "\u200e", "\u200f", "\u061c", "\u2028", "\u200b",
                                  "\ufeff", "\U000e0041", "\ud800"])
def test_printable_escapes_every_dangerous_character(char):
    from allocsim.terminal import printable

    out = printable(f"a{char}b\n\tc")
    assert char not in out and out.startswith("a\\") and out.endswith("b\n\tc")
    assert out.encode("utf-8")      # a lone surrogate too: nothing is left that cannot be written


@pytest.mark.parametrize("make", ["snapshot", "kineto"])
def test_trace_text_never_reaches_the_terminal_raw(tmp_path, cli, make):
    """Op names, frames, step labels and device names with ESC, CR, DEL, C1 and bidi controls could
    set the terminal title, erase a line and forge a verdict; every command's text output escapes them."""
    from tests.attack_files_round3_output import hostile_text_kineto, hostile_text_snapshot

    path = (hostile_text_snapshot if make == "snapshot" else hostile_text_kineto)(tmp_path)
    runs = {"info": ["info", path], "info sites": ["info", path, "--sites", "5"],
            "run": ["run", path, "--policy", "pytorch", "--fast"],
            "run timed": ["run", path, "--policy", "pytorch", "--capacity", "1GiB"],
            "advise": ["advise", path, "--fast", "--capacity", "1GiB", "--workers", "1"],
            "report": ["report", path, "-o", tmp_path / "r.html"]}
    for name, argv in runs.items():
        code, out, err = cli(*argv)
        assert code in (0, 1, 3), f"{name}: {err}"
        assert not _raw_controls(out + err), f"{name}: {_raw_controls(out + err)}"
    code, out, err = cli("info", path, "--sites", "5")
    assert "\\x1b]0;pwned\\x07" in out       # shown, as its escape


def test_json_output_keeps_the_text_exactly(tmp_path, cli):
    """``--json`` stays JSON: its own escapes carry the trace's text, which decodes unchanged."""
    from tests.attack_files_round3_output import HOSTILE_TEXT, hostile_text_kineto

    path = hostile_text_kineto(tmp_path)
    code, out, err = cli("run", path, "--policy", "pytorch", "--fast", "--json")
    assert code == 0 and not _raw_controls(out)
    sites = json.loads(out)["sites"]["at_peak"]
    assert any(HOSTILE_TEXT in row["site"] for row in sites), sites


def test_file_names_and_errors_never_reach_the_terminal_raw(tmp_path, cli):
    """A trace's file name and the values an error quotes are escaped too (sweep, winners, convert,
    scale, a refused record)."""
    import pickle

    from tests.attack_files_round3_output import HOSTILE_TEXT, hostile_text_snapshot

    path = hostile_text_snapshot(tmp_path)
    named = tmp_path / "t\x1b[2K\r\u202egnp.pickle"
    named.write_bytes(path.read_bytes())
    results = tmp_path / "r\x1b[1A.parquet"
    bad = tmp_path / "bad\x1b[2K.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": HOSTILE_TEXT, "addr": 1, "size": 512,
                                                                      "stream": 0, "time_us": 1}]]}))
    runs = [["sweep", named, "--policy", "pytorch", "--fast", "--workers", "1", "-o", results],
            ["winners", results], ["convert", named, "-o", tmp_path / "c\x1b[2K.parquet"],
            ["scale", f"{named}@1", f"{named}@2", "--to", "4", "-o", tmp_path / "s.parquet"],
            ["info", bad], ["run", bad, "--policy", "pytorch"], ["info", tmp_path / "missing\x1b[2K.pickle"]]
    for argv in runs:
        code, out, err = cli(*argv)
        assert not _raw_controls(out + err), f"{argv[0]}: {_raw_controls(out + err)}"
        assert "\\x1b" in out + err, f"{argv[0]}: {out + err}"


def test_validate_escapes_what_it_prints(tmp_path, capsys):
    from tests.attack_files_round3_output import hostile_text_snapshot
    from validate.__main__ import main as validate_main

    path = hostile_text_snapshot(tmp_path)
    named = tmp_path / "v\x1b[2K.pickle"
    named.write_bytes(path.read_bytes())
    validate_main(["snapshot", str(named)])
    captured = capsys.readouterr()
    assert not _raw_controls(captured.out + captured.err)


# ------------------------------------------------------------------------------- lone surrogates
def _surrogate_files(folder: Path) -> dict[str, Path]:
    from tests import attack_files_round3_output as gen

    return {"snapshot": gen.surrogate_snapshot(folder), "kineto": gen.surrogate_kineto(folder),
            "paddle": gen.surrogate_paddle(folder), "rmm": gen.surrogate_rmm(folder),
            "allocsim csv": gen.surrogate_native(folder, ".csv"),
            "allocsim parquet": gen.surrogate_native(folder, ".parquet")}


def _texts(trace) -> list[str]:
    frames = trace.table("frames")
    return [*map(str, frames["filename"]), *map(str, frames["name"]), *trace.labels, *trace.meta.notes,
            json.dumps(trace.meta.to_dict(), ensure_ascii=False)]


@pytest.mark.parametrize("kind", ["snapshot", "kineto", "paddle", "rmm", "allocsim csv", "allocsim parquet"])
def test_lone_surrogates_are_replaced_once_at_read_time(tmp_path, kind):
    """``\\ud800`` in an op or frame name: ``run`` failed with Python's codec message naming no file,
    and Kineto ``info`` wrote a raw byte. Every reader, on both routes, now replaces each lone
    surrogate by U+FFFD and notes how many strings it repaired."""
    from allocsim.trace.reading.surrogates import has_surrogate

    path = _surrogate_files(tmp_path)[kind]
    traces = []
    for route in ROUTES:
        if route == "compiled" and compiled.ext is None:
            continue
        with kernel.route(route):
            trace = read_trace(path)
        texts = _texts(trace)
        assert not any(map(has_surrogate, texts)), kind
        if kind != "rmm":      # (an RMM log keeps no text: its bytes are read as numbers or refused)
            assert any("lone surrogate" in note for note in trace.meta.notes), trace.meta.notes
            assert any("\ufffd" in text for text in texts)
        traces.append(texts)
    assert all(t == traces[0] for t in traces), "the routes read different text"


@pytest.mark.parametrize("kind", ["snapshot", "kineto", "paddle", "allocsim csv"])
def test_no_command_fails_on_encoding(tmp_path, cli, kind):
    path = _surrogate_files(tmp_path)[kind]
    for argv in (["info", path], ["info", path, "--json"], ["run", path, "--policy", "pytorch", "--fast"],
                 ["report", path, "-o", tmp_path / "r.html"], ["convert", path, "-o", tmp_path / "c.parquet"]):
        code, out, err = cli(*argv)
        assert code == 0, f"{argv[0]}: {err}"
    assert read_trace(tmp_path / "c.parquet").meta.notes     # the converted trace reads back, note and all


# ------------------------------------------------------------------------------- output files
def _output_argv(folder: Path, command: str, target: str) -> list:
    """``command`` writing to ``target`` (a file for report, scale, convert; a folder for run and plot)."""
    from tests.attack_files_round3_output import scale_inputs

    trace = distinct_stacks_snapshot(folder, 20)
    b1, b2 = scale_inputs(folder)
    return {"report": ["report", trace, "-o", target],
            "scale": ["scale", f"{b1}@1", f"{b2}@2", "--to", "4", "-o", target],
            "convert": ["convert", trace, "-o", target],
            "run": ["run", trace, "--policy", "pytorch", "--fast", "-o", target],
            "plot": ["plot", trace, "--fast", "-o", target],
            "plot two policies": ["plot", trace, "--fast", "--policy", "pytorch", "--policy", "bestfit", "-o", target]}[command]


_FILE_COMMANDS = {"report": "page.html", "scale": "out.parquet", "convert": "out.csv"}
_FOLDER_COMMANDS = {"run": "summary.json", "plot": "timeline.png", "plot two policies": "bestfit/timeline.svg"}


def _no_reading(monkeypatch):
    """Fail the test if a trace is read: the output is checked before any work."""
    import allocsim.commands.common as common
    import allocsim.trace as trace_package

    def refuse(*args, **kwargs):
        raise AssertionError("a trace was read before the output was checked")

    monkeypatch.setattr(common, "read_trace", refuse)
    monkeypatch.setattr(trace_package, "read_trace", refuse)


def _refused(code: int, err: str, target: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"-o {target}:" in lines[0], err
    return lines[0]


@pytest.mark.parametrize("command", sorted(_FILE_COMMANDS))
def test_a_users_file_is_never_replaced(tmp_path, cli, monkeypatch, command):
    """``echo notes > n.txt; allocsim report X -o n.txt`` replaced the notes (report, scale)."""
    target = tmp_path / _FILE_COMMANDS[command]
    target.write_bytes(b"notes\n")
    argv = _output_argv(tmp_path, command, str(target))
    _no_reading(monkeypatch)
    line = _refused(*cli(*argv)[::2], str(target))
    assert "refusing to replace it" in line and target.read_bytes() == b"notes\n"


@pytest.mark.parametrize("command", sorted(_FOLDER_COMMANDS))
def test_a_users_file_in_an_output_folder_is_never_replaced(tmp_path, cli, monkeypatch, command):
    folder = tmp_path / "out"
    target = folder / _FOLDER_COMMANDS[command]
    target.parent.mkdir(parents=True)
    target.write_bytes(b"notes\n")
    argv = _output_argv(tmp_path, command, str(folder))
    _no_reading(monkeypatch)
    line = _refused(*cli(*argv)[::2], str(folder))
    assert str(target) in line and target.read_bytes() == b"notes\n"


@pytest.mark.parametrize("command", [*sorted(_FILE_COMMANDS), *sorted(_FOLDER_COMMANDS)])
def test_a_fifo_never_hangs_a_command(tmp_path, command):
    """``-o`` naming a FIFO (or a FIFO where a folder's file goes) hung report and scale on open()."""
    import os

    folder = tmp_path / "out"
    folder.mkdir()
    if command in _FILE_COMMANDS:
        fifo = target = tmp_path / _FILE_COMMANDS[command]
    else:
        target, fifo = folder, folder / _FOLDER_COMMANDS[command]
        fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    argv = [str(a) for a in _output_argv(tmp_path, command, str(target))]
    started = time.perf_counter()
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLI, *argv], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert time.perf_counter() - started < 60
    line = _refused(done.returncode, done.stderr, str(target))
    assert "FIFO" in line and fifo.is_fifo()


@pytest.mark.parametrize("command", [*sorted(_FILE_COMMANDS), *sorted(_FOLDER_COMMANDS)])
def test_a_missing_folder_is_refused_before_any_work(tmp_path, cli, monkeypatch, command):
    target = tmp_path / "no" / "such" / ("x.parquet" if command == "scale" else "x.html" if command == "report"
                                         else "x.csv" if command == "convert" else "dir")
    argv = _output_argv(tmp_path, command, str(target))
    _no_reading(monkeypatch)
    assert "does not exist" in _refused(*cli(*argv)[::2], str(target))


@pytest.mark.parametrize("command", [*sorted(_FILE_COMMANDS), "run", *(
    pytest.param(c, marks=pytest.mark.full) for c in ("plot", "plot two policies"))])   # (drawing: 8-17 s)
def test_each_command_replaces_its_own_output(tmp_path, cli, command):
    """What a command wrote carries allocsim's mark: running it again replaces it."""
    target = tmp_path / (_FILE_COMMANDS.get(command) or "out")
    argv = _output_argv(tmp_path, command, str(target))
    for _ in range(2):
        code, out, err = cli(*argv)
        assert code == 0, err


def test_output_marks_recognise_only_allocsim_files(tmp_path):
    """Each kind of file is ours only with allocsim's mark (the lead's ``capture`` calls
    ``output_file.check_trace_output``, which replaces only ``output_marks.is_allocsim_trace`` files)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from matplotlib.figure import Figure

    from allocsim.output_file import check_trace_output
    from allocsim.output_marks import FIGURE_METADATA, is_allocsim_trace, write_json, write_table, written_by_allocsim
    from allocsim.trace import write_trace

    trace = read_trace(distinct_stacks_snapshot(tmp_path, 3))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    write_trace(trace, ours / "t.parquet"), write_trace(trace, ours / "t.csv"), write_trace(trace, ours / "t.csv.gz")
    write_table(pd.DataFrame({"x": [1]}), ours / "x.parquet")
    write_json({"a": 1}, ours / "x.json", "allocsim-test/1")
    pq.write_table(pa.table({"x": [1]}), theirs / "x.parquet")
    (theirs / "x.json").write_text('{"schema": "theirs", "allocsim": 1}')
    (theirs / "t.csv").write_text("t_ns,kind\n# allocsim\n")
    figure = Figure()
    figure.add_subplot().plot([1, 2])
    for ext in ("png", "svg"):
        figure.savefig(ours / f"f.{ext}", metadata=FIGURE_METADATA[ext])
        figure.savefig(theirs / f"f.{ext}")
    traces = {"t.parquet", "t.csv", "t.csv.gz"}      # allocsim's, but not what a folder output writes (issue 40)
    assert all(written_by_allocsim(str(p)) for p in ours.iterdir() if p.name not in traces), \
        [p.name for p in ours.iterdir() if p.name not in traces and not written_by_allocsim(str(p))]
    assert not any(written_by_allocsim(str(ours / name)) for name in traces)
    assert all(is_allocsim_trace(str(ours / name)) for name in traces)
    assert not any(written_by_allocsim(str(p)) for p in theirs.iterdir())
    assert is_allocsim_trace(str(ours / "t.parquet")) and not is_allocsim_trace(str(ours / "x.parquet"))
    check_trace_output(str(ours / "t.parquet"))
    with pytest.raises(ValueError, match="is not an allocsim trace"):
        check_trace_output(str(theirs / "x.parquet"))
    with pytest.raises(ValueError, match="unknown extension"):
        check_trace_output(str(tmp_path / "t.txt"))
