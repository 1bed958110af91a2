"""PyTorch's allocator settings in PyTorch's own words: ``parse_alloc_conf("expandable_segments:True")``.

Users already write ``PYTORCH_CUDA_ALLOC_CONF`` strings; this module reads them exactly as PyTorch's
parser does (``c10/core/AllocatorConfig.cpp`` and ``c10/cuda/CUDAAllocatorConfig.cpp``): the text
is split into tokens at ``,`` ``:`` ``[`` ``]`` with whitespace dropped, every item is
``key:value``, booleans are spelled ``True`` / ``False``, ``_mb`` values are whole MiB, and
``roundup_power2_divisions`` takes one power of two or a ``[MB:divisions,...,>:divisions]`` list.
A key given twice keeps its last value, as in PyTorch.

Every key PyTorch knows is either modelled (it maps to a parameter of the ``pytorch`` preset, or
``backend:cudaMallocAsync`` to the ``cuda-async`` preset) or refused with one line that says why
(pinned host memory, locking, CUDA-graph options: nothing allocsim simulates). ``--policy
NAME:SETTINGS`` specs (``pytorch:expandable_segments:True``) are read by ``parse_policy_spec``.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import QUOTE_CHARS, quote
from ..units import MiB
from .divisions import K_ROUNDUP_POWER2_INTERVALS
from .pytorch_sizes import K_LARGE_BUFFER
from .values import LARGEST_SETTING_BYTES, LARGEST_WHY, finite_number, whole_number

#: PyTorch's kLargeBuffer in MB: the smallest max_split_size_mb / max_non_split_rounding_mb it accepts.
MIN_SPLIT_MB = K_LARGE_BUFFER // MiB
ENV_VAR = "PYTORCH_CUDA_ALLOC_CONF"


@dataclass(frozen=True)
class AllocConf:
    """Parsed settings: the policy they select and that policy's parameters (registry names, typed)."""

    policy: str                                     #: "pytorch" (backend:native) or "cuda-async"
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""                                  #: the settings as given, whitespace removed


# ----------------------------------------------------------------------------- value readers
def _whole_mb(key: str, token: str) -> int:
    value = whole_number(key, token, high=LARGEST_SETTING_BYTES // MiB, unit="MB (MiB)", why=LARGEST_WHY)
    if value < MIN_SPLIT_MB:
        raise ValueError(f"{key} must be >= {MIN_SPLIT_MB} (PyTorch refuses smaller values), got {value}")
    return value * MiB


def _true_false(key: str, token: str) -> bool:
    if token not in ("True", "False"):
        raise ValueError(f"{key} takes True or False (PyTorch's spelling, capitalised), got {quote(token)}")
    return token == "True"


def _gc_threshold(key: str, token: str) -> float:
    return finite_number(key, token, low=0.0, high=1.0, low_open=True, high_open=True, why="as in PyTorch")


def _memory_fraction(key: str, token: str) -> float | None:
    value = finite_number(key, token, low=0.0, high=1.0, why="as in PyTorch")
    # PyTorch's setMemoryFraction keeps no cap at 1.0 (and then garbage collection stays off too).
    return None if value == 1.0 else value


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _is_count(token: str) -> bool:
    """A plain decimal of at most 18 digits (longer ones are past any table and past int()'s digit cap)."""
    return token.isascii() and token.isdigit() and len(token) <= 18


def _divisions(key: str, tokens: list[str]) -> str:
    """Check ``roundup_power2_divisions`` tokens (``["8"]`` or ``["[", "256", ":", "1", ..., "]"]``)."""
    if tokens[0] != "[":
        if len(tokens) != 1 or not _is_count(tokens[0]) or not _is_power_of_two(int(tokens[0])):
            raise ValueError(f"{key} takes a power of 2 or a list like [256:1,512:2,>:8], got {quote(''.join(tokens))}")
        return tokens[0]
    if tokens[-1] != "]":
        raise ValueError(f"{key}: no closing ']' in {quote(''.join(tokens))}")
    body = tokens[1:-1]
    entries = []
    for start in range(0, len(body), 4):
        item = body[start:start + 4]
        sep = item[3] if len(item) == 4 else ","
        if len(item) < 3 or item[1] != ":" or sep != ",":
            raise ValueError(f"{key}: expected [MB:divisions,...,>:divisions], got {quote(''.join(tokens))}")
        boundary, divisions = item[0], item[2]
        if boundary != ">" and (not _is_count(boundary) or not _is_power_of_two(int(boundary))):
            raise ValueError(f"{key}: interval {quote(boundary)} is not a power of 2 (in MB) or '>'")
        if not _is_count(divisions) or (int(divisions) and not _is_power_of_two(int(divisions))):
            raise ValueError(f"{key}: divisions {quote(divisions)} must be 0 or a power of 2")
        entries.append(f"{boundary}:{int(divisions)}")
    if not entries or body[-1] == ",":
        raise ValueError(f"{key}: expected [MB:divisions,...,>:divisions], got {quote(''.join(tokens))}")
    return "[" + ",".join(entries) + "]"


# ----------------------------------------------------------------------------- the keys
@dataclass(frozen=True)
class Key:
    """One key PyTorch knows: the preset parameter it sets (and how to read it), or why it is refused."""

    name: str
    param: str | None = None
    read: Callable[[str, str], Any] | None = None
    refused: str = ""


_PINNED = "concerns pinned (page-locked) host memory, which allocsim does not simulate"
_MODELLED = (
    Key("max_split_size_mb", "max_split_size", _whole_mb),
    Key("max_non_split_rounding_mb", "max_non_split_rounding", _whole_mb),
    Key("garbage_collection_threshold", "garbage_collection_threshold", _gc_threshold),
    Key("expandable_segments", "expandable_segments", _true_false),
    Key("roundup_power2_divisions", "roundup_power2_divisions"),
    Key("per_process_memory_fraction", "memory_fraction", _memory_fraction),
    Key("backend"),
)
_REFUSED = (
    Key("pinned_use_cuda_host_register", refused=_PINNED),
    Key("pinned_use_hip_host_register", refused=_PINNED),
    Key("pinned_num_register_threads", refused=_PINNED),
    Key("pinned_use_background_threads", refused=_PINNED),
    Key("pinned_reserve_segment_size_mb", refused=_PINNED),
    Key("pinned_free_catch_all", refused=_PINNED),
    Key("pinned_max_round_threshold_mb", refused=_PINNED),
    Key("pinned_max_cached_size_mb", refused=_PINNED),
    Key("release_lock_on_cudamalloc", refused="changes which thread waits for cudaMalloc, not where memory "
                                              "goes; allocsim does not simulate the allocator's lock"),
    Key("release_lock_on_hipmalloc", refused="changes which thread waits for hipMalloc, not where memory "
                                             "goes; allocsim does not simulate the allocator's lock"),
    Key("graph_capture_record_stream_reuse", refused="concerns CUDA graph capture, which allocation traces "
                                                     "do not record"),
    Key("throw_on_cudamalloc_oom", refused="changes how an out-of-memory is raised, not whether it happens"),
    Key("large_segment_size_mb", refused="changes the large-segment size, which the pytorch preset does not "
                                         "model (it follows kLargeBuffer = 20 MiB)"),
)
#: Every key PyTorch's parsers know (CUDA and the device-generic ones) -> how allocsim treats it.
KEYS: dict[str, Key] = {key.name: key for key in (*_MODELLED, *_REFUSED)}
#: Backend names -> the preset that models them.
BACKENDS = {"native": "pytorch", "cudaMallocAsync": "cuda-async", "hipMallocAsync": "cuda-async"}
#: Keys PyTorch's cudaMallocAsync backend ignores (it warns); refused here instead of silently dropped.
NATIVE_ONLY = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
               "roundup_power2_divisions", "expandable_segments", "per_process_memory_fraction")


def _short(text: str) -> str:
    """``text`` as it is when short, else quoted and cut (a hostile value may be megabytes long)."""
    return text if len(text) <= QUOTE_CHARS else quote(text)


def tokenize(text: str) -> list[str]:
    """PyTorch's ConfigTokenizer: split at ``,`` ``:`` ``[`` ``]`` (kept as tokens), drop whitespace."""
    tokens, buffer = [], []
    for ch in text:
        if ch in ",:[]":
            if buffer:
                tokens.append("".join(buffer))
                buffer = []
            tokens.append(ch)
        elif not ch.isspace():
            buffer.append(ch)
    if buffer:
        tokens.append("".join(buffer))
    return tokens


def _items(tokens: list[str], where: str) -> list[tuple[str, list[str]]]:
    """``key : value , key : [ ... ] , ...`` -> [(key, value tokens)]; a trailing ``,`` is fine, as in PyTorch."""
    items, i, n = [], 0, len(tokens)
    while i < n:
        key = tokens[i]
        if key in ",:[]":
            raise ValueError(f"{where}: expected a key at {quote(''.join(tokens[i:]))}")
        if "=" in key and (i + 1 >= n or tokens[i + 1] == ","):
            name, _, value = key.partition("=")
            raise ValueError(f"{where}: {quote(key)} uses '=': PYTORCH_CUDA_ALLOC_CONF writes KEY:VALUE with ':', "
                             f"as in {quote(name + ':' + value)}")
        if i + 2 >= n or tokens[i + 1] != ":" or tokens[i + 2] in ",:]":
            raise ValueError(f"{where}: expected {_short(key)}:VALUE")
        j = i + 2
        if tokens[j] == "[":
            end = tokens.index("]", j) if "]" in tokens[j:] else n - 1
            value, j = tokens[j:end + 1], end + 1
        else:
            value, j = [tokens[j]], j + 1
        items.append((key, value))
        if j < n and tokens[j] != ",":
            raise ValueError(f"{where}: expected ',' after {quote(key + ':' + ''.join(value))}, got {quote(tokens[j])}")
        i = j + 1
    return items


def unknown_key_message(key: str, where: str) -> str:
    """One line for a key PyTorch does not know, with the nearest known key or allocsim name."""
    close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    for modelled in _MODELLED:
        if modelled.param and key in (modelled.param, modelled.param + "_bytes"):
            hint = f"; allocsim's {key} is PyTorch's {modelled.name}"
    return f"{where}: PyTorch has no allocator setting {quote(key)}{hint}"


def parse_alloc_conf(text: str, *, where: str = "--alloc-conf") -> AllocConf:
    """Read a ``PYTORCH_CUDA_ALLOC_CONF`` string; ``ValueError`` (one line, naming ``where``) if PyTorch
    would refuse it or allocsim does not model a key."""
    params: dict[str, Any] = {}
    backend = "native"
    given: list[str] = []
    items = _items(tokenize(text), where)
    for key, value in items:
        spec = KEYS.get(key)
        if spec is None:
            raise ValueError(unknown_key_message(key, where))
        if spec.refused:
            raise ValueError(f"{where}: {key} is not modelled: it {spec.refused}; remove it to simulate")
        if key != "roundup_power2_divisions" and len(value) != 1:
            raise ValueError(f"{where}: {key} takes one value, got {quote(''.join(value))}")
        try:
            if key == "backend":
                if value[0] not in BACKENDS:
                    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {quote(value[0])}")
                backend = value[0]
                continue
            given.append(key)
            if key == "roundup_power2_divisions":
                params[spec.param] = _divisions(key, value)
            else:
                params[spec.param] = spec.read(key, value[0])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    policy = BACKENDS[backend]
    if policy != "pytorch":
        ignored = [k for k in dict.fromkeys(given) if k in NATIVE_ONLY]
        if ignored:
            raise ValueError(f"{where}: backend:{backend} ignores {', '.join(ignored)} (PyTorch warns and drops "
                             "them); remove them, or use backend:native")
        params = {}
    return AllocConf(policy, params, ",".join(f"{key}:{''.join(value)}" for key, value in items))


def env_alloc_conf(environ: Mapping[str, str] | None = None) -> AllocConf | None:
    """``PYTORCH_CUDA_ALLOC_CONF`` from the environment, parsed; None when it is unset."""
    text = (os.environ if environ is None else environ).get(ENV_VAR)
    return None if text is None else parse_alloc_conf(text, where=ENV_VAR)


# ----------------------------------------------------------------------------- back to PyTorch's words
def _divisions_text(table: list[int]) -> str:
    """A 16-entry divisions table in PyTorch's list syntax (the first key covers the intervals below it)."""
    if len(set(table)) == 1:
        return str(table[0])
    runs: list[tuple[int, int, int]] = []   # (first index, last index, value)
    for index, value in enumerate(table):
        if runs and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], index, value)
        else:
            runs.append((index, index, value))
    parts = [f"{1 << runs[0][1]}:{runs[0][2]}"]
    for first, last, value in runs[1:-1]:
        parts += [f"{1 << index}:{value}" for index in range(first, last + 1)]
    parts.append(f">:{runs[-1][2]}")
    return "[" + ",".join(parts) + "]"


def format_alloc_conf(params: Mapping[str, Any]) -> str | None:
    """The ``pytorch`` preset's parameters (as ``PyTorchPolicy.params()`` gives them, defaults left out
    by the caller) as a ``PYTORCH_CUDA_ALLOC_CONF`` string; None if one cannot be said in PyTorch's words."""
    parts = []
    for name, value in params.items():
        name = name[:-len("_bytes")] if name.endswith("_bytes") else name
        if name in ("max_split_size", "max_non_split_rounding"):
            if value is None:
                continue
            if value % MiB:
                return None
            parts.append(f"{name}_mb:{value // MiB}")
        elif name == "expandable_segments":
            parts.append(f"expandable_segments:{bool(value)}")
        elif name == "garbage_collection_threshold":
            if value:
                parts.append(f"garbage_collection_threshold:{value}")
        elif name == "memory_fraction":
            if value is not None:
                parts.append(f"per_process_memory_fraction:{value}")
        elif name == "roundup_power2_divisions":
            if value is None:
                continue
            if isinstance(value, str):
                parts.append(f"roundup_power2_divisions:{value}")
            else:
                table = list(value) if not isinstance(value, int) else [value] * K_ROUNDUP_POWER2_INTERVALS
                if len(table) != K_ROUNDUP_POWER2_INTERVALS:
                    return None
                parts.append(f"roundup_power2_divisions:{_divisions_text(table)}")
        elif name == "record_decisions":
            continue
        else:
            return None
    return ",".join(parts)


def changed_settings(policy: str, params: Mapping[str, Any],
                     reference: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(ours, theirs)`` for every parameter whose value differs from ``reference`` (both as a policy's
    ``params()`` gives them): ``pytorch`` settings in PyTorch's words (``expandable_segments:True``,
    ``""`` for a PyTorch default), others as ``key=value``."""
    out = []
    for key, value in params.items():
        if key == "record_decisions" or reference.get(key) == value:
            continue
        ours = format_alloc_conf({key: value}) if policy == "pytorch" else None
        theirs = format_alloc_conf({key: reference.get(key)}) if policy == "pytorch" else None
        if ours and theirs is not None:
            out.append((ours, theirs))
        else:
            size = key.endswith("_bytes")
            name = key[:-len("_bytes")] if size else key
            out.append((f"{name}={_plain(value, size)}", f"{name}={_plain(reference.get(key), size)}"))
    return out


def _plain(value: Any, size: bool) -> str:
    """A value as ``--set`` takes it: ``none``, ``true``, ``1GiB`` (sizes in the largest exact unit)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if size and isinstance(value, int) and value > 0:
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    return str(value)


# ----------------------------------------------------------------------------- hints for allocsim names
def setting_hint(key: str, value: str | None = None) -> str:
    """For a PyTorch key given where allocsim names are expected (``--set max_split_size_mb=256``):
    the allocsim name to use instead, as one clause (with ``value`` rewritten when given); "" for any
    other key."""
    spec = KEYS.get(key)
    if spec is None or spec.param == key:   # not PyTorch's, or the same name in both
        return ""
    if spec.refused:
        return f"{key} is a PyTorch setting allocsim does not model: it {spec.refused}"
    if key == "backend":
        return "backend:cudaMallocAsync is the cuda-async policy (--policy cuda-async)"
    shown = "VALUE" if value is None else value
    if key.endswith("_mb"):
        ours = f"{value}MiB" if value is not None and value.strip().isdigit() else "<N>MiB"
        return (f"PyTorch's {key} is in MiB: say --set {spec.param}={ours}, "
                f"or in PyTorch's words --alloc-conf {key}:{shown}")
    return f"PyTorch's {key} is {spec.param} here: say --set {spec.param}=..., or --alloc-conf {key}:{shown}"


# ----------------------------------------------------------------------------- --policy NAME:SETTINGS
@dataclass(frozen=True)
class PolicySpec:
    """``--policy`` as given: the policy, its own settings, and the text (for labels and titles)."""

    name: str
    params: dict[str, Any]
    text: str
    limit_bytes: int | None = None     #: a device cap the settings set (Paddle's FLAGS_gpu_memory_limit_mb)


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        depth += ch == "["
        depth -= ch == "]" and depth > 0
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_policy_spec(text: str) -> PolicySpec:
    """``pytorch`` / ``pytorch:expandable_segments:True,max_split_size_mb:256`` / ``paddle:chunk_size:64MiB``.

    After the first ``:``, the ``pytorch`` policy takes PYTORCH_CUDA_ALLOC_CONF syntax (PyTorch's key
    names), ``paddle`` takes Paddle's flags (``paddle:FLAGS_allocator_strategy=naive_best_fit,...``,
    see ``paddle_flags``; they may select ``paddle-naive`` or ``deferred-gc``); every other policy
    takes ``key:value`` pairs with the names ``allocsim policies`` lists.
    """
    name, sep, rest = text.strip().partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"--policy {quote(text)}: no policy name")
    if not sep:
        return PolicySpec(name, {}, name)
    if not rest.strip():
        raise ValueError(f"--policy {quote(text)}: no settings after ':'")
    where = f"--policy {_short(text)}"
    if name == "paddle" and "=" in rest:
        from .paddle_flags import parse_flags

        flags = parse_flags(rest, where=where)
        return PolicySpec(flags.policy, dict(flags.params), f"{name}:{flags.text}", flags.limit_bytes)
    if name == "pytorch":
        conf = parse_alloc_conf(rest, where=where)
        if conf.policy != "pytorch":
            raise ValueError(f"{where}: backend:cudaMallocAsync is its own policy: say --policy cuda-async")
        return PolicySpec(name, dict(conf.params), f"{name}:{conf.text}")
    params: dict[str, Any] = {}
    for item in _split_outside_brackets(rest):
        key, colon, value = item.partition(":")
        if not colon or not key.strip() or not value.strip():
            raise ValueError(f"{where}: expected {name}:KEY:VALUE[,KEY:VALUE...], got {quote(item)}")
        params[key.strip()] = value.strip()
    return PolicySpec(name, params, f"{name}:{','.join(f'{k}:{v}' for k, v in params.items())}")
