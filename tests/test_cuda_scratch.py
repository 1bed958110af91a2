"""The CUDA scratch model (allocsim.torch_capture.cuda_scratch) against values derived from PyTorch's source and real snapshots.

Three kinds of checks:

* hand-derived values: ``setReduceConfig`` (Reduce.cuh) worked through by hand for a few shapes, so the
  suite asserts exact bytes on a machine without ``../shared``;
* real GPU snapshots (``../shared/traces/pytorch-snapshots``, PyTorch 2.6 with C++ frames): every
  allocation whose stack holds ``gpu_reduce_kernel`` is reproduced byte for byte from the reduction's
  input, reconstructed from the Python frames and the neighbouring allocations, and the reductions of
  the same window that allocated nothing are predicted to allocate nothing;
* properties (hypothesis): sizes are positive integers, buffers come with their semaphores, the
  buffer is linear in the accumulation type's size and monotone where the source says so.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.torch_capture.cuda_scratch import (
    GPUS,
    GpuProps,
    KernelSpec,
    TensorMeta,
    embedding_dense_backward_scratch,
    flash_attention_backward_scratch,
    layer_norm_backward_scratch,
    reduce_config,
    reduction_iter,
    reduction_kernel_spec,
    reduction_scratch,
    scratch_events,
    scratch_requests,
)

H100, A100 = GPUS["H100"], GPUS["A100"]
#: The snapshots were recorded with PyTorch 2.6 (the repositories pin torch~=2.6.0).
TORCH_2_6 = (2, 6)


def sizes(requests) -> list[int]:
    return [r.size_bytes for r in requests]


# ----------------------------------------------------------------------------- hand-derived from Reduce.cuh


def test_full_sum_of_a_million_floats_splits_across_123_blocks():
    # 1-D after coalescing, reduced on the fastest dimension: vectorised input, dim0 = 10**6 / 4, so
    # block 512 x 1; 1954 values per thread >= 16 splits across warps (block_height 1); 4 blocks per
    # SM x 132 SMs = 528 >= grid 1: ctas = max(min(528, ceil(1954/16) = 123), ceil(1954/256) = 8) = 123.
    t = TensorMeta.contiguous((1000, 1000), "float32")
    assert sizes(reduction_scratch("sum", t, None, gpu=H100)) == [4 * 123, 4]


def test_the_gpu_caps_the_blocks_per_output():
    # 2**24 floats: 32768 values per thread, ceil(32768/16) = 2048 > target grid, so ctas = target grid
    # = SMs x (2048 threads / 512 per block): 528 on an H100, 432 on an A100.
    t = TensorMeta.contiguous((1 << 24,), "float32")
    assert sizes(reduction_scratch("sum", t, gpu=H100)) == [4 * 528, 4]
    assert sizes(reduction_scratch("sum", t, gpu=A100)) == [4 * 432, 4]


def test_a_column_sum_stages_one_slot_per_lane_and_vector_element():
    # sum(0) of a (4096, 256) float32: not the fastest dimension, output vector 4 (dim0 = 64), 128
    # threads: block 32 x 4; grid.x = ceil(64 / 32) = 2; 1024 values per thread after the warp split:
    # ctas = max(min(ceil(2112 / 2), 64), 4) = 64; buffer = 4 B x 256 outputs x 64 x (32 lanes x 4).
    t = TensorMeta.contiguous((4096, 256), "float32")
    assert sizes(reduction_scratch("sum", t, 0, gpu=H100)) == [4 * 256 * 64 * 32 * 4, 4 * 2]


def test_a_row_reduction_that_fits_a_block_needs_no_global_memory():
    # logits.max(-1) on a row-major (512, 10000): 313 values per thread over 32 lanes, split across 16
    # warps leaves 20 per thread < 256: no global reduce.
    t = TensorMeta.contiguous((512, 10000), "float32")
    assert scratch_requests("aten::max.dim", {"self": t, "dim": -1, "keepdim": True}, H100) == []
    assert scratch_requests("aten::sum.dim_IntList", {"self": t, "dim": [-1]}, H100) == []


def test_the_same_reduction_on_a_transposed_layout_stages_in_global_memory():
    # The layout the 2.6 snapshots show (see below): vocab is the slow dimension. max.dim's accumulator
    # is pair<float, int64_t> (16 B), sum's is float (4 B); same launch: 157 blocks per output.
    t = TensorMeta((512, 10000), (1, 512), "float32")
    assert sizes(scratch_requests("aten::max.dim", {"self": t, "dim": -1, "keepdim": True}, H100)) == [
        16 * 512 * 157 * 128, 16]
    assert sizes(scratch_requests("aten::sum.dim_IntList", {"self": t, "dim": [-1]}, H100)) == [
        4 * 512 * 157 * 128, 16]


def test_sum_of_int32_reads_an_int64_copy():
    t = TensorMeta.contiguous((1000, 1000), "int32")
    reqs = scratch_requests("aten::sum", {"self": t}, H100)
    assert sizes(reqs) == [8 * 10**6, 8 * 123, 4]
    assert [r.lifetime for r in reqs] == ["op", "kernel", "kernel"]


def test_low_precision_sum_to_float_casts_inside_the_kernel():
    t = TensorMeta.contiguous((1000, 1000), "bfloat16")
    reqs = scratch_requests("aten::sum", {"self": t, "dtype": "float32"}, H100)
    assert sizes(reqs) == [4 * 123, 4]            # no copy: gpu_lowp_to_f32


def test_a_reduction_over_2_to_the_32_elements_runs_four_sub_iterators():
    # numel > INT32_MAX: SplitUntil32Bit halves it twice. bf16 in and out cannot accumulate in the
    # output, so one float AccumulationBuffer for the (single) output comes first, held across the launches.
    t = TensorMeta.contiguous((1 << 16, 1 << 16), "bfloat16")
    reqs = reduction_scratch("sum", t, None, gpu=H100)
    assert reqs[0].size_bytes == 4 and reqs[0].lifetime == "op"
    launches = Counter(r.launch for r in reqs if r.lifetime == "kernel")
    assert len(launches) == 4 and set(launches.values()) == {2}


def test_events_free_a_kernels_requests_before_the_next_launch():
    t = TensorMeta.contiguous((1 << 16, 1 << 16), "bfloat16")
    reqs = reduction_scratch("sum", t, None, gpu=H100)
    assert scratch_events(reqs)[:6] == [("alloc", 0), ("alloc", 1), ("alloc", 2), ("free", 2), ("free", 1),
                                        ("alloc", 3)]
    assert scratch_events(reqs)[-1] == ("free", 0)


def test_welford_keeps_a_16_byte_accumulator():
    t = TensorMeta.contiguous((64, 1 << 20), "float32")
    cfg = reduce_config(reduction_iter(t, [1]), reduction_kernel_spec("var", "float32", "float32"), H100)
    reqs = scratch_requests("aten::var.correction", {"self": t, "dim": [1]}, H100)
    assert sizes(reqs) == [16 * 64 * cfg.ctas_per_output, 4 * cfg.grid_x]


def test_layer_norm_backward_partial_buffers_for_many_short_rows():
    # M = 131072 > 65536 rows of N = 256 (256 / 32 < 132 / 2): blocks (8, min(32768 / 8, 131072 / 32)).
    x = TensorMeta.contiguous((1 << 17, 256), "float32")
    w = TensorMeta.contiguous((256,), "float32")
    reqs = layer_norm_backward_scratch(x, x, 1, w, w, gpu=H100)
    assert sizes(reqs)[:2] == [4096 * 256 * 4, 4096 * 256 * 4]
    assert layer_norm_backward_scratch(x, x, 1, w, w, gpu=H100, torch_version=TORCH_2_6) == []
    few = TensorMeta.contiguous((4096, 256), "float32")
    assert layer_norm_backward_scratch(few, few, 1, w, w, gpu=H100) == []


def test_layer_norm_backward_copies_a_non_contiguous_gradient():
    x = TensorMeta.contiguous((512, 2560), "float32")
    g = TensorMeta((512, 2560), (1, 512), "float32")
    w = TensorMeta.contiguous((2560,), "float32")
    assert sizes(layer_norm_backward_scratch(g, x, 1, w, None, rms_norm=True, gpu=H100)) == [512 * 2560 * 4]


def test_embedding_backward_sort_and_segment_buffers():
    grad = TensorMeta.contiguous((8, 1024, 768), "bfloat16")
    idx = TensorMeta.contiguous((8, 1024), "int64")
    n = 8 * 1024
    partial = n // 10 + n
    assert sizes(embedding_dense_backward_scratch(grad, idx, 50257)) == [
        8 * n, 8 * n, 8 * n, 8 * n, 8, 8 * n, 8 * n, 8 * n, 8, 8 * partial, 4 * 768 * partial]
    few = TensorMeta.contiguous((3072,), "int64")
    assert embedding_dense_backward_scratch(TensorMeta.contiguous((3072, 768), "float32"), few, 50257) == []


def test_flash_backward_accumulators_round_the_sequence_to_128():
    q = TensorMeta.contiguous((2, 16, 1000, 64), "bfloat16")
    assert sizes(flash_attention_backward_scratch(q, q)) == [2 * 16 * 1024 * 4, 2 * 1024 * 16 * 64 * 4]
    k = TensorMeta.contiguous((2, 4, 1000, 64), "bfloat16")
    assert sizes(flash_attention_backward_scratch(q, k))[2:] == [2 * 1000 * 16 * 64 * 2] * 2


def test_mse_loss_mean_keeps_the_elementwise_loss_and_reduces_it():
    x = TensorMeta.contiguous((4096, 4096), "float32")
    reqs = scratch_requests("aten::mse_loss", {"self": x, "target": x, "reduction": 1}, H100)
    assert sizes(reqs) == [4096 * 4096 * 4, 4 * 528, 4]
    assert scratch_requests("aten::mse_loss", {"self": x, "target": x, "reduction": 0}, H100) == []


# ----------------------------------------------------------------------------- the real snapshots

#: Every reduction in the two snapshot windows, reconstructed: (file, ATen op, where it runs, input,
#: reduced dims, keepdim, GPU, requests the snapshot recorded for each call, number of calls).
#: Layouts: in PyTorch 2.6 ``einsum`` returned the ``bmm`` result permuted, so the LM head's logits
#: (4, 128, 10000) have strides (128, 1, 512) and ``reshape(-1, 10000)`` gives (512, 10000) with
#: strides (1, 512); the RMSNorm gradient that ``_sum_to`` reduces inherits that layout. A
#: row-major layout would make the three recorded reductions allocate nothing (see the test above),
#: and a one-warp-per-row launch would give a 128-byte semaphore, not the 16 bytes recorded (grid 4).
SNAPSHOT_CASES = [
    # silmont2000: loss = output.sum(), output (8, 4096, 16) float32 from the attention einsum (the
    # 2,097,152-byte bmm result just before); the GPU has 8,519,680-byte cuBLAS workspaces (not sm90).
    ("silmont2000__mem_snapshot", "sum", "trace_peak_memory.py:46", TensorMeta.contiguous((8, 4096, 16), "float32"),
     None, False, A100, [256, 4], 1),
    ("silmont2000__mem_snapshot", "max", "trace_peak_memory.py:6",
     TensorMeta.contiguous((8, 4096, 4096), "float32"), -1, True, A100, [], 1),
    ("silmont2000__mem_snapshot", "sum", "trace_peak_memory.py:8",
     TensorMeta.contiguous((8, 4096, 4096), "float32"), [-1], True, A100, [], 1),
    # softmax backward: the gradients of the max and of the sum, reduced over keys by _sum_to
    ("silmont2000__mem_snapshot", "sum", "_sum_to:131072", TensorMeta.contiguous((8, 4096, 4096), "float32"),
     [-1], True, A100, [], 2),
    # kkaitlyn111: 2.7B TransformerLM (d_model 2560, 32 layers, vocab 10000), batch 4, context 128,
    # float32, on an sm90 GPU (32 MiB cuBLAS workspaces); cross_entropy_loss on (512, 10000) logits.
    ("kkaitlyn111__memory_ctx128_fullstep", "max", "training.py:21", TensorMeta((512, 10000), (1, 512), "float32"),
     -1, True, H100, [164626432, 16], 1),
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "training.py:26", TensorMeta((512, 10000), (1, 512), "float32"),
     [-1], False, H100, [41156608, 16], 1),
    # RMSNorm backward: d(x / rms)/d(rms) summed over d_model by _sum_to, once per norm (2 x 32 + 1).
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "_sum_to:2048", TensorMeta((4, 128, 2560), (128, 1, 512), "float32"),
     [-1], True, H100, [10485760, 16], 65),
    # the cross-entropy backward's d(inputs - max)/d(max): a row-major gradient (from index_put), one call
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "_sum_to:2048", TensorMeta.contiguous((512, 10000), "float32"),
     [-1], True, H100, [], 1),
    # RMSNorm weight gradient: sum over batch and sequence
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "_sum_to:10240", TensorMeta((4, 128, 2560), (128, 1, 512), "float32"),
     [0, 1], False, H100, [], 65),
    ("kkaitlyn111__memory_ctx128_fullstep", "linalg_vector_norm", "transformer.py:54",
     TensorMeta.contiguous((4, 128, 2560), "float32"), [-1], True, H100, [], 65),
    # attention softmax (4, 32, 128, 128): max and sum over keys, and their backward _sum_to
    ("kkaitlyn111__memory_ctx128_fullstep", "max", "transformer.py:135",
     TensorMeta.contiguous((4, 32, 128, 128), "float32"), -1, True, H100, [], 32),
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "transformer.py:140",
     TensorMeta.contiguous((4, 32, 128, 128), "float32"), [-1], True, H100, [], 32),
    ("kkaitlyn111__memory_ctx128_fullstep", "sum", "_sum_to:65536",
     TensorMeta.contiguous((4, 32, 128, 128), "float32"), [-1], True, H100, [], 64),
    ("kkaitlyn111__memory_ctx128_fullstep", "mean", "training.py:33", TensorMeta.contiguous((512,), "float32"),
     None, False, H100, [], 1),
]

_OPS = {"sum": ("aten::sum.dim_IntList", "sum_dim_IntList"), "max": ("aten::max.dim", "max_dim"),
        "mean": ("aten::mean.dim", "mean_dim"), "linalg_vector_norm": ("aten::linalg_vector_norm", "linalg_vector_norm")}


def model_sizes(op: str, inp: TensorMeta, dims, keepdim: bool, gpu: GpuProps) -> list[int]:
    args = {"self": inp, "dim": dims, "keepdim": keepdim}
    return sizes(scratch_requests(_OPS[op][0], args, gpu, torch_version=TORCH_2_6))


@pytest.mark.parametrize("case", SNAPSHOT_CASES, ids=lambda c: f"{c[0].split('__')[0]}-{c[1]}-{c[2]}")
def test_the_model_without_the_snapshots(case):
    _file, op, _where, inp, dims, keepdim, gpu, recorded, _count = case
    assert model_sizes(op, inp, dims, keepdim, gpu) == recorded


def reduction_calls(path) -> list[tuple[str, str, list[int]]]:
    """Each reduction call in a snapshot: (op, where, sizes of the gpu_reduce_kernel requests it made)."""
    import allocsim

    trace = allocsim.read_trace(path)
    events = trace.table("events").frame()
    frames = {r.frame_id: (r.filename, r.line, r.name) for r in trace.table("frames").frame().itertuples()}
    stacks: dict[int, list] = {}
    for r in trace.table("stacks").frame().sort_values(["stack_id", "depth"]).itertuples():
        stacks.setdefault(r.stack_id, []).append(frames[r.frame_id])
    wanted = {name: op for op, (_, name) in _OPS.items()}
    calls: list[list] = []                            # [op, where, scratch sizes, outputs seen]
    for r in events[events.kind == 1].itertuples():
        stack = stacks.get(r.stack_id, [])
        names = [name for _f, _l, name in stack]
        ops = [n.split("(")[0].split("::")[-2] for n in names if n.startswith("at::_ops::") and "::call(" in n]
        if not ops or ops[0] not in wanted:
            continue
        if any("gpu_reduce_kernel" in n for n in names):
            calls[-1][2].append(int(r.size_bytes))
            continue
        op = wanted[ops[0]]
        if op == "max" and calls and calls[-1][0] == "max" and calls[-1][3] == 1 and not calls[-1][2]:
            calls[-1][3] = 2                          # max.dim's second output (the int64 indices)
            continue
        py = [f"{f.rsplit('/', 1)[-1]}:{line}" for f, line, _n in stack if f.endswith(".py") and "/torch/" not in f]
        where = py[0] if py else (f"_sum_to:{int(r.size_bytes)}" if any("_sum_to" in n for n in names) else "?")
        calls.append([op, where, [], 1])
    return [(op, where, got) for op, where, got, _outputs in calls]


@pytest.mark.shared
@pytest.mark.parametrize("name", ["silmont2000__mem_snapshot", "kkaitlyn111__memory_ctx128_fullstep"])
def test_every_reduction_in_the_snapshot_matches_the_model(shared_dir, name):
    path = shared_dir / "traces" / "pytorch-snapshots" / f"{name}.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    calls = reduction_calls(path)
    cases = [c for c in SNAPSHOT_CASES if c[0] == name]
    seen: Counter = Counter()
    for op, where, recorded in calls:
        matching = [c for c in cases if c[1] == op and c[2] == where]
        if len(matching) > 1:
            # two _sum_to reductions with one output size that differ in the gradient's layout only
            # (see SNAPSHOT_CASES); the call counts below check how many of each the window holds
            matching = [c for c in matching if c[7] == recorded]
        assert matching, f"no reconstructed case for {op} at {where} (recorded {recorded})"
        case = matching[0]
        _f, _op, _w, inp, dims, keepdim, gpu, expected, _n = case
        assert recorded == expected == model_sizes(op, inp, dims, keepdim, gpu), (op, where)
        seen[(case[1], case[2], tuple(expected))] += 1
    for case in cases:
        assert seen[(case[1], case[2], tuple(case[7]))] == case[8], case[:3]


# ----------------------------------------------------------------------------- properties

DTYPES = ["float32", "bfloat16", "float16", "float64", "int64"]
FAMILIES = ["sum", "mean", "amax", "max_dim", "argmax", "var", "norm", "any_all", "prod", "aminmax"]


@st.composite
def dense_tensors(draw, max_numel: int = 1 << 22):
    ndim = draw(st.integers(1, 4))
    shape = []
    for _ in range(ndim):
        budget = max(1, max_numel // max(1, math.prod(shape)))
        shape.append(draw(st.integers(1, min(budget, 1 << 14))))
    order = draw(st.permutations(range(ndim)))          # a permuted row-major layout
    strides = [0] * ndim
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    dtype = draw(st.sampled_from(DTYPES))
    return TensorMeta(tuple(shape), tuple(strides), dtype)


@settings(max_examples=40, deadline=None)
@given(t=dense_tensors(), family=st.sampled_from(FAMILIES), data=st.data(),
       gpu=st.sampled_from([H100, A100, GPUS["T4"], GPUS["RTX4090"]]), legacy=st.booleans())
def test_requests_are_positive_integers_with_matching_semaphores(t, family, data, gpu, legacy):
    if family in ("var", "mean", "norm") and t.dtype == "int64":
        return
    dims = data.draw(st.sets(st.integers(0, len(t.shape) - 1), min_size=1))
    reqs = reduction_scratch(family, t, sorted(dims), data.draw(st.booleans()), gpu=gpu,
                             noutputs=2 if family in ("max_dim", "aminmax") else 1, input_rule="self",
                             torch_version=(2, 6) if legacy else (2, 13))
    assert all(isinstance(r.size_bytes, int) and r.size_bytes > 0 for r in reqs)
    kernels = [r for r in reqs if r.lifetime == "kernel"]
    assert len(kernels) % 2 == 0
    for buffer, semaphores in zip(kernels[::2], kernels[1::2]):
        assert buffer.launch == semaphores.launch and "semaphores" in semaphores.label
        assert semaphores.size_bytes % 4 == 0
    events = scratch_events(reqs)
    assert Counter(kind for kind, _ in events) == {"alloc": len(reqs), "free": len(reqs)} or not reqs


@settings(max_examples=40, deadline=None)
@given(t=dense_tensors(), data=st.data(), gpu=st.sampled_from([H100, A100]))
def test_the_buffer_is_linear_in_the_accumulator_size(t, data, gpu):
    # setReduceConfig reads sizeof(arg_t) only in global_memory_size(): doubling it doubles the buffer.
    dims = sorted(data.draw(st.sets(st.integers(0, len(t.shape) - 1), min_size=1)))
    it = reduction_iter(t, dims)
    base = KernelSpec(t.itemsize, t.itemsize, 4)
    one = reduce_config(it, base, gpu)
    two = reduce_config(it, base._replace(arg_bytes=8), gpu)
    assert two.global_memory_bytes == 2 * one.global_memory_bytes
    assert two.semaphore_bytes == one.semaphore_bytes
    if one.ctas_per_output > 1:
        # ctas_per_output >= ceil(values_per_thread / 256): each thread then reads at most 256 values
        assert math.ceil(one.num_inputs / one.step_input) <= 256


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1 << 16, (1 << 29) - (1 << 20)), extra=st.integers(0, 1 << 20),
       gpu=st.sampled_from([H100, A100, GPUS["T4"]]))
def test_a_full_reduction_buffer_never_shrinks_as_the_input_grows(n, extra, gpu):
    # One output, a full 512-thread block: ctas = max(min(target, ceil(v/16)), ceil(v/256)), v = ceil(n/512).
    # Up to 2**29 floats (2 GiB): past that the iterator splits for 32-bit indexing and each half has
    # its own, smaller buffer (test_a_reduction_over_2_to_the_32_elements_runs_four_sub_iterators).
    small = sizes(reduction_scratch("sum", TensorMeta.contiguous((n,), "float32"), gpu=gpu))
    large = sizes(reduction_scratch("sum", TensorMeta.contiguous((n + extra,), "float32"), gpu=gpu))
    assert (small[0] if small else 0) <= (large[0] if large else 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(3073, 1 << 20), extra=st.integers(0, 1 << 16), vocab=st.integers(1, 1 << 18),
       dim=st.integers(1, 4096))
def test_embedding_backward_buffers_grow_with_the_indices(n, extra, vocab, dim):
    grad = TensorMeta.contiguous((n, dim), "float32")
    grad2 = TensorMeta.contiguous((n + extra, dim), "float32")
    a = embedding_dense_backward_scratch(grad, TensorMeta.contiguous((n,), "int64"), vocab)
    b = embedding_dense_backward_scratch(grad2, TensorMeta.contiguous((n + extra,), "int64"), vocab)
    assert all(x.size_bytes <= y.size_bytes for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.full
def test_the_torch_adapter_reads_meta_tensors():
    # full suite: importing torch and its first backward take about 5 s
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from allocsim.torch_capture.cuda_scratch import requests_for_call

    seen = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.append((func.name(), sizes(requests_for_call(func, args, kwargs, out, "H100",
                                                              torch_version=TORCH_2_6))))
            return out

    logits = torch.empty(10000, 512, device="meta").t()          # (512, 10000), strides (1, 512)
    a = torch.empty(8, 8, device="meta", requires_grad=True)
    with Mode():
        torch.max(logits, dim=-1, keepdim=True)
        (a @ a).sum().backward()
    assert ("aten::max.dim", [164626432, 16]) in seen
