"""NCCL's own memory on each GPU, per rank: call ``nccl_term(job)`` for ``(low, point, high, parts)`` in bytes.

What a rank's NCCL communicators allocate on the card outside PyTorch's caching allocator, modelled
from NCCL's sources (2.20 to 2.30: the versions torch 2.4 to 2.15 wheels bundle) term by term:

* ``device_structures``: every communicator's device-side structures (``devCommAndChans``, and per
  channel the peer tables and ring ranks of ``initChannel``), each its own cuMem allocation rounded to
  the 2 MiB granularity when ``NCCL_CUMEM_ENABLE`` is on (the default since 2.19);
* ``ring`` / ``tree``: a send and a receive connection per channel, each with its LL, LL128 and
  Simple buffers (``NCCL_LL_BUFFSIZE``, ``NCCL_LL128_BUFFSIZE``, ``NCCL_BUFFSIZE``) in device memory
  for the P2P transport (NVLink, PCIe peer access) and the network with GPUDirect RDMA, in host
  memory for the SHM transport;
* ``nvls``: NVLink SHARP's unicast buffer and credits on NVSwitch systems (Hopper and later);
* ``p2p``: send/recv and all-to-all connections, ``p2pnChannelsPerPeer`` channels per peer.

Where the topology decides (the number of channels off NVSwitch, which algorithm NCCL's tuner picks
once connections are made lazily, the transport of a PCIe pair), the low and high ends say so. Every
rule and number is in docs/nccl.md with its source file. The input is a plain ``NcclJob`` (a capture
fills it; ``job_from_manifest`` reads a capture folder's ``manifest.json``); ``NCCL_*`` variables come
from ``env`` (the process environment by default) and are bounded as NCCL bounds them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Mapping

from .units import MiB, align_up

# --- NCCL constants (src/include/device.h, src/include/comm.h, src/init.cc; equal in 2.20.5 and 2.30.7) ---
NCCL_STEPS = 8
#: DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS x sizeof(ncclLLFifoLine) (16).
LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16
#: DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x 8.
LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8
#: DEFAULT_BUFFSIZE (1 << 22): the Simple protocol's buffer, ``NCCL_BUFFSIZE``.
SIMPLE_BUFFSIZE = 1 << 22
#: sizeof(ncclSendMem) and sizeof(ncclRecvMem): unions padded to MEM_ALIGN (4096).
CONN_MEM_BYTES = 4096
#: CUDA_IPC_MIN: P2P buffers are rounded up to it (ALIGN_SIZE in p2pSendSetup / p2pRecvSetup).
CUDA_IPC_MIN = 2 * MiB
#: cuMemGetAllocationGranularity(MINIMUM) for device memory: every cuMem allocation is a multiple of it.
CUMEM_GRANULARITY = 2 * MiB
#: NVLS_MEM_ALIGN_SIZE (1 << 21): the least a multicast allocation is rounded to (see docs/nccl.md).
NVLS_MEM_ALIGN = 1 << 21
#: sizeof(ncclConnInfo) on x86-64, counted from its fields in 2.29 (pointers, ints, the net device
#: handle): it sizes the device peer tables, which stay under one 2 MiB granule below ~3,000 ranks.
CONN_INFO_BYTES = 152
NVLS_CHUNKSIZE = 128 * 1024            # NCCL_NVLS_CHUNKSIZE default (2.21 and later)
NVLS_CHANNELS_SM90 = 16                # NVLS_NCHANNELS_SM90 / NCCL_NVLS_NCHANNELS default
NVLS_CHANNELS_SM100 = 32               # NVLS_NCHANNELS_SM100 (several nodes)
NVLS_CHANNELS_SM100_ONE_NODE = 24      # NVLS_NCHANNELS_SM100_NVL (2.27 and later)
NCCL_MAX_NVLS_ARITY = 32
NCCL_SHARED_STEPS = 16                 # net.cc: shared p2p network buffers are nChannels x 16 x chunk
P2P_NET_CHUNKSIZE = 1 << 17
P2P_PCI_CHUNKSIZE = 1 << 17
P2P_NVL_CHUNKSIZE = 1 << 19

#: NVLink bandwidth per link NCCL assumes, GB/s (src/graph/topo.h SM*_NVLINK_BW), by compute capability.
NVLINK_BW = {70: 20.0, 80: 20.0, 86: 12.0, 89: 12.0, 90: 20.6, 100: 40.1}
#: The ring search's speeds, GB/s (src/graph/search.cc speedArrayIntra / sm90SpeedArrayIntra /
#: sm100SpeedArrayIntra; the sm90 list gained 11.0 in 2.21).
SPEEDS_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEEDS_INTRA_SM90 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SPEEDS_INTRA_SM100 = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
#: NVLinks from each GPU to the NVSwitches (NVIDIA product specifications: 18 x 50 GB/s = 900 GB/s on
#: H100/H200 SXM, 12 x 50 = 600 GB/s on A100 SXM, 6 on V100 SXM2 with NVSwitch, 8 on H800).
NVLINKS = {"H100": 18, "H200": 18, "H800": 8, "A100 40GB": 12, "A100 80GB": 12, "V100 16GB": 6, "V100 32GB": 6}

#: The NCCL each torch wheel on PyPI requires (``nvidia-nccl-cu12`` / ``-cu13``, measured with ``pip
#: install --dry-run --report`` on the manylinux x86_64 wheels; docs/nccl.md has the command).
TORCH_NCCL = {(2, 4): (2, 20, 5), (2, 5): (2, 21, 5), (2, 6): (2, 21, 5), (2, 7): (2, 26, 2),
              (2, 8): (2, 27, 3), (2, 9): (2, 27, 5), (2, 10): (2, 27, 5), (2, 11): (2, 28, 9),
              (2, 12): (2, 29, 7), (2, 13): (2, 29, 7), (2, 14): (2, 30, 7), (2, 15): (2, 30, 7)}
DEFAULT_NCCL = TORCH_NCCL[(2, 13)]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv", "all_to_all")
_RING = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})
_NVLS = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
_P2P = frozenset({"send_recv", "all_to_all"})
INTERCONNECTS = ("nvswitch", "pcie", "pcie-shm")

#: Bounds on what a job description (a manifest, a caller) may ask for: beyond them it is refused.
MAX_WORLD_SIZE = 1 << 20
MAX_COMMUNICATORS = 4096
#: NCCL parses its variables as 64-bit integers; sizes past this are refused as not a real setting.
MAX_ENV_BYTES = 1 << 40
MAX_MANIFEST_BYTES = 64 << 20


class NcclInputError(ValueError):
    """A job description NCCL's model cannot take (the message says which field and why)."""


@dataclasses.dataclass(frozen=True)
class Communicator:
    """One NCCL communicator this rank is a member of: its size, the nodes it spans, what it runs.

    ``count``: how many such communicators the rank holds (PyTorch makes one per process group and
    device, and one per peer pair for unbatched ``send``/``recv``). ``peers``: the send/recv peers
    of this rank (a pipeline stage: 2; None: 2, or 1 in a communicator of 2).
    """

    ranks: int
    collectives: frozenset[str] = frozenset({"all_reduce"})
    nodes: int = 1
    count: int = 1
    peers: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "collectives", frozenset(self.collectives))


@dataclasses.dataclass(frozen=True)
class NcclJob:
    """What NCCL's memory depends on: the communicators one rank holds, the card, the interconnect, NCCL, env.

    ``interconnect``: ``nvswitch`` (SXM boards), ``pcie`` (PCIe with peer access), ``pcie-shm`` (PCIe
    without it: NCCL goes through host memory). ``gpu``: a name from ``allocsim.gpus`` (or ``H800``).
    ``nccl_version``: (major, minor[, patch]); None: the one torch 2.13's wheel bundles.
    ``env``: ``NCCL_*`` variables; None: the process environment.
    """

    world_size: int
    communicators: tuple[Communicator, ...]
    gpu: str = "H100"
    interconnect: str = "nvswitch"
    nccl_version: tuple[int, ...] | None = None
    env: Mapping[str, str] | None = None


@dataclasses.dataclass
class _Settings:
    """The NCCL settings that size memory, from the version and the environment."""

    version: tuple[int, int]
    sm: int
    nvlinks: int
    buffs: tuple[int, int, int]          # LL, LL128, Simple
    cumem: bool
    nvls_enable: bool
    nvls_chunk: int
    nvls_channels_env: int | None
    runtime_connect: bool
    min_channels: int
    max_channels: int
    p2p_disable: bool
    read: bool
    gdr: bool
    algos: frozenset[str] | None
    p2p_net_chunk: int
    notes: list[str]

    @property
    def maxchannels(self) -> int:
        """MAXCHANNELS: 32 before NCCL 2.25, 64 since (src/include/device.h)."""
        return 64 if self.version >= (2, 25) else 32


def _env_int(env: Mapping[str, str], name: str, default: int | None, low: int, high: int,
             notes: list[str]) -> int | None:
    """An integer NCCL variable as ncclParam reads it; out of [low, high] or unparsable: the default, noted."""
    text = env.get(name)
    if text is None:
        return default
    try:
        value = int(str(text).strip()[:32], 0)
    except ValueError:
        notes.append(f"{name}={str(text)[:40]!r} is not an integer: NCCL's default kept")
        return default
    if not low <= value <= high:
        notes.append(f"{name}={value} is outside [{low}, {high}]: NCCL's default kept")
        return default
    return value


def _version(job: NcclJob) -> tuple[int, int]:
    version = tuple(job.nccl_version or DEFAULT_NCCL)
    if len(version) < 2 or not all(isinstance(v, int) and 0 <= v < 1000 for v in version):
        raise NcclInputError(f"nccl_version {job.nccl_version!r} is not (major, minor[, patch])")
    if version[:2] < (2, 18) or version[:2] > (2, 30):
        raise NcclInputError(f"NCCL {version[0]}.{version[1]} is outside the modelled 2.18 to 2.30")
    return version[0], version[1]


def _settings(job: NcclJob, env: Mapping[str, str]) -> _Settings:
    from .errors import AllocsimError
    from .gpus import find_gpu

    notes: list[str] = []
    version = _version(job)
    if str(job.gpu).upper() == "H800":
        sm, card = 90, "H800"
    else:
        try:
            model = find_gpu(str(job.gpu)[:100])
        except AllocsimError as exc:
            raise NcclInputError(str(exc)) from None
        sm, card = model.sm, model.name
    if job.interconnect == "nvswitch" and card not in NVLINKS:
        notes.append(f"{card} has no NVSwitch board: its channels are counted as on PCIe")
    buffs = (_env_int(env, "NCCL_LL_BUFFSIZE", LL_BUFFSIZE, 1, MAX_ENV_BYTES, notes),
             _env_int(env, "NCCL_LL128_BUFFSIZE", LL128_BUFFSIZE, 1, MAX_ENV_BYTES, notes),
             _env_int(env, "NCCL_BUFFSIZE", SIMPLE_BUFFSIZE, 1, MAX_ENV_BYTES, notes))
    # NCCL_CUMEM_ENABLE: -2 auto (on where the driver supports it: every driver these wheels need).
    cumem = _env_int(env, "NCCL_CUMEM_ENABLE", -2, -2, 1, notes)
    cumem_on = cumem != 0 and (cumem == 1 or version >= (2, 19))
    maxch = 64 if version >= (2, 25) else 32
    max_nch = _env_int(env, "NCCL_MAX_NCHANNELS", None, 1, 1 << 20, notes)
    if max_nch is None:
        max_nch = _env_int(env, "NCCL_MAX_NRINGS", maxch, 1, 1 << 20, notes)
    max_ctas = _env_int(env, "NCCL_MAX_CTAS", maxch, 1, 1 << 20, notes)
    min_nch = _env_int(env, "NCCL_MIN_NCHANNELS", None, 0, 1 << 20, notes)
    if min_nch is None:
        min_nch = _env_int(env, "NCCL_MIN_NRINGS", 0, 0, 1 << 20, notes)
    min_ctas = _env_int(env, "NCCL_MIN_CTAS", 0, 1, 1 << 20, notes)
    read_env = _env_int(env, "NCCL_P2P_READ_ENABLE", None, 0, 1, notes)
    # ncclTopoCheckP2p: P2P read by default only between two sm80 GPUs over NVLink.
    read = bool(read_env) if read_env is not None else (sm == 80 and job.interconnect == "nvswitch")
    algos = None
    if env.get("NCCL_ALGO"):
        text = str(env["NCCL_ALGO"])[:200].lower()
        if not text.startswith("^"):
            algos = frozenset(a.strip() for a in text.split(",") if a.strip())
        else:
            algos = frozenset({"ring", "tree", "nvls", "nvlstree", "pat"}) - \
                frozenset(a.strip() for a in text[1:].split(","))
    gdr_level = str(env.get("NCCL_NET_GDR_LEVEL", ""))[:20].upper()
    return _Settings(
        version=version, sm=sm, nvlinks=NVLINKS.get(card, 0), buffs=buffs, cumem=cumem_on,
        nvls_enable=_env_int(env, "NCCL_NVLS_ENABLE", 2, 0, 2, notes) != 0,
        nvls_chunk=_env_int(env, "NCCL_NVLS_CHUNKSIZE", NVLS_CHUNKSIZE, 1, MAX_ENV_BYTES, notes),
        nvls_channels_env=(_env_int(env, "NCCL_NVLS_NCHANNELS", None, 1, 64, notes)
                           if version < (2, 27) else None),
        runtime_connect=version >= (2, 22) and _env_int(env, "NCCL_RUNTIME_CONNECT", 1, 0, 1, notes) == 1,
        min_channels=max(min_nch, min_ctas), max_channels=min(max_nch, max_ctas, maxch),
        p2p_disable=_env_int(env, "NCCL_P2P_DISABLE", 0, 0, 1, notes) == 1,
        read=read, gdr=gdr_level not in ("LOC", "0"),
        algos=algos,
        p2p_net_chunk=_env_int(env, "NCCL_P2P_NET_CHUNKSIZE", P2P_NET_CHUNKSIZE, 1, MAX_ENV_BYTES, notes),
        notes=notes)


def _alloc(size_bytes: int, s: _Settings) -> int:
    """One device allocation as NCCL makes it: cuMem rounds to the granularity, cudaMalloc to 512 B."""
    if size_bytes <= 0:
        return 0
    return align_up(size_bytes, CUMEM_GRANULARITY if s.cumem else 512)


def _p2p_pair_bytes(s: _Settings) -> int:
    """A send and a receive connection through the P2P transport (p2pSendSetup + p2pRecvSetup, p2p.cc)."""
    ll, ll128, simple = s.buffs
    recv = CONN_MEM_BYTES + ll + ll128 + (0 if s.read else simple)
    send = CONN_MEM_BYTES + (simple if s.read else 0)
    return _alloc(align_up(recv, CUDA_IPC_MIN), s) + _alloc(align_up(send, CUDA_IPC_MIN), s)


def _net_pair_bytes(s: _Settings) -> int:
    """A send and a receive connection through the network with GPUDirect RDMA (net.cc send/recvProxyConnect).

    The sender keeps LL128 and Simple on the device (LL in host memory), the receiver all three; the
    ncclSendMem/ncclRecvMem heads stay in host memory. Without GDR everything is host memory.
    """
    if not s.gdr:
        return 0
    ll, ll128, simple = s.buffs
    return _alloc(ll128 + simple, s) + _alloc(ll + ll128 + simple, s)


def _intra_pair_bytes(s: _Settings, interconnect: str) -> tuple[int, int]:
    """(low, high) bytes of one intra-node connection pair: SHM keeps its buffers in host memory."""
    if interconnect == "pcie-shm" or s.p2p_disable:
        return 0, 0
    pair = _p2p_pair_bytes(s)
    if interconnect == "pcie":
        return 0, pair        # PCIe peer access may be off (ACS, virtual machines): then SHM
    return pair, pair


def _ring_search_channels(nvlinks: int, sm: int, max_search: int) -> int:
    """Ring channels NCCL's search finds on an NVSwitch board (ncclTopoCompute, search.cc), doubled as NCCL doubles.

    Each channel takes ``speed`` GB/s of the GPU's NVSwitch bandwidth (links x per-link bandwidth);
    the search keeps the best channels x speed found while lowering the speed (not below half the
    best speed), then ncclTopoDupChannels doubles the channels (not on sm > 80 below 50 GB/s with more
    than 4 channels). ncclTopoPostset doubles them again (connect.cc).
    """
    link_bw = nvlinks * NVLINK_BW.get(sm, 20.0)
    speeds = SPEEDS_INTRA_SM100 if sm >= 100 else SPEEDS_INTRA_SM90 if sm >= 90 else SPEEDS_INTRA
    best: tuple[int, float] | None = None
    for speed in speeds:
        if speed > link_bw:
            continue
        if best is not None and speed / best[1] <= 0.49:
            break
        channels = min(max_search, int(link_bw / speed + 1e-6))
        if channels and (best is None or channels * speed > best[0] * best[1] + 1e-6):
            best = (channels, speed)
        if best and (best[0] * best[1] >= link_bw - 1e-6 or best[0] == max_search):
            break
    if best is None:
        return 1
    channels, speed = best
    if speed >= 25.0 and not (sm > 80 and speed < 50.0 and channels > 4):
        channels = min(2 * channels, max_search)
    return channels


def _pow2_up(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def _channels(comm: Communicator, job: NcclJob, s: _Settings) -> tuple[tuple[int, int, int], str]:
    """Collective channels (low, point, high) for this communicator and where the figure comes from."""
    maxch = s.maxchannels
    if comm.nodes > 1:
        # Topology (NICs per GPU, PXN) decides: NCCL_DEBUG logs of 8-GPU H100 nodes show 8 and 16.
        raw, source = (8, 16, 32), "several nodes: 8 to 32 channels as NICs decide (docs/nccl.md, logs cited)"
    elif job.interconnect == "nvswitch" and s.nvlinks:
        n = 2 * _ring_search_channels(s.nvlinks, s.sm, maxch // 2)
        raw, source = (n, n, n), f"ring search on {s.nvlinks} NVLinks x {NVLINK_BW.get(s.sm, 20.0)} GB/s, doubled"
    else:
        raw, source = (2, 2, 4), "PCIe: 2 channels (4 where one switch holds every GPU)"
    clamp = tuple(max(s.min_channels, min(min(maxch, c), s.max_channels)) for c in raw)
    return (min(clamp[0], maxch), min(clamp[1], maxch), min(clamp[2], maxch)), source


def _p2p_channels(coll: int, comm: Communicator, job: NcclJob, s: _Settings) -> tuple[int, int]:
    """(p2pnChannels, p2pnChannelsPerPeer) as ncclTopoComputeP2pChannels computes them (graph/paths.cc)."""
    p2p_n = _pow2_up(min(coll, s.maxchannels))
    if comm.nodes > 1:
        per_peer = 2                       # ncclTopoGetNchannels: network peers, 2 unless NICs say more
    elif job.interconnect == "nvswitch" and s.nvlinks:
        per_peer = 2 * max(1, s.nvlinks)   # 2 x path bandwidth / per-link bandwidth
    else:
        per_peer = 2
    return p2p_n, min(p2p_n, _pow2_up(per_peer))


def _nvls_bytes(comm: Communicator, job: NcclJob, s: _Settings, local: int) -> tuple[int, str]:
    """Unicast buffer, credits and device peers NVLS allocates per rank (transport/nvls.cc), by NCCL version."""
    if s.sm >= 100:
        channels = NVLS_CHANNELS_SM100 if comm.nodes > 1 or s.version < (2, 27) else NVLS_CHANNELS_SM100_ONE_NODE
    else:
        channels = NVLS_CHANNELS_SM90
    if s.nvls_channels_env is not None:
        channels = s.nvls_channels_env
    channels = max(s.min_channels, min(s.max_channels, channels))
    heads = min(NCCL_MAX_NVLS_ARITY, local)
    step = s.nvls_chunk * NCCL_STEPS
    if s.version <= (2, 20):
        # 2.20: buffSize = NCCL_BUFFSIZE, plus a 2 MiB credit slot per buffer, aligned to the multicast granularity
        total = align_up(channels * 2 * (s.buffs[2] + NVLS_MEM_ALIGN) * heads, NVLS_MEM_ALIGN)
        how = f"{channels} ch x 2 x (NCCL_BUFFSIZE + 2 MiB) x {heads} heads"
    elif s.version <= (2, 21):
        total = align_up(channels * 2 * (step + NVLS_MEM_ALIGN) * heads, NVLS_MEM_ALIGN)
        how = f"{channels} ch x 2 x (8 x NVLS_CHUNKSIZE + 2 MiB) x {heads} heads"
    else:
        credit = 16 if s.version < (2, 24) else 64
        total = (align_up(channels * 2 * step * heads, NVLS_MEM_ALIGN)
                 + align_up(channels * 2 * credit * heads, NVLS_MEM_ALIGN))
        how = f"{channels} ch x 2 x 8 x NVLS_CHUNKSIZE x {heads} heads + credits"
    # initNvlsChannel: one device allocation of the NVLS peers per NVLS channel.
    total += channels * _alloc(local * 2 * 2 * CONN_INFO_BYTES, s)
    return total, how


def _communicator_parts(comm: Communicator, job: NcclJob, s: _Settings) -> list[dict[str, Any]]:
    """The named terms (low, point, high bytes) one communicator costs this rank."""
    parts: list[dict[str, Any]] = []
    n, count = comm.ranks, comm.count
    local = max(1, -(-n // comm.nodes))
    label = comm.name or f"{n} ranks"

    def add(term: str, low: int, point: int, high: int, source: str) -> None:
        parts.append({"communicator": label, "term": term, "count": count, "low_bytes": low * count,
                      "point_bytes": point * count, "high_bytes": high * count, "source": source})

    (c_low, c_point, c_high), channel_source = _channels(comm, job, s)
    p2p_point = _p2p_channels(c_point, comm, job, s)
    p2p_high = _p2p_channels(c_high, comm, job, s)
    p2p_low = _p2p_channels(c_low, comm, job, s)
    # initChannel: 3 allocations per channel (devPeers shared, devPeers, devRingUserRanks) for the
    # collective channels and the extra p2p channels; devCommAndChans (+ rankToLocalRank since 2.24).
    peer_bytes = 2 * 2 * CONN_INFO_BYTES           # ncclDevChannelPeer: send/recv x NCCL_MAX_CONNS x ncclConnInfo
    per_channel = (_alloc(n * peer_bytes, s) + _alloc((n + 1 + local) * 8, s) + _alloc(n * 4, s))
    comm_allocs = _alloc(4096, s) + (_alloc(n * 4, s) if s.version >= (2, 24) else 0)
    add("device_structures", comm_allocs + per_channel * max(c_low, p2p_low[0]),
        comm_allocs + per_channel * max(c_point, p2p_point[0]),
        comm_allocs + per_channel * max(c_high, p2p_high[0]),
        f"init.cc devCommSetup, channel.cc initChannel: 3 allocations x max(coll, p2p) channels; {channel_source}")
    if n == 1:
        return parts
    intra_low, intra_high = _intra_pair_bytes(s, job.interconnect)
    net = _net_pair_bytes(s)
    # NCCL_ALGO without Ring: with lazy connection no ring buffers; before 2.22 rings connect at init anyway.
    ring_used = s.algos is None or "ring" in s.algos or not s.runtime_connect
    if comm.collectives & _RING and ring_used:
        if comm.nodes > 1:
            net_low = c_low // local
            net_high = -(-c_high // local)
            net_point = -(-c_point // local)
            low = net_low * net + (c_low - net_low) * intra_low
            point = net_point * net + (c_point - net_point) * intra_high
            high = net_high * net + (c_high - net_high) * intra_high
        else:
            low, point, high = c_low * intra_low, c_point * intra_high, c_high * intra_high
        add("ring", low, point, high,
            "p2p.cc p2pSendSetup/p2pRecvSetup, net.cc: one send + one receive connection per channel")
    if "all_reduce" in comm.collectives and (s.algos is None or "tree" in s.algos):
        # Tree: one more connection pair per channel where tree neighbours differ from ring ones,
        # two at most (parent and child); with lazy connection only when the tuner picks Tree.
        pair_high = max(intra_high, net if comm.nodes > 1 else 0)
        if s.runtime_connect:
            # several nodes: Tree is picked for all-reduce; its chain in a node follows the ring, the
            # node-crossing edges (this rank on 1/local of the channels) are network pairs
            point = -(-c_point // local) * net if comm.nodes > 1 else 0
            add("tree", 0, point, 2 * c_high * pair_high,
                "enqueue.cc: Tree connected at its first use (NCCL >= 2.22); 0 to 2 pairs per channel")
        else:
            add("tree", c_low * intra_low, c_point * intra_high, 2 * c_high * pair_high,
                "init.cc: Tree connected at init before NCCL 2.22; 1 to 2 pairs per channel")
    nvls_possible = (job.interconnect == "nvswitch" and s.sm >= 90 and s.nvls_enable and local >= 2
                     and s.cumem and (s.algos is None or s.algos & {"nvls", "nvlstree"}))
    if comm.collectives & _NVLS and nvls_possible:
        nvls, how = _nvls_bytes(comm, job, s, local)
        low = 0 if s.runtime_connect else nvls
        add("nvls", low, nvls, nvls,
            f"transport/nvls.cc ncclNvlsBufferSetup: {how}"
            + ("; set up at the first NVLS collective (NCCL >= 2.22)" if s.runtime_connect else "; set up at init"))
    if comm.collectives & _P2P:
        a2a = "all_to_all" in comm.collectives
        local_peers = (local - 1) if a2a else (comm.peers if comm.peers is not None else min(2, n - 1))
        remote_peers = (n - local) if a2a else 0
        if comm.nodes > 1 and not a2a:
            local_peers, remote_peers = 0, (comm.peers if comm.peers is not None else min(2, n - 1))
        local_peers = max(0, min(local_peers, n - 1))
        remote_peers = max(0, min(remote_peers, n - 1))
        _, per_peer_point = p2p_point
        _, per_peer_low = p2p_low
        _, per_peer_high = p2p_high
        shared = 0
        if remote_peers and s.gdr:
            chunk = min(s.p2p_net_chunk, s.buffs[2] // NCCL_STEPS)
            shared = 2 * _alloc(p2p_point[0] * NCCL_SHARED_STEPS * chunk, s)
        add("p2p", local_peers * per_peer_low * intra_low + (shared if remote_peers else 0),
            local_peers * per_peer_point * intra_high + shared,
            local_peers * per_peer_high * intra_high + shared,
            f"enqueue.cc p2pTaskAppend: {local_peers} NVLink/PCIe peer(s) x p2pnChannelsPerPeer "
            f"({per_peer_point}) x a send + receive pair; network peers share 2 buffers of p2pnChannels x 16 "
            "x NCCL_P2P_NET_CHUNKSIZE (net.cc sharedNetBuffersInit)")
    return parts


def _check_job(job: NcclJob) -> None:
    if isinstance(job.world_size, bool) or not isinstance(job.world_size, int) or not 1 <= job.world_size <= MAX_WORLD_SIZE:
        raise NcclInputError(f"world_size {job.world_size!r} is not a whole number in [1, {MAX_WORLD_SIZE}]")
    if job.interconnect not in INTERCONNECTS:
        raise NcclInputError(f"interconnect {job.interconnect!r} is not one of {', '.join(INTERCONNECTS)}")
    if len(job.communicators) > MAX_COMMUNICATORS:
        raise NcclInputError(f"{len(job.communicators)} communicators is more than {MAX_COMMUNICATORS}")
    for comm in job.communicators:
        for name, value, high in (("ranks", comm.ranks, job.world_size), ("nodes", comm.nodes, comm.ranks),
                                  ("count", comm.count, job.world_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise NcclInputError(f"communicator {comm.name or comm.ranks!r}: {name} {value!r} is not in [1, {high}]")
        if comm.peers is not None and (isinstance(comm.peers, bool) or not isinstance(comm.peers, int)
                                       or not 0 <= comm.peers < comm.ranks):
            raise NcclInputError(f"communicator {comm.name or comm.ranks!r}: peers {comm.peers!r} is not in "
                                 f"[0, {comm.ranks - 1}]")
        unknown = set(comm.collectives) - set(COLLECTIVES)
        if unknown:
            raise NcclInputError(f"unknown collectives {sorted(map(str, unknown))[:5]}; known: {', '.join(COLLECTIVES)}")


def nccl_term(job: NcclJob) -> tuple[int, int, int, list[dict[str, Any]]]:
    """NCCL's device memory on one rank: (low, point, high) bytes and the parts they add up from.

    Each part names its communicator, its term (``device_structures``, ``ring``, ``tree``, ``nvls``,
    ``p2p``), its bytes at each end and its source; a last part with ``term`` ``notes`` lists the
    settings read from the environment that were refused. ``NcclInputError`` for a job out of bounds.
    """
    _check_job(job)
    env = os.environ if job.env is None else job.env
    s = _settings(job, env)
    parts: list[dict[str, Any]] = []
    for comm in job.communicators:
        parts.extend(_communicator_parts(comm, job, s))
    low = sum(p["low_bytes"] for p in parts)
    point = sum(p["point_bytes"] for p in parts)
    high = sum(p["high_bytes"] for p in parts)
    if s.notes:
        parts.append({"communicator": "", "term": "notes", "count": 0, "low_bytes": 0, "point_bytes": 0,
                      "high_bytes": 0, "source": "; ".join(s.notes)})
    return low, point, high, parts


def nccl_version_for_torch(torch_version: str) -> tuple[int, int, int]:
    """The NCCL a torch release's PyPI wheel bundles (``"2.13.0+cu130"`` -> (2, 29, 7)); the newest known past the table."""
    try:
        major, minor = (int(x) for x in str(torch_version).split("+")[0].split(".")[:2])
    except ValueError:
        return DEFAULT_NCCL
    key = (major, minor)
    if key in TORCH_NCCL:
        return TORCH_NCCL[key]
    return TORCH_NCCL[max(TORCH_NCCL)] if key > max(TORCH_NCCL) else TORCH_NCCL[min(TORCH_NCCL)]


def _int_field(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise NcclInputError(f"manifest: {name} {value!r} is not a whole number in [{low}, {high}]")
    return value


def _communicators_of(facts: dict[str, Any], world: int, per_node: int) -> list[Communicator]:
    """The communicators one rank holds, from the manifest's facts (see docs/nccl.md for the rule)."""
    given = facts.get("communicators")
    if isinstance(given, list):
        if len(given) > MAX_COMMUNICATORS:
            raise NcclInputError(f"manifest: {len(given)} communicators is more than {MAX_COMMUNICATORS}")
        comms = []
        for i, item in enumerate(given):
            if not isinstance(item, dict):
                raise NcclInputError(f"manifest: communicators[{i}] is not an object")
            ranks = _int_field(item.get("ranks"), f"communicators[{i}].ranks", 1, world)
            collectives = item.get("collectives", ["all_reduce"])
            if not isinstance(collectives, list) or len(collectives) > len(COLLECTIVES):
                raise NcclInputError(f"manifest: communicators[{i}].collectives is not a list of collectives")
            nodes = item.get("nodes", max(1, -(-ranks // per_node)))
            peers = item.get("peers")
            comms.append(Communicator(ranks=ranks, collectives=frozenset(str(c)[:20] for c in collectives),
                                      nodes=_int_field(nodes, f"communicators[{i}].nodes", 1, ranks),
                                      count=_int_field(item.get("count", 1), f"communicators[{i}].count", 1, world),
                                      peers=None if peers is None else _int_field(
                                          peers, f"communicators[{i}].peers", 0, ranks - 1),
                                      name=str(item.get("name", ""))[:60]))
        return comms
    sizes = facts.get("group_sizes") or []
    if not isinstance(sizes, list) or len(sizes) > MAX_COMMUNICATORS:
        raise NcclInputError("manifest: facts.group_sizes is not a list of group sizes")
    everything = frozenset(_RING)
    comms = [Communicator(ranks=world, collectives=everything, nodes=max(1, -(-world // per_node)), name="world")]
    pipeline = {len(st.get("group_ranks") or []) for st in facts.get("stages") or [] if isinstance(st, dict)}
    for size in sorted({_int_field(v, "facts.group_sizes[]", 1, world) for v in sizes}):
        if size in (1, world):
            continue
        collectives = frozenset({"send_recv"}) if size in pipeline else everything
        comms.append(Communicator(ranks=size, collectives=collectives, nodes=max(1, -(-size // per_node)),
                                  name=f"group of {size}"))
    return comms


def job_from_manifest(folder: str, *, gpu: str | None = None, interconnect: str = "nvswitch",
                      env: Mapping[str, str] | None = None) -> NcclJob:
    """The ``NcclJob`` of a per-rank capture folder, read from its ``manifest.json`` (bounded, checked).

    Takes ``world_size``, ``launcher.nproc_per_node`` (nodes of each group), ``gpu``, ``torch`` (the
    NCCL its wheel bundles) and ``facts``: ``facts.communicators`` when the capture lists them
    (``[{"ranks", "nodes", "collectives", "count", "name"}]``), else the world group plus one
    communicator per distinct ``facts.group_sizes`` (pipeline groups, from ``facts.stages``, doing send/recv).
    """
    path = os.path.join(folder, "manifest.json")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise NcclInputError(f"{folder}: no manifest.json ({exc.strerror or exc})") from None
    if size > MAX_MANIFEST_BYTES:
        raise NcclInputError(f"{path}: {size:,} bytes is more than a manifest may be ({MAX_MANIFEST_BYTES:,})")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise NcclInputError(f"{path}: not readable JSON ({exc})") from None
    return job_from_manifest_data(data, gpu=gpu, interconnect=interconnect, env=env)


def job_from_manifest_data(data: Any, *, gpu: str | None = None, interconnect: str = "nvswitch",
                           env: Mapping[str, str] | None = None, torch_version: str | None = None) -> NcclJob:
    """``job_from_manifest`` for a manifest already parsed (a dict); ``torch_version``: the torch the GPU run
    uses (``run --torch``), whose NCCL is priced, instead of the capture's."""
    if not isinstance(data, dict):
        raise NcclInputError("manifest: not a JSON object")
    world = _int_field(data.get("world_size"), "world_size", 1, MAX_WORLD_SIZE)
    launcher = data.get("launcher") if isinstance(data.get("launcher"), dict) else {}
    per_node = launcher.get("nproc_per_node", world)
    per_node = _int_field(per_node, "launcher.nproc_per_node", 1, MAX_WORLD_SIZE) if per_node is not None else world
    if "launcher" in launcher and not launcher["launcher"] and "spawn" in (data.get("facts") or {}):
        # no launcher: the script started its ranks itself (torch.multiprocessing.spawn), all on its own node
        per_node = world
    facts = data.get("facts") if isinstance(data.get("facts"), dict) else {}
    card = gpu or str(data.get("gpu") or "H100")[:100]
    return NcclJob(world_size=world, communicators=tuple(_communicators_of(facts, world, per_node)), gpu=card,
                   interconnect=interconnect, nccl_version=nccl_version_for_torch(str(torch_version or data.get("torch", ""))[:60]),
                   env=env)


def term_names(parts: Iterable[dict[str, Any]]) -> list[str]:
    """The distinct terms of ``parts`` in order (for a one-line summary)."""
    seen: list[str] = []
    for part in parts:
        if part["term"] not in seen and part["term"] != "notes":
            seen.append(part["term"])
    return seen
