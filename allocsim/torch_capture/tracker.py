"""Record the device storages ATen operators create and release: ``StorageTracker(channel, gpu)`` plus a ``Recorder`` per thread.

A dispatch mode (``Recorder``) sees each ATen operator below autograd, where the CUDA backend would
run it: a new storage in an output is a request to the caching allocator of exactly
``storage.nbytes()`` bytes (the allocator rounds it, the simulator applies that rule). Views share
their base's storage and are not requests; zero-byte storages are never requested (the allocator
returns a null pointer). PyTorch keeps a storage's Python object alive as long as the storage
itself, so a weak reference's callback is the moment the CUDA run would hand the block back. A
storage that an ``out=`` or ``resize_`` operator grows is a free of the old block followed by a
request for the new size, as the CUDA resize does.

Three kinds of ``meta`` storage live side by side (see ``devicemap``): *device* storages, which a
CUDA run would hold in GPU memory (recorded); *host* storages, the abstract stand-ins for large CPU
tensors a script builds before moving them to ``cuda`` (never recorded: they cost the capture no
memory, and the GPU run holds them on the host); and *script meta* storages, the tensors the script
itself makes on ``meta`` (``with torch.device("meta"):``, ``device="meta"``: a model built without
memory, as torchtitan builds its models), which the CUDA run holds nowhere (never recorded).
An operator's outputs are host storages when it runs under ``host()`` (a CPU factory, ``.cpu()``),
script meta under ``script_meta()`` (a factory the script sent to ``meta``), else they take the kind
of the meta tensors it reads: device when any is a device storage, else script meta when any is one,
else host. A copy under ``to_device()`` (``.to("cuda")``, ``to_empty(device="cuda")``, any
operator given ``device="cuda"``) is always a device request.

Beside the operators' own outputs the tracker inserts the requests CUDA libraries make through the
caching allocator: cuDNN convolution workspaces (``cudnn``), one cuBLAS workspace per (handle,
stream) kept for the life of the process (``cublas``), and the scratch buffers of kernels such as
reductions (``cuda_scratch``). Each request carries the Python stack of the script (innermost
first) below a frame naming the operator; operators the autograd engine runs name their node.

With a card's memory (``memory_bytes``, ``allocsim capture --gpu``), a request the modelled caching
allocator cannot serve raises ``torch.cuda.OutOfMemoryError`` in the script, as on the GPU. It stays
cheap: the tracker keeps a budget, the memory the allocator had left at the parent's last answer
less an upper bound of what each request since can have added to its reserved memory (twice the
request plus a 20 MiB segment and a 2 MiB page: rounding, ``roundup_power2_divisions`` and the
segment sizes of ``get_allocation_size`` stay below it); only a request beyond the budget is sent
as a question (``R``) whose answer is the allocator model's. Without a card, a request over 1 PiB
(the trace's limit: a size computed wrong in the script) ends the capture with that reason.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Iterator

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from . import cublas, cuda_scratch, cudnn, torch_versions
from .channel import Channel, text
from .stream_clock import StreamClock, released
from .uploads import Uploads

#: The device the script's ``cuda`` tensors live on during a capture.
CAPTURE_DEVICE = "meta"
#: Python frames kept per stack (innermost first): enough to reach the training loop.
MAX_FRAMES = 24
#: Frames from these folders are PyTorch's or allocsim's own, not the script's.
_SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)
_CONV = torch.ops.aten.convolution.default
_CONV_BACKWARD = torch.ops.aten.convolution_backward.default
#: Synthetic addresses are spaced by the allocator's smallest block so no two live blocks overlap.
_ADDR_STEP = 512
#: Backward operators a CUDA run makes in place, into an input it holds the last reference to, where
#: the capture gets an out-of-place result: autograd counts a meta tensor, and any tensor under a
#: dispatch mode, as "subclass-like" (ATen/TensorSubclassLikeUtils.h), and then neither accumulates
#: gradients in place (torch/csrc/autograd/input_buffer.cpp, can_accumulate_inplace) nor scatters in
#: place in the backward of max/min (value_selecting_reduction_backward). The tracker gives the
#: result the input's block when that input is freed right after, as the CUDA run's in-place op keeps it.
_IN_PLACE_ON_CUDA = frozenset(op for op in (torch.ops.aten.add.Tensor, torch.ops.aten.scatter.src,
                                            torch.ops.aten.scatter.value))
#: Phases a request is made in (the parent names categories from them): forward or other code, the
#: autograd engine's backward, an optimizer's step.
PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = b"f", b"b", b"o"
#: The largest request the capture takes without a card (``records.MAX_REQUEST_BYTES``: the trace's limit).
MAX_REQUEST_BYTES = 1 << 50
#: What a request may add to the allocator's reserved memory beyond twice its size (a 20 MiB segment, a 2 MiB page).
_REQUEST_SLACK_BYTES = 22 << 20


def _tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors among an operator's arguments (and in their lists), without pytree's cost."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


def _output_tensors(out: Any) -> list:
    """The tensors of an operator's output: a tensor, or tuples and lists of them (ATen's outputs), without pytree's cost."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        if all(isinstance(t, torch.Tensor) for t in out):
            return list(out)
        return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return []


_META_KEY = torch._C.DispatchKey.Meta


def on_meta(t: Any) -> bool:
    """Whether ``t`` lives on the capture's device, as ATen sees it.

    Under the capture's torch-function mode ``t.device`` answers ``cuda:0`` (``identity``), so
    there the dispatch keys say where the tensor really is.
    """
    if not isinstance(t, torch.Tensor):
        return False
    if torch._C._is_torch_function_mode_enabled():
        return torch._C._dispatch_keys(t).has(_META_KEY)
    return t.device.type == CAPTURE_DEVICE


class _Block(weakref.ref):
    """A live device storage: a weak reference to it (its callback is the free) and the block it stands for.

    One object per storage, holding its own fields, keeps the capture's share of what Python's
    cycle collector walks small (a list and a closure per storage cost a tenth of a 10^5-tensor capture).
    """

    __slots__ = ("key", "addr", "size_bytes", "stream", "category")


class _HostRef(weakref.ref):
    """A host storage (abstract CPU tensor), forgotten with it."""

    __slots__ = ("key",)


class _ThreadFlags(threading.local):
    host = 0            # > 0: outputs are host storages (a CPU factory, .cpu())
    script_meta = 0     # > 0: outputs are the script's own meta storages (a factory given device="meta")
    device_copy = 0     # > 0: outputs are device storages whatever the inputs (host -> cuda copies)
    optimizer = 0       # > 0: inside an optimizer's step
    category = ""       # the category of requests made now, when the code that makes them says it


class StorageTracker:
    """The capture's state: live device storages, host storages, stacks; sends records on ``channel``."""

    def __init__(self, channel: Channel, gpu: dict[str, Any] | None = None, memory_bytes: int | None = None):
        self.channel = channel
        #: Bytes the allocator can still reserve for sure (None: no card, no limit); see the module doc.
        self.budget_bytes = memory_bytes
        #: Called with the reason when a request cannot be taken (the child ends the capture there).
        self.on_refused: Any = None
        #: Code objects where a stack walk stops (the child's runner: below it nothing is the script's).
        self.stack_floor: frozenset = frozenset()
        self._skip_file: dict[str, bool] = {}
        self.gpu = dict(gpu or {})
        self._lock = threading.RLock()
        self._t0 = time.perf_counter_ns()
        self._last_t_ns = 0
        self._next_addr = _ADDR_STEP
        # id(storage) -> its block; the weak reference's callback is the free
        self._live: dict[int, _Block] = {}
        # id(storage) -> weak reference of host (abstract CPU) storages
        self._host: dict[int, _HostRef] = {}
        self._on_release = lambda block: self._released(block.key)        # one callback for every block
        self._on_host_release = lambda ref: self._host.pop(ref.key, None)
        # id(storage) -> weak reference of the script's own meta storages (no memory on a GPU either)
        self._script_meta: dict[int, _HostRef] = {}
        self._on_script_meta_release = lambda ref: self._script_meta.pop(ref.key, None)
        self._stacks: dict[tuple, int] = {}
        self.flags = _ThreadFlags()
        self.active = True
        self.live_bytes = 0
        self.peak_bytes = 0
        self.n_allocs = 0
        self.n_frees = 0
        self.n_workspaces = 0
        self.n_scratch = 0
        self.stream_of_thread: dict[int, int] = {}
        self.workspace_ratio = cudnn.workspace_ratio()
        #: Bytes a convolution workspace may take beside the live tensors: a larger one does not fit
        #: and PyTorch falls back to an engine that needs none.
        self.workspace_limit_bytes = int(self.gpu.get("total_bytes") or (80 << 30))
        self.cublas = cublas.Workspaces(self.gpu)
        self.scratch_gpu = cuda_scratch.GpuProps(
            str(self.gpu.get("name", "GPU")), int(self.gpu.get("sm_count") or 108),
            int(self.gpu.get("max_threads_per_sm") or 2048),
            compute_capability=(int(self.gpu.get("major", 8)), int(self.gpu.get("minor", 0))))
        self.torch_version = torch_versions.installed()
        self.reduce_rule = torch_versions.use_installed_reduce_rule()     # the installed Reduce.cuh's
        self._scratch_ops: dict[Any, bool] = {}
        # An out-of-place backward result whose request waits to see whether an input it could
        # have been written into is freed at once: (storage key, {input key: size}, message).
        self._defer: dict[int, int] | None = None
        self._pending: tuple[int, dict[int, int], list[Any]] | None = None
        self.n_in_place = 0
        self.uploads = Uploads()           # small host values copied to the device, for a copy back
        self.clock = StreamClock()         # when blocks with record_stream uses go back (stream_clock)
        self._uses: dict[int, set[int]] = {}   # id(storage) -> other streams that recorded uses of it
        #: Called with every operator before it is recorded (a distributed rank notes its functional
        #: collectives: ``distributed.rank``); None in a single-process capture.
        self.operator_hook: Any = None

    # ----------------------------------------------------------------- clock, stacks, streams
    def now_ns(self) -> int:
        # Callbacks come from other threads too: time never goes back in the trace.
        t_ns = max(time.perf_counter_ns() - self._t0, self._last_t_ns)
        self._last_t_ns = t_ns
        return t_ns

    def current_stream(self) -> int:
        """The stream the calling thread issues work on (0 unless the script entered a side stream)."""
        return self.stream_of_thread.get(threading.get_ident(), 0)

    def phase(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return PHASE_BACKWARD
        return PHASE_OPTIMIZER if self.flags.optimizer else PHASE_FORWARD

    def stack_id(self, first: tuple[str, int, str], with_python: bool = True) -> int:
        """The id of the stack ``first`` + the script's Python frames (innermost first), sent once."""
        frames = [first]
        node = torch._C._current_autograd_node()
        if node is not None:
            # the autograd engine runs this: name the node as a GPU snapshot's C++ frames do
            frames.append(("autograd", 0, f"autograd::engine::evaluate_function: {node.name()}"))
            frames.append(("autograd", 0, "torch::autograd::Engine::thread_main"))
        elif with_python:
            frame = sys._getframe(1)
            skip, floor = self._skip_file, self.stack_floor
            room = MAX_FRAMES
            while frame is not None and room:
                code = frame.f_code
                if code in floor:
                    break
                filename = code.co_filename
                skipped = skip.get(filename)
                if skipped is None:
                    skipped = skip[filename] = filename.startswith(_SKIP_DIRS) or filename == "<frozen runpy>"
                if not skipped:
                    frames.append((filename, frame.f_lineno, code.co_name))
                    room -= 1
                frame = frame.f_back
        key = tuple(frames)
        stack_id = self._stacks.get(key)
        if stack_id is None:
            stack_id = self._stacks[key] = len(self._stacks)
            self.channel.send(["S", stack_id, [[text(f), line, text(name)] for f, line, name in frames]])
        return stack_id

    # ----------------------------------------------------------------- requests
    def _new_addr(self, size_bytes: int) -> int:
        addr = self._next_addr
        self._next_addr += (size_bytes + _ADDR_STEP - 1) // _ADDR_STEP * _ADDR_STEP
        return addr

    def _alloc(self, storage: Any, size_bytes: int, op_name: str) -> None:
        self._settle()
        key = id(storage)
        stream = self.current_stream()
        stack = self.stack_id(("aten", 0, op_name))
        fields = (self.now_ns(), self._new_addr(size_bytes), size_bytes, stream, stack, self.phase())
        defer = self._defer
        same_size = {k: v for k, v in defer.items() if v == size_bytes and k != key} if defer else None
        if not same_size:
            self._request(fields)           # may raise the card's OutOfMemoryError: then nothing is live
            self._named(fields[1])
        block = self._live[key] = _Block(storage, self._on_release)
        block.key, block.addr, block.size_bytes, block.stream, block.category = key, fields[1], size_bytes, stream, None
        if same_size:
            self._pending = (key, same_size, fields)
            return
        self._counted(size_bytes)

    def _counted(self, size_bytes: int) -> None:
        self.n_allocs += 1
        self.live_bytes += size_bytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _request(self, fields: tuple, may_raise: bool = True) -> None:
        """Send one request ``(t_ns, addr, size_bytes, stream, stack, phase)``; with a card, the model's answer when near its memory.

        Raises ``torch.cuda.OutOfMemoryError`` when the modelled allocator cannot serve it (nothing is
        recorded then); without a card, a request over 1 PiB ends the capture (``on_refused``).
        ``may_raise=False`` (a request sent later, where no exception may surface) never asks.
        """
        size_bytes = fields[2]
        budget = self.budget_bytes
        if budget is None:
            if size_bytes > MAX_REQUEST_BYTES:
                self._refuse(f"a request of {size_bytes:,} bytes, over the {MAX_REQUEST_BYTES:,} bytes (1 PiB) the "
                             f"capture takes (no device has that much memory: a size computed wrong?), at "
                             f"{self._where()}")
        else:
            need = 2 * size_bytes + _REQUEST_SLACK_BYTES
            if need > budget and may_raise:
                answer = self.channel.ask_request(fields)
                if isinstance(answer, dict):
                    if "oom" in answer:
                        raise torch.cuda.OutOfMemoryError(str(answer["oom"]))
                    headroom = answer.get("ok")
                    self.budget_bytes = headroom if type(headroom) is int else 0
                return
            self.budget_bytes = budget - need
        self.channel.send_line(b'["A",%d,%d,%d,%d,%d,"%s"]\n' % fields)

    def _named(self, addr: int) -> None:
        """The block at ``addr`` is the category the code making it says (``named``), if it says one."""
        if self.flags.category:
            self.channel.send(["C", addr, self.flags.category])

    def _refuse(self, reason: str) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)         # ends the process
        raise RuntimeError(f"allocsim capture: {reason}")

    def _where(self) -> str:
        """The script's innermost frame, for a message."""
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(_SKIP_DIRS) and filename != "<frozen runpy>":
                return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
        return "an unknown place"

    def _settle(self) -> None:
        """Send the request held back for an in-place check: its input was not freed right after."""
        if self._pending is not None:
            _key, _inputs, fields = self._pending
            self._pending = None
            self._request(fields, may_raise=False)
            self._named(fields[1])
            self._counted(fields[2])

    def _free(self, key: int) -> None:
        pending = self._pending
        if pending is not None and key in pending[1] and key in self._live and pending[0] in self._live:
            # the CUDA run wrote the result into this input's block: the result keeps the block
            self._pending = None
            old = self._live.pop(key)
            new = self._live[pending[0]]
            new.addr, new.size_bytes, new.stream, new.category = old.addr, old.size_bytes, old.stream, old.category
            self.n_in_place += 1
            return
        self._settle()
        block = self._live.pop(key, None)
        if block is None:
            return
        uses = self._uses.pop(key, None)
        if uses:
            # freed while other streams recorded uses: the block goes back later (stream_clock)
            self.channel.send_line(b'["P",%d,%d,%d]\n' % (self.now_ns(), block.addr, block.stream))
            self.clock.defer(block.addr, block.stream, uses)
        else:
            self.channel.send_line(b'["F",%d,%d,%d]\n' % (self.now_ns(), block.addr, block.stream))
        self.n_frees += 1
        self.live_bytes -= block.size_bytes

    def record_stream(self, tensor: Any, stream: int) -> None:
        """``tensor.record_stream(stream)``: its block is in use on ``stream`` until that work is done."""
        if not on_meta(tensor):
            return
        with self._lock:
            key = id(tensor.untyped_storage())
            block = self._live.get(key)
            if block is not None and int(stream) != block.stream:
                self._uses.setdefault(key, set()).add(int(stream))
                self.clock.tick()

    def learned(self, blocks: list[tuple[int, int]]) -> None:
        """Blocks whose recorded uses the host now knows are done go back (``stream_clock``)."""
        if blocks:
            with self._lock:
                if self.active:
                    released(blocks, self.channel.send, self.now_ns)

    def host_waits(self) -> None:
        """A read-back (``item()``, ``cpu()``...) waited for the current stream's work."""
        if self.clock.pending:
            self.learned(self.clock.stream_synchronized(self.current_stream()))

    def _released(self, key: int) -> None:
        with self._lock:
            if self.active:
                self._free(key)

    def scratch(self, size_bytes: int, name: str, source: str = "cuda", *, category: str = "workspace",
                keep: bool = False) -> int:
        """A request a CUDA library or kernel (``source``) makes beside an operator's outputs; freed at once unless ``keep``.

        Its stack's first frame is ``name`` in ``source``. Returns the block's address (kept blocks
        stay live to the end of the trace).
        """
        self._settle()
        addr = self._new_addr(size_bytes)
        stream = self.current_stream()
        stack_id = self.stack_id((text(source), 0, text(name)), with_python=keep)
        self._request((self.now_ns(), addr, size_bytes, stream, stack_id, self.phase()))
        self.channel.send(["C", addr, category])
        self.n_allocs += 1
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + size_bytes)
        if keep:
            self.live_bytes += size_bytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        else:
            self.channel.send_line(b'["F",%d,%d,%d]\n' % (self.now_ns(), addr, stream))
            self.n_frees += 1
        return addr

    def storage_resized(self, storage: Any, size_bytes: int) -> None:
        """``storage.resize_(size_bytes)`` ran: a device storage's block goes back (0) or is requested anew.

        FSDP frees an unsharded parameter between its uses by resizing its storage to 0 and back
        (``free_storage`` / ``alloc_storage`` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py),
        which reaches no ATen operator: the CUDA caching allocator frees the block and allocates a
        new one, as here.
        """
        if getattr(storage, "device", None) is None or storage.device.type != CAPTURE_DEVICE:
            return
        with self._lock:
            if not self.active:
                return
            key = id(storage)
            if key in self._host or key in self._script_meta:
                return
            block = self._live.get(key)
            if block is not None and block() is storage:
                if block.size_bytes == size_bytes:
                    return
                self._free(key)
            if size_bytes > 0:
                self._alloc(storage, int(size_bytes), "UntypedStorage.resize_")

    def categorize(self, tensor: Any, category: str) -> None:
        """Say that ``tensor``'s device storage is a ``parameter``, ``gradient``, ``optimizer_state``, ..."""
        if is_traceable_wrapper_subclass(tensor):          # a DTensor: its local tensor holds the memory
            for name in tensor.__tensor_flatten__()[0]:
                self.categorize(getattr(tensor, name), category)
            return
        if not on_meta(tensor):
            return
        with self._lock:
            self._settle()
            block = self._live.get(id(tensor.untyped_storage()))
            if block is not None and block.category != category:
                block.category = category
                self.channel.send(["C", block.addr, category])

    # ----------------------------------------------------------------- host and device storages
    def is_host(self, t: Any) -> bool:
        """Whether ``t`` is an abstract host tensor (a large CPU tensor the capture keeps on meta)."""
        local = getattr(t, "_local_tensor", t)        # a DTensor is where its shard is
        return on_meta(local) and id(local.untyped_storage()) in self._host

    def is_script_meta(self, t: Any) -> bool:
        """Whether ``t`` is a tensor the script made on ``meta`` itself (no memory on a GPU either)."""
        local = getattr(t, "_local_tensor", t)        # a DTensor is where its shard is
        return on_meta(local) and id(local.untyped_storage()) in self._script_meta

    def is_device(self, t: Any) -> bool:
        """Whether ``t`` stands for a CUDA tensor."""
        local = getattr(t, "_local_tensor", t)        # a DTensor is where its shard is
        if not on_meta(local):
            return False
        key = id(local.untyped_storage())
        return key not in self._host and key not in self._script_meta

    def mark_host(self, t: Any) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._host:
            ref = self._host[key] = _HostRef(storage, self._on_host_release)
            ref.key = key

    def mark_script_meta(self, t: Any) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._script_meta:
            ref = self._script_meta[key] = _HostRef(storage, self._on_script_meta_release)
            ref.key = key

    @contextlib.contextmanager
    def _raised(self, flag: str) -> Iterator[None]:
        setattr(self.flags, flag, getattr(self.flags, flag) + 1)
        try:
            yield
        finally:
            setattr(self.flags, flag, getattr(self.flags, flag) - 1)

    def host(self) -> Any:
        """Outputs made inside the block are host storages (not recorded)."""
        return self._raised("host")

    def to_device(self) -> Any:
        """Outputs made inside the block are device storages (a copy of a host tensor to ``cuda``)."""
        return self._raised("device_copy")

    def script_meta(self) -> Any:
        """Outputs made inside the block are the script's own meta storages (not recorded)."""
        return self._raised("script_meta")

    @contextlib.contextmanager
    def named(self, category: str) -> Iterator[None]:
        """Requests made inside the block (this thread) are ``category`` (``communication``, ``parameter``...)."""
        before = self.flags.category
        self.flags.category = category
        try:
            yield
        finally:
            self.flags.category = before

    def _abstract_outputs(self, args: tuple, kwargs: dict) -> dict[int, _HostRef] | None:
        """Where an operator's meta outputs go when they are not device storages: ``_host``, ``_script_meta``; None: device."""
        flags = self.flags
        if flags.device_copy:
            return None
        if flags.host:
            return self._host
        if flags.script_meta:
            return self._script_meta
        kind = None
        for t in _tensors(args, kwargs):
            if t.device.type == CAPTURE_DEVICE:
                key = id(t.untyped_storage())
                if key in self._script_meta:
                    kind = self._script_meta
                elif key in self._host:
                    kind = kind or self._host
                else:
                    return None
        return kind

    # ----------------------------------------------------------------- operators
    def on_operator(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Record what ``func`` created (called by the dispatch mode after the operator ran)."""
        if self.operator_hook is not None:
            self.operator_hook(func, args, kwargs)
        with self._lock:
            if not self.active:
                return
            abstract = self._abstract_outputs(args, kwargs)
            if abstract is not None:
                mark = self.mark_host if abstract is self._host else self.mark_script_meta
                for t in _output_tensors(out):
                    if on_meta(t):
                        mark(t)
                return
            self._settle()
            if func in _IN_PLACE_ON_CUDA and torch._C._current_graph_task_id() != -1:
                self._defer = {id(t.untyped_storage()): int(t.untyped_storage().nbytes()) for t in args
                               if on_meta(t) and id(t.untyped_storage()) in self._live}
            try:
                self._record(func, args, kwargs, out)
            finally:
                self._defer = None

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Record the outputs of ``func`` and the requests its CUDA kernel makes beside them."""
        # Positional arguments only (how autograd calls them); anything else is recorded plainly.
        if func is _CONV and len(args) == 9 and not kwargs and on_meta(args[0]):
            self._record_convolution(args, out)
        elif func is _CONV_BACKWARD and len(args) == 11 and not kwargs and on_meta(args[0]):
            self._record_convolution_backward(args, out)
        else:
            self._record_outputs(func, out)
        if not any(on_meta(t) for t in _tensors(args, kwargs)):
            return      # a CPU operator (torch 2.6's torch._dynamo runs `a @ b` on CPU tensors at import)
        if func in cublas.OPERATORS:
            self._cublas_workspace()
        elif self._has_scratch(func):
            self._kernel_scratch(func, args, kwargs, out)

    def _has_scratch(self, func: Any) -> bool:
        known = self._scratch_ops.get(func)
        if known is None:
            known = self._scratch_ops[func] = cuda_scratch.may_need_scratch(func.name())
        return known

    def _kernel_scratch(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """The requests a CUDA kernel makes beside its outputs (reduction buffers, ...), in the kernel's order."""
        requests = cuda_scratch.requests_for_call(func, args, kwargs, out, self.scratch_gpu,
                                                  torch_version=self.torch_version)
        if not requests:
            return
        addrs: dict[int, tuple[int, int]] = {}
        try:
            for action, i in cuda_scratch.scratch_events(requests):
                request = requests[i]
                if action == "alloc":
                    addrs[i] = (self.scratch(request.size_bytes, request.label, "cuda", keep=True), request.size_bytes)
                    self.n_scratch += 1
                else:
                    self._scratch_free(*addrs.pop(i))
        except torch.cuda.OutOfMemoryError:
            for addr, size_bytes in addrs.values():     # the kernel never ran: what it had taken goes back
                self._scratch_free(addr, size_bytes)
            raise

    def _scratch_free(self, addr: int, size_bytes: int) -> None:
        self.channel.send_line(b'["F",%d,%d,%d]\n' % (self.now_ns(), addr, self.current_stream()))
        self.n_frees += 1
        self.live_bytes -= size_bytes

    def _cublas_workspace(self) -> None:
        handle = "autograd" if torch._C._current_graph_task_id() != -1 else threading.get_ident()
        size_bytes = self.cublas.needed(handle, self.current_stream())
        if size_bytes:
            self.scratch(size_bytes, cublas.LABEL, "cublas", keep=True)

    def _workspace(self, phase: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, groups: int) -> None:
        """A cuDNN workspace of this convolution phase: requested and handed back around the kernel."""
        dtype_bytes = x.element_size()
        size_bytes = cudnn.workspace_bytes(phase, x.shape, w.shape, y.shape, groups, dtype_bytes,
                                           self.workspace_ratio)
        if size_bytes <= 0 or size_bytes > self.workspace_limit_bytes - self.live_bytes:
            return
        try:
            self.scratch(size_bytes, cudnn.label(phase, x.shape, w.shape, y.shape, groups, dtype_bytes), "cudnn")
        except torch.cuda.OutOfMemoryError:
            return      # as Conv_v8.cpp does: a workspace that does not fit, and cuDNN runs an engine without one
        self.n_workspaces += 1

    def _record_convolution(self, args: tuple, out: torch.Tensor) -> None:
        # aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        # the output is allocated, then the kernel runs with its workspace.
        self._record_outputs(_CONV, out)
        x, w, groups = args[0], args[1], int(args[8])
        if args[6]:                      # transposed: cuDNN runs it as the backward-data of a convolution
            self._workspace("backward data", out, w, x, groups)
        else:
            self._workspace("forward", x, w, out, groups)

    def _record_convolution_backward(self, args: tuple, out: tuple) -> None:
        # aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
        # transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias);
        # cuDNN's backward computes grad_input (with its workspace), then grad_weight (with its own).
        grad_output, x, w, transposed, groups = args[0], args[1], args[2], bool(args[7]), int(args[9])
        grad_input, grad_weight, grad_bias = out
        if grad_input is not None:
            self._record_outputs(_CONV_BACKWARD, grad_input)
            if transposed:               # the data gradient of a transposed convolution is a forward one
                self._workspace("forward", grad_output, w, x, groups)
            else:
                self._workspace("backward data", x, w, grad_output, groups)
        if grad_weight is not None:
            self._record_outputs(_CONV_BACKWARD, grad_weight)
            if transposed:
                self._workspace("backward filter", grad_output, w, x, groups)
            else:
                self._workspace("backward filter", x, w, grad_output, groups)
        self._record_outputs(_CONV_BACKWARD, grad_bias)

    def _record_outputs(self, func: Any, out: Any) -> None:
        for t in _output_tensors(out):
            if not on_meta(t):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._host or key in self._script_meta:
                continue
            size_bytes = int(storage.nbytes())
            block = self._live.get(key)
            if block is not None and block() is storage:
                if block.size_bytes == size_bytes:
                    continue
                self._free(key)        # grown by resize_ or out=: the old block goes back
            if size_bytes > 0:
                self._alloc(storage, size_bytes, func.name())

    # ----------------------------------------------------------------- program events
    def marker(self, label: str) -> None:
        """Record ``label`` (a step boundary, a memory-history call) at the current time."""
        with self._lock:
            self._settle()
            if self.active:
                self.channel.send(["M", self.now_ns(), text(label)])
                self.channel.flush()

    def empty_cache(self) -> None:
        """Record the script's ``torch.cuda.empty_cache()``."""
        with self._lock:
            self._settle()
            if self.active:
                self.channel.send(["E", self.now_ns()])

    def note(self, note: str) -> None:
        """A fact the trace should carry (something the capture answered differently from a GPU)."""
        self.channel.send(["N", text(note)])

    def stop(self) -> None:
        """Stop recording; storages still alive stay live in the trace (the script ended with them).

        Blocks held for recorded uses on other streams go back now: the script ended, the device is idle.
        """
        with self._lock:
            self._settle()
            if self.active:
                released(self.clock.release_all(), self.channel.send, self.now_ns)
            self.active = False


_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


#: Functional-collective ops whose CUDA result is their input, where meta makes a new tensor:
#: ``_c10d_functional::wait_tensor`` waits for the collective and returns the same tensor
#: (torch/csrc/distributed/c10d/Functional.cpp); ``_wrap_tensor_autograd`` returns
#: ``AsyncCollectiveTensor(input)``, a wrapper around it (torch/distributed/_functional_collectives.py,
#: registered when that module is imported: matched by name).
_ALIAS_ON_CUDA = frozenset({"_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd"})
_alias_op: dict[Any, bool] = {}


def _is_alias_op(func: Any) -> bool:
    known = _alias_op.get(func)
    if known is None:
        known = _alias_op[func] = func.name() in _ALIAS_ON_CUDA
    return known


def _zero_scalar(dtype: torch.dtype) -> Any:
    """The Python zero ``.item()`` gives for ``dtype``."""
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


class Recorder(TorchDispatchMode):
    """The dispatch mode of one thread: every operator's outputs go to the shared ``StorageTracker``."""

    def __init__(self, tracker: StorageTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass(t) for t in _tensors(args, kwargs)):
            # a DTensor (or another wrapper) holds no memory itself: its own dispatch runs the
            # operator on its local tensors, which this mode then sees and records
            return NotImplemented
        if func is _LOCAL_SCALAR and args and isinstance(args[0], torch.Tensor) and args[0].device.type == CAPTURE_DEVICE:
            # A read-back the torch-function mode did not see (``Tensor.__contains__`` and other Python
            # methods call ``.item()`` while that mode is off): zero, as every read-back answers.
            self.tracker.host_waits()
            return _zero_scalar(args[0].dtype)
        if _is_alias_op(func) and args and isinstance(args[0], torch.Tensor) and args[0].device.type == CAPTURE_DEVICE:
            return args[0]                                  # the same tensor, as on CUDA: no new block
        uploads = self.tracker.uploads
        answer = uploads.dispatch(func, args, kwargs)      # a device-to-host copy C++ code makes
        if answer is not NotImplemented:
            return answer
        out = func(*args, **kwargs)
        self.tracker.on_operator(func, args, kwargs, out)
        uploads.after(func, args, out)
        return out
