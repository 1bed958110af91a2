"""``python -m validate calibrate [--backend cupy|host] [-o FILE]``: measure a device into a cost-model file.

Measures malloc/free latency against size, the device-wide sync, the allocation granularity and
the cost of a pool hit (see ``validate.calibrate``), fits the ``CostModel`` constants and writes
them with ``CostModel.save``; ``allocsim run --cost-model FILE`` and ``python -m validate replay
--cost-model FILE`` read it. Default output: ``calibration-BACKEND.json`` in the current folder (the
repository's tracked ``validate/results/`` only when ``-o`` names it). ``-o`` is checked before the
measurement (``allocsim.output_file``): its folder must exist, and an existing file there is replaced
only if it is a cost model allocsim wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .calibrate import calibrate

#: The output without ``-o``: in the current folder, never inside the repository.
DEFAULT_OUT = "calibration-{backend}.json"


def register(subparsers) -> None:
    """Add the ``calibrate`` subcommand."""
    p = subparsers.add_parser("calibrate", help="measure a device's allocation costs into a cost-model file",
                              description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--backend", choices=("host", "cupy"), default="host", help="device to measure (default host)")
    p.add_argument("-o", "--out", metavar="FILE", help="cost-model JSON to write (default calibration-BACKEND.json "
                                                       "in the current folder; its folder must exist)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds, for tests)")
    p.add_argument("--touch", action="store_true", help="host: populate mappings (match replay --touch)")
    p.add_argument("--device-id", type=int, default=0, help="CUDA device (cupy backend)")
    p.add_argument("--json", action="store_true", help="print the written constants as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from allocsim.output_file import check_output_file
    from allocsim.output_marks import is_cost_model_file

    out = Path(args.out or DEFAULT_OUT.format(backend=args.backend))
    check_output_file(str(out), ours=is_cost_model_file, what="a cost model allocsim wrote")   # before measuring
    log = None if args.json else (lambda m: print(f"validate calibrate: {m}", file=sys.stderr))
    model, provenance = calibrate(args.backend, quick=args.quick, touch=args.touch, device_id=args.device_id,
                                  log=log)
    model.save(out)
    if args.json:
        from allocsim.commands.common import print_json

        print_json({"file": str(out), **model.to_dict(), "_granularity_bytes": provenance["_granularity_bytes"],
                    "_small_granularity_bytes": provenance["_small_granularity_bytes"]})
    else:
        for key, value in model.to_dict().items():
            print(f"{key:24s} {value}")
        print(f"{'granularity':24s} {provenance['_granularity_bytes']} B (small "
              f"{provenance['_small_granularity_bytes']} B)")
        print(f"wrote {out} ({provenance['_seconds']} s)")
    return 0
