"""Parameter sweeps over allocator policies, resumable and parallel; see ``allocsim sweep --help``.

    from allocsim.sweep import build_configs, run_sweep, make_executor
    configs = build_configs(["pytorch"], grid_items=["max_split_size=none,256MiB"])
    report = run_sweep(["traces/bert_fp32.json.gz"], configs, output="results.parquet", fast=True,
                       executor=make_executor(workers=2))

Modules, one idea each: ``grid`` (parse and expand grids), ``tasks`` (what a row needs and its
key), ``worker`` (run one task where it lands, traces cached per process), ``flatten`` (summary ->
tidy row), ``journal`` (finished rows on disk as they come), ``results`` (the Parquet file),
``executors`` (in-process, process pool, Dask), ``driver`` (resume, run, write), ``failures``
(each distinct error with its rows), ``pareto`` (what ``allocsim winners`` reports).
"""

from .driver import SweepReport, SweepStopped, executor_from_options, run_sweep
from .executors import DaskExecutor, InProcessExecutor, ProcessPoolExecutor, make_executor
from .flatten import PERF_COLUMNS, deterministic, flatten
from .grid import Config, build_configs, make_config, set_args
from .journal import Journal, journal_dir
from .results import read_metadata, read_results, write_results

__all__ = [
    "Config", "DaskExecutor", "InProcessExecutor", "Journal", "PERF_COLUMNS", "ProcessPoolExecutor",
    "SweepReport", "SweepStopped", "build_configs", "deterministic", "executor_from_options", "flatten",
    "journal_dir", "make_config", "make_executor", "read_metadata", "read_results", "run_sweep", "set_args",
    "write_results",
]
