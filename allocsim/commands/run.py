"""``allocsim run TRACE --policy NAME``: replay a trace through one policy and say whether it fits.

By default the run is timed (SimPy engine, ``--cost-model FILE`` or the documented defaults);
``--fast`` skips time for pure memory questions. Memory figures and OOMs always follow the trace's
recorded order of streams, so ``--fast`` and the default agree (see ``allocsim.runner``). A trace
with several devices needs ``--device N``.

Settings: ``--set KEY=VALUE`` (allocsim's names, see ``allocsim policies``), ``--alloc-conf`` /
``--env-alloc-conf`` (PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` syntax) or ``--policy
pytorch:expandable_segments:True``; ``--flags`` / ``--env-flags`` or ``--policy
paddle:FLAGS_allocator_strategy=naive_best_fit`` (Paddle's ``FLAGS_*``, ``allocsim.settings.paddle_flags``). A PyTorch snapshot's recorded ``allocator_settings`` apply to
the ``pytorch`` policy unless a setting overrides them.

A snapshot with a recorded state and no history has nothing to replay: ``run`` then reports the
recorded state instead (``allocsim.metrics.state``; ``--request SIZE`` judges a failed request) and
says how to record a history for what-if replays.

Code sites (``--sites N``, ``--site-filter PATHS``): who holds the memory at the peak of requested
memory and at the first OOM, and who causes the waste at the peak of reserved memory, by the
innermost frame of the program (``allocsim.metrics.sites.report``; JSON ``sites``).

``--gpu NAME``: the card's memory less its own terms; the verdict bets on the high end of what a
CPU run cannot know (``allocsim.gpu_ranges``: FITS, FITS UNLESS <term>, DOES NOT FIT), and a capture
needs no ``--policy`` (pytorch is taken).

Capacity: ``--capacity SIZE``, else the capacity the recording implies (said in the output), else
unlimited. The last line is the verdict. Exit status: 0 when it fits (or no capacity), 3 on a
simulated out-of-memory, 4 when the trace stops before its script's end (``INCOMPLETE TRACE`` in the
verdict; ``--allow-incomplete`` gives the verdict's own status), 2 on a usage or input error (one
line on stderr). A trace predicted by
``allocsim scale`` whose inputs leave sizes open is replayed at both ends of its range too: the
last line then says which ends fit, and exit 3 unless both do. With ``--json`` the
output is one object: the deterministic summary plus ``sim_seconds`` and ``events_per_second``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import AllocsimError
from ..output_file import check_output_folder
from ..units import format_bytes, parse_bytes
from ..metrics.verdict import incomplete_line
from .common import (add_cost_model_args, add_incomplete_arg, add_trace_args, cost_model_from_args,
                     incomplete_status, load_trace, note_picked_device, print_json)
from .info import add_site_args, add_state_args, site_options, state_options

#: Exit status of a run that ran out of memory in the simulation.
EXIT_OOM = 3

EXIT_STATUS_HELP = ("exit status: 0 = fits (or no capacity to check), 3 = the simulation ran out of memory (with "
                    "--gpu: anything but FITS, which needs the unknown terms' high end to fit), 4 = the trace stops "
                    "before the script's end (an incomplete capture; --allow-incomplete: the verdict's status), "
                    "2 = usage or input error")


def register(subparsers) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run", help="replay a trace through one allocator policy: does it fit?",
        description="Replay TRACE through an allocator policy on a simulated device and report requested, "
                    "allocated and reserved memory beside the trace's lower bound, device calls, OOMs and "
                    "(unless --fast) allocation latency, sync stalls and makespan; where the trace records the "
                    "real run, its figures stand beside the simulated ones. The last line is the verdict: FITS, "
                    "OUT OF MEMORY, or no allocator setting can fit.",
        epilog="examples:\n"
               "  allocsim run snapshot.pickle --policy pytorch                 # the recorded run, replayed\n"
               "  allocsim run snapshot.pickle --policy pytorch --capacity 16GiB \\\n"
               "      --alloc-conf expandable_segments:True,max_split_size_mb:256   # what if?\n"
               "  allocsim run trace.json.gz --policy pytorch:expandable_segments:True --capacity 24GiB\n"
               + EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_args(parser)
    parser.add_argument("--policy", default=None, metavar="NAME[:SETTINGS]",
                        help="policy name (see `allocsim policies`); pytorch:SETTINGS takes PYTORCH_CUDA_ALLOC_CONF "
                             "syntax, other policies NAME:KEY:VALUE,...; required, except for a trace `allocsim "
                             "capture` wrote, which records PyTorch's caching allocator (pytorch is then the default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="set a policy parameter (repeatable); sizes take units: --set max_split_size=200MiB")
    conf = parser.add_mutually_exclusive_group()
    conf.add_argument("--alloc-conf", metavar="CONF",
                      help="pytorch settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "
                           "expandable_segments:True,max_split_size_mb:256 (backend:cudaMallocAsync = cuda-async)")
    conf.add_argument("--env-alloc-conf", action="store_true",
                      help="read the settings from the PYTORCH_CUDA_ALLOC_CONF environment variable")
    add_flags_args(conf)
    parser.add_argument("--capacity", metavar="SIZE",
                        help="device memory, e.g. 80GiB (default: what the recording implies, else unlimited)")
    parser.add_argument("--gpu", metavar="NAME",
                        help="the GPU to judge against (see `allocsim gpus`): its memory less the CUDA context, "
                             "libraries and cuBLAS workspaces is the allocator's capacity; the summary gets "
                             "gpu_estimate")
    parser.add_argument("--torch", metavar="VERSION", dest="target_torch",
                        help="the torch the GPU run uses (default: the capture's); with --gpu, the verdict says "
                             "when the trace was made with another release")
    parser.add_argument("--device", type=int, metavar="N", help="device to replay (required if the trace has several)")
    parser.add_argument("--fast", action="store_true", help="no timing: memory results only, much faster")
    parser.add_argument("--continue-on-oom", action="store_true",
                        help="record every failed allocation, skip it and go on (default: stop at the first)")
    add_cost_model_args(parser)
    add_state_args(parser)
    add_site_args(parser)
    add_incomplete_arg(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-o", "--out", metavar="OUT_DIR", dest="out_dir",
                        help="write summary.json, timeseries.parquet and perf.json there")
    parser.set_defaults(func=main)


def _pairs(items: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} {item!r}: expected KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return out


def policy_params(settings: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items as a dict of strings (the registry checks names and converts values).

    A PyTorch setting name (``max_split_size_mb``) is refused here with the allocsim name to use.
    """
    from ..settings.alloc_conf import setting_hint

    params = {}
    for key, value in _pairs(settings, "--set"):
        hint = setting_hint(key, value)
        if hint:
            raise ValueError(f"--set {key}={value}: {hint}")
        params[key] = value
    return params


def find_spec(name: str) -> Any:
    """The registry's ``PolicySpec`` called ``name``; ``ValueError`` listing the names if there is none."""
    from ..policies.registry import policy_specs

    specs = {spec.name: spec for spec in policy_specs()}
    if name not in specs:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(specs)}")
    return specs[name]


def _canonical(key: str) -> str:
    return key[:-len("_bytes")] if key.endswith("_bytes") else key


def merge_settings(*sources: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One params dict from several (where, params) sources; a parameter set by two of them is refused."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, params in sources:
        for key, value in params.items():
            name = _canonical(key)
            if name in origin:
                raise ValueError(f"{name} is set twice ({origin[name]} and {where}); give it once")
            origin[name] = where
            merged[key] = value
    return merged


def add_flags_args(group: Any) -> None:
    """``--flags`` / ``--env-flags``: Paddle's allocator settings in Paddle's words (into a mutually exclusive group)."""
    group.add_argument("--flags", metavar="FLAGS", dest="paddle_flags",
                       help="paddle settings as Paddle's FLAGS, e.g. FLAGS_allocator_strategy=naive_best_fit,"
                            "FLAGS_eager_delete_tensor_gb=1.0 (they select paddle, paddle-naive or deferred-gc)")
    group.add_argument("--env-flags", action="store_true",
                       help="read Paddle's allocator FLAGS_* environment variables")


def paddle_flags(args: argparse.Namespace) -> Any:
    """The ``PaddleFlags`` that ``--flags`` / ``--env-flags`` give, or None."""
    from ..settings.paddle_flags import env_flags, parse_flags

    if getattr(args, "env_flags", False):
        flags = env_flags()
        if flags is None:
            raise ValueError("--env-flags: no allocator FLAGS_* variable is set in the environment")
        return flags
    text = getattr(args, "paddle_flags", None)
    return parse_flags(text) if text is not None else None


def flags_limit_bytes(args: argparse.Namespace) -> int | None:
    """The device cap Paddle's ``FLAGS_gpu_memory_limit_mb`` sets (from --flags, --env-flags or --policy paddle:...)."""
    from ..settings.alloc_conf import parse_policy_spec

    flags = paddle_flags(args)
    limits = [x for x in (flags.limit_bytes if flags else None, parse_policy_spec(args.policy).limit_bytes)
              if x is not None]
    return min(limits) if limits else None


def resolve_policy(policy: str, settings: list[str], alloc_conf: str | None = None,
                   env_alloc_conf: bool = False, flags: Any = None) -> tuple[str, dict[str, Any]]:
    """``--policy``, ``--set``, ``--alloc-conf`` / ``--env-alloc-conf``, ``--flags`` / ``--env-flags``
    (``flags``: their ``PaddleFlags``) -> (policy name, params)."""
    from ..settings.alloc_conf import ENV_VAR, env_alloc_conf as read_env, parse_alloc_conf, parse_policy_spec

    spec = parse_policy_spec(policy)
    find_spec(spec.name)
    sources = [(f"--policy {spec.text}", spec.params)]
    if flags is not None:
        base = spec.name if spec.name != "deferred-gc" else str(spec.params.get("inner", "paddle"))
        if base not in ("paddle", "paddle-naive"):
            raise ValueError(f"--flags sets PaddlePaddle's allocator (policy paddle), not {spec.name}")
        if spec.params:
            raise ValueError("give Paddle's flags once: in --policy paddle:FLAGS... or in --flags, not both")
        spec_name = flags.policy
        return spec_name, merge_settings((f"--flags {flags.text}", flags.params), ("--set", policy_params(settings)))
    conf = None
    if env_alloc_conf:
        conf = read_env()
        if conf is None:
            raise ValueError(f"--env-alloc-conf: {ENV_VAR} is not set in the environment")
        where = ENV_VAR
    elif alloc_conf is not None:
        conf, where = parse_alloc_conf(alloc_conf), "--alloc-conf"
    if conf is not None:
        if spec.name not in ("pytorch", "cuda-async"):
            raise ValueError(f"{where} sets PyTorch's allocator (policy pytorch or cuda-async), not {spec.name}")
        if conf.policy != spec.name:
            chosen = "backend:cudaMallocAsync" if conf.policy == "cuda-async" else "backend:native (the default)"
            raise ValueError(f"{where} {conf.text or '(empty)'} selects the {conf.policy} policy ({chosen}); "
                             f"say --policy {conf.policy}")
        sources.append((where, conf.params))
    sources.append(("--set", policy_params(settings)))
    return spec.name, merge_settings(*sources)


def default_policy(args: argparse.Namespace, trace: Any) -> None:
    """Fill in ``--policy pytorch`` for a capture (and say so on stderr); refuse a missing one otherwise.

    A capture records the requests PyTorch's caching allocator gets, so no other policy is what the
    GPU run would use; any other trace can be replayed under several, so the choice is the user's.
    """
    if args.policy is not None:
        return
    from ..gpu_ranges import is_capture

    if not is_capture(trace):
        raise ValueError("give --policy NAME (allocsim policies lists them): only a trace allocsim capture wrote "
                         "implies one (pytorch)")
    args.policy = "pytorch"
    print("allocsim run: --policy pytorch (the trace is an allocsim capture: PyTorch's caching allocator)",
          file=sys.stderr)
    resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf, paddle_flags(args))


def execute(args: argparse.Namespace, trace: Any = None):
    """Run what ``args`` asks for and return the ``RunResult`` (raises on bad input); ``trace``: already read.

    With ``--sites N`` (N > 0) the summary gets the run's code sites (``sites``) and the verdict's
    first OOM the site of the failed request.
    """
    from ..engine import select_device
    from ..runner import GIVEN, Capacity, check_capacity, resolve_capacity, simulate_trace

    from ..torch_release import check_target

    given = parse_bytes(args.capacity, round_down=True) if args.capacity is not None else None
    gpu = _gpu(args)
    target_torch = check_target(getattr(args, "target_torch", None))
    if gpu is not None and given is not None:
        raise ValueError("give --gpu or --capacity, not both")
    cost_model = cost_model_from_args(args)
    if trace is None:
        trace = load_trace(args)
    default_policy(args, trace)
    name, params = resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf, paddle_flags(args))
    limit = flags_limit_bytes(args)
    site_filter, top = site_options(args) if hasattr(args, "sites") else (None, 0)
    trace = load_trace(args) if trace is None else trace
    note_picked_device("run", trace, args.device)
    trace = select_device(trace, args.device)
    if gpu is not None:
        from ..gpu_ranges import is_capture as captured, runs_cudnn
        from ..gpus import allocator_capacity
        from ..trace.inference.workspaces import cublas_workspaces_in_trace

        given = allocator_capacity(gpu, cublas_workspaces_in_trace(trace.meta), cudnn=runs_cudnn(trace),
                                   capture=captured(trace))
    capacity = resolve_capacity(trace, given)
    if limit is not None and (capacity.bytes is None or limit < capacity.bytes):
        # FLAGS_gpu_memory_limit_mb caps the bytes Paddle cudaMallocs, below whatever the device has.
        capacity = Capacity(limit, GIVEN, f"FLAGS_gpu_memory_limit_mb={limit >> 20}")
    check_capacity(trace, capacity)
    result = simulate_trace(trace, name, params, capacity=capacity, cost_model=cost_model, fast=args.fast,
                            continue_on_oom=args.continue_on_oom)
    if top > 0:   # categories, like code sites, are a report of this one run: --sites 0 skips both
        categories = add_categories(result, trace, site_filter, args.continue_on_oom)
        add_sites(result, trace, name, params, capacity.bytes, cost_model, site_filter, top, args.continue_on_oom,
                  categories)
    if gpu is not None:
        add_gpu_estimate(result, gpu, trace, name, params, target_torch=target_torch)
    mark_incomplete_run(result.summary, trace.meta.incomplete)
    return result


def mark_incomplete_run(summary: dict[str, Any], reason: str) -> None:
    """On a trace that stops early: ``incomplete`` and its reason in the summary, and the verdict line says so."""
    from ..metrics.verdict import mark_incomplete

    if not reason:
        return
    summary["incomplete"] = True
    summary["incomplete_reason"] = reason
    if summary.get("verdict") is not None:
        mark_incomplete(summary["verdict"], reason)


def add_categories(result: Any, trace: Any, site_filter: Any, continue_on_oom: bool) -> Any:
    """Add the run's memory categories (``categories``: bytes per category at the peak and first OOM)."""
    from ..metrics.categories import categorize, run_categories

    categories = categorize(trace, site_filter)
    result.summary["categories"] = run_categories(trace, result, categories, continue_on_oom=continue_on_oom)
    return categories


def _gpu(args: argparse.Namespace) -> Any:
    from ..gpus import find_gpu

    name = getattr(args, "gpu", None)
    return find_gpu(name) if name is not None else None      # `--gpu ''` is refused, never ignored


def gpu_replays(trace: Any, gpu: Any, policy: str, params: dict[str, Any], point_fits: bool,
                in_trace: bool, cudnn: bool, capture: bool = False,
                point_peak_bytes: int | None = None) -> dict[str, Any]:
    """What ``--gpu`` needs beyond the replay at the point capacity: whether the run fits at the low and
    the high end of the unknown terms, and the reserved peak the estimate counts.

    Each end's answer is the replay at that end's ``allocator_capacity`` (the allocator frees its
    cache and retries there as PyTorch does); no replay is made where the peak with no capacity limit
    settles it. The peak counted is the one of the replay that decided the verdict: at the high end's
    capacity for a FITS (``fit`` and ``scale --find-max`` count the same), at the point's for a run
    that fits there, else the peak with no capacity limit (what the run needs, never what it held when
    it ran out of memory).
    """
    from ..gpus import allocator_capacity
    from ..metrics.verdict import GIVEN
    from ..runner import Capacity, simulate_trace

    def replay(capacity: int | None) -> dict[str, Any]:
        cap = Capacity(capacity, GIVEN) if capacity is not None else Capacity(None, None)
        return simulate_trace(trace, policy, params, capacity=cap, fast=True).summary

    unlimited = int(replay(None).get("peak_reserved_bytes") or 0)
    high_capacity = allocator_capacity(gpu, in_trace, end="high", cudnn=cudnn, capture=capture)
    if unlimited <= high_capacity:
        fits_high, high_peak = True, unlimited
    else:
        squeezed = replay(high_capacity) if high_capacity > 0 else None
        fits_high = squeezed is not None and bool(squeezed["verdict"]["fits"])
        high_peak = int(squeezed.get("peak_reserved_bytes") or 0) if fits_high else None
    low_capacity = allocator_capacity(gpu, in_trace, end="low", cudnn=cudnn, capture=capture)
    fits_low = (point_fits or fits_high or unlimited <= low_capacity
                or (low_capacity > 0 and bool(replay(low_capacity)["verdict"]["fits"])))
    if high_peak is not None:
        peak = high_peak
    elif point_fits and point_peak_bytes is not None:
        peak = point_peak_bytes
    else:
        peak = unlimited
    return {"unlimited_peak_reserved_bytes": unlimited, "peak_reserved_bytes": peak, "fits_low": fits_low,
            "fits_high": fits_high}


def add_gpu_estimate(result: Any, gpu: Any, trace: Any = None, policy: str = "pytorch",
                     params: dict[str, Any] | None = None, target_torch: str | None = None) -> None:
    """Put ``gpu_estimate`` in the summary and say the GPU's memory in the verdict line.

    The estimate counts the peak the run reserves with no capacity limit (what it needs) plus the
    card's own terms, each unknown one with its range (``gpu_ranges``); the verdict's first word is
    FITS only when the high end fits, FITS UNLESS <term> between the ends, DOES NOT FIT when even
    the low end does not. Where the trace states the card it was recorded on
    (``meta.device_properties``), the estimate's ``recorded_device`` says whether ``gpu`` is that
    card and whether its total is the recorded one. ``torch`` says which torch made the trace and which
    the GPU run uses (``target_torch``, by default the trace's), with a note in the verdict line where
    they differ (``torch_release``).
    """
    from ..gpu_ranges import benchmark_note, is_capture as captured, runs_cudnn, verdict_words
    from ..gpus import gpu_estimate, recorded_device_check, terms_of
    from ..torch_release import torch_check
    from ..trace.inference.workspaces import cublas_workspaces_in_trace

    summary = result.summary
    in_trace = trace is not None and cublas_workspaces_in_trace(trace.meta)
    cudnn = trace is not None and runs_cudnn(trace)
    capture = trace is not None and captured(trace)
    verdict = summary.get("verdict") or {}
    point_fits = verdict.get("fits") is not False
    if trace is not None:
        ends = gpu_replays(trace, gpu, policy, dict(params or {}), point_fits, in_trace, cudnn, capture,
                           int(summary.get("peak_reserved_bytes") or 0))
    else:
        peak = int(summary.get("peak_reserved_bytes") or 0)
        ends = {"unlimited_peak_reserved_bytes": peak, "peak_reserved_bytes": peak, "fits_low": None,
                "fits_high": None}
    peak = ends["peak_reserved_bytes"]
    estimate = gpu_estimate(gpu, peak, workspaces_in_trace=in_trace, cudnn=cudnn, capture=capture,
                            fits_low=ends["fits_low"],
                            fits_point=point_fits, fits_high=ends["fits_high"])
    devices = trace.devices if trace is not None else []
    recorded = trace.meta.device_properties.get(str(devices[0])) if len(devices) == 1 else None
    estimate["recorded_device"] = None if recorded is None else recorded_device_check(gpu, devices[0], recorded)
    estimate["unlimited_peak_reserved_bytes"] = ends["unlimited_peak_reserved_bytes"]
    summary["gpu_estimate"] = estimate
    word = verdict_words(estimate, terms_of(gpu, peak, cudnn, capture))
    label = "" if gpu.verified else ", label"
    notes = [estimate["caveat"]] if estimate["caveat"] else []
    if estimate["recorded_device"] is not None and not estimate["recorded_device"]["total_matches"]:
        notes.append(estimate["recorded_device"]["note"])
    captured_on = ((trace.meta.version_hints.get("gpu") or {}).get("name") if trace is not None else None)
    if captured_on and captured_on != gpu.name:
        estimate["captured_for"] = captured_on
        notes.append(f"captured for {captured_on}: its kernels' scratch and cuBLAS workspaces are that card's; "
                     f"capture again with --gpu \"{gpu.name}\" for this one's")
    bench = benchmark_note(trace) if cudnn and trace is not None else None
    if bench:
        estimate["cudnn_benchmark_note"] = bench
        notes.append(bench)
    if trace is not None:
        estimate["torch"] = torch_check(trace.meta, target_torch)
        if estimate["torch"]["note"]:
            notes.append(estimate["torch"]["note"])
    caveat = f" ({'; '.join(notes)})" if notes else ""
    terms = terms_of(gpu, peak, cudnn, capture)
    unknown = "".join(f" + {t.text()}" for t in terms)
    # A replay at an end's capacity can complete below the unlimited peak: the allocator frees its cache
    squeezed = (f" (the allocator frees cached blocks to stay within the card: with no limit the run reserves "
                f"{format_bytes(ends['unlimited_peak_reserved_bytes'])})"
                if ends["unlimited_peak_reserved_bytes"] > peak else "")
    verdict["line"] = (f"{word} on {gpu.name} ({format_bytes(gpu.total_bytes)}{label}){caveat}: needs "
                       f"{format_bytes(estimate['total_bytes'])} ({format_bytes(estimate['total_low_bytes'])} to "
                       f"{format_bytes(estimate['total_high_bytes'])}){squeezed} = reserved peak "
                       f"{format_bytes(estimate['reserved_peak_bytes'])}"
                       + (" (cuBLAS workspaces included)" if in_trace else
                          f" + cuBLAS workspaces {format_bytes(estimate['workspace_bytes'])}")
                       + f" + libraries {format_bytes(estimate['library_bytes'])}{unknown}. "
                       + str(verdict.get("line", "")))


def add_sites(result: Any, trace: Any, policy: str, params: dict[str, Any], capacity_bytes: int | None,
              cost_model: Any, site_filter: Any, top: int, continue_on_oom: bool, categories: Any = None) -> None:
    """Add the run's code sites to its summary (``sites``) and name the failed request in its verdict."""
    from ..metrics.sites.report import name_failed_request, run_sites
    from ..policies.registry import build_policy
    from ..runner import device_for, waste_by_site

    def build():
        return build_policy(policy, device=device_for(capacity_bytes, cost_model), params=dict(params or {}),
                            allocator_settings=trace.meta.allocator_settings)

    def waste_at(event_index: int) -> Any:
        return waste_by_site(trace, build, event_index, continue_on_oom=continue_on_oom)

    sites = run_sites(trace, result, waste_at, site_filter=site_filter, top=top, continue_on_oom=continue_on_oom,
                      categories=categories)
    result.summary["sites"] = sites
    name_failed_request(result.summary, sites)


def format_run(result: Any) -> str:
    """The run's report; its memory categories and code sites (if any) just before the verdict line, which stays last."""
    from ..metrics.categories import format_run_categories
    from ..metrics.sites.report import format_sites

    text = result.format_text()
    sites = result.summary.get("sites")
    categories = result.summary.get("categories")
    if not sites and not categories:
        return text
    head, _, verdict = text.rpartition("\n")
    extra = format_run_categories(categories) if categories else []
    return "\n".join([head, *extra, *(format_sites(sites) if sites else []), verdict])


def exit_status(summary: dict[str, Any]) -> int:
    """0 when the run fits or has no capacity, ``EXIT_OOM`` when it ran out of memory; with ``--gpu``,
    0 only when it fits at the high end of the unknown terms (a "FITS UNLESS" is ``EXIT_OOM`` too)."""
    verdict = summary.get("verdict") or {}
    estimate = summary.get("gpu_estimate")
    if estimate is not None:
        return 0 if estimate.get("verdict") == "fits" else EXIT_OOM
    return EXIT_OOM if verdict.get("fits") is False else 0


def state_only(args: argparse.Namespace, trace: Any) -> dict[str, Any]:
    """The recorded-state report of a snapshot without history (nothing to replay); saved with ``-o``."""
    import os

    from ..engine import select_device
    from ..metrics.state import state_report
    from ..output_marks import write_json

    # Every device when none is chosen: a state report has no single replay to run.
    report = state_report(trace if args.device is None else select_device(trace, args.device),
                          **state_options(args))
    report["replayed"] = False
    devices = [int(d) for d in trace.devices]
    report["device"] = args.device if args.device is not None else (devices[0] if len(devices) == 1 else None)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        write_json(report, os.path.join(args.out_dir, "state.json"), report["schema"])
    return report


def print_state(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Print a ``state_only`` report; exit 0 (there is no verdict without a replay)."""
    from ..metrics.state import format_state_report

    if args.json:
        print_json(report)
    else:
        print(format_state_report(report))
        print("nothing replayed: this snapshot records the final state only")
    return 0


def main(args: argparse.Namespace) -> int:
    """Replay, then print the report (text or ``--json``) and optionally save it; see ``exit_status``.

    A snapshot without history gets the recorded-state report instead (``state_only``).
    """
    from ..capture_folder import is_capture_folder_path
    from ..metrics.state import is_state_only

    if is_capture_folder_path(args.trace):
        from .per_rank import run_folder

        def check_args(args: argparse.Namespace) -> None:
            resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf, paddle_flags(args))
            state_options(args)
            site_options(args)

        return run_folder(args, execute, check_args, EXIT_OOM)
    try:
        if args.policy is not None:
            resolve_policy(args.policy, args.settings, args.alloc_conf, args.env_alloc_conf,
                           paddle_flags(args))   # bad input first
        state_options(args)
        site_options(args)
        if args.out_dir:
            from ..result import RESULT_FILES

            check_output_folder(args.out_dir, files=(*RESULT_FILES, "state.json"))
        trace = load_trace(args)
        default_policy(args, trace)
        state = state_only(args, trace) if is_state_only(trace) else None
        result = execute(args, trace) if state is None else None
        ends = _judge_ends(args, trace) if result is not None else None
        if ends is not None:
            result.summary["prediction_range"] = ends
        if args.out_dir and result is not None:
            result.save(args.out_dir)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim run: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:   # the policy registry is missing or broken
        print(f"allocsim run: error: policy registry unavailable: {exc}", file=sys.stderr)
        return 2
    if state is not None:
        return print_state(args, state)
    reason = result.summary.get("incomplete_reason") or ""
    if ends is not None and reason:
        ends["line"] = incomplete_line(reason, ends["line"])
    if args.json:
        print_json(result.to_dict(include_perf=True))
    else:
        print(format_run(result))
        if ends is not None:
            print(ends["line"])
    status = exit_status(result.summary)
    status = EXIT_OOM if status == 0 and ends is not None and ends["fits"] is False else status
    return incomplete_status("run", reason, args, status)


def _judge_ends(args: argparse.Namespace, trace: Any) -> dict[str, Any] | None:
    """A trace predicted by ``allocsim scale`` carries a range: replay both ends (``scale.ranges``)."""
    from ..scale.ranges import judge_ends

    return judge_ends(lambda end: execute(args, end).summary, trace)
