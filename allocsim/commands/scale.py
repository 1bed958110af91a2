"""``allocsim scale TRACE@VALUE TRACE@VALUE ... --to VALUE -o OUT.parquet``: a trace at an unrun scale.

Reads two or more traces of the same program recorded at different values of one scale parameter,
aligns their allocations, fits each allocation's size as a law of the value and writes the trace at
``--to`` (allocsim Parquet, or CSV when OUT ends in .csv). Prints how it was built and the limits of
the prediction (``--json``: one object). Then ``allocsim run OUT --policy pytorch --capacity 80GiB``
says whether it fits.

``--capacity SIZE --find-max`` instead searches the largest value that fits (``scale.findmax``):
with the recorded allocator settings, and with the best setting ``allocsim advise`` finds. Exit
status then: 0 some value fits at both ends of the range, 3 it fits only at the low end, 1 none
does; 2 on a usage or input error. An input that stops before its script's end (an incomplete
capture) makes the output trace incomplete too, the last line say ``INCOMPLETE TRACE`` and the exit
status 4, unless ``--allow-incomplete`` is given.

Inputs that are not one program in one configuration (``scale.consistency``) are refused with one
line (exit 2) unless ``--allow-mixed`` is given; the report then says ``consistent: false`` and
lists the differences.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from fractions import Fraction

from ..errors import AllocsimError
from ..trace import write_trace
from ..units import format_bytes, parse_bytes
from ..metrics.verdict import incomplete_line
from .common import add_incomplete_arg, add_read_args, incomplete_status, print_json, trace_limits

EXIT_NOTHING_FITS = 1
#: With --find-max: the answer fits at the low end of the prediction's range only (as ``run``'s out-of-memory).
EXIT_LOW_END_ONLY = 3


def register(subparsers) -> None:
    """Add the ``scale`` subcommand."""
    parser = subparsers.add_parser(
        "scale", help="predict the trace at a batch size / sequence length nobody has run, or the largest that fits",
        description="Align the allocations of traces recorded at different values of one scale parameter "
                    "(by code site, operator or order within each training step; the start-of-window state by code site "
                    "and size class), fit each allocation's size as a monomial c*v^k of the value, and write the "
                    "trace at --to with the range the inputs leave open; or, with --capacity and --find-max, search "
                    "the largest value that fits. Inputs that are not one program in one configuration are "
                    "refused.",
        epilog="examples:\n"
               "  allocsim scale b1.json.gz@1 b2.json.gz@2 b4.json.gz@4 --to 8 -o b8.parquet\n"
               "  allocsim run b8.parquet --policy pytorch --capacity 80GiB\n"
               "  allocsim scale s128.pickle@128 s256.pickle@256 s512.pickle@512 --name seq \\\n"
               "      --capacity 80GiB --find-max --multiple-of 128\n"
               "refusal: inputs that are not one program in one configuration (autocast or cast ops in some\n"
               "  inputs only, sizes that shrink as the value grows, another driver line or allocator setting,\n"
               "  under 50% of the allocations aligned) are refused with one line naming the difference and\n"
               "  what to record; --allow-mixed predicts anyway (JSON: consistent false, differences).\n"
               "range: sizes are monomials c*v^k (k = 0, 1, 2; batch: 0, 1), fixed by two inputs; what the inputs\n"
               "  leave open (an allocation seen in one input, a size no monomial fits) spans every consistent\n"
               "  law: prediction_range gives peak live and peak reserved, low and high (equal when every law is\n"
               "  determined). allocsim run on the output judges both ends (exit 3 unless both fit).\n"
               "start layout: start-of-window weights sit where the reference run had them; the rest as one\n"
               "  step of a repeating window leaves them (else placed anew); inputs whose start segments nest\n"
               "  (one process ran them in turn) keep the reference's cached segments. Laid out the same way,\n"
               "  each input shows how far that is from its recorded layout: the peak reserved range in the\n"
               "  report is widened by as much (allocsim run judges the ends of the laws only).\n"
               "checked: the largest size of six real GPU series predicted from the smaller ones (ctx 512 or\n"
               "  1024, 2x the largest input): peak live within 0.02%, peak reserved within 3.0%, the recording\n"
               "  inside the range every time (python traces/scale_series.py); further out it is unchecked.\n"
               "exit status: 0 = done (with --find-max: some value fits at both ends of the range),\n"
               "  1 = with --find-max: nothing fits, 3 = with --find-max: the answer fits only at the low end,\n"
               "  4 = an input stops before its script's end (an incomplete capture; the last line says\n"
               "  INCOMPLETE TRACE; --allow-incomplete gives the status above), 2 = usage or input error (a\n"
               "  refused mix of inputs too)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="TRACE@VALUE",
                        help="a trace and the scale value it was recorded at, e.g. bert_b4.json.gz@4 (two or more)")
    parser.add_argument("--to", metavar="VALUE", dest="target", help="the scale value to predict")
    parser.add_argument("--name", choices=("batch", "seq"), default="batch",
                        help="what the value is (default batch): seq allows c*v^2 laws (attention scores), batch only c and c*v")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="output trace (.parquet, .csv, .csv.gz); with --find-max, the trace at the answer")
    parser.add_argument("--device", type=int, metavar="N", help="device to use when the traces have several")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="predict even from inputs that are not one configuration (refused otherwise); the "
                             "report lists the differences")
    add_incomplete_arg(parser)
    add_read_args(parser)
    search = parser.add_argument_group("finding the largest value that fits")
    parser.add_argument("--torch", metavar="VERSION", dest="target_torch",
                        help="the torch the GPU run uses (default: the inputs'); a note says when the inputs "
                             "were made with another release, or with several")
    search.add_argument("--capacity", metavar="SIZE", help="device memory for --find-max, e.g. 80GiB")
    search.add_argument("--gpu", metavar="NAME",
                        help="instead of --capacity: the GPU (see `allocsim gpus`); its memory less the CUDA "
                             "context, libraries and cuBLAS workspaces is the capacity, as for run --gpu")
    search.add_argument("--find-max", action="store_true",
                        help="search the largest value that fits --capacity (whole multiples of --multiple-of)")
    search.add_argument("--multiple-of", type=int, default=1, metavar="N",
                        help="values searched are multiples of N (default 1: every integer)")
    search.add_argument("--max-value", type=int, metavar="N",
                        help="search no further than N (default 1024 times the largest input value)")
    search.add_argument("--policy", default="pytorch", metavar="NAME",
                        help="allocator to replay with its recorded settings (default pytorch)")
    search.add_argument("--no-advise", action="store_true",
                        help="only the recorded settings: skip the search with the best advise setting")
    search.add_argument("--workers", type=int, metavar="N",
                        help="worker processes for the advise runs (default: CPU count; 1 = run here)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=main)


def _check_args(args: argparse.Namespace) -> None:
    if args.gpu is not None and args.capacity is not None:
        raise ValueError("give --gpu or --capacity, not both")
    if args.gpu is not None:
        from ..gpus import find_gpu

        find_gpu(args.gpu)        # an unknown name is refused before any trace is read
    if args.find_max:
        if args.capacity is None and args.gpu is None:
            raise ValueError("--find-max needs --capacity SIZE (or --gpu NAME)")
        if args.target is not None:
            raise ValueError("give either --to VALUE or --find-max, not both")
    else:
        if args.target is None:
            raise ValueError("give --to VALUE (or --capacity SIZE --find-max)")
        if args.output is None:
            raise ValueError("give -o OUT for the trace at --to")
    if args.output is not None:
        from ..output_file import check_trace_output

        check_trace_output(args.output)      # before any input is read


def main(args: argparse.Namespace) -> int:
    """Build (or search), write and report; 2 with one line on stderr on bad input."""
    from ..scale import load_input, parse_spec, parse_value
    from ..scale.build import Scaler
    from ..torch_release import check_target, inputs_check

    try:
        _check_args(args)
        inputs = [load_input(path, value, device=args.device, lenient=args.lenient, limits=trace_limits(args))
                  for path, value in (parse_spec(spec) for spec in args.inputs)]
        scaler = Scaler(inputs, args.name, allow_mixed=args.allow_mixed)
        torch = inputs_check([item.trace.meta for item in inputs], check_target(args.target_torch))
        if args.find_max:
            return incomplete_status("scale", scaler.incomplete, args, _find_max(args, scaler, torch))
        result = scaler.at(parse_value(args.target))
        write_trace(result.trace, args.output)
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim scale: error: {exc}", file=sys.stderr)
        return 2
    reason = scaler.incomplete
    if args.json:
        print_json({"output": args.output, **result.report.to_dict(), "torch": torch, **_incomplete_keys(reason)})
    else:
        print(result.report.format_text())
        if torch["note"]:
            print(f"note: {torch['note']}")
        where = ["--gpu", args.gpu] if args.gpu else ["--capacity", args.capacity or "80GiB"]
        print(f"\nwrote {args.output}; next: "
              + " ".join(shlex.quote(a) for a in ["allocsim", "run", args.output, "--policy", "pytorch", *where]))
        if reason:
            print(incomplete_line(reason, f"the trace at {args.target} is a prediction of a run that stops early "
                                          "too (it says so wherever it is replayed)"))
    return incomplete_status("scale", reason, args, 0)


def _incomplete_keys(reason: str) -> dict:
    """``incomplete`` and its reason for the JSON report, when the inputs stop early."""
    return {"incomplete": True, "incomplete_reason": reason} if reason else {}


def _find_max(args: argparse.Namespace, scaler, torch: dict) -> int:
    from ..scale.findmax import find_max
    from ..sweep.executors import make_executor

    gpu_note = point = None
    if args.gpu is not None:
        from ..gpu_ranges import is_capture, runs_cudnn
        from ..gpus import allocator_capacity, find_gpu, label_note

        from ..trace.inference.workspaces import cublas_workspaces_in_trace

        gpu = find_gpu(args.gpu)
        in_trace = all(cublas_workspaces_in_trace(item.trace.meta) for item in scaler.inputs)
        cudnn = any(runs_cudnn(item.trace) for item in scaler.inputs)
        capture = all(is_capture(item.trace) for item in scaler.inputs)
        # FITS only at the high end of the unknown terms (gpu_ranges): that is the search's capacity;
        # the answer at their point estimate is searched after, with the answer's setting.
        capacity = allocator_capacity(gpu, in_trace, end="high", cudnn=cudnn, capture=capture)
        point = allocator_capacity(gpu, in_trace, end="point", cudnn=cudnn, capture=capture)
        where = ["--gpu", gpu.name]
        gpu_note = label_note(gpu)
    else:
        capacity = parse_bytes(args.capacity, round_down=True)
        where = ["--capacity", args.capacity]
    executor = None if args.no_advise else make_executor(workers=args.workers)
    log = (lambda m: print(f"allocsim scale: {m}", file=sys.stderr)) if sys.stderr.isatty() else (lambda m: None)
    with executor if executor is not None else contextlib.nullcontext():   # one pool for every advise probe
        found = find_max(scaler, capacity, policy=args.policy, multiple=args.multiple_of, max_value=args.max_value,
                         advise=not args.no_advise, executor=executor, log=log)
    best = found.best
    at_point = None
    if point is not None and point != capacity:
        from ..scale.findmax import largest_with_setting

        params = best.at_value.params if best.at_value is not None else None
        value, failing = largest_with_setting(scaler, point, args.policy, params, best.value or args.multiple_of,
                                              args.multiple_of, found.max_value)
        at_point = {"capacity_bytes": point, "value": value, "first_failing": failing,
                    "line": (f"at the point estimate of the unknown terms (capacity {format_bytes(point)}, the "
                             f"search above took their high end, {format_bytes(capacity)}): {found.scale_name} "
                             f"{value} fits with the same setting"
                             + (f", {failing} does not" if failing is not None else ""))}
    result = scaler.at(Fraction(best.value)) if best.value is not None else None
    if result is not None and args.output:
        write_trace(result.trace, args.output)
    if args.json:
        print_json({"output": args.output if result is not None else None, "find_max": found.to_dict(),
                    "report_at_answer": result.report.to_dict() if result is not None else None,
                    "torch": torch, **({"point_estimate": at_point} if at_point is not None else {}),
                    **({"gpu_note": gpu_note} if gpu_note else {}), **_incomplete_keys(scaler.incomplete)})
    else:
        if result is not None:
            print(result.report.format_text())
            print()
        print(found.format_text())
        if at_point is not None:
            print(f"  {at_point['line']}")
        if gpu_note:
            print(f"note: {gpu_note}")
        if torch["note"]:
            print(f"note: {torch['note']}")
        if result is not None and args.output:
            command = ["allocsim", "run", args.output, *best.at_value.run_args, *where]
            print(f"\nwrote {args.output} ({found.scale_name} {best.value}); replay it: "
                  + " ".join(shlex.quote(a) for a in command))
        if scaler.incomplete:
            answer = (f"no {found.scale_name} fits" if best.value is None else
                      f"the largest {found.scale_name} that fits is {best.value}")
            print(incomplete_line(scaler.incomplete, answer))
    if best.value is None:
        return EXIT_NOTHING_FITS
    return 0 if found.fits_both_ends else EXIT_LOW_END_ONLY
