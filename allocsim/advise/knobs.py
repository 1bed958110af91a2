"""The knobs ``advise`` turns, per preset, and how a setting is said back to the user.

A ``Knob`` is one setting people change (``expandable_segments``, ``FLAGS_free_idle_chunk``) with
its ``Choice``s: the recorded value first (the run's own settings: a PyTorch snapshot's
``allocator_settings``, else the preset's defaults), then the values tried. A choice sets allocsim
parameters (the registry's names); the recorded one sets none.

- ``pytorch``: ``expandable_segments``, ``max_split_size_mb`` {none, 64, 128, 256, 512},
  ``roundup_power2_divisions`` {none, 2, 4, 8, 16} and ``garbage_collection_threshold``
  {off, 0.6, 0.8}, which acts only with a memory fraction (as in PyTorch and the preset): its
  values come with ``per_process_memory_fraction:0.99`` unless the run sets a fraction.
- ``paddle``: ``FLAGS_auto_growth_chunk_size_in_mb`` {0, 64, 256}, ``FLAGS_free_idle_chunk``,
  ``FLAGS_free_when_no_cache_hit``; said back as ``export FLAGS_...`` lines and ``flags`` lists.
- ``cupy``: ``CUPY_GPU_MEMORY_LIMIT`` (``set_limit``) {none, 50 %, 75 %, 90 % of the capacity}.

``Preset.paste_line(params)`` is what the user pastes (``PYTORCH_CUDA_ALLOC_CONF=...``, Paddle's
flags, CuPy's variable) and ``Preset.run_args(params)`` the ``allocsim run`` options that replay it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..settings.alloc_conf import format_alloc_conf
from ..device import SimulatedDevice
from ..policies.registry import build_policy
from ..sweep.grid import set_args
from ..units import MiB, format_bytes
from ..settings.divisions import parse_roundup_power2_divisions

#: The memory fraction that lets garbage_collection_threshold act when the run sets none. Not 1.0:
#: current PyTorch keeps no memory maximum at a fraction of 1.0, and without one GC never runs.
GC_MEMORY_FRACTION = 0.99
MAX_SPLIT_MB = (64, 128, 256, 512)
ROUNDUP_DIVISIONS = ("2", "4", "8", "16")
GC_THRESHOLDS = (0.6, 0.8)
PADDLE_CHUNK_MB = (64, 256)
CUPY_LIMIT_PERCENT = (50, 75, 90)


@dataclass(frozen=True)
class Choice:
    """One value of a knob: how people write it and the allocsim parameters it sets ({} = recorded)."""

    text: str
    params: Mapping[str, Any] = field(default_factory=dict)
    recorded: bool = False


@dataclass(frozen=True)
class Knob:
    """A setting people change, its recorded value first, then the values ``advise`` tries."""

    name: str
    choices: tuple[Choice, ...]
    note: str = ""

    @property
    def recorded(self) -> Choice:
        """The run's own value."""
        return self.choices[0]


def _recorded_first(name: str, recorded: str, others: list[tuple[str, dict[str, Any]]], note: str = "") -> Knob:
    return Knob(name, (Choice(recorded, {}, True), *(Choice(text, params) for text, params in others)), note)


def _mb_text(value: int | None) -> str:
    if value is None:
        return "none"
    return str(value // MiB) if value % MiB == 0 else f"{value} bytes"


class Preset:
    """How ``advise`` searches one policy: its knobs, the recorded parameters, the lines to show."""

    policy = ""

    def __init__(self, allocator_settings: Mapping[str, Any] | None, capacity_bytes: int):
        self.allocator_settings = allocator_settings
        self.capacity_bytes = capacity_bytes

    def effective(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The policy's full parameters (``Policy.params()``) with ``params`` over the recorded ones."""
        policy = build_policy(self.policy, device=SimulatedDevice(self.capacity_bytes), params=dict(params),
                              allocator_settings=self.allocator_settings)
        return policy.params()

    def knobs(self) -> list[Knob]:
        raise NotImplementedError

    def paste_line(self, params: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def alloc_conf(self, params: Mapping[str, Any]) -> str | None:
        """PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` value for ``params`` (None for other allocators)."""
        return None

    def flags(self, params: Mapping[str, Any]) -> list[str] | None:
        """Paddle's ``FLAGS_name=value`` settings for ``params`` (None for other allocators)."""
        return None

    def describe(self, params: Mapping[str, Any]) -> str:
        """The full setting in a few words: the paste line, or "<allocator>'s defaults"."""
        line = self.paste_line(params)
        return line if "=" in line else self.DEFAULTS

    DEFAULTS = "the defaults"

    def run_args(self, params: Mapping[str, Any]) -> list[str]:
        """``allocsim run`` options that replay ``params`` (changes from the recorded settings)."""
        return ["--policy", self.policy, *set_args(self.policy, params)]


class PyTorchPreset(Preset):
    """PyTorch's CUDA caching allocator: ``PYTORCH_CUDA_ALLOC_CONF``."""

    policy = "pytorch"
    DEFAULTS = "PyTorch's defaults"

    def knobs(self) -> list[Knob]:
        rec = self.effective({})
        expandable = bool(rec["expandable_segments"])
        knobs = [_recorded_first("expandable_segments", str(expandable),
                                 [(str(not expandable), {"expandable_segments": not expandable})])]
        split = rec["max_split_size_bytes"]
        knobs.append(_recorded_first("max_split_size_mb", _mb_text(split),
                                     [(_mb_text(v), {"max_split_size": v})
                                      for v in (None, *(mb * MiB for mb in MAX_SPLIT_MB)) if v != split]))
        table = rec["roundup_power2_divisions"]
        table = tuple(table) if table is not None else None
        knobs.append(_recorded_first("roundup_power2_divisions", _divisions_text(table),
                                     [(v or "none", {"roundup_power2_divisions": v})
                                      for v in (None, *ROUNDUP_DIVISIONS)
                                      if parse_roundup_power2_divisions(v) != table]))
        knobs.append(self._gc_knob(rec))
        return knobs

    @staticmethod
    def _gc_knob(rec: Mapping[str, Any]) -> Knob:
        threshold, fraction = rec["garbage_collection_threshold"], rec["memory_fraction"]
        acts = threshold > 0 and fraction is not None
        with_fraction = {} if fraction is not None else {"memory_fraction": GC_MEMORY_FRACTION}
        others = [("off", {"garbage_collection_threshold": 0.0})] if acts else []
        others += [(f"{g:g}", {"garbage_collection_threshold": g, **with_fraction})
                   for g in GC_THRESHOLDS if not (acts and g == threshold)]
        note = ("acts only with a memory fraction, as in PyTorch: each value comes with "
                f"per_process_memory_fraction:{GC_MEMORY_FRACTION:g} (or torch.cuda.set_per_process_memory_fraction"
                f"({GC_MEMORY_FRACTION:g}) where PyTorch lacks that key)" if fraction is None else
                f"with the run's per_process_memory_fraction:{fraction:g}")
        return _recorded_first("garbage_collection_threshold", f"{threshold:g}" if acts else "off", others, note)

    def _defaults(self) -> dict[str, Any]:
        return build_policy("pytorch", device=SimulatedDevice(self.capacity_bytes)).params()

    def alloc_conf(self, params: Mapping[str, Any]) -> str:
        """Every setting that differs from PyTorch's defaults, in PyTorch's words ("" = all defaults)."""
        full, defaults = self.effective(params), self._defaults()
        return format_alloc_conf({k: v for k, v in full.items() if v != defaults.get(k)}) or ""

    def paste_line(self, params: Mapping[str, Any]) -> str:
        conf = self.alloc_conf(params)
        return f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "unset PYTORCH_CUDA_ALLOC_CONF (PyTorch's defaults)"

    def run_args(self, params: Mapping[str, Any]) -> list[str]:
        """``--alloc-conf`` with the full setting, the default values it changes back explicitly
        (``expandable_segments:False`` over a recorded True), and ``--set`` for those PyTorch cannot
        spell (``max_split_size`` none, garbage collection off)."""
        full, defaults, recorded = self.effective(params), self._defaults(), self.effective({})
        in_conf = {k for k, v in full.items() if v != defaults.get(k)}
        conf = self.alloc_conf(params)
        parts = [conf] if conf else []
        extra: dict[str, Any] = {}
        for key, value in full.items():
            if key in in_conf or value == recorded.get(key):
                continue
            said = format_alloc_conf({key: value})
            if said:
                parts.append(said)
            else:
                extra[key[:-len("_bytes")] if key.endswith("_bytes") else key] = value
        args = ["--policy", "pytorch"]
        if parts:
            args += ["--alloc-conf", ",".join(parts)]
        return args + set_args("pytorch", extra)


def _divisions_text(table: tuple[int, ...] | None) -> str:
    if table is None:
        return "none"
    said = format_alloc_conf({"roundup_power2_divisions": list(table)}) or ""
    return said.partition(":")[2] or str(list(table))


class PaddlePreset(Preset):
    """PaddlePaddle's auto_growth allocator: ``FLAGS_*`` environment variables."""

    policy = "paddle"
    DEFAULTS = "Paddle's defaults"
    FLAGS = {"chunk_size_bytes": "FLAGS_auto_growth_chunk_size_in_mb", "free_idle_chunk": "FLAGS_free_idle_chunk",
             "free_when_no_cache_hit": "FLAGS_free_when_no_cache_hit",
             "stream_safe": "FLAGS_use_stream_safe_cuda_allocator"}

    def knobs(self) -> list[Knob]:
        rec = self.effective({})
        chunk = rec["chunk_size_bytes"]
        knobs = [_recorded_first(self.FLAGS["chunk_size_bytes"], _mb_text(chunk),
                                 [(str(mb), {"chunk_size": mb * MiB}) for mb in (0, *PADDLE_CHUNK_MB)
                                  if mb * MiB != chunk])]
        for key in ("free_idle_chunk", "free_when_no_cache_hit"):
            value = bool(rec[key])
            knobs.append(_recorded_first(self.FLAGS[key], str(value).lower(), [(str(not value).lower(), {key: not value})]))
        return knobs

    def flags(self, params: Mapping[str, Any]) -> list[str]:
        """Every flag whose value differs from Paddle's default, as ``FLAGS_name=value`` ([] = all defaults)."""
        full, defaults = self.effective(params), build_policy("paddle", device=SimulatedDevice(None)).params()
        parts = []
        for key, flag in self.FLAGS.items():
            if full[key] != defaults[key]:
                value = full[key]
                parts.append(f"{flag}={value // MiB if key == 'chunk_size_bytes' else str(value).lower()}")
        return parts

    def paste_line(self, params: Mapping[str, Any]) -> str:
        """``export FLAGS_a=v FLAGS_b=w``: paste it into the shell that starts the Paddle program."""
        parts = self.flags(params)
        return f"export {' '.join(parts)}" if parts else "(Paddle's defaults: no flag to set)"

    def run_args(self, params: Mapping[str, Any]) -> list[str]:
        """``--flags`` with the same flags the paste line sets."""
        parts = self.flags(params)
        return ["--policy", "paddle", *(["--flags", ",".join(parts)] if parts else [])]


class CuPyPreset(Preset):
    """CuPy's MemoryPool: ``CUPY_GPU_MEMORY_LIMIT`` (``MemoryPool.set_limit``)."""

    policy = "cupy"
    DEFAULTS = "CuPy's defaults"

    def knobs(self) -> list[Knob]:
        limit = self.effective({})["limit_bytes"]
        others = []
        for percent in CUPY_LIMIT_PERCENT:
            value = self.capacity_bytes * percent // 100 // MiB * MiB
            if value and value != limit:
                others.append((f"{value} ({percent}% of {format_bytes(self.capacity_bytes)})", {"limit": value}))
        return [_recorded_first("CUPY_GPU_MEMORY_LIMIT", str(limit) if limit else "none", others,
                                "set_limit: the pool frees its cached blocks before it would exceed the limit")]

    def paste_line(self, params: Mapping[str, Any]) -> str:
        limit = self.effective(params)["limit_bytes"]
        return f"CUPY_GPU_MEMORY_LIMIT={limit}" if limit else "(CuPy's defaults: no limit)"


PRESETS: dict[str, type[Preset]] = {"pytorch": PyTorchPreset, "paddle": PaddlePreset, "cupy": CuPyPreset}


def preset_for(policy: str, allocator_settings: Mapping[str, Any] | None, capacity_bytes: int) -> Preset:
    """The ``Preset`` of ``policy``; ``ValueError`` (one line) for a policy ``advise`` has no knobs for."""
    if policy not in PRESETS:
        raise ValueError(f"advise knows the knobs of {', '.join(PRESETS)}, not {policy!r}; "
                         f"compare other policies with allocsim sweep")
    settings = allocator_settings if policy == "pytorch" else None
    return PRESETS[policy](settings, capacity_bytes)
