"""GPU models for ``allocsim run --gpu NAME``: what besides the caching allocator's segments takes a GPU's memory.

A GPU's memory during a PyTorch training run is

* the CUDA context (``context_bytes``): the driver's per-process state, there before the first tensor;
* what the libraries load and keep once the first kernels run (``library_bytes``): lazily loaded
  kernel modules, cuDNN and cuBLAS handles, which a run on the CPU cannot see (cuDNN's convolution
  workspaces go through the caching allocator: ``allocsim capture`` puts them in the trace, see
  ``allocsim.torch_capture.cudnn``, so they are in the simulated segments);
* cuBLAS workspaces (``workspace_bytes``): PyTorch gives each (cuBLAS handle, stream) its own
  workspace from the caching allocator, and a training step uses two handles (the forward runs in
  the script's thread, the backward in the autograd engine's device thread);
* the caching allocator's segments: ``peak_reserved_bytes`` of the simulation.

``gpu_estimate`` adds them up; the verdict compares the total with the GPU's memory. Each figure says
where it comes from in ``sources``; ``library_bytes`` is calibrated on measured runs only (see
``validate/xmem_calibration.json``) and ``context_bytes`` is fitted on milabench's L40S table (torch
2.6 / CUDA 12.6) and moved to other cards by their local memory (``python -m validate milabench``:
on milabench's H100 and H200 tables the cards held about 320 MiB more), so the verdict near the
limit has that uncertainty.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Any

from .errors import AllocsimError
from .units import format_bytes

GiB = 1 << 30
MiB = 1 << 20
#: PyTorch's default cuBLAS workspace (``CUBLAS_WORKSPACE_CONFIG`` unset): ``:4096:2:16:8``, or
#: ``:4096:8`` on compute capability 9.x to 12.x (aten/src/ATen/cuda/CublasHandlePool.cpp,
#: parseChosenWorkspaceSize; Hopper only before Blackwell support).
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 1024 * 8
_CUBLAS_LARGE_MAJORS = (9, 10, 11, 12)
_CUBLAS_CONFIG = re.compile(r":([0-9]+):([0-9]+)")


def cublas_workspace_bytes(compute_major: int | None, config: str | None = None) -> int:
    """One cuBLAS workspace as PyTorch sizes it: ``CUBLAS_WORKSPACE_CONFIG`` (``:KIB:COUNT`` pairs) or the default."""
    default = CUBLAS_WORKSPACE_BYTES_SM90 if compute_major in _CUBLAS_LARGE_MAJORS else CUBLAS_WORKSPACE_BYTES
    pairs = _CUBLAS_CONFIG.findall(config) if config is not None else []
    if not pairs:
        return default                     # unset, or unparsable (PyTorch warns and keeps the default)
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


#: cuBLAS handles a training step uses: the script's thread (forward, optimizer) and the autograd
#: engine's device thread (backward), each with its own workspace on the current stream.
TRAINING_CUBLAS_HANDLES = 2
#: The caching allocator rounds a large request to 2 MiB; a workspace is its own segment.
_ROUND_LARGE = 2 * MiB
#: The primary context with lazy module loading (CUDA >= 12 default): the estimate used where no fitted
#: figure applies (``GpuModel(context_bytes=...)`` given by hand).
CONTEXT_BYTES_ESTIMATE = 400 * MiB
#: The CUDA context and the kernels a training step loads lazily, less the card's local-memory
#: reservation: fitted on milabench's L40S table (torch 2.6.0+cu126, cuDNN 9.5.1; the median at
#: batch 0 of the residual ground - NVML reserved - simulated reserved peak of its six transformer
#: benchmarks, 48 rows; ``python -m validate milabench --calibrate``, validate/milabench_calibration.json).
CONTEXT0_BYTES_FITTED = 192937984
#: cudaLimitStackSize's default: the local memory CUDA reserves per resident thread when the context is made.
LOCAL_BYTES_PER_THREAD = 1024
#: Calibrated on xMem's 001-Anova rows (RTX 3060): the median of ground truth minus allocsim's
#: simulated reserved peak and cuBLAS workspaces; validate/xmem_calibration.json has the rows.
LIBRARY_BYTES_CALIBRATED = 0


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """One GPU: its memory as a real card reports it (or the product label), compute capability, sources."""

    name: str
    aliases: tuple[str, ...]
    nominal_bytes: int                       # the product label ("80 GB"), which real cards do not reach
    sm: int                                  # compute capability, e.g. 86 for 8.6
    nominal_source: str
    #: What a real card reported (CUDA totalGlobalMem / cudaMemGetInfo total); None: no recording found.
    recorded_bytes: int | None = None
    recorded_source: str = ""
    #: None: the fitted context (``CONTEXT0_BYTES_FITTED``) plus this card's local memory.
    context_bytes: int | None = None
    library_bytes: int = LIBRARY_BYTES_CALIBRATED
    #: Streaming multiprocessors (the product's published count): kernels size their grids by it.
    sm_count: int = 0

    def __post_init__(self) -> None:
        if self.context_bytes is None:
            object.__setattr__(self, "context_bytes", CONTEXT0_BYTES_FITTED + self.local_bytes)

    @property
    def local_bytes(self) -> int:
        """The local memory the CUDA context reserves: SMs x resident threads per SM x the default 1 KiB stack."""
        return self.sm_count * self.max_threads_per_sm * LOCAL_BYTES_PER_THREAD

    @property
    def verified(self) -> bool:
        """Whether ``total_bytes`` is what a real card of this model reported (else the nominal label)."""
        return self.recorded_bytes is not None

    @property
    def total_bytes(self) -> int:
        """The memory the verdict is judged against: the recorded total, else the nominal label."""
        return self.recorded_bytes if self.recorded_bytes is not None else self.nominal_bytes

    @property
    def total_source(self) -> str:
        """Where ``total_bytes`` comes from, for people."""
        if self.verified:
            return self.recorded_source
        return (f"{self.nominal_source}; unverified: no recording of what a real card reports was found, and "
                "real cards report less than their label (a fit near the limit is not proven)")

    @property
    def max_threads_per_sm(self) -> int:
        """Resident threads per SM for this compute capability (CUDA C Programming Guide, compute capabilities table)."""
        return _MAX_THREADS_PER_SM.get(self.sm, 2048)

    def capture_properties(self) -> dict[str, Any]:
        """What ``torch.cuda.get_device_properties`` says of this card under ``allocsim capture --gpu``."""
        return {"name": self.name, "total_bytes": self.total_bytes, "major": self.sm // 10, "minor": self.sm % 10,
                "sm_count": self.sm_count, "max_threads_per_sm": self.max_threads_per_sm,
                "context_bytes": self.context_bytes}

    @property
    def cublas_workspace_bytes(self) -> int:
        """One cuBLAS workspace as PyTorch sizes it for this architecture."""
        return cublas_workspace_bytes(self.sm // 10)

    def sources(self) -> dict[str, str]:
        """Where each figure of this GPU model comes from."""
        return {
            "total_bytes": self.total_source,
            "context_bytes": (f"fitted: CUDA context + lazily loaded kernels {format_bytes(CONTEXT0_BYTES_FITTED)} "
                              "(milabench L40S table, torch 2.6.0+cu126 / cuDNN 9.5.1: median batch-0 residual "
                              "of its transformer benchmarks, validate/milabench_calibration.json) + this card's "
                              f"local memory {format_bytes(self.local_bytes)} ({self.sm_count} SMs x "
                              f"{self.max_threads_per_sm} threads x 1 KiB); checked on milabench's H100 and H200 "
                              "tables, where the cards held about 320 MiB more than this (docs/capture.md, 'The "
                              "GPU's own memory'); other CUDA, driver and library versions are not measured"
                              if self.context_bytes == CONTEXT0_BYTES_FITTED + self.local_bytes else
                              "given by hand (estimate)"),
            "library_bytes": "calibrated: median of (xMem 001-Anova ground - allocsim reserved peak - cuBLAS "
                             "workspaces) over the rows in validate/xmem_calibration.json",
            "workspace_bytes": "PyTorch CublasHandlePool.cpp default CUBLAS_WORKSPACE_CONFIG "
                               f"({'4096 KiB x 8' if self.sm // 10 in _CUBLAS_LARGE_MAJORS else '4096 KiB x 2 + 16 KiB x 8'}) per "
                               f"handle, {TRAINING_CUBLAS_HANDLES} handles, each a segment rounded to 2 MiB",
        }


_SPEC = "NVIDIA product specification (nominal)"
_MAX_THREADS_PER_SM = {70: 2048, 75: 1024, 80: 2048, 86: 1536, 87: 2048, 89: 1536, 90: 2048, 100: 2048,
                       120: 1536}
_DQ = "CUDA deviceQuery printout"
#: Real totals differ by driver version and ECC (GDDR cards with ECC on give up 1/16 of the memory), so
#: where several recordings of one model exist the lowest is kept: a fit there fits the others too.
GPUS: tuple[GpuModel, ...] = (
    GpuModel("RTX 3060", ("3060", "GeForce RTX 3060", "NVIDIA GeForce RTX 3060"), 12 * GiB, 86, _SPEC + ", 12 GB",
             12622168064,
             "total_gpu_memory of xMem's RTX 3060 runs (NVML): 12622168064, Stone-ResearchLife/xMem "
             "evaluation_result.json", sm_count=28),
    GpuModel("RTX 3080", ("3080", "GeForce RTX 3080", "NVIDIA GeForce RTX 3080"), 10 * GiB, 86, _SPEC + ", 10 GB",
             10485956608,
             f"{_DQ}, 'NVIDIA GeForce RTX 3080', driver 12.4, ECC off: '10000 MBytes (10485956608 bytes)', (68) "
             "Multiprocessors, thamada/gls @0aa17a64 gls/RTX3080_deviceQuery.py", sm_count=68),
    GpuModel("RTX 3090", ("3090", "GeForce RTX 3090", "NVIDIA GeForce RTX 3090"), 24 * GiB, 86, _SPEC + ", 24 GB",
             25286672384,
             "device-query printout, 'NVIDIA GeForce RTX 3090', ECC off: 'Global Memory: 25286672384 bytes', 82 SMs, "
             "Jumperkables/cuda-benchmarking @76861cac 00_deviceQuery/README.md; on driver 12.6 another reports "
             "'24154 MBytes (25327697920 bytes)', thamada/nvidia-smi @b09ef139 gls/RTX3090_deviceQuery.py (the "
             "lower is kept)", sm_count=82),
    GpuModel("RTX 4060", ("4060", "GeForce RTX 4060", "NVIDIA GeForce RTX 4060"), 8 * GiB, 89, _SPEC + ", 8 GB", sm_count=24),
    GpuModel("RTX 4090", ("4090", "GeForce RTX 4090"), 24 * GiB, 89, _SPEC + ", 24 GB", 25386352640,
             f"{_DQ}, 'NVIDIA GeForce RTX 4090', driver 12.4, ECC off: '24210 MBytes (25386352640 bytes)', "
             "thamada/nvidia-smi @b09ef139 gls/RTX4090_deviceQuery.py", sm_count=128),
    GpuModel("RTX A6000", ("A6000", "NVIDIA RTX A6000"), 48 * GiB, 86, _SPEC + ", 48 GB", 47834660864,
             f"{_DQ}, 'NVIDIA RTX A6000' (9 cards), driver 12.4, ECC on: '45619 MBytes (47834660864 bytes)', (084) "
             "Multiprocessors, thamada/gls @ecc9fb58 gls/RTX_A6000_x9_deviceQuery.py (with ECC off a card reports "
             "more: 48790 MBytes)", sm_count=84),
    GpuModel("T4", ("Tesla T4",), 16 * GiB, 75, _SPEC + ", 16 GB", 15095 * MiB,
             "deviceQuery table, 'Tesla T4' on Colab, driver 12.4, ECC on: 'Global Memory | 15095 MBytes' "
             "(15095 to 15096 MiB; the lower end is kept), sylvia-ymlin/cuda-kernels-from-scratch README.md", sm_count=40),
    GpuModel("V100 16GB", ("V100-SXM2-16GB", "V100-PCIE-16GB"), 16 * GiB, 70, _SPEC + ", 16 GB", sm_count=80),
    GpuModel("V100 32GB", ("V100-SXM2-32GB", "V100-PCIE-32GB", "V100-DGXS-32GB"), 32 * GiB, 70, _SPEC + ", 32 GB",
             34084028416,
             "Kineto deviceProperties totalGlobalMem of 'Tesla V100-DGXS-32GB' device 0 (the recorded run's): "
             "34084028416 (devices 1-3 of the same box: 34087305216), pytorch/kineto @f329bb5f "
             "tb_plugin/samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz", sm_count=80),
    GpuModel("L4", (), 24 * GiB, 89, _SPEC + ", 24 GB", 23570219008,
             f"{_DQ}, 'NVIDIA L4', driver 12.4, ECC on: '22478 MBytes (23570219008 bytes)', "
             "thamada/nvidia-smi @b09ef139 gls/L4_deviceQuery.py", sm_count=58),
    GpuModel("A10", (), 24 * GiB, 86, _SPEC + ", 24 GB", 23609475072,
             "device-query printout, 'NVIDIA A10', driver 12.2: '21.99 GBytes (23609475072 bytes)', "
             "aalanwyr/face2cuda step2cuda/README.md (AWS's A10G is its own model: 80 SMs)", sm_count=72),
    GpuModel("A10G", ("NVIDIA A10G",), 24 * GiB, 86,
             _SPEC + ", 24 GB (AWS's A10 variant, 80 SMs; a torch printout 'total_memory=22587MB' was found in the "
             "code index without its repository, so it is not used)", sm_count=80),
    GpuModel("A40", ("NVIDIA A40",), 48 * GiB, 86, _SPEC + ", 48 GB", 47608692736,
             f"{_DQ}, 'NVIDIA A40', driver 12.4, ECC on: '45403 MBytes (47608692736 bytes)', (084) Multiprocessors, "
             "thamada/nvidia-smi @5f6b7728 nvsim/A40x10_deviceQuery.py", sm_count=84),
    GpuModel("A100 40GB", ("A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"), 40 * GiB, 80,
             _SPEC + ", 40 GB", 42298834944,
             f"{_DQ}, 'NVIDIA A100-SXM4-40GB', driver 12.2: '40339 MBytes (42298834944 bytes)', "
             "bottlerocket-os/bottlerocket pull request #3873 (no PCIe 40GB recording found)", sm_count=108),
    GpuModel("A100 80GB", ("A100-80GB", "A100-SXM4-80GB", "A100 80GB PCIe"), 80 * GiB, 80, _SPEC + ", 80 GB",
             81049 * MiB,
             "mixbench-cuda printout, 'NVIDIA A100 80GB PCIe', driver 12.3, ECC on: 'Total global mem: 81049 MB' "
             "(totalGlobalMem/1024/1024 as mixbench-cuda/lcutil.h prints it: 81049 to 81050 MiB, the lower end "
             "kept), ekondis/mixbench issue #47; the SXM4 card reports "
             "more: '81158 MBytes (85100068864 bytes)', thamada/nvidia-smi @b09ef139 gls/A100SXMx4_deviceQuery.py", sm_count=108),
    GpuModel("L40", ("NVIDIA L40",), 48 * GiB, 89, _SPEC + ", 48 GB", sm_count=142),
    GpuModel("L40S", ("NVIDIA L40S",), 48 * GiB, 89, _SPEC + ", 48 GB", 47803596800,
             f"{_DQ}, 'NVIDIA L40S', driver 12.4, ECC on: '45589 MBytes (47803596800 bytes)', "
             "(142) Multiprocessors, thamada/nvidia-smi @c768aedc nvsim/L40S_deviceQuery.py", sm_count=142),
    GpuModel("H100", ("H100 80GB", "H100-80GB", "H100 SXM", "H100 80GB HBM3"), 80 * GiB, 90, _SPEC + ", 80 GB",
             85018279936,
             "Kineto deviceProperties totalGlobalMem of 'NVIDIA H100 80GB HBM3' (SXM): 85018279936, "
             "AMD-AGI/TraceLens @f0bb9f37 tests/traces/h100/*.json.gz; on driver 12.7 the same card reports "
             "'81106 MBytes (85045477376 bytes)', thamada/nvidia-smi @03fbe6e6 nvsim/H100SXMx8_deviceQuery.py "
             "(H100 PCIe and H100 NVL are their own models)", sm_count=132),
    GpuModel("H100 PCIe", ("NVIDIA H100 PCIe",), 80 * GiB, 90,
             _SPEC + ", 80 GB (114 SMs; a torch printout 'total_memory=81008MB' was found in the code index without "
             "its repository, so it is not used)", sm_count=114),
    GpuModel("H100 NVL", ("NVIDIA H100 NVL",), 94 * GiB, 90, _SPEC + ", 94 GB", 99861594112,
             f"{_DQ}, 'NVIDIA H100 NVL', driver 12.4, ECC on: '95235 MBytes (99861594112 bytes)', (132) "
             "Multiprocessors, thamada/nvidia-smi @b09ef139 gls/H100NVLx2_deviceQuery.py", sm_count=132),
    GpuModel("H20", ("NVIDIA H20",), 96 * GiB, 90,
             _SPEC + ", 96 GB (78 SMs; torch printouts 'total_memory=97285MB' were found in the code index without "
             "their repository, so they are not used)", sm_count=78),
    # The card of torchtitan's benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton, "H100 GPU is
    # equipped with 96GB HBM2e"): no recording of what one reports to CUDA was found, so its label.
    GpuModel("H100 96GB", ("H100-96GB", "H100 96GB HBM2e", "H100 96GB HBM3"), 96 * GiB, 90,
             _SPEC + ", 96 GB (Grand Teton's H100, pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md)",
             sm_count=132),
    GpuModel("H200", ("H200 141GB",), 141 * GiB, 90, _SPEC + ", 141 GB (read as GiB: cards report 139.8 GiB to CUDA)",
             150114475704,
             "PyTorch's out-of-memory message on 'NVIDIA H200' cards: 'GPU 0 has a total capacity of 139.81 GiB' "
             "(two decimals: 139.805 GiB = 150114475704 B, the lower end, is kept), sungwon-chae/arxiv_confi "
             "@3906c481 etu_logging.md", sm_count=132),
    GpuModel("B200", ("NVIDIA B200",), 180 * GiB, 100,
             _SPEC + ", 180 GB (148 SMs; torch printouts 'total_memory=182631MB' and PyTorch out-of-memory messages "
             "'a total capacity of 178.35 GiB' were found in the code index without their repository, so they are "
             "not used)", sm_count=148),
)


def lowest_recorded_ratio() -> Fraction:
    """The least share of its label any recorded card reports (L4: ECC on GDDR6 takes 1/16 off)."""
    return min(Fraction(g.total_bytes, g.nominal_bytes) for g in GPUS if g.verified)


def proven_total_bytes(gpu: GpuModel) -> int:
    """The least memory a real card of ``gpu``'s model is shown to have.

    A recorded model: its recorded total. An unverified one: its label scaled by the lowest
    recorded/label ratio of the recorded models, since nothing here shows its cards do better.
    """
    if gpu.verified:
        return gpu.total_bytes
    ratio = lowest_recorded_ratio()
    return gpu.nominal_bytes * ratio.numerator // ratio.denominator


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


#: Names that stand for more than one model: ``find_gpu`` refuses them and lists the choices, so ``--gpu
#: A100`` never means the 40 GB card in one command and the 80 GB one (capture's default) in another.
AMBIGUOUS_NAMES: dict[str, tuple[str, ...]] = {
    "A100": ("A100 40GB", "A100 80GB"),
    "V100": ("V100 16GB", "V100 32GB"),
}


def find_gpu(name: str) -> GpuModel:
    """The GPU model named ``name`` (case, spaces and dashes ignored); ``AllocsimError`` lists the known ones.

    A name that stands for several models (``A100``: 40 GB or 80 GB) is refused with the choices; the
    same rule holds for every command, since each one asks here.
    """
    wanted = _key(name)
    if not wanted:                 # `--gpu ''`: no name at all, not an unknown one
        raise AllocsimError(f"--gpu needs a GPU name, got {name!r}; known: {', '.join(g.name for g in GPUS)} "
                            "(allocsim gpus)")
    for short, choices in AMBIGUOUS_NAMES.items():
        if wanted == _key(short) or wanted == _key("NVIDIA " + short) or wanted == _key("Tesla " + short):
            listed = " or ".join(f'--gpu "{c}"' for c in choices)
            raise AllocsimError(f"GPU {name!r} is ambiguous: say which card, {listed} (allocsim gpus)")
    for gpu in GPUS:
        if wanted in {_key(n) for n in (gpu.name, *gpu.aliases)}:
            return gpu
    raise AllocsimError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)} (allocsim gpus)")


def model_of_card(card_name: str) -> GpuModel | None:
    """The model whose name (or alias) is the longest found in a card's reported name ("NVIDIA H100 80GB HBM3")."""
    card = _key(card_name)
    best: tuple[int, GpuModel] | None = None
    for gpu in GPUS:
        for name in (gpu.name, *gpu.aliases):
            key = _key(name)
            if key and key in card and (best is None or len(key) > best[0]):
                best = (len(key), gpu)
    return best[1] if best else None


def recorded_device_check(gpu: GpuModel, device: int, recorded: dict[str, Any]) -> dict[str, Any]:
    """How ``gpu`` stands against the card a trace was recorded on (Kineto deviceProperties), with a sentence."""
    name, total = str(recorded.get("name") or ""), int(recorded["total_bytes"])
    same_model = model_of_card(name) is gpu
    card = f"'{name}'" if name else "an unnamed card"
    if not same_model:
        note = (f"the trace was recorded on a different card: {card} (device {device}, {format_bytes(total)} "
                f"totalGlobalMem), not {gpu.name}")
    elif total == gpu.total_bytes:
        note = f"{gpu.name}'s memory is what the recording's {card} reported (device {device} totalGlobalMem)"
    else:
        note = (f"the recording's {card} reported {format_bytes(total)} ({total:,} B, device {device} "
                f"totalGlobalMem) where {gpu.name} here has {format_bytes(gpu.total_bytes)} "
                f"({gpu.total_bytes:,} B): driver version and ECC change the total; give --capacity for that card")
    return {"device": device, "name": name, "total_bytes": total, "same_model": same_model,
            "total_matches": same_model and total == gpu.total_bytes, "note": note}


def workspace_bytes(gpu: GpuModel) -> int:
    """cuBLAS workspaces a training step keeps: one segment per handle, rounded as the allocator rounds."""
    one = -(-gpu.cublas_workspace_bytes // _ROUND_LARGE) * _ROUND_LARGE
    return TRAINING_CUBLAS_HANDLES * one


def terms_of(gpu: GpuModel, reserved_peak_bytes: int, cudnn: bool = False, capture: bool = False) -> list:
    """The unknown terms (``gpu_ranges.Term``) of a run on ``gpu`` that reserves ``reserved_peak_bytes``.

    ``cudnn``: the trace runs cuDNN convolutions (``gpu_ranges.runs_cudnn``), which adds cuDNN's term;
    ``capture``: the trace is a CPU capture (``gpu_ranges.is_capture``), whose replay does not know
    where the driver places segments: one that runs no cuDNN gets the placement term.
    """
    from .gpu_ranges import context_term, cudnn_term, placement_term

    terms = [context_term(gpu.context_bytes, gpu.local_bytes, CONTEXT0_BYTES_FITTED + gpu.local_bytes)]
    if cudnn:
        terms.append(cudnn_term(reserved_peak_bytes))
    elif capture:
        terms.append(placement_term(reserved_peak_bytes))
    return terms


#: The ends of the unknown terms' ranges a capacity or an estimate can be taken at.
ENDS = ("low", "point", "high")


def allocator_capacity(gpu: GpuModel, workspaces_in_trace: bool = False, *, end: str = "point",
                       cudnn: bool = False, capture: bool = False) -> int:
    """The memory left to the caching allocator's tensors once context, libraries and workspaces are in.

    ``workspaces_in_trace``: the trace holds its cuBLAS workspaces itself (a GPU recording, a
    current capture), so they are the allocator's to place, not taken off beforehand. ``end``: the
    unknown terms (``gpu_ranges``) at their point estimates, or at the low or high end of their
    ranges; ``cudnn``: the trace runs cuDNN convolutions, whose term grows with the reserved peak
    (so the capacity is what leaves room for the peak and its share); ``capture``: a capture that runs
    no cuDNN, whose placement term grows with the reserved peak too.
    """
    from .gpu_ranges import CUDNN_BYTES_FITTED, CUDNN_KERNELS_HIGH_BYTES, CUDNN_KERNELS_LOW_BYTES, CUDNN_SHARE_HIGH, \
        CUDNN_SHARE_LOW, PLACEMENT_SHARE_HIGH, PLACEMENT_SHARE_LOW

    if end not in ENDS:
        raise ValueError(f"end must be one of {ENDS}, got {end!r}")
    taken = 0 if workspaces_in_trace else workspace_bytes(gpu)
    context = terms_of(gpu, 0)[0]
    room = (gpu.total_bytes - gpu.library_bytes - taken
            - {"low": context.low_bytes, "point": context.bytes, "high": context.high_bytes}[end])
    if not cudnn:
        if not capture:
            return int(room)
        share = {"low": min(0.0, PLACEMENT_SHARE_LOW), "point": 0.0, "high": max(0.0, PLACEMENT_SHARE_HIGH)}[end]
        return int(room / (1.0 + share))
    share = {"low": min(0.0, CUDNN_SHARE_LOW), "point": 0.0, "high": max(0.0, CUDNN_SHARE_HIGH)}[end]
    kernels = {"low": min(CUDNN_BYTES_FITTED, CUDNN_KERNELS_LOW_BYTES), "point": CUDNN_BYTES_FITTED,
               "high": max(CUDNN_BYTES_FITTED, CUDNN_KERNELS_HIGH_BYTES)}[end]
    return int((room - kernels) / (1.0 + share))


def gpu_estimate(gpu: GpuModel, reserved_peak_bytes: int, workspaces_in_trace: bool = False, *,
                 cudnn: bool = False, capture: bool = False, fits_low: bool | None = None,
                 fits_point: bool | None = None, fits_high: bool | None = None) -> dict[str, Any]:
    """The GPU memory the run needs at its peak, part by part, as a point and a range, and whether it fits ``gpu``.

    ``total_bytes`` is the point estimate; ``total_low_bytes`` / ``total_high_bytes`` take every
    unknown term (``unknown_terms``: each its own ``bytes``, ``low_bytes``, ``high_bytes`` and
    source) at the low / high end of its range. ``verdict`` is "fits" (the high end fits: ``fits``
    is True only then), "fits_unless" (the low end fits, the high end does not; ``deciding_terms``
    name the terms whose range crosses the card's memory and how much each may take) or
    "does_not_fit". ``fits_*``: replays at each end's ``allocator_capacity`` (the allocator frees
    its cache and retries as PyTorch does), which decide where given.
    ``fits_proven`` is False when the run fits only in memory a real card is not shown to have (an
    unverified model's label above ``proven_total_bytes``); ``caveat`` then says so in one sentence.
    ``workspaces_in_trace``: the reserved peak already holds the cuBLAS workspaces (not added again).
    """
    from .gpu_ranges import judge

    workspaces = 0 if workspaces_in_trace else workspace_bytes(gpu)
    terms = terms_of(gpu, reserved_peak_bytes, cudnn, capture)
    fixed = reserved_peak_bytes + workspaces + gpu.library_bytes
    judged = judge(gpu.total_bytes, fixed, terms, fits_low=fits_low, fits_point=fits_point, fits_high=fits_high)
    fits = judged["verdict"] == "fits"
    proven = proven_total_bytes(gpu)
    # a recorded total is proven; a label only up to what recorded cards show of theirs
    fits_proven = fits and (gpu.verified or judged["total_high_bytes"] <= proven)
    cudnn_term = next((t for t in terms if t.key == "cudnn_bytes"), None)
    return {
        "gpu": gpu.name,
        "gpu_total_bytes": gpu.total_bytes,
        "gpu_total_verified": gpu.verified,
        "gpu_proven_total_bytes": proven,
        "reserved_peak_bytes": int(reserved_peak_bytes),
        "workspace_bytes": workspaces,
        "library_bytes": gpu.library_bytes,
        "context_bytes": gpu.context_bytes,
        "cudnn_bytes": cudnn_term.bytes if cudnn_term is not None else 0,
        "total_bytes": judged["total_bytes"],
        "total_low_bytes": judged["total_low_bytes"],
        "total_high_bytes": judged["total_high_bytes"],
        "unknown_terms": {t.key: t.to_dict() for t in terms},
        "verdict": judged["verdict"],
        "deciding_terms": judged["deciding_terms"],
        "fits": fits,
        "fits_low": judged["fits_low"],
        "fits_point": judged["fits_point"],
        "fits_high": judged["fits_high"],
        "fits_proven": fits_proven,
        "caveat": None if fits_proven or not fits else unproven_caveat(gpu, proven),
        "sources": gpu.sources(),
    }


def unproven_caveat(gpu: GpuModel, proven_bytes: int) -> str:
    """The sentence a fit on an unverified model's label carries: how little a real card may have."""
    ratio = lowest_recorded_ratio()
    return (f"not proven: {gpu.name}'s {format_bytes(gpu.total_bytes)} is the product label, no real card's "
            f"total was found, and recorded cards report as little as {float(ratio):.2%} of theirs, so a real "
            f"{gpu.name} may have {format_bytes(proven_bytes)} (allocsim gpus)")


def label_note(gpu: GpuModel) -> str | None:
    """For an unverified model, the sentence a capacity taken from its label carries (None when recorded)."""
    if gpu.verified:
        return None
    proven = proven_total_bytes(gpu) - (gpu.total_bytes - allocator_capacity(gpu))
    return (f"{gpu.name}'s {format_bytes(gpu.total_bytes)} is the product label, no real card's total was found: "
            f"a reserved peak above {format_bytes(proven)} is not proven to fit a real card (allocsim gpus)")


def gpu_rows() -> list[dict[str, Any]]:
    """Every GPU model as a JSON-ready row (for ``allocsim gpus``)."""
    return [{"name": g.name, "aliases": list(g.aliases), "total_bytes": g.total_bytes,
             "total_verified": g.verified, "nominal_bytes": g.nominal_bytes,
             "proven_total_bytes": proven_total_bytes(g), "sm": g.sm,
             "context_bytes": g.context_bytes, "context_low_bytes": terms_of(g, 0)[0].low_bytes,
             "context_high_bytes": terms_of(g, 0)[0].high_bytes, "library_bytes": g.library_bytes,
             "workspace_bytes": workspace_bytes(g), "allocator_capacity_bytes": allocator_capacity(g),
             "sources": g.sources()} for g in GPUS]
