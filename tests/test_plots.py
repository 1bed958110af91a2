"""Plots are pure functions (tables in, labelled Axes out, no disk); downsampling keeps peaks; ``allocsim plot``.

The command is exercised end to end on a shipped trace (files written), on a result directory written by
``allocsim run -o`` and on a sweep results file, and refuses bad input with exit 2 and one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from allocsim.cli import main as cli_main  # noqa: E402
from allocsim.engine import simulate  # noqa: E402
from allocsim.runner import attribute_run  # noqa: E402
from allocsim.plots import (  # noqa: E402
    comparison_table,
    downsample,
    plot_attribution,
    plot_latency,
    plot_pareto,
    plot_policy_comparison,
    plot_segment_map,
    plot_sweep_heatmap,
    plot_timeline,
    step_markers,
)
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.reading.builder import TraceBuilder  # noqa: E402
from allocsim.units import MiB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BERT = ROOT / "traces" / "bert_fp32.json.gz"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def bert():
    return read_trace(BERT)


@pytest.fixture(scope="module")
def bert_run(bert):
    return attribute_run(bert, "pytorch")


def small_trace():
    """Eight allocations on two streams, some freed: a trace that runs out of 32 MiB."""
    b = TraceBuilder("small", "test")
    for k in range(8):
        b.alloc(k, 10 * k, 0, k % 2, 0x1000 * (k + 1), (k + 1) * 3 * MiB)
        if k % 3 == 2:
            b.free(100 + k, 10 * k + 5, 0, k % 2, 0x1000 * k)
    return b.finish()


@pytest.fixture
def no_disk(monkeypatch, tmp_path):
    """Fail if a plot function saves a figure; run in an empty directory to catch stray files."""
    def refuse(*args, **kwargs):
        raise AssertionError("a plot function saved a figure")

    monkeypatch.setattr(Figure, "savefig", refuse)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


def labelled(ax) -> None:
    assert ax.get_title() and ax.get_xlabel()


def test_timeline_draws_labelled_axes_with_lower_bound_capacity_and_oom(no_disk):
    """The timeline names its axes and series, marks the lower bound, the capacity and the OOM."""
    result = simulate(small_trace(), "pytorch", fast=True, capacity_bytes=32 * MiB)
    assert len(result.ooms) == 1
    ax = plot_timeline(result)
    labelled(ax)
    assert "GiB" in ax.get_ylabel() and "(s)" in ax.get_xlabel()
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    for word in ("reserved", "allocated", "requested", "lower bound", "capacity", "out of memory"):
        assert word in legend


@pytest.mark.full
def test_attribution_segment_map_latency_on_a_real_run(no_disk, bert, bert_run):
    """Stacked attribution, segment map and latency of the BERT run: titled, labelled, legends."""
    result, observer, table = bert_run
    ax = plot_attribution(table, result.summary)
    labelled(ax)
    assert "GiB" in ax.get_ylabel()
    assert any("live data" in t.get_text() for t in ax.get_legend().get_texts())
    ax = plot_segment_map(observer.peak_segments, max_segments=5)
    labelled(ax)
    assert "MiB" in ax.get_xlabel()
    assert "smaller segments" in ax.get_yticklabels()[-1].get_text()
    ax = plot_latency({"pytorch": result})
    labelled(ax)
    assert "µs" in ax.get_xlabel() and ax.get_xscale() == "log"
    ax = plot_timeline(result, markers=step_markers(bert, result.timeseries, result.summary))
    assert any("ProfilerStep#2" in t.get_text() for t in ax.texts)


def test_latency_of_a_fast_run_says_there_is_none(no_disk):
    ax = plot_latency({"fast": simulate(small_trace(), "bestfit", fast=True)})
    assert "no latency data" in ax.texts[0].get_text()


def test_policy_comparison_bars(no_disk, bert):
    """One bar per policy (first on top), split by cause, with the lower bound line."""
    peaks = {}
    for name in ("direct", "pytorch"):
        _, obs, _ = attribute_run(bert, name, every=None, resolution=None, fast=True, segments_at_peak=False)
        peaks[name] = obs.peak
    table = comparison_table(peaks)
    assert (table["peak_reserved_bytes"] == table[["live_requested", "device_rounding", "rounding",
                                                   "free_slivers"]].sum(axis=1)).all()
    ax = plot_policy_comparison(table, lower_bound_bytes=2_104_640_000)
    labelled(ax)
    by_height = sorted((t.get_position()[1], t.get_text()) for t in ax.get_yticklabels())
    assert [text for _, text in by_height] == ["pytorch", "direct"]   # the first policy is on top


def sweep_rows() -> pd.DataFrame:
    rows = []
    for msz in ("none", "64MiB"):
        for gc in ("0.0", "0.6"):
            rows.append({"trace": "t.pickle", "policy": "pytorch", "params_json": json.dumps([msz, gc]),
                         "param.max_split_size": msz, "param.garbage_collection_threshold": gc,
                         "peak_reserved_bytes": (5 if gc == "0.0" else 4) * 2**30 + (msz == "64MiB") * 2**28,
                         "alloc_latency_ns.p99": 500 if msz == "none" else 1_600_000,
                         "oom_count": 0, "error": None, "completed": True})
    rows[-1]["oom_count"] = 1
    return pd.DataFrame(rows)


def test_sweep_heatmap_and_pareto(no_disk):
    """Heatmap cells per configuration (OOM marked); the Pareto front joins the non-dominated points."""
    rows = sweep_rows()
    ax = plot_sweep_heatmap(rows, x="max_split_size")
    labelled(ax)
    texts = [t.get_text() for t in ax.texts]
    assert any("OOM" in t for t in texts) and len(texts) == 4
    ax = plot_pareto(rows, winner=rows.iloc[1])
    labelled(ax)
    assert "lower is better" in ax.get_ylabel()
    front_line = [line for line in ax.get_lines() if line.get_label().startswith("Pareto front")][0]
    assert front_line.get_label() == "Pareto front (1 point)"   # (4 GiB, 500 ns) dominates the others


@pytest.mark.full
def test_downsample_keeps_every_peak_exactly():
    """Min/max per bucket: each column's exact maximum and minimum, at their first rows, survive."""
    rng = np.random.default_rng(7)
    n = 1_000_000
    x = np.cumsum(rng.integers(0, 3, n)).astype(float)
    cols = {"a": np.cumsum(rng.normal(size=n)), "b": rng.integers(0, 1_000_000, n)}
    cols["b"][123_457] = 10**9    # a single-sample spike
    keep = downsample(x, cols, max_points=2000)
    assert len(keep) <= 2 * 2000 + 2 and np.all(np.diff(keep) > 0)
    for values in cols.values():
        assert values[keep].max() == values.max() and values[keep].min() == values.min()
        assert int(np.argmax(values)) in set(keep.tolist())
    assert 123_457 in set(keep.tolist()) and keep[0] == 0 and keep[-1] == n - 1
    assert len(downsample(x[:100], {"a": cols["a"][:100]}, max_points=2000)) == 100


def test_timeline_draws_few_points_for_a_long_run_but_keeps_the_peak(no_disk):
    """A long time series is drawn with at most about max_points points per line; the peak is on it."""
    n = 200_000
    t = np.arange(n, dtype=np.int64) * 1000
    reserved = np.minimum(np.arange(n), 150_000) * 10
    reserved[77_777] = 5 * 2**30
    ts = pd.DataFrame({"event_index": np.arange(-1, n - 1), "t_ns": t, "kind": np.ones(n, dtype=np.uint8),
                       "requested_bytes": reserved // 2, "allocated_bytes": reserved // 2,
                       "active_bytes": reserved // 2, "reserved_bytes": reserved})
    ax = plot_timeline(ts, {"policy": "x"}, max_points=1000)
    lines = [line for line in ax.get_lines() if line.get_label().startswith("reserved")]
    ydata = np.asarray(lines[0].get_ydata())
    assert len(ydata) <= 1000 and ydata.max() == 5.0


# ----------------------------------------------------------------------------- the command
def run_cli(*argv) -> int:
    return cli_main([str(a) for a in argv])


@pytest.mark.full
def test_plot_command_on_a_shipped_trace(tmp_path, capsys):
    """One policy: figures (PNG and SVG) and the data they were drawn from, in DIR."""
    out = tmp_path / "figs"
    assert run_cli("plot", BERT, "-o", out) == 0
    for stem in ("timeline", "attribution", "segments", "latency"):
        for ext in ("png", "svg"):
            assert (out / f"{stem}.{ext}").stat().st_size > 1000
    for name in ("summary.json", "timeseries.parquet", "attribution.parquet", "segments_at_peak.parquet",
                 "markers.parquet"):
        assert (out / name).is_file()
    table = pd.read_parquet(out / "attribution.parquet")
    assert table["at_peak"].sum() == 1
    assert "timeline" in capsys.readouterr().out


@pytest.mark.full
def test_plot_command_compares_policies_and_replots_its_output(tmp_path):
    """Several policies: one directory each plus the comparison; the output re-plots as a result directory."""
    trace = ROOT / "traces" / "bert_recompute.json.gz"
    out = tmp_path / "cmp"
    assert run_cli("plot", trace, "--policy", "pytorch", "--policy", "deferred-gc", "--set", "threshold=64MiB",
                   "--fast", "-o", out) == 0
    assert (out / "comparison.png").is_file() and (out / "comparison.svg").is_file()
    assert not (out / "latency.png").exists()   # --fast: no timing
    for label in ("pytorch", "deferred-gc"):
        assert (out / label / "timeline.png").is_file() and (out / label / "segments.svg").is_file()
    summary = json.loads((out / "deferred-gc" / "summary.json").read_text())
    assert summary["params"]["threshold_bytes"] == 64 * MiB
    comparison = pd.read_parquet(out / "comparison.parquet")
    assert comparison["policy"].tolist() == ["pytorch", "deferred-gc"]
    again = tmp_path / "again"
    assert run_cli("plot", out, "-o", again) == 0
    assert (again / "comparison.png").is_file() and (again / "pytorch" / "attribution.png").is_file()


@pytest.mark.full
def test_plot_command_on_a_run_result_directory(tmp_path, capsys):
    """`allocsim run -o DIR` output: the timeline and latency figures are drawn beside its tables."""
    run_dir = tmp_path / "run"
    assert run_cli("run", ROOT / "traces" / "bert_accum.json.gz", "--policy", "cupy", "-o", run_dir) == 0
    capsys.readouterr()
    assert run_cli("plot", run_dir) == 0
    assert (run_dir / "timeline.png").is_file() and (run_dir / "latency.svg").is_file()
    assert not (run_dir / "attribution.png").exists()


@pytest.mark.full
def test_plot_command_on_sweep_results(tmp_path):
    """A sweep results file: a heatmap and, for a timed sweep, the Pareto front."""
    sweep = pytest.importorskip("allocsim.sweep")
    configs = sweep.build_configs(["pytorch"], ["max_split_size=none,32MiB", "expandable_segments=false,true"])
    results = tmp_path / "r.parquet"
    sweep.run_sweep([str(ROOT / "traces" / "bert_recompute.json.gz")], configs, output=results,
                    log=lambda message: None)
    out = tmp_path / "sweep-figs"
    assert run_cli("plot", results, "-o", out) == 0
    for name in ("heatmap.png", "heatmap.svg", "pareto.png", "pareto.svg", "sweep_rows.parquet"):
        assert (out / name).is_file()


@pytest.mark.parametrize("argv, message", [
    (["plot", "no/such/file.json", "-o", "x"], "no such file"),
    (["plot", str(BERT), "--policy", "nope", "-o", "{tmp}"], "unknown policy"),
    (["plot", str(BERT), "--set", "bogus=1", "-o", "{tmp}"], "bogus"),
    (["plot", str(BERT)], "-o DIR is required"),
])
def test_plot_command_bad_input_exits_2_with_one_line(argv, message, tmp_path, capsys):
    code = run_cli(*[a.replace("{tmp}", str(tmp_path / "o")) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("allocsim plot: error:")


@pytest.mark.full
def test_plot_compares_settings_of_one_policy_side_by_side(tmp_path):
    """`--policy pytorch --policy pytorch:expandable_segments:True`: two runs, labelled by their settings."""
    trace = ROOT / "traces" / "bert_recompute.json.gz"
    out = tmp_path / "cmp"
    assert run_cli("plot", trace, "--policy", "pytorch", "--policy", "pytorch:expandable_segments:True",
                   "--fast", "-o", out) == 0
    comparison = pd.read_parquet(out / "comparison.parquet")
    assert comparison["policy"].tolist() == ["pytorch", "pytorch:expandable_segments:True"]
    plain = json.loads((out / "pytorch" / "summary.json").read_text())
    expandable = json.loads((out / "pytorch_expandable_segments_True" / "summary.json").read_text())
    assert plain["params"]["expandable_segments"] is False and expandable["params"]["expandable_segments"] is True
    assert plain["device_maps"] == 0 < expandable["device_maps"]


def test_titles_name_the_non_default_settings(no_disk):
    result = simulate(small_trace(), "pytorch", fast=True, params={"max_split_size": "64MiB",
                                                                   "expandable_segments": "true"})
    title = plot_timeline(result).get_title()
    assert "pytorch (max_split_size_mb:64,expandable_segments:True)" in title
    plain = simulate(small_trace(), "pytorch", fast=True)
    assert "Memory over time — pytorch\n" in plot_timeline(plain).get_title()
    gc = simulate(small_trace(), "deferred-gc", fast=True, params={"threshold": "1GiB"})
    assert "deferred-gc(paddle) (threshold=1GiB)" in plot_timeline(gc).get_title()


@pytest.mark.full
def test_plot_memory_follows_the_recorded_stream_order(tmp_path):
    """A timed plot of a two-stream trace draws the trace-order memory; the timed series feeds latency only."""
    out = tmp_path / "p"
    trace = small_trace()
    from allocsim.trace import write_trace

    write_trace(trace, tmp_path / "t.parquet")
    assert run_cli("plot", tmp_path / "t.parquet", "-o", out) == 0
    fast = simulate(trace, "pytorch", fast=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peak_reserved_bytes"] == fast.summary["peak_reserved_bytes"]
    assert summary["timed_memory"]["streams"] == 2 and (out / "latency.png").is_file()
    assert (out / "timeseries_timed.parquet").is_file()
