"""Attack suite: every CLI command on hostile and valid files, in a subprocess under a memory cap.

Each run must end with exit 0, 1, 2 or 3, no traceback, a one-line error naming the file when it
fails, peak RSS within the cap, and on valid files the numbers of an independent recount. CI runs
one file per class of attack; ``pytest -m slow tests/test_attack.py`` runs every generator with
several seeds plus a hypothesis search over valid files (see docs/security.md).
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
from allocsim.trace.reading.limits import iter_chunks, open_binary, read_bytes
from tests.attack_files import EXPECTED_REFUSALS, HOSTILE, MiB, OUTPUT_TARGETS, VALID, _member, nested_ops_kineto

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


def run_capped(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS bytes of the process and its children)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=cap, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
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


@pytest.mark.full
@pytest.mark.parametrize("cls, gen_name, gen, seed",
                         [c for c in _cases(1) if _CI_PICK.get(c.values[0]) == c.values[1]])
def test_hostile_files_ci(tmp_path, cls, gen_name, gen, seed):
    path, expected = gen(tmp_path, random.Random(seed))
    for name in _CI_COMMANDS:
        check_run(name, path, commands(path, tmp_path)[name], expected)


@pytest.mark.full
@pytest.mark.parametrize("cls, gen_name, gen, seed", [c for c in _cases(1) if c.values[0] in _CI_ALL_INFO])
def test_round2_files_ci(tmp_path, cls, gen_name, gen, seed):
    path, expected = gen(tmp_path, random.Random(seed))
    check_run("info", path, commands(path, tmp_path)["info"], expected)


@pytest.mark.full
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


@pytest.mark.full
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
@pytest.mark.full
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


# ------------------------------------------------------------------ refusals: the same line on both routes
_GENERATORS = {name: gen for generators in HOSTILE.values() for name, gen in generators.items()}


def _routes_agree(path: Path, argv_of, expected: str) -> None:
    """``argv_of(path)`` exits 2 with one line holding ``expected``, the same line on both routes."""
    lines = {}
    for route in ("compiled", "reference"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "ALLOCSIM_KERNEL": route}
        if route == "compiled":
            env.pop("ALLOCSIM_KERNEL")   # auto: compiled where built (CI also runs without a compiler)
        proc = subprocess.run([sys.executable, *argv_of(path)], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=TIME_LIMIT_S)
        err = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(err) == 1, f"{route} on {path.name}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert expected in err[0] and path.name in err[0], f"{route} on {path.name}: {err[0]}"
        lines[route] = err[0]
    assert lines["compiled"] == lines["reference"], lines


@pytest.mark.full
@pytest.mark.parametrize("gen_name", sorted(EXPECTED_REFUSALS))
def test_refusals_name_the_rule_on_both_routes(tmp_path, gen_name):
    path, _ = _GENERATORS[gen_name](tmp_path, random.Random(0))
    _routes_agree(path, lambda p: ["-c", _CLI, "info", str(p)], EXPECTED_REFUSALS[gen_name])


@pytest.mark.slow
@pytest.mark.parametrize("gen_name, seed", [(g, seed) for g in sorted(EXPECTED_REFUSALS) for seed in range(1, 4)])
def test_refusals_every_command_and_seed(tmp_path, gen_name, seed):
    path, _ = _GENERATORS[gen_name](tmp_path, random.Random(seed))
    for name in ("info", "run pytorch", "run bestfit"):
        _routes_agree(path, lambda p, n=name: commands(p, tmp_path)[n], EXPECTED_REFUSALS[gen_name])


@pytest.mark.full
def test_validate_names_the_file_for_an_impossible_state(tmp_path):
    path, _ = _GENERATORS["odd live block"](tmp_path, random.Random(0))
    code, _, err, _ = run_capped(commands(path, tmp_path)["validate snapshot"])
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert path.name in err and "is not a multiple of 512" in err


# ------------------------------------------------------------------ options: one line that blames the option
def _hostile_options(folder: Path, rng: random.Random) -> dict[str, tuple[list[str], str]]:
    """Hostile command-line values on a valid trace -> (argv, what the one error line must say)."""
    from allocsim.sweep.results import rows_to_table
    import pyarrow.parquet as pq

    trace, _ = VALID["snapshot"](folder, rng)
    nested = "[" * rng.randint(5000, 50000)
    nested += "]" * len(nested)
    (folder / "nested.json").write_text(nested)

    def results(name: str, policy: str, params_json: str) -> str:
        row = {"trace": str(trace), "trace_sha256": "ab" * 32, "policy": policy, "params_json": params_json,
               "error": None, "completed": True, "oom_count": 0, "peak_reserved_bytes": 1 << 30}
        pq.write_table(rows_to_table([row]), folder / name)
        return str(folder / name)

    run = ["run", str(trace), "--policy"]
    long_value = "9" * rng.randint(5000, 20000)
    return {
        "paddle alignment=0": ([*run, "paddle", "--set", "alignment=0"], "alignment_bytes must be > 0"),
        "alloc-conf with '='": ([*run, "pytorch", "--alloc-conf", "expandable_segments=True"], "uses '='"),
        "alloc-conf 20 KB value": ([*run, "pytorch", "--alloc-conf", f"max_split_size_mb:{long_value}"],
                                   "characters)"),
        "policy spec 20 KB": ([*run, f"pytorch:x:{long_value}"], "characters)"),
        "limits events=1e30": ([*run, "pytorch", "--limits", "events=1e30"], "--limits events=1e30: must be from 1"),
        "limits memory_bytes=2**63": ([*run, "pytorch", "--limits", f"memory_bytes={1 << 63}"],
                                      "--limits memory_bytes="),
        "limits seconds=2**31": (["info", str(trace), "--limits", f"seconds={1 << 31}"], "--limits seconds="),
        "limits nan": (["info", str(trace), "--limits", "depth=nan"], "not a whole number"),
        "max-events 0": (["info", str(trace), "--max-events", "0"], "--max-events 0: must be from 1"),
        "cost model nested": ([*run, "pytorch", "--cost-model", str(folder / "nested.json")], "nested too deeply"),
        "grid file nested": (["sweep", str(trace), "--grid-file", str(folder / "nested.json"), "--fast",
                              "-o", str(folder / "out.parquet")], "nested too deeply"),
        "winners unknown policy": (["winners", results("unknown.parquet", "no-such-policy", "{}")],
                                   "unknown policy 'no-such-policy'"),
        "winners unknown parameter": (["winners", results("param.parquet", "pytorch", '{"nope": 1}')],
                                      "no parameter 'nope'"),
        "winners nested params": (["winners", results("nested.parquet", "pytorch", nested)], "nested too deeply"),
    }


def test_hostile_options_give_one_line(tmp_path, capsys):
    from allocsim.cli import main

    for name, (argv, expected) in _hostile_options(tmp_path, random.Random(0)).items():
        capsys.readouterr()
        code = main(argv)
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(err) == 1, f"{name}: exit {code}, {err}"
        assert expected in err[0] and len(err[0]) < 400, f"{name}: {err[0][:500]}"


# ------------------------------------------------------------------ bounded work on big start states
def test_site_waste_reads_each_pool_view_once(tmp_path, monkeypatch):
    """Charging waste to code sites on a start state of 1,000 segments copies each compiled free list's
    views once per pool, not once per free block (40k segments took over 10 minutes), and charges the
    same bytes to the same sites as the reference route."""
    from allocsim.metrics.sites.waste import waste_total_check
    from allocsim.policies import kernel
    from allocsim.policies.registry import build_policy
    from allocsim.runner import device_for, resolve_capacity, simulate_trace, waste_by_site
    from allocsim.trace import read_trace
    from tests.attack_files import many_initial_segments_snapshot

    if kernel.compiled is None and os.environ.get("CI") != "true":
        pytest.skip(f"compiled kernel not built here: {kernel.LOAD_ERROR}")
    n_segments = 1000
    path, expected = many_initial_segments_snapshot(tmp_path, random.Random(0), n_segments)
    trace = read_trace(path)
    capacity = resolve_capacity(trace, None)
    copied = []
    items = kernel.compiled.FreeList._items
    monkeypatch.setattr(kernel.CompiledFreeList, "_items", lambda self, name: copied.append(n := items(self, name)) or n)

    charges = {}
    for route in ("compiled", "reference"):
        with kernel.route(route):
            target = simulate_trace(trace, "pytorch", {}, capacity=capacity, fast=True).summary["at_peak_reserved"]["event_index"]
            copied.clear()
            charges[route] = waste_by_site(trace, lambda: build_policy("pytorch", device=device_for(capacity.bytes),
                                                                       allocator_settings=trace.meta.allocator_settings),
                                           target)
            if route == "compiled":
                # Each view copy holds at most every segment's entries; per free block it was 1,000 copies.
                assert 0 < len(copied) <= 8, f"{len(copied)} copies of free-list views"
                assert sum(len(c) for c in copied) <= 8 * (n_segments + 1)
        assert waste_total_check(charges[route]) == charges[route].waste_bytes > 0
    assert charges["compiled"].charges == charges["reference"].charges
    assert expected["initial_segments"] == n_segments == len(trace.initial_segments)


class _NoWalk(dict):
    """A stream map that refuses to be walked (``largest()`` must not look at every stream)."""

    def values(self):
        raise AssertionError("walked every stream")

    items = __iter__ = values


def test_largest_free_block_is_not_a_walk_over_streams(tmp_path):
    """Taking the largest free block and then reaching a new reserved peak, stream after stream
    (60k streams: minutes on either route), gives the same run on both routes, and the reference
    free list answers ``largest()`` without walking its streams."""
    from allocsim.policies import kernel
    from allocsim.policies.freelist import FreeList, check_free_list
    from allocsim.runner import simulate_trace
    from allocsim.trace import read_trace
    from tests.attack_files import streams_taking_the_largest_rmm

    rng = random.Random(0)
    pool = FreeList()
    for k in range(400):
        pool.add_segment(k << 30, 1 << 20, k)
        pool.add(k << 30, 1 << 20, k)
    pool.by_stream = _NoWalk(pool.by_stream)
    for k in rng.sample(range(400), 400):     # take blocks in any order: largest() follows
        pool.take(k, (1 << 20) << 64 | k << 30)
        pool.add(k << 30, 512 * rng.randint(1, 2048), k)
        assert pool.largest() == max(size for blocks in dict.values(pool.by_stream) for key in blocks
                                     for size in [key >> 64])
    pool.by_stream = dict(pool.by_stream)
    check_free_list(pool)

    path, expected = streams_taking_the_largest_rmm(tmp_path, rng, 1500)
    trace = read_trace(path)
    summaries = {}
    for route in ("compiled", "reference"):
        if route == "compiled" and kernel.compiled is None and os.environ.get("CI") != "true":
            continue
        with kernel.route(route):
            summary = simulate_trace(trace, "pytorch", {}, fast=True).summary
        summaries[route] = {k: v for k, v in summary.items() if "seconds" not in k and "per_s" not in k}
    assert summaries["reference"]["peak_requested_bytes"] == expected["peak_live_bytes"]
    if "compiled" in summaries:
        assert summaries["compiled"] == summaries["reference"]


def test_compiled_budget_follows_the_process_memory_limit(tmp_path, monkeypatch):
    """Under a process limit tighter than ``memory_bytes`` the compiled scan's budget comes from that
    limit: a snapshot that fits stays on the compiled route, one that does not is refused at once with
    one line naming the limit (it went to the reference route for minutes and blamed memory_bytes)."""
    from allocsim.errors import TraceFormatError
    from allocsim.policies import kernel
    from allocsim.trace import read_trace
    from allocsim.trace.formats.snapshot import reader as snapshot
    from allocsim.trace.reading import compiled, isolate
    from allocsim.trace.reading.headroom import Headroom, headroom
    from tests.attack_files import tiny_blocks_snapshot

    if compiled.ext is None and os.environ.get("CI") != "true":
        pytest.skip(compiled.LOAD_ERROR)
    room = headroom()
    assert room is None or room.bytes >= 0 and "limit" in room.limit
    path, expected = tiny_blocks_snapshot(tmp_path, random.Random(0), 40_960)

    def no_reference(*args, **kwargs):
        raise AssertionError("the file went to the reference route")

    monkeypatch.setattr(isolate, "run_isolated", no_reference)
    with kernel.route("compiled"):
        monkeypatch.setattr(snapshot, "headroom", lambda: Headroom(600 * MiB, "the test's limit of 600 MiB"))
        trace = read_trace(path)             # a scan of ~10 MB: within a third of 600 MiB
        assert int(trace.initial_allocs["size_bytes"].sum()) == expected["baseline_live_bytes"]
        monkeypatch.setattr(snapshot, "headroom", lambda: Headroom(6 * MiB, "the test's limit of 6 MiB"))
        with pytest.raises(TraceFormatError) as refused:
            read_trace(path)
        message = str(refused.value)
        assert path.name in message and "the test's limit of 6 MiB" in message and "\n" not in message
        assert "memory_bytes" not in message
        # A budget set by --limits memory_bytes still goes to the reference route, which names that cap.
        monkeypatch.setattr(snapshot, "headroom", lambda: None)
        with pytest.raises(AssertionError, match="reference route"):
            read_trace(path, limits=snapshot.Limits(memory_bytes=2 * MiB))



@pytest.mark.full
def test_kineto_budget_follows_the_process_memory_limit(tmp_path, monkeypatch):
    """Under a process limit the Kineto reader sizes its work from that limit on both routes: a file
    that fits is read (on the compiled route without the reference), one that does not is refused at
    once with the same line on both routes, naming the limit (the scan only stopped at memory_bytes)."""
    from allocsim.errors import TraceFormatError
    from allocsim.policies import kernel
    from allocsim.trace import read_trace
    from allocsim.trace.formats.kineto import reader as kineto
    from allocsim.trace.reading import compiled
    from allocsim.trace.reading.headroom import Headroom
    from tests.attack_files import many_memory_events_kineto

    path, expected = many_memory_events_kineto(tmp_path, random.Random(0), 20_000)
    routes = ["reference"] + (["compiled"] if compiled.ext is not None or os.environ.get("CI") == "true" else [])
    lines = {}
    for route in routes:
        with kernel.route(route), monkeypatch.context() as patch:
            if route == "compiled":
                patch.setattr(kineto, "_read_decoded", lambda *a, **k: pytest.fail("went to the reference route"))
            patch.setattr(kineto, "headroom", lambda: Headroom(600 * MiB, "the test's limit of 600 MiB"))
            trace = read_trace(path)           # a scan of ~1 MB, a reference read of ~20 MB: both fit
            assert (trace.events["kind"] == 1).sum() == expected["allocs"]
            patch.setattr(kineto, "headroom", lambda: Headroom(6 * MiB, "the test's limit of 6 MiB"))
            with pytest.raises(TraceFormatError) as refused:
                read_trace(path)
            lines[route] = str(refused.value)
    for line in lines.values():
        assert path.name in line and "the test's limit of 6 MiB" in line and "memory_bytes" not in line
    assert len(set(lines.values())) == 1, lines
    if "compiled" in routes:
        # A budget set by --limits memory_bytes still hands the file to the reference route.
        with kernel.route("compiled"), monkeypatch.context() as patch:
            patch.setattr(kineto, "headroom", lambda: None)
            patch.setattr(kineto, "_read_decoded", lambda *a, **k: pytest.fail("went to the reference route"))
            with pytest.raises(pytest.fail.Exception, match="reference route"):
                read_trace(path, limits=kineto.Limits(memory_bytes=MiB))


def test_memory_error_under_a_process_limit_names_it(tmp_path, monkeypatch):
    """A MemoryError while reading any trace under a process memory limit is one line naming that limit."""
    import allocsim.trace as trace_module
    from allocsim.errors import TraceFormatError
    from allocsim.trace.reading.headroom import Headroom

    path, _ = VALID["rmm"](tmp_path, random.Random(0))

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(trace_module, "_reader", lambda fmt: no_memory)
    monkeypatch.setattr(trace_module, "headroom", lambda: Headroom(1 << 30, "the test's limit of 1 GiB"))
    with pytest.raises(TraceFormatError, match="may take under the test's limit of 1 GiB; raise that limit"):
        trace_module.read_trace(path)
    monkeypatch.setattr(trace_module, "headroom", lambda: None)
    with pytest.raises(TraceFormatError, match="MemoryError"):
        trace_module.read_trace(path)


@pytest.mark.full
def test_repeated_entry_dicts_are_refused_at_once_on_both_routes(tmp_path):
    """Entry dicts referenced again through the pickle's memo are refused with the same line on both
    routes, naming the entry and the one it repeats; equal dicts that are separate objects are read."""
    import pickle

    from allocsim.errors import TraceFormatError
    from allocsim.policies import kernel
    from allocsim.trace import read_trace
    from allocsim.trace.reading import compiled
    from tests.attack_files import repeated_entry_snapshot

    routes = ["reference"] + (["compiled"] if compiled.ext is not None or os.environ.get("CI") == "true" else [])
    copies = tmp_path / "copies.pickle"
    entries = [{"action": act, "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 1}
               for _ in range(3) for act in ("alloc", "free_requested", "free_completed")]
    copies.write_bytes(pickle.dumps({"segments": [], "device_traces": [[], entries]}, protocol=4))
    for seed, record in ((0, "device 0 entry 1: "), (1, "device 0 entry 3: ")):
        path, _ = repeated_entry_snapshot(tmp_path, random.Random(seed), 30_000)
        lines = {}
        for route in routes:
            with kernel.route(route):
                with pytest.raises(TraceFormatError) as refused:
                    read_trace(path)
                lines[route] = str(refused.value)
                assert len(read_trace(copies).events) == 9     # 3 allocs, 3 free requests, 3 completions
        assert len(set(lines.values())) == 1, lines
        assert f"{path.name}: {record}the same dict as device 0 entry 0" in lines[route], lines[route]
    # a device's entry repeating another device's: named across devices, the same on both routes
    shared = {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 1}
    cross = tmp_path / "cross.pickle"
    cross.write_bytes(pickle.dumps({"segments": [], "device_traces": [[dict(shared), shared], [shared]]}, protocol=4))
    lines = {}
    for route in routes:
        with kernel.route(route), pytest.raises(TraceFormatError) as refused:
            read_trace(cross)
        lines[route] = str(refused.value)
    assert len(set(lines.values())) == 1 and "device 1 entry 0: the same dict as device 0 entry 1" in lines[route], lines


@pytest.mark.full
@pytest.mark.parametrize("kind", ["broken", "truncated", "wrong schema", "damaged results"])
def test_damaged_parquet_is_named_by_every_command(tmp_path, capsys, kind):
    """Every command given a damaged ``.parquet`` (as a trace or a results file) exits 2 with one line
    naming the file (``plot`` printed pyarrow's text alone); ``sweep`` records the error in its row,
    naming the file, and exits 1."""
    from allocsim.cli import main
    from tests.attack_files import damaged_parquet

    path = damaged_parquet(tmp_path, random.Random(0), kind)
    out = str(tmp_path / "out")
    argvs = {"info": ["info", str(path)], "run": ["run", str(path), "--policy", "pytorch", "--fast"],
             "advise": ["advise", str(path), "--fast", "--capacity", "8GiB"],
             "scale": ["scale", f"{path}@1", f"{path}@2", "--to", "4", "-o", out + ".scaled.parquet"],
             "convert": ["convert", str(path), "-o", out + ".parquet"], "plot": ["plot", str(path), "-o", out],
             "report": ["report", str(path), "-o", out + ".html"], "winners": ["winners", str(path)]}
    for name, argv in argvs.items():
        capsys.readouterr()
        code = main(argv)
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(err) == 1, f"{name} on {kind}: exit {code}, {err}"
        assert path.name in err[0] and "Traceback" not in err[0] and len(err[0]) < 400, f"{name} on {kind}: {err[0]}"
    capsys.readouterr()
    code = main(["sweep", str(path), "--policy", "pytorch", "--fast", "-o", out + ".sweep.parquet"])
    captured = capsys.readouterr()
    assert code == 1 and f"TraceFormatError: {path}" in captured.out, captured


@pytest.mark.slow
@pytest.mark.parametrize("gen_name, route", [("memory events over the process limit", "compiled"),
                                             ("memory events over the process limit", "reference"),
                                             ("tiny blocks over the process limit", "compiled")])
def test_over_the_process_limit_names_it(tmp_path, gen_name, route):
    """Under the suite's real 4 GiB address-space cap, a file that does not fit is refused with one
    line naming that limit (not memory_bytes, not a bare MemoryError). The snapshot's reference route
    is left out: it still reads 10^7 blocks for minutes before its child is stopped for memory."""
    from allocsim.trace.reading import compiled

    if route == "compiled" and compiled.ext is None and os.environ.get("CI") != "true":
        pytest.skip(compiled.LOAD_ERROR)
    path, _ = _GENERATORS[gen_name](tmp_path, random.Random(0))
    code, _, err, rss = run_capped(["-c", _CLI, "info", str(path)], env={"ALLOCSIM_KERNEL": route})
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and path.name in lines[0], err[-2000:]
    assert "address-space limit of 4.00 GiB" in lines[0] and "memory_bytes" not in lines[0], lines[0]
    assert rss <= MEMORY_CAP_BYTES

def _odd_columns_give_one_line(folder: Path, capsys, columns: tuple[str, ...]) -> dict:
    from allocsim.cli import main
    from tests.attack_files import _odd_columns, odd_type_parquet

    outcomes = {}
    for kind in sorted(_odd_columns(6)):
        for column in columns:
            path, _ = odd_type_parquet(folder, random.Random(0), kind, column)
            commands = [["info", str(path)], ["run", str(path), "--policy", "pytorch", "--fast", "--sites", "0"],
                        ["convert", str(path), "-o", str(folder / "copy.parquet")]]
            for argv in commands:
                (folder / "copy.parquet").unlink(missing_ok=True)
                capsys.readouterr()
                code = main(argv)
                err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
                assert code in (0, 1, 2), f"{kind} in {column}, {argv[0]}: exit {code}"
                assert (code == 0) == (not err) and len(err) <= 1 and (not err or path.name in err[0]), \
                    f"{kind} in {column}, {argv[0]}: {err}"
                outcomes[kind, column, argv[0]] = code
                if code:
                    break         # run and convert read the file as info does: the same line
    return outcomes


def test_parquet_columns_of_odd_types_give_one_line(tmp_path, capsys):
    """Every Arrow type a Parquet event column can hold reads as numbers or gives one line naming
    the file, through ``info``, ``run`` and ``convert`` in-process (no ``ArrowException`` escapes)."""
    outcomes = _odd_columns_give_one_line(tmp_path, capsys, ("size_bytes",))
    assert 0 in outcomes.values() and 2 in outcomes.values()


@pytest.mark.slow
def test_parquet_columns_of_odd_types_every_column(tmp_path, capsys):
    outcomes = _odd_columns_give_one_line(tmp_path, capsys, ("t_ns", "kind", "alloc_id", "stream", "device"))
    assert 0 in outcomes.values() and 2 in outcomes.values()


def test_headroom_reads_the_tightest_cgroup_limit(tmp_path, monkeypatch):
    """The cgroup limit is the tightest of the group and its ancestors, less reclaimable page cache."""
    from allocsim.trace.reading import headroom as room

    (tmp_path / "proc").write_text("0::/outer/inner\n")
    for folder, limit, used, cache in (("", "max", 10 << 30, 0), ("outer", 8 << 30, 6 << 30, 1 << 30),
                                       ("outer/inner", "max", 5 << 30, 0)):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "memory.max").write_text(f"{limit}\n")
        (tmp_path / folder / "memory.current").write_text(f"{used}\n")
        (tmp_path / folder / "memory.stat").write_text(f"anon 5\ninactive_file {cache}\n")
    monkeypatch.setattr(room, "_CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(room, "_PROC_CGROUP", str(tmp_path / "proc"))
    found = room._cgroup_memory()
    assert found.bytes == (8 << 30) - (5 << 30) and "8.00 GiB" in found.limit
    monkeypatch.setattr(room, "_address_space", lambda: room.Headroom(1 << 30, "the address-space limit"))
    assert room.headroom().bytes == 1 << 30
