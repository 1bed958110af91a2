"""The largest per-GPU value that fits every rank of a distributed job, and the rank that limits it: ``fit_job(...)``.

``allocsim fit -- torchrun --nproc-per-node 8 train.py --batch {B}`` is ``allocsim.fit`` per role
of ranks: the job is captured at each value (``allocsim capture`` of the launcher: one trace per
role, ``torch_capture.distributed.capture_dir``), each role's traces are scaled and searched as a
single script's are, and the job's answer on a GPU is the smallest of its roles' answers: every
rank runs the same ``{B}``, so the role that stops first limits the job. Its lowest rank is the
**limiting rank**. The roles must be the same at every value captured (they are for a job whose
layout does not depend on the batch). Where a role's two captures straddle a kernel switch, the job is
captured once more above them, as ``fit`` does for one process (``fit._choose_inputs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import tempfile
import time
from fractions import Fraction
from typing import Any, Callable, Sequence

from .fit import (CaptureRun, FitResult, GpuAnswer, ScriptFailed, _answer, _slug, check_command, extra_values,
                  group_gpus, scale_name_for, with_value)
from .gpus import allocator_capacity, find_gpu
from .nccl_estimate import add_nccl_ends, role_nccl_ends


def _job_folder(folder: str, knob: str, value: int, gpu: Any) -> str:
    return os.path.join(folder, f"job.{knob}{value}.{_slug(gpu.name)}")


def _capture_jobs(command: list[str], knob: str, values: Sequence[int], reps: Sequence[Any], folder: str, steps: int,
                  timeout_s: float | None, workers: int, log: Callable[[str], None]) -> dict[tuple[str, int], Any]:
    from .torch_capture.distributed.capture_dir import capture_job
    from .torch_capture.distributed.folder_check import check_job_folder
    from .torch_capture.distributed.launchers import parse_launch

    manifests = {}
    for gpu in reps:
        for value in values:
            launch = parse_launch(with_value(command, knob, value))
            path = _job_folder(folder, knob, value, gpu)
            check_job_folder(path, path)
            t0 = time.monotonic()
            manifest = capture_job(launch, path, steps=steps, gpu=gpu.capture_properties(), gpu_name=gpu.name,
                                   timeout_s=timeout_s, verify=False, workers=workers, log=lambda m: None,
                                   rank0_to_terminal=False)
            log(f"captured the job at {knob} = {value} for {gpu.name}: {len(manifest.roles)} role(s), "
                f"{time.monotonic() - t0:.1f} s")
            if manifest.status != 0:
                failed = next(r for r in manifest.roles if r.status != 0)
                raise ScriptFailed(f"the capture of rank {failed.representative} at {knob} = {value} (for {gpu.name}) "
                                   f"ended with exit status {failed.status}: {failed.message or 'no reason given'} "
                                   f"(its folder: {path})", failed.status)
            manifests[(gpu.name, value)] = (path, manifest)
    return manifests


def _same_roles(manifests: list[tuple[int, Any]], knob: str) -> None:
    first_value, first = manifests[0]
    layout = [r.ranks for r in first.roles]
    for value, manifest in manifests[1:]:
        if [r.ranks for r in manifest.roles] != layout:
            raise ValueError(f"the job's roles differ between {knob} = {first_value} and {knob} = {value}; fit needs the "
                             "same ranks doing the same work at every value")


@dataclasses.dataclass
class _RoleRun:
    """One role's trace at one value (what ``fit._choose_inputs`` reads of a capture)."""

    value: int
    path: str


def _role_inputs(mine: list[tuple[int, Any]], scale_name: str, knob: str, final: bool) -> tuple[list | None, str]:
    """Per role: ``(role, scaler, in_trace, kinds, [(path, value)...], note, metas)``; ``(None, why)`` when a role's
    captures straddle a kernel switch and another capture should be made (``fit._choose_inputs``)."""
    from .fit import _choose_inputs, _refused
    from .gpu_ranges import is_capture, runs_cudnn
    from .scale import load_input
    from .scale.consistency import MixedInputs
    from .trace.inference.workspaces import cublas_workspaces_in_trace

    roles = mine[0][1][1].roles
    per_role = []
    for index, role in enumerate(roles):
        runs = [_RoleRun(v, os.path.join(path, manifest.roles[index].trace)) for v, (path, manifest) in mine]
        loaded = {run.path: load_input(run.path, Fraction(run.value)) for run in runs}
        try:
            choice, why = _choose_inputs(runs, loaded, scale_name, knob, final)
        except MixedInputs as exc:
            raise _refused(exc, runs, knob) from None
        if choice is None:
            return None, f"ranks {role.to_dict()['ranks_text']}: {why}"
        inputs = [loaded[run.path] for run in choice.runs]
        in_trace = all(cublas_workspaces_in_trace(item.trace.meta) for item in inputs)
        kinds = (any(runs_cudnn(item.trace) for item in inputs), all(is_capture(item.trace) for item in inputs))
        per_role.append((role, choice.scaler, in_trace, kinds, [(run.path, run.value) for run in choice.runs],
                         choice.note, [item.trace.meta for item in inputs]))
    return per_role, ""


def is_job(command: Sequence[str]) -> bool:
    """Whether ``command`` runs its script under a launcher (``torchrun ...``): ``fit_job`` answers it."""
    from .torch_capture.distributed.launcher import LaunchError
    from .torch_capture.distributed.launchers import parse_launch

    try:
        return bool(parse_launch(list(command)).launcher)
    except LaunchError:
        return False


def fit_job(command: Sequence[str], gpus: Sequence[str] | None = None, *, values: Sequence[int], steps: int,
            out_dir: str | None, scale_name: str | None, multiple: int, max_value: int | None, advise: bool,
            workers: int | None, timeout_s: float | None, per_gpu: bool, allow_incomplete: bool = False,
            target_torch: str | None = None, log: Callable[[str], None] = lambda message: None) -> FitResult:
    """``allocsim.fit.fit`` for a launcher command: per role, the job limited by its smallest answer (module doc).

    A capture that stops early ends the fit (``ScriptFailed``) whatever ``allow_incomplete`` says: a
    job's roles must all be whole to be compared.
    """
    from .fit import DEFAULT_GPUS
    from .torch_release import check_target, inputs_check
    from .scale.findmax import find_max
    from .sweep.executors import make_executor

    command = list(command)
    knob = check_command(command)
    values = sorted(set(int(v) for v in values))
    if len(values) < 2 or values[0] < 1:
        raise ValueError("give two or more different values >= 1 to capture, e.g. --values 2,4")
    if steps < 0 or multiple < 1 or (workers is not None and workers < 1):
        raise ValueError("--steps must be >= 0, --multiple-of and --workers >= 1")
    models = list({m.name: m for m in (find_gpu(n) for n in (gpus or DEFAULT_GPUS))}.values())
    target_torch = check_target(target_torch)
    scale_name = scale_name or scale_name_for(knob)
    groups = group_gpus(models, per_gpu)
    if out_dir is not None:
        from .output_file import check_output_folder

        check_output_folder(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        folder = out_dir
    else:
        folder = tempfile.mkdtemp(prefix="allocsim-fit-")
    n_workers = workers or os.cpu_count() or 1
    try:
        t0 = time.monotonic()
        manifests = _capture_jobs(command, knob, values, [rep for rep, _ in groups], folder, steps, timeout_s,
                                  n_workers, log)
        t1 = time.monotonic()
        captures = [CaptureRun(value, rep.name, path, None, manifest.seconds,
                               sum(r.allocs for r in manifest.roles),
                               max(r.peak_reserved_bytes for r in manifest.roles))
                    for (rep_name, value), (path, manifest) in manifests.items()
                    for rep in [next(g for g, _ in groups if g.name == rep_name)]]
        answers: list[GpuAnswer] = []
        replay: list[str] = []
        torch: dict[str, Any] = {}
        executor = make_executor(workers=workers) if advise else None
        with executor if executor is not None else contextlib.nullcontext():
            for rep, members in groups:
                rep_values = list(values)
                extra = extra_values(values)
                while True:
                    mine = [(v, manifests[(rep.name, v)]) for v in rep_values]
                    _same_roles([(v, m) for v, (_p, m) in mine], knob)
                    per_role, wanted = _role_inputs(mine, scale_name, knob, final=not extra)
                    if per_role is not None:
                        break
                    # the captures straddle a kernel switch for some role: one more, above them (as fit does)
                    value = extra.pop(0)
                    log(f"the captures disagree, a kernel switch between them? ({wanted}): capturing the job at "
                        f"{knob} = {value}")
                    manifests.update(_capture_jobs(command, knob, [value], [rep], folder, steps, timeout_s,
                                                   n_workers, log))
                    path, manifest = manifests[(rep.name, value)]
                    captures.append(CaptureRun(value, rep.name, path, None, manifest.seconds,
                                               sum(r.allocs for r in manifest.roles),
                                               max(r.peak_reserved_bytes for r in manifest.roles)))
                    rep_values.append(value)
                for item in per_role:
                    torch = torch or inputs_check(item[-1], target_torch)
                per_role = [item[:-1] for item in per_role]
                for gpu in members:
                    role_answers = []
                    for role, scaler, in_trace, (cudnn, capture), paths, note in per_role:
                        log(f"searching the largest {knob} that fits {gpu.name} for ranks "
                            f"{role.to_dict()['ranks_text']}")
                        # FITS only at the high end of the unknown terms (gpu_ranges), as for one process;
                        # NCCL's communicators take their bytes off the card first, each end its own
                        nccl_low, nccl, nccl_high = role_nccl_ends(mine[-1][1][1], role, gpu)
                        capacity = allocator_capacity(gpu, in_trace, end="high", cudnn=cudnn, capture=capture) \
                            - nccl_high
                        point = allocator_capacity(gpu, in_trace, end="point", cudnn=cudnn, capture=capture) - nccl
                        found = find_max(scaler, capacity, policy="pytorch", multiple=multiple, max_value=max_value,
                                         advise=advise, executor=executor)
                        answer = _answer(gpu, rep, found, scaler, capacity, in_trace, multiple, found.max_value,
                                         cudnn, point, capture)
                        add_nccl_ends(answer.estimate, nccl_low, nccl, nccl_high)
                        answer.inputs_note = note
                        answer.fitted_from = [v for _p, v in paths]
                        role_answers.append((role, answer, paths))
                    limit_role, answer, paths = min(role_answers, key=lambda ra: (
                        -1 if ra[1].value is None else ra[1].value, ra[0].representative))
                    answer = dataclasses.replace(answer, limiting_rank=limit_role.representative,
                                                 per_role=[{"ranks": r.ranks, "ranks_text": r.to_dict()["ranks_text"],
                                                            "value": a.value, "range_low": a.range_low,
                                                            "range_high": a.range_high}
                                                           for r, a, _p in role_answers])
                    answers.append(answer)
                    replay.append(shlex.join(["allocsim", "scale", *(f"{p}@{v}" for p, v in paths),
                                              "--name", scale_name, "--gpu", gpu.name, "--find-max"]))
        t2 = time.monotonic()
    finally:
        if out_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    if out_dir is None:
        captures = [dataclasses.replace(c, path=None, log=None) for c in captures]
        replay = []
    order = {m.name: i for i, m in enumerate(models)}
    answers.sort(key=lambda a: order[a.gpu.name])
    values = sorted({value for _name, value in manifests})       # with those captured past a kernel switch
    return FitResult(command, knob, scale_name, values, steps, captures, answers, t1 - t0, t2 - t1, out_dir, replay,
                     torch=torch)
