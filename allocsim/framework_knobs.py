"""The smallest framework change that makes a DeepSpeed or Megatron-LM job fit: ``knob_advice(folder, gpu)``.

``allocsim advise DIR --gpu NAME --framework`` reads the job's launch command from DIR's manifest and
tries, smallest change first, the settings those frameworks offer for memory, each captured again as a
job and replayed per role with NCCL counted, until one fits every role:

* DeepSpeed (a ``--deepspeed_config PATH`` / ``--deepspeed PATH`` JSON on the command line): the next
  ZeRO stages (``"zero_optimization": {"stage": S}``), then the optimizer offloaded to the CPU
  (``"offload_optimizer": {"device": "cpu"}``, at stage 2 or more), then ZeRO-3 with the parameters
  offloaded too (``"offload_param": {"device": "cpu"}``);
* Megatron-LM (``pretrain_*.py``): selective recompute (``--recompute-activations``), full recompute
  (``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``), the
  distributed optimizer (``--use-distributed-optimizer``) where data parallelism exists, then the
  tensor x pipeline splits the world allows (tensor parallel within a node and dividing the attention
  heads, pipeline dividing the layers, the global batch divisible by micro-batch x data parallel), the
  fewest model-parallel ranks first.

Each answer is the line to paste and the rank that limits the job. A changed DeepSpeed config is
written to a temporary folder (the user's file is never touched). The order is the frameworks' own
cost order (communication grows with the ZeRO stage, recompute costs a forward, more model
parallelism costs more communication); it is not a search of every combination.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Callable

#: Largest DeepSpeed config read (bytes); a config is untrusted input.
MAX_CONFIG_BYTES = 1 << 20
#: Tensor x pipeline splits tried at most.
MAX_SPLITS = 4
#: The capacity of a replay that only measures what a run needs (1 PiB: never reached).
UNBOUNDED_BYTES = 1 << 50


@dataclasses.dataclass
class Candidate:
    """One change to the job: what it is, the line to paste, and the command that runs with it."""

    label: str
    paste: str
    command: list[str]


def _option(args: list[str], names: tuple[str, ...]) -> tuple[int, str] | None:
    """(index of the value, value) of the first of ``names`` in ``args`` (``--name V`` or ``--name=V``)."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return i + 1, args[i + 1]
            if arg.startswith(name + "="):
                return i, arg.split("=", 1)[1]
    return None


def _replace(command: list[str], index: int, old: str, value: str) -> list[str]:
    out = list(command)
    out[index] = out[index].replace(old, value) if out[index] != old else value
    return out


def deepspeed_candidates(command: list[str], workdir: str) -> list[Candidate]:
    """ZeRO stage, optimizer offload, parameter offload: each a new config beside ``workdir``."""
    found = next((f for f in (_option(command, (name,)) for name in ("--deepspeed_config", "--deepspeed"))
                  if f is not None and f[1].endswith(".json")), None)
    if found is None:
        return []
    index, path = found
    try:
        if os.path.getsize(path) > MAX_CONFIG_BYTES:
            return []
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return []
    if not isinstance(config, dict):
        return []
    zero = dict(config.get("zero_optimization") or {})
    stage = int(zero.get("stage", 0) or 0)
    changes: list[tuple[str, str, dict[str, Any]]] = []
    for s in range(stage + 1, 4):
        changes.append((f"ZeRO stage {s}", f'"zero_optimization": {{"stage": {s}}}', {"stage": s}))
    if "offload_optimizer" not in zero:
        s = max(stage, 2)
        changes.append((f"ZeRO stage {s} with the optimizer on the CPU",
                        f'"zero_optimization": {{"stage": {s}, "offload_optimizer": {{"device": "cpu"}}}}',
                        {"stage": s, "offload_optimizer": {"device": "cpu"}}))
    if "offload_param" not in zero:
        changes.append(("ZeRO stage 3 with optimizer and parameters on the CPU",
                        '"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, '
                        '"offload_param": {"device": "cpu"}}',
                        {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}))
    out = []
    for n, (label, paste, change) in enumerate(changes):
        new = dict(config, zero_optimization={**zero, **change})
        new_path = os.path.join(workdir, f"ds_config.{n}.json")
        with open(new_path, "w", encoding="utf-8") as fh:
            json.dump(new, fh)
        out.append(Candidate(label, paste, _replace(command, index, path, new_path)))
    return out


def _int_option(args: list[str], names: tuple[str, ...], default: int) -> int:
    found = _option(args, names)
    try:
        return int(found[1]) if found else default
    except ValueError:
        return default


def megatron_candidates(command: list[str], world_size: int, ranks_per_node: int) -> list[Candidate]:
    """Recompute, the distributed optimizer, then tensor x pipeline splits the world allows."""
    if not any(os.path.basename(a).startswith("pretrain_") and a.endswith(".py") for a in command):
        return []
    tp = _int_option(command, ("--tensor-model-parallel-size",), 1)
    pp = _int_option(command, ("--pipeline-model-parallel-size",), 1)
    layers = _int_option(command, ("--num-layers",), 0)
    heads = _int_option(command, ("--num-attention-heads",), 0)
    micro = _int_option(command, ("--micro-batch-size",), 1)
    global_batch = _int_option(command, ("--global-batch-size",), 0)
    out = []
    if "--recompute-granularity" not in command and "--recompute-activations" not in command:
        out.append(Candidate("selective recompute", "--recompute-activations", command + ["--recompute-activations"]))
        full = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        out.append(Candidate("full recompute", " ".join(full), command + full))
    if "--use-distributed-optimizer" not in command and world_size // max(1, tp * pp) > 1:
        out.append(Candidate("distributed optimizer", "--use-distributed-optimizer",
                             command + ["--use-distributed-optimizer"]))
    splits = []
    t = 1
    while t <= ranks_per_node:
        for p in range(1, world_size + 1):
            if world_size % (t * p) or t * p <= tp * pp:
                continue
            if (heads and heads % t) or (layers and layers % p):
                continue
            dp = world_size // (t * p)
            if global_batch and global_batch % (micro * dp):
                continue
            splits.append((t * p, p, t))
        t *= 2
    for _, p, t in sorted(splits)[:MAX_SPLITS]:
        new = [a for a in command]
        for name, value in (("--tensor-model-parallel-size", t), ("--pipeline-model-parallel-size", p)):
            found = _option(new, (name,))
            if found:
                new = _replace(new, found[0], found[1], str(value))
            else:
                new += [name, str(value)]
        out.append(Candidate(f"tensor parallel {t} x pipeline parallel {p}",
                             f"--tensor-model-parallel-size {t} --pipeline-model-parallel-size {p}", new))
    return out


def job_fits(path: str, manifest: Any, gpu: Any, capacity_bytes: int | None) -> tuple[bool, int, int]:
    """(every role fits, limiting rank, bytes the limiting role needs) for the job captured in ``path``."""
    from .gpus import allocator_capacity, gpu_estimate
    from .metrics.verdict import GIVEN
    from .nccl_estimate import role_nccl_bytes
    from .runner import Capacity, simulate_trace
    from .trace import read_trace
    from .trace.inference.workspaces import cublas_workspaces_in_trace

    worst = (True, manifest.roles[0].representative, -1)
    for role in manifest.roles:
        if not role.trace:
            return False, role.representative, 0
        trace = read_trace(os.path.join(path, role.trace))
        in_trace = cublas_workspaces_in_trace(trace.meta)
        nccl = role_nccl_bytes(manifest, role, gpu) if gpu is not None else 0
        room = int(capacity_bytes) if gpu is None else allocator_capacity(gpu, in_trace) - nccl
        summary = simulate_trace(trace, "pytorch", {}, capacity=Capacity(room, GIVEN), fast=True).summary
        reserved = int(summary.get("peak_reserved_bytes") or 0)
        if not (summary.get("verdict") or {}).get("fits"):
            # out of memory: what was reserved when it stopped is less than the run needs; replay unbounded
            unbounded = simulate_trace(trace, "pytorch", {}, capacity=Capacity(UNBOUNDED_BYTES, GIVEN), fast=True)
            reserved = max(reserved, int(unbounded.summary.get("peak_reserved_bytes") or 0))
        need = (gpu_estimate(gpu, reserved, workspaces_in_trace=in_trace)["total_bytes"] + nccl
                if gpu is not None else reserved)
        fits = bool((summary.get("verdict") or {}).get("fits")) and (gpu is None or need <= gpu.total_bytes)
        if (not fits, need) > (not worst[0], worst[2]):
            worst = (fits, role.representative, need)
    return worst[0], worst[1], worst[2]


def knob_advice(folder: Any, gpu: Any = None, capacity_bytes: int | None = None,
                log: Callable[[str], None] = lambda m: None, timeout_s: float | None = None) -> dict[str, Any]:
    """Try the job's framework changes in order (module doc); the first that fits every role is the answer."""
    from .torch_capture.distributed.capture_dir import capture_job
    from .torch_capture.distributed.launchers import parse_launch

    manifest = folder.manifest
    command = [str(a) for a in manifest.launcher.get("command") or []]
    if not command:
        raise ValueError(f"{folder.path}: the manifest has no launch command to change")
    launch = parse_launch(command)
    workdir = tempfile.mkdtemp(prefix="allocsim-knobs-")
    tried: list[dict[str, Any]] = []
    answer = None
    try:
        candidates = (deepspeed_candidates(command, workdir)
                      or megatron_candidates(command, launch.world_size, launch.nproc_per_node))
        if not candidates:
            raise ValueError("no DeepSpeed config (--deepspeed_config / --deepspeed FILE.json) or Megatron-LM "
                             "pretrain_*.py in the job's command: no framework setting to try")
        gpu_props = gpu.capture_properties() if gpu is not None else {}
        for n, cand in enumerate(candidates):
            log(f"trying {cand.label}")
            out = os.path.join(workdir, f"job{n}")
            job = capture_job(parse_launch(cand.command), out, steps=manifest.steps, gpu=gpu_props,
                              gpu_name=gpu.name if gpu is not None else "", timeout_s=timeout_s, verify=False,
                              rank0_to_terminal=False)
            if job.status != 0:
                tried.append({"change": cand.label, "paste": cand.paste, "fits": False,
                              "error": next((r.message for r in job.roles if r.status), "")[:300]})
                continue
            fits, rank, need = job_fits(out, job, gpu, capacity_bytes)
            tried.append({"change": cand.label, "paste": cand.paste, "fits": fits, "limiting_rank": rank,
                          "needs_bytes": need})
            if fits:
                answer = tried[-1]
                break
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"answer": answer, "tried": tried}
