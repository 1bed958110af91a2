"""Build the report page of a trace: ``build_report(trace_path, policies, ...)`` returns the HTML text.

Each ``--policy`` is replayed exactly as ``allocsim run TRACE --policy P --fast`` replays it (same
code path, so the verdict line is the one ``run`` prints), with its code sites and categories; a
second replay of each stops at the peak of reserved memory to take the segment map there, with the
allocation in every live block. ``--advise`` adds ``allocsim advise``'s recommendations.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from ..units import parse_bytes
from .data import PolicyRun, report_data


def _run_args(trace_path: str, policy: str, capacity: str | None, device: int | None, sites: int,
              read_options: list[str]) -> argparse.Namespace:
    """The arguments ``allocsim run`` would parse for this policy (``--fast``)."""
    from ..cli import build_parser

    argv = ["run", trace_path, "--policy", policy, "--fast", "--sites", str(sites), *read_options]
    if capacity is not None:
        argv += ["--capacity", capacity]
    if device is not None:
        argv += ["--device", str(device)]
    return build_parser().parse_args(argv)


class _MapObserver:
    """Engine observer: the segment map and the owner of each live block after one event (and at the end)."""

    def __init__(self, target_event: int):
        self.target = target_event
        self.at_target: tuple[Any, dict[int, int]] | None = None
        self.policy = None
        self.last_event = -1

    @staticmethod
    def capture(policy: Any) -> tuple[Any, dict[int, int]]:
        from ..metrics.attribution import segment_table, stack_layers

        top = stack_layers(policy)[0]
        owners = {int(addr): int(aid) for aid, (addr, _req, alloc, _stream) in top.live.items() if alloc}
        return segment_table(policy), owners

    def __call__(self, event_index: int, policy: Any) -> None:
        self.policy, self.last_event = policy, event_index
        if event_index == self.target and self.at_target is None:
            self.at_target = self.capture(policy)


def _maps(trace: Any, name: str, params: dict[str, Any], capacity_bytes: int | None, summary: dict[str, Any]
          ) -> dict[str, tuple[int, Any, dict[int, int]]]:
    """Segment maps of one run: at its peak of reserved memory and at its end (the first OOM, if any)."""
    from ..engine import run_fast
    from ..policies.registry import build_policy
    from ..runner import device_for

    target = int((summary.get("at_peak_reserved") or {}).get("event_index", -1))
    observer = _MapObserver(target)
    policy = build_policy(name, device=device_for(capacity_bytes), params=dict(params or {}),
                          allocator_settings=trace.meta.allocator_settings)
    run_fast(trace, policy, observer=observer)
    out = {}
    if observer.at_target is not None:
        out["peak_reserved"] = (target, *observer.at_target)
    if observer.policy is not None:
        out["end"] = (observer.last_event, *observer.capture(observer.policy))
    return out


def build_report(trace_path: str, policies: list[str], *, capacity: str | None = None, device: int | None = None,
                 sites: int = 10, advise: bool = False, read_options: list[str] | None = None,
                 log: Callable[[str], None] = lambda message: None) -> tuple[str, dict[str, Any]]:
    """(the page's HTML, its data) for ``trace_path`` replayed under each of ``policies``."""
    from ..commands.common import load_trace
    from ..commands.run import execute, format_run, resolve_policy
    from ..engine import select_device
    from ..metrics.categories import categorize
    from ..metrics.sites.rule import SiteFilter, SiteIndex
    from ..runner import resolve_capacity
    from .page import render

    read_options = list(read_options or [])
    first = _run_args(trace_path, policies[0], capacity, device, sites, read_options)
    trace = select_device(load_trace(first), device)
    from ..metrics.state import is_state_only

    if is_state_only(trace):
        raise ValueError(f"{trace.meta.source or trace_path} records the final state only, no history to replay: "
                         f"`allocsim run {trace_path} --policy pytorch` reports that state")
    runs = []
    for text in policies:
        args = _run_args(trace_path, text, capacity, device, sites, read_options)
        log(f"replaying {text}")
        result = execute(args, trace)
        name, params = resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf)
        verdict = format_run(result).rpartition("\n")[2]
        cap = resolve_capacity(trace, None if capacity is None else parse_bytes(capacity))
        runs.append(PolicyRun(label=text, result=result, verdict_line=verdict,
                              maps=_maps(trace, name, params, cap.bytes, result.summary)))
    categories = categorize(trace)
    index = SiteIndex(trace, SiteFilter())
    program = index._program
    advice = advice_text = None
    if advise:
        log("searching the allocator's settings (advise)")
        advice, advice_text = _advise(trace_path, policies[0], capacity, device)
    data = report_data(trace, runs, categories, np.asarray(program, dtype=bool), advice, advice_text)
    return render(data), data


def _advise(trace_path: str, policy: str, capacity: str | None, device: int | None) -> tuple[dict, str]:
    """``allocsim advise --fast``'s JSON object and text for the first policy's allocator."""
    from ..advise.advice import advise
    from ..advise.report import advice_to_dict, format_advice
    from ..settings.alloc_conf import parse_policy_spec
    name = parse_policy_spec(policy).name
    advice = advise(trace_path, policy=name if name in ("pytorch", "paddle", "cupy") else "pytorch",
                    capacity_bytes=parse_bytes(capacity) if capacity else None, device=device, fast=True,
                    progress=False, log=lambda message: None)
    return advice_to_dict(advice), format_advice(advice)
