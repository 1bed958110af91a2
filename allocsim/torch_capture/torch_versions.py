"""Which torch release the capture runs in, and what differs between 2.4 and 2.15: ``installed()``, ``wheel_for()``, ``reduce_vectorization()``.

A capture follows the torch it runs in: the same script allocates differently under 2.6 and 2.13
(autograd's backward of a slice, CUDA reductions' vectorisation, which SDPA kernel runs), so the
capture must run in the torch the GPU run will use, and every rule that differs by release is
either read from the installed torch (``autocast_mode.h``, ``Reduce.cuh``, the build's cuDNN) or
keyed here by its release. Supported: ``SUPPORTED`` (oldest and newest release tested, CPU and CUDA
builds; a CUDA build needs no GPU). The version keys of the other modules live here too:

* ``WHEELS``: the CUDA and cuDNN of each release's default PyPI wheel (``Requires-Dist`` pins,
  read with ``pip install --dry-run --report``), the cuDNN a CPU build answers and SDPA's rules use;
* ``REDUCE_RULES``: CUDA reductions' input vectorisation (``ATen/native/cuda/Reduce.cuh``; three rules
  between 2.4 and 2.13), and ``reduce_vectorization()`` reading it from the installed header;
* ``LAYER_NORM_TWO_PASS``: the first release whose layer-norm backward sums gamma/beta in two passes.

Compatibility shims (features that moved between releases) are here as well, each named after what
it stands in for: ``register_fallthrough`` (``Library.fallback`` is 2.5+), ``stream_bases`` (2.4's
``torch._dynamo`` requires ``torch._streambase`` subclasses of ``torch.cuda.Stream``/``Event``).
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

#: Oldest and newest torch release the capture is tested with (``python -m validate torch-matrix``).
SUPPORTED = ((2, 4), (2, 15))
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)")


def parse(text: Any) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``"2.6.0+cu124"`` -> ``(2, 6)``); None when it is not one."""
    match = _VERSION.match(str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed() -> tuple[int, int]:
    """The running torch's ``(major, minor)``."""
    import torch  # noqa: PLC0415

    return parse(torch.__version__) or (0, 0)


def supported(version: tuple[int, int]) -> bool:
    """Whether ``version`` lies in the tested range."""
    return SUPPORTED[0] <= tuple(version) <= SUPPORTED[1]


def describe(text: Any) -> str:
    """``"2.6"`` of ``"2.6.0+cu124"`` (the release a rule is keyed by), or the text as given."""
    version = parse(text)
    return f"{version[0]}.{version[1]}" if version else str(text or "?")


def differ(a: Any, b: Any) -> bool:
    """Whether two torch version strings name different releases (``2.6.0+cu124`` and ``2.6.0`` do not)."""
    pa, pb = parse(a), parse(b)
    return pa is not None and pb is not None and pa != pb


class Wheel(NamedTuple):
    """The CUDA and cuDNN of a release's default PyPI wheel (``pip install torch==X`` on Linux x86-64)."""

    cuda: str           # the CUDA runtime's major.minor
    cudnn: int          # cuDNN as ``torch.backends.cudnn.version()`` answers (9.1.0 -> 90100)


#: Read from each release's ``Requires-Dist`` (``nvidia-cuda-runtime``, ``nvidia-cudnn``; from 2.11 on
#: ``cuda-toolkit[...]``): 2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0,
#: 2.14.1, 2.15.0. The newest entry at or below a release applies.
WHEELS: dict[tuple[int, int], Wheel] = {
    (2, 4): Wheel("12.1", 90100),
    (2, 5): Wheel("12.4", 90100),
    (2, 6): Wheel("12.4", 90100),
    (2, 7): Wheel("12.6", 90501),
    (2, 8): Wheel("12.8", 91002),
    (2, 9): Wheel("12.8", 91002),
    (2, 10): Wheel("12.8", 91002),
    (2, 11): Wheel("13.0", 91900),
    (2, 12): Wheel("13.0", 92000),
    (2, 13): Wheel("13.0", 92000),
    (2, 14): Wheel("13.0", 92400),
    (2, 15): Wheel("13.2", 92600),
}


def keyed(table: dict[tuple[int, int], Any], version: tuple[int, int]) -> Any:
    """The entry of the newest release at or below ``version`` (the oldest entry below the table)."""
    known = [v for v in table if v <= tuple(version)]
    return table[max(known)] if known else table[min(table)]


def wheel_for(version: tuple[int, int]) -> Wheel:
    """The default PyPI wheel's CUDA and cuDNN of ``version``."""
    return keyed(WHEELS, version)


_BUILD_CUDNN: list[int | None] = []


def build_cudnn() -> int | None:
    """The cuDNN the installed CUDA build loads (None for a CPU build); read once, before the capture answers for it."""
    if not _BUILD_CUDNN:
        value = None
        try:
            import torch  # noqa: PLC0415

            if torch.version.cuda and hasattr(torch._C, "_cudnn"):
                value = int(torch._C._cudnn.getVersionInt())
        except (ImportError, AttributeError, RuntimeError, OSError):
            value = None
        _BUILD_CUDNN.append(value)
    return _BUILD_CUDNN[0]


def cudnn_version(version: tuple[int, int] | None = None) -> int:
    """cuDNN as the GPU run would report it: the installed CUDA build's own, else the release's PyPI wheel's."""
    if version is None:
        found = build_cudnn()
        if found:
            return found
        version = installed()
    return wheel_for(version).cudnn


def cuda_major(version: tuple[int, int] | None = None) -> int:
    """The CUDA major version of the installed CUDA build, else of the release's PyPI wheel."""
    if version is None:
        try:
            import torch  # noqa: PLC0415

            if torch.version.cuda:
                return int(str(torch.version.cuda).split(".")[0])
        except (ImportError, ValueError):
            pass
        version = installed()
    return int(wheel_for(version).cuda.split(".")[0])


# ------------------------------------------------------------------------------ CUDA kernels' rules
#: ``layer_norm_kernel.cu``'s two-pass gamma/beta backward (``dgamma_blocks``) is absent from the 2.6
#: sources and present in 2.13's (docs/cuda_scratch.md): releases from this one on take it.
LAYER_NORM_TWO_PASS = (2, 7)
#: ``Reduce.cuh``'s input vectorisation of CUDA reductions (``setReduceConfig``), read from the headers
#: of the PyPI wheels: up to 2.6 ``ReduceConfig::input_vec_size`` is 4 and used when ``dim0 > 128`` and
#: ``vt0 >= 4`` ("vec4"); 2.7 makes ``input_vec_size`` a per-kernel template argument (8 for 16-bit sums
#: and means) still used only when ``dim0 > 128`` and ``vt0 >= input_vec_size`` ("per_kernel_gated", 2.7
#: to 2.9); from 2.10 it is used when ``dim0 >= 128`` with no gate ("per_kernel"). Read from the headers
#: of the PyPI wheels 2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.13.0 and 2.15.0 (CUDA branch;
#: ROCm's differs). The newest entry at or below a release applies.
REDUCE_RULES: dict[tuple[int, int], str] = {(2, 4): "vec4", (2, 7): "per_kernel_gated", (2, 10): "per_kernel"}


#: Rules read from an installed ``Reduce.cuh`` (``use_installed_reduce_rule``), by release: they win over the key.
_READ_RULES: dict[tuple[int, int], str] = {}


def reduce_rule_for(version: tuple[int, int]) -> str:
    """The reductions' vectorisation rule of a release: as its installed header says, else ``REDUCE_RULES``."""
    return _READ_RULES.get(tuple(version)) or keyed(REDUCE_RULES, tuple(version))


def use_installed_reduce_rule() -> str:
    """Read the installed torch's ``Reduce.cuh`` once, so its release's reductions follow it (the capture calls this)."""
    version = installed()
    text = _reduce_header()
    rule = reduce_rule_of_header(text) if text else None
    if rule:
        _READ_RULES[version] = rule
    return reduce_rule_for(version)


def _reduce_header() -> str | None:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "native", "cuda", "Reduce.cuh")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _cuda_branch_condition(text: str) -> str | None:
    """The CUDA (not ROCm) condition of ``setReduceConfig``'s "vectorize along input" case."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "reduction_on_fastest_striding_dimension && dim0" not in line or "if (" not in line:
            continue
        if i > 0 and lines[i - 1].strip().startswith("#ifdef USE_ROCM"):
            continue                    # the ROCm branch: the CUDA one follows its #else
        return line
    return None


def reduce_rule_of_header(text: str) -> str | None:
    """``"vec4"``, ``"per_kernel_gated"`` or ``"per_kernel"`` from ``Reduce.cuh``'s text; None when not recognised."""
    condition = _cuda_branch_condition(text)
    if condition is None:
        return None
    fixed_four = re.search(r"static\s+constexpr\s+int\s+input_vec_size\s*=\s*4\s*;", text) is not None
    if fixed_four and "dim0 > 128" in condition and "vt0 >= ReduceConfig::input_vec_size" in condition:
        return "vec4"
    if re.search(r"int\s+input_vec_size\s*=\s*vt0", text):
        if "dim0 > 128" in condition and "vt0 >= input_vec_size" in condition:
            return "per_kernel_gated"
        if "dim0 >= 128" in condition and "vt0" not in condition:
            return "per_kernel"
    return None


def reduce_vectorization(version: tuple[int, int] | None = None) -> str:
    """Which input vectorisation CUDA reductions use: read from the installed ``Reduce.cuh``, else keyed by release."""
    if version is None:
        text = _reduce_header()
        rule = reduce_rule_of_header(text) if text else None
        if rule:
            return rule
        version = installed()
    return reduce_rule_for(version)


# ------------------------------------------------------------------------------ compatibility shims
def register_fallthrough(library: Any, key: str) -> None:
    """A fallthrough for every operator at dispatch key ``key`` (``Library.fallback`` is missing in 2.4)."""
    library.m.fallback_fallthrough(key)


def stream_bases() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """Base classes for the capture's ``torch.cuda.Stream`` and ``Event``.

    torch 2.4 and 2.5's ``torch._dynamo.device_interface`` asserts, when it is first imported (an
    optimizer's constructor imports it), that ``torch.cuda.Stream``/``Event`` derive from
    ``torch._streambase._StreamBase``/``_EventBase``, abstract classes then. Later releases made those
    deprecated aliases of ``torch.Stream``/``torch.Event`` (which warn when subclassed) and dropped
    the assertion: there the classes stand alone.
    """
    try:
        from torch import _streambase  # noqa: PLC0415
    except ImportError:
        return (), ()
    stream, event = getattr(_streambase, "_StreamBase", None), getattr(_streambase, "_EventBase", None)
    if isinstance(stream, type) and isinstance(event, type) and stream.__module__ == "torch._streambase" \
            and getattr(stream, "__abstractmethods__", None):
        return (stream,), (event,)
    return (), ()

