"""Parameter grids: parse ``--grid KEY=V1,V2``, ``--set KEY=VALUE`` and ``--grid-file FILE``, expand to configs.

Start with ``build_configs(policies, grid_items, set_items, grid_file)``: it checks every key
against the policy registry *before anything runs* (an unknown key is a ``ValueError`` naming the
policy and its valid keys), then returns one ``Config`` per point of each policy's cartesian
product, in grid order.

Policies are specs: ``--policy pytorch --policy pytorch:expandable_segments:True`` sweeps both side
by side (after ``pytorch:`` PYTORCH_CUDA_ALLOC_CONF syntax, after any other name ``KEY:VALUE,...``
with allocsim's names); a spec's settings are fixed for that spec only.

Scope: ``--grid`` and ``--set`` keys apply to every swept policy that has the key (the others run
without it, their ``param.<key>`` null); a key no swept policy has is refused. A grid file scopes
keys per policy (a JSON object of policy name -> {key: [values] or value})::

    {"pytorch": {"max_split_size": ["none", "256MiB"], "garbage_collection_threshold": [0, 0.6]},
     "deferred-gc": {"threshold": ["0", "64MiB", "1GiB"]}}

``deferred-gc`` also accepts the parameters of the policy it wraps (``inner``, default ``paddle``).

Values are canonicalised with the registry's own parser (``"256MiB"`` and ``268435456`` are the same
value, so the same row), giving ``Config.params_json``: the canonical JSON that keys a row. A value
the parser rejects, or a point whose policy cannot be built (``max_split_size=10MiB``), stops the
sweep before anything runs, with one line naming the policy, the parameter and the value.
``Config.texts`` renders each value back as ``allocsim run --set`` accepts it (sizes in exact units).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..jsonfile import load_json_file

#: The policy that wraps another one; its ``inner`` parameter names the wrapped policy.
WRAPPER_POLICY = "deferred-gc"
DEFAULT_INNER_POLICY = "paddle"


@dataclass(frozen=True)
class Config:
    """One point of a sweep: a policy and its canonical parameters (grid keys and ``--set`` keys)."""

    policy: str
    #: Canonical values (sizes as ints, None, bools, floats; unparseable values as given).
    params: dict[str, Any] = field(hash=False)
    #: ``json.dumps(params, sort_keys=True, separators=(",", ":"))``: part of the row key.
    params_json: str
    #: Each value as ``allocsim run --set KEY=TEXT`` accepts it, in key order.
    texts: dict[str, str] = field(hash=False)
    #: Position in the expansion (policy order, then grid order): the row order of the results.
    order: int = 0
    #: The ``--policy`` spec this point comes from (``pytorch:expandable_segments:True``), for labels.
    label: str = ""


def canonical_json(params: Mapping[str, Any]) -> str:
    """The canonical JSON text of a params dict (sorted keys, no spaces)."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), allow_nan=False)


# ----------------------------------------------------------------------------- parsing
def split_values(text: str) -> list[str]:
    """Split ``"a,b,[1:2,3:4]"`` at commas outside brackets; values are stripped, empty ones refused."""
    values, depth, current = [], 0, []
    for ch in text:
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            values.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    values.append("".join(current).strip())
    if any(v == "" for v in values):
        raise ValueError(f"empty value in {text!r}")
    return values


def parse_grid_item(item: str) -> tuple[str, list[str]]:
    """``"KEY=V1,V2"`` -> ``("KEY", ["V1", "V2"])``; ``ValueError`` explains a malformed item."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. --grid max_split_size=none,256MiB)")
    if not text.strip():
        raise ValueError(f"--grid {item!r}: no values after '='")
    try:
        return key, split_values(text)
    except ValueError as exc:
        raise ValueError(f"--grid {item!r}: {exc}") from None


def parse_set_item(item: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` -> ``("KEY", "VALUE")`` (one value; commas are part of it)."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE")
    return key, value.strip()


def load_grid_file(path: str | os.PathLike) -> dict[str, dict[str, list[Any]]]:
    """Read a per-policy grid file (see the module docstring); ``ValueError`` names the file and the problem."""
    data = load_json_file(path, f"--grid-file {path}")
    if not isinstance(data, dict) or not data:
        raise ValueError(f"--grid-file {path}: expected a JSON object of policy name -> {{key: [values]}}")
    grids: dict[str, dict[str, list[Any]]] = {}
    for policy, axes in data.items():
        if not isinstance(axes, dict):
            raise ValueError(f"--grid-file {path}: {policy!r} must map to an object of key -> [values]")
        grids[policy] = {}
        for key, values in axes.items():
            values = values if isinstance(values, list) else [values]
            if not values:
                raise ValueError(f"--grid-file {path}: {policy}.{key} has no values")
            grids[policy][str(key)] = values
    return grids


# ----------------------------------------------------------------------------- registry look-ups
def _specs() -> dict[str, Any]:
    from ..policies.registry import policy_specs

    return {spec.name: spec for spec in policy_specs()}


def _param_table(spec: Any) -> dict[str, Any]:
    """Accepted key -> ParamSpec (``x`` and, for sizes, ``x_bytes``)."""
    table = {p.name: p for p in spec.params}
    table.update({p.name + "_bytes": p for p in spec.params if p.unit == "bytes"})
    return table


def _inner_names(values: Iterable[Any]) -> list[str]:
    return [str(v).strip() for v in values if v is not None]


def accepted_keys(policy: str, inner_policies: Iterable[str] = ()) -> dict[str, Any]:
    """Keys ``policy`` accepts (-> ParamSpec); for ``deferred-gc``, plus those of each inner policy."""
    specs = _specs()
    if policy not in specs:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(specs)}")
    table = _param_table(specs[policy])
    if policy == WRAPPER_POLICY:
        for inner in inner_policies or [DEFAULT_INNER_POLICY]:
            if inner in specs and inner != WRAPPER_POLICY:
                for key, spec in _param_table(specs[inner]).items():
                    table.setdefault(key, spec)
    return table


def _param_spec(policy: str, key: str, params: Mapping[str, Any]) -> Any | None:
    """The ParamSpec of ``key`` for ``policy`` with these params (deferred-gc: its own or its inner's)."""
    specs = _specs()
    own = _param_table(specs[policy])
    if key in own:
        return own[key]
    if policy == WRAPPER_POLICY:
        inner = str(params.get("inner", DEFAULT_INNER_POLICY)).strip()
        if inner in specs and inner != WRAPPER_POLICY:
            return _param_table(specs[inner]).get(key)
    return None


# ----------------------------------------------------------------------------- values
_PLAIN = (type(None), bool, int, float, str)


def canonical_value(spec: Any | None, value: Any) -> Any:
    """The registry's reading of ``value`` when it is a plain scalar; otherwise ``value`` as given.

    ``ValueError`` (naming the parameter) when the registry's parser refuses the value.
    """
    if isinstance(value, str):
        value = value.strip()
    if spec is None:
        return value
    from ..policies.registry import parse_param

    try:
        parsed = parse_param(spec, value)
    except TypeError as exc:
        raise ValueError(f"parameter {spec.name}={value!r}: {exc}") from None
    if spec.name == "roundup_power2_divisions":   # parsed into a 16-entry table: keep the user's text
        return None if parsed is None else value
    return parsed if isinstance(parsed, _PLAIN) else value


def _size_text(size_bytes: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return str(size_bytes)


def value_text(spec: Any | None, value: Any) -> str:
    """``value`` as ``--set KEY=TEXT`` would give it (``none``, ``true``, ``256MiB``, ``0.6``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and spec is not None and spec.unit == "bytes":
        return _size_text(value)
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def make_config(policy: str, raw: Mapping[str, Any], order: int = 0, label: str = "") -> Config:
    """Canonicalise ``raw`` (key aliases -> names, values via the registry) into a ``Config``.

    ``ValueError`` names the policy and the parameter when a value does not parse.
    """
    inner_raw = raw.get("inner", DEFAULT_INNER_POLICY)
    context = {"inner": inner_raw.strip() if isinstance(inner_raw, str) else inner_raw}
    params: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    for key, value in raw.items():
        spec = _param_spec(policy, key, context)
        name = spec.name if spec is not None else key
        if name in params:
            raise ValueError(f"policy {policy}: {key!r} and {name!r} name the same parameter; give one")
        try:
            params[name] = canonical_value(spec, value)
        except ValueError as exc:
            raise ValueError(f"policy {label or policy}: {exc}") from None
        specs[name] = spec
    texts = {key: value_text(specs[key], params[key]) for key in params}
    return Config(policy, params, canonical_json(params), texts, order, label or policy)


def check_config(config: Config) -> None:
    """Build the config's policy once (on an unlimited device): ``ValueError`` if it cannot be built.

    Catches what parses but cannot be (``max_split_size=10MiB``: PyTorch refuses splits under 20 MiB,
    ``garbage_collection_threshold=1.5``), so a sweep refuses it before running anything.
    """
    from ..device import SimulatedDevice
    from ..policies.registry import build_policy

    try:
        build_policy(config.policy, device=SimulatedDevice(None), params=dict(config.params))
    except (ValueError, TypeError, KeyError) as exc:
        shown = " ".join(f"{k}={v}" for k, v in config.texts.items()) or "(defaults)"
        raise ValueError(f"policy {config.label or config.policy} with {shown}: {exc}") from None


def set_args(policy: str, params: Mapping[str, Any]) -> list[str]:
    """``["--set", "k=v", ...]`` reproducing ``params`` with ``allocsim run`` (keys sorted)."""
    out: list[str] = []
    for key in sorted(params):
        out += ["--set", f"{key}={value_text(_param_spec(policy, key, params), params[key])}"]
    return out


# ----------------------------------------------------------------------------- expansion
def _check_keys(policy: str, keys: Iterable[str], inner: list[str], where: str) -> None:
    table = accepted_keys(policy, inner)
    unknown = [k for k in keys if k not in table]
    if unknown:
        from ..settings.alloc_conf import setting_hint

        valid = sorted({spec.name for spec in table.values()})
        hints = "".join(f"; {hint}" for hint in map(setting_hint, unknown) if hint)
        raise ValueError(
            f"{where}: policy {policy!r} has no parameter {', '.join(map(repr, unknown))} "
            f"(valid: {', '.join(valid) or 'none'}); scope keys per policy with --grid-file{hints}")


def build_configs(policies: list[str], grid_items: list[str] = (), set_items: list[str] = (),
                  grid_file: str | os.PathLike | None = None) -> list[Config]:
    """Every config of the sweep, in order; ``ValueError`` (before anything runs) for bad keys, values or input.

    Policies: ``policies`` (specs, ``NAME[:SETTINGS]``) in order, or the grid file's when
    ``policies`` is empty. CLI ``--grid`` and ``--set`` keys apply to every policy that has them (a
key none has is refused); grid-file keys
    to every spec of their policy; a spec's settings to that spec. A key given twice for one policy
    is refused. Duplicate points (same policy and canonical params) are kept once. Every point's
    values are parsed and its policy built once here, so a value that cannot work stops the sweep
    before it starts.
    """
    from ..settings.alloc_conf import parse_policy_spec

    cli_axes: dict[str, list[Any]] = {}
    for item in grid_items:
        key, values = parse_grid_item(item)
        if key in cli_axes:
            raise ValueError(f"--grid {key} given twice; list all values in one --grid {key}=V1,V2,...")
        cli_axes[key] = values
    fixed: dict[str, Any] = {}
    for item in set_items:
        key, value = parse_set_item(item)
        if key in fixed or key in cli_axes:
            raise ValueError(f"--set {key}: {key} is already set or on the grid")
        fixed[key] = value
    file_grids = load_grid_file(grid_file) if grid_file else {}
    known = _specs()
    specs = [parse_policy_spec(text) for text in dict.fromkeys(policies)]
    for name in [spec.name for spec in specs] + list(file_grids):
        if name not in known:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
    if not specs:
        specs = [parse_policy_spec(name) for name in file_grids]
    if not specs:
        raise ValueError("nothing to sweep: give --policy NAME (repeatable) or --grid-file FILE")

    configs: list[Config] = []
    seen: set[tuple[str, str]] = set()
    cli_keys = list(cli_axes) + list(fixed)
    used: set[str] = set()
    for spec in specs:
        policy = spec.name
        for key, values in file_grids.get(policy, {}).items():
            if key in cli_axes or key in fixed:
                raise ValueError(f"--grid-file {grid_file}: {policy}.{key} is also given on the command line")
        clash = [k for k in spec.params if k in cli_axes or k in fixed]
        if clash:
            raise ValueError(f"--policy {spec.text}: {', '.join(clash)} is also on the grid or in --set; give it once")
        every = {**cli_axes, **file_grids.get(policy, {})}
        inner = _inner_names(every.get("inner", [spec.params.get("inner", fixed.get("inner"))]
                                       if "inner" in spec.params or "inner" in fixed else []))
        # --grid and --set apply to each listed policy that has the key; the others run without it.
        table = accepted_keys(policy, inner)
        used.update(k for k in cli_keys if k in table)
        axes = {k: v for k, v in cli_axes.items() if k in table}
        axes.update(file_grids.get(policy, {}))
        own = {**{k: v for k, v in fixed.items() if k in table}, **spec.params}
        _check_keys(policy, list(spec.params), inner, f"--policy {spec.text}")
        _check_keys(policy, list(file_grids.get(policy, {})), inner, f"--grid-file {grid_file}")
        keys = list(axes)
        for point in itertools.product(*(axes[k] for k in keys)):
            config = make_config(policy, {**own, **dict(zip(keys, point))}, order=len(configs), label=spec.text)
            if (policy, config.params_json) not in seen:
                check_config(config)
                seen.add((policy, config.params_json))
                configs.append(config)
    unused = [k for k in cli_keys if k not in used]
    if unused:
        if len(specs) == 1:
            _check_keys(specs[0].name, unused, [], "--grid/--set")
        valid = "; ".join(f"{name}: {', '.join(sorted({p.name for p in accepted_keys(name).values()})) or 'none'}"
                          for name in dict.fromkeys(spec.name for spec in specs))
        raise ValueError(f"--grid/--set: no listed policy has parameter {', '.join(map(repr, unused))} "
                         f"(valid: {valid})")
    return configs
