#!/usr/bin/env python
"""Capture CUDA caching-allocator snapshots of BERT-base / GPT-2 small training at every grid scale.

NOT run in this repository's CI (it needs an NVIDIA GPU). The grid is the one of
``capture_scales.py`` (batch series at a fixed sequence length, sequence series at a fixed batch,
each with its 2x held-out point), so a GPU run gives the real allocator's decisions -- segment
allocations, block placement, peak reserved -- at every scale that ``allocsim scale`` predicts.

Each grid point runs in its own Python process (a fresh CUDA context and an empty caching
allocator, as a real job starts), which:

1. calls ``torch.cuda.memory._record_memory_history(enabled="all", context=..., stacks=...,
   max_entries=...)`` before the model is built, so parameters, gradients and AdamW state are in
   the history (adds ``global_record_annotations=True`` where this torch has it, so the
   ``record_function`` step names land in the snapshot's ``external_annotations``);
2. runs ``--warmup`` + ``--steps`` fp32 training steps (forward, backward, AdamW, ``zero_grad(
   set_to_none=True)``), each inside ``record_function("WarmupStep#N" / "ProfilerStep#N")``, on the
   default stream only;
3. writes ``torch.cuda.memory._dump_snapshot(...)`` gzip-compressed to
   ``<out-dir>/<model>_b<batch>_s<seq>.pickle.gz`` and a ``.meta.json`` sidecar with the real
   ``max_memory_allocated`` / ``max_memory_reserved`` and the trace-entry counts per action.

    python traces/capture_gpu_scales.py --grid all --out-dir traces/scales_gpu
    python traces/capture_gpu_scales.py --list
    python traces/capture_gpu_scales.py --model gpt2 --batch 8 --seq 128   # one point, in this process

Then, e.g.::

    allocsim scale traces/scales_gpu/bert_b1_s128.pickle.gz@1 ... --to 8 -o bert_b8.parquet
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import gzip
import inspect
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from capture_scales import MODELS, SEED, STEP_PREFIX, capture_name, grid  # noqa: E402

WARMUP_PREFIX = "WarmupStep#"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=["all", *MODELS], help="every grid point (of one model), one process each")
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps, recorded too (default 1)")
    p.add_argument("--steps", type=int, default=2, help="steps after warm-up (default 2)")
    p.add_argument("--max-entries", type=int, default=400_000,
                   help="ring-buffer size of _record_memory_history (default 400000)")
    p.add_argument("--stacks", choices=["python", "all"], default="python")
    p.add_argument("--context", choices=["all", "alloc", "state"], default="all")
    p.add_argument("--out-dir", type=Path, default=HERE / "scales_gpu")
    p.add_argument("--skip-existing", action="store_true")
    p.add_argument("--timeout", type=int, default=900, help="seconds per grid point (default 900)")
    p.add_argument("--list", action="store_true", help="print the grid and the commands, then exit")
    args = p.parse_args(argv)
    if not (args.list or args.grid or (args.model and args.batch and args.seq)):
        p.error("give --grid, --list, or --model with --batch and --seq")
    if min(args.warmup, args.steps) < 0 or args.steps < 1 or args.max_entries < 1:
        p.error("--steps and --max-entries must be >= 1, --warmup >= 0")
    return args


def point_command(pt: dict, args: argparse.Namespace) -> list[str]:
    """The command that captures one grid point in its own process."""
    return [sys.executable, str(Path(__file__).resolve()), "--model", pt["model"], "--batch", str(pt["batch"]),
            "--seq", str(pt["seq"]), "--warmup", str(args.warmup), "--steps", str(args.steps),
            "--max-entries", str(args.max_entries), "--stacks", args.stacks, "--context", args.context,
            "--out-dir", str(args.out_dir)]


def plan(args: argparse.Namespace) -> list[tuple[dict, list[str]]]:
    """(grid point, command) for every point ``--grid`` selects, existing outputs skipped if asked."""
    out = []
    for pt in grid():
        if args.grid not in ("all", pt["model"]):
            continue
        if args.skip_existing and (args.out_dir / f"{capture_name(pt['model'], pt['batch'], pt['seq'])}.pickle.gz").exists():
            continue
        out.append((pt, point_command(pt, args)))
    return out


def record_kwargs(args: argparse.Namespace, record_impl) -> dict:
    """Arguments of ``_record_memory_history``; annotations only where this torch accepts them."""
    kwargs = dict(enabled="all", context=args.context, stacks=args.stacks, max_entries=args.max_entries)
    if record_impl is not None and "global_record_annotations" in inspect.signature(record_impl).parameters:
        kwargs["global_record_annotations"] = True
    return kwargs


def snapshot_counts(snap: dict, device_index: int) -> dict:
    """Trace entries per action, segments and annotations of one device in a snapshot dict."""
    traces = snap.get("device_traces") or []
    entries = traces[device_index] if 0 <= device_index < len(traces) else []
    actions = collections.Counter(e.get("action") for e in entries)
    return dict(trace_entries=len(entries), actions=dict(sorted(actions.items())),
                segments_at_dump=sum(1 for s in snap.get("segments", []) if s.get("device", device_index) == device_index),
                external_annotations=len(snap.get("external_annotations", []) or []))


def gzip_file(src: Path, dst: Path) -> None:
    """Compress ``src`` to ``dst`` deterministically (no name or time in the gzip header)."""
    with open(src, "rb") as fi, open(dst, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as fo:
        shutil.copyfileobj(fi, fo)


def capture_point(args: argparse.Namespace) -> int:
    """Capture one grid point in this process (needs CUDA)."""
    import torch

    if not torch.cuda.is_available():
        print(f"capture_gpu_scales.py: CUDA is not available (torch {torch.__version__}, cuda build: "
              f"{torch.version.cuda}). Run this on a machine with an NVIDIA GPU and a CUDA build of torch.",
              file=sys.stderr)
        return 2
    from capture_cpu import build_model, make_batch

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(SEED)
    torch.cuda.manual_seed_all(SEED)
    gen = torch.Generator().manual_seed(SEED)
    rec = record_kwargs(args, getattr(torch.cuda.memory, "_record_memory_history_impl", None))
    torch.cuda.memory._record_memory_history(**rec)

    model, cfg, tf_version = build_model(args.model)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_seconds = []
    for i in range(args.warmup + args.steps):
        name = f"{WARMUP_PREFIX}{i + 1}" if i < args.warmup else f"{STEP_PREFIX}{i - args.warmup + 1}"
        t0 = time.time()
        with torch.profiler.record_function(name):
            batch = {k: v.to(device) for k, v in make_batch(args.model, cfg.vocab_size, args.batch, args.seq, gen).items()}
            out = model(**batch)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del out, batch
        torch.cuda.synchronize(device)
        step_seconds.append(round(time.time() - t0, 3))

    name = capture_name(args.model, args.batch, args.seq)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    raw = args.out_dir / f"{name}.pickle"
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(str(raw))
    torch.cuda.memory._record_memory_history(enabled=None)
    gz = args.out_dir / f"{name}.pickle.gz"
    gzip_file(raw, gz)
    raw_bytes = raw.stat().st_size
    raw.unlink()
    counts = snapshot_counts(snap, device.index)
    meta = dict(
        file=gz.name, model=args.model, batch=args.batch, seq_len=args.seq, dtype="fp32",
        warmup_steps=args.warmup, steps=args.steps, streams="default only",
        record_memory_history=rec, recording_started="before model construction",
        ring_buffer_full=counts["trace_entries"] >= args.max_entries,
        peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
        step_wall_seconds=step_seconds,
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda, transformers=tf_version,
                      python=platform.python_version()),
        gpu=torch.cuda.get_device_name(device),
        date_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        command=f"python traces/capture_gpu_scales.py --model {args.model} --batch {args.batch} --seq {args.seq}",
        raw_pickle_bytes=raw_bytes, gz_bytes=gz.stat().st_size, **counts,
    )
    (args.out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("file", "peak_allocated_bytes", "peak_reserved_bytes", "trace_entries")}))
    if meta["ring_buffer_full"]:
        print(f"warning: {name}: history hit --max-entries; the oldest entries were overwritten", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for pt, cmd in plan(argparse.Namespace(**{**vars(args), "grid": args.grid or "all"})):
            print(capture_name(pt["model"], pt["batch"], pt["seq"]), ",".join(pt["series"]), " ".join(cmd[1:]))
        return 0
    if not args.grid:
        return capture_point(args)
    failed = 0
    for pt, cmd in plan(args):
        try:
            rc = subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        if rc:
            failed += 1
            print(f"{capture_name(pt['model'], pt['batch'], pt['seq'])}: exit {rc}", file=sys.stderr)
            if rc == 2:
                return 2   # no CUDA: the other points would fail the same way
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
