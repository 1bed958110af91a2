"""The NCCL communicators one rank would hold, recorded as its collectives happen: ``CommunicatorLog``.

Give ``allocsim.nccl`` exact input: which process groups this rank ran a collective on, with which
collectives, and the peers of its point-to-point traffic. PyTorch makes an NCCL communicator per
process group and device at the group's first collective (``ProcessGroupNCCL::getNCCLComm``), or at
``init_process_group(device_id=...)`` for the default group (eager init); a group never used costs
nothing. Batched point-to-point (``batch_isend_irecv``, as ``torch.distributed.pipelining`` sends)
runs on the group's communicator; an unbatched ``send`` / ``recv`` makes a 2-rank communicator per
peer pair (``ProcessGroupNCCL::pointToPoint``, key ``getKeySendRecv``). ``gather`` / ``scatter``
are point-to-point inside the group's communicator (the root talks to every rank, the others to
the root); ``barrier`` is a one-element all-reduce (``ProcessGroupNCCL::barrier``).

The answering process group (``process_group.AnsweringGroup``) and the functional collectives'
operators (``torch.ops._c10d_functional.*``, which DTensor's redistributions run) report here; the
fact ``communicators`` is sent at the end of the run (``to_fact``). Bounded: at most
``MAX_GROUPS`` groups and ``MAX_PEERS`` peers per group are kept.
"""

from __future__ import annotations

import threading
from typing import Any

#: Process groups recorded; later ones are counted as dropped.
MAX_GROUPS = 4096
#: Distinct send/recv peers remembered per group (a rank of a pipeline talks to 2).
MAX_PEERS = 4096
#: Ranks listed per group in the fact (the size is always given).
MAX_LISTED_RANKS = 1 << 16

#: AnsweringGroup method -> the NCCL collective it runs.
METHOD_COLLECTIVE = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "barrier": "all_reduce",
    "reduce": "reduce", "broadcast": "broadcast",
    "allgather": "all_gather", "allgather_coalesced": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_single": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "alltoall": "all_to_all",
}


def functional_collective(op_name: str) -> str | None:
    """``_c10d_functional::all_gather_into_tensor`` -> ``all_gather`` (None: not a collective, e.g. ``wait_tensor``)."""
    name = op_name.split("::")[-1]
    for prefix, collective in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                               ("reduce_scatter", "reduce_scatter"), ("all_to_all", "all_to_all"),
                               ("broadcast", "broadcast")):
        if name.startswith(prefix):
            return collective
    return None


class _Group:
    __slots__ = ("ranks", "name", "collectives", "peers", "eager")

    def __init__(self, ranks: list[int], name: str):
        self.ranks = ranks
        self.name = name
        self.collectives: set[str] = set()
        self.peers: set[int] = set()
        self.eager = False


class CommunicatorLog:
    """The communicators of this rank, keyed by process group (``note``), and per peer pair (``pair``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[int, _Group] = {}
        self._keep: list[Any] = []           # the groups themselves: their ids stay theirs
        self._pairs: set[tuple[int, int]] = set()
        self.dropped = 0
        self.rank = 0
        self.batching = threading.local()

    # ------------------------------------------------------------------ what the process group reports
    def _group(self, group: Any) -> _Group | None:
        found = self._groups.get(id(group))
        if found is not None:
            return found
        if len(self._groups) >= MAX_GROUPS:
            self.dropped += 1
            return None
        import torch.distributed as dist  # noqa: PLC0415

        try:
            ranks = [int(r) for r in dist.get_process_group_ranks(group)]
        except (RuntimeError, ValueError, KeyError):
            size = int(group.size()) if hasattr(group, "size") else 1
            ranks = list(range(size))
        name = str(getattr(group, "group_desc", "") or getattr(group, "group_name", "") or "")[:60]
        found = self._groups[id(group)] = _Group(ranks, name)
        self._keep.append(group)
        return found

    def note(self, group: Any, collective: str) -> None:
        """``group`` ran ``collective`` (one of ``allocsim.nccl.COLLECTIVES``)."""
        with self._lock:
            entry = self._group(group)
            if entry is not None:
                entry.collectives.add(collective)

    def eager(self, group: Any) -> None:
        """``group``'s communicator is made at creation (``init_process_group(device_id=...)``)."""
        with self._lock:
            entry = self._group(group)
            if entry is not None:
                entry.eager = True

    def point_to_point(self, group: Any, peer_in_group: int, root_of_all: bool = False,
                       in_group: bool = False) -> None:
        """A send or receive between this rank and ``peer_in_group`` (its rank in ``group``).

        Inside ``batch_isend_irecv`` it runs on the group's communicator; alone, on a 2-rank
        communicator of the pair (global ranks). ``root_of_all``: a gather / scatter root, which
        talks to every rank of the group; ``in_group``: a gather / scatter, on the group's communicator.
        """
        with self._lock:
            entry = self._group(group)
            if entry is None:
                return
            batched = in_group or getattr(self.batching, "depth", 0) > 0
            if root_of_all:
                entry.collectives.add("all_to_all")
                return
            if not 0 <= peer_in_group < len(entry.ranks):
                return
            peer = entry.ranks[peer_in_group]
            if batched or len(entry.ranks) == 2:
                entry.collectives.add("send_recv")
                if len(entry.peers) < MAX_PEERS:
                    entry.peers.add(peer)
            elif len(self._pairs) < MAX_PEERS:
                me = entry.ranks[self._my_index(entry)]
                self._pairs.add((min(me, peer), max(me, peer)))

    def _my_index(self, entry: _Group) -> int:
        try:
            return entry.ranks.index(self.rank)
        except ValueError:
            return 0

    # ------------------------------------------------------------------ the fact
    def to_fact(self, ranks_per_node: int) -> list[dict[str, Any]]:
        """``facts.communicators``: each communicator this rank holds (see ``allocsim.nccl``'s reader)."""
        per_node = max(1, int(ranks_per_node))
        out: list[dict[str, Any]] = []
        with self._lock:
            groups = list(self._groups.values())
            pairs = sorted(self._pairs)
        for g in groups:
            if not g.collectives and not g.eager:
                continue          # never used: no communicator (PyTorch makes it at the first collective)
            item: dict[str, Any] = {
                "name": g.name or f"group of {len(g.ranks)}", "ranks": len(g.ranks),
                "group_ranks": g.ranks[:MAX_LISTED_RANKS], "nodes": len({r // per_node for r in g.ranks}),
                "collectives": sorted(g.collectives), "count": 1}
            if "send_recv" in g.collectives:
                item["peers"] = max(1, min(len(g.peers), len(g.ranks) - 1))
            out.append(item)
        if pairs:
            by_nodes: dict[int, int] = {}
            for a, b in pairs:
                nodes = 1 if a // per_node == b // per_node else 2
                by_nodes[nodes] = by_nodes.get(nodes, 0) + 1
            for nodes, count in sorted(by_nodes.items()):
                out.append({"name": "send/recv pair", "ranks": 2, "nodes": nodes, "collectives": ["send_recv"],
                            "count": count, "peers": 1})
        return out
