"""``allocsim policies``: the policies ``allocsim run --policy`` accepts, with parameters, defaults and units."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import print_json


def register(subparsers) -> None:
    """Add the ``policies`` subcommand."""
    parser = subparsers.add_parser("policies", help="list allocator policies and their parameters",
                                   description="List the allocator policies `allocsim run --policy NAME` "
                                               "accepts, with each parameter's default, unit and meaning "
                                               "(set one with `--set KEY=VALUE`).")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=main)


def type_name(kind: Any) -> str:
    """A parameter type as a short word ("int", "float", "bool", "str", ...)."""
    if kind is None:
        return "any"
    if isinstance(kind, str):
        return kind
    return getattr(kind, "__name__", str(kind))


def spec_dicts() -> list[dict[str, Any]]:
    """Every registered policy as a JSON-ready dict: name, description, params."""
    from ..metrics.summary import jsonable
    from ..policies.registry import policy_specs

    return [{
        "name": spec.name,
        "description": spec.description,
        "params": [{"name": p.name, "default": jsonable(p.default), "unit": p.unit, "type": type_name(p.type),
                    "doc": p.doc} for p in spec.params],
    } for spec in policy_specs()]


def default_text(param: dict[str, Any]) -> str:
    """A default as ``--set`` would take it: ``none`` (not ``None bytes``), ``512 bytes``, ``2MiB``, ``0.92``."""
    value, unit = param["default"], param["unit"]
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if unit == "bytes" and isinstance(value, int):
        for name, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value and value % (1 << shift) == 0:
                return f"{value >> shift}{name}"
        return f"{value} bytes"
    return f"{value} {unit}" if unit and unit not in ("bool", "fraction") else str(value)


def format_specs(specs: list[dict[str, Any]]) -> str:
    """Render ``spec_dicts()`` as indented text."""
    lines = []
    for spec in specs:
        lines.append(f"{spec['name']:<16} {spec['description']}")
        if not spec["params"]:
            lines.append("    (no parameters)")
        for p in spec["params"]:
            lines.append(f"    {p['name']:<30} = {default_text(p)}  ({p['type']}) {p['doc']}".rstrip())
        lines.append("")
    return "\n".join(lines).rstrip()


def main(args: argparse.Namespace) -> int:
    """Print the policy list."""
    try:
        specs = spec_dicts()
    except ImportError as exc:
        print(f"allocsim policies: error: policy registry unavailable: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json({"policies": specs})
    else:
        print(format_specs(specs))
    return 0
