"""``allocsim fit [--gpu NAME ...] [--values 4,8] [--steps N] [--json] [-o DIR] -- python train.py --batch {B}``.

The largest value of the script's ``{B}`` that fits each GPU asked, with the allocator setting that
lets it fit and the predicted total beside the card's memory: the script is captured on the CPU at
two or more small values (``allocsim capture``), the captures are scaled (``allocsim scale``) and the
largest fitting value searched per GPU (``scale --find-max`` with ``advise``); ``allocsim.fit`` has
the steps. Exit status: 0 answered (a GPU where nothing fits is an answer too, unless it is every
GPU asked: 1), 2 usage or input error (one line), and a capture that did not finish passes its own
status on (3 the script raised or exited with an error, 124 ``--timeout``, 130 interrupted) unless
``--allow-incomplete`` is given: then the answers come from the captures as they stopped and each
answer line says ``INCOMPLETE TRACE``.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import AllocsimError
from .common import print_json


def _whole(text: str) -> int:
    """A whole number in ASCII digits (argparse's ``int`` takes ``"²"`` and ``"1_000"``)."""
    if not text.strip().isascii() or not text.strip().lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def register(subparsers) -> None:
    """Add the ``fit`` subcommand."""
    from ..fit import DEFAULT_GPUS, DEFAULT_STEPS, DEFAULT_VALUES

    parser = subparsers.add_parser(
        "fit", help="the largest batch (or any value of the script's {B}) that fits each GPU, and the setting",
        description="Capture a PyTorch training script on the CPU at two or more small values of its one {NAME} "
                    "placeholder, predict its memory at every other value (allocsim scale) and print, for each GPU, "
                    "the largest value that fits, the allocator setting that lets it fit (allocsim advise) and the "
                    "predicted total beside the card's memory.",
        epilog="examples:\n"
               "  allocsim fit -- python train.py --batch {B}\n"
               "  allocsim fit --gpu \"RTX 3060\" --gpu H100 --values 4,8 --steps 3 -o fit-captures -- "
               "python train.py --batch {B}\n"
               "  allocsim fit --name seq --values 256,512 --multiple-of 64 -- python train.py --seq-len {SEQ}\n"
               "  allocsim fit -- ~/envs/train/bin/python train.py --batch {B}   # the training venv's torch\n"
               "torch: the captures run in the interpreter after --, so they follow its torch (2.4 to 2.15):\n"
               "  give your training environment's python; --torch VERSION says the GPU run uses another.\n"
               "captures: one per value for each class of the GPUs asked (compute capability 7.x, 8.x, 9.x and\n"
               "  newer: what the capture reads of the card -- cuBLAS workspace size, attention kernels, bf16 --\n"
               "  follows it); the first card asked of a class is captured for, and the others' answers say what\n"
               "  that capture does not know of them; --per-gpu captures for each card. Captures go to -o DIR\n"
               "  (created if its parent exists) with the script's output beside each, else to a temporary folder\n"
               "  deleted at the end.\n"
               "kernel switches: where two captures disagree (allocations at one value only, sizes that seem to\n"
               "  fall as the value grows: a kernel that changes past some size), fit captures at twice the\n"
               "  largest value (at most two more captures) and fits its laws from the largest ones that agree.\n"
               "range: where the inputs leave sizes open, the answer is searched again at both ends of the laws:\n"
               "  the lower value fits whatever they are, the upper is the most they allow. The answer is the\n"
               "  largest value whose GPU estimate fits; the memory it leaves free is stated (margin).\n"
               "confirm: each answer is then captured for its card's class and replayed with its setting; where\n"
               "  it does not fit (a kernel that switches past the values captured), that capture joins the\n"
               "  inputs and the search runs again below it (two captures per GPU at most); --no-confirm skips it.\n"
               "progress: one line per capture on stderr, with its seconds.\n"
               "exit status: 0 = answered, 1 = nothing fits on any GPU asked, 2 = usage or input error,\n"
               "  3 = a capture's script raised or exited with an error (the message has its error line),\n"
               "  124 = a capture reached --timeout, 130 = interrupted (with --allow-incomplete such captures\n"
               "  are used as they stopped: each answer line says INCOMPLETE TRACE and the status is 0 or 1)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="append", metavar="NAME",
                        help=f"a GPU to answer for (repeatable; allocsim gpus lists them; default: "
                             f"{', '.join(DEFAULT_GPUS)})")
    parser.add_argument("--values", metavar="V1,V2,...",
                        help=f"the values of {{NAME}} to capture, two or more (default "
                             f"{','.join(map(str, DEFAULT_VALUES))}; one or two more at twice the largest where "
                             "they disagree)")
    parser.add_argument("--steps", type=_whole, default=DEFAULT_STEPS, metavar="N",
                        help=f"optimizer steps per capture (default {DEFAULT_STEPS}: the first makes the optimizer's "
                             "state, the second runs forward and backward with it; 0: run the script to its end)")
    parser.add_argument("--name", choices=("batch", "seq"), default=None,
                        help="what the value is: seq allows c*v^2 sizes (attention scores), batch does not "
                             "(default: seq when the placeholder's name says seq, len, ctx, context or token)")
    parser.add_argument("--multiple-of", type=_whole, default=1, metavar="N",
                        help="answer with whole multiples of N (default 1)")
    parser.add_argument("--max-value", type=_whole, metavar="N",
                        help="search no further than N (default 1024 times the largest value captured)")
    parser.add_argument("--no-advise", action="store_true",
                        help="PyTorch's default allocator settings only: skip the search for a setting that fits more")
    parser.add_argument("--no-confirm", action="store_true",
                        help="do not capture each answer to confirm it (one capture per GPU, more when a kernel "
                             "switches past the values captured): faster, and the answers say they are unconfirmed")
    parser.add_argument("--per-gpu", action="store_true",
                        help="capture for every GPU asked, not once per compute-capability class")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop a capture after S seconds (it then fails with exit status 124)")
    parser.add_argument("--workers", type=_whole, metavar="N",
                        help="captures at once and processes for the advise runs (default: CPU count)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="keep the captures and the script's output in DIR (default: a temporary folder, deleted)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="answer from captures whose script stopped before its end (raised, exited with an "
                             "error, --timeout) instead of stopping with the capture's exit status; each answer "
                             "line then says INCOMPLETE TRACE")
    parser.add_argument("--torch", metavar="VERSION", dest="target_torch",
                        help="the torch the GPU run uses, when it is not the one of the interpreter after -- "
                             "(the answer then says the captures follow another release)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PYTHON SCRIPT ARGS",
                        help="the command that runs the script, after --, with one {NAME} placeholder")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Check the input, capture, scale, search and print; see the module doc for the exit status."""
    from ..fit import DEFAULT_VALUES, EXIT_NOTHING_FITS, ScriptFailed, check_command, check_search, fit, parse_values
    from ..gpus import find_gpu

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        # Every argument before the first capture (fit checks them again, and -o, before capturing).
        values = parse_values(args.values) if args.values is not None else list(DEFAULT_VALUES)
        check_command(command, values)
        check_search(values, args.multiple_of, args.max_value)
        for name in args.gpu or []:
            find_gpu(name)
        if args.timeout is not None and not args.timeout > 0:
            raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        if args.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {args.steps}")
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        from ..fit_ranks import fit_job, is_job

        # A launcher command is answered per role of ranks (fit_ranks: no switch handling or confirming
        # captures there yet); progress, one line per capture with its seconds, on stderr.
        extra = {} if is_job(command) else {"confirm": not args.no_confirm}
        answer = fit_job if is_job(command) else fit
        result = answer(command, args.gpu, values=values, steps=args.steps, out_dir=args.output, scale_name=args.name,
                     multiple=args.multiple_of, max_value=args.max_value, advise=not args.no_advise,
                     workers=args.workers, timeout_s=args.timeout, per_gpu=args.per_gpu,
                     allow_incomplete=args.allow_incomplete, target_torch=args.target_torch, **extra,
                     log=lambda m: print(f"allocsim fit: {m}", file=sys.stderr, flush=True))
    except ScriptFailed as exc:
        print(f"allocsim fit: error: {exc}", file=sys.stderr)
        return exc.status
    except (AllocsimError, ValueError, OSError) as exc:
        print(f"allocsim fit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("allocsim fit: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.format_text())
    return 0 if result.any_fits else EXIT_NOTHING_FITS
