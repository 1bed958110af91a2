#!/usr/bin/env python
"""Capture real PaddlePaddle allocation traces: training steps under ``paddle.profiler`` with memory.

Runs a BERT-base-shaped ``paddle.nn.TransformerEncoder`` masked-LM step (ERNIE/BERT-like, the shapes
of ``bert_fp32.json.gz``) and a small ResNet, under ``paddle.profiler.Profiler(...,
profile_memory=True)``, exports Paddle's own Chrome trace, and keeps

* every ``[memory]`` event, unchanged (Paddle's ``place``, ``addr``, ``increase_bytes``,
  ``current_allocated``, ``current_reserved``, ``peak_*`` args),
* the ``ProfileStep#N`` events, the process/thread metadata events and the top-level keys,
* the host events that enclose at least one ``[memory]`` event on its thread (Forward layers,
  UserDefined API calls, Operator and kernel-launch events): allocsim's pseudo-frames,

written gzip-compressed to ``traces/paddle/<config>.json.gz`` with a ``.meta.json`` sidecar.

Usage::

    python traces/capture_paddle.py --config all                 # CPU (paddlepaddle)
    python traces/capture_paddle.py --config all --device gpu    # GPU (paddlepaddle-gpu): paddle/gpu/

One un-profiled warm-up step runs first, so parameters and optimizer state exist before the window
opens (the reader turns them into one start-of-window allocation from ``current_allocated``).
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
SEED = 1234
FRAME_CATS = {"Operator", "UserDefined", "Forward", "Backward", "Optimization", "DygraphKernelLaunch"}

# BERT-base shapes (as bert_fp32.json.gz): 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, seq 512, batch 2.
BERT = dict(model="bert", layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, seq_len=512, batch=2)
CONFIGS = {
    "ernie_fp32": dict(BERT, amp=None, recompute=False),
    "ernie_bf16": dict(BERT, amp="bfloat16", recompute=False),
    "ernie_recompute": dict(BERT, amp=None, recompute=True),
    "resnet_fp32": dict(model="resnet", depth=18, image=64, batch=8, classes=10, amp=None, recompute=False),
}


def build_bert(cfg):
    import paddle
    from paddle import nn

    class MaskedLM(nn.Layer):
        """BERT-like MLM: embeddings + TransformerEncoder + tied output projection."""

        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(cfg["vocab"], cfg["hidden"])
            self.pos = nn.Embedding(cfg["seq_len"], cfg["hidden"])
            self.norm = nn.LayerNorm(cfg["hidden"])
            self.layers = nn.LayerList([
                nn.TransformerEncoderLayer(cfg["hidden"], cfg["heads"], cfg["ffn"], dropout=0.1, activation="gelu")
                for _ in range(cfg["layers"])])
            self.recompute = cfg["recompute"]

        def forward(self, ids):
            positions = paddle.arange(ids.shape[1]).unsqueeze(0)
            h = self.norm(self.word(ids) + self.pos(positions))
            for layer in self.layers:
                if self.recompute and self.training:
                    from paddle.distributed.fleet.utils import recompute
                    h = recompute(layer, h)
                else:
                    h = layer(h)
            return paddle.matmul(h, self.word.weight, transpose_y=True)

    return MaskedLM()


def build_resnet(cfg):
    import paddle.vision.models as models

    return getattr(models, f"resnet{cfg['depth']}")(num_classes=cfg["classes"])


def make_step(cfg, model, opt):
    import paddle
    import paddle.nn.functional as F

    gen = paddle.seed(SEED)  # noqa: F841 (seeds paddle's global generator)

    def step():
        if cfg["model"] == "bert":
            ids = paddle.randint(0, cfg["vocab"], [cfg["batch"], cfg["seq_len"]])
            labels = paddle.randint(0, cfg["vocab"], [cfg["batch"], cfg["seq_len"]])
            inputs = (ids,)
        else:
            inputs = (paddle.randn([cfg["batch"], 3, cfg["image"], cfg["image"]]),)
            labels = paddle.randint(0, cfg["classes"], [cfg["batch"]])
        if cfg["amp"]:
            with paddle.amp.auto_cast(level="O1", dtype=cfg["amp"]):
                logits = model(*inputs)
                loss = F.cross_entropy(logits.astype("float32").reshape([-1, logits.shape[-1]]), labels.reshape([-1]))
        else:
            logits = model(*inputs)
            loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1]))
        loss.backward()
        opt.step()
        opt.clear_grad(set_to_zero=False)
        return float(loss)
    return step


def _thread(ev):
    tid = str(ev.get("tid"))
    base, paren, _ = tid.partition("(")
    return (ev.get("pid"), base if paren and base.isdigit() else tid)


def filter_trace(doc):
    """Keep [memory], steps, metadata and the host events that enclose a [memory] event on its thread."""
    events = doc["traceEvents"]
    memory = [e for e in events if e.get("name") == "[memory]"]
    by_thread = {}
    for e in memory:
        by_thread.setdefault(_thread(e), []).append(e["ts"])
    for ts in by_thread.values():
        ts.sort()
    import bisect

    def encloses(e):
        ts = by_thread.get(_thread(e))
        if not ts:
            return False
        start, end = e["ts"], e["ts"] + e.get("dur", 0)
        k = bisect.bisect_left(ts, start)
        return k < len(ts) and ts[k] <= end

    kept = [e for e in events if e.get("name") == "[memory]" or e.get("ph") == "M" or e.get("cat") == "ProfileStep"
            or (e.get("ph") == "X" and e.get("cat") in FRAME_CATS and encloses(e))]
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out, len(events), len(memory)


def capture(name, cfg, device, out_dir):
    import paddle
    from paddle import profiler

    paddle.set_device(device)
    paddle.seed(SEED)
    model = build_bert(cfg) if cfg["model"] == "bert" else build_resnet(cfg)
    model.train()
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    step = make_step(cfg, model, opt)
    step()   # warm-up, not profiled: parameters and AdamW state exist before the window
    targets = [profiler.ProfilerTarget.CPU] + ([profiler.ProfilerTarget.GPU] if device.startswith("gpu") else [])
    raw = Path(tempfile.mkdtemp()) / f"{name}.json"
    prof = profiler.Profiler(targets=targets, profile_memory=True,
                             on_trace_ready=lambda p: p.export(str(raw), format="json"))
    t0 = time.time()
    prof.start()
    losses = []
    for _ in range(2):
        losses.append(step())
        prof.step()
    prof.stop()
    seconds = time.time() - t0
    raw_bytes = raw.stat().st_size
    doc = json.loads(raw.read_text())
    kept, n_raw, n_memory = filter_trace(doc)
    out = out_dir / f"{name}.json.gz"
    with gzip.GzipFile(out, "wb", mtime=0) as fh:
        fh.write(json.dumps(kept, separators=(",", ":")).encode())
    meta = {
        "config": name, "settings": cfg, "device": device, "steps_profiled": 2, "warmup_steps": 1,
        "losses": losses, "profiled_seconds": round(seconds, 2),
        "raw_export_bytes": raw_bytes, "raw_events": n_raw, "memory_events": n_memory,
        "kept_events": len(kept["traceEvents"]), "shipped_bytes": out.stat().st_size,
        "paddle": paddle.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "date": _dt.date.today().isoformat(),
        "flags": {k: v for k, v in os.environ.items() if k.startswith("FLAGS_")},
    }
    (out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    raw.unlink()
    print(f"{name}: {n_memory} [memory] events, {raw_bytes:,} B raw -> {out.stat().st_size:,} B, {seconds:.1f} s",
          file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="all", help=f"one of {', '.join(CONFIGS)} or all")
    ap.add_argument("--device", default="cpu", help="cpu (default) or gpu / gpu:N (needs paddlepaddle-gpu)")
    ap.add_argument("--out", default=None, help="output folder (default: traces/paddle, traces/paddle/gpu on GPU)")
    args = ap.parse_args(argv)
    names = list(CONFIGS) if args.config == "all" else [args.config]
    out_dir = Path(args.out) if args.out else HERE / "paddle" / ("gpu" if args.device.startswith("gpu") else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if CONFIGS[name]["amp"] and not args.device.startswith("gpu"):
            # paddle 3.3.1 on CPU: "amp_guard can only be enabled on CUDAPlace, XPUPlace, and CustomPlace ...
            # so it makes no effect": an AMP capture there would be the fp32 run under another name.
            print(f"{name}: skipped on {args.device} (Paddle's auto_cast has no effect there)", file=sys.stderr)
            continue
        capture(name, CONFIGS[name], args.device, out_dir)


if __name__ == "__main__":
    main()
