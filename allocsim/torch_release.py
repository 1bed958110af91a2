"""Say when the torch a trace was made with is not the one the GPU run will use: ``torch_check(meta, target)``.

The same script allocates differently under two torch releases (docs/capture.md: "Capture in the
torch your GPU run uses"), so a prediction is only as good as the match between the torch that made
the trace and the torch of the run it predicts. A capture names its torch
(``meta.version_hints["torch"]``); a Kineto trace names it where the profiler's caller recorded it
(``metadata.torch_env_info.torch_version``, as TraceLens does); a memory snapshot does not. The
target run's torch is what the user says (``--torch VERSION``), by default the capture's own.
"""

from __future__ import annotations

from typing import Any

from .torch_capture import torch_versions


def trace_torch(meta: Any) -> tuple[str | None, bool]:
    """``(torch version or None, made by allocsim capture)`` of a trace's metadata."""
    hints = getattr(meta, "version_hints", None) or {}
    version = hints.get("torch")
    version = str(version)[:80] if version else None
    return version, hints.get("capture") == "cuda on meta"


def check_target(target: str | None) -> str | None:
    """``--torch VERSION`` checked (``"2.6"``, ``"2.6.0+cu124"``); ValueError when it names no release."""
    if target is None:
        return None
    if torch_versions.parse(target) is None:
        raise ValueError(f"--torch: {target!r} is not a torch version (give one like 2.6 or 2.6.0)")
    return str(target)


def torch_check(meta: Any, target: str | None = None) -> dict[str, Any]:
    """``{"trace_torch", "captured", "target_torch", "differs", "note"}``: ``note`` says what to do, or is None.

    ``target`` None means the run uses the trace's own torch (nothing to say). A capture whose
    release differs from ``target`` is to be made again in the target's interpreter; a recording's
    differing release is said as a fact (the GPU run will not allocate the same).
    """
    version, captured = trace_torch(meta)
    out: dict[str, Any] = {"trace_torch": version, "captured": captured, "target_torch": target or version,
                           "differs": False, "note": None}
    if target is None:
        return out
    if version is None:
        out["note"] = (f"the trace does not say which torch made it; the GPU run uses torch {target}: "
                       "where the releases differ, so do the allocations")
        return out
    if torch_versions.differ(version, target):
        out["differs"] = True
        if captured:
            out["note"] = (f"captured with torch {version}, the GPU run uses torch {target}: releases allocate "
                           "differently (autograd, reductions, attention kernels); capture again in the training "
                           "environment's interpreter (-- /path/to/python train.py)")
        else:
            out["note"] = (f"recorded with torch {version}, the GPU run uses torch {target}: releases allocate "
                           "differently (autograd, reductions, attention kernels)")
    return out


def inputs_check(metas: list[Any], target: str | None = None) -> dict[str, Any]:
    """``torch_check`` over several traces (``allocsim scale``'s inputs): their torch versions, and one note
    when they differ from each other or from ``target``."""
    versions = [trace_torch(m)[0] for m in metas]
    known = sorted({v for v in versions if v})
    mixed = len({torch_versions.parse(v) for v in known}) > 1
    first = next((m for m, v in zip(metas, versions) if v), metas[0] if metas else None)
    out = torch_check(first, target) if first is not None else {"note": None, "differs": False}
    out["input_torch"] = versions
    if mixed:
        out["differs"] = True
        out["note"] = (f"the inputs were made with different torch releases ({', '.join(known)}): a law fitted "
                       "across them mixes the releases' allocations; make them all in one torch")
    return out
