"""Check a scaled prediction against a trace really recorded at the target: ``compare_peaks(pred, truth)``.

Both traces are replayed through the same policy (``pytorch`` by default, no timing) and their peak
live bytes (the lower bound no allocator beats) and peak reserved bytes are compared.
"""

from __future__ import annotations

from typing import Any

from ..engine import run_fast
from ..trace.schema import Trace


def peaks(trace: Trace, policy: str = "pytorch") -> dict[str, int]:
    """Peak live and peak reserved bytes of ``trace`` replayed through ``policy``."""
    summary = run_fast(trace, policy).summary
    return {"peak_live_bytes": int(summary["peak_live_lower_bound_bytes"]),
            "peak_reserved_bytes": int(summary["peak_reserved_bytes"])}


def relative_error(predicted: int, truth: int) -> float:
    """(predicted - truth) / truth; 0 when both are 0."""
    if truth == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - truth) / truth


def compare_peaks(predicted: Trace, truth: Trace, policy: str = "pytorch") -> dict[str, Any]:
    """Peaks of both traces through ``policy`` and the relative errors of the prediction."""
    p, t = peaks(predicted, policy), peaks(truth, policy)
    return {
        "predicted": p, "truth": t,
        "live_error": relative_error(p["peak_live_bytes"], t["peak_live_bytes"]),
        "reserved_error": relative_error(p["peak_reserved_bytes"], t["peak_reserved_bytes"]),
    }
