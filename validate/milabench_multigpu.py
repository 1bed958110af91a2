"""milabench's several-GPU rows captured per rank and held against its tables: ``python -m validate milabench-multigpu``.

    python -m validate milabench-multigpu --work milabench-work --python PYTHON [--card H100] [--batch 128]

milabench's ``*-gpus`` rows run one process per GPU of an 8-GPU node and record the largest NVML
``used`` figure of any GPU (``benchmate.monitor.multigpu_monitor``; ``validate/milabench.py`` has the
ground truth's terms). Each row here is captured as the distributed job it is (``allocsim capture -o
DIR --gpu CARD --steps 3`` with ``LOCAL_WORLD_SIZE`` set to the node's GPU count, which the script asks
for before it spawns its ranks), answered per rank by ``allocsim run DIR --policy pytorch --gpu CARD
--json`` (the limiting rank's ``gpu_estimate``: reserved peak, context, cuDNN and NCCL's buffers, each
unknown term with its range), and compared in NVML's terms (the card's NVML reserved memory added to
the total, its low and its high end). Nothing is fitted here: the terms are the single-GPU
calibration's (``validate/milabench_calibration.json``) and NCCL's model (``allocsim.nccl``).

Reproduced: ``resnet152-ddp-gpus`` (``milabench_scripts/torchvision_ddp_bench.py``). Not yet:
``llm-lora-ddp-gpus`` and ``llm-full-mp-gpus`` (torchtune recipes; ``LEFT_OUT`` says why).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from . import milabench

MiB = milabench.MiB
#: GPUs on the node milabench's several-GPU rows ran on (8 on every card of the tables).
NODE_GPUS = 8
#: A trace of the third step: DDP rebuilds its buckets in the second iteration.
STEPS = 3
#: Reproduced several-GPU benchmarks: script and arguments (milabench's config/base.yaml argv).
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "resnet152-ddp-gpus": ("torchvision_ddp_bench.py", ["--model", "resnet152"]),
}
LEFT_OUT = {
    "llm-lora-ddp-gpus": "torchtune 0.5 lora_finetune_distributed (milabench's copy): Llama 3.1 8B weights, its "
                         "tokenizer and the alpaca-cleaned data set (the batches' sequence lengths) from the Hub",
    "llm-full-mp-gpus": "torchtune 0.5 full_finetune_distributed (milabench's copy): Llama 3.1 70B weights, its "
                        "tokenizer and the alpaca-cleaned data set from the Hub",
}


def select(rows: list[dict[str, Any]], cards: list[str] | None = None, batches: list[int] | None = None,
           benchmarks: list[str] | None = None) -> list[dict[str, Any]]:
    """The calibrate and check rows of the reproduced several-GPU benchmarks (outliers left out)."""
    out = []
    for r in rows:
        if r["benchmark"] not in BENCHMARKS or r["set"] not in ("calibrate", "check") or r.get("outlier"):
            continue
        if cards and r["card"] not in cards or batches and r["batch"] not in batches:
            continue
        if benchmarks and r["benchmark"] not in benchmarks:
            continue
        out.append(r)
    return out


def capture_dir(row: dict[str, Any], work: str) -> str:
    gpu = milabench.capture_gpu(row).replace(" ", "")
    return os.path.join(work, f"{row['benchmark']}_{row['batch']}_{gpu}")


def capture(row: dict[str, Any], work: str, python: str) -> str:
    """The row's capture folder in ``work`` (captured now unless its manifest is there)."""
    out = capture_dir(row, work)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    script, args = BENCHMARKS[row["benchmark"]]
    argv = [sys.executable, "-m", "allocsim", "capture", "--gpu", milabench.capture_gpu(row), "--steps", str(STEPS),
            "--workers", "1", "-o", out + "/", "--", python, os.path.join(milabench.SCRIPTS, script), *args,
            "--batch-size", str(row["batch"])]
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(NODE_GPUS))
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {os.path.basename(out)} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return out


def row_torch(row: dict[str, Any]) -> str | None:
    """The torch release the row ran (its table's pins: 2.6.0 for the 2025 tables), without the local tag."""
    torch = (row.get("libraries") or {}).get("torch")
    return str(torch).split("+")[0] if torch else None


def estimate(folder: str, card: str, torch: str | None = None) -> dict[str, Any]:
    """``allocsim run FOLDER --policy pytorch --gpu MODEL [--torch T] --json``: the limiting rank's total and range,
    in bytes. ``--torch`` is the row's own release: NCCL's buffers are those of the NCCL it ships (2.21.5 for
    torch 2.6: NVLS 800 MiB per 8-GPU H100 rank, docs/nccl.md)."""
    model = milabench.CARDS[card]["model"]
    argv = [sys.executable, "-m", "allocsim", "run", folder, "--policy", "pytorch", "--gpu", model, "--json"]
    if torch:
        argv += ["--torch", torch]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 3):       # 3: anything but FITS (the JSON is written all the same)
        raise RuntimeError(f"allocsim run {folder} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    data = json.loads(done.stdout)
    limiting = data.get("limiting_rank")
    ranks = data["ranks"]
    entry = next((r for r in ranks if limiting in r["ranks"]), None) or max(
        ranks, key=lambda r: r["gpu_estimate"]["total_bytes"])
    g = entry["gpu_estimate"]
    return {"ranks": entry["ranks_text"], "total": g["total_bytes"], "low": g["total_low_bytes"],
            "high": g["total_high_bytes"], "reserved_peak": g["reserved_peak_bytes"],
            "nccl": g.get("nccl_bytes", 0), "verdict": g.get("verdict")}


def evaluate(rows: list[dict[str, Any]], work: str, python: str, log=lambda m: None) -> list[dict[str, Any]]:
    results = []
    for row in rows:
        res = {k: row[k] for k in ("set", "card", "benchmark", "batch", "memory_mib")}
        try:
            folder = capture(row, work, python)
            est = estimate(folder, row["card"], row_torch(row))
        except RuntimeError as exc:
            res["failed"] = str(exc)
            results.append(res)
            log(f"{row['card']} {row['benchmark']} {row['batch']}: {exc}")
            continue
        reserved = milabench.CARDS[row["card"]]["nvml_reserved_mib"]
        res.update(est)
        res["allocsim_mib"] = est["total"] / MiB + reserved
        res["low_mib"] = est["low"] / MiB + reserved
        res["high_mib"] = est["high"] / MiB + reserved
        res["error"] = (res["allocsim_mib"] - row["memory_mib"]) / row["memory_mib"]
        res["inside"] = res["low_mib"] <= row["memory_mib"] <= res["high_mib"]
        results.append(res)
        log(f"{row['card']} {row['benchmark']} {row['batch']}: ground {row['memory_mib']:.0f} MiB, "
            f"allocsim {res['allocsim_mib']:.0f} MiB ({res['error']:+.1%})")
    return results


def format_table(results: list[dict[str, Any]]) -> str:
    lines = ["| benchmark | card | batch | ground MiB | allocsim MiB | error | range MiB | truth in range | set |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['benchmark']} | {r['card']} | {r['batch']} | {r['memory_mib']:,.0f} | capture failed "
                         f"| | | | {r['set']} |")
            continue
        lines.append(f"| {r['benchmark']} | {r['card']} | {r['batch']} | {r['memory_mib']:,.0f} | "
                     f"{r['allocsim_mib']:,.0f} | {r['error']:+.1%} | {r['low_mib']:,.0f} to {r['high_mib']:,.0f} | "
                     f"{'yes' if r['inside'] else 'no'} | {r['set']} |")
    return "\n".join(lines)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if "error" in r]
    if not done:
        return {"rows": 0}
    errors = [r["error"] for r in done]
    return {"rows": len(done), "median_error": statistics.median(errors),
            "median_abs_error": statistics.median(abs(e) for e in errors),
            "under_5pct": sum(e < -milabench.FALSE_FIT_MARGIN for e in errors),
            "inside": sum(r["inside"] for r in done), "worst": min(errors, key=lambda e: -abs(e))}


def register(subparsers) -> None:
    parser = subparsers.add_parser("milabench-multigpu", help="milabench's several-GPU rows captured per rank",
                                   description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="milabench-work", metavar="DIR", help="where capture folders are kept and reused")
    parser.add_argument("--python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter that runs the benchmark scripts (torch, torchvision); default: this one")
    parser.add_argument("--card", action="append", default=None, help="only this card's rows (repeatable)")
    parser.add_argument("--batch", action="append", type=int, default=None, help="only this batch (repeatable)")
    parser.add_argument("--benchmark", action="append", default=None, help="only this benchmark (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    rows = select(milabench.load()["rows"], args.card, args.batch, args.benchmark)
    os.makedirs(args.work, exist_ok=True)
    results = evaluate(rows, args.work, args.python, lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(results, indent=1, default=str))
        return 0
    print(format_table(results))
    for which in ("calibrate", "check"):
        s = summarize([r for r in results if r["set"] == which])
        if s["rows"]:
            print(f"\n{which} rows ({s['rows']}): median error {s['median_error']:+.1%}, median absolute error "
                  f"{s['median_abs_error']:.1%}, worst {s['worst']:+.1%}, more than 5% under: {s['under_5pct']}, "
                  f"truth inside the range: {s['inside']}")
    for name, why in LEFT_OUT.items():
        print(f"\nnot reproduced: {name}: {why}")
    return 0
