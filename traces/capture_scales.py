#!/usr/bin/env python
"""Capture CPU memory traces of BERT-base and GPT-2 small training steps at several scales.

The same training step as ``capture_cpu.py`` (random init, no downloaded weights, 1 un-profiled
warm-up step, then profiled steps under ``torch.profiler`` with ``profile_memory=True``) is run
on a grid of batch sizes (sequence fixed) and sequence lengths (batch fixed), so that
``allocsim scale`` can learn how each allocation grows and be checked against a held-out point.

Each capture is filtered down to what scaling needs and written gzip-compressed to
``traces/scales/<model>_b<batch>_s<seq>.json.gz`` with a ``.meta.json`` sidecar:

* every ``[memory]`` event, unchanged except two ``args`` that are dropped because they are
  recomputable and take 37% of the compressed size: ``Ev Idx`` (strictly increasing in file
  order; checked before dropping) and ``Total Allocated`` (the running sum of ``Bytes`` plus the
  baseline stored in the sidecar; checked before dropping, mismatches counted in the sidecar);
* the ``ProfilerStep#N`` step markers, unchanged;
* the CPU op events (``cat == "cpu_op"``) that contain at least one ``[memory]`` event on the same
  thread, trimmed to ``ph, cat, name, pid, tid, ts, dur`` (their ``args`` -- External id,
  Sequence number, Record function id, ... -- are dropped). Nesting is kept, so each allocation
  can be attributed to its innermost op and that op's enclosing ops;
* with ``--with-stack``, the ``python_function`` events that contain a ``[memory]`` event,
  trimmed the same way (module / file(line): function names). Off by default: it multiplies the
  file size (see traces/README.md);
* every top-level key other than ``traceEvents``.

Usage::

    python traces/capture_scales.py --grid all              # the whole grid (both models)
    python traces/capture_scales.py --model bert --batch 2 --seq 128
    python traces/capture_scales.py --list                  # print the grid
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from capture_cpu import STEP_PREFIX, SEED, build_model, train_step  # noqa: E402

MEMORY = "[memory]"
#: Memory-event args dropped after checking they can be recomputed (see ``_drop_recomputable``).
DROPPED_MEMORY_ARGS = ("Ev Idx", "Total Allocated")
OP_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
OP_CATEGORIES = ("cpu_op",)
STACK_CATEGORIES = ("python_function",)

#: Fixed sequence length of the batch series and fixed batch of the sequence series.
BATCH_SERIES_SEQ = 128
SEQ_SERIES_BATCH = 2
#: Input points of each series, then the held-out point (2x the largest input).
BATCH_VALUES = (1, 2, 3, 4)
BATCH_HELD_OUT = 8
SEQ_VALUES = (64, 128, 192, 256)
SEQ_HELD_OUT = 512
MODELS = ("bert", "gpt2")


def grid() -> list[dict]:
    """Every (model, batch, seq) of the grid, each once, with the series it belongs to."""
    points: dict[tuple, dict] = {}
    for model in MODELS:
        for batch in (*BATCH_VALUES, BATCH_HELD_OUT):
            p = points.setdefault((model, batch, BATCH_SERIES_SEQ),
                                  dict(model=model, batch=batch, seq=BATCH_SERIES_SEQ, series=[]))
            p["series"].append("batch" + ("(held-out)" if batch == BATCH_HELD_OUT else ""))
        for seq in (*SEQ_VALUES, SEQ_HELD_OUT):
            p = points.setdefault((model, SEQ_SERIES_BATCH, seq),
                                  dict(model=model, batch=SEQ_SERIES_BATCH, seq=seq, series=[]))
            p["series"].append("seq" + ("(held-out)" if seq == SEQ_HELD_OUT else ""))
    return list(points.values())


def capture_name(model: str, batch: int, seq: int) -> str:
    """File stem of one capture, e.g. ``bert_b2_s128``."""
    return f"{model}_b{batch}_s{seq}"


def _trim(event: dict) -> dict:
    return {k: event[k] for k in OP_FIELDS if k in event}


def filter_scale_trace(raw: dict, keep_stack: bool) -> tuple[dict, dict]:
    """Keep memory events, step markers and the op (and optionally Python) events containing memory.

    An op event "contains" a memory event when both are on the same (pid, tid) and
    ``ts <= mem.ts <= ts + dur``. Returns the filtered trace and counts of what was kept.
    """
    events = raw["traceEvents"]
    categories = OP_CATEGORIES + (STACK_CATEGORIES if keep_stack else ())
    spans = [(i, e) for i, e in enumerate(events)
             if e.get("ph") == "X" and e.get("cat") in categories and isinstance(e.get("dur"), (int, float))]
    mems = [(i, e) for i, e in enumerate(events) if e.get("name") == MEMORY]
    keep_span = _spans_containing(spans, mems)
    kept = []
    counts = {"memory": 0, "step_markers": 0, "cpu_op": 0, "python_function": 0}
    counts.update(_drop_recomputable([e for _, e in mems]))
    for i, e in enumerate(events):
        name = e.get("name")
        if name == MEMORY:
            kept.append(e)
            counts["memory"] += 1
        elif isinstance(name, str) and name.startswith(STEP_PREFIX) and e.get("ph") == "X":
            kept.append(e)
            counts["step_markers"] += 1
        elif i in keep_span:
            kept.append(_trim(e))
            counts[e["cat"]] += 1
    out = {k: v for k, v in raw.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out, counts


def _drop_recomputable(mems: list[dict]) -> dict:
    """Drop ``Ev Idx`` and ``Total Allocated`` from memory events in place; return what recomputes them.

    ``Total Allocated`` after event k equals ``baseline + sum(Bytes[0..k])``; the baseline and the
    number of events where that does not hold are returned (0 in every shipped capture).
    """
    baseline = None
    running = 0
    mismatched = 0
    last_idx = None
    idx_increasing = True
    for e in mems:
        args = e["args"]
        running += args["Bytes"]
        total = args.pop("Total Allocated", None)
        if total is not None:
            if baseline is None:
                baseline = total - running
            elif total != baseline + running:
                mismatched += 1
        idx = args.pop("Ev Idx", None)
        if idx is not None and last_idx is not None and idx <= last_idx:
            idx_increasing = False
        last_idx = idx if idx is not None else last_idx
    return {"total_allocated_baseline_bytes": baseline or 0,
            "total_allocated_mismatches": mismatched,
            "ev_idx_strictly_increasing": idx_increasing}


def _spans_containing(spans: list[tuple[int, dict]], mems: list[tuple[int, dict]]) -> set[int]:
    """Indices of the spans that contain at least one memory event on their thread (one sweep)."""
    by_thread: dict[tuple, list] = {}
    # Order at equal times: span starts, then memory events, then span ends (closed intervals).
    for i, e in spans:
        key = (e.get("pid"), e.get("tid"))
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        by_thread.setdefault(key, []).append((start, 0, -end, i))
        by_thread[key].append((end, 2, 0.0, i))
    for i, e in mems:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append((float(e["ts"]), 1, 0.0, i))
    keep: set[int] = set()
    for items in by_thread.values():
        items.sort()
        open_spans: set[int] = set()
        for _, kind, _, i in items:
            if kind == 0:
                open_spans.add(i)
            elif kind == 2:
                open_spans.discard(i)
            else:
                keep.update(open_spans)
    return keep


def capture(model_kind: str, batch: int, seq: int, out_dir: Path, steps: int, keep_stack: bool,
            series: list[str]) -> dict:
    """Run one configuration, write ``<name>.json.gz`` and ``<name>.meta.json``; return the meta."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    name = capture_name(model_kind, batch, seq)
    spec = dict(model=model_kind, seq_len=seq, micro_batch=batch, accum=1, dtype="fp32", recompute=False)
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    model, cfg, tf_version = build_model(model_kind)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(SEED)

    t0 = time.time()
    train_step(model, opt, spec, cfg.vocab_size, gen)  # warm-up, not profiled
    print(f"[{name}] warm-up {time.time() - t0:.1f}s", flush=True)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt_state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                          for t in st.values() if torch.is_tensor(t))

    step_seconds = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False,
                 with_stack=keep_stack) as prof:
        for i in range(steps):
            t0 = time.time()
            with record_function(f"{STEP_PREFIX}{i + 1}"):
                train_step(model, opt, spec, cfg.vocab_size, gen)
            step_seconds.append(round(time.time() - t0, 2))
    print(f"[{name}] profiled steps {step_seconds}", flush=True)

    with tempfile.TemporaryDirectory() as td:
        cwd = os.getcwd()
        os.chdir(td)  # a bare relative name keeps local paths out of "traceName"
        try:
            prof.export_chrome_trace(f"{name}.json")
        finally:
            os.chdir(cwd)
        raw_path = Path(td) / f"{name}.json"
        raw_bytes = raw_path.stat().st_size
        raw = json.loads(raw_path.read_text())
    n_raw = len(raw["traceEvents"])
    trace, counts = filter_scale_trace(raw, keep_stack)
    del raw

    out_path = out_dir / f"{name}.json.gz"
    payload = json.dumps(trace, separators=(",", ":")).encode()
    with open(out_path, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(payload)
    mem = [e for e in trace["traceEvents"] if e.get("name") == MEMORY]
    sizes = [e["args"]["Bytes"] for e in mem]
    running = peak = 0
    for b in sizes:
        running += b
        peak = max(peak, running)
    meta = dict(
        file=out_path.name,
        model={"bert": "BertForMaskedLM (BERT-base, BertConfig() defaults, random init)",
               "gpt2": "GPT2LMHeadModel (GPT-2 small, GPT2Config() defaults, use_cache=False, random init)"}[model_kind],
        attn_implementation=getattr(cfg, "_attn_implementation", None),
        batch=batch, seq_len=seq, series=series, dtype="fp32",
        optimizer="torch.optim.AdamW(lr=1e-4), zero_grad(set_to_none=True) after step",
        warmup_steps=1, profiled_steps=steps, seed=SEED, torch_threads=torch.get_num_threads(),
        profiler=dict(activities=["CPU"], profile_memory=True, record_shapes=False, with_stack=keep_stack),
        kept=dict(counts, op_fields=list(OP_FIELDS), dropped_memory_args=list(DROPPED_MEMORY_ARGS),
                  rule="memory events (less the dropped args) and ProfilerStep# markers unchanged; cpu_op"
                       + (" and python_function" if keep_stack else "")
                       + " events containing a memory event on their thread, args dropped"),
        versions=dict(torch=torch.__version__, transformers=tf_version, python=platform.python_version()),
        machine=f"{platform.machine()} CPU, {os.cpu_count()} cores",
        date_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        command=f"python traces/capture_scales.py --model {model_kind} --batch {batch} --seq {seq}"
                + (f" --steps {steps}" if steps != 2 else "") + (" --with-stack" if keep_stack else ""),
        step_wall_seconds=step_seconds,
        resident_before_window=dict(param_bytes=param_bytes, adamw_state_bytes=opt_state_bytes,
                                    note="allocated before profiling began; not in the trace"),
        raw_export_bytes=raw_bytes, raw_export_events=n_raw, gz_bytes=out_path.stat().st_size,
        allocs=sum(1 for b in sizes if b > 0), frees=sum(1 for b in sizes if b < 0),
        peak_total_allocated_bytes=peak,
    )
    (out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"[{name}] {meta['gz_bytes']} B gz, {counts}", flush=True)
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=["all", *MODELS], help="capture every point of the grid (of one model)")
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--steps", type=int, default=2, help="profiled steps after 1 warm-up (default 2)")
    p.add_argument("--with-stack", action="store_true", help="also keep python_function events (large)")
    p.add_argument("--skip-existing", action="store_true", help="skip grid points whose .json.gz exists")
    p.add_argument("--out-dir", type=Path, default=HERE / "scales")
    p.add_argument("--list", action="store_true", help="print the grid and exit")
    args = p.parse_args(argv)
    points = grid()
    if args.list:
        for pt in points:
            print(capture_name(pt["model"], pt["batch"], pt["seq"]), ",".join(pt["series"]))
        return 0
    if args.grid:
        todo = [pt for pt in points if args.grid == "all" or pt["model"] == args.grid]
    elif args.model and args.batch and args.seq:
        todo = [next((pt for pt in points if (pt["model"], pt["batch"], pt["seq"]) == (args.model, args.batch, args.seq)),
                     dict(model=args.model, batch=args.batch, seq=args.seq, series=[]))]
    else:
        p.error("give --grid, or --model with --batch and --seq")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for pt in todo:
        if args.skip_existing and (args.out_dir / f"{capture_name(pt['model'], pt['batch'], pt['seq'])}.json.gz").exists():
            continue
        capture(pt["model"], pt["batch"], pt["seq"], args.out_dir, args.steps, args.with_stack, pt["series"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
