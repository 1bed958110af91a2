"""The launcher in front of a script: ``parse_torch_launch(["torchrun", "--nproc-per-node", "8", "train.py"])``.

``allocsim capture -- torchrun ...`` (or ``python -m torch.distributed.run ...``) starts no
launcher: it reads the launcher's options as ``torch.distributed.run`` parses them (its
``get_args_parser`` in torch 2.13: the same names, aliases, defaults and ``PET_*`` environment
variables) and gives each rank the environment torchrun's agent gives it
(``LocalElasticAgent._start_workers`` in torch/distributed/elastic/agent/server/local_elastic_agent.py:
``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``, ``LOCAL_WORLD_SIZE``,
``WORLD_SIZE``, ``GROUP_WORLD_SIZE``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_*``, and ``OMP_NUM_THREADS=1`` when several ranks share a node and it is unset, as
``config_from_args`` in torch/distributed/run.py does). Every node of ``--nnodes N`` is captured;
rank = node rank x ranks per node + local rank, as a static rendezvous numbers them.

Options that only change logging, restarts or the rendezvous are accepted and have no effect on
memory; those a CPU capture cannot follow are refused with the reason (``LaunchError``). This module
needs no torch: it runs in allocsim's process.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from typing import Any

#: ``python -m`` modules that are torchrun.
RUN_MODULES = ("torch.distributed.run",)
#: Launchers named for what they are, with the issue that will take them.
NOT_YET = {"torch.distributed.launch": "torch.distributed.launch (deprecated; use torchrun)"}
#: torchrun's default rendezvous port (``--master-port`` unset).
DEFAULT_MASTER_PORT = 29500
#: Largest world a launcher may describe (nodes x ranks per node).
MAX_WORLD_SIZE = 1 << 20


class LaunchError(ValueError):
    """A launcher command allocsim cannot capture (the message says why, in one line)."""


@dataclasses.dataclass
class Launch:
    """A command that runs the script: the interpreter, the script's argv, and the job's shape."""

    command: list[str]                 # as the user gave it
    launcher: str                      # "torchrun" or "" (the script runs itself, and may start ranks)
    python: str                        # the interpreter that runs the script
    script: list[str]                  # [script.py, args...] or ["-m", module, args...]
    nproc_per_node: int = 1
    nnodes: int = 1
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def child_command(self) -> list[str]:
        """``[python, script, args...]``: what ``torch_capture.session.capture`` runs."""
        return [self.python, *self.script]

    def rank_command(self, rank: int) -> list[str]:
        """What rank ``rank`` runs (the same for every rank under torchrun; DeepSpeed adds ``--local_rank``)."""
        return self.child_command()

    def rank_env(self, rank: int) -> dict[str, str]:
        """The variables torchrun's agent sets for ``rank`` (empty when no launcher starts the ranks)."""
        if not self.launcher:
            return {}
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a world of {self.world_size}")
        o = self.options
        node, local = divmod(rank, self.nproc_per_node)
        static = o["rdzv_backend"] == "static" and not o["standalone"]
        addr, port = str(o["master_addr"]), o["master_port"] or DEFAULT_MASTER_PORT
        if not static and o["rdzv_endpoint"]:
            host, _, maybe_port = str(o["rdzv_endpoint"]).rpartition(":")
            addr, port = (host, maybe_port) if host else (maybe_port, DEFAULT_MASTER_PORT)
        env = {
            "RANK": str(rank), "GROUP_RANK": str(node), "ROLE_RANK": str(rank), "ROLE_NAME": str(o["role"]),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node), "WORLD_SIZE": str(self.world_size),
            "GROUP_WORLD_SIZE": str(self.nnodes), "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": str(o["max_restarts"]),
            "TORCHELASTIC_RUN_ID": "allocsim-capture" if o["standalone"] else str(o["rdzv_id"]),
            "TORCHELASTIC_USE_AGENT_STORE": str(not static),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "LOCAL_RANK": "0" if o["virtual_local_rank"] else str(local),
        }
        if "OMP_NUM_THREADS" not in os.environ and self.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"
        return env

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "launcher": self.launcher or None, "python": self.python,
                "script": self.script, "nproc_per_node": self.nproc_per_node, "nnodes": self.nnodes,
                "world_size": self.world_size if self.launcher else None, "notes": self.notes}


class _Env(argparse.Action):
    """torch.distributed.argparse_util.env: the default comes from ``PET_<NAME>`` when set."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, **kwargs: Any) -> None:
        env_name = f"PET_{dest.upper()}"
        default = os.environ.get(env_name, default)
        super().__init__(dest=dest, default=default, required=required and default is None, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """torch.distributed.argparse_util.check_env: a flag, also set by ``PET_<NAME>`` = 1."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        env_name = f"PET_{dest.upper()}"
        default = bool(int(os.environ.get(env_name, "1" if default else "0")))
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, self.const)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, our exception: never exit the process
        raise LaunchError(f"torchrun: {message}")


def _parser() -> _Parser:
    """torchrun's options (torch/distributed/run.py ``get_args_parser``, torch 2.13), same names and defaults."""
    p = _Parser(prog="torchrun", add_help=False)
    env, flag = _Env, _CheckEnv
    p.add_argument("--nnodes", action=env, type=str, default="1:1")
    p.add_argument("--nproc-per-node", "--nproc_per_node", action=env, type=str, default="1")
    p.add_argument("--rdzv-backend", "--rdzv_backend", action=env, type=str, default="static")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", action=env, type=str, default="")
    p.add_argument("--rdzv-id", "--rdzv_id", action=env, type=str, default="none")
    p.add_argument("--rdzv-conf", "--rdzv_conf", action=env, type=str, default="")
    p.add_argument("--standalone", action=flag)
    p.add_argument("--max-restarts", "--max_restarts", action=env, type=int, default=0)
    p.add_argument("--monitor-interval", "--monitor_interval", action=env, type=float, default=0.1)
    p.add_argument("--start-method", "--start_method", action=env, type=str, default="spawn",
                   choices=["spawn", "fork", "forkserver"])
    p.add_argument("--event-log-handler", "--event_log_handler", action=env, type=str, default="null")
    p.add_argument("--role", action=env, type=str, default="default")
    p.add_argument("-m", "--module", action=flag)
    p.add_argument("--no-python", "--no_python", action=flag)
    p.add_argument("--run-path", "--run_path", action=flag)
    p.add_argument("--log-dir", "--log_dir", action=env, type=str, default=None)
    p.add_argument("-r", "--redirects", action=env, type=str, default="0")
    p.add_argument("-t", "--tee", action=env, type=str, default="0")
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", action=env, type=str, default="")
    p.add_argument("--duplicate-stdout-filters", "--duplicate_stdout_filters", action=env, type=str, default="")
    p.add_argument("--duplicate-stderr-filters", "--duplicate_stderr_filters", action=env, type=str, default="")
    p.add_argument("--node-rank", "--node_rank", type=int, action=env, default=0)
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", type=str, action=env)
    p.add_argument("--master-port", "--master_port", default=None, type=int, action=env)
    p.add_argument("--local-addr", "--local_addr", default=None, type=str, action=env)
    p.add_argument("--logs-specs", "--logs_specs", default=None, type=str)
    p.add_argument("--numa-binding", "--numa_binding", type=str, default=None)
    p.add_argument("--signals-to-handle", "--signals_to_handle", action=env, type=str,
                   default="SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    p.add_argument("--shutdown-timeout", "--shutdown_timeout", action=env, type=int, default=None)
    p.add_argument("--virtual-local-rank", "--virtual_local_rank", action=flag)
    p.add_argument("training_script", type=str)
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _count(text: str, option: str, what: str) -> int:
    text = str(text).strip()
    if text.isdigit() and 0 < int(text) <= MAX_WORLD_SIZE:
        return int(text)
    raise LaunchError(f"torchrun: {option} {text!r}: {what}")


def _nnodes(text: str) -> int:
    low, sep, high = str(text).partition(":")
    if sep and low.strip() != high.strip():
        raise LaunchError(f"torchrun: --nnodes {text!r} is an elastic range; the memory of a rank depends on the "
                          "world it runs in: give the node count the job runs with, e.g. --nnodes "
                          f"{high.strip() or low.strip()}")
    return _count(low, "--nnodes", "give a whole number of nodes")


#: Runs one of allocsim's launcher helpers (``hf.py``, ``tune_launch.py``: standard library at import, then the
#: launcher's own package) by its file path in the launcher's interpreter, which need not have allocsim installed
#: (``python -m allocsim...`` there stops at ``No module named 'allocsim'``); the helper's ``main`` answers.
_HELPER_RUNNER = ("import importlib.util, sys\n"
                  "spec = importlib.util.spec_from_file_location('_allocsim_launch_helper', sys.argv[1])\n"
                  "module = importlib.util.module_from_spec(spec)\n"
                  "sys.modules[spec.name] = module\n"
                  "spec.loader.exec_module(module)\n"
                  "raise SystemExit(module.main(sys.argv[2:]))\n")


def helper_argv(python: str, helper_file: str, args: list[str]) -> list[str]:
    """``python`` running the helper module at ``helper_file`` with ``args``, without importing allocsim there."""
    return [python, "-c", _HELPER_RUNNER, os.path.abspath(helper_file), "--", *args]


def _interpreter_of(program: str) -> tuple[str, str]:
    """The Python a console script such as ``torchrun`` runs under (its ``#!`` line), and a note when guessed."""
    path = shutil.which(program) or program
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable, f"{program!r} was not found; the script runs under {sys.executable}"
    if first.startswith("#!"):
        words = first[2:].split()
        if words and os.path.basename(words[0]) == "env" and len(words) > 1:
            words = words[1:]
        if words and "python" in os.path.basename(words[0]):
            return words[0], ""
    return sys.executable, f"{program!r} names no Python interpreter; the script runs under {sys.executable}"


def _torchrun(command: list[str], python: str, note: str, args: list[str]) -> Launch:
    options = vars(_parser().parse_args(args))
    nproc_text = str(options["nproc_per_node"])
    if nproc_text in ("auto", "gpu", "cuda", "cpu", "xpu"):
        raise LaunchError(f"torchrun: --nproc-per-node {nproc_text} counts the devices of the machine the job runs "
                          "on, which a CPU capture cannot see: give the number of ranks per node, e.g. "
                          "--nproc-per-node 8")
    nproc = _count(nproc_text, "--nproc-per-node", "give a whole number of ranks per node")
    nnodes = _nnodes(options["nnodes"])
    if nproc * nnodes > MAX_WORLD_SIZE:
        raise LaunchError(f"torchrun: {nnodes} nodes x {nproc} ranks is more than {MAX_WORLD_SIZE} ranks")
    if options["no_python"] and not options["run_path"]:
        raise LaunchError("torchrun: --no-python runs a program that is not a Python script; a capture runs "
                          "PyTorch scripts only")
    script = ["-m", options["training_script"]] if options["module"] else [options["training_script"]]
    script += list(options["training_script_args"])
    notes = [note] if note else []
    if nnodes > 1:
        notes.append(f"--nnodes {nnodes}: every node's ranks are captured (rank = node rank x {nproc} + local rank); "
                     f"--node-rank {options['node_rank']} is not used")
    return Launch(list(command), "torchrun", python, script, nproc, nnodes, options, notes)


def is_torchrun(command: list[str]) -> bool:
    """Whether ``command`` starts with the ``torchrun`` program."""
    return bool(command) and os.path.basename(command[0]) in ("torchrun", "torchrun.exe")


def parse_torch_launch(command: list[str]) -> Launch:
    """The launch ``command`` describes when it is torch's own (``LaunchError`` for a launcher a capture cannot follow).

    ``torchrun OPTS SCRIPT ARGS``, ``python -m torch.distributed.run OPTS SCRIPT ARGS``; anything else
    is a script run by its interpreter (``python SCRIPT ARGS``, ``python -m MODULE ARGS``,
    ``SCRIPT.py ARGS``), which may start its own ranks (``torch.multiprocessing.spawn``). Frameworks'
    launchers (DeepSpeed, accelerate, tune) are read by ``launchers.parse_launch``, which falls back here.
    """
    command = list(command)
    if not command:
        raise LaunchError("give the command that runs the script after --")
    program = os.path.basename(command[0])
    if is_torchrun(command):
        python, note = _interpreter_of(command[0])
        return _torchrun(command, python, note, command[1:])
    if program in NOT_YET:
        raise LaunchError(f"{NOT_YET[program]} is not supported by allocsim capture yet; launch the script with "
                          "torchrun")
    if len(command) >= 3 and command[1] == "-m":
        if command[2] in RUN_MODULES:
            return _torchrun(command, command[0], "", command[3:])
        if command[2] in NOT_YET:
            raise LaunchError(f"{NOT_YET[command[2]]} is not supported by allocsim capture; launch the script with "
                              "torchrun")
    if command[0].endswith(".py"):
        return Launch(command, "", sys.executable, command)
    return Launch(command, "", command[0], command[1:])
