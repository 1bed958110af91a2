"""The ``allocsim`` command: read a trace, simulate policies, report. Each subcommand is one module."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from .errors import AllocsimError

#: Subcommand modules under ``allocsim.commands``, in the order ``--help`` lists them.
COMMANDS = ("info", "convert", "run", "advise", "policies", "sweep", "winners", "plot", "report", "scale",
            "capture", "fit", "gpus")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="allocsim",
        description="Replay real GPU allocation traces through allocator policies and see the memory they need.",
        epilog="exit status: 0 = success (run: it fits, or no capacity to check), 2 = usage or input error "
               "(one line on stderr), 3 = run: the simulation ran out of memory, 1 = sweep: rows left to finish or "
               "ended in an error / winners: nothing fits / advise: nothing fits or a run ended in an error")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the version and whether the compiled policy kernel is in use, then exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.commands.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: print ``version_line()`` on one line (argparse's own action re-wraps it) and exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``allocsim X.Y.Z (policy kernel: compiled|reference (why); readers: compiled|reference (why))``."""
    from .version import __version__
    from .policies.kernel import describe
    from .trace.reading.compiled import describe as describe_readers

    return f"allocsim {__version__} ({describe()}; {describe_readers()})"


def attach_dash_values(argv: list[str]) -> list[str]:
    """Attach a value that starts with a dash and a digit to its option: ``--capacity -5GiB`` -> ``--capacity=-5GiB``.

    argparse takes ``-5GiB`` for an unknown option and prints the whole usage; attached, the value
    reaches the option's own check, which says in one line what is wrong with it.
    """
    out: list[str] = []
    for token in argv:
        prev = out[-1] if out else ""
        if re.match(r"-[0-9.]", token) and prev.startswith("--") and prev != "--" and "=" not in prev:
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


#: Options that take a device's SIZE (``units.parse_bytes(..., round_down=True)``), by their argparse name.
SIZE_OPTIONS = ("capacity", "request")


def note_rounded_sizes(args: argparse.Namespace) -> None:
    """Say on stderr when a SIZE option is rounded down to whole bytes (``--capacity 11.7GiB``)."""
    from .units import bytes_rounding_note

    for name in SIZE_OPTIONS:
        value = getattr(args, name, None)
        if not isinstance(value, str):
            continue
        try:
            note = bytes_rounding_note(value)
        except ValueError:
            continue                  # not a size: the command refuses it in its own one line
        if note:
            print(f"allocsim {args.command}: note: --{name.replace('_', '-')} {note}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; bad input exits 2 with a one-line message, never a traceback. Everything it
    prints goes through ``terminal.printable``: no text from a trace reaches the terminal raw."""
    from .terminal import escaped_output

    with escaped_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(attach_dash_values(sys.argv[1:] if argv is None else list(argv)))
    note_rounded_sizes(args)
    try:
        return int(args.func(args) or 0)
    except (AllocsimError, ValueError) as exc:
        print(f"allocsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:     # (a simulated OutOfMemory is an AllocsimError: caught above)
        from .trace.reading.headroom import out_of_memory_line

        print(f"allocsim {args.command}: error: {out_of_memory_line(_inputs(args))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def _inputs(args: argparse.Namespace) -> str:
    """The trace files a command was given, for a message (``the input`` when it names none)."""
    files = [getattr(args, "trace", None), *(getattr(args, "traces", None) or []),
             *(getattr(args, "inputs", None) or []), getattr(args, "input", None)]
    files = [f for f in files if isinstance(f, str)]
    return ", ".join(files) if files else "the input"
