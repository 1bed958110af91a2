"""Framework launchers read as their own code reads them: ``deepspeed`` (``parse_deepspeed``).

``allocsim capture -- deepspeed --num_gpus 8 train.py --deepspeed ds_config.json`` starts no
launcher either: its options are read as DeepSpeed's runner parses them
(deepspeed/launcher/runner.py ``parse_args``, DeepSpeed 0.19: the same names, aliases and
defaults) and each rank gets what DeepSpeed's per-node launcher gives it
(deepspeed/launcher/launch.py ``main``): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_SIZE``,
``CROSS_RANK`` (the node), ``CROSS_SIZE`` (nodes), ``MASTER_ADDR`` (``127.0.0.1`` on one node, as
the runner sets it, else ``--master_addr``), ``MASTER_PORT`` (29500), and the script's arguments
with ``--local_rank=N`` in front of them unless ``--no_local_rank``. The script runs as
``python SCRIPT`` (or ``-m MODULE`` with ``--module``; DeepSpeed adds ``-u``). ``CUDA_VISIBLE_DEVICES`` is not set: a
capture has one GPU per rank whatever it says.

What a CPU capture cannot follow is refused with the reason (``LaunchError``): no ``--num_gpus``
(the runner counts the machine's GPUs), a hostfile or ``--include`` / ``--exclude`` naming other
hosts (give ``--num_nodes N --num_gpus G``: the job is N nodes of G ranks), ``--no_python``,
``--autotuning`` (it runs many jobs).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .launcher import (DEFAULT_MASTER_PORT, MAX_WORLD_SIZE, Launch, LaunchError, _interpreter_of, is_torchrun,
                       parse_torch_launch)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:       # one line, our exception: never exit the process
        raise LaunchError(f"{self.prog}: {message}")


def _deepspeed_parser() -> _Parser:
    """DeepSpeed's runner options (deepspeed/launcher/runner.py ``parse_args``), same names and defaults."""
    p = _Parser(prog="deepspeed", add_help=False)
    p.add_argument("-H", "--hostfile", type=str, default="/job/hostfile")
    p.add_argument("-i", "--include", type=str, default="")
    p.add_argument("-e", "--exclude", type=str, default="")
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=DEFAULT_MASTER_PORT)
    p.add_argument("--master_addr", type=str, default="")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--launcher", type=str, default="pdsh")
    p.add_argument("--launcher_args", type=str, default="")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("--no_ssh_check", action="store_true")
    p.add_argument("--force_multi", action="store_true")
    p.add_argument("--save_pid", action="store_true")
    p.add_argument("--enable_each_rank_log", type=str, default="None")
    p.add_argument("--autotuning", type=str, default="", choices=["tune", "run"])
    p.add_argument("user_script", type=str)
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", type=str, default=None)
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--venv_script", type=str, default=None)
    p.add_argument("--log_level", type=str, default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("-q", "--quiet", action="store_true")
    return p


def _include_slots(text: str) -> int:
    """Ranks on the one node of ``--include localhost:0,1,2`` (DeepSpeed's NODE_SPEC[:SLOT,...])."""
    specs = [s for s in text.split("@") if s]
    if len(specs) != 1:
        raise LaunchError(f"deepspeed: --include {text!r} names several hosts; give --num_nodes N --num_gpus G")
    _host, sep, slots = specs[0].partition(":")
    if not sep:
        raise LaunchError(f"deepspeed: --include {text!r} takes every slot of a host the capture cannot count; "
                          "give --num_gpus G")
    picked = [s for s in slots.split(",") if s.strip()]
    if not picked or not all(s.strip().isdigit() for s in picked):
        raise LaunchError(f"deepspeed: --include {text!r}: slots must be GPU numbers")
    return len(set(picked))


class DeepSpeedLaunch(Launch):
    """A job ``deepspeed`` starts: DeepSpeed's per-rank environment and ``--local_rank=N``."""

    def rank_env(self, rank: int) -> dict[str, str]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a world of {self.world_size}")
        o = self.options
        node, local = divmod(rank, self.nproc_per_node)
        addr = "127.0.0.1" if self.nnodes == 1 else (o["master_addr"] or "127.0.0.1")
        return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(self.world_size),
                "LOCAL_SIZE": str(self.nproc_per_node), "CROSS_RANK": str(node), "CROSS_SIZE": str(self.nnodes),
                "MASTER_ADDR": addr, "MASTER_PORT": str(o["master_port"]),
                # what torchrun would name them: the capture's roles and NCCL's nodes read these
                "LOCAL_WORLD_SIZE": str(self.nproc_per_node), "GROUP_RANK": str(node)}

    def rank_command(self, rank: int) -> list[str]:
        local = rank % self.nproc_per_node
        script = list(self.script)
        head = 2 if script[:1] == ["-m"] else 1
        if not self.options["no_local_rank"]:
            script = script[:head] + [f"--local_rank={local}"] + script[head:]
        return [self.python, *script]


def parse_deepspeed(command: list[str]) -> Launch:
    """The job ``deepspeed OPTIONS SCRIPT ARGS`` starts (``LaunchError`` where a capture cannot follow it)."""
    python, note = _interpreter_of(command[0])
    options = vars(_deepspeed_parser().parse_args(command[1:]))
    if options["autotuning"]:
        raise LaunchError("deepspeed: --autotuning runs many jobs to pick a configuration; capture one "
                          "configuration at a time")
    if options["no_python"]:
        raise LaunchError("deepspeed: --no_python runs a program that is not a Python script; a capture runs "
                          "PyTorch scripts only")
    if options["include"] or options["exclude"]:
        if options["exclude"] or options["num_gpus"] > 0 or options["num_nodes"] > 1:
            raise LaunchError("deepspeed: give --num_nodes N --num_gpus G (or --include localhost:SLOTS) for the "
                              "capture; --exclude needs the machine's devices")
        nproc, nnodes = _include_slots(options["include"]), 1
    else:
        if options["num_gpus"] <= 0:
            raise LaunchError("deepspeed: without --num_gpus DeepSpeed's runner counts the GPUs of the machine the job runs "
                              "on, which a CPU capture cannot see: give the number of ranks per node, e.g. "
                              "--num_gpus 8")
        nproc, nnodes = options["num_gpus"], max(1, options["num_nodes"])
    if nproc * nnodes > MAX_WORLD_SIZE:
        raise LaunchError(f"deepspeed: {nnodes} nodes x {nproc} ranks is more than {MAX_WORLD_SIZE} ranks")
    script = ["-m", options["user_script"]] if options["module"] else [options["user_script"]]
    script += list(options["user_args"])
    notes = [note] if note else []
    if nnodes > 1:
        notes.append(f"--num_nodes {nnodes}: every node's ranks are captured (rank = node x {nproc} + local rank)")
    return DeepSpeedLaunch(list(command), "deepspeed", python, script, nproc, nnodes, options, notes)


def _accelerate(command: list[str]) -> Launch:
    from .hf import parse_accelerate  # noqa: PLC0415  (runs accelerate's own parser in its interpreter)

    return parse_accelerate(command)


def _tune(command: list[str]) -> Launch:
    from .tune_launch import parse_tune  # noqa: PLC0415  (runs torchtune's own parser in its interpreter)

    return parse_tune(command)


#: Console scripts read here, by program name.
PARSERS = {"deepspeed": parse_deepspeed, "accelerate": _accelerate, "tune": _tune}


def other_launcher(command: list[str]) -> Launch | None:
    """The launch of a framework launcher ``command`` names (None: not one of them)."""
    program = os.path.basename(command[0]) if command else ""
    parse = PARSERS.get(program)
    return parse(command) if parse is not None else None


def parse_launch(command: list[str]) -> Launch:
    """The launch ``command`` describes (``LaunchError`` for a launcher a capture cannot follow).

    ``torchrun ...`` and ``python -m torch.distributed.run ...`` as torch reads them, ``deepspeed``,
    ``accelerate launch`` and ``tune run`` as their own code reads them, else a script run by its
    interpreter (``launcher.parse_torch_launch``).
    """
    command = list(command)
    if command and not is_torchrun(command):
        framework = other_launcher(command)
        if framework is not None:
            return framework
    return parse_torch_launch(command)


__all__ = ["DeepSpeedLaunch", "PARSERS", "other_launcher", "parse_deepspeed", "parse_launch"]
