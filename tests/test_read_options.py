"""Every command that reads a trace takes the read options (--lenient, --limits, --max-events, ...)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from allocsim.cli import main
from allocsim.sweep.tasks import row_key
from allocsim.trace.reading.limits import DEFAULT_LIMITS

BERT = Path(__file__).resolve().parents[1] / "traces" / "bert_fp32.json.gz"


@pytest.mark.parametrize("argv", [
    ["info", str(BERT)],
    ["run", str(BERT), "--policy", "pytorch", "--fast"],
    ["advise", str(BERT), "--capacity", "4GiB", "--fast", "--workers", "1"],
    ["plot", str(BERT), "-o", "{tmp}/plots"],
    ["scale", f"{BERT}@1", f"{BERT}@2", "--to", "3", "-o", "{tmp}/out.parquet"],
    ["convert", str(BERT), "-o", "{tmp}/out.parquet"],
])
def test_a_cap_the_file_exceeds_is_one_line_naming_the_option(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ALLOCSIM_CACHE_DIR", str(tmp_path / "cache"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv + ["--max-events", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bert_fp32.json.gz" in err and "--max-events" in err


def test_sweep_workers_read_with_the_options_the_user_gave(tmp_path, capsys):
    out = tmp_path / "rows.parquet"
    assert main(["sweep", str(BERT), "--policy", "pytorch", "--fast", "--workers", "1", "-o", str(out),
                 "--max-events", "100"]) == 1   # a row that failed makes the sweep exit 1
    rows = pd.read_parquet(out)
    assert "--max-events" in rows["error"].iat[0]
    assert main(["sweep", str(BERT), "--policy", "pytorch", "--fast", "--workers", "1", "-o", str(out),
                 "--retry-errors", "--limits", "events=1e6"]) == 0
    assert pd.read_parquet(out)["error"].isna().all()


def test_a_lenient_read_is_another_row_and_limits_are_not():
    key = ["sha", "pytorch", "{}", None, None, True]
    assert row_key(*key, lenient=True) != row_key(*key) == row_key(*key, lenient=False)
    assert DEFAULT_LIMITS.with_overrides({"events": "5"}) != DEFAULT_LIMITS   # part of the worker's cache key
