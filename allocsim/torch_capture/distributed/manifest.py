"""A capture folder's ``manifest.json``: which ranks each role's trace stands for. ``Manifest.read(folder)``.

Written by ``allocsim capture`` for a distributed job (``capture_dir``), read by every command that
takes a capture folder (``allocsim.capture_folder``). Reading treats the file as untrusted: its size
is capped, every rank must be a whole number below the world size and belong to one role at most,
and a role's trace must be a plain file name in the folder (no path), so a manifest cannot point a
command at a file elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .roles import MAX_WORLD_SIZE, ranks_text

MANIFEST = "manifest.json"
SCHEMA = "allocsim-capture-dir/1"
#: A manifest larger than this is refused (a million ranks in lists is about 8 MiB).
MAX_MANIFEST_BYTES = 64 << 20
RULE = ("ranks grouped by their position in the pipeline group and the shapes of their shards (uneven DTensor "
        "layouts); each role captured by its lowest rank, the largest role checked by capturing its highest "
        "rank too and comparing request-stream fingerprints (docs/distributed.md)")


def trace_name(rank: int) -> str:
    """The file the capture of ``rank`` is written to, in the folder."""
    return f"rank{int(rank)}.parquet"


@dataclasses.dataclass
class RoleEntry:
    """One role: the ranks it stands for and the capture of its representative."""

    index: int
    ranks: list[int]
    representative: int
    why: str
    trace: str | None
    log: str | None
    status: int
    message: str
    seconds: float
    allocs: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fingerprint: str
    verified_by: dict[str, Any] | None = None
    #: The NCCL communicators this role's capture recorded (``facts.communicators`` of its rank); None: unknown.
    communicators: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["role"] = data.pop("index")
        data["ranks_text"] = ranks_text(self.ranks)
        return data


@dataclasses.dataclass
class Manifest:
    """The job a folder's traces come from, and its roles."""

    launcher: dict[str, Any]
    world_size: int
    gpu: str = ""
    torch: str = ""
    steps: int = 0
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    roles: list[RoleEntry] = dataclasses.field(default_factory=list)
    status: int = 0
    seconds: float = 0.0
    rule: str = RULE

    def to_dict(self) -> dict[str, Any]:
        return {"launcher": self.launcher, "world_size": self.world_size, "gpu": self.gpu, "torch": self.torch,
                "steps": self.steps, "status": self.status, "seconds": self.seconds, "rule": self.rule,
                "roles": [r.to_dict() for r in self.roles], "facts": self.facts, "notes": self.notes}

    def write(self, folder: str) -> str:
        from ...output_marks import write_json

        path = os.path.join(folder, MANIFEST)
        write_json(self.to_dict(), path, SCHEMA)
        return path

    def role_of(self, rank: int) -> RoleEntry | None:
        return next((r for r in self.roles if rank in r.ranks), None)

    @classmethod
    def read(cls, folder: str) -> "Manifest":
        """The manifest of ``folder``, checked (ValueError with one line saying what is wrong)."""
        path = os.path.join(folder, MANIFEST)
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise ValueError(f"{folder}: no {MANIFEST} ({exc.strerror or exc}); is it a folder allocsim capture "
                             "wrote?") from None
        if size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{path}: {size:,} bytes is more than a manifest may be ({MAX_MANIFEST_BYTES:,})")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not readable JSON ({exc})") from None
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a capture manifest: {exc}") from None

    @classmethod
    def _from_dict(cls, data: Any) -> "Manifest":
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"schema is not {SCHEMA!r}")
        world = data["world_size"]
        if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size {world!r} is not a whole number in [1, {MAX_WORLD_SIZE}]")
        seen: set[int] = set()
        roles = []
        for i, item in enumerate(data["roles"]):
            ranks = item["ranks"]
            if not isinstance(ranks, list) or not ranks:
                raise ValueError(f"role {i}: ranks must be a non-empty list")
            for r in ranks:
                if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world:
                    raise ValueError(f"role {i}: rank {r!r} is not in a world of {world}")
                if r in seen:
                    raise ValueError(f"rank {r} is in two roles")
                seen.add(r)
            trace = item.get("trace")
            if trace is not None and (not isinstance(trace, str) or os.path.basename(trace) != trace
                                      or trace in ("", ".", "..") or not trace.endswith((".parquet", ".csv"))):
                raise ValueError(f"role {i}: trace {trace!r} must be a .parquet or .csv file name in the folder")
            log = item.get("log")
            if log is not None and (not isinstance(log, str) or os.path.basename(log) != log):
                log = None
            rep = item.get("representative", ranks[0])
            roles.append(RoleEntry(
                index=i, ranks=[int(r) for r in ranks], representative=int(rep) if isinstance(rep, int) else ranks[0],
                why=str(item.get("why", ""))[:500], trace=trace, log=log, status=int(item.get("status", 0)),
                message=str(item.get("message", ""))[:2000], seconds=float(item.get("seconds", 0.0)),
                allocs=int(item.get("allocs", 0)), peak_allocated_bytes=int(item.get("peak_allocated_bytes", 0)),
                peak_reserved_bytes=int(item.get("peak_reserved_bytes", 0)),
                fingerprint=str(item.get("fingerprint", ""))[:64],
                verified_by=item.get("verified_by") if isinstance(item.get("verified_by"), dict) else None,
                communicators=item.get("communicators") if isinstance(item.get("communicators"), list) else None))
        launcher = data.get("launcher") if isinstance(data.get("launcher"), dict) else {}
        return cls(launcher=launcher, world_size=world, gpu=str(data.get("gpu", ""))[:100],
                   torch=str(data.get("torch", ""))[:60], steps=int(data.get("steps", 0)),
                   facts=data.get("facts") if isinstance(data.get("facts"), dict) else {},
                   notes=[str(n)[:2000] for n in data.get("notes", [])][:1000], roles=roles,
                   status=int(data.get("status", 0)), seconds=float(data.get("seconds", 0.0)),
                   rule=str(data.get("rule", RULE))[:2000])


def is_capture_folder(path: str) -> bool:
    """Whether ``path`` is a folder holding a capture manifest."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))
