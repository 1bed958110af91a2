"""Ask ``scratch_requests(op_name, args_meta, gpu)`` which device memory a CUDA kernel takes that a meta run cannot show.

``allocsim capture`` runs a script with ``cuda`` mapped to ``meta`` and records every storage an ATen
operator returns. Some CUDA implementations also ask PyTorch's caching allocator for memory that
never leaves the operator: the staging buffer and semaphores of a reduction split across thread
blocks, the cast copy a reduction makes of its input, the partial-gradient buffers of a layer-norm
backward, the sort buffers of an embedding backward, the accumulators of a flash-attention backward,
the cuBLAS workspace. Their meta kernels allocate none of it. This module says, for one operator call
described by plain shapes, strides (in elements) and dtype names, which requests the CUDA run makes,
in order, with their exact byte sizes and how long each lives; it imports nothing but the standard
library (``requests_for_call`` takes torch tensors and imports torch lazily).

What each request models, and the PyTorch source it was read from, is in ``docs/cuda_scratch.md``.
Sources read: PyTorch 2.13.0's installed ``ATen/native/cuda/Reduce.cuh`` and ``ReduceOpsUtils.h``
(identical in 2.14.1 but for an equivalent ``std::clamp``), the reduction kernels instantiated in the
2.14.1 CUDA wheel's ``libtorch_cuda.so`` (their template arguments: ``vt0``, ``input_vec_size``,
accumulation types), and ``pytorch/pytorch`` sources for the other operators. ``torch_version``
switches the few rules that differ in 2.6 (validated against real 2.6 snapshots, see the tests).

Lifetimes: ``"kernel"`` requests are freed right after their kernel, in reverse order of the requests
that share their ``launch``; ``"op"`` requests are freed when the operator returns (in reverse order);
``"kept"`` requests stay allocated after the operator (the cuBLAS workspace). ``scratch_events``
turns a list into the alloc/free sequence the CUDA run makes.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from . import cudnn_rnn_model, torch_versions   # version keys only: importing them does not import torch

# ----------------------------------------------------------------------------- dtypes

#: Bytes per element of each dtype, by the name torch prints without ``torch.``.
DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "bool": 1, "complex128": 16, "cdouble": 16, "complex64": 8, "cfloat": 8, "complex32": 4,
    "chalf": 4, "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}
_CANONICAL = {"double": "float64", "float": "float32", "half": "float16", "long": "int64", "int": "int32",
              "short": "int16", "cdouble": "complex128", "cfloat": "complex64", "chalf": "complex32"}
_LOWP_FLOAT = ("float16", "bfloat16")
_COMPLEX = ("complex32", "complex64", "complex128")
_INTEGRAL = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")


def dtype_name(dtype: Any) -> str:
    """Give a dtype as torch prints it (``torch.bfloat16``) or by name (``"bfloat16"``); get the canonical name."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    name = _CANONICAL.get(name, name)
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(f"unknown dtype {dtype!r}")
    return name


def itemsize(dtype: str) -> int:
    """Look up the bytes per element of a dtype name (``"bfloat16"`` -> 2)."""
    return DTYPE_ITEMSIZE[dtype_name(dtype)]


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


class TensorMeta(NamedTuple):
    """Describe one tensor argument: ``TensorMeta((4, 128, 10000), (1280000, 10000, 1), "float32")``.

    ``strides`` are in elements (as ``tensor.stride()``); ``storage_offset`` in elements too (it moves
    the data pointer off the allocator's 512-byte alignment, which the vectorisation checks read).
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    storage_offset: int = 0

    @classmethod
    def contiguous(cls, shape: Sequence[int], dtype: str) -> "TensorMeta":
        """Build a row-major tensor of ``shape``: ``TensorMeta.contiguous((512, 10000), "float32")``."""
        shape = tuple(int(s) for s in shape)
        return cls(shape, _contiguous_strides(shape), dtype_name(dtype))

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def is_contiguous(self) -> bool:
        return all(size == 1 or stride == expected
                   for size, stride, expected in zip(self.shape, self.strides, _contiguous_strides(self.shape)))

    def is_non_overlapping_and_dense(self) -> bool:
        """True when the elements fill ``numel`` consecutive slots in some dimension order (a permuted row-major layout)."""
        dims = sorted((d for d in range(len(self.shape)) if self.shape[d] != 1), key=lambda d: abs(self.strides[d]))
        expected = 1
        for d in dims:
            if self.strides[d] != expected:
                return False
            expected *= self.shape[d]
        return True


# ----------------------------------------------------------------------------- GPUs


class GpuProps(NamedTuple):
    """Describe the target GPU as ``cudaDeviceProp`` does: ``GpuProps("H100", 132, 2048, compute_capability=(9, 0))``."""

    name: str
    sm_count: int                    # multiProcessorCount
    max_threads_per_sm: int          # maxThreadsPerMultiProcessor
    warp_size: int = 32
    max_threads_per_block: int = 1024
    compute_capability: tuple[int, int] = (9, 0)


#: Common training GPUs (values from NVIDIA's specifications; the SXM variants where two exist).
GPUS: dict[str, GpuProps] = {g.name: g for g in (
    GpuProps("H100", 132, 2048, compute_capability=(9, 0)),
    GpuProps("H100-PCIe", 114, 2048, compute_capability=(9, 0)),
    GpuProps("H200", 132, 2048, compute_capability=(9, 0)),
    GpuProps("B200", 148, 2048, compute_capability=(10, 0)),
    GpuProps("A100", 108, 2048, compute_capability=(8, 0)),
    GpuProps("A10G", 80, 1536, compute_capability=(8, 6)),
    GpuProps("A6000", 84, 1536, compute_capability=(8, 6)),
    GpuProps("L4", 58, 1536, compute_capability=(8, 9)),
    GpuProps("L40S", 142, 1536, compute_capability=(8, 9)),
    GpuProps("RTX3060", 28, 1536, compute_capability=(8, 6)),
    GpuProps("RTX3090", 82, 1536, compute_capability=(8, 6)),
    GpuProps("RTX4090", 128, 1536, compute_capability=(8, 9)),
    GpuProps("V100", 80, 2048, compute_capability=(7, 0)),
    GpuProps("T4", 40, 1024, compute_capability=(7, 5)),
)}


def gpu_props(gpu: GpuProps | str) -> GpuProps:
    """Pass a ``GpuProps`` or a name from ``GPUS`` (``"H100"``, case-insensitive); get the properties."""
    if isinstance(gpu, GpuProps):
        return gpu
    for name, props in GPUS.items():
        if name.lower() == str(gpu).lower():
            return props
    raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)} (or pass a GpuProps)")


# ----------------------------------------------------------------------------- requests


class ScratchRequest(NamedTuple):
    """One request to the caching allocator: ``size_bytes`` as asked (before the allocator rounds it), and its life.

    ``lifetime`` is ``"kernel"`` (freed after its kernel, with the other requests of the same
    ``launch``, in reverse order), ``"op"`` (freed when the operator returns) or ``"kept"`` (stays).
    """

    size_bytes: int
    label: str
    lifetime: str = "kernel"
    launch: int = 0


def scratch_events(requests: Iterable[ScratchRequest]) -> list[tuple[str, int]]:
    """Turn requests into the CUDA run's order of events: ``[("alloc", 0), ("alloc", 1), ("free", 1), ...]``.

    Indices point into ``requests``. A kernel's requests are freed (last first) before the next
    request of another launch is made; operator-lifetime requests are freed at the end, last first.
    """
    requests = list(requests)
    events: list[tuple[str, int]] = []
    pending: list[int] = []
    pending_launch: int | None = None
    held: list[int] = []
    for i, req in enumerate(requests):
        if pending and (req.lifetime != "kernel" or req.launch != pending_launch):
            events.extend(("free", j) for j in reversed(pending))
            pending = []
        events.append(("alloc", i))
        if req.lifetime == "kernel":
            pending.append(i)
            pending_launch = req.launch
        elif req.lifetime == "op":
            held.append(i)
    events.extend(("free", j) for j in reversed(pending))
    events.extend(("free", j) for j in reversed(held))
    return events


class _Requests:
    """Collects requests; numbers kernel launches."""

    def __init__(self) -> None:
        self.items: list[ScratchRequest] = []
        self.launch = 0

    def kernel(self, pairs: Sequence[tuple[int, str]]) -> None:
        self.launch += 1
        for size_bytes, label in pairs:
            if size_bytes > 0:        # allocate(0) is a null pointer, not a request
                self.items.append(ScratchRequest(int(size_bytes), label, "kernel", self.launch))

    def op(self, size_bytes: int, label: str) -> None:
        if size_bytes > 0:
            self.items.append(ScratchRequest(int(size_bytes), label, "op", 0))

    def kept(self, size_bytes: int, label: str) -> None:
        if size_bytes > 0:
            self.items.append(ScratchRequest(int(size_bytes), label, "kept", 0))

    def extend(self, other: list[ScratchRequest]) -> None:
        """Append another operator's requests (its launches renumbered after ours)."""
        base = self.launch
        for req in other:
            launch = req.launch + base if req.lifetime == "kernel" else 0
            self.launch = max(self.launch, launch)
            self.items.append(req._replace(launch=launch))


# ----------------------------------------------------------------------------- TensorIterator (reductions)

_INT32_MAX = 2**31 - 1
#: The caching allocator hands out blocks aligned to 512 bytes (kMinBlockSize).
_BLOCK_ALIGN_BYTES = 512


class _Iter:
    """The part of a reduction ``TensorIterator`` the CUDA config reads: shape, byte strides, data offsets.

    Operand 0..noutputs-1 are the outputs, the last operand is the input (``iter.ntensors() - 1``).
    """

    def __init__(self, shape: list[int], strides: list[list[int]], offsets: list[int], noutputs: int):
        self.shape = shape
        self.strides = strides
        self.offsets = offsets
        self.noutputs = noutputs

    def copy(self) -> "_Iter":
        return _Iter(list(self.shape), [list(s) for s in self.strides], list(self.offsets), self.noutputs)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def num_output_elements(self) -> int:
        return math.prod(size for size, st in zip(self.shape, self.strides[0]) if st != 0 or size == 0)

    def num_reduce_dims(self) -> int:
        return sum(1 for st in self.strides[0] if st == 0)

    def can_use_32bit_indexing(self) -> bool:
        if self.numel() > _INT32_MAX:
            return False
        for strides in self.strides:
            max_offset = 1 + sum((size - 1) * st for size, st in zip(self.shape, strides))
            if max_offset > _INT32_MAX:
                return False
        return True

    def dim_to_split(self) -> int:
        max_extent, dim_to_split = -1, -1
        for dim in range(self.ndim - 1, -1, -1):
            size = self.shape[dim]
            if size == 0:
                continue
            for strides in self.strides:
                extent = (size - 1) * abs(strides[dim])
                if extent > max_extent:
                    max_extent, dim_to_split = extent, dim
        return dim_to_split

    def narrow(self, dim: int, start: int, size: int) -> None:
        # reductions are not re-coalesced after narrowing (TensorIteratorBase::narrow)
        self.shape[dim] = size
        for k, strides in enumerate(self.strides):
            self.offsets[k] += strides[dim] * start

    def with_32bit_indexing(self) -> list["_Iter"]:
        """The sub-iterators ``SplitUntil32Bit`` yields, in order (first halves first, depth first)."""
        if self.can_use_32bit_indexing():
            return [self]
        out: list[_Iter] = []
        stack = [self.copy()]
        while stack:
            top = stack[-1]
            if top.can_use_32bit_indexing():
                out.append(stack.pop())
                continue
            dim = top.dim_to_split()
            copy_size = top.shape[dim] // 2
            first = top.copy()
            first.narrow(dim, 0, copy_size)
            top.narrow(dim, copy_size, top.shape[dim] - copy_size)
            stack.append(first)
        return out


def _reorder_and_coalesce(shape: list[int], strides: list[list[int]], noutputs: int) -> tuple[list[int], list[list[int]]]:
    """TensorIteratorBase::reorder_dimensions (reduced dims first, then by stride) and coalesce_dimensions."""
    ndim = len(shape)
    if ndim > 1:
        perm = list(range(ndim - 1, -1, -1))

        def should_swap(dim0: int, dim1: int) -> int:
            for k, st in enumerate(strides):
                stride0, stride1 = st[dim0], st[dim1]
                if k < noutputs and (stride0 == 0) != (stride1 == 0):
                    return 1 if stride1 == 0 else -1       # move reduced dimensions to the front
                if stride0 == 0 or stride1 == 0:
                    continue
                if stride0 < stride1:
                    return -1
                if stride0 > stride1:
                    return 1
                if shape[dim0] > shape[dim1]:               # equal strides: the smaller size goes first
                    return 1
            return 0

        for i in range(1, ndim):
            dim1 = i
            for dim0 in range(i - 1, -1, -1):
                comparison = should_swap(perm[dim0], perm[dim1])
                if comparison > 0:
                    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                    dim1 = dim0
                elif comparison < 0:
                    break
        shape = [shape[p] for p in perm]
        strides = [[st[p] for p in perm] for st in strides]
    else:
        shape = list(shape)
        strides = [list(st) for st in strides]
    if ndim <= 1:
        return shape, strides
    prev = 0
    for dim in range(1, ndim):
        if shape[prev] == 1 or shape[dim] == 1 or all(shape[prev] * st[prev] == st[dim] for st in strides):
            if shape[prev] == 1:
                for st in strides:
                    st[prev] = st[dim]
            shape[prev] *= shape[dim]
        else:
            prev += 1
            if prev != dim:
                for st in strides:
                    st[prev] = st[dim]
                shape[prev] = shape[dim]
    shape = shape[:prev + 1]
    strides = [st[:prev + 1] for st in strides]
    return shape, strides


def _wrap_dims(dims: Any, ndim: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    dims = tuple(int(d) for d in dims)
    if not dims:
        return tuple(range(ndim))          # dim=[] reduces everything (make_dim_mask)
    wrapped = []
    for d in dims:
        extent = max(ndim, 1)
        if not -extent <= d < extent:
            raise ValueError(f"dimension {d} out of range for a {ndim}-d tensor")
        wrapped.append(d % extent if ndim else 0)
    return tuple(sorted(set(wrapped)))


def reduction_iter(inp: TensorMeta, dims: Any = None, keepdim: bool = False, noutputs: int = 1,
                   out_itemsizes: Sequence[int] | None = None) -> _Iter:
    """Build the TensorIterator a CUDA reduction of ``inp`` over ``dims`` runs on (outputs contiguous, as allocated)."""
    ndim = len(inp.shape)
    reduce = set(_wrap_dims(dims, ndim)) if ndim else set()
    out_itemsizes = list(out_itemsizes or [inp.itemsize] * noutputs)
    kd_shape = [1 if d in reduce else inp.shape[d] for d in range(ndim)]
    out_strides_all: list[list[int]] = []
    for k in range(noutputs):
        if keepdim:
            strides = list(_contiguous_strides(kd_shape))
        else:
            kept = [inp.shape[d] for d in range(ndim) if d not in reduce]
            packed = iter(_contiguous_strides(kept))
            strides = [0 if d in reduce else next(packed) for d in range(ndim)]
        # compute_strides: a size-1 operand dim broadcast against a larger shape gets stride 0
        out_strides_all.append([0 if (kd_shape[d] == 1 and inp.shape[d] != 1) else strides[d] * out_itemsizes[k]
                                for d in range(ndim)])
    in_strides = [inp.strides[d] * inp.itemsize for d in range(ndim)]
    shape, strides = _reorder_and_coalesce(list(inp.shape), out_strides_all + [in_strides], noutputs)
    offsets = [0] * noutputs + [inp.storage_offset * inp.itemsize]
    return _Iter(shape, strides, offsets, noutputs)


# ----------------------------------------------------------------------------- Reduce.cuh


class KernelSpec(NamedTuple):
    """The template arguments of one ``gpu_reduce_kernel`` instantiation, as byte sizes.

    ``scalar_bytes``: input element; ``out_bytes``: first output element; ``arg_bytes``: the
    accumulation type ``arg_t`` of the ops (e.g. 16 for ``pair<float, int64_t>``); ``vt0`` and
    ``input_vec_size`` the template parameters; ``can_accumulate_in_output`` as computed in
    ``gpu_reduce_kernel``; ``jitted`` for ``jitted_gpu_reduce_kernel`` (its accumulation buffer
    never allocates); ``max_threads`` 512 (256 for complex double).
    """

    scalar_bytes: int
    out_bytes: int
    arg_bytes: int
    vt0: int = 4
    input_vec_size: int = 4
    can_accumulate_in_output: bool = True
    jitted: bool = False
    max_threads: int = 512


class ReduceConfig(NamedTuple):
    """The launch ``setReduceConfig`` chose for one (sub-)iterator, and the two buffers it implies."""

    num_outputs: int
    num_inputs: int
    block_width: int
    block_height: int
    output_vec_size: int
    vectorize_input: bool
    step_input: int
    step_output: int
    ctas_per_output: int
    input_mult: tuple[int, int, int]
    grid_x: int
    global_memory_bytes: int
    semaphore_bytes: int


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def _last_pow2(n: int) -> int:
    n = int(n)
    if n < 1:
        return 1
    return 1 << (n.bit_length() - 1)


def _output_vec_size(it: _Iter, scalar_bytes: int) -> int:
    vec = 4

    def update(n: int) -> None:
        nonlocal vec
        while n % vec != 0:
            vec //= 2

    # data_ptr(noutputs) / sizeof(scalar_t): the block base is 512-byte aligned, so only the offset matters
    update(it.offsets[it.noutputs] // scalar_bytes)
    output_index = it.num_reduce_dims()
    update(it.shape[output_index])
    for j, st in enumerate(it.strides[it.noutputs]):
        if j != output_index:
            update(int(st / scalar_bytes))
    return vec


def reduce_config(it: _Iter, spec: KernelSpec, gpu: GpuProps, *, legacy: bool = False,
                  gated: bool = False) -> ReduceConfig:
    """Run ``setReduceConfig`` (Reduce.cuh) on one 32-bit-indexable iterator; ``legacy`` is PyTorch <= 2.6's rule,
    ``gated`` the rule of the releases between (``torch_versions.REDUCE_RULES``)."""
    num_outputs = it.num_output_elements()
    inputs_per_output = it.numel() // num_outputs
    in_strides = it.strides[-1]
    nrd = it.num_reduce_dims()
    if it.ndim > 0:
        fastest = nrd == it.ndim or in_strides[0] < in_strides[nrd]
        if fastest:
            dim0, dim1, fastest_stride = inputs_per_output, num_outputs, in_strides[0]
        else:
            dim0, dim1, fastest_stride = num_outputs, inputs_per_output, in_strides[nrd]
    else:
        fastest, fastest_stride, dim0, dim1 = True, spec.scalar_bytes, 1, 1

    vectorize_input, output_vec = False, 1
    if fastest_stride == spec.scalar_bytes:
        if legacy:
            # <= 2.6: ReduceConfig::input_vec_size == 4, used only when vt0 >= 4, and dim0 > 128
            vec_in = fastest and dim0 > 128 and nrd == 1 and spec.vt0 >= 4
            input_vec = 4
        elif gated:
            # 2.7 on, until the gate went: the kernel's own input_vec_size, used only when vt0 >= it, dim0 > 128
            vec_in = fastest and dim0 > 128 and nrd == 1 and spec.vt0 >= spec.input_vec_size
            input_vec = spec.input_vec_size
        else:
            vec_in = fastest and dim0 >= 128 and nrd == 1
            input_vec = spec.input_vec_size
        if vec_in:
            vectorize_input = True
            dim0 //= input_vec
        elif not fastest:
            output_vec = _output_vec_size(it, spec.scalar_bytes)
            dim0 //= output_vec

    max_num_threads = spec.max_threads // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_num_threads else max_num_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_num_threads else max_num_threads
    block_width = min(dim0_pow2, gpu.warp_size)
    block_height = min(dim1_pow2, max_num_threads // block_width)
    block_width = min(dim0_pow2, max_num_threads // block_height)
    num_threads = block_width * block_height

    step_input = step_output = 1
    input_mult = [0, 0, 0]
    if it.ndim == 0 or fastest:
        input_mult[0] = step_input
        step_input *= block_width
    else:
        step_output *= block_width

    min_values_per_thread, max_values_per_thread = 16, 256
    if _div_up(inputs_per_output, step_input) >= min(block_height * 16, max_values_per_thread):
        input_mult[1] = step_input
        step_input *= block_height
    else:
        step_output *= block_height

    blocks_per_sm = gpu.max_threads_per_sm // num_threads
    target_grid_size = gpu.sm_count * blocks_per_sm
    grid_x = _div_up(num_outputs // output_vec, step_output)
    ctas_per_output = 1
    values_per_thread = _div_up(inputs_per_output, step_input)
    if input_mult[1] != 0 and values_per_thread >= max_values_per_thread and grid_x <= target_grid_size:
        ctas1 = _div_up(target_grid_size, grid_x)
        ctas2 = _div_up(values_per_thread, min_values_per_thread)
        ctas3 = _div_up(values_per_thread, max_values_per_thread)
        ctas_per_output = max(min(ctas1, ctas2), ctas3)
        if ctas_per_output > 1:
            input_mult[2] = step_input
            step_input *= ctas_per_output

    global_bytes = semaphore_bytes = 0
    if input_mult[2] != 0:
        global_bytes = spec.arg_bytes * num_outputs * ctas_per_output
        if input_mult[0] == 0:                  # no block_x_reduce: one slot per lane and vector element
            global_bytes *= block_width * output_vec
        semaphore_bytes = 4 * grid_x            # sizeof(int) * grid().x
    return ReduceConfig(num_outputs, inputs_per_output, block_width, block_height, output_vec, vectorize_input,
                        step_input, step_output, ctas_per_output, tuple(input_mult), grid_x,
                        global_bytes, semaphore_bytes)


def gpu_reduce_requests(it: _Iter, spec: KernelSpec, gpu: GpuProps, *, legacy: bool = False, gated: bool = False,
                        label: str = "reduce") -> list[ScratchRequest]:
    """List what ``gpu_reduce_kernel`` asks the caching allocator for on iterator ``it``, in order."""
    reqs = _Requests()
    if it.numel() == 0:
        return []
    top_32bit = it.can_use_32bit_indexing()
    if not spec.can_accumulate_in_output and not top_32bit and not spec.jitted:
        out_bytes = spec.out_bytes
        out_memory = max([out_bytes] + [size * st for size, st in zip(it.shape, it.strides[0])])
        if out_bytes < spec.arg_bytes:
            reqs.op((out_memory // out_bytes) * spec.arg_bytes, f"{label}: accumulation buffer (AccumulationBuffer)")
    subs = it.with_32bit_indexing()
    for n, sub in enumerate(subs):
        cfg = reduce_config(sub, spec, gpu, legacy=legacy, gated=gated)
        part = f" (sub-iterator {n + 1}/{len(subs)})" if len(subs) > 1 else ""
        reqs.kernel([(cfg.global_memory_bytes, f"{label}: global reduce buffer{part}"),
                     (cfg.semaphore_bytes, f"{label}: semaphores{part}")])
    return reqs.items


# ----------------------------------------------------------------------------- reduction operators

#: The families of ``gpu_reduce_kernel`` callers; ``ATEN_REDUCTIONS`` maps ATen names onto them.
REDUCTION_FAMILIES = ("sum", "nansum", "mean", "prod", "amax", "max_dim", "argmax", "aminmax", "var",
                      "norm", "any_all")

#: ATen operator base name -> (family, number of outputs, how the input dtype is chosen).
ATEN_REDUCTIONS: dict[str, tuple[str, int, str]] = {
    "sum": ("sum", 1, "out_ty"), "nansum": ("nansum", 1, "out_ty"), "mean": ("mean", 1, "out_ty"),
    "prod": ("prod", 1, "out_ty"),
    "amax": ("amax", 1, "self"), "amin": ("amax", 1, "self"),
    "max": ("amax", 1, "self"), "min": ("amax", 1, "self"),               # all-reduce overloads
    "argmax": ("argmax", 1, "self"), "argmin": ("argmax", 1, "self"),
    "aminmax": ("aminmax", 2, "self"), "_aminmax": ("aminmax", 2, "self"),
    "var": ("var", 1, "self"), "std": ("var", 1, "self"),
    "var_mean": ("var", 2, "self"), "std_mean": ("var", 2, "self"),
    "linalg_vector_norm": ("norm", 1, "norm"), "norm": ("norm", 1, "norm"),
    "any": ("any_all", 1, "self"), "all": ("any_all", 1, "self"),
}


def _opmath_bytes(dtype: str) -> int:
    if dtype in _LOWP_FLOAT:
        return 4
    if dtype == "complex32":
        return 8
    return itemsize(dtype)


def reduction_kernel_spec(family: str, scalar_dtype: str, out_dtype: str, *, legacy: bool = False) -> KernelSpec:
    """Give the ``gpu_reduce_kernel`` template arguments CUDA PyTorch uses for a reduction family and dtypes.

    Read from ReduceSumProdKernel.cu, ReduceMomentKernel.cu, ReduceMaxValuesKernel.cu,
    ReduceArgMaxKernel.cu, ReduceAMinMaxKernel.cu, ReduceNormKernel.cu, ReduceLogicKernel.cu and the
    instantiations in the 2.14.1 ``libtorch_cuda.so``; ``legacy`` drops the 8-wide input vector of
    16-bit sums and means, which 2.6 did not have. Complex double reductions launch at most 256
    threads per block (``mnt_wrapper``).
    """
    spec = _kernel_spec(family, scalar_dtype, out_dtype, legacy)
    if dtype_name(scalar_dtype) == "complex128":
        spec = spec._replace(max_threads=256)
    return spec


def _kernel_spec(family: str, scalar_dtype: str, out_dtype: str, legacy: bool) -> KernelSpec:
    s, o = dtype_name(scalar_dtype), dtype_name(out_dtype)
    sb, ob = itemsize(s), itemsize(o)
    half_same = s == o and s in (*_LOWP_FLOAT, "complex32")
    if family in ("sum", "mean"):
        arg = _opmath_bytes(s) if s in (*_LOWP_FLOAT, "complex32") else sb
        ivs = 8 if (sb == 2 and not legacy and s != "complex32") else 4
        return KernelSpec(sb, ob, arg, 4, ivs, not half_same)
    if family == "nansum":
        return KernelSpec(sb, ob, _opmath_bytes(s), 4, 4, not half_same)
    if family == "prod":
        if s == "bool":
            return KernelSpec(1, 1, 1, 4, 4, True)
        return KernelSpec(sb, ob, _opmath_bytes(s), 4, 4, not half_same, jitted=True)
    if family == "amax":                       # func_wrapper<scalar_t>(MaxNanFunctor<scalar_t>): arg_t == scalar_t
        return KernelSpec(sb, ob, sb, 4, 4, not half_same)
    if family == "max_dim":                    # MaxOps / MinOps: pair<scalar_t, int64_t>
        return KernelSpec(sb, ob, 16, 4, 4, False)
    if family == "argmax":                     # ArgMaxOps<acc_t>: pair<acc_t, int64_t>, output int64
        return KernelSpec(sb, 8, 16, 4, 4, False)
    if family == "aminmax":                    # MinMaxOps: pair<scalar_t, scalar_t>
        return KernelSpec(sb, ob, 2 * sb, 4, 4, False)
    if family == "var":                        # WelfordOps: WelfordData<acc_t, int> {mean, m2, n, nf}
        arg = 32 if s == "float64" else 16
        return KernelSpec(sb, ob, arg, 2, 2, False)
    if family == "norm":
        arg = 8 if s in ("float64", "complex128") else 4
        return KernelSpec(sb, ob, arg, 4, 4, not half_same)
    if family == "any_all":
        return KernelSpec(sb, 1, 1, 4, 4, True)
    raise ValueError(f"unknown reduction family {family!r}; known: {', '.join(REDUCTION_FAMILIES)}")


def _reduction_input_dtype(rule: str, in_dtype: str, out_dtype: str) -> str:
    """The dtype the TensorIterator reads (ReduceOpsUtils.h make_reduction / make_reduction_from_out_ty)."""
    if rule in ("out_ty", "norm"):
        if in_dtype in _LOWP_FLOAT and out_dtype == "float32":
            return in_dtype                   # gpu_lowp_to_f32: cast and reduce in one kernel
        if rule == "norm" and in_dtype in _COMPLEX:
            return in_dtype
        return out_dtype
    return in_dtype


def reduction_scratch(family: str, inp: TensorMeta, dims: Any = None, keepdim: bool = False, *,
                      out_dtype: str | None = None, gpu: GpuProps | str = "H100", noutputs: int = 1,
                      input_rule: str = "out_ty", torch_version: tuple[int, int] = (2, 13),
                      label: str | None = None) -> list[ScratchRequest]:
    """List the requests a CUDA reduction of ``inp`` over ``dims`` makes: ``reduction_scratch("sum", t, -1, gpu="H100")``.

    Covers the cast copy ``make_reduction`` makes when the input's dtype is not the one the kernel
    reads (e.g. ``sum`` of int32 reads int64), the ``AccumulationBuffer`` of reductions that need
    64-bit indexing, and the global reduce buffer and semaphores of each kernel launch.
    """
    gpu = gpu_props(gpu)
    rule = torch_versions.reduce_rule_for(torch_version)
    legacy, gated = rule == "vec4", rule == "per_kernel_gated"
    out_dtype = dtype_name(out_dtype or inp.dtype)
    label = label or family
    reqs = _Requests()
    if inp.numel == 0:
        return []
    read_dtype = _reduction_input_dtype(input_rule, inp.dtype, out_dtype)
    src = inp
    if read_dtype != inp.dtype:
        # self.to(in_dtype): a dense input keeps its strides (preserve_format), others become row-major
        strides = inp.strides if inp.is_non_overlapping_and_dense() else _contiguous_strides(inp.shape)
        src = TensorMeta(inp.shape, tuple(strides), read_dtype)
        reqs.op(src.nbytes, f"{label}: input cast to {read_dtype} (make_reduction self.to)")
    out_bytes = [itemsize(out_dtype)] + ([8] if family in ("max_dim",) else [itemsize(out_dtype)]) * (noutputs - 1)
    it = reduction_iter(src, dims, keepdim, noutputs, out_bytes)
    spec = reduction_kernel_spec(family, read_dtype, out_dtype, legacy=legacy)
    reqs.extend(gpu_reduce_requests(it, spec, gpu, legacy=legacy, gated=gated, label=label))
    return reqs.items


# ----------------------------------------------------------------------------- other operators


def _contiguous_copy(reqs: _Requests, t: TensorMeta | None, label: str) -> None:
    if t is not None and not t.is_contiguous():
        reqs.op(t.nbytes, f"{label} (.contiguous() copy)")


def layer_norm_backward_scratch(grad_out: TensorMeta, inp: TensorMeta, normalized_ndim: int,
                                weight: TensorMeta | None, bias: TensorMeta | None = None, *,
                                output_mask: Sequence[bool] = (True, True, True), rms_norm: bool = False,
                                gpu: GpuProps | str = "H100",
                                torch_version: tuple[int, int] = (2, 13)) -> list[ScratchRequest]:
    """List the hidden requests of ``native_layer_norm_backward`` / ``_fused_rms_norm_backward`` on CUDA.

    layer_norm_kernel.cu: ``X``/``gamma``/``beta`` ``expect_contiguous()`` and ``dY.contiguous()``
    copies; for ``M > 65536`` rows and ``N / 32 < SMs / 2`` columns (PyTorch >= 2.7) the two-pass
    gamma/beta gradient: ``dgamma_blocks``/``dbeta_blocks`` of ``blocks.y x N`` in the weight's dtype,
    then ``dgamma_blocks.sum(0)`` (a reduction whose result replaces the preallocated gradient).
    """
    gpu = gpu_props(gpu)
    reqs = _Requests()
    _contiguous_copy(reqs, inp, "input")
    _contiguous_copy(reqs, weight, "weight")
    if not rms_norm:
        _contiguous_copy(reqs, bias, "bias")
    _contiguous_copy(reqs, grad_out, "grad_out")
    n_cols = math.prod(inp.shape[len(inp.shape) - normalized_ndim:]) if normalized_ndim else 1
    m_rows = inp.numel // n_cols if n_cols else 0
    want_dgamma = weight is not None and output_mask[1]
    want_dbeta = (not rms_norm) and bias is not None and len(output_mask) > 2 and output_mask[2]
    if m_rows == 0 or n_cols == 0 or not (want_dgamma or want_dbeta) or tuple(torch_version) < torch_versions.LAYER_NORM_TWO_PASS:
        return reqs.items
    block_dim_x = 32
    if m_rows > 64 * 1024 and n_cols // block_dim_x < gpu.sm_count // 2:
        blocks_x = _div_up(n_cols, block_dim_x)
        blocks_y = min((64 * 1024 // 2) // blocks_x, _div_up(m_rows, 32))
        wdtype = (weight or bias).dtype
        partial = TensorMeta.contiguous((blocks_y, n_cols), wdtype)
        names = [("gamma", want_dgamma), ("beta", want_dbeta)]
        for name, wanted in names:
            if wanted:
                reqs.op(partial.nbytes, f"layer_norm backward: d{name}_blocks ({blocks_y} x {n_cols})")
        for name, wanted in names:
            if wanted:
                reqs.op(itemsize(wdtype) * n_cols, f"layer_norm backward: d{name}_blocks.sum(0) result")
                reqs.extend(reduction_scratch("sum", partial, 0, out_dtype=wdtype, gpu=gpu,
                                              torch_version=torch_version, label=f"d{name}_blocks.sum(0)"))
    return reqs.items


#: EmbeddingBackwardKernel.cu: rows summed per thread in one partial segment.
_NROWS_PER_THREAD = 10


def embedding_dense_backward_scratch(grad_out: TensorMeta, indices: TensorMeta, num_weights: int, *,
                                     scale_grad_by_freq: bool = False) -> list[ScratchRequest]:
    """List the hidden requests of ``embedding_dense_backward`` on CUDA (Embedding.cu, EmbeddingBackwardKernel.cu).

    Up to 3072 indices (without ``scale_grad_by_freq``) it runs one kernel with no scratch. Above,
    it sorts the indices (``sorted_indices``, ``orig_indices``, an ``arange``) and builds segment
    tables (``segment_offsets``, ``partials_per_segment``, ``partial_segment_offset``, the per-segment
    partial sums ``grad_weight_per_segment`` in the accumulation type). CUB's own temporary storage
    (radix sort, unique-by-key, exclusive sum) is sized inside CUB and is NOT included.
    """
    reqs = _Requests()
    _contiguous_copy(reqs, grad_out, "grad_output")
    num_indices = indices.numel
    dim = grad_out.shape[-1] if grad_out.shape else 1
    if num_indices <= 3072 and not scale_grad_by_freq:
        return reqs.items
    ib = indices.itemsize
    reqs.op(num_indices * ib, "embedding backward: sorted_indices")
    reqs.op(num_indices * ib, "embedding backward: orig_indices")
    reqs.kernel([(num_indices * ib, "embedding backward: arange for the radix sort (freed after it)")])
    if scale_grad_by_freq:
        reqs.op(num_indices * ib, "embedding backward: count")
    max_segments = min(num_indices, num_weights)
    max_partial_segment = num_indices // _NROWS_PER_THREAD + max_segments
    acc = 4 if grad_out.dtype in _LOWP_FLOAT else grad_out.itemsize
    reqs.op(num_indices * ib, "embedding backward: segment_offsets")
    reqs.op(8, "embedding backward: num_of_segments")
    reqs.kernel([(num_indices * ib, "embedding backward: unique_by_key keys_out (freed after it)")])
    reqs.op(max_segments * ib, "embedding backward: partials_per_segment")
    reqs.op(max_segments * ib, "embedding backward: partials_per_segment_offset")
    reqs.op(8, "embedding backward: num_of_partial_segments")
    reqs.op(max_partial_segment * ib, "embedding backward: partial_segment_offset")
    reqs.op(max_partial_segment * dim * acc, "embedding backward: grad_weight_per_segment")
    return reqs.items


def flash_attention_backward_scratch(query: TensorMeta, key: TensorMeta, *, layout: str = "bhsd",
                                     deterministic: bool = False, gpu: GpuProps | str = "H100") -> list[ScratchRequest]:
    """List the accumulators FlashAttention-2's ``mha_bwd`` (PyTorch's flash_api.cpp) allocates on CUDA.

    ``softmax_d`` (batch x heads x round128(seqlen_q), float32), ``dq_accum`` (batch x round128(seqlen_q)
    x heads x head_size_rounded, float32; with ``deterministic`` one per split, zeroed) and, when key
    has fewer heads than query (MQA/GQA), ``dk_expanded``/``dv_expanded`` in the query's dtype.
    ``layout`` is ``"bhsd"`` for ``_scaled_dot_product_flash_attention_backward``, ``"bshd"`` for
    ``_flash_attention_backward``.
    """
    gpu = gpu_props(gpu)
    if layout == "bhsd":
        batch, heads, seqlen_q, head_size = query.shape
        heads_k, seqlen_k = key.shape[1], key.shape[2]
    else:
        batch, seqlen_q, heads, head_size = query.shape
        seqlen_k, heads_k = key.shape[1], key.shape[2]
    seqlen_q_rounded = _div_up(seqlen_q, 128) * 128
    head_size_rounded = _div_up(head_size, 32) * 32 if head_size <= 192 else 256
    reqs = _Requests()
    reqs.op(batch * heads * seqlen_q_rounded * 4, "flash backward: softmax_d")
    if deterministic:
        nsplits = _div_up(gpu.sm_count, batch * heads)
        reqs.op(nsplits * batch * seqlen_q_rounded * heads * head_size_rounded * 4, "flash backward: dq_accum")
    else:
        reqs.op(batch * seqlen_q_rounded * heads * head_size_rounded * 4, "flash backward: dq_accum")
    if heads_k != heads:
        expanded = batch * seqlen_k * heads * head_size * query.itemsize
        reqs.op(expanded, "flash backward: dk_expanded")
        reqs.op(expanded, "flash backward: dv_expanded")
    return reqs.items


def mse_loss_scratch(inp: TensorMeta, target: TensorMeta, reduction: int, *, gpu: GpuProps | str = "H100",
                     torch_version: tuple[int, int] = (2, 13), label: str = "mse_loss") -> list[ScratchRequest]:
    """List the hidden requests of ``mse_loss`` (also ``smooth_l1_loss``) on CUDA with reduction mean (1) or sum (2).

    Loss.cpp ``mse_loss_out`` computes the element-wise loss into a temporary the size of the
    broadcast inputs, then ``mean_out``/``sum_out`` over all of it (a reduction with its own scratch).
    """
    if reduction == 0:
        return []
    ndim = max(len(inp.shape), len(target.shape))
    a = (1,) * (ndim - len(inp.shape)) + tuple(inp.shape)
    b = (1,) * (ndim - len(target.shape)) + tuple(target.shape)
    shape = tuple(max(x, y) for x, y in zip(a, b))
    dtype = inp.dtype if itemsize(inp.dtype) >= itemsize(target.dtype) else target.dtype
    loss = TensorMeta.contiguous(shape, dtype)
    reqs = _Requests()
    reqs.op(loss.nbytes, f"{label}: element-wise loss temporary")
    family = "mean" if reduction == 1 else "sum"
    reqs.extend(reduction_scratch(family, loss, None, out_dtype=dtype, gpu=gpu, torch_version=torch_version,
                                  label=f"{label} {family}"))
    return reqs.items


# ----------------------------------------------------------------------------- entry point


def _split_name(op_name: str) -> tuple[str, str]:
    name = op_name.split("::", 1)[-1]
    base, _, overload = name.partition(".")
    return base, overload


def _tensor_outputs(args: Mapping[str, Any]) -> list[TensorMeta]:
    result = args.get("result", ())
    if isinstance(result, TensorMeta):
        return [result]
    return [r for r in result if isinstance(r, TensorMeta)]


#: Operators other than the reductions whose CUDA kernels may ask for scratch (``scratch_requests``).
_OTHER_SCRATCH_OPS = frozenset({
    "count_nonzero", "mse_loss", "smooth_l1_loss", "nll_loss_forward", "native_layer_norm", "_fused_rms_norm",
    "native_layer_norm_backward", "_fused_rms_norm_backward", "embedding_dense_backward",
    "_scaled_dot_product_flash_attention_backward", "_flash_attention_backward", "_cudnn_rnn", "_cudnn_rnn_backward"})


def may_need_scratch(op_name: str) -> bool:
    """Whether ``scratch_requests`` can give anything for ``op_name`` (``"aten::sum.dim_IntList"``): a cheap filter."""
    base, _overload = _split_name(op_name)
    return base in ATEN_REDUCTIONS or base in _OTHER_SCRATCH_OPS


def scratch_requests(op_name: str, args_meta: Mapping[str, Any], gpu: GpuProps | str = "H100", *,
                     torch_version: tuple[int, int] = (2, 13)) -> list[ScratchRequest]:
    """List the caching-allocator requests a CUDA run of one ATen call makes that its meta kernel does not.

    ``op_name`` is ``func.name()`` (``"aten::sum.dim_IntList"``); ``args_meta`` maps the schema's
    argument names to values, tensors as ``TensorMeta``, plus ``"result"``: the output tensors.
    Example::

        scratch_requests("aten::max.dim", {"self": TensorMeta((512, 10000), (1, 512), "float32"),
                                           "dim": -1, "keepdim": True}, "H100")

    Operators without hidden requests give ``[]``. cuBLAS workspaces (one per thread and stream, kept)
    are the capture's ``allocsim.torch_capture.cublas``.
    """
    gpu = gpu_props(gpu)
    base, overload = _split_name(op_name)
    a = args_meta
    outs = _tensor_outputs(a)
    reqs = _Requests()
    if base in ATEN_REDUCTIONS:
        family, noutputs, rule = ATEN_REDUCTIONS[base]
        inp = a.get("self")
        if not isinstance(inp, TensorMeta):
            return []
        if base in ("max", "min") and overload in ("dim", "dim_max", "dim_min"):
            family, noutputs = "max_dim", 2
        elif base in ("max", "min") and overload not in ("", "unary_out"):
            return []                               # binary max/min (other=...) are element-wise
        dims = a.get("dim")
        keepdim = bool(a.get("keepdim", False))
        if family == "argmax":
            out_dtype = "int64"
            if dims is None:                        # argmax over everything: self.reshape(-1)
                if not inp.is_contiguous():
                    reqs.op(inp.nbytes, f"{base}: input.reshape(-1) copy")
                inp = TensorMeta.contiguous((inp.numel,), inp.dtype)
                keepdim = False
        elif outs:
            out_dtype = outs[0].dtype
        elif a.get("dtype") is not None:
            out_dtype = dtype_name(a["dtype"])
        elif family in ("sum", "prod", "nansum") and inp.dtype in _INTEGRAL:
            out_dtype = "int64"                     # get_dtype_from_self(promote_integers=True)
        elif family == "any_all":
            out_dtype = "uint8" if inp.dtype == "uint8" else "bool"
        else:
            out_dtype = inp.dtype
        if family == "norm" and inp.shape and all(inp.shape[d] == 1 for d in _wrap_dims(dims, len(inp.shape))):
            return []                               # linalg_vector_norm over size-1 dims is abs(), no reduction
        reqs.extend(reduction_scratch(family, inp, dims, keepdim, out_dtype=out_dtype, gpu=gpu,
                                      noutputs=noutputs, input_rule=rule, torch_version=torch_version,
                                      label=base))
        return reqs.items
    if base == "count_nonzero":
        inp = a.get("self")
        if not isinstance(inp, TensorMeta):
            return []
        ne = TensorMeta.contiguous(inp.shape, "bool") if inp.is_contiguous() else TensorMeta(
            inp.shape, inp.strides if inp.is_non_overlapping_and_dense() else _contiguous_strides(inp.shape), "bool")
        reqs.op(ne.nbytes, "count_nonzero: (self != 0) temporary")
        reqs.extend(reduction_scratch("sum", ne, a.get("dim"), False, out_dtype="int64", gpu=gpu,
                                      torch_version=torch_version, label="count_nonzero sum"))
        return reqs.items
    if base in ("mse_loss", "smooth_l1_loss"):
        inp, target = a.get("self"), a.get("target")
        if isinstance(inp, TensorMeta) and isinstance(target, TensorMeta):
            return mse_loss_scratch(inp, target, int(a.get("reduction", 1)), gpu=gpu,
                                    torch_version=torch_version, label=base)
        return []
    if base == "nll_loss_forward":
        # NLLLoss.cu nll_loss_forward_out_cuda_template: input/target expect_contiguous, weight.contiguous()
        _contiguous_copy(reqs, a.get("self"), "nll_loss input")
        _contiguous_copy(reqs, a.get("target"), "nll_loss target")
        _contiguous_copy(reqs, a.get("weight"), "nll_loss weight")
        return reqs.items
    if base == "native_layer_norm":
        _contiguous_copy(reqs, a.get("input"), "layer_norm input")
        _contiguous_copy(reqs, a.get("weight"), "layer_norm weight")
        _contiguous_copy(reqs, a.get("bias"), "layer_norm bias")
        return reqs.items
    if base == "_fused_rms_norm":
        _contiguous_copy(reqs, a.get("input"), "rms_norm input")
        _contiguous_copy(reqs, a.get("weight"), "rms_norm weight")
        return reqs.items
    if base in ("native_layer_norm_backward", "_fused_rms_norm_backward"):
        inp, grad = a.get("input"), a.get("grad_out")
        if not isinstance(inp, TensorMeta) or not isinstance(grad, TensorMeta):
            return []
        normalized = a.get("normalized_shape") or ()
        return layer_norm_backward_scratch(
            grad, inp, len(tuple(normalized)), a.get("weight"), a.get("bias"),
            output_mask=tuple(a.get("output_mask", (True, True, True))),
            rms_norm=base == "_fused_rms_norm_backward", gpu=gpu, torch_version=torch_version)
    if base == "embedding_dense_backward":
        grad, indices = a.get("grad_output"), a.get("indices")
        if not isinstance(grad, TensorMeta) or not isinstance(indices, TensorMeta):
            return []
        return embedding_dense_backward_scratch(grad, indices, int(a.get("num_weights", 0)),
                                                scale_grad_by_freq=bool(a.get("scale_grad_by_freq", False)))
    if base in ("_cudnn_rnn", "_cudnn_rnn_backward"):
        # RNN.cpp: _cudnn_rnn's workspace, the backward's zeros_like gradients and two workspaces
        for r in cudnn_rnn_model.rnn_scratch(base, a, itemsize):
            reqs.items.append(ScratchRequest(r.size_bytes, r.label, r.lifetime, r.launch))
        return reqs.items
    if base in ("_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"):
        q, k = a.get("query"), a.get("key")
        if not isinstance(q, TensorMeta) or not isinstance(k, TensorMeta) or len(q.shape) != 4:
            return []
        layout = "bhsd" if base.startswith("_scaled") else "bshd"
        return flash_attention_backward_scratch(q, k, layout=layout, gpu=gpu)
    return []


# ----------------------------------------------------------------------------- torch adapter


def tensor_meta(t: Any) -> TensorMeta:
    """Describe a torch tensor (meta or real) as a ``TensorMeta``; needs only ``.shape``, ``.stride()``, ``.dtype``."""
    return TensorMeta(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()), dtype_name(t.dtype),
                      int(t.storage_offset()))


def _to_meta(value: Any) -> Any:
    if hasattr(value, "stride") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return tensor_meta(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value) if isinstance(value, list) else tuple(_to_meta(v) for v in value)
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return dtype_name(value)
    return value


def requests_for_call(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, out: Any,
                      gpu: GpuProps | str = "H100", *, torch_version: tuple[int, int] = (2, 13)
                      ) -> list[ScratchRequest]:
    """Call from a TorchDispatchMode after ``out = func(*args, **kwargs)``: the call's hidden CUDA requests.

    Binds the arguments to ``func._schema``'s names, describes tensors as ``TensorMeta`` and asks
    ``scratch_requests``.
    """
    kwargs = dict(kwargs or {})
    named: dict[str, Any] = {}
    schema = getattr(func, "_schema", None)
    if schema is not None:
        for i, arg in enumerate(schema.arguments):
            if i < len(args):
                named[arg.name] = _to_meta(args[i])
            elif arg.name in kwargs:
                named[arg.name] = _to_meta(kwargs[arg.name])
            elif arg.has_default_value():
                named[arg.name] = _to_meta(arg.default_value)
    results = out if isinstance(out, (list, tuple)) else (out,)
    named["result"] = tuple(_to_meta(r) for r in results if hasattr(r, "stride"))
    return scratch_requests(func.name(), named, gpu, torch_version=torch_version)
