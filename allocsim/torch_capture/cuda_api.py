"""``torch.cuda`` as one GPU would answer it, inside a capture: ``shims(tracker, gpu)`` gives the replacements.

Every function a training or profiling script calls either behaves as on the GPU named by
``allocsim capture --gpu`` or is a documented no-op (docs/capture.md lists them all):

* device queries: ``is_available`` (True), ``device_count`` and ``current_device`` (``local_device``: one GPU, or a launched rank's node),
  ``get_device_name``/``get_device_properties``/``get_device_capability`` (the card's name, memory,
  compute capability and SM count), ``is_bf16_supported`` (compute capability 8.0 or newer, or
  emulated), ``get_arch_list``, ``is_initialized``, ``init``, ``set_device``, ``synchronize``;
* memory: ``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
  ``max_memory_reserved``, ``memory_stats``, ``memory_summary``, ``mem_get_info`` and the resets are
  answered by allocsim's model of the caching allocator fed with the capture's requests (block
  bytes, as the GPU reports them; the parent process answers over the capture's private channel);
  ``empty_cache`` is recorded; ``set_per_process_memory_fraction`` is recorded in the trace's notes;
* the memory-history API: ``torch.cuda.memory._record_memory_history`` and ``_dump_snapshot`` put
  markers in the trace (``memory_history start`` / ``memory_history stop`` / ``memory snapshot
  FILE``), so a capture can be compared with the snapshot the script writes on a GPU over the same
  window; no file is written;
* NVTX (``torch.cuda.nvtx.range_push``/``range_pop``/``range``/``mark``/``range_start``/
  ``range_end``), ``cudart()`` (``cudaProfilerStart``/``Stop``) and ``torch.cuda.profiler``: no-ops;
* every replacement function takes exactly the arguments of the installed torch's function it
  replaces (``signatures.conform``: names, keywords, defaults), so ``torch.cuda.stream(stream=s)``
  works as on the GPU and a wrong call raises the same ``TypeError``;
* streams and events: ``Stream``, ``stream(s)``, ``current_stream``, ``default_stream``,
  ``set_stream``, ``Event`` (record, wait, query, synchronize; ``elapsed_time`` is 0.0): requests
  made inside ``with torch.cuda.stream(s)`` are on that stream in the trace; waits, records and
  synchronisations advance the capture's stream clock (``stream_clock``), which says when a block
  freed with ``record_stream`` uses goes back;
* random state: ``manual_seed``, ``manual_seed_all``, ``seed``, ``get_rng_state``/``set_rng_state``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

from . import local_device, torch_versions
from .signatures import conform, noop
from .tracker import StorageTracker

#: torch 2.4 and 2.5 want torch.cuda's Stream and Event to derive from torch._streambase's classes.
_STREAM_BASES, _EVENT_BASES = torch_versions.stream_bases()


class DeviceProperties:
    """What ``torch.cuda.get_device_properties(0)`` says of the capture's card."""

    def __init__(self, gpu: dict[str, Any]):
        self.name = str(gpu.get("name", "allocsim capture"))
        self.total_memory = int(gpu.get("total_bytes", 80 << 30))
        self.major = int(gpu.get("major", 8))
        self.minor = int(gpu.get("minor", 0))
        self.multi_processor_count = int(gpu.get("sm_count", 108))
        self.max_threads_per_multi_processor = int(gpu.get("max_threads_per_sm", 2048))
        self.warp_size = 32
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = int(gpu.get("l2_bytes", 40 << 20))
        self.gcnArchName = ""
        self.uuid = "allocsim-capture"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count="
                f"{self.multi_processor_count}, allocsim capture)")


#: The capture's tracker (one per process), whose stream clock streams and events advance.
_TRACKER: list[StorageTracker] = []


def _clock_learned(blocks: list) -> None:
    if _TRACKER and blocks:
        _TRACKER[0].learned(blocks)


def _clock() -> Any:
    return _TRACKER[0].clock if _TRACKER else None


def _current_number() -> int:
    return _TRACKER[0].current_stream() if _TRACKER else 0


def stream_number(stream: Any) -> int:
    """The capture's number of ``stream`` (a ``Stream`` here, or anything with ``stream_id``); 0 for the default."""
    if stream is None:
        return _current_number()
    return int(getattr(stream, "stream_id", 0) or 0)


class Stream(*_STREAM_BASES):
    """A CUDA stream as the script sees it; requests made while it is current carry its number."""

    _next_id = 1
    _lock = threading.Lock()

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        with Stream._lock:
            self.stream_id = Stream._next_id
            Stream._next_id += 1
        self.priority = priority
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else None
        self.cuda_stream = 0x5000 + self.stream_id

    def wait_stream(self, stream: Any) -> None:
        clock = _clock()
        if clock is not None:
            clock.stream_waits(self.stream_id, clock.stream_point(stream_number(stream)))

    def wait_event(self, event: Any) -> None:
        clock = _clock()
        if clock is not None:
            clock.stream_waits(self.stream_id, getattr(event, "point", None))

    def record_event(self, event: Any = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        self.synchronize()          # answered True: the host now knows its work is done
        return True

    def synchronize(self) -> None:
        clock = _clock()
        if clock is not None:
            _clock_learned(clock.stream_synchronized(self.stream_id))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("allocsim-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:0 cuda_stream={self.cuda_stream:#x} (allocsim capture)>"


class _DefaultStream(Stream):
    def __init__(self) -> None:  # noqa: D107  (stream 0)
        self.stream_id = 0
        self.priority = 0
        self.device = None
        self.cuda_stream = 0


DEFAULT_STREAM = _DefaultStream()


class Event(*_EVENT_BASES):
    """A CUDA event: recording and waiting are instantaneous on the capture's single timeline."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        self.enable_timing = enable_timing
        self.point: dict[int, int] | None = None     # the stream clock where it was recorded

    def record(self, stream: Any = None) -> None:
        clock = _clock()
        if clock is not None:
            self.point = clock.event_recorded(stream_number(stream))

    def wait(self, stream: Any = None) -> None:
        clock = _clock()
        if clock is not None:
            clock.stream_waits(stream_number(stream), self.point)

    def query(self) -> bool:
        self.synchronize()          # answered True: the host now knows the work before it is done
        return True

    def synchronize(self) -> None:
        clock = _clock()
        if clock is not None:
            _clock_learned(clock.event_synchronized(self.point))

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


class _Cudart:
    """``torch.cuda.cudart()``: the profiler switches are no-ops."""

    @staticmethod
    def cudaProfilerStart() -> int:  # noqa: N802  (CUDA's name)
        return 0

    @staticmethod
    def cudaProfilerStop() -> int:  # noqa: N802
        return 0


@contextlib.contextmanager
def _no_range(*_args: Any, **_kwargs: Any) -> Iterator[None]:
    yield


class Memory:
    """The memory figures, asked of the parent's allocator model (or counted here when run by hand)."""

    def __init__(self, tracker: StorageTracker, gpu: dict[str, Any]):
        self.tracker = tracker
        self.total_bytes = int(gpu.get("total_bytes", 80 << 30))
        self.context_bytes = int(gpu.get("context_bytes", 0))
        self.history_entries = 0

    def stats(self, device: Any = None) -> dict[str, int]:
        answer = self.tracker.channel.ask("memory_stats")
        if isinstance(answer, dict):
            return answer
        live, peak = self.tracker.live_bytes, self.tracker.peak_bytes
        return {"allocated_bytes.all.current": live, "allocated_bytes.all.peak": peak,
                "reserved_bytes.all.current": live, "reserved_bytes.all.peak": peak,
                "requested_bytes.all.current": live, "requested_bytes.all.peak": peak}

    def allocated(self, device: Any = None) -> int:
        return int(self.stats().get("allocated_bytes.all.current", 0))

    def max_allocated(self, device: Any = None) -> int:
        return int(self.stats().get("allocated_bytes.all.peak", 0))

    def reserved(self, device: Any = None) -> int:
        return int(self.stats().get("reserved_bytes.all.current", 0))

    def max_reserved(self, device: Any = None) -> int:
        return int(self.stats().get("reserved_bytes.all.peak", 0))

    def reset_peak(self, device: Any = None) -> None:
        self.tracker.channel.ask("reset_peak_memory_stats")
        self.tracker.peak_bytes = self.tracker.live_bytes

    def reset_accumulated(self, device: Any = None) -> None:
        self.tracker.channel.ask("reset_accumulated_memory_stats")

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        used = self.reserved() + self.context_bytes
        return max(0, self.total_bytes - used), self.total_bytes

    def summary(self, device: Any = None, abbreviated: bool = False) -> str:
        stats = self.stats()
        lines = ["allocsim capture: the caching allocator's figures for this run (allocsim's model)"]
        lines += [f"  {key}: {value:,}" for key, value in sorted(stats.items())]
        return "\n".join(lines)

    def set_fraction(self, fraction: float, device: Any = None) -> None:
        self.tracker.note(f"the script set the memory fraction to {fraction} "
                          "(torch.cuda.set_per_process_memory_fraction); replay with the fraction to apply it")

    def record_history(self, enabled: Any, context: Any, stacks: Any, max_entries: int, *_rest: Any) -> None:
        """``_record_memory_history(enabled, context, stacks, max_entries, ...)`` with torch's defaults filled in."""
        if enabled is None or enabled is False:
            self.tracker.marker("memory_history stop")
            return
        self.history_entries = int(max_entries)
        self.tracker.marker(f"memory_history start max_entries={self.history_entries}")

    def dump_snapshot(self, filename: str = "dump_snapshot.pickle", *_rest: Any) -> None:
        self.tracker.marker(f"memory snapshot {filename}")

    def snapshot(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.tracker.marker("memory snapshot (in memory)")
        return {"segments": [], "device_traces": [[]],
                "allocator_settings": {}, "allocsim": "a capture has no device snapshot; see the trace"}


class CudaGenerator:
    """``torch.cuda.default_generators[0]`` of the capture: its state is the 16 zero bytes ``get_rng_state`` answers.

    Megatron-LM's RNG tracker sets and reads the CUDA generator directly
    (megatron/core/tensor_parallel/random.py ``_set_cuda_rng_state``); random numbers on the device are
    never drawn in a capture, so its state changes nothing.
    """

    device = torch.device("cuda", 0)

    def get_state(self) -> torch.Tensor:
        return torch.zeros(16, dtype=torch.uint8)

    def set_state(self, new_state: Any) -> None:
        return None

    graphsafe_get_state = clone_state = lambda self: self  # noqa: E731
    graphsafe_set_state = set_state

    def manual_seed(self, seed: int) -> "CudaGenerator":
        return self

    def seed(self) -> int:
        return 0

    def initial_seed(self) -> int:
        return 0


class CudaGenerators(tuple):
    """``torch.cuda.default_generators``: one ``CudaGenerator`` per device this rank sees (its node's GPUs)."""

    def __new__(cls) -> "CudaGenerators":
        return super().__new__(cls, (CudaGenerator(),))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return tuple.__getitem__(self, 0)       # every device's generator is the same stand-in
        return tuple.__getitem__(self, index)

    def __len__(self) -> int:
        return max(1, int(torch.cuda.device_count()))


def shims(tracker: StorageTracker, gpu: dict[str, Any]) -> dict[tuple[Any, str], Any]:
    """``{(owner, attribute): replacement}`` for everything in ``torch.cuda`` the capture answers, each with torch's signature."""
    cuda = torch.cuda
    _TRACKER[:] = [tracker]
    props = DeviceProperties(gpu)
    memory = Memory(tracker, gpu)
    streams = tracker.stream_of_thread
    capability = (props.major, props.minor)

    def current_stream(device: Any = None) -> Stream:
        sid = streams.get(threading.get_ident(), 0)
        return _STREAMS.get(sid, DEFAULT_STREAM)

    def set_stream(stream: Any) -> None:
        if isinstance(stream, Stream):
            _STREAMS[stream.stream_id] = stream
            streams[threading.get_ident()] = stream.stream_id

    @contextlib.contextmanager
    def stream(stream: Any) -> Iterator[None]:
        if stream is None:
            yield
            return
        before = streams.get(threading.get_ident(), 0)
        set_stream(stream)
        try:
            yield
        finally:
            streams[threading.get_ident()] = before

    def device_synchronize(device: Any = None) -> None:
        tracker.learned(tracker.clock.device_synchronized())

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return props.major >= 8 or bool(including_emulation)

    answers: dict[tuple[Any, str], Any] = {
        (cuda, "is_available"): lambda: True,
        (cuda, "is_initialized"): lambda: True,
        (cuda, "init"): noop,
        (cuda, "device_count"): local_device.count,
        (cuda, "current_device"): local_device.current,
        (cuda, "set_device"): local_device.select,
        (cuda, "synchronize"): device_synchronize,
        (cuda, "get_device_name"): lambda device=None: props.name,
        (cuda, "get_device_properties"): lambda device=None: props,
        (cuda, "get_device_capability"): lambda device=None: capability,
        (cuda, "get_arch_list"): lambda: [f"sm_{props.major}{props.minor}"],
        (cuda, "is_bf16_supported"): is_bf16_supported,
        (cuda, "empty_cache"): tracker.empty_cache,
        (cuda, "memory_allocated"): memory.allocated,
        (cuda, "max_memory_allocated"): memory.max_allocated,
        (cuda, "memory_reserved"): memory.reserved,
        (cuda, "max_memory_reserved"): memory.max_reserved,
        (cuda, "memory_cached"): memory.reserved,
        (cuda, "max_memory_cached"): memory.max_reserved,
        (cuda, "memory_stats"): memory.stats,
        (cuda, "memory_summary"): memory.summary,
        (cuda, "reset_peak_memory_stats"): memory.reset_peak,
        (cuda, "reset_max_memory_allocated"): memory.reset_peak,
        (cuda, "reset_accumulated_memory_stats"): memory.reset_accumulated,
        (cuda, "mem_get_info"): memory.mem_get_info,
        (cuda, "set_per_process_memory_fraction"): memory.set_fraction,
        (cuda, "manual_seed"): noop,
        (cuda, "manual_seed_all"): noop,
        (cuda, "seed"): noop,
        (cuda, "seed_all"): noop,
        (cuda, "initial_seed"): lambda: 0,
        (cuda, "get_rng_state"): lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
        (cuda, "set_rng_state"): lambda new_state, device="cuda": None,
        (cuda, "get_rng_state_all"): lambda: [torch.zeros(16, dtype=torch.uint8)],
        (cuda, "set_rng_state_all"): lambda new_states: None,
        (cuda, "stream"): stream,
        (cuda, "current_stream"): current_stream,
        (cuda, "default_stream"): lambda device=None: DEFAULT_STREAM,
        (cuda, "set_stream"): set_stream,
        (cuda, "cudart"): lambda: _Cudart,
        (cuda.memory, "_record_memory_history"): memory.record_history,
        (cuda.memory, "_dump_snapshot"): memory.dump_snapshot,
        (cuda.memory, "_snapshot"): memory.snapshot,
    }
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_stats", "memory_summary", "reset_peak_memory_stats", "mem_get_info", "empty_cache",
                 "set_per_process_memory_fraction", "reset_accumulated_memory_stats",
                 "reset_max_memory_allocated"):
        answers[(cuda.memory, name)] = answers[(cuda, name)]
    # torch.cuda.random's own names (Megatron-LM calls torch.cuda.random.get_rng_state)
    import torch.cuda.random as cuda_random  # noqa: PLC0415

    for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed",
                 "manual_seed_all", "seed", "seed_all", "initial_seed"):
        answers[(cuda_random, name)] = answers[(cuda, name)]
    nvtx = getattr(cuda, "nvtx", None)
    if nvtx is not None:
        for name in ("range_push", "range_pop", "mark", "range_end"):
            answers[(nvtx, name)] = noop
        answers[(nvtx, "range_start")] = lambda msg: 0
        answers[(nvtx, "range")] = _no_range
    profiler = getattr(cuda, "profiler", None)
    if profiler is not None:
        for name in ("start", "stop", "init"):
            answers[(profiler, name)] = noop
        answers[(profiler, "profile")] = _no_range
    cudnn = torch.backends.cudnn
    answers[(cudnn, "is_available")] = lambda: True
    cudnn_version = torch_versions.cudnn_version()     # read before the capture answers for cuDNN
    answers[(cudnn, "version")] = lambda: cudnn_version
    # Streams and events are classes the script makes and subclasses: replaced as they are
    table: dict[tuple[Any, str], Any] = {(cuda, "Stream"): Stream, (cuda, "Event"): Event,
                                         # a tuple, not a function: the RNG tracker of Megatron-LM reads it
                                         (cuda, "default_generators"): CudaGenerators()}
    for (owner, name), impl in answers.items():
        if owner is not None and hasattr(owner, name):       # only what this torch has
            table[(owner, name)] = conform(getattr(owner, name), impl)
    return table


#: Streams the script made, by number (for ``current_stream``).
_STREAMS: dict[int, Stream] = {}
