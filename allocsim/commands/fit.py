"""``allocsim fit [--gpu NAME ...] [--values 2,4] [--steps N] [--json] [-o DIR] -- python train.py --batch {B}``.

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
               "range: where the inputs leave sizes open, the answer is searched again at both ends of the laws:\n"
               "  the lower value fits whatever they are, the upper is the most they allow.\n"
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
                             f"{','.join(map(str, DEFAULT_VALUES))})")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"optimizer steps per capture (default {DEFAULT_STEPS}: the first makes the optimizer's "
                             "state, the second runs forward and backward with it; 0: run the script to its end)")
    parser.add_argument("--name", choices=("batch", "seq"), default=None,
                        help="what the value is: seq allows c*v^2 sizes (attention scores), batch does not "
                             "(default: seq when the placeholder's name says seq, len, ctx, context or token)")
    parser.add_argument("--multiple-of", type=int, default=1, metavar="N",
                        help="answer with whole multiples of N (default 1)")
    parser.add_argument("--max-value", type=int, metavar="N",
                        help="search no further than N (default 1024 times the largest value captured)")
    parser.add_argument("--no-advise", action="store_true",
                        help="PyTorch's default allocator settings only: skip the search for a setting that fits more")
    parser.add_argument("--per-gpu", action="store_true",
                        help="capture for every GPU asked, not once per compute-capability class")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop a capture after S seconds (it then fails with exit status 124)")
    parser.add_argument("--workers", type=int, metavar="N",
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
    from ..fit import DEFAULT_VALUES, EXIT_NOTHING_FITS, ScriptFailed, check_command, fit, parse_values
    from ..gpus import find_gpu

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        check_command(command)
        values = parse_values(args.values) if args.values is not None else list(DEFAULT_VALUES)
        for name in args.gpu or []:
            find_gpu(name)
        if args.timeout is not None and not args.timeout > 0:
            raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        if args.max_value is not None and args.max_value < 1:
            raise ValueError(f"--max-value must be >= 1, got {args.max_value}")
        interactive = sys.stderr.isatty()
        from ..fit_ranks import fit_job, is_job

        answer = fit_job if is_job(command) else fit     # a launcher command is answered per role of ranks
        result = answer(command, args.gpu, values=values, steps=args.steps, out_dir=args.output, scale_name=args.name,
                     multiple=args.multiple_of, max_value=args.max_value, advise=not args.no_advise,
                     workers=args.workers, timeout_s=args.timeout, per_gpu=args.per_gpu,
                     allow_incomplete=args.allow_incomplete,
                     target_torch=args.target_torch,
                     log=(lambda m: print(f"allocsim fit: {m}", file=sys.stderr)) if interactive else
                     (lambda m: None))
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
