"""``allocsim run --cost-model FILE`` also takes the calibrated device footprint rule."""

from __future__ import annotations

import json

from allocsim.cli import main
from allocsim.cost import CostModel
from allocsim.trace import write_trace
from allocsim.trace.reading.builder import TraceBuilder


def test_calibrated_granularity_sets_direct_footprint(tmp_path, capsys):
    b = TraceBuilder("t", "test")
    sizes = [1, 5000, 3 << 20]
    for i, size in enumerate(sizes):
        b.alloc(i, i, 0, 0, 0x1000 * (i + 1) << 12, size)
    trace_path = tmp_path / "t.parquet"
    write_trace(b.finish(), trace_path)
    model = CostModel.from_overrides({"_granularity_bytes": 4096, "_small_granularity_bytes": 4096})
    model_path = tmp_path / "cal.json"
    model.save(model_path)

    assert main(["run", str(trace_path), "--policy", "direct", "--fast", "--json", "--cost-model", str(model_path)]) == 0
    calibrated = json.loads(capsys.readouterr().out)["peak_reserved_bytes"]
    assert calibrated == sum(-(-s // 4096) * 4096 for s in sizes)

    assert main(["run", str(trace_path), "--policy", "direct", "--fast", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)["peak_reserved_bytes"]
    assert default == 3 * (2 << 20) + (2 << 20)  # two whole 2 MiB pages for the small ones, 4 MiB for 3 MiB

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"_granularity_bytes": -5}))
    assert main(["run", str(trace_path), "--policy", "direct", "--fast", "--cost-model", str(bad)]) == 2
    assert "_granularity_bytes" in capsys.readouterr().err
