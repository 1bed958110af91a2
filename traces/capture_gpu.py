#!/usr/bin/env python
"""Capture a CUDA caching-allocator memory snapshot of BERT-base training.

NOT run in this repository's CI (it needs an NVIDIA GPU). It imports cleanly on
a CPU-only machine and exits with a clear message at run time if CUDA is
unavailable.

What it does
------------
1. ``torch.cuda.memory._record_memory_history(max_entries=N)`` is switched on
   *before* the model is built, so the history contains parameter, gradient and
   AdamW-state allocations as well as the per-step transients (unlike the CPU
   Kineto traces, which start after a warm-up step).
2. BERT-base (``BertForMaskedLM``, ``BertConfig()`` defaults, random init, no
   downloaded weights) runs ``--warmup`` + ``--steps`` training steps:
   forward -> backward -> AdamW step -> ``zero_grad(set_to_none=True)``.
   Each step is wrapped in ``record_function("ProfilerStep#N")`` (warm-up
   steps: ``WarmupStep#N``); with ``global_record_annotations=True`` these
   appear in the snapshot's ``external_annotations``.
3. Two CUDA streams: the *next* batch is copied host(pinned)->device on a side
   stream while the current step computes on the default stream. Before a
   prefetched batch is used, the default stream waits on the side stream and
   every batch tensor gets ``tensor.record_stream(default_stream)``: those
   blocks were allocated on the side stream, so without ``record_stream`` the
   caching allocator could hand them out again (on the side stream) while the
   default stream is still reading them. In the snapshot these blocks carry the
   side stream's id, which is what exercises per-stream pools in allocsim.
   ``--no-side-stream`` disables this (single stream).
4. ``torch.cuda.memory._dump_snapshot(path)`` writes the pickle, which is then
   gzip-compressed to ``--out`` (the uncompressed pickle is removed unless
   ``--keep-raw``). A ``<out>.meta.json`` sidecar records provenance and the
   number of trace entries per action.

Example::

    python traces/capture_gpu.py --out traces/bert_cuda_2stream.pickle.gz
    python traces/capture_gpu.py --dtype bf16 --batch 16 --out traces/bert_cuda_bf16.pickle.gz

Load with::

    import gzip, pickle
    snap = pickle.load(gzip.open("traces/bert_cuda_2stream.pickle.gz"))
    snap["device_traces"][0]   # list of {action, addr, size, stream, time_us, frames}
    snap["segments"]           # allocator state at dump time

(``gunzip`` it first to view at https://pytorch.org/memory_viz .)
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as _dt
import gzip
import inspect
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

SEED = 1234


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "bert_cuda_snapshot.pickle.gz",
                   help="output path of the gzip-compressed snapshot (default: traces/bert_cuda_snapshot.pickle.gz)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--seq-len", type=int, default=512, help="sequence length (default 512)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 = torch.autocast('cuda', bfloat16) around forward (default fp32)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps, recorded too (default 1)")
    p.add_argument("--steps", type=int, default=2, help="measured steps after warm-up (default 2)")
    p.add_argument("--max-entries", type=int, default=200_000,
                   help="ring-buffer size of _record_memory_history; older entries are dropped beyond it (default 200000)")
    p.add_argument("--stacks", choices=["python", "all"], default="python",
                   help="'python' keeps the snapshot small; 'all' adds C++ frames (large, slow to symbolize)")
    p.add_argument("--context", choices=["all", "alloc", "state"], default="all",
                   help="which events keep a traceback: 'all' = alloc+free (default), 'alloc', 'state'")
    p.add_argument("--no-side-stream", action="store_true", help="copy batches on the default stream (1 stream)")
    p.add_argument("--keep-raw", action="store_true", help="keep the uncompressed pickle next to --out")
    return p.parse_args(argv)


def make_host_batch(vocab: int, batch: int, seq_len: int, gen: torch.Generator) -> dict:
    """A random MLM batch on the CPU, in pinned memory so the H2D copy can be async."""
    input_ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    mask = torch.rand(batch, seq_len, generator=gen) < 0.15
    labels = torch.where(mask, input_ids, torch.full_like(input_ids, -100))
    attention_mask = torch.ones(batch, seq_len, dtype=torch.long)
    return {k: v.pin_memory() for k, v in
            dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels).items()}


class Prefetcher:
    """Copies batch i+1 to the GPU on a side stream while batch i is being used."""

    def __init__(self, host_batches, device, side_stream: bool):
        self.host_batches = host_batches  # iterator of pinned CPU batches
        self.device = device
        self.stream = torch.cuda.Stream(device=device) if side_stream else None
        self.pending = self._start_copy()

    def _start_copy(self):
        host = next(self.host_batches, None)
        if host is None:
            return None
        if self.stream is None:
            return {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
        # The destination blocks are allocated by the caching allocator in the
        # side stream's pool. The pinned host buffers may be dropped right away:
        # the pinned-memory host allocator records an event on the copy and does
        # not reuse them until the copy has finished.
        with torch.cuda.stream(self.stream):
            return {k: v.to(self.device, non_blocking=True) for k, v in host.items()}

    def next(self):
        batch = self.pending
        if batch is None:
            raise StopIteration
        if self.stream is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_stream(self.stream)  # the copy must finish before compute reads it
            for t in batch.values():
                t.record_stream(main)  # don't recycle these side-stream blocks while main uses them
        self.pending = self._start_copy()  # overlap the next copy with this step's compute
        return batch


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("capture_gpu.py: CUDA is not available (torch %s, cuda build: %s). "
              "Run this script on a machine with an NVIDIA GPU and a CUDA build of torch."
              % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 2
    try:
        import transformers
        from transformers import BertConfig, BertForMaskedLM
    except ImportError:
        print("capture_gpu.py: needs `transformers` (see traces/requirements-capture.txt)", file=sys.stderr)
        return 2

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(SEED)
    torch.cuda.manual_seed_all(SEED)
    gen = torch.Generator().manual_seed(SEED)

    rec_kwargs = dict(enabled="all", context=args.context, stacks=args.stacks, max_entries=args.max_entries)
    impl = getattr(torch.cuda.memory, "_record_memory_history_impl", None)
    if impl is not None and "global_record_annotations" in inspect.signature(impl).parameters:
        rec_kwargs["global_record_annotations"] = True  # record_function names -> snapshot["external_annotations"]
    torch.cuda.memory._record_memory_history(**rec_kwargs)

    cfg = BertConfig()
    model = BertForMaskedLM(cfg).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if args.dtype == "bf16" else contextlib.nullcontext

    n_total = args.warmup + args.steps
    host_batches = (make_host_batch(cfg.vocab_size, args.batch, args.seq_len, gen) for _ in range(n_total))
    loader = Prefetcher(host_batches, device, side_stream=not args.no_side_stream)

    for i in range(n_total):
        name = f"WarmupStep#{i + 1}" if i < args.warmup else f"ProfilerStep#{i - args.warmup + 1}"
        t0 = time.time()
        with torch.profiler.record_function(name):
            batch = loader.next()
            with amp():
                out = model(**batch)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = out.loss.detach()
            del out, batch
        torch.cuda.synchronize(device)
        print(f"{name}: {time.time() - t0:.2f}s loss={loss.item():.3f} "
              f"allocated={torch.cuda.memory_allocated(device) / 2**20:.0f}MiB "
              f"peak={torch.cuda.max_memory_allocated(device) / 2**20:.0f}MiB", flush=True)

    torch.cuda.synchronize(device)
    snap = torch.cuda.memory._snapshot()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix("") if out.suffix == ".gz" else out.with_name(out.name + ".raw")
    torch.cuda.memory._dump_snapshot(str(raw))
    torch.cuda.memory._record_memory_history(enabled=None)

    gz = out if out.suffix == ".gz" else out.with_name(out.name + ".gz")
    with open(raw, "rb") as src, open(gz, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    raw_bytes = raw.stat().st_size
    if not args.keep_raw:
        raw.unlink()

    traces = snap.get("device_traces", [])
    dev_trace = traces[device.index] if device.index < len(traces) else []
    actions = collections.Counter(e["action"] for e in dev_trace)
    streams = collections.Counter(e.get("stream") for e in dev_trace if e["action"] == "alloc")
    meta = dict(
        file=gz.name,
        model="BertForMaskedLM (BERT-base, BertConfig() defaults, random init)",
        batch=args.batch, seq_len=args.seq_len, dtype=args.dtype,
        warmup_steps=args.warmup, steps=args.steps,
        streams="default + side stream for H2D prefetch (record_stream)" if not args.no_side_stream else "default only",
        record_memory_history=rec_kwargs,
        recording_started="before model construction (params/optimizer state are in the history)",
        trace_entries=len(dev_trace),
        ring_buffer_full=len(dev_trace) >= args.max_entries,
        actions=dict(actions),
        allocs_per_stream={str(k): v for k, v in streams.items()},
        segments_at_dump=len(snap.get("segments", [])),
        external_annotations=len(snap.get("external_annotations", [])),
        peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda,
                      transformers=transformers.__version__, python=platform.python_version()),
        gpu=torch.cuda.get_device_name(device),
        date_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        command="python traces/capture_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        raw_pickle_bytes=raw_bytes,
        gz_bytes=gz.stat().st_size,
    )
    gz.with_name(gz.name + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    if meta["ring_buffer_full"]:
        print("warning: history hit --max-entries; the oldest entries were overwritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
