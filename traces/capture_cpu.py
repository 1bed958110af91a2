#!/usr/bin/env python
"""Capture real CPU allocation traces of transformer training steps.

Runs BERT-base / GPT-2 small training steps (random init, no downloaded
weights) on CPU under ``torch.profiler`` with ``profile_memory=True`` and
exports a Kineto Chrome trace. The raw export is then filtered down to

* every event named ``"[memory]"`` (args kept byte-for-byte as exported),
* the step-marker duration events ``ProfilerStep#N``,
* all top-level keys other than ``traceEvents``,

and written gzip-compressed to ``traces/<config>.json.gz``. A small
``traces/<config>.meta.json`` sidecar records provenance and event counts.

Usage::

    python traces/capture_cpu.py --config bert_fp32
    python traces/capture_cpu.py --config all

Each step is: batch creation (torch.randint) -> forward -> backward -> AdamW step ->
``zero_grad(set_to_none=True)``. One un-profiled warm-up step runs first, so
parameters, AdamW state and the allocator's one-time buffers already exist
when the profiling window opens (they are *not* in the trace; see README).
"""
from __future__ import annotations

import argparse
import contextlib
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

# name -> (model, seq_len, micro_batch, micro_batches_per_step, dtype, recompute)
CONFIGS = {
    "bert_fp32": dict(model="bert", seq_len=512, micro_batch=2, accum=1, dtype="fp32", recompute=False),
    "bert_bf16": dict(model="bert", seq_len=512, micro_batch=2, accum=1, dtype="bf16", recompute=False),
    "bert_recompute": dict(model="bert", seq_len=512, micro_batch=2, accum=1, dtype="fp32", recompute=True),
    "bert_accum": dict(model="bert", seq_len=512, micro_batch=1, accum=2, dtype="fp32", recompute=False),
    "gpt2_small": dict(model="gpt2", seq_len=512, micro_batch=2, accum=1, dtype="fp32", recompute=False),
}

STEP_PREFIX = "ProfilerStep#"
SEED = 1234


def build_model(kind: str):
    import transformers
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    if kind == "bert":
        cfg = BertConfig()  # BERT-base: 12 layers, hidden 768, 12 heads, vocab 30522
        model = BertForMaskedLM(cfg)
    elif kind == "gpt2":
        cfg = GPT2Config()  # GPT-2 small: 12 layers, hidden 768, 12 heads, vocab 50257
        cfg.use_cache = False
        model = GPT2LMHeadModel(cfg)
    else:  # pragma: no cover
        raise ValueError(kind)
    return model, cfg, transformers.__version__


def enable_recompute(model) -> str:
    # transformers >= 5.x renamed gradient_checkpointing_enable (deprecated alias).
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
        return "model.activation_checkpointing_enable()  (== gradient_checkpointing_enable(); use_reentrant=False)"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return "model.gradient_checkpointing_enable(use_reentrant=False)"


def make_batch(kind, vocab, micro_batch, seq_len, gen):
    import torch

    input_ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen)
    attention_mask = torch.ones(micro_batch, seq_len, dtype=torch.long)
    if kind == "bert":
        # MLM: predict ~15% of positions, ignore the rest.
        mask = torch.rand(micro_batch, seq_len, generator=gen) < 0.15
        labels = torch.where(mask, input_ids, torch.full_like(input_ids, -100))
    else:
        labels = input_ids.clone()
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def train_step(model, opt, spec, vocab, gen):
    import torch

    amp = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if spec["dtype"] == "bf16"
        else contextlib.nullcontext()
    )
    for _ in range(spec["accum"]):
        batch = make_batch(spec["model"], vocab, spec["micro_batch"], spec["seq_len"], gen)
        with amp:
            out = model(**batch)
        loss = out.loss / spec["accum"]
        loss.backward()
        del out, batch
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def filter_trace(raw: dict) -> dict:
    events = raw["traceEvents"]
    kept = [
        e
        for e in events
        if e.get("name") == "[memory]"
        or (isinstance(e.get("name"), str) and e["name"].startswith(STEP_PREFIX) and e.get("ph") == "X")
    ]
    out = {k: v for k, v in raw.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out


def summarize(trace: dict) -> dict:
    mem = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith(STEP_PREFIX)]
    b = [e["args"]["Bytes"] for e in mem]
    return dict(
        memory_events=len(mem),
        allocs=sum(1 for x in b if x > 0),
        frees=sum(1 for x in b if x < 0),
        zero_byte=sum(1 for x in b if x == 0),
        distinct_addr=len({e["args"]["Addr"] for e in mem}),
        device_types=sorted({e["args"]["Device Type"] for e in mem}),
        steps=len(steps),
        step_names=[e["name"] for e in sorted(steps, key=lambda e: e["ts"])],
    )


def capture(name: str, out_dir: Path, profiled_steps: int, keep_raw: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    spec = CONFIGS[name]
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    model, cfg, tf_version = build_model(spec["model"])
    recompute_call = enable_recompute(model) if spec["recompute"] else None
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(SEED)
    vocab = cfg.vocab_size

    t0 = time.time()
    loss = train_step(model, opt, spec, vocab, gen)  # warm-up (not profiled)
    print(f"[{name}] warm-up step {time.time() - t0:.1f}s loss={loss:.3f}", flush=True)
    # Memory that is resident when the window opens and therefore invisible in
    # the trace: parameters + AdamW state (grads are None after zero_grad).
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt_state_bytes = sum(
        t.numel() * t.element_size()
        for st in opt.state.values()
        for t in st.values()
        if torch.is_tensor(t)
    )

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        for i in range(profiled_steps):
            t0 = time.time()
            with record_function(f"{STEP_PREFIX}{i + 1}"):
                loss = train_step(model, opt, spec, vocab, gen)
            print(f"[{name}] profiled step {i + 1} {time.time() - t0:.1f}s loss={loss:.3f}", flush=True)

    with tempfile.TemporaryDirectory() as td:
        # Export with a bare relative file name: Kineto stores the path it was
        # given as the top-level "traceName", and we don't want a local path there.
        raw_path = Path(td) / f"{name}.json"
        cwd = os.getcwd()
        os.chdir(td)
        try:
            prof.export_chrome_trace(raw_path.name)
        finally:
            os.chdir(cwd)
        raw_bytes = raw_path.stat().st_size
        with open(raw_path) as f:
            raw = json.load(f)
        if keep_raw:
            (out_dir / f"{name}.raw.json").write_bytes(raw_path.read_bytes())
    n_raw_events = len(raw["traceEvents"])
    trace = filter_trace(raw)
    del raw

    out_path = out_dir / f"{name}.json.gz"
    payload = json.dumps(trace, separators=(",", ":")).encode()
    # mtime=0 keeps the gzip header free of wall-clock time.
    with open(out_path, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(payload)

    summary = summarize(trace)
    meta = dict(
        file=out_path.name,
        config=name,
        model={"bert": "BertForMaskedLM (BERT-base, BertConfig() defaults, random init)",
               "gpt2": "GPT2LMHeadModel (GPT-2 small, GPT2Config() defaults, random init)"}[spec["model"]],
        attn_implementation=getattr(cfg, "_attn_implementation", None),
        seq_len=spec["seq_len"],
        micro_batch=spec["micro_batch"],
        micro_batches_per_step=spec["accum"],
        dtype=spec["dtype"] if spec["dtype"] == "fp32" else "bf16 autocast around forward (params/optimizer fp32)",
        recompute=recompute_call,
        optimizer="torch.optim.AdamW(lr=1e-4), zero_grad(set_to_none=True) after step",
        warmup_steps=1,
        profiled_steps=profiled_steps,
        seed=SEED,
        torch_threads=torch.get_num_threads(),
        versions=dict(torch=torch.__version__, transformers=tf_version, python=platform.python_version()),
        machine=f"{platform.machine()} CPU, {os.cpu_count()} cores",
        date_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        command=f"python traces/capture_cpu.py --config {name}"
        + (f" --steps {profiled_steps}" if profiled_steps != 2 else ""),
        resident_before_window=dict(
            param_bytes=param_bytes,
            adamw_state_bytes=opt_state_bytes,
            note="allocated before profiling began; not in the trace",
        ),
        raw_export_bytes=raw_bytes,
        raw_export_events=n_raw_events,
        gz_bytes=out_path.stat().st_size,
        **summary,
    )
    (out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2), flush=True)
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, choices=[*CONFIGS, "all"])
    p.add_argument("--steps", type=int, default=2, help="profiled training steps after 1 warm-up (default 2)")
    p.add_argument("--out-dir", type=Path, default=HERE, help="output directory (default: traces/)")
    p.add_argument("--keep-raw", action="store_true", help="also keep the unfiltered export (large; not shipped)")
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    names = list(CONFIGS) if args.config == "all" else [args.config]
    for n in names:
        capture(n, args.out_dir, args.steps, args.keep_raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
