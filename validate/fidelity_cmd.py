"""``python -m validate snapshot FILE [--device N] [--json]``: the pytorch preset vs PyTorch's recorded decisions."""

from __future__ import annotations

import argparse
import json

from allocsim.device import ADDRESS_ORDERS
from allocsim.units import parse_bytes

from .fidelity import check_snapshot, format_report


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``snapshot`` subcommand."""
    parser = subparsers.add_parser(
        "snapshot", help="replay a PyTorch memory snapshot through the pytorch preset and compare "
                         "every allocator decision with the recorded one",
        description="Replay a torch.cuda.memory._dump_snapshot pickle through the pytorch preset from "
                    "the allocator state at the start of the recorded window and compare every "
                    "alloc placement, segment alloc/map and segment free/unmap with the real ones.")
    parser.add_argument("file", help="snapshot pickle (plain or gzip)")
    parser.add_argument("--device", type=int, default=None, help="only this device (default: every device)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--capacity", default=None, metavar="BYTES",
                        help="replay on a device of this capacity (e.g. 22519218176 or 21GiB) instead of "
                             "forcing the inferred OOM-path failures and recorded OOMs")
    parser.add_argument("--own-addresses", action="store_true",
                        help="let the simulated device place the segments the replay makes instead of handing "
                             "it the recorded addresses (how well the address rule predicts the recorded ties)")
    parser.add_argument("--address-order", choices=ADDRESS_ORDERS, default=None,
                        help="with --own-addresses: the device's order (default: the preset's, driver)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the comparison and print it; exit 0 (the report says how well it matched)."""
    capacity = parse_bytes(args.capacity) if args.capacity is not None else None
    report = check_snapshot(args.file, args.device, capacity_bytes=capacity, address_order=args.address_order,
                            recorded_addresses=not args.own_addresses)
    if args.json:
        print(json.dumps(report, default=_plain))
    else:
        print(format_report(report))
    return 0


def _plain(value):
    # numpy scalars and other leftovers
    if hasattr(value, "item"):
        return value.item()
    return str(value)
