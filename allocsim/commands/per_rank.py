"""``run``, ``advise`` and ``report`` of a capture folder: one answer per role of ranks, and the rank that limits the job.

A distributed job's capture (``allocsim capture -o DIR -- torchrun ...``) holds one trace per role
(``allocsim.capture_folder``). Each command replays every role's trace exactly as it replays a
single trace (its own code, the same options) and adds what only a job has: which role runs out
first. The **limiting role** is the one a simulated out-of-memory stops, else the one that needs
the most memory (the predicted total with ``--gpu``, else the reserved peak); its lowest rank is the
**limiting rank**. Every rank of a job gets the same allocator setting, so ``advise`` searches the
limiting role and replays the settings it finds on every other role until one fits them all.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

from ..capture_folder import CaptureFolder, open_capture_folder
from ..nccl_estimate import add_nccl_term, nccl_text
from ..units import format_bytes

#: Schema of ``run -o OUT_DIR``'s ``ranks.json`` for a capture folder.
RANKS_SCHEMA = "allocsim-run-ranks/1"


def _role_args(args: argparse.Namespace, folder: CaptureFolder, role: Any) -> argparse.Namespace:
    role_args = copy.copy(args)
    role_args.trace = folder.trace_path(role)
    return role_args


def _needs(summary: dict[str, Any]) -> tuple[bool, int]:
    """Sort key of a role's run: (ran out, bytes it needs), largest first."""
    verdict = summary.get("verdict") or {}
    estimate = summary.get("gpu_estimate") or {}
    out = verdict.get("fits") is False or estimate.get("fits") is False
    need = int(estimate.get("total_bytes") or summary.get("peak_reserved_bytes") or 0)
    return out, need


def _gpu_of(args: argparse.Namespace) -> Any:
    from ..gpus import find_gpu

    name = getattr(args, "gpu", None)
    return find_gpu(name) if name is not None else None


def limiting(entries: list[dict[str, Any]]) -> int:
    """Index of the limiting role among ``entries`` (each with its run's ``summary``)."""
    return max(range(len(entries)), key=lambda i: (*_needs(entries[i]["summary"]), -i))


def _role_line(entry: dict[str, Any]) -> str:
    s = entry["summary"]
    estimate = s.get("gpu_estimate") or {}
    verdict = s.get("verdict") or {}
    parts = [f"peak allocated {format_bytes(int(s.get('peak_allocated_bytes') or 0))}",
             f"peak reserved {format_bytes(int(s.get('peak_reserved_bytes') or 0))}"]
    if estimate:
        nccl = nccl_text(estimate)
        parts.append(f"predicted total {format_bytes(int(estimate.get('total_bytes') or 0))}"
                     + (f" with {nccl}" if nccl else ""))
        word = "FITS" if estimate.get("fits") else "DOES NOT FIT"
    else:
        word = {True: "FITS", False: "OUT OF MEMORY"}.get(verdict.get("fits"), "no capacity to check")
    n = len(entry["ranks"])
    return (f"  ranks {entry['ranks_text']} ({n} rank{'s' if n != 1 else ''}, {entry['trace']}): "
            f"{', '.join(parts)}: {word}")


def _categories_line(entry: dict[str, Any]) -> str | None:
    from ..metrics.categories import format_split

    categories = entry["summary"].get("categories")
    if not categories:
        return None
    m = categories["moments"]
    return f"    by category at the peak of requested memory: {format_split(categories['at_peak'], m['at_peak']['bytes'])}"


def run_folder(args: argparse.Namespace, execute: Any, check_args: Any, exit_oom: int) -> int:
    """``allocsim run DIR``: every role replayed, one line each, the limiting rank's verdict last.

    ``execute(args)`` replays one trace as ``run`` does; ``check_args(args)`` refuses bad options first
    (both ``run``'s own, passed in so that this module does not import ``run``).
    """
    from ..errors import AllocsimError
    from ..output_file import check_output_folder
    from .common import incomplete_status, print_json

    try:
        if args.policy is None:
            # a capture folder holds allocsim captures only: they record PyTorch's caching allocator's
            # requests, so its policy is implied, as for one capture (run.default_policy)
            args.policy = "pytorch"
            print("allocsim run: --policy pytorch (the folder holds allocsim captures: PyTorch's caching "
                  "allocator)", file=sys.stderr)
        check_args(args)
        folder = open_capture_folder(args.trace)
        if args.device is not None and args.device != 0:
            raise ValueError("--device: a capture folder's traces each hold one GPU (device 0), one per rank")
        roles = folder.roles
        if args.out_dir:
            from ..result import RESULT_FILES

            check_output_folder(args.out_dir, files=["ranks.json", *(f"rank{r.representative}/" for r in roles)])
            for role in roles:
                check_output_folder(os.path.join(args.out_dir, f"rank{role.representative}"), files=RESULT_FILES)
        entries = []
        gpu = _gpu_of(args)
        for role in roles:
            result = execute(_role_args(args, folder, role))
            if gpu is not None:
                add_nccl_term(result.summary, folder.manifest, role, gpu, getattr(args, "target_torch", None))
            if args.out_dir:
                os.makedirs(args.out_dir, exist_ok=True)
                result.save(os.path.join(args.out_dir, f"rank{role.representative}"))
            entries.append({"role": role.index, "ranks": role.ranks, "ranks_text": role.to_dict()["ranks_text"],
                            "rank": role.representative, "trace": role.trace,
                            "summary": result.to_dict(include_perf=False)})
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim run: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"allocsim run: error: policy registry unavailable: {exc}", file=sys.stderr)
        return 2
    index = limiting(entries)
    limit = entries[index]
    verdict = limit["summary"].get("verdict") or {}
    any_out = any(_needs(e["summary"])[0] for e in entries)
    data = {"capture_folder": folder.path, "world_size": folder.manifest.world_size,
            "ranks": [{"role": e["role"], "ranks": e["ranks"], "ranks_text": e["ranks_text"], "trace": e["trace"],
                       "peak_allocated_bytes": e["summary"].get("peak_allocated_bytes"),
                       "peak_reserved_bytes": e["summary"].get("peak_reserved_bytes"),
                       "peak_requested_bytes": e["summary"].get("peak_requested_bytes"),
                       "gpu_estimate": e["summary"].get("gpu_estimate"), "verdict": e["summary"].get("verdict"),
                       "categories": (e["summary"].get("categories") or {}).get("at_peak"),
                       "summary": e["summary"]} for e in entries],
            "limiting_rank": limit["rank"], "limiting_role": limit["role"], "fits": not any_out,
            "verdict": verdict}
    if args.out_dir:
        from ..output_marks import write_json

        write_json({k: v for k, v in data.items()}, os.path.join(args.out_dir, "ranks.json"), RANKS_SCHEMA)
    if args.json:
        print_json(data)
    else:
        n_roles = len(entries)
        print(f"allocsim run {folder.path}: a world of {folder.manifest.world_size} ranks in {n_roles} "
              f"role{'s' if n_roles != 1 else ''} (captured for {folder.manifest.gpu or '?'}), policy {args.policy}")
        for e in entries:
            print(_role_line(e))
            line = _categories_line(e)
            if line:
                print(line)
        print(f"limiting rank {limit['rank']} (ranks {limit['ranks_text']}): {verdict.get('line', '')}")
    reasons = [f"ranks {e['ranks_text']}: {e['summary']['incomplete_reason']}" for e in entries
               if e["summary"].get("incomplete_reason")]
    return incomplete_status("run", "; ".join(reasons), args, exit_oom if any_out else 0)


def advise_folder(args: argparse.Namespace, command_args: tuple[str, ...], exit_none_fits: int) -> int:
    """``allocsim advise DIR``: the limiting role searched, its settings replayed on every role until one fits all.

    ``command_args``: the options advise repeats in the ``allocsim run`` commands it prints.
    """
    from ..advise.advice import advise
    from ..advise.report import advice_to_dict, format_advice
    from ..errors import AllocsimError
    from ..runner import Capacity, simulate_trace
    from ..metrics.verdict import GIVEN
    from ..settings.alloc_conf import parse_alloc_conf
    from ..sweep import executor_from_options
    from ..trace import read_trace
    from .common import print_json, trace_limits
    from .info import site_options

    if getattr(args, "framework", False):
        return framework_advice(args, exit_none_fits)
    try:
        folder = open_capture_folder(args.trace)
        capacity = None
        gpu = None
        if args.capacity is not None:
            from ..units import parse_bytes

            capacity = parse_bytes(args.capacity, round_down=True)
        if args.gpu is not None:
            from ..gpus import find_gpu

            if capacity is not None:
                raise ValueError("give --gpu or --capacity, not both")
            gpu = find_gpu(args.gpu)
        if capacity is None and gpu is None:
            raise ValueError("a capture folder has no recorded capacity: give --gpu NAME or --capacity SIZE")
        site_filter, top_sites = site_options(args)
        traces = {r.index: read_trace(folder.trace_path(r), lenient=args.lenient, limits=trace_limits(args))
                  for r in folder.roles}

        def role_capacity(trace: Any, role: Any = None) -> int:
            if gpu is None:
                return int(capacity)
            from ..gpus import allocator_capacity
            from ..nccl_estimate import role_nccl_bytes
            from ..trace.inference.workspaces import cublas_workspaces_in_trace

            nccl = role_nccl_bytes(folder.manifest, role, gpu) if role is not None else 0
            return allocator_capacity(gpu, cublas_workspaces_in_trace(trace.meta)) - nccl

        def replay(trace: Any, params: dict[str, Any] | None, role: Any = None) -> dict[str, Any]:
            return simulate_trace(trace, "pytorch", params or {}, capacity=Capacity(role_capacity(trace, role), GIVEN),
                                  fast=True).summary

        defaults = [{"summary": replay(traces[r.index], None, r), "role": r} for r in folder.roles]
        index = limiting(defaults)
        limit_role = defaults[index]["role"]
        executor = executor_from_options(args.workers, args.scheduler, args.dask)
        interactive = not args.json and sys.stderr.isatty()
        advice = advise(folder.trace_path(limit_role), policy=args.policy, capacity_bytes=capacity,
                        executor=executor, output=args.output, cost_model=None, fast=args.fast, top=args.top,
                        progress=interactive, log=(lambda m: print(f"allocsim advise: {m}", file=sys.stderr))
                        if interactive else (lambda m: None), command_args=command_args, lenient=args.lenient,
                        limits=trace_limits(args), site_filter=site_filter, top_sites=top_sites, gpu=gpu)
        job_line, checked = None, []
        for rec in advice.recommendations:
            params = parse_alloc_conf(rec.alloc_conf).params if rec.alloc_conf is not None else {}
            fits = {r.index: bool(replay(traces[r.index], params, r)["verdict"]["fits"]) for r in folder.roles}
            checked.append({"line": rec.line, "fits_every_role": all(fits.values()),
                            "fits": {str(k): v for k, v in fits.items()}})
            if all(fits.values()):
                job_line = rec.line
                break
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim advise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("allocsim advise: interrupted", file=sys.stderr)
        return 130
    limit_text = limit_role.to_dict()["ranks_text"]
    if args.json:
        print_json({"capture_folder": folder.path, "limiting_rank": limit_role.representative,
                    "limiting_ranks": limit_role.ranks, "advice": advice_to_dict(advice),
                    "job_setting": job_line, "checked": checked,
                    "ranks": [{"ranks": d["role"].ranks, "trace": d["role"].trace,
                               "defaults_fit": bool((d["summary"].get("verdict") or {}).get("fits")),
                               "peak_reserved_bytes": d["summary"].get("peak_reserved_bytes")} for d in defaults]})
    else:
        print(f"allocsim advise {folder.path}: limiting rank {limit_role.representative} (ranks {limit_text}) "
              "searched; each setting it finds is replayed on every role")
        print(format_advice(advice))
        if job_line is not None:
            print(f"for every rank of the job: {job_line} (fits all {len(folder.roles)} roles)")
        elif advice.recommendations:
            print("no setting that fits the limiting rank fits every role (see --json: checked)")
    return 0 if job_line is not None else exit_none_fits


def framework_advice(args: argparse.Namespace, exit_none_fits: int) -> int:
    """``allocsim advise DIR --framework``: the smallest DeepSpeed / Megatron-LM change that fits (``framework_knobs``)."""
    from ..errors import AllocsimError
    from ..framework_knobs import knob_advice
    from .common import print_json

    try:
        folder = open_capture_folder(args.trace)
        gpu = _gpu_of(args)
        capacity = None
        if args.capacity is not None:
            from ..units import parse_bytes

            if gpu is not None:
                raise ValueError("give --gpu or --capacity, not both")
            capacity = parse_bytes(args.capacity, round_down=True)
        if gpu is None and capacity is None:
            raise ValueError("--framework needs --gpu NAME (or --capacity SIZE)")
        log = (lambda m: print(f"allocsim advise: {m}", file=sys.stderr)) if not args.json else (lambda m: None)
        result = knob_advice(folder, gpu, capacity, log=log)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim advise: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json({"capture_folder": folder.path, **result})
    else:
        for t in result["tried"]:
            need = f", needs {format_bytes(int(t['needs_bytes']))} on rank {t['limiting_rank']}" if "needs_bytes" in t \
                else f" ({t.get('error', '')})"
            print(f"  {t['change']}: {'FITS' if t['fits'] else 'does not fit'}{need}")
        answer = result["answer"]
        if answer is None:
            print("no framework setting tried fits every rank")
        else:
            print(f"smallest change that fits every rank: {answer['change']}; paste: {answer['paste']} "
                  f"(limiting rank {answer['limiting_rank']})")
    return 0 if result["answer"] is not None else exit_none_fits


def report_folder(args: argparse.Namespace, build_report: Any, read_options: list[str]) -> int:
    """``allocsim report DIR -o PAGE.html``: one page per role, ``PAGE.rankR.html``."""
    from ..errors import AllocsimError
    from ..output_file import check_output_file
    from ..output_marks import is_report_page

    try:
        folder = open_capture_folder(args.trace)
        stem, ext = os.path.splitext(args.out)
        pages = [(role, f"{stem}.rank{role.representative}{ext or '.html'}") for role in folder.roles]
        for _role, page in pages:
            check_output_file(page, ours=is_report_page, what="a page allocsim report wrote")
        for role, page in pages:
            html, data = build_report(folder.trace_path(role), args.policy or ["pytorch"], capacity=args.capacity,
                                      device=args.device, sites=args.sites, advise=args.advise,
                                      read_options=read_options)
            with open(page, "w", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(html)
            for run in data["runs"]:
                print(f"ranks {role.to_dict()['ranks_text']}: {run['label']}: {run['verdict']}")
            print(f"wrote {page}")
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim report: error: {exc}", file=sys.stderr)
        return 2
    return 0
