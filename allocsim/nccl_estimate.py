"""Add NCCL's own memory to one rank's ``--gpu`` estimate: ``add_nccl_term(summary, manifest, role, gpu)``.

A distributed job's ranks hold NCCL communicators whose buffers live outside the caching allocator
(``allocsim.nccl``, docs/nccl.md). For a capture folder, ``run --gpu`` calls this once per role
after the role's own estimate is made: the role's communicators (those its capture recorded, else
the manifest's, else the rule ``job_from_manifest`` falls back on) are priced with ``nccl_term``
and the estimate gains the term ``nccl_bytes`` (its point, added to ``total_bytes``),
``nccl_low_bytes`` / ``nccl_high_bytes`` (added to the range's ends where the estimate has them:
``total_low_bytes`` / ``total_high_bytes``) and ``sources.nccl_bytes`` (each part with its source).
The interconnect is NVSwitch for the SXM cards NCCL's model knows the NVLinks of, PCIe otherwise.
A single-process trace gets nothing from here.
"""

from __future__ import annotations

from typing import Any

from .units import format_bytes


def interconnect_of(gpu_name: str) -> str:
    """``nvswitch`` for the SXM boards ``allocsim.nccl`` knows the NVLinks of, ``pcie`` for every other card."""
    from .nccl import NVLINKS

    return "nvswitch" if gpu_name in NVLINKS else "pcie"


def role_nccl_term(manifest: Any, role: Any, gpu_name: str,
                   torch_version: str | None = None) -> tuple[int, int, int, list[dict[str, Any]]]:
    """``nccl_term`` of ``role``'s ranks in the job ``manifest`` describes (``NcclInputError`` on a bad manifest);
    ``torch_version``: the GPU run's torch (``run --torch``), whose NCCL release is priced, else the capture's."""
    from .nccl import job_from_manifest_data, nccl_term

    data = manifest.to_dict()
    communicators = getattr(role, "communicators", None)
    if isinstance(communicators, list):
        data["facts"] = {**data.get("facts", {}), "communicators": communicators}
    job = job_from_manifest_data(data, gpu=gpu_name, interconnect=interconnect_of(gpu_name), torch_version=torch_version)
    return nccl_term(job)


def role_nccl_ends(manifest: Any, role: Any, gpu: Any) -> tuple[int, int, int]:
    """NCCL's (low, point, high) bytes for ``role`` on ``gpu`` ((0, 0, 0) when the manifest cannot be priced)."""
    from .nccl import NcclInputError

    try:
        low, point, high, _parts = role_nccl_term(manifest, role, gpu.name)
    except NcclInputError:
        return 0, 0, 0
    return low, point, high


def add_nccl_ends(estimate: dict[str, Any] | None, low: int, point: int, high: int) -> None:
    """``fit``'s estimate at an answer: NCCL's bytes added to each end of its totals (``nccl_*_bytes`` beside)."""
    if not isinstance(estimate, dict):
        return
    estimate.update(nccl_bytes=point, nccl_low_bytes=low, nccl_high_bytes=high)
    for key, add in (("total_low_bytes", low), ("total_bytes", point), ("total_high_bytes", high)):
        if isinstance(estimate.get(key), int):
            estimate[key] += add


def role_nccl_bytes(manifest: Any, role: Any, gpu: Any) -> int:
    """NCCL's point estimate for ``role`` on ``gpu`` (0 when the manifest cannot be priced): what ``fit`` and
    ``advise`` take off the card before the caching allocator's capacity."""
    from .nccl import NcclInputError

    try:
        return role_nccl_term(manifest, role, gpu.name)[1]
    except NcclInputError:
        return 0


#: The label NCCL's term carries in the range verdict (``gpu_ranges.verdict_words``).
NCCL_LABEL = "NCCL communicators' buffers"


def add_nccl_term(summary: dict[str, Any], manifest: Any, role: Any, gpu: Any, torch_version: str | None = None) -> None:
    """Add NCCL's term to ``summary["gpu_estimate"]`` (made by ``run --gpu``) and judge the fit again with it.

    NCCL is one more unknown term with a low, point and high end (``gpu_ranges.Term``): the totals
    gain it, the verdict is judged again over the estimate's terms and NCCL's (``gpu_ranges.judge``;
    a fit the replays at each end refused stays refused), and the verdict line's first words and
    its end say so.
    """
    from .gpu_ranges import Term, judge, verdict_words
    from .nccl import NcclInputError

    estimate = summary.get("gpu_estimate")
    if not isinstance(estimate, dict):
        return
    try:
        low, point, high, parts = role_nccl_term(manifest, role, gpu.name, torch_version)
    except NcclInputError as exc:
        estimate["nccl_bytes"] = 0
        estimate.setdefault("sources", {})["nccl_bytes"] = f"not counted: {exc}"
        return
    estimate["nccl_bytes"] = point
    estimate["nccl_low_bytes"] = low
    estimate["nccl_high_bytes"] = high
    estimate.setdefault("sources", {})["nccl_bytes"] = parts
    card = int(estimate.get("gpu_total_bytes") or 0)
    old_word = None
    if isinstance(estimate.get("unknown_terms"), dict) and "total_low_bytes" in estimate:
        terms = [Term(key, str(t.get("label", key)), int(t["bytes"]), int(t["low_bytes"]), int(t["high_bytes"]),
                      str(t.get("source", ""))) for key, t in estimate["unknown_terms"].items()]
        old_word = verdict_words(estimate, terms)
        nccl = Term("nccl_bytes", NCCL_LABEL, point, low, high,
                    "allocsim.nccl: the communicators this role's capture recorded (docs/nccl.md)")
        fixed = int(estimate["total_bytes"]) - sum(t.bytes for t in terms)
        judged = judge(card, fixed, terms + [nccl])
        for end in ("fits_low", "fits_point", "fits_high"):       # a replay's refusal at an end stands
            judged[end] = bool(judged[end]) and bool(estimate.get(end, True))
        judged["verdict"] = ("fits" if judged["fits_high"] else "fits_unless" if judged["fits_low"]
                             else "does_not_fit")
        estimate.update(judged)
        estimate["unknown_terms"]["nccl_bytes"] = nccl.to_dict()
        estimate["fits"] = judged["verdict"] == "fits"
        new_word = verdict_words(estimate, terms + [nccl])
    else:                                                        # an estimate without ranges: the point only
        estimate["total_bytes"] = int(estimate.get("total_bytes") or 0) + point
        estimate["fits"] = bool(estimate.get("fits")) and estimate["total_bytes"] <= card
        new_word = "FITS" if estimate["fits"] else "DOES NOT FIT"
        old_word = "FITS" if str((summary.get("verdict") or {}).get("line", "")).startswith("FITS") else new_word
    if not estimate["fits"]:
        estimate["fits_proven"] = False
        estimate["caveat"] = None
    verdict = summary.get("verdict")
    if isinstance(verdict, dict) and isinstance(verdict.get("line"), str):
        line = verdict["line"]
        if old_word and line.startswith(old_word):
            line = new_word + line[len(old_word):]
        verdict["line"] = (f"{line.rstrip().rstrip('.')}. NCCL's communicators add {format_bytes(point)} on the card "
                           f"outside the allocator (range {format_bytes(low)} to {format_bytes(high)}, "
                           f"allocsim.nccl): needs {format_bytes(int(estimate['total_bytes']))} in all.")


def nccl_text(estimate: dict[str, Any]) -> str:
    """``NCCL 774.00 MiB`` for a role's line (empty when the estimate has no NCCL term)."""
    if "nccl_low_bytes" not in estimate:
        return ""
    return (f"NCCL {format_bytes(int(estimate['nccl_bytes']))} "
            f"({format_bytes(int(estimate['nccl_low_bytes']))} to {format_bytes(int(estimate['nccl_high_bytes']))})")
