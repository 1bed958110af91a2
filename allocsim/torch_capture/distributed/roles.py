"""Which ranks of a job do the same work, so that one capture stands for them all: ``assign_roles(facts)``.

The rule (docs/distributed.md says it for users):

1. The first capture is rank 0's. It learns the job (``facts`` sent by the child, see
   ``allocsim.torch_capture.distributed.facts``): the world size, every process group created
   (every rank creates every group, the slices of a device mesh included), the pipeline stages
   rank 0 holds with the ranks of their pipeline group, and every DTensor layout whose shards
   differ in shape between ranks.
2. What changes a rank's work, and so its memory, is (a) its **position in its pipeline group**
   (which stages it holds: the first stage embeds, the last computes the loss, each keeps its own
   microbatches alive) and (b) the **shapes of its shards** where a tensor does not divide evenly
   (DTensor's chunking rule gives the last ranks of a dimension smaller or empty shards; FSDP2's
   optimizer state follows the unpadded shard). Data-parallel, FSDP, context-parallel and evenly
   sharded tensor-parallel ranks hold tensors of the same shapes and run the same operators:
   their request streams are the same.
3. Ranks with the same (pipeline position, shard shapes) form one **role**, captured once, by its
   lowest rank. A rank whose pipeline position cannot be found (its group was never seen) is a
   role of its own.
4. Where a role stands for several ranks, one more of them (its highest) is captured when
   affordable (``verify``) and its request stream's fingerprint compared with the role's. Equal:
   the role is verified. Different (a script that does extra work on rank 0, logging or
   evaluation): the role is split, the first capture standing for itself alone and the second for
   the rest, and the manifest says so.

So the number of captures follows the number of distinct roles (pipeline stages times uneven shard
classes, plus one check), never the world size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The largest world a capture accepts (a fact naming more is refused as malformed).
MAX_WORLD_SIZE = 1 << 20
#: Ranks kept over all groups a child reports (they come from the script's process: bounded).
MAX_GROUP_RANKS = 1 << 21
#: Pipeline stages kept per capture.
MAX_STAGES = 4096
#: Pipeline metadata messages kept per capture, and their total size (base64 characters).
MAX_MESSAGES = 4096
MAX_MESSAGE_CHARS = 1 << 22


def _int(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{value!r} is not a whole number in [{low}, {high}]")
    return value


def _ranks(value: Any, world_size: int) -> list[int]:
    if not isinstance(value, list):
        raise ValueError("ranks must be a list")
    return [_int(r, 0, max(world_size - 1, 0)) for r in value]


#: Communicators one rank may report (``allocsim.nccl.MAX_COMMUNICATORS``).
MAX_COMMUNICATORS = 4096
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv", "all_to_all")


def _communicators(value: Any, world_size: int) -> list[dict[str, Any]]:
    """The ``communicators`` fact, checked: each ``{name, ranks, group_ranks, nodes, collectives, count[, peers]}``."""
    if not isinstance(value, list) or len(value) > MAX_COMMUNICATORS:
        raise ValueError("communicators must be a list of at most 4096")
    out = []
    listed = 0
    for item in value:
        size = _int(item["ranks"], 1, world_size)
        collectives = item.get("collectives", [])
        if not isinstance(collectives, list) or any(c not in _COLLECTIVES for c in collectives):
            raise ValueError("unknown collective")
        entry: dict[str, Any] = {"name": str(item.get("name", ""))[:60], "ranks": size,
                                 "nodes": _int(item.get("nodes", 1), 1, size),
                                 "collectives": sorted(set(collectives)), "count": _int(item.get("count", 1), 1,
                                                                                         world_size)}
        members = item.get("group_ranks")
        if members is not None and listed + len(members) <= MAX_GROUP_RANKS:
            entry["group_ranks"] = _ranks(members, world_size)
            listed += len(members)
        if item.get("peers") is not None:
            entry["peers"] = _int(item["peers"], 0, max(size - 1, 0))
        out.append(entry)
    return out


@dataclasses.dataclass
class JobFacts:
    """What one rank's capture reported of its job (checked: they come from the script's process)."""

    rank: int | None = None
    world_size: int = 1
    backend: str = ""
    groups: list[list[int]] = dataclasses.field(default_factory=list)
    stages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    spawn: dict[str, Any] | None = None
    shard_classes: list[int] | None = None
    uneven_layouts: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    communicators: list[dict[str, Any]] | None = None
    broadcasts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    bad: int = 0
    _group_ranks: int = 0
    _message_chars: int = 0

    def add(self, fact: Any) -> None:
        """Take one ``["X", fact]`` payload; a malformed one is counted and dropped."""
        try:
            self._add(fact)
        except (ValueError, TypeError, KeyError):
            self.bad += 1

    def _add(self, fact: dict[str, Any]) -> None:
        kind = fact["fact"]
        if kind == "world":
            world_size = _int(fact["world_size"], 1, MAX_WORLD_SIZE)
            self.rank = _int(fact["rank"], 0, world_size - 1)
            self.world_size = world_size
            self.backend = str(fact.get("backend", ""))[:40]
        elif kind == "group":
            ranks = _ranks(fact["ranks"], self.world_size)
            if self._group_ranks + len(ranks) <= MAX_GROUP_RANKS:
                self._group_ranks += len(ranks)
                self.groups.append(ranks)
        elif kind == "stage":
            if len(self.stages) < MAX_STAGES:
                num_stages = _int(fact["num_stages"], 1, MAX_WORLD_SIZE)
                self.stages.append({"stage_index": _int(fact["stage_index"], 0, num_stages - 1),
                                    "num_stages": num_stages,
                                    "group_ranks": _ranks(fact["group_ranks"], self.world_size)})
        elif kind == "spawn":
            self.spawn = {"nprocs": _int(fact["nprocs"], 0, MAX_WORLD_SIZE), "index": _int(fact["index"], 0,
                                                                                         MAX_WORLD_SIZE),
                          "how": str(fact.get("how", ""))[:60]}
        elif kind == "shards":
            classes = fact["class_of_rank"]
            if not isinstance(classes, list) or len(classes) != self.world_size:
                raise ValueError("class_of_rank must give one class per rank")
            self.shard_classes = [_int(c, 0, MAX_WORLD_SIZE) for c in classes]
            self.uneven_layouts = _int(fact.get("layouts", 0), 0, 1 << 30)
        elif kind == "message":
            payload = fact["payload"]
            if not isinstance(payload, str):
                raise ValueError("payload must be text")
            if len(self.messages) < MAX_MESSAGES and self._message_chars + len(payload) <= MAX_MESSAGE_CHARS:
                self._message_chars += len(payload)
                self.messages.append({"src_stage": _int(fact["src_stage"], 0, MAX_WORLD_SIZE),
                                      "dst_stage": _int(fact["dst_stage"], 0, MAX_WORLD_SIZE), "payload": payload})
        elif kind == "broadcast":
            values = fact["values"]
            if not isinstance(values, list) or len(values) > 64 or not all(
                    isinstance(v, (int, float, bool)) for v in values):
                raise ValueError("broadcast values must be a short list of numbers")
            if len(self.broadcasts) < 1024:
                self.broadcasts.append({"key": str(fact["key"])[:200], "values": values})
        elif kind == "communicators":
            self.communicators = _communicators(fact["communicators"], self.world_size)
        elif kind == "error":
            self.notes.append(str(fact.get("text", ""))[:300])
        else:
            raise ValueError(f"unknown fact {kind!r}")

    def to_dict(self) -> dict[str, Any]:
        """The facts the manifest keeps (groups are summarised: their count and sizes)."""
        sizes = sorted({len(g) for g in self.groups})
        return {"rank": self.rank, "world_size": self.world_size, "backend": self.backend,
                "groups": len(self.groups), "group_sizes": sizes, "stages": self.stages, "spawn": self.spawn,
                "uneven_layouts": self.uneven_layouts, "shard_classes": self.shard_classes,
                "notes": self.notes, "malformed": self.bad,
                **({"communicators": self.communicators} if self.communicators is not None else {}),
                **({"broadcasts": self.broadcasts} if self.broadcasts else {})}


@dataclasses.dataclass
class Role:
    """Ranks that do the same work, and the rank whose capture stands for them."""

    ranks: list[int]
    representative: int
    why: str                      # what sets this role apart, in words
    position: int = 0             # its position in its pipeline group (the order pipeline roles are captured in)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "ranks_text": ranks_text(self.ranks), "representative": self.representative,
                "why": self.why}


def ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _pipeline_positions(facts: JobFacts) -> tuple[dict[int, int] | None, str]:
    """Each rank's position in its pipeline group, from the groups seen; None when there is no pipeline."""
    if not facts.stages:
        return None, ""
    mine = sorted(set(facts.stages[0]["group_ranks"]))
    size = len(mine)
    if size <= 1:
        return None, ""
    # the family of groups the pipeline group belongs to: the groups created next to it, of its size,
    # none overlapping another (every rank creates a family's groups one after the other: a device
    # mesh's dimension, Megatron's parallel_state); other families of that size (tensor or data
    # parallel groups of the same size) are not mixed in
    family = _family_of(mine, [sorted(set(g)) for g in facts.groups])
    position: dict[int, int] = {}
    for group in [mine] + family:
        for index, rank in enumerate(group):
            position.setdefault(rank, index)
    stages = sorted({s["stage_index"] for s in facts.stages})
    return position, f"pipeline group of {size} ranks; rank {facts.rank} holds stage(s) {stages} of " \
                      f"{facts.stages[0]['num_stages']}"


def _family_of(mine: list[int], groups: list[list[int]]) -> list[list[int]]:
    """The groups made consecutively with ``mine`` (same size, pairwise disjoint); all such groups when it was not seen.

    Groups made among them whose ranks are already in the family (Megatron makes each pipeline
    group's embedding group right after it), or of another size touching no member, are passed over.
    """
    size = len(mine)
    if mine not in groups:
        return [g for g in groups if len(g) == size and not set(g) & set(mine)]
    at = groups.index(mine)
    family, used = [mine], set(mine)
    # rank 0's group comes first in its family (each family is made in rank order): walk forward
    for step in (1,):
        i = at + step
        while 0 <= i < len(groups):
            group = set(groups[i])
            if group <= used or not group & used and len(group) != size:
                pass                  # made beside the family's groups (Megatron's embedding groups): skipped
            elif len(group) == size and not group & used:
                family.append(groups[i])
                used |= group
            else:
                break
            i += step
    return family


def assign_roles(facts: JobFacts, world_size: int | None = None) -> tuple[list[Role], list[str]]:
    """The roles of the job rank 0's capture described, and the rule's notes (see the module doc)."""
    world = world_size or facts.world_size
    notes: list[str] = []
    positions, pipeline_note = _pipeline_positions(facts)
    if pipeline_note:
        notes.append(pipeline_note)
    shards = facts.shard_classes if facts.shard_classes and len(facts.shard_classes) == world else None
    if shards is not None and len(set(shards)) > 1:
        notes.append(f"{facts.uneven_layouts} DTensor layouts shard unevenly: {len(set(shards))} classes of ranks "
                     "by the shapes of their shards")
    keys: dict[tuple, list[int]] = {}
    for rank in range(world):
        if positions is None:
            stage_key: Any = 0
        else:
            stage_key = positions.get(rank, ("own", rank))
        shard_key = shards[rank] if shards is not None else 0
        keys.setdefault((stage_key, shard_key), []).append(rank)
    roles = []
    for (stage_key, shard_key), ranks in keys.items():
        why = []
        if positions is not None:
            why.append(f"pipeline position {stage_key}" if not isinstance(stage_key, tuple)
                       else "pipeline position unknown (its group was not seen)")
        if shards is not None and len(set(shards)) > 1:
            why.append(f"shard class {shard_key}")
        position = stage_key if isinstance(stage_key, int) else world
        roles.append(Role(ranks, ranks[0], "; ".join(why) or "every rank does the same work", position))
    roles.sort(key=lambda role: (role.position, role.representative))
    return roles, notes


def verification_rank(roles: list[Role]) -> tuple[int, int] | None:
    """``(role index, rank)`` to capture a second time as a check: the highest rank of the largest role."""
    candidates = [(len(role.ranks), -i, i) for i, role in enumerate(roles) if len(role.ranks) > 1]
    if not candidates:
        return None
    _, _, index = max(candidates)
    return index, roles[index].ranks[-1]
