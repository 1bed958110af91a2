"""``accelerate launch`` read by accelerate's own code: ``parse_accelerate(command)`` (and ``python -m`` this module).

``accelerate launch [--config_file F] [--num_processes 8] [--use_fsdp ...] train.py ARGS`` starts
torchrun (``multi_gpu_launcher``: FSDP, Megatron-LM and plain multi-GPU) or torchrun with
DeepSpeed's environment (``deepspeed_launcher`` on one machine), after ``_validate_launch_command``
merged the config file's defaults (accelerate/commands/launch.py) and ``prepare_multi_gpu_env`` /
``prepare_deepspeed_cmd_env`` (accelerate/utils/launch.py) turned every option into environment
variables (``ACCELERATE_USE_FSDP``, ``FSDP_SHARDING_STRATEGY``, ``FSDP_OFFLOAD_PARAMS``,
``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ...) that ``Accelerator()``
reads in each rank. Those functions are run here, in the interpreter of the ``accelerate``
program (where accelerate is installed), as this module's ``main``: it prints the torchrun options
and the variables as JSON and starts nothing. allocsim then captures the job as the torchrun job
it is, every rank with those variables.

Refused with the reason: a launch accelerate would not start with torchrun (TPU, SageMaker, CPU
only, a single process without ``--multi_gpu``/FSDP/DeepSpeed is captured as a plain script),
several machines with DeepSpeed's own multi-node launcher (pdsh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

#: Seconds accelerate's own parsing may take (it imports torch).
HELPER_TIMEOUT_S = 180
#: Characters of the helper's answer read (the environment of a launch is small).
MAX_ANSWER_CHARS = 1 << 20


def _launch_options(argv: list[str]) -> dict[str, Any]:
    """What ``accelerate launch ARGV`` would start: torchrun's options and the variables it sets (runs accelerate)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: PLC0415
    from accelerate.utils import launch as launch_utils  # noqa: PLC0415

    parser = launch_command_parser()
    args = parser.parse_args(argv)
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    if getattr(args, "cpu", False) or getattr(args, "tpu", False):
        return {"error": "accelerate launch --cpu / TPU runs no CUDA ranks: capture the script with python"}
    before = dict(os.environ)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        if mp_from_config_flag:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        if args.num_machines > 1 and args.deepspeed_multinode_launcher != "standard":
            return {"error": "accelerate launch with DeepSpeed on several machines starts DeepSpeed's own multi-node "
                             "launcher: use --deepspeed_multinode_launcher standard (torchrun) for the capture"}
        _cmd, env = launch_utils.prepare_deepspeed_cmd_env(args)
        how = "deepspeed"
    elif args.use_fsdp or args.use_megatron_lm or args.multi_gpu:
        env = launch_utils.prepare_multi_gpu_env(args)
        how = "fsdp" if args.use_fsdp else "megatron_lm" if args.use_megatron_lm else "multi_gpu"
    else:
        return {"error": "accelerate launch would run one process (no --multi_gpu, FSDP or DeepSpeed, or "
                         "--num_processes 1): capture it as `python SCRIPT ...`"}
    changed = {k: str(v) for k, v in env.items() if before.get(k) != str(v)}
    nnodes = int(getattr(args, "num_machines", 1) or 1)
    return {"how": how, "env": changed, "nproc_per_node": int(args.num_processes) // max(1, nnodes),
            "nnodes": nnodes, "master_port": int(args.main_process_port or 29500),
            "module": bool(args.module), "no_python": bool(args.no_python),
            "script": str(args.training_script), "script_args": [str(a) for a in args.training_script_args]}


def main(argv: list[str]) -> int:
    """``python -m allocsim.torch_capture.distributed.hf -- ACCELERATE_LAUNCH_ARGS``: the JSON answer on stdout."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        answer = _launch_options(argv)
    except SystemExit as exc:                 # argparse's own refusal
        answer = {"error": f"accelerate launch: bad arguments (exit {exc.code})"}
    except Exception as exc:                  # noqa: BLE001  (accelerate's own error, said in one line)
        answer = {"error": f"accelerate launch: {type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


def parse_accelerate(command: list[str]) -> Any:
    """The job ``accelerate launch ...`` starts, as accelerate's own code computes it (``LaunchError`` when refused)."""
    from .launcher import LaunchError, _interpreter_of, _torchrun, helper_argv  # noqa: PLC0415

    if len(command) < 2 or command[1] != "launch":
        raise LaunchError("accelerate: only `accelerate launch ...` starts a training job")
    python, note = _interpreter_of(command[0])
    try:
        done = subprocess.run(helper_argv(python, __file__, command[2:]),
                              capture_output=True, text=True, timeout=HELPER_TIMEOUT_S, check=False,
                              env={**os.environ, "ACCELERATE_DISABLE_RICH": "1"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"accelerate launch: could not run accelerate's parser with {python}: {exc}") from None
    lines = [line for line in done.stdout[-MAX_ANSWER_CHARS:].splitlines() if line.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LaunchError(f"accelerate launch: accelerate's parser gave no answer ({tail[0][:300]}); is accelerate "
                          f"installed for {python}?") from None
    if not isinstance(answer, dict) or answer.get("error"):
        raise LaunchError(str(answer.get("error") if isinstance(answer, dict) else "accelerate launch: no answer"))
    if answer.get("no_python"):
        raise LaunchError("accelerate launch --no_python runs a program that is not a Python script")
    options = ["--nproc-per-node", str(int(answer["nproc_per_node"])), "--nnodes", str(int(answer["nnodes"])),
               "--master-port", str(int(answer["master_port"]))]
    if answer.get("module"):
        options.append("-m")
    launch = _torchrun(command, python, note, options + [str(answer["script"]), *map(str, answer["script_args"])])
    env = {str(k): str(v) for k, v in (answer.get("env") or {}).items()}
    return AccelerateLaunch(launch.command, "accelerate", launch.python, launch.script, launch.nproc_per_node,
                            launch.nnodes, launch.options, launch.notes + [f"accelerate launch ({answer['how']})"],
                            env)


def _accelerate_launch_class() -> Any:
    from .launcher import Launch  # noqa: PLC0415

    class _AccelerateLaunch(Launch):
        """A torchrun job whose ranks also get the variables ``accelerate launch`` sets."""

        def __init__(self, command, launcher, python, script, nproc_per_node, nnodes, options, notes, env):
            super().__init__(command, launcher, python, script, nproc_per_node, nnodes, options, notes)
            self.accelerate_env = dict(env)

        def rank_env(self, rank: int) -> dict[str, str]:
            return {**self.accelerate_env, **super().rank_env(rank)}

        def to_dict(self) -> dict[str, Any]:
            data = super().to_dict()
            data["environment"] = {k: v for k, v in self.accelerate_env.items()
                                   if k.startswith(("ACCELERATE_", "FSDP_", "MEGATRON_LM_"))}
            return data

    return _AccelerateLaunch


# Built where this module is imported from allocsim's package; run by its path in accelerate's interpreter
# (``launcher.helper_argv``), only ``main`` runs and nothing of allocsim is imported there.
AccelerateLaunch = _accelerate_launch_class() if __package__ else None

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
