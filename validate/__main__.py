"""``python -m validate COMMAND``: hold allocsim's predictions against what real allocators did."""

from __future__ import annotations

import argparse
import importlib
import sys

from allocsim.errors import AllocsimError

#: Subcommand -> module under ``validate`` that has ``register(subparsers)``.
COMMANDS = {
    "snapshot": "validate.fidelity_cmd",   # recorded PyTorch decisions vs the pytorch preset
    "replay": "validate.replay_cmd",       # policies on a real device (CuPy or host memory)
    "calibrate": "validate.calibrate_cmd", # measure the device's costs into a cost-model file
    "xmem": "validate.xmem_cmd",           # CPU capture + GPU model vs xMem's published ground truth
    "snapshots": "validate.snapshots_cmd", # CPU captures of public scripts vs the GPU snapshots they wrote
    "milabench": "validate.milabench_cmd", # the GPU's own memory learned and checked on milabench's tables
    "milabench-multigpu": "validate.milabench_multigpu", # milabench's several-GPU rows captured per rank
    "addresses": "validate.addresses_cmd", # where the driver put cudaMalloc segments in real snapshots
    "corpus": "validate.corpus_cmd",       # public training scripts captured unchanged vs their model arithmetic
    "torch-env": "validate.torch_env",     # a small venv with one torch release (for torch-matrix)
    "torch-matrix": "validate.torch_matrix", # the same scripts captured under several torch releases
    "torchtitan": "validate.torchtitan",   # torchtitan's Llama 3.1 benchmark rows captured per rank
}


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="python -m validate", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one validation command; bad input exits 2 with a one-line message (printed as ``allocsim``
    prints: no text from a trace reaches the terminal raw)."""
    from allocsim.terminal import escaped_output

    with escaped_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (AllocsimError, ValueError, OSError) as exc:
        # Every error names the file it is about, even one raised far from the reader.
        source = getattr(args, "file", None) or getattr(args, "trace", None)
        message = str(exc) if not source or str(source) in str(exc) else f"{source}: {exc}"
        print(f"validate {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
