"""The GPU's own memory, learned from milabench's published measurements and checked on others: ``python -m validate milabench``.

milabench (mila-iqia/milabench) keeps, per GPU, the whole-GPU memory of each benchmark at several
batch sizes (``config/scaling/*.yaml``; before 2025 one ``config/scaling.yaml`` measured on an
8x A100-SXM4-80GB box). Its memory is the largest NVML ``nvmlDeviceGetMemoryInfo`` ``used`` figure
voir's monitor saw during the run (``voir/instruments/gpu/cuda.py``), which counts the driver's
reserved memory too (an idle L40S reports 46068 MiB total, 479 MiB reserved, 45589 MiB free = its
CUDA total: thamada/nvidia-smi @c768aedc nvsim/L40S_smi.py and L40S_deviceQuery.py). So

    ground = NVML reserved + CUDA context and lazily loaded kernels + cuDNN's kernels where cuDNN runs
             + the caching allocator's reserved peak (cuBLAS and cuDNN workspaces included)

``validate/milabench_rows.json`` holds the rows (``--extract GITDIR`` rebuilds it from a milabench
clone), each with its file, commit, benchmark, batch, memory and ``set``: ``calibrate`` (the L40S
table and the old A100 ``config/scaling.yaml``), ``check`` (H100, H200: never fitted on),
``excluded`` (MI325: ROCm). Each reproduced row is captured on this machine's CPU with
``validate/milabench_scripts/`` (``allocsim capture --gpu <card> --steps 2``; captures are kept in
``--work``) and replayed in this process with allocsim's PyTorch allocator model; ``--calibrate``
fits the terms above on calibrate rows only and writes ``validate/milabench_calibration.json``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS_PATH = os.path.join(HERE, "milabench_rows.json")
CALIBRATION_PATH = os.path.join(HERE, "milabench_calibration.json")
SCRIPTS = os.path.join(HERE, "milabench_scripts")
MiB = 1 << 20
FALSE_FIT_MARGIN = 0.05
#: cudaLimitStackSize's default: the local memory CUDA reserves per resident thread at context creation.
LOCAL_BYTES_PER_THREAD = 1024

#: The measured cards: allocsim's GPU model, NVML's total and reserved figures with their sources.
CARDS = {
    "L40S": {"model": "L40S", "nvml_total_mib": 46068, "nvml_reserved_mib": 479, "recorded": True,
             "source": "nvidia-smi -q 'NVIDIA L40S', driver 550.127.05: FB Memory Usage Total 46068 MiB, Reserved "
                       "479 MiB, Free 45589 MiB, thamada/nvidia-smi @c768aedc nvsim/L40S_smi.py"},
    "A100-SXM4-80GB": {"model": "A100 80GB", "nvml_total_mib": 81920, "nvml_reserved_mib": 763, "recorded": True,
                       "cuda_total_bytes": 85100068864,
                       "source": "nvidia-smi -q 'NVIDIA A100-SXM4-80GB', driver 555.42.02: Total 81920 MiB, Reserved "
                                 "763 MiB, Free 81158 MiB, thamada/nvidia-smi @b09ef139 gls/A100SXMx4_smi.py (CUDA "
                                 "total 85100068864 B: gls/A100SXMx4_deviceQuery.py)"},
    "H100": {"model": "H100", "nvml_total_mib": 81559, "nvml_reserved_mib": 454, "recorded": True,
             "source": "nvidia-smi -q 'NVIDIA H100 80GB HBM3', driver 565.57.01: Total 81559 MiB, Reserved 454 MiB, "
                       "Free 81106 MiB, thamada/nvidia-smi @03fbe6e6 nvsim/H100SXMx8_smi.py"},
    "H200": {"model": "H200", "nvml_total_mib": 143771, "nvml_reserved_mib": 611, "recorded": False,
             "source": "not recorded: nvidia-smi's H200 total 143771 MiB less allocsim's H200 CUDA total "
                       "(139.805 GiB, the lower end of PyTorch's '139.81 GiB'); no nvidia-smi -q printout of an "
                       "H200's reserved memory was found"},
}

#: Where each table is, which card measured it, and which set it belongs to.
TABLES = (
    {"file": "config/scaling/L40S.yaml", "card": "L40S", "set": "calibrate"},
    {"file": "config/scaling.yaml", "card": "A100-SXM4-80GB", "set": "calibrate", "at": "5b4fe167", "blame": True,
     "why_card": "milabench's docs of that time: 'The current setup runs on 8xA100 SXM4 80Go' (docs/recipes.rst "
                 "@33f4eb7d), README '4x NVIDIA A100 80GB' (@1f1bb167), docs/sizer.rst's example capacity "
                 "81920 MiB (an A100-SXM4-80GB's NVML total; an H100's is 81559 MiB); rows of 2023-11 to 2024-11"},
    {"file": "config/scaling/H100.yaml", "card": "H100", "set": "check"},
    {"file": "config/scaling/H200.yaml", "card": "H200", "set": "check"},
    {"file": "config/scaling/MI325.yaml", "card": "MI325", "set": "excluded"},
)
#: Commits of the old config/scaling.yaml whose rows a git blame shows re-added by a revert.
BLAME_IGNORE = ("a60a3aae", "226e4555")

_TV = "torchvision_bench.py"
_HF = "hf_bench.py"
#: Reproduced benchmarks: script and arguments (milabench's config/base.yaml @21b96e79 argv).
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "resnet50": (_TV, ["--model", "resnet50", "--precision", "tf32-fp16", "--optim", "channel_last", "--loader", "pytorch"]),
    "resnet50-noio": (_TV, ["--model", "resnet50", "--precision", "tf32-fp16", "--optim", "channel_last",
                            "--loader", "synthetic_fixed"]),
    "regnet_y_128gf": (_TV, ["--model", "regnet_y_128gf", "--precision", "tf32-fp16"]),
    **{f"convnext_large-{p}": (_TV, ["--model", "convnext_large", "--precision", p])
       for p in ("fp32", "fp16", "tf32", "tf32-fp16")},
    **{f"bert-{p}": (_HF, ["--model", "Bert", "--precision", p]) for p in ("fp32", "fp16", "tf32", "tf32-fp16")},
    "t5": (_HF, ["--model", "T5", "--precision", "tf32-fp16"]),
    "reformer": (_HF, ["--model", "Reformer", "--precision", "tf32-fp16"]),
    "whisper": (_HF, ["--model", "Whisper", "--precision", "tf32-fp16"]),
}
#: Benchmarks whose script runs cuDNN (convolutions): the cuDNN term applies to them only.
CUDNN_BENCHMARKS = {name for name, (script, _a) in BENCHMARKS.items() if script == _TV} | {"whisper"}
#: Why the other benchmarks' rows are left out.
LEFT_OUT = {
    "lightning": "PyTorch Lightning's Trainer loop (its precision plugin and callbacks) not reproduced",
    "focalnet": "timm's train.py (its loader, EMA and AMP settings) not reproduced",
    "diffusion": "diffusers + accelerate, needs model files from the Hub",
    "dinov2": "Meta's dinov2 training code (FSDP, xformers) not reproduced",
    "llm": "torchtune recipes with Llama weights from the Hub",
    "rlhf": "TRL PPO with models from the Hub",
    "vjepa": "V-JEPA training code not reproduced",
    "llava": "LLaVA with weights from the Hub",
    "multigpu": "several GPUs (DDP, NCCL buffers): one process's capture is not the run",
    "jax": "JAX, not PyTorch",
    "graph": "PyTorch Geometric / torch-scatter kernels not reproduced",
    "other": "a benchmark not reproduced here (timm models, retired benchmarks: davit_large, opt, resnet152, rwkv, ...)",
    "rocm": "ROCm (AMD MI325): allocsim has no HIP/MIOpen model; rows kept for reference, neither fitted nor checked",
    "outlier": "below a smaller batch's memory in the same table (a failed or partial run)",
    "legacy-hf": None,
}


def left_out_reason(benchmark: str, card: str) -> str | None:
    """Why ``benchmark``'s rows on ``card`` are not reproduced (None: they are)."""
    if card == "MI325":
        return LEFT_OUT["rocm"]
    if benchmark in BENCHMARKS:
        return None
    for key, words in (("multigpu", ("-gpus", "-ddp", "-nodes", "-multi", "-mp")), ("lightning", ("lightning",)),
                       ("focalnet", ("focalnet",)), ("diffusion", ("diffusion",)), ("dinov2", ("dinov2",)),
                       ("llm", ("llm", "llama")), ("rlhf", ("rlhf",)), ("vjepa", ("vjepa",)),
                       ("llava", ("llava",)), ("jax", ("brax", "cleanrl", "purejax", "torchatari", "dqn", "ppo")),
                       ("graph", ("pna", "dimenet", "recursiongfn"))):
        if any(w in benchmark for w in words):
            return LEFT_OUT[key]
    return LEFT_OUT["other"]


# ---------------------------------------------------------------------------------------------------------
# Extraction from a milabench clone
# ---------------------------------------------------------------------------------------------------------

_MIB = re.compile(r"^\s*([0-9.]+)\s*MiB\s*$")


def parse_mib(text: Any) -> float:
    """``'7257 MiB'`` -> 7257.0."""
    m = _MIB.match(str(text))
    if not m:
        raise ValueError(f"not a MiB figure: {text!r}")
    return float(m.group(1))


def parse_table(text: str) -> dict[str, list[dict[str, Any]]]:
    """A scaling file's observations per benchmark: ``[{batch, memory_mib, cpu, time}]`` (both file formats)."""
    import yaml   # noqa: PLC0415

    data = yaml.safe_load(text) or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for bench, config in data.items():
        if not isinstance(config, dict):
            continue
        observations = []
        for obs in config.get("observations") or []:
            observations.append({"batch": int(obs["batch_size"]), "memory_mib": parse_mib(obs["memory"]),
                                 "cpu": obs.get("cpu"), "time": obs.get("time")})
        for batch, memory in (config.get("model") or {}).items():
            observations.append({"batch": int(batch), "memory_mib": parse_mib(memory), "cpu": None, "time": None})
        if observations:
            out[bench] = observations
    return out


def flag_outliers(rows: list[dict[str, Any]]) -> None:
    """Mark a row whose memory is below the largest memory of a smaller batch of its table and benchmark.

    Memory grows with the batch: a row under a smaller batch's figure is a run that failed early or
    was not measured (the old table has 475 MiB at batch 2 and 16 beside 4108 MiB at batch 1).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["card"], r["benchmark"]), []).append(r)
    for group in groups.values():
        best = 0.0
        for r in sorted(group, key=lambda r: r["batch"]):
            if r["memory_mib"] < best * 0.99:
                r["outlier"] = f"below {best:.0f} MiB measured at a smaller batch"
            else:
                r["outlier"] = None
                best = max(best, r["memory_mib"])


def rows_from_table(table: dict[str, Any], text: str, commit: str, libraries: dict[str, str],
                    blame: dict[tuple[str, int], str] | None = None,
                    libraries_at: Any = None) -> list[dict[str, Any]]:
    """One row per (benchmark, batch) of a table: the largest of its observations, all of them kept."""
    rows = []
    for bench, observations in sorted(parse_table(text).items()):
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for obs in observations:
            by_batch.setdefault(obs["batch"], []).append(obs)
        for batch, group in sorted(by_batch.items()):
            added = blame.get((bench, batch)) if blame else None
            row = {"card": table["card"], "set": table["set"], "benchmark": bench, "batch": batch,
                   "memory_mib": max(o["memory_mib"] for o in group),
                   "observations": [o["memory_mib"] for o in group],
                   "file": table["file"], "commit": commit, "added_in": added,
                   "libraries": libraries_at(added) if (added and libraries_at) else libraries}
            row["left_out"] = left_out_reason(bench, table["card"])
            rows.append(row)
    return rows


def _git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", gitdir, *args], check=True, capture_output=True, text=True).stdout


def libraries_at(gitdir: str, commit: str) -> dict[str, str]:
    """torch, cuDNN and cuBLAS pins of milabench at ``commit`` (its .pin file, else the torchvision requirements)."""
    for path in (".pin/constraints-cuda-torch.txt", "benchmarks/torchvision/requirements.cuda.txt"):
        try:
            text = _git(gitdir, "show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
        pins = dict(re.findall(r"^(torch|nvidia-cudnn-cu1[12]|nvidia-cublas-cu1[12]|transformers|torchvision)==(\S+)",
                               text, re.M))
        if "torch" in pins:
            return {"pins": path, "commit": commit, **pins}
    return {"commit": commit}


def _blame(gitdir: str, commit: str, path: str) -> dict[tuple[str, int], str]:
    """(benchmark, batch) -> the commit that last set that line of the old scaling file (reverts ignored)."""
    ignore = [a for c in BLAME_IGNORE for a in ("--ignore-rev", c)]
    text = _git(gitdir, "blame", "--line-porcelain", *ignore, commit, "--", path)
    out, bench, sha = {}, None, None
    for line in text.splitlines():
        if re.match(r"^[0-9a-f]{40} ", line):
            sha = line[:8]
        elif line.startswith("\t"):
            content = line[1:]
            m = re.match(r"^([A-Za-z0-9_.-]+):", content)
            if m:
                bench = m.group(1)
            m = re.match(r"^\s+([0-9]+):\s*[0-9.]+ MiB", content)
            if m and bench:
                out[(bench, int(m.group(1)))] = sha
    return out


def extract(gitdir: str) -> dict[str, Any]:
    """Every table's rows from a milabench clone (a bare repository works), with provenance."""
    head = _git(gitdir, "rev-parse", "HEAD").strip()
    rows, tables = [], []
    for table in TABLES:
        at = table.get("at") or head
        commit = _git(gitdir, "log", "-1", "--format=%h", at, "--", table["file"]).strip()
        text = _git(gitdir, "show", f"{at}:{table['file']}")
        libraries = libraries_at(gitdir, commit)
        blame = _blame(gitdir, at, table["file"]) if table.get("blame") else None
        cache: dict[str, dict[str, str]] = {}

        def at_commit(sha, cache=cache):
            if sha not in cache:
                cache[sha] = libraries_at(gitdir, sha)
            return cache[sha]

        rows += rows_from_table(table, text, commit, libraries, blame, at_commit if blame else None)
        tables.append({**table, "commit": commit, "libraries": libraries})
    flag_outliers(rows)
    return {"source": "mila-iqia/milabench", "read_at": head[:8], "tables": tables, "cards": CARDS, "rows": rows}


# ---------------------------------------------------------------------------------------------------------
# Rows, captures, replays
# ---------------------------------------------------------------------------------------------------------

def dump_rows(data: dict[str, Any], path: str = ROWS_PATH) -> None:
    """Write ``data`` with one row per line."""
    head = {k: v for k, v in data.items() if k != "rows"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n'
    text += ",\n".join("  " + json.dumps(r) for r in data["rows"]) + "\n ]\n}\n"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def load(path: str = ROWS_PATH) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def usable(row: dict[str, Any]) -> bool:
    """Whether a row is captured and compared: a reproduced benchmark, not an outlier, not excluded."""
    return row["set"] != "excluded" and not row.get("left_out") and not row.get("outlier")


#: Rows kept per benchmark of the old A100 table (it mixes runs of 2023 and 2024 code and libraries): the
#: smallest and the largest batch and evenly spaced ones between, chosen by batch before any result.
OLD_TABLE_PER_BENCHMARK = 4


def spread(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """At most ``n`` of ``rows`` (one benchmark's), by batch: the first, the last and evenly spaced between."""
    rows = sorted(rows, key=lambda r: r["batch"])
    if len(rows) <= n:
        return rows
    picks = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in picks]


def select(rows: list[dict[str, Any]], which: str) -> list[dict[str, Any]]:
    """The usable rows of set ``which`` ('calibrate', 'check', 'all'); the old A100 table spread to
    ``OLD_TABLE_PER_BENCHMARK`` rows per benchmark."""
    chosen = [r for r in rows if usable(r) and (which == "all" or r["set"] == which)]
    old: dict[str, list[dict[str, Any]]] = {}
    for r in chosen:
        if r["card"] == "A100-SXM4-80GB":
            old.setdefault(r["benchmark"], []).append(r)
    keep = {id(r) for group in old.values() for r in spread(group, OLD_TABLE_PER_BENCHMARK)}
    return [r for r in chosen if r["card"] != "A100-SXM4-80GB" or id(r) in keep]


def legacy(row: dict[str, Any]) -> bool:
    """A row of the old table set in 2023 (milabench @1f1bb167): the torchvision loop of that time."""
    return row.get("added_in") == "1f1bb167"


def script_args(row: dict[str, Any]) -> list[str]:
    """The reproduction script and its arguments for ``row``."""
    script, args = BENCHMARKS[capture_benchmark(row["benchmark"])]
    args = list(args)
    if script == _TV and row["card"] == "A100-SXM4-80GB":
        # resnet50 took channels_last in 2025 (milabench @60843ba2), after the old table.
        if "channel_last" in args:
            i = args.index("channel_last")
            args[i - 1:i + 1] = []
        if legacy(row):
            args.append("--legacy-2023")
    return [os.path.join(SCRIPTS, script), *args, "--batch-size", str(row["batch"])]


def capture_gpu(row: dict[str, Any]) -> str:
    """The ``--gpu`` of a row's capture (H200 shares H100's: same compute capability and SM count)."""
    model = CARDS[row["card"]]["model"]
    return "H100" if model == "H200" else model


def capture_benchmark(benchmark: str) -> str:
    """The benchmark whose capture ``benchmark`` shares: TF32 changes no allocation (bert-tf32 is bert-fp32's
    capture, convnext_large-tf32-fp16 convnext_large-fp16's); the real runs may differ by cuDNN's choices."""
    return benchmark.replace("-tf32-fp16", "-fp16").replace("-tf32", "-fp32")


def capture_name(row: dict[str, Any]) -> str:
    tag = "_legacy" if legacy(row) and BENCHMARKS[row["benchmark"]][0] == _TV else ""
    tag += "_nocl" if row["card"] == "A100-SXM4-80GB" and row["benchmark"].startswith("resnet50") else ""
    return f"{capture_benchmark(row['benchmark'])}{tag}_{row['batch']}_{capture_gpu(row).replace(' ', '')}"


def capture(row: dict[str, Any], work: str, python: str, steps: int = 2) -> tuple[str, float]:
    """The row's trace in ``work`` (captured now unless there) and the capture's seconds (0: reused)."""
    path = os.path.join(work, capture_name(row) + ".parquet")
    if os.path.exists(path):
        return path, 0.0
    t0 = time.perf_counter()
    part = path.replace(".parquet", ".part.parquet")
    argv = [sys.executable, "-m", "allocsim", "capture", "--gpu", capture_gpu(row), "--steps", str(steps),
            "-o", part, "--", python, *script_args(row)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"capture of {capture_name(row)} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    os.replace(part, path)
    return path, time.perf_counter() - t0


def replay(path: str, gpu: str, capacity: int | None) -> dict[str, Any]:
    """The reserved and allocated peaks of ``path`` replayed with the PyTorch allocator model here."""
    from allocsim.runner import resolve_capacity, simulate_trace   # noqa: PLC0415
    from allocsim.trace import read_trace   # noqa: PLC0415

    trace = read_trace(path)
    summary = simulate_trace(trace, "pytorch", {}, capacity=resolve_capacity(trace, capacity), fast=True).summary
    return {"reserved_peak_bytes": int(summary["peak_reserved_bytes"] or 0),
            "allocated_peak_bytes": int(summary["peak_allocated_bytes"] or 0),
            "completed": bool(summary["completed"])}


# ---------------------------------------------------------------------------------------------------------
# The terms
# ---------------------------------------------------------------------------------------------------------

def local_bytes(model_name: str) -> int:
    """The local memory a CUDA context reserves on ``model_name``: SMs x resident threads x the default stack."""
    from allocsim.gpus import find_gpu   # noqa: PLC0415

    gpu = find_gpu(model_name)
    return gpu.sm_count * gpu.max_threads_per_sm * LOCAL_BYTES_PER_THREAD


def library_key(row: dict[str, Any]) -> str:
    """The library version a row ran with: 'torch X / cuDNN Y'."""
    lib = row.get("libraries") or {}
    cudnn = lib.get("nvidia-cudnn-cu12") or lib.get("nvidia-cudnn-cu11") or "not pinned (in the torch wheel)"
    return f"torch {lib.get('torch', '?')} / cuDNN {cudnn}"


def residual(row: dict[str, Any], result: dict[str, Any]) -> float:
    """Bytes of the ground truth outside the allocator: ground - NVML reserved - simulated reserved peak."""
    card = CARDS[row["card"]]
    return row["memory_mib"] * MiB - card["nvml_reserved_mib"] * MiB - result["reserved_peak_bytes"]


#: Rows whose ground is above this share of the card's NVML total ran against the card's limit (the
#: allocator frees its cache and retries there), so they are left out of the per-benchmark lines.
NEAR_FULL = 0.95


def theil_sen(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the line through ``points`` (batch, bytes): median pairwise slope, median intercept.

    Robust to a few rows the replay gets wrong (a fragmentation the real allocator did not have);
    one point gives slope 0 and that point's value.
    """
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    slope = statistics.median(slopes) if slopes else 0.0
    return statistics.median(y - slope * x for x, y in points), slope


def fit_terms(rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (card, library version) of the calibrate rows: the context term and the cuDNN term, each with its rows.

    What the GPU holds beside the allocator does not grow with the batch, so each benchmark's residual
    (ground - NVML reserved - simulated reserved peak) is put on a line over its batches (Theil-Sen)
    and only the line's value at batch 0 is the GPU's own memory; the slope is the capture's own
    error per sample (kept as a diagnostic, never applied). Then

    * context0 = median batch-0 residual of the benchmarks that run no cuDNN (transformers), less the
      card's local-memory reservation (so it moves to another card as context0 + local(card));
    * cudnn = median batch-0 residual of the benchmarks that run cuDNN, less context0 and local memory
      (cuDNN's lazily loaded kernels and handle), floored at 0.
    """
    groups: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    for row, res in zip(rows, results):
        if row["set"] != "calibrate" or not res.get("completed", True):
            continue
        card = CARDS[row["card"]]
        if row["memory_mib"] > NEAR_FULL * card["nvml_total_mib"]:
            continue
        key = (row["card"], library_key(row))
        groups.setdefault(key, {}).setdefault(row["benchmark"], []).append((row["batch"], residual(row, res)))
    terms = []
    for (card, lib), benches in sorted(groups.items()):
        local = local_bytes(CARDS[card]["model"])
        lines = {b: theil_sen(sorted(points)) for b, points in sorted(benches.items())}
        plain = {b: line for b, line in lines.items() if b not in CUDNN_BENCHMARKS}
        conv = {b: line for b, line in lines.items() if b in CUDNN_BENCHMARKS}
        entry: dict[str, Any] = {"card": card, "libraries": lib, "local_bytes": local,
                                 "per_benchmark": {b: {"rows": len(benches[b]), "at_batch_0_mib": round(a / MiB),
                                                       "per_sample_mib": round(k / MiB, 2)}
                                                   for b, (a, k) in lines.items()}}
        if plain:
            entry["context0_bytes"] = int(statistics.median(a for a, _k in plain.values())) - local
            entry["context_rows"] = sorted(f"{card} {b} ({len(benches[b])} rows)" for b in plain)
        if conv and "context0_bytes" in entry:
            at0 = statistics.median(a for a, _k in conv.values())
            entry["cudnn_bytes"] = max(0, int(at0) - local - entry["context0_bytes"])
            entry["cudnn_rows"] = sorted(f"{card} {b} ({len(benches[b])} rows)" for b in conv)
        terms.append(entry)
    return {"terms": terms,
            "about": "fitted on milabench calibrate rows only (L40S table, old A100 config/scaling.yaml); check "
                     "rows (H100, H200) never enter. Per benchmark the residual ground - NVML reserved - "
                     "simulated reserved peak is a Theil-Sen line over the batches (rows above 95% of the "
                     "card's NVML total left out); its value at batch 0 is the GPU's own memory, its slope the "
                     "capture's error per sample (per_benchmark, not applied). context0 is per library "
                     "version; a card adds its local memory (SMs x resident threads x 1 KiB)"}


def terms_for(row: dict[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """The context and cuDNN bytes for ``row``: its own card and library version if calibrated there, else
    the calibrated card with the same library version (context0 + this card's local memory), else the
    defaults (allocsim.gpus' 400 MiB context estimate, no cuDNN term)."""
    from allocsim.gpus import CONTEXT_BYTES_ESTIMATE   # noqa: PLC0415

    local = local_bytes(CARDS[row["card"]]["model"])
    uses_cudnn = row["benchmark"] in CUDNN_BENCHMARKS
    lib = library_key(row)
    candidates = [t for t in (calibration or {}).get("terms", []) if "context0_bytes" in t]
    same = [t for t in candidates if t["card"] == row["card"] and t["libraries"] == lib]
    same_lib = [t for t in candidates if t["libraries"] == lib]
    chosen = (same or same_lib or [None])[0]
    if chosen is None:
        return {"context_bytes": CONTEXT_BYTES_ESTIMATE, "cudnn_bytes": 0, "from": "default (not calibrated)"}
    return {"context_bytes": chosen["context0_bytes"] + local,
            "cudnn_bytes": chosen.get("cudnn_bytes", 0) if uses_cudnn else 0,
            "from": f"{chosen['card']}, {chosen['libraries']}"}


def predict(row: dict[str, Any], result: dict[str, Any], terms: dict[str, Any],
            ranges: dict[str, Any] | None = None) -> dict[str, Any]:
    """allocsim's figure in NVML terms (comparable with the row), its low and high end (``milabench_ranges``),
    and on the CUDA side the verdict: "fits" only when the high end is within the card's CUDA total."""
    from allocsim.gpus import find_gpu   # noqa: PLC0415
    from validate.milabench_ranges import nvml_reserved_range, predict_range   # noqa: PLC0415

    card = CARDS[row["card"]]
    gpu = find_gpu(card["model"])
    cuda_total = card.get("cuda_total_bytes", gpu.total_bytes)
    cuda_side = result["reserved_peak_bytes"] + terms["context_bytes"] + terms["cudnn_bytes"]
    predicted = cuda_side + card["nvml_reserved_mib"] * MiB
    ground = row["memory_mib"] * MiB
    ends = predict_range(row, result, terms, ranges)
    high_cuda = ends["high_bytes"] - nvml_reserved_range(row["card"])[2]
    return {"predicted_bytes": int(predicted), "ground_bytes": int(ground),
            "error": (predicted - ground) / ground,
            "false_fit": predicted <= ground * (1 - FALSE_FIT_MARGIN),
            "fits_point": bool(result["completed"]) and cuda_side <= cuda_total,
            "fits": bool(result["completed"]) and high_cuda <= cuda_total, "cuda_total_bytes": cuda_total,
            **ends, "terms_from": terms["from"]}


def capacity_for(row: dict[str, Any], terms: dict[str, Any]) -> int:
    """The caching allocator's room on the row's card once the context and cuDNN terms are taken."""
    from allocsim.gpus import find_gpu   # noqa: PLC0415

    card = CARDS[row["card"]]
    total = card.get("cuda_total_bytes", find_gpu(card["model"]).total_bytes)
    return total - terms["context_bytes"] - terms["cudnn_bytes"]


def evaluate(rows: list[dict[str, Any]], work: str, python: str, jobs: int,
             calibration: dict[str, Any] | None, log: Any = None) -> list[dict[str, Any]]:
    """Capture (``jobs`` at a time) and replay every row; each result carries the prediction under ``calibration``."""
    os.makedirs(work, exist_ok=True)

    def one(row):
        try:
            path, seconds = capture(row, work, python)
        except RuntimeError as exc:
            return {"error_message": str(exc)}
        if log and seconds:
            log(f"captured {capture_name(row)} in {seconds:.0f} s")
        terms = terms_for(row, calibration)
        result = replay(path, capture_gpu(row), capacity_for(row, terms))
        return {**result, "capture_s": round(seconds, 1), "terms": terms}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, rows))
    out = []
    for row, res in zip(rows, results):
        if "error_message" in res:
            out.append({**row, "failed": res["error_message"]})
            continue
        out.append({**row, **res, **predict(row, res, res["terms"], (calibration or {}).get("ranges"))})
    return out


def calibrate(rows: list[dict[str, Any]], work: str, python: str, jobs: int, log: Any = None) -> dict[str, Any]:
    """Fit the terms on the calibrate rows (replayed at the default capacity), then refit once at the fitted one."""
    cal_rows = [r for r in rows if r["set"] == "calibrate"]
    first = evaluate(cal_rows, work, python, jobs, None, log)
    ok = [r for r in first if "failed" not in r]
    fitted = fit_terms(ok, ok)
    second = evaluate(cal_rows, work, python, jobs, fitted, log)
    ok = [r for r in second if "failed" not in r]
    fitted = fit_terms(ok, ok)
    fitted["rows"] = len(ok)
    # the ranges: from the terms just fitted and the calibrate rows evaluated under them
    from validate.milabench_ranges import fit_ranges   # noqa: PLC0415

    third = [r for r in evaluate(cal_rows, work, python, jobs, fitted, log) if "failed" not in r]
    fitted["ranges"] = fit_ranges(fitted, third)
    return fitted


# ---------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------

def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst absolute error, false fits, over the results that have a prediction."""
    done = [r for r in results if "error" in r]
    if not done:
        return {"rows": 0}
    errors = [abs(r["error"]) for r in done]
    worst = max(done, key=lambda r: abs(r["error"]))
    return {"rows": len(done), "median_abs_error": statistics.median(errors),
            "worst_error": worst["error"], "worst_row": f"{worst['benchmark']} {worst['batch']}",
            "false_fits": sum(r["false_fit"] for r in done), "under_5pct": sum(r["error"] < -FALSE_FIT_MARGIN for r in done)}


def fit_summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per benchmark: the largest batch in the table (it ran, so it fitted) and the largest allocsim says fits."""
    out = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if "error" in r:
            groups.setdefault(r["benchmark"], []).append(r)
    for bench, group in sorted(groups.items()):
        real = max(r["batch"] for r in group)
        fitting = [r["batch"] for r in group if r["fits"]]
        out.append({"benchmark": bench, "real_max_batch": real, "allocsim_max_batch": max(fitting) if fitting else None})
    return out


def format_tables(results: list[dict[str, Any]]) -> str:
    """A markdown table per (set, card), then its summary and the fit per benchmark."""
    lines = []
    order = {"calibrate": 0, "check": 1}
    keys = sorted({(r["set"], r["card"]) for r in results}, key=lambda k: (order.get(k[0], 2), k[1]))
    for which, card in keys:
        group = [r for r in results if r["set"] == which and r["card"] == card]
        lines.append(f"\n**{which}: milabench {card}** ({CARDS[card]['model']}; {group[0]['file']} @{group[0]['commit']})\n")
        lines.append("| benchmark | batch | ground MiB | allocsim MiB | error | range MiB | fits at the high end (real: "
                     "yes) |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in sorted(group, key=lambda r: (r["benchmark"], r["batch"])):
            if "error" not in r:
                lines.append(f"| {r['benchmark']} | {r['batch']} | {r['memory_mib']:,.0f} | capture failed | | | |")
                continue
            flag = " **false fit**" if r["false_fit"] else ""
            outside = (" **above**" if r["ground_bytes"] > r["high_bytes"] else
                       " (below)" if r["ground_bytes"] < r["low_bytes"] else "")
            lines.append(f"| {r['benchmark']} | {r['batch']} | {r['memory_mib']:,.0f} | "
                         f"{r['predicted_bytes'] / MiB:,.0f} | {r['error']:+.1%}{flag} | {r['low_bytes'] / MiB:,.0f} to "
                         f"{r['high_bytes'] / MiB:,.0f}{outside} | {'yes' if r['fits'] else 'no'} |")
        s = summarize(group)
        if s["rows"]:
            lines.append(f"\n{s['rows']} rows: median absolute error {s['median_abs_error']:.1%}, worst "
                         f"{s['worst_error']:+.1%} ({s['worst_row']}), predictions more than 5% below the truth: "
                         f"{s['under_5pct']}. Terms from: {', '.join(sorted({r['terms_from'] for r in group if 'terms_from' in r}))}.")
        fits = fit_summary(group)
        if fits:
            lines.append("\n| benchmark | largest batch in the table | largest of them allocsim says fits |")
            lines.append("|---|---|---|")
            for f in fits:
                lines.append(f"| {f['benchmark']} | {f['real_max_batch']} | {f['allocsim_max_batch']} |")
    return "\n".join(lines)


def format_terms(calibration: dict[str, Any]) -> str:
    """The fitted terms, one line each, with the rows they came from."""
    lines = ["| card | libraries | local memory MiB | context0 MiB | cuDNN MiB | rows (context / cuDNN) |",
             "|---|---|---|---|---|---|"]
    for t in calibration.get("terms", []):
        lines.append(f"| {t['card']} | {t['libraries']} | {t['local_bytes'] / MiB:.0f} | "
                     f"{t.get('context0_bytes', 0) / MiB:.0f} | {t.get('cudnn_bytes', 0) / MiB:.0f} | "
                     f"{len(t.get('context_rows', []))} / {len(t.get('cudnn_rows', []))} |")
    return "\n".join(lines)


def format_summary(results: list[dict[str, Any]]) -> str:
    """One line per (set, card, benchmark): rows, errors, predictions more than 5% under, and the fit."""
    lines = ["| set | card | benchmark | rows | batches | median abs. error | worst | > 5% under | largest batch "
             "in the table / allocsim says fits |", "|---|---|---|---|---|---|---|---|---|"]
    order = {"calibrate": 0, "check": 1}
    keys = sorted({(r["set"], r["card"], r["benchmark"]) for r in results if "error" in r},
                  key=lambda k: (order.get(k[0], 2), k[1], k[2]))
    for which, card, bench in keys:
        group = [r for r in results if (r["set"], r["card"], r["benchmark"]) == (which, card, bench) and "error" in r]
        s = summarize(group)
        (fit,) = fit_summary(group)
        batches = sorted(r["batch"] for r in group)
        lines.append(f"| {which} | {card} | {bench} | {s['rows']} | {batches[0]}-{batches[-1]} | "
                     f"{s['median_abs_error']:.1%} | {s['worst_error']:+.1%} | {s['under_5pct']} | "
                     f"{fit['real_max_batch']} / {fit['allocsim_max_batch']} |")
    for which in ("calibrate", "check"):
        for card in sorted({r["card"] for r in results if r["set"] == which}):
            s = summarize([r for r in results if r["set"] == which and r["card"] == card])
            if s["rows"]:
                lines.append(f"| **{which}** | **{card}** | all | {s['rows']} | | **{s['median_abs_error']:.1%}** | "
                             f"{s['worst_error']:+.1%} | **{s['under_5pct']}** | |")
        s = summarize([r for r in results if r["set"] == which])
        if s["rows"]:
            lines.append(f"| **{which}** | all | all | {s['rows']} | | **{s['median_abs_error']:.1%}** | "
                         f"{s['worst_error']:+.1%} | **{s['under_5pct']}** | |")
    return "\n".join(lines)
