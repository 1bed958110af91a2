"""Make a small virtual environment with one torch release for the torch matrix: ``python -m validate torch-env 2.6.0 DIR``.

PyPI's Linux torch wheels are CUDA builds whose NVIDIA dependency packages take 3 to 6 GB; a
capture needs none of what they compute, only what ``import torch`` loads. So the environment gets
torch without its dependencies, its pure-Python requirements, and then only the NVIDIA packages
whose shared libraries the libraries ``import torch`` loads name (``DT_NEEDED`` of
``torch/_C``'s closure in ``torch/lib``; ``libtorch_cuda_linalg`` and NVRTC are opened lazily and
left out), each at the version torch's own metadata pins. cuDNN's engine libraries, which cuDNN 9
opens only when a convolution runs, are removed (its graph library, which answers its version, stays) (``--keep-cudnn`` keeps them): about 1 GB less.
The scripts of the scale-series recipes import einops, einx, jaxtyping and pandas: ``--extra``
adds them (default: at the versions the recordings' lock files pin) or others.

PyPI only (pip as configured here; ``PIP_CONSTRAINT`` is emptied for this environment's installs, so
a machine's cap on torch does not apply to it). Nothing here is imported by allocsim.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: Shared-library name prefix -> the NVIDIA package (name prefix, any CUDA suffix) that ships it.
LIBRARY_PACKAGES = {
    "libcublasLt": "nvidia-cublas", "libcublas": "nvidia-cublas", "libcudart": "nvidia-cuda-runtime",
    "libcupti": "nvidia-cuda-cupti", "libnvrtc": "nvidia-cuda-nvrtc", "libcudnn": "nvidia-cudnn",
    "libcufft": "nvidia-cufft", "libcurand": "nvidia-curand", "libcusolver": "nvidia-cusolver",
    "libcusparseLt": "nvidia-cusparselt", "libcusparse": "nvidia-cusparse", "libnccl": "nvidia-nccl",
    "libnvToolsExt": "nvidia-nvtx", "libnvJitLink": "nvidia-nvjitlink", "libcufile": "nvidia-cufile",
    "libnvshmem": "nvidia-nvshmem",
}
#: What the scale-series recipes' scripts import beside torch, at the versions their repositories' uv.lock
#: pins (einx's get_at makes other temporaries from one release to the next: 0.4 adds index arithmetic).
DEFAULT_EXTRA = ("numpy", "einops==0.8.1", "einx==0.3.0", "jaxtyping==0.3.2", "pandas")
_REQUIRES = re.compile(r"^Requires-Dist:\s*([A-Za-z0-9_.\-]+)\s*(?:\(([^)]*)\)|([=<>!~][^;]*))?\s*(?:;\s*(.*))?$")


def _pip(python: Path, *args: str) -> None:
    # No configuration file: a machine-wide constraint (a cap on torch) must not apply to this venv.
    # PIP_CONSTRAINT="" and --isolated both still read the global file's constraint.
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_CONSTRAINT", None)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, env=env)


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def requirements(metadata: str) -> list[tuple[str, str, str]]:
    """``(name, specifier, marker)`` of each ``Requires-Dist`` line of a wheel's METADATA (extras left out)."""
    out = []
    for line in metadata.splitlines():
        match = _REQUIRES.match(line.strip())
        if not match:
            continue
        name, spec = match.group(1), (match.group(2) or match.group(3) or "").strip()
        marker = match.group(4) or ""
        if "extra ==" in marker:
            continue
        out.append((name, spec, marker))
    return out


def marker_holds(marker: str) -> bool:
    """Whether a requirement's environment marker holds here (the venv runs this interpreter's Python)."""
    if not marker.strip():
        return True
    from packaging.markers import Marker  # noqa: PLC0415  (pip's own dependency, installed with setuptools)

    return Marker(marker).evaluate()


def _metadata(site: Path, dist: str) -> str:
    key = dist.lower().replace("-", "_")
    for info in site.glob("*.dist-info"):
        if info.name.lower().split("-")[0] == key:
            return (info / "METADATA").read_text(encoding="utf-8", errors="replace")
    return ""


def needed_libraries(torch_lib: Path) -> set[str]:
    """The sonames outside ``torch/lib`` that ``import torch`` needs (the closure of ``_C``'s libraries)."""
    todo = ["libtorch_python.so", "libtorch_global_deps.so"]
    seen: set[str] = set()
    outside: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = torch_lib / name
        if not path.exists():
            outside.add(name)
            continue
        dump = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        todo.extend(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dump))
    return outside


def _package_of(soname: str) -> str | None:
    for prefix in sorted(LIBRARY_PACKAGES, key=len, reverse=True):
        if soname.startswith((prefix + ".", prefix + "-", prefix + "_")):
            return LIBRARY_PACKAGES[prefix]
    return None


def nvidia_pins(torch_requires: list[tuple[str, str, str]], sonames: set[str]) -> list[str]:
    """``name==version`` of the NVIDIA packages torch pins that ship one of ``sonames``."""
    wanted = {p for p in map(_package_of, sonames) if p}
    pins = []
    for name, spec, _marker in torch_requires:
        base = name.lower().replace("_", "-")
        if any(base == w or base.startswith(w + "-cu") for w in wanted):
            pins.append(f"{name}{spec.replace(' ', '')}")
    return pins


def toolkit_requires(python: Path, site: Path, torch_requires: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """torch >= 2.11 names its CUDA libraries through ``cuda-toolkit[cublas,...]==V``: its packages' pins instead."""
    out = []
    for name, spec, marker in torch_requires:
        if name.lower() != "cuda-toolkit":
            out.append((name, spec, marker))
    for line in _metadata(site, "torch").splitlines():
        match = re.match(r"^Requires-Dist:\s*cuda-toolkit\[([^\]]*)\]\s*\(?([^;)]*)\)?", line.strip())
        if not match:
            continue
        extras = {e.strip() for e in match.group(1).split(",")}
        _pip(python, "--no-deps", f"cuda-toolkit{match.group(2).strip()}")
        for req in _metadata(site, "cuda-toolkit").splitlines():
            found = re.match(r"^Requires-Dist:\s*([A-Za-z0-9_.\-]+)\s*([^;]*);.*extra\s*==\s*'([^']+)'", req.strip())
            if found and found.group(3) in extras:
                out.append((found.group(1), found.group(2).strip(), ""))
    return out


def make_env(version: str, dest: Path, extra: tuple[str, ...] = DEFAULT_EXTRA, keep_cudnn: bool = False) -> Path:
    """Create ``dest`` with torch ``version`` and what its import needs; the interpreter's path."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    python = dest / "bin" / "python"
    _pip(python, "--no-deps", f"torch=={version}")
    site = _site_packages(python)
    torch_requires = toolkit_requires(python, site, requirements(_metadata(site, "torch")))
    pure = [f"{n}{s.replace(' ', '')}" for n, s, m in torch_requires
            if not n.lower().startswith(("nvidia-", "triton", "cuda-", "pytorch-triton")) and marker_holds(m)]
    _pip(python, *pure, *extra)
    pins = nvidia_pins(torch_requires, needed_libraries(site / "torch" / "lib"))
    if pins:
        _pip(python, "--no-deps", *pins)
    for _ in range(4):          # the NVIDIA packages' own NVIDIA requirements (cuSPARSE needs nvJitLink)
        installed = {info.name.split("-")[0].lower().replace("_", "-") for info in site.glob("*.dist-info")}
        more = []
        for pin in pins:
            dist = re.split(r"[=<>!~]", pin)[0]
            for name, spec, _m in requirements(_metadata(site, dist)):
                if name.lower().startswith("nvidia-") and name.lower().replace("_", "-") not in installed:
                    more.append(f"{name}{spec.replace(' ', '')}")
        if not more:
            break
        _pip(python, "--no-deps", *sorted(set(more)))
        pins += more
    if not keep_cudnn:
        for lib in (site / "nvidia").glob("cudnn*/lib/libcudnn_*.so*"):
            if not lib.name.startswith("libcudnn_graph"):     # cudnnGetVersion lives there (cuDNN 9)
                lib.unlink()
    check = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True)
    if check.returncode != 0:
        raise RuntimeError(f"import torch fails in {dest}: {check.stderr.strip().splitlines()[-1:]}")
    return python


def register(subparsers) -> None:
    """Add the ``torch-env`` subcommand."""
    parser = subparsers.add_parser("torch-env", help="make a venv with one torch release for torch-matrix",
                                   description=__doc__.split("\n")[0])
    parser.add_argument("version", help="torch release, as pip names it (2.6.0)")
    parser.add_argument("dest", help="the venv folder to create")
    parser.add_argument("--extra", nargs="*", default=list(DEFAULT_EXTRA), metavar="PKG",
                        help="packages the scripts import (default: %(default)s)")
    parser.add_argument("--keep-cudnn", action="store_true", help="keep cuDNN's engine libraries")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Make the environment; print its interpreter and size."""
    dest = Path(args.dest)
    if not shutil.which("readelf"):
        raise ValueError("torch-env reads the libraries' needs with readelf (binutils): install it first")
    if dest.exists():
        raise ValueError(f"{dest} exists: give a new folder")
    python = make_env(args.version, dest, tuple(args.extra), args.keep_cudnn)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"{python}  ({size / 2**30:.1f} GiB)")
    return 0

