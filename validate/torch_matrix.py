"""Capture the same scripts under several torch releases and tabulate their peaks: ``python -m validate torch-matrix --python PY ...``.

A capture follows the torch it runs in, so the same script can ask for different memory under two
releases where the releases' CUDA code differs (autograd's backward of a slice, which SDPA kernel
runs, CUDA reductions' vectorisation). For each interpreter given (each with its own torch, CPU or
CUDA build: ``python -m validate torch-env VERSION DIR`` makes a small one), this captures

* the project's fixtures (``validate/torch_matrix_scripts/``: an MLP with AdamW, a CNN under float16
  autocast with a GradScaler, a small GPT under bfloat16 autocast with causal and masked SDPA and a
  loss on the last position's logits), replayed through the pytorch preset: peaks per release;
* with ``--repos``, the public scripts behind the shared scale-series snapshots (``snapshot_recipes.json``,
  as ``python -m validate snapshots`` does): each capture's peaks over the snapshot's window against
  the recording's, per release, and whether the release is the one the recording was made with
  (the recipe's ``torch``: the repository's lock file).

A release that cannot run a script says why in its cell. Nothing here is part of the fast suite: one
interpreter takes about 30 s for the fixtures and 5 to 10 minutes for the 20 scale-series captures
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from allocsim.torch_capture import torch_versions

from . import snapshot_captures as sc

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "torch_matrix_scripts"
#: The card the fixtures are captured for (its kernels: cuBLAS workspace, SDPA choice).
FIXTURE_GPU = "H100"
PEAKS = ("requested", "allocated", "reserved")


def interpreter_torch(python: str) -> str:
    """The torch version ``python`` imports (raises ``ValueError`` when it has none)."""
    done = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{python} cannot import torch: {last}")
    return done.stdout.strip().splitlines()[-1]


def fixtures() -> list[Path]:
    """The fixture scripts, by name."""
    return sorted(FIXTURES.glob("*.py"))


def capture_fixture(python: str, script: Path, work: Path, gpu: str = FIXTURE_GPU) -> dict[str, Any]:
    """Capture ``script`` in ``python`` and replay it: ``{"peaks": {...}, "allocs": N}`` or ``{"error": text}``."""
    import allocsim

    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{script.stem}.parquet"
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "--gpu", gpu, "-o", str(out), "--",
                           python, str(script)], capture_output=True, text=True, cwd=str(work))
    if done.returncode != 0 or not out.exists():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"error": (lines or [f"exit status {done.returncode}"])[-1]}
    trace = allocsim.read_trace(str(out))
    summary = allocsim.run(trace, "pytorch", fast=True).summary
    return {"peaks": {p: int(summary[f"peak_{p}_bytes"]) for p in PEAKS},
            "allocs": int((trace.events["kind"].to_numpy() == 1).sum())}


def recorded_torch(table: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str | None:
    """The torch the recording was made with, as its recipe says (None when the repository does not pin it)."""
    return table["captures"][snapshot["capture"]].get("torch")


def run_matrix(pythons: Iterable[str], work: str | os.PathLike, repos: str | None = None,
               shared: str | os.PathLike = sc.DEFAULT_SHARED, only: list[str] | None = None, jobs: int = 2,
               timeout: float | None = None, with_fixtures: bool = True) -> dict[str, Any]:
    """Capture the fixtures (and the scale-series scripts when ``repos`` is given) under each interpreter."""
    work = Path(work)
    table = sc.load_recipes()
    result: dict[str, Any] = {"versions": [], "fixtures": {}, "series": {}}
    for python in pythons:
        version = interpreter_torch(python)
        result["versions"].append({"python": python, "torch": version})
        folder = work / f"torch-{version.replace('+', '_')}"
        if with_fixtures:
            for script in fixtures():
                result["fixtures"].setdefault(script.stem, {})[version] = capture_fixture(python, script,
                                                                                          folder / "fixtures")
        if repos:
            rows = sc.evaluate(table, repos, folder / "series", shared, only, jobs, timeout, python=python)
            for row in rows:
                snap = next(s for s in table["snapshots"] if s["file"] == row["file"])
                cell: dict[str, Any] = {"status": row.get("status")}
                if row.get("status") == "ok":
                    cell.update(real=row["real"], capture=row["capture"], error=row["error"])
                entry = result["series"].setdefault(row["file"], {
                    "series": row["series"], "size": row["size"], "precision": row["precision"],
                    "recorded_torch": recorded_torch(table, snap), "by_version": {}})
                entry["by_version"][version] = cell
    return result


def same_release(recorded: str | None, captured: str) -> bool:
    """Whether a capture ran in the release a recording was made with."""
    return recorded is not None and not torch_versions.differ(recorded, captured) \
        and torch_versions.parse(recorded) is not None


def _mib(value: int) -> str:
    return f"{value / 2**20:,.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.3f}%"


def format_matrix(result: Mapping[str, Any]) -> str:
    """Markdown: the fixtures' peaks per release, then each scale-series snapshot's errors per release."""
    versions = [v["torch"] for v in result["versions"]]
    parts = []
    if result["fixtures"]:
        head = "| fixture | peak | " + " | ".join(f"torch {v}" for v in versions) + " |"
        lines = [f"**Fixtures** (captured for the {FIXTURE_GPU}; MiB = 2^20 bytes)", "", head,
                 "|---|---|" + "---|" * len(versions)]
        for name, cells in result["fixtures"].items():
            for peak in ("allocated", "reserved"):
                row = []
                for v in versions:
                    cell = cells.get(v)
                    row.append("-" if cell is None else _mib(cell["peaks"][peak]) if "peaks" in cell else
                               f"fails: {cell.get('error', '?')}"[:120])
                lines.append(f"| {name} | {peak} | " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    if result["series"]:
        head = ("| snapshot | recorded with | " + " | ".join(f"torch {v} alloc / reserved" for v in versions) + " |")
        lines = ["**Scale-series snapshots** (capture / recording - 1 over the snapshot's window; "
                 "**bold**: the release the recording was made with)", "", head,
                 "|---|---|" + "---|" * len(versions)]
        for entry in result["series"].values():
            row = []
            for v in versions:
                cell = entry["by_version"].get(v)
                if cell is None:
                    row.append("-")
                elif cell.get("status") != "ok":
                    row.append(f"no: {cell.get('status')}"[:120])
                else:
                    text = f"{_pct(cell['error']['allocated'])} / {_pct(cell['error']['reserved'])}"
                    row.append(f"**{text}**" if same_release(entry["recorded_torch"], v) else text)
            name = f"{entry['series']} {entry['size']} ({entry['precision']})"
            lines.append(f"| {name} | {entry['recorded_torch'] or 'not pinned'} | " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def summarize(result: Mapping[str, Any]) -> dict[str, Any]:
    """Per release: fixtures captured, scale-series rows compared, on target, and on target where the release is the recording's."""
    out: dict[str, Any] = {}
    for v in (x["torch"] for x in result["versions"]):
        cells = [e["by_version"].get(v) for e in result["series"].values()]
        ok = [(e, c) for e, c in zip(result["series"].values(), cells) if c and c.get("status") == "ok"]
        same = [(e, c) for e, c in ok if same_release(e["recorded_torch"], v)]
        out[v] = {
            "fixtures_captured": sum("peaks" in c.get(v, {}) for c in result["fixtures"].values()),
            "fixtures": len(result["fixtures"]),
            "series_compared": len(ok), "series_on_target": sum(bool(sc.on_target(c)) for _e, c in ok),
            "same_release_rows": len(same),
            "same_release_exact": sum(c["error"]["requested"] == 0 and c["error"]["allocated"] == 0
                                      and abs(c["error"]["reserved"]) <= sc.RESERVED_TARGET for _e, c in same),
        }
    return out


def merge(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs' results (``--json`` outputs, one release each) as one matrix."""
    out: dict[str, Any] = {"versions": [], "fixtures": {}, "series": {}}
    for result in results:
        out["versions"] += [v for v in result["versions"] if v not in out["versions"]]
        for name, cells in result.get("fixtures", {}).items():
            out["fixtures"].setdefault(name, {}).update(cells)
        for name, entry in result.get("series", {}).items():
            mine = out["series"].setdefault(name, {**entry, "by_version": {}})
            mine["by_version"].update(entry["by_version"])
    return out


def register(subparsers) -> None:
    """Add the ``torch-matrix`` subcommand."""
    parser = subparsers.add_parser("torch-matrix", help="capture the same scripts under several torch releases",
                                   description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", default=[], metavar="PY",
                        help="an interpreter with torch (repeat for each release)")
    parser.add_argument("--table", nargs="+", default=None, metavar="JSON",
                        help="print the matrix of earlier --json outputs (one release each) instead of capturing")
    parser.add_argument("--work", default="torch-matrix-work", metavar="DIR",
                        help="where captures are written, one folder per release (default: torch-matrix-work)")
    parser.add_argument("--repos", default=None, metavar="DIR",
                        help="also the scale-series scripts: their repositories' files as DIR/OWNER+REPO/ "
                             "(as python -m validate snapshots --repos)")
    parser.add_argument("--extract-from", default=None, metavar="GITS",
                        help="first write each recipe's files into --repos from local clones GITS/OWNER+REPO")
    parser.add_argument("--shared", default=str(sc.DEFAULT_SHARED), metavar="DIR",
                        help="the shared data folder holding traces/scale-series/ (default: ../shared)")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="only snapshots whose file name contains TEXT or whose series is TEXT")
    parser.add_argument("--no-fixtures", action="store_true", help="leave the fixtures out")
    parser.add_argument("--jobs", type=int, default=2, help="captures at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="stop each capture after S seconds")
    parser.add_argument("--json", action="store_true", help="print the matrix as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Capture, replay, print the tables (or JSON)."""
    if args.table:
        result = merge(json.loads(Path(path).read_text(encoding="utf-8")) for path in args.table)
        _print(result, args.json)
        return 0
    if not args.python:
        raise ValueError("give --python PY (an interpreter with torch), or --table JSON ...")
    if args.extract_from:
        if not args.repos:
            raise ValueError("--extract-from writes into --repos: give --repos too")
        for line in sc.extract_all(sc.load_recipes(), args.extract_from, args.repos):
            print(f"extract: {line}")
    result = run_matrix(args.python, args.work, args.repos, args.shared, args.only, args.jobs, args.timeout,
                        not args.no_fixtures)
    _print(result, args.json)
    return 0


def _print(result: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps({**result, "summary": summarize(result)}, indent=1))
        return
    print(format_matrix(result))
    for version, counts in summarize(result).items():
        print(f"\ntorch {version}: fixtures {counts['fixtures_captured']}/{counts['fixtures']} captured; "
              f"scale-series {counts['series_on_target']}/{counts['series_compared']} on target, "
              f"{counts['same_release_exact']}/{counts['same_release_rows']} exact where the recording "
              "was made with this release", end="")
    print()
