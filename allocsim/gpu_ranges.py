"""What a GPU holds that a CPU run cannot know, as ranges: ``unknown_terms(gpu, facts)`` and ``judge(...)``.

Bet on the high end: a verdict says FITS only when the run fits with every unknown term at the high
end of its range, "FITS UNLESS <term> ..." when it fits at the low end but not at the high end (the
term named is the one whose range crosses the card's memory), and DOES NOT FIT when even the low
end does not fit.

The unknown terms, each with a point (the estimate ``allocsim gpus`` shows), a low and a high end:

* ``context_bytes``: the CUDA context and the kernels CUDA and the libraries load lazily (cuBLAS,
  cuBLASLt, cuDNN handles and kernel images), which depend on the architecture and the library
  versions. Point: ``gpus.CONTEXT0_BYTES_FITTED`` plus the card's local memory. Low and high: the
  5% quantile and the most of the batch-0 values of the calibrated groups' benchmarks that run no cuDNN (milabench's L40S table and old A100 table; ``python -m
  validate milabench --calibrate``, ``validate/milabench_calibration.json`` "ranges"), each plus the
  card's local memory.
* ``cudnn_bytes`` (traces that run cuDNN convolutions only): cuDNN's loaded kernels, and what the
  capture's one workspace model cannot know -- the engine cuDNN's heuristic picks per architecture
  and library version, TF32 or float32 engines, ``cudnn.benchmark``'s trial workspaces. Point: the
  fitted kernels term (``CUDNN_BYTES_FITTED``). Low and high: the calibrated groups' kernels terms,
  plus a share of the replay's reserved peak (``CUDNN_SHARE_LOW`` / ``CUDNN_SHARE_HIGH``), the 5%
  quantile and the most by which calibrate rows that run cuDNN differ from the point estimate (milabench L40S and old A100 tables, xMem's Anova
  rows). It scales with the reserved peak because a different engine's workspace is a share of the
  feature maps it works on.

* ``placement_bytes`` (captures that run no cuDNN): the caching allocator's fragmentation follows
  where the driver places segments, which the replay does not know (it hands out addresses in
  creation order). Point 0; low and high: shares of the reserved peak (``PLACEMENT_SHARE_LOW`` /
  ``PLACEMENT_SHARE_HIGH``), the 5% quantile and the most by which calibrate rows that run no cuDNN
  differ from the point estimate. A capture that runs cuDNN has this inside cuDNN's term, whose range was
  learned from the whole difference of such rows.

The libraries' own memory outside these (``gpus.LIBRARY_BYTES_CALIBRATED``) fits to 0 and is not a
separate term; NVML's reserved memory is outside CUDA's total (``gpus`` totals are what CUDA
reports), so it enters only comparisons with NVML figures (``validate/milabench.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .units import format_bytes

MiB = 1 << 20

#: Fitted on milabench calibrate rows only (``python -m validate milabench --calibrate``): the 5%
#: quantile and the most context0 (batch-0 residual less the card's local memory) of the calibrated
#: groups' benchmarks that run no cuDNN (125 and 1026 MiB: L40S Bert fp16, A100 torch 2.3 T5); a test
#: holds every constant here to validate/milabench_calibration.json.
CONTEXT0_LOW_BYTES = 131072000
CONTEXT0_HIGH_BYTES = 1075838976
#: cuDNN's loaded kernels (the point): median batch-0 residual of the L40S benchmarks that run cuDNN
#: less the context (validate/milabench_calibration.json, L40S group).
CUDNN_BYTES_FITTED = 49516088
#: The least and the most cuDNN's loaded kernels took in the calibrated groups (those with a context).
CUDNN_KERNELS_LOW_BYTES = 24886649
CUDNN_KERNELS_HIGH_BYTES = 49516088
#: Shares of the reserved peak for cuDNN's unknown workspaces and engines (low may be negative: the
#: capture's workspace model can ask for more than the run takes).
CUDNN_SHARE_LOW = -0.1102
CUDNN_SHARE_HIGH = 0.0647

#: Shares of the reserved peak by which a capture that runs no cuDNN can differ from the replay: where
#: the driver places segments and so how the caching allocator fragments (the replay hands out
#: addresses in creation order). Learned from calibrate rows that run no cuDNN.
PLACEMENT_SHARE_LOW = -0.116
PLACEMENT_SHARE_HIGH = 0.0019

CONTEXT_LABEL = "CUDA context and loaded kernels"
PLACEMENT_LABEL = "allocator placement"
CUDNN_LABEL = "cuDNN workspaces and engines"


@dataclasses.dataclass(frozen=True)
class Term:
    """One unknown term: its point estimate, low and high end, and where they come from."""

    key: str
    label: str
    bytes: int
    low_bytes: int
    high_bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "bytes": self.bytes, "low_bytes": self.low_bytes,
                "high_bytes": self.high_bytes, "source": self.source}

    def text(self) -> str:
        """``CUDA context and loaded kernels 448.00 MiB (389.00 MiB to 1.26 GiB)``."""
        return (f"{self.label} {format_bytes(self.bytes)} ({format_bytes(self.low_bytes)} to "
                f"{format_bytes(self.high_bytes)})")


def context_term(context_bytes: int, local_bytes: int, fitted_bytes: int | None) -> Term:
    """The context term of a card whose point is ``context_bytes``.

    A fitted point (``fitted_bytes`` is the fitted context0 plus the card's local memory) takes the
    calibrated range plus the card's local memory; a context given by hand keeps its own value at
    both ends shifted by the same spread around the fitted point.
    """
    low = CONTEXT0_LOW_BYTES + local_bytes
    high = CONTEXT0_HIGH_BYTES + local_bytes
    if fitted_bytes is not None and context_bytes != fitted_bytes:
        low, high = context_bytes - (fitted_bytes - low), context_bytes + (high - fitted_bytes)
    low, high = min(low, context_bytes), max(high, context_bytes)
    return Term("context_bytes", CONTEXT_LABEL, int(context_bytes), int(max(0, low)), int(high),
                "calibrated: the least and the most context + loaded kernels (less local memory) of milabench's "
                "calibrate groups (L40S torch 2.6; A100-SXM4-80GB torch 2.1 to 2.4), batch-0 values of their "
                "benchmarks that run no cuDNN, plus this card's local memory (validate/milabench_calibration.json "
                "'ranges'); other architectures and library versions may lie outside")


def cudnn_term(reserved_peak_bytes: int) -> Term:
    """The cuDNN term of a trace that runs cuDNN convolutions and reserves ``reserved_peak_bytes`` at its peak."""
    low = CUDNN_KERNELS_LOW_BYTES + int(min(0.0, CUDNN_SHARE_LOW) * reserved_peak_bytes)
    high = CUDNN_KERNELS_HIGH_BYTES + int(max(0.0, CUDNN_SHARE_HIGH) * reserved_peak_bytes)
    return Term("cudnn_bytes", CUDNN_LABEL, CUDNN_BYTES_FITTED, min(low, CUDNN_BYTES_FITTED),
                max(high, CUDNN_BYTES_FITTED),
                f"calibrated: cuDNN's loaded kernels {format_bytes(CUDNN_BYTES_FITTED)} (milabench L40S; "
                f"{format_bytes(CUDNN_KERNELS_LOW_BYTES)} to {format_bytes(CUDNN_KERNELS_HIGH_BYTES)} in the "
                "calibrated groups), and "
                f"{CUDNN_SHARE_LOW:+.1%} to {CUDNN_SHARE_HIGH:+.1%} of the reserved peak for the engine and "
                "workspace cuDNN picks per architecture, TF32 or float32 and cudnn.benchmark (the least and the "
                "most by which milabench's L40S and A100 calibrate rows and xMem's Anova rows that run cuDNN "
                "differ from the estimate; validate/milabench_calibration.json 'ranges')")


def placement_term(reserved_peak_bytes: int) -> Term:
    """The placement term of a capture that runs no cuDNN (a capture that runs cuDNN has it inside cuDNN's)."""
    low = int(min(0.0, PLACEMENT_SHARE_LOW) * reserved_peak_bytes)
    high = int(max(0.0, PLACEMENT_SHARE_HIGH) * reserved_peak_bytes)
    return Term("placement_bytes", PLACEMENT_LABEL, 0, low, high,
                f"calibrated: {PLACEMENT_SHARE_LOW:+.1%} to {PLACEMENT_SHARE_HIGH:+.1%} of the reserved peak, the "
                "least and the most by which milabench's calibrate rows that run no cuDNN (L40S) differ from the "
                "estimate: the driver's segment addresses decide how the caching allocator fragments, and the replay "
                "hands them out in creation order (validate/milabench_calibration.json 'ranges')")


def is_capture(trace: Any) -> bool:
    """Whether ``trace`` is an ``allocsim capture`` (or a trace ``scale`` predicted from captures)."""
    return ((getattr(trace.meta, "version_hints", None) or {}).get("capture")) == "cuda on meta"


def runs_cudnn(trace: Any) -> bool:
    """Whether a capture asked for cuDNN convolution workspaces (its requests name them)."""
    from .torch_capture.cudnn import is_workspace_label

    if not is_capture(trace):
        return False                          # a GPU recording holds its real workspaces
    try:
        names = trace.table("frames")["name"]
    except (KeyError, AttributeError, ValueError):
        return False
    return any(is_workspace_label(str(name)) for name in set(names))


def benchmark_note(trace: Any) -> str | None:
    """The caveat a capture that turned ``cudnn.benchmark`` on carries (None otherwise)."""
    flags = (getattr(trace.meta, "version_hints", None) or {}).get("cudnn_flags") or {}
    if not flags.get("benchmark"):
        return None
    return ("cudnn.benchmark is on: on a GPU cuDNN times several engines and first allocates the largest "
            "workspace among them, which no calibration row ran with, so the high end may be short")


def ends_total(fixed_bytes: int, terms: Sequence[Term], end: str) -> int:
    """``fixed_bytes`` plus every term at ``end`` ("low", "point", "high")."""
    pick = {"low": lambda t: t.low_bytes, "point": lambda t: t.bytes, "high": lambda t: t.high_bytes}[end]
    return int(fixed_bytes + sum(pick(t) for t in terms))


def judge(card_bytes: int, fixed_bytes: int, terms: Sequence[Term], *, fits_low: bool | None = None,
          fits_point: bool | None = None, fits_high: bool | None = None) -> dict[str, Any]:
    """The range verdict: ``verdict`` is "fits", "fits_unless" or "does_not_fit", with the deciding terms.

    ``fixed_bytes`` is what the run needs besides the terms (the reserved peak and any cuBLAS
    workspaces not in it). ``fits_*`` (from replays at each end's capacity, where the allocator
    frees its cache and retries as PyTorch does) override the sums when given.
    """
    totals = {end: ends_total(fixed_bytes, terms, end) for end in ("low", "point", "high")}
    low_ok = totals["low"] <= card_bytes if fits_low is None else fits_low
    high_ok = totals["high"] <= card_bytes if fits_high is None else fits_high
    point_ok = totals["point"] <= card_bytes if fits_point is None else fits_point
    low_ok = low_ok or point_ok or high_ok          # each end fits whenever a larger one does
    point_ok = point_ok or high_ok
    verdict = "fits" if high_ok else "fits_unless" if low_ok else "does_not_fit"
    deciding: list[dict[str, Any]] = []
    if verdict == "fits_unless":
        for t in terms:
            # the most this term may take, the others at their point estimates, for the total to fit
            room = card_bytes - (totals["point"] - t.bytes)
            if t.low_bytes <= room < t.high_bytes:
                deciding.append({"key": t.key, "label": t.label, "at_most_bytes": int(room)})
    return {"verdict": verdict, "total_low_bytes": totals["low"], "total_bytes": totals["point"],
            "total_high_bytes": totals["high"], "fits_low": bool(low_ok), "fits_point": bool(point_ok),
            "fits_high": bool(high_ok), "deciding_terms": deciding}


def verdict_words(judged: dict[str, Any], terms: Sequence[Term]) -> str:
    """``FITS``, ``FITS UNLESS the CUDA context and loaded kernels take more than 612.00 MiB`` or ``DOES NOT FIT``."""
    if judged["verdict"] == "fits":
        return "FITS"
    if judged["verdict"] == "does_not_fit":
        return "DOES NOT FIT"
    deciding = judged["deciding_terms"]
    if deciding:
        return "FITS UNLESS " + " or ".join(f"the {d['label']} take more than {format_bytes(d['at_most_bytes'])}"
                                            for d in deciding)
    names = " and the ".join(t.label for t in terms if t.high_bytes > t.bytes)
    return f"FITS UNLESS the {names} together take more than the card leaves them"


__all__ = ["CONTEXT_LABEL", "CUDNN_LABEL", "PLACEMENT_LABEL", "Term", "benchmark_note", "context_term", "cudnn_term",
           "ends_total", "is_capture", "judge", "placement_term", "runs_cudnn", "verdict_words"]
