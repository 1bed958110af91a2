"""Round 3's wrong numbers with a normal exit (issue 33, items 4-7): each case must give the exact figure or one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from allocsim.cli import main
from allocsim.errors import TraceFormatError
from allocsim.policies import kernel
from allocsim.trace import read_trace
from allocsim.trace.reading import compiled
from tests.attack_files_round3_numbers import (
    GiB, HOSTILE_SETTINGS, ODD_DIGITS, START_BYTES, huge_live_bytes_trace, paddle_odd_number, same_recording_twice,
)

ROOT = Path(__file__).resolve().parents[1]
SMALL_PADDLE = ROOT / "traces" / "paddle" / "resnet_fp32.json.gz"
ROUTES = ["reference"] + (["compiled"] if compiled.ext is not None else [])


def info_json(path, capsys, *extra: str) -> dict:
    assert main(["info", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------ item 4: start bytes from one event
READ_CASES = [name for name in START_BYTES if not name.startswith("contradicting")]
REFUSED_CASES = [name for name in START_BYTES if name.startswith("contradicting")]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", READ_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_start_bytes_are_the_largest_every_event_allows(tmp_path, capsys, name, route, seed):
    path, expected = START_BYTES[name](tmp_path, random.Random(seed))
    with kernel.route(route):
        info = info_json(path, capsys)
    assert {key: info[key] for key in expected} == expected


@pytest.mark.parametrize("fmt", ["paddle", "kineto"])
def test_swapped_threads_fit_where_the_trace_fits(tmp_path, capsys, fmt):
    """The issue's realistic case: exit 3 "peak live 2.00 GiB > 1.50 GiB" although the trace peaks at 1 GiB."""
    path, expected = START_BYTES[f"swapped threads ({fmt})"](tmp_path, random.Random(0))
    policy = "paddle" if fmt == "paddle" else "pytorch"
    assert main(["run", str(path), "--policy", policy, "--capacity", "1.5GiB", "--fast", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"]["fits"] is True
    assert data["peak_live_lower_bound_bytes"] == expected["peak_live_with_baseline_bytes"]
    trace = read_trace(path)
    assert any("pairs of neighbouring events fed in the order" in note for note in trace.meta.notes)
    assert trace.events["t_ns"].is_monotonic_increasing      # times keep their order; the events moved


@pytest.mark.parametrize("fmt", ["paddle", "kineto"])
def test_a_first_total_no_later_event_allows_is_named_in_a_note(tmp_path, capsys, fmt):
    path, _ = START_BYTES[f"first total too high ({fmt})"](tmp_path, random.Random(0))
    assert main(["run", str(path), "--policy", "paddle" if fmt == "paddle" else "pytorch", "--fast", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_live_lower_bound_bytes"] == 4 << 20          # not 30 GiB
    notes = read_trace(path).meta.notes
    assert any("the first event's" in n and "the start is 0 bytes" in n for n in notes), notes


@pytest.mark.parametrize("name", REFUSED_CASES)
def test_totals_no_start_explains_are_refused_in_one_line_on_both_routes(tmp_path, capsys, name):
    path, _ = START_BYTES[name](tmp_path, random.Random(0))
    lines = []
    for route in ROUTES:
        with kernel.route(route), pytest.raises(TraceFormatError) as err:
            read_trace(path)
        lines.append(str(err.value))
        with kernel.route(route):
            assert main(["info", str(path)]) == 2
        err_lines = capsys.readouterr().err.strip().splitlines()
        assert len(err_lines) == 1 and path.name in err_lines[0] and "traceEvents[1]" in err_lines[0]
    assert len(set(lines)) == 1 and "no start explains the totals" in lines[0]
    # --lenient replays the events in timestamp order from a start of 0 bytes, and says so.
    info = info_json(path, capsys, "--lenient")
    assert info["baseline_live_bytes"] == 0 and info["peak_live_with_baseline_bytes"] == 3 * GiB
    assert any("no start explains the totals" in r for r in read_trace(path, lenient=True).meta.repairs)


# ------------------------------------------------------------------ item 5: one number syntax for settings
@pytest.mark.parametrize("name", sorted(HOSTILE_SETTINGS))
def test_hostile_numeric_settings_are_refused_in_one_line_naming_them(capsys, monkeypatch, name):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    argv, message = HOSTILE_SETTINGS[name]
    assert main(["run", str(SMALL_PADDLE), *argv, "--fast"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err[-600:]
    assert len(lines[0]) < 400 and "Traceback" not in err
    # Python's own wording never reaches the user.
    assert not any(s in err for s in ("invalid literal", "could not convert", "OverflowError", "Exceeds the limit"))


def test_settings_in_range_still_read():
    from allocsim.settings.alloc_conf import parse_alloc_conf
    from allocsim.settings.paddle_flags import parse_flags
    from allocsim.policies.registry import accepted_params, parse_param

    flags = parse_flags("FLAGS_gpu_memory_limit_mb=1073741824,FLAGS_eager_delete_tensor_gb=+1e-3")
    assert flags.limit_bytes == 1 << 50 and flags.params["threshold"] == int(1e-3 * GiB)
    assert parse_flags("FLAGS_eager_delete_tensor_gb=1048576").params["threshold"] == 1 << 50
    assert parse_alloc_conf("max_split_size_mb:+0256,garbage_collection_threshold:.5").params == {
        "max_split_size": 256 << 20, "garbage_collection_threshold": 0.5}
    threshold = next(p for p in accepted_params("deferred-gc") if p.name == "threshold")
    assert parse_param(threshold, "1024TiB") == 1 << 50 and parse_param(threshold, 1 << 50) == 1 << 50
    with pytest.raises(ValueError, match="parameter threshold=1125899906842625: must be <= 1,125,899,906,842,624"):
        parse_param(threshold, (1 << 50) + 1)


@pytest.mark.parametrize("field", ["increase_bytes", "addr", "place"])
@pytest.mark.parametrize("kind", sorted(ODD_DIGITS))
def test_paddle_numbers_take_ascii_digits_only(tmp_path, field, kind):
    path, _ = paddle_odd_number(tmp_path, random.Random(0), field, ODD_DIGITS[kind])
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    said = str(err.value)
    assert path.name in said and "traceEvents[1]" in said and "\n" not in said
    assert {"increase_bytes": "increase_bytes is not an integer", "addr": "addr is not a 64-bit integer",
            "place": "is not modelled"}[field] in said


# ------------------------------------------------------------------ item 6: scale given one recording twice
def test_scale_refuses_one_recording_at_two_values(tmp_path, capsys):
    specs, _ = same_recording_twice(tmp_path, random.Random(0))
    first = specs[0].rsplit("@", 1)[0]
    for pair in (specs, [specs[0], f"{first}@3"]):       # a renamed gzipped copy, and the same path twice
        assert main(["scale", *pair, "--to", "8", "-o", str(tmp_path / "out.parquet")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "hold the same events" in err[0], err
        assert "record the program once per value" in err[0] and "TRACE@VALUE" in err[0]
    assert not (tmp_path / "out.parquet").exists()


def test_scale_compares_content_not_paths(tmp_path):
    """A Parquet conversion of a recording is the same recording; two recordings that differ only in time are not."""
    from allocsim.scale import load_input
    from allocsim.scale.inputs import recording_digest
    from allocsim.trace import write_trace

    specs, _ = same_recording_twice(tmp_path, random.Random(1))
    path = specs[0].rsplit("@", 1)[0]
    trace = read_trace(path)
    write_trace(trace, tmp_path / "converted.parquet")
    assert recording_digest(read_trace(tmp_path / "converted.parquet")) == recording_digest(trace)
    rerun = read_trace(path)
    rerun.events = trace.events.assign(t_ns=trace.events["t_ns"] + 1000)     # the same sizes, another run
    assert recording_digest(rerun) != recording_digest(trace)
    with pytest.raises(Exception, match="hold the same events"):
        from allocsim.scale.build import Scaler
        Scaler([load_input(path, 2), load_input(str(tmp_path / "converted.parquet"), 4)], "batch")


# ------------------------------------------------------------------ item 7: the report's byte counts past 2**53
JS_SAFE = (1 << 53) - 1


def _numbers(value):
    """Every int and numeric string in the page's data, walked plainly."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


@pytest.fixture(scope="module")
def huge_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("huge")
    path, expected = huge_live_bytes_trace(folder, random.Random(0))
    out = folder / "report.html"
    assert main(["report", str(path), "--policy", "pytorch", "-o", str(out)]) == 0
    return out, expected["peak_live_bytes"], read_trace(path)


def test_report_data_carries_byte_counts_past_2_53_exactly(huge_report):
    from tests.test_report import page_data

    out, peak, trace = huge_report
    assert peak > JS_SAFE and peak % 2 == 1          # a JavaScript Number would round it
    data = page_data(out.read_text(encoding="utf-8"))
    assert all(abs(n) <= JS_SAFE for n in _numbers(data)), "a JSON number past 2**53 loses digits in the page"
    run = data["runs"][0]
    assert run["peak_requested_bytes"] == run["lower_bound_bytes"] == str(peak)
    assert sum(int(v) for v in run["categories"]["at_peak"].values()) == peak
    sizes = sorted(int(row[1]) for row in data["allocs"])
    assert sizes == sorted(trace.events.query("kind == 1")["size_bytes"].tolist())
    assert max(int(v) for v in data["timelines"]["live"]) == peak


@pytest.mark.full
def test_report_shows_exact_byte_counts_in_chromium(huge_report):
    from tests.test_report import _chrome

    out, peak, _ = huge_report
    browser = _chrome()
    try:
        browser.get(out.as_uri())
        assert browser.execute_script("return document.body.dataset.ready") == "1"
        assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
        shown = f"{peak:,}"
        assert shown in browser.execute_script("return document.getElementById('summary').innerText")
        assert shown in browser.execute_script("return document.getElementById('cats').innerText")
        # The tooltips: an allocation's size, and the timeline's value at the peak column.
        rows = browser.execute_script("return D.allocs.map((a, i) => [String(a[1]), allocText(i)])")
        assert rows and all(f"({int(size):,} bytes)" in text for size, text in rows)
        tips = browser.execute_script(
            "const j = TL.series.findIndex(s => s.name.startsWith('live')); const col = TL.cols[j];"
            "const p = col.indexOf(Math.max(...col)); return both(TL.series[j].v[TL.ats[j][p]]);")
        assert tips.endswith(f"({shown} bytes)")
        assert browser.execute_script("return exact('" + str(peak) + "')") == shown
    finally:
        browser.quit()
