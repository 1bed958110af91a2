"""The public API the notebooks use gives what the commands give: attribute_run, sweep/winners, scale/find_max."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim import api
from allocsim.cli import main as cli_main
from tests.test_sweep import write_tiny

TRACES = Path(__file__).resolve().parents[1] / "traces"


def test_attribute_run_adds_up_to_what_run_reports(tmp_path):
    trace = api.read_trace(str(write_tiny(tmp_path / "tiny.parquet", n=400, streams=2)))
    for policy in ("pytorch", "paddle"):
        result, observer, table = api.attribute_run(trace, policy, every=50)
        ran = api.run(trace, policy).summary
        assert sum(observer.peak.values()) == result.summary["peak_reserved_bytes"] == ran["peak_reserved_bytes"]
        assert set(observer.peak) == set(api.ATTRIBUTION_PARTS) == set(api.ATTRIBUTION_LABELS)
        assert (table[list(api.ATTRIBUTION_PARTS)].sum(axis=1) == table["reserved_bytes"]).all()
    with pytest.raises(ValueError, match="memory_fraction"):
        api.attribute_run(trace, "pytorch", {"memory_fraction": 7})


def test_sweep_rows_are_the_commands_and_winners_picks_the_lowest_peak_that_fits(tmp_path, capsys):
    tiny = write_tiny(tmp_path / "tiny.parquet")
    rows = api.sweep(tiny, ["pytorch"], ["max_split_size=none,32MiB"], ["memory_fraction=1"], capacity="1GiB",
                     fast=True, output=tmp_path / "r.parquet")
    assert len(rows) == 2 and rows["error"].isna().all() and (tmp_path / "r.parquet").is_file()
    assert cli_main(["sweep", str(tiny), "--policy", "pytorch", "--grid", "max_split_size=none,32MiB", "--set",
                     "memory_fraction=1", "--capacity", "1GiB", "--fast", "-o", str(tmp_path / "c.parquet"),
                     "--workers", "1"]) == 0
    capsys.readouterr()
    import pandas as pd

    command = pd.read_parquet(tmp_path / "c.parquet")
    assert rows["peak_reserved_bytes"].tolist() == command["peak_reserved_bytes"].tolist()
    picked = api.winners(rows, ["peak_reserved_bytes"], capacity="1GiB")
    assert picked.winner["peak_reserved_bytes"] == rows["peak_reserved_bytes"].min()
    with pytest.raises(ValueError, match="banana"):
        api.sweep(tiny, ["pytorch"], ["garbage_collection_threshold=0,banana"])


def test_scale_predicts_a_held_out_capture_and_find_max_orders_its_answers():
    captures = {b: TRACES / "scales" / f"bert_b{b}_s128.json.gz" for b in (2, 3, 4)}
    scaler = api.scale({b: captures[b] for b in (2, 3)}, "batch")
    predicted = scaler.at(4)
    [truth] = [item.trace for item in api.scale(captures, "batch").inputs if item.value == 4]
    assert predicted.trace.events["size_bytes"].tolist() == truth.events["size_bytes"].tolist()
    found = api.find_max(scaler, "3GiB", advise=False)
    assert found.advised is None and found.recorded.value <= found.bound.value


@pytest.mark.shared
def test_scale_refuses_a_mixed_pair_in_one_line(shared_dir):
    series = shared_dir / "traces" / "scale-series"
    pair = {128: series / "charliesabino_cs336-assignment2_2.7B-128-fwd-memory-snapshot.pickle",
            256: series / "charliesabino_cs336-assignment2_2.7B-256-fwd-memory-snapshot_mixed.pickle"}
    with pytest.raises(ValueError) as refused:
        api.scale(pair, "seq")
    message = str(refused.value)
    assert "\n" not in message and "autocast in charliesabino_cs336-assignment2_2.7B-256" in message
    assert "--allow-mixed" in message
