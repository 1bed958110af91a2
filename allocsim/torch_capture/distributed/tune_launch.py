"""``tune run`` read by torchtune's own code: ``parse_tune(command)`` (and ``python -m`` this module).

``tune run [TORCHRUN-OPTIONS] RECIPE --config CONFIG [KEY=VALUE ...]`` (torchtune/_cli/run.py
``Run``) takes torchrun's options (it copies ``torch.distributed.run.get_args_parser``'s actions),
resolves a built-in recipe name to its file under the installed package (``_get_recipe``:
``ROOT / "recipes" / recipe.file_path``) and a built-in config name to its YAML
(``_get_config``), a custom recipe to a module path run with ``-m`` (``_convert_to_dotpath``), and
starts torchrun (``_run_distributed``) or runs the recipe in its own process. Here torchtune's
parser and resolution run in the interpreter of the ``tune`` program (``main``), print the recipe,
its arguments and torchrun's options as JSON and start nothing; allocsim captures the job as the
torchrun job it is (or as a plain script when no torchrun option is given).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

HELPER_TIMEOUT_S = 180
MAX_ANSWER_CHARS = 1 << 20
#: torchrun options passed on as they are (name in torchtune's namespace -> torchrun's flag).
TORCHRUN_OPTIONS = {"nproc_per_node": "--nproc-per-node", "nnodes": "--nnodes", "master_port": "--master-port",
                    "master_addr": "--master-addr", "node_rank": "--node-rank", "rdzv_backend": "--rdzv-backend",
                    "rdzv_endpoint": "--rdzv-endpoint", "rdzv_id": "--rdzv-id"}


def _resolve(argv: list[str]) -> dict[str, Any]:
    """What ``tune run ARGV`` would run: the recipe file or module, its arguments, torchrun's options."""
    from torch.distributed.run import get_args_parser  # noqa: PLC0415
    from torchtune._cli.run import ROOT, Run  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="tune")
    run = Run(parser.add_subparsers(title="subcommands"))
    args = parser.parse_args(["run", *argv])
    try:
        config_index = args.recipe_args.index("--config") + 1
        config_str = args.recipe_args[config_index]
    except (ValueError, IndexError):
        return {"error": "tune run: the '--config' argument is required"}
    recipe = run._get_recipe(args.recipe)
    if recipe is None:
        recipe_path, builtin, distributed_ok = run._convert_to_dotpath(args.recipe), False, True
    else:
        recipe_path, builtin = str(ROOT / "recipes" / recipe.file_path), True
        distributed_ok = recipe.supports_distributed
    config = run._get_config(config_str, recipe)
    recipe_args = list(args.recipe_args)
    recipe_args[config_index] = config_str if config is None else str(ROOT / "recipes" / "configs" / config.file_path)
    defaults = vars(get_args_parser().parse_args(["x"]))
    given = {name: getattr(args, name) for name in TORCHRUN_OPTIONS
             if getattr(args, name, None) not in (None, defaults.get(name))}
    distributed = bool(given)
    if distributed and not distributed_ok:
        return {"error": f"tune run: recipe {args.recipe} does not support distributed training"}
    return {"recipe": recipe_path, "builtin": builtin, "recipe_args": recipe_args,
            "torchrun": {k: str(v) for k, v in given.items()}, "distributed": distributed}


def main(argv: list[str]) -> int:
    """``python -m allocsim.torch_capture.distributed.tune_launch -- TUNE_RUN_ARGS``: the JSON answer on stdout."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        answer = _resolve(argv)
    except SystemExit as exc:
        answer = {"error": f"tune run: bad arguments (exit {exc.code})"}
    except Exception as exc:                  # noqa: BLE001  (torchtune's own error, said in one line)
        answer = {"error": f"tune run: {type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


def parse_tune(command: list[str]) -> Any:
    """The job ``tune run ...`` starts, as torchtune's own code resolves it (``LaunchError`` when refused)."""
    from .launcher import Launch, LaunchError, _interpreter_of, _torchrun, helper_argv  # noqa: PLC0415

    if len(command) < 2 or command[1] != "run":
        raise LaunchError("tune: only `tune run ...` starts a training job")
    python, note = _interpreter_of(command[0])
    try:
        done = subprocess.run(helper_argv(python, __file__, command[2:]),
                              capture_output=True, text=True, timeout=HELPER_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"tune run: could not run torchtune's parser with {python}: {exc}") from None
    lines = [line for line in done.stdout[-MAX_ANSWER_CHARS:].splitlines() if line.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LaunchError(f"tune run: torchtune's parser gave no answer ({tail[0][:300]}); is torchtune installed "
                          f"for {python}?") from None
    if not isinstance(answer, dict) or answer.get("error"):
        raise LaunchError(str(answer.get("error") if isinstance(answer, dict) else "tune run: no answer"))
    script = ([] if answer["builtin"] else ["-m"]) + [str(answer["recipe"])] + [str(a) for a in answer["recipe_args"]]
    if not answer["distributed"]:
        return Launch(list(command), "", python, script, notes=[note] if note else [])
    options: list[str] = []
    for name, flag in TORCHRUN_OPTIONS.items():
        if name in answer["torchrun"]:
            options += [flag, str(answer["torchrun"][name])]
    if answer["torchrun"].get("rdzv_endpoint") is None:
        options.append("--standalone")           # _run_distributed: standalone unless an endpoint is given
    if not answer["builtin"]:
        options.append("-m")
    launch = _torchrun(list(command), python, note, options + script[1 if not answer["builtin"] else 0:])
    launch.launcher = "tune"
    return launch


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
