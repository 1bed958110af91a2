"""A process group that answers every collective of one rank alone: ``install(facts)`` inside the capture child.

Why our own and not PyTorch's ``FakeProcessGroup``: that one leaves every output as it was, so a
collective whose answer the script reads on the host (DDP's check that every rank has the same
parameters, ``all_gather_object``, a loss summed over ranks) gets garbage and the script stops.
Here every rank is taken to send what this rank sends, so each answer is the one a job of equal
ranks would give: ``all_gather`` fills every slot with this rank's input, ``all_reduce`` with
``SUM`` multiplies by the group's size (``AVG``, ``MIN``, ``MAX``, bitwise ops leave it), a
``broadcast`` keeps this rank's tensor, ``reduce_scatter`` gives this rank's chunk of the reduced
input. Device tensors (``cuda``, on ``meta`` during a capture) hold no values: their collectives
change nothing, and what the real collective allocates on the device is what the script's own
code (DDP's buckets, FSDP's buffers, the functional collectives' outputs) makes around it, which
the capture records as usual. Nothing here opens a socket or waits for another process.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

#: The backend name ``init_process_group`` gets whatever the script asked for (``nccl``, ``gloo``...).
BACKEND = "allocsim"


def _done(value: Any) -> Any:
    """A finished ``Work`` whose future holds ``value`` (what DDP's reducer and ``wait()`` read)."""
    future: Future = Future()
    future.set_result(value)
    return _create_work_from_future(future)


def _has_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds numbers (a host tensor): device tensors on ``meta`` have none to answer."""
    return t.device.type != "meta"


def _reduce_alone(t: torch.Tensor, op: Any, size: int) -> None:
    """``t`` reduced over ``size`` ranks that all sent ``t``."""
    if not _has_values(t) or size == 1:
        return
    if op == dist.ReduceOp.SUM:
        t.mul_(size)
    elif op == dist.ReduceOp.PRODUCT:
        t.pow_(size)


def _copy_into(out: torch.Tensor, src: torch.Tensor) -> None:
    if _has_values(out) and _has_values(src) and out.numel() == src.numel():
        with torch.no_grad():
            out.copy_(src.reshape(out.shape))


class AnsweringGroup(dist.ProcessGroup):
    """One rank's process group: every collective completes at once, as if every rank sent this rank's data."""

    #: Where the collectives this rank runs are reported (``communicators.CommunicatorLog``; None: nowhere).
    communicators: Any = None
    #: Rank 0's small broadcasts, recorded and replayed (``broadcasts.BroadcastLog``; None: keep this rank's).
    broadcasts: Any = None

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size

    def _heard(self, collective: str) -> None:
        log = AnsweringGroup.communicators
        if log is not None:
            log.note(self, collective)

    def _heard_p2p(self, peer: int, root_of_all: bool = False, in_group: bool = False) -> None:
        log = AnsweringGroup.communicators
        if log is not None:
            log.point_to_point(self, int(peer), root_of_all, in_group)

    def getBackendName(self) -> str:  # noqa: N802  (c10d's name)
        return BACKEND

    # A Python process group keeps its name itself (c10d's setter does not reach a Python subclass).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_group_name", None)
        return name if name is not None else dist.distributed_c10d._world.pg_names[self]

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    @property
    def _op_size(self) -> int:
        return self._size

    # all-reduce family
    def allreduce(self, tensors, opts=None):
        self._heard("all_reduce")
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for t in tensors:
            _reduce_alone(t, op, self._size)
        return _done(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        self._heard("reduce")
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for t in tensors:
            _reduce_alone(t, op, self._size)
        return _done(list(tensors))

    # gathers
    def allgather(self, output_lists, inputs, opts=None):
        self._heard("all_gather")
        for outs, src in zip(output_lists, inputs):
            for out in outs:
                _copy_into(out, src)
        return _done(output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def _allgather_base(self, output, input, opts=None):
        self._heard("all_gather")
        if _has_values(output) and _has_values(input):
            for chunk in output.chunk(self._size):
                _copy_into(chunk, input)
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, src in zip(outputs, inputs):
            self._allgather_base(out, src, opts)
        return _done(list(outputs))

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def gather(self, output_lists, inputs, opts=None):
        # ProcessGroupNCCL::gather: sends and receives in the group's communicator, the root to every rank
        root = int(getattr(opts, "rootRank", 0))
        self._heard_p2p(root, root_of_all=root == self._rank, in_group=True)
        for outs, src in zip(output_lists, inputs):
            for out in outs:
                _copy_into(out, src)
        return _done(output_lists)

    # scatters
    def reduce_scatter(self, outputs, input_lists, opts=None):
        self._heard("reduce_scatter")
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for out, chunks in zip(outputs, input_lists):
            if chunks:
                _copy_into(out, chunks[min(self._rank, len(chunks) - 1)])
                _reduce_alone(out, op, self._size)
        return _done(list(outputs))

    def _reduce_scatter_base(self, output, input, opts=None):
        self._heard("reduce_scatter")
        if _has_values(output) and _has_values(input):
            chunks = input.chunk(self._size)
            self.reduce_scatter([output], [list(chunks)], opts)
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, src in zip(outputs, inputs):
            self._reduce_scatter_base(out, src, opts)
        return _done(list(outputs))

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def scatter(self, outputs, input_lists, opts=None):
        root = int(getattr(opts, "rootRank", 0))
        self._heard_p2p(root, root_of_all=root == self._rank, in_group=True)
        for out, chunks in zip(outputs, input_lists or []):
            if chunks:
                _copy_into(out, chunks[min(self._rank, len(chunks) - 1)])
        return _done(list(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._heard("all_to_all")
        _copy_into(output, input)
        return _done([output])

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, outputs, inputs, opts=None):
        self._heard("all_to_all")
        for out, src in zip(outputs, inputs):
            _copy_into(out, src)
        return _done(list(outputs))

    # the rest
    def broadcast(self, tensors, opts=None):
        self._heard("broadcast")
        log = AnsweringGroup.broadcasts
        if log is not None:
            log.on_broadcast(self._size, self._rank, int(getattr(opts, "rootRank", 0)), list(tensors))
        return _done(list(tensors))

    def barrier(self, opts=None):
        self._heard("all_reduce")
        return _done(None)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return None

    def send(self, tensors, dst, tag=0):
        self._heard_p2p(dst)
        return _done(list(tensors))

    def recv(self, tensors, src, tag=0):
        self._heard_p2p(src)
        return _done(list(tensors))

    def recv_anysource(self, tensors, tag=0):
        return _done(list(tensors))

    # torch <= 2.6's batch_isend_irecv coalesces on any group when the tensors are on cuda ("NCCL style":
    # _coalescing_manager(group, device) calls these around the sends; 2.13 only on a C++ ProcessGroup whose
    # backend supports coalescing), and c10d's own look for a backend this Python group never registers
    # ("No backend type associated with device type cuda"). The sends inside answer one by one.
    def _start_coalescing(self, device):
        return None

    def _end_coalescing(self, device):
        return _done([])

    def __repr__(self) -> str:
        return f"AnsweringGroup(rank={self._rank}, size={self._size}, allocsim capture)"


def _create(store: Any, rank: int, size: int, timeout: Any) -> AnsweringGroup:
    return AnsweringGroup(rank, size)


def register_backend() -> None:
    """Make ``allocsim`` a c10d backend (once per process)."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda", "meta"])


def copy_object(obj: Any) -> Any:
    """What another rank unpickles of ``obj``: a pickled copy, or ``obj`` itself when it cannot be pickled."""
    try:
        return pickle.loads(pickle.dumps(obj))
    except Exception:  # noqa: BLE001  (any object a script sends)
        try:
            return copy.deepcopy(obj)
        except Exception:  # noqa: BLE001
            return obj
