"""Read the command after ``allocsim capture --`` as Python reads its own: ``split_command(["python", "-u", "train.py"])``.

``python [OPTIONS] SCRIPT ARGS``, ``python [OPTIONS] -m MODULE ARGS`` and ``python [OPTIONS] -c CODE
ARGS`` are taken as the interpreter takes them: its own options (``-u``, ``-O``, ``-X dev``, ``-W
error``, combined as ``-uB``) stay with the interpreter, and what follows is the script. A bare
``train.py ARGS`` runs with this interpreter. The capture child is then
``python [OPTIONS] .../torch_capture/bootstrap.py -- SCRIPT ARGS`` (``bootstrap``).
"""

from __future__ import annotations

import os
import sys

#: Python's options that take no argument (``python --help``); they may be combined (``-uB``).
_FLAGS = frozenset("bBdEhiIOPqsSuvVx")
#: Options whose argument follows, attached (``-Xdev``) or as the next word (``-X dev``).
_WITH_ARGUMENT = ("-X", "-W")
#: The file the child runs (by path, see ``bootstrap``).
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")


def split_command(command: list[str]) -> tuple[str, list[str], list[str]]:
    """``(interpreter, its options, the script and its arguments)``; ValueError for an option Python does not have.

    The script part starts with ``-m MODULE`` or ``-c CODE`` for those forms, and is empty when the
    command names only an interpreter.
    """
    if not command:
        raise ValueError("no command")
    python, rest = command[0], list(command[1:])
    if python.endswith(".py"):           # `-- train.py ARGS`: this interpreter runs it
        return sys.executable, [], list(command)
    options: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("-m", "-c") or arg == "-" or not arg.startswith("-"):
            break
        if arg == "--":                   # python -- script.py: the script follows
            i += 1
            break
        if arg in _WITH_ARGUMENT:
            if i + 1 >= len(rest):
                raise ValueError(f"the interpreter's option {arg} needs a value")
            options += rest[i:i + 2]
            i += 2
            continue
        if arg.startswith(_WITH_ARGUMENT):
            options.append(arg)
            i += 1
            continue
        letters = arg[1:]
        if arg.startswith("--") or not letters:
            raise ValueError(f"the interpreter's option {arg!r} is not one allocsim capture passes on; "
                             "give the script after the interpreter (python train.py ARGS)")
        if letters[-1] in "cm" and all(ch in _FLAGS for ch in letters[:-1]):   # -uc CODE, -Om MODULE
            if letters[:-1]:
                options.append("-" + letters[:-1])
            return python, options, ["-" + letters[-1], *rest[i + 1:]]
        if not all(ch in _FLAGS for ch in letters):
            raise ValueError(f"{arg!r} is not an option of the Python interpreter")
        options.append(arg)
        i += 1
    return python, options, rest[i:]


def script_of(command: list[str]) -> list[str]:
    """The script and its arguments (``["train.py", ...]``, ``["-m", "pkg.train", ...]`` or ``["-c", CODE, ...]``)."""
    return split_command(command)[2]


def child_command(command: list[str]) -> list[str]:
    """The child's command line: the user's interpreter, with its options, running ``bootstrap.py`` by path."""
    python, options, script = split_command(command)
    return [python, *options, BOOTSTRAP, "--", *script]


def script_problem(script: list[str]) -> str:
    """Why ``script`` (``script_of``'s answer) cannot run, in one line; "" when it can."""
    if not script:
        return "give the script after the interpreter, e.g. allocsim capture -- python train.py"
    first = script[0]
    if first in ("-m", "-c"):
        if len(script) < 2 or not script[1]:
            return f"python {first} needs {'a module name' if first == '-m' else 'the code to run'} after it"
        return ""
    if first == "-":
        return "a script read from standard input (python -) cannot be captured; give its file"
    if os.path.isfile(first) or os.path.isfile(os.path.join(first, "__main__.py")):
        return ""
    where = os.getcwd()
    if os.path.isdir(first):
        return f"no script {first!r}: it is a folder without __main__.py"
    return f"no script {first!r}: no such file (relative names are looked up in {where})"
