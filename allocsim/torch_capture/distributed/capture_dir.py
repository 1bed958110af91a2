"""Capture a distributed job rank role by rank role into a folder: ``capture_job(launch, out_dir, ...)``.

The steps (``roles`` has the rule and why it holds):

1. rank 0 is captured first, with the environment its launcher gives it (``launcher``), and reports
   what it learned of the job (``facts``);
2. the ranks are grouped into roles from those facts (``roles.assign_roles``); each other role's
   lowest rank is captured, ``workers`` at a time, started in pipeline order (pipeline stages share a
   ``relay.Relay``: each gets the shapes the stage before it sends as they are sent);
3. where a role stands for several ranks, its highest rank is captured too and the two request
   streams' fingerprints compared (``verify``): equal, the role is verified; different, the role is
   split (``roles`` module doc);
4. ``manifest.json`` says the job (launcher command, world size, facts), each role's ranks, trace
   file, status and peaks, and how the roles were found.

A script that starts its own ranks (``torch.multiprocessing.spawn``) is launched like any other:
the capture of rank R runs the function of its R-th process in the script's own process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Callable

from .folder_check import LOG_HEADER
from .launcher import Launch
from .manifest import Manifest, RoleEntry, trace_name
from .relay import Relay
from .roles import JobFacts, Role, assign_roles, ranks_text, verification_rank


@dataclasses.dataclass
class RankCapture:
    """One capture of one rank."""

    rank: int
    status: int
    trace: str | None
    log: str | None
    seconds: float
    message: str
    summary: dict[str, Any]


def _capture_rank(launch: Launch, rank: int, out_dir: str, steps: int, gpu: dict[str, Any],
                  timeout_s: float | None, to_terminal: bool,
                  messages: list[dict[str, Any]] | None = None,
                  broadcasts: list[dict[str, Any]] | None = None, relay: Relay | None = None,
                  spawn_nprocs: int = 0) -> RankCapture:
    from ..session import capture

    path = os.path.join(out_dir, trace_name(rank))
    log_path = None if to_terminal else os.path.join(out_dir, f"rank{rank}.log")
    env = launch.rank_env(rank)
    if not launch.launcher and spawn_nprocs > 1 and "LOCAL_WORLD_SIZE" not in os.environ:
        # the script started its ranks itself on one node: rank R's process sees that node's GPUs (at
        # least one per process it started), so ``torch.cuda.set_device(R)`` works as on the GPUs
        env = {**env, "LOCAL_WORLD_SIZE": str(spawn_nprocs)}
    settings = {"spawn_index": rank, "messages": _bounded(messages or []),
                "broadcasts": _bounded_broadcasts(broadcasts or []), "relay": relay is not None}
    if log_path is None:
        result, _trace = capture(launch.rank_command(rank), path, steps=steps, gpu=gpu, timeout_s=timeout_s,
                                 env_extra=env, distributed=settings, relay=relay)
    else:
        with open(log_path, "w", encoding="utf-8") as fh:
            fh.write(f"{LOG_HEADER}{rank} (`{' '.join(launch.command)}`)\n")
            fh.flush()
            result, _trace = capture(launch.rank_command(rank), path, steps=steps, gpu=gpu, timeout_s=timeout_s,
                                     stdout=fh, stderr=fh, env_extra=env, distributed=settings, relay=relay)
    return RankCapture(rank, result.status, os.path.basename(result.trace_path) if result.trace_path else None,
                       os.path.basename(log_path) if log_path else None, result.seconds, result.message,
                       dict(result.summary or {}))


#: Characters of pipeline messages handed to one capture (they travel in its environment).
MAX_MESSAGES_CHARS = 96 << 10


def _bounded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, total = [], 0
    for m in messages:
        total += len(m.get("payload", ""))
        if total > MAX_MESSAGES_CHARS:
            break
        out.append(m)
    return out


#: Characters of rank 0's recorded broadcasts handed to one capture (they travel in its environment).
MAX_BROADCAST_CHARS = 64 << 10


def _bounded_broadcasts(broadcasts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, total = [], 0
    for b in broadcasts:
        total += len(str(b))
        if total > MAX_BROADCAST_CHARS:
            break
        out.append(b)
    return out


def _entry(role: Role, run: RankCapture, index: int) -> RoleEntry:
    summary = run.summary
    return RoleEntry(index=index, ranks=list(role.ranks), representative=run.rank, why=role.why, trace=run.trace,
                     log=run.log, status=run.status, message=run.message, seconds=round(run.seconds, 3),
                     allocs=int(summary.get("allocs", 0)),
                     peak_allocated_bytes=int(summary.get("peak_allocated_bytes", 0)),
                     peak_reserved_bytes=int(summary.get("peak_reserved_bytes", 0)),
                     fingerprint=str(summary.get("fingerprint", "")),
                     communicators=(summary.get("facts") or {}).get("communicators"))


def _world_of(launch: Launch, facts: JobFacts) -> tuple[int, list[str]]:
    """The job's world size: the launcher's, else what the script's ranks said (spawn), else 1."""
    notes = []
    if launch.launcher:
        if facts.rank is not None and facts.world_size != launch.world_size:
            notes.append(f"the script initialised a world of {facts.world_size} ranks, not the launcher's "
                         f"{launch.world_size}: the launcher's is kept")
        return launch.world_size, notes
    if facts.spawn and facts.spawn["nprocs"] > 1:
        world = facts.spawn["nprocs"]
        if facts.rank is not None and facts.world_size != world:
            notes.append(f"the script started {world} processes and initialised a world of {facts.world_size}; "
                         f"each process is taken for the rank of its index")
        return world, notes
    return max(1, facts.world_size if facts.rank is not None else 1), notes


def capture_job(launch: Launch, out_dir: str, *, steps: int = 0, gpu: dict[str, Any] | None = None,
                gpu_name: str = "", timeout_s: float | None = None, verify: bool = True, workers: int = 1,
                log: Callable[[str], None] = lambda message: None, rank0_to_terminal: bool = True) -> Manifest:
    """Capture every role of the job ``launch`` runs into ``out_dir`` and write its manifest (module doc).

    Rank 0's output goes to this process's own stdout and stderr (``rank0_to_terminal``, as torchrun
    shows local rank 0) or, like every other rank's, to ``rankR.log`` in the folder.
    """
    os.makedirs(out_dir, exist_ok=True)
    gpu = dict(gpu or {})
    t0 = time.monotonic()
    log("capturing rank 0 (it learns the job's layout)")
    probe = _capture_rank(launch, 0, out_dir, steps, gpu, timeout_s, to_terminal=rank0_to_terminal)
    facts = _facts_of(probe)
    world, notes = _world_of(launch, facts)
    roles, rule_notes = assign_roles(facts, world)
    notes += rule_notes
    manifest = Manifest(launcher=launch.to_dict(), world_size=world, gpu=gpu_name, torch=str(probe.summary.get("torch", "")),
                        steps=steps, facts=facts.to_dict(), notes=notes)
    if probe.status != 0 or probe.trace is None:
        role = next(r for r in roles if 0 in r.ranks)
        manifest.roles = [_entry(Role(role.ranks, 0, role.why), probe, 0)]
        manifest.status = probe.status
        manifest.seconds = round(time.monotonic() - t0, 3)
        manifest.write(out_dir)
        return manifest
    runs: dict[int, RankCapture] = {0: probe}
    todo = [role.representative for role in roles if role.representative != 0]
    check = verification_rank(roles) if verify else None
    if check is not None:
        todo.append(check[1])
    log(f"{len(roles)} role(s) in a world of {world}: capturing rank(s) {ranks_text(todo) or '-'}"
        + (f" (rank {check[1]} checks role {check[0]})" if check else ""))
    # pipeline positions start in order, ``workers`` at a time, and share one relay: each stage's capture
    # gets the shapes the earlier stages send it as they are sent (``relay``), so they run side by side
    relay = Relay(facts.messages) if facts.stages else None
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo) or 1))) as pool:
        spawned = int(facts.spawn["nprocs"]) if facts.spawn else 0
        futures = {pool.submit(_capture_rank, launch, rank, out_dir, steps, gpu, timeout_s, False, None,
                                   facts.broadcasts, relay, spawned): rank
                   for rank in todo}
        for future in concurrent.futures.as_completed(futures):
            run = future.result()
            runs[run.rank] = run
            log(f"captured rank {run.rank} ({run.seconds:.1f} s, exit {run.status})")
    entries = [_entry(role, runs[role.representative], i) for i, role in enumerate(roles)]
    if check is not None:
        entries = _verified(entries, roles, check, runs[check[1]], manifest)
    manifest.roles = entries
    manifest.status = next((e.status for e in entries if e.status != 0), 0)
    manifest.seconds = round(time.monotonic() - t0, 3)
    manifest.write(out_dir)
    return manifest


def _facts_of(run: RankCapture) -> JobFacts:
    facts = JobFacts()
    data = run.summary.get("facts") or {}
    facts.rank = data.get("rank")
    facts.world_size = int(data.get("world_size") or 1)
    facts.backend = str(data.get("backend") or "")
    facts.stages = list(data.get("stages") or [])
    facts.spawn = data.get("spawn")
    facts.shard_classes = data.get("shard_classes")
    facts.uneven_layouts = int(data.get("uneven_layouts") or 0)
    facts.notes = list(data.get("notes") or [])
    facts.communicators = data.get("communicators") if isinstance(data.get("communicators"), list) else None
    facts.broadcasts = [b for b in data.get("broadcasts") or [] if isinstance(b, dict)]
    facts.groups = list(run.summary.get("groups") or [])
    facts.messages = list(run.summary.get("messages") or [])
    return facts


def _verified(entries: list[RoleEntry], roles: list[Role], check: tuple[int, int], run: RankCapture,
              manifest: Manifest) -> list[RoleEntry]:
    """Compare the check capture with its role's; split the role when they differ."""
    index, rank = check
    entry = entries[index]
    same = run.status == 0 and entry.status == 0 and run.summary.get("fingerprint") == entry.fingerprint
    entry.verified_by = {"rank": rank, "fingerprint": str(run.summary.get("fingerprint", "")), "equal": same,
                         "trace": run.trace}
    if same or run.status != 0:
        if run.status != 0:
            manifest.notes.append(f"the check capture of rank {rank} ended with exit {run.status}: role "
                                  f"{ranks_text(entry.ranks)} is not verified")
        return entries
    others = [r for r in entry.ranks if r != entry.representative]
    manifest.notes.append(
        f"rank {rank}'s requests differ from rank {entry.representative}'s although the rule put them in one role: "
        f"rank {entry.representative} stands for itself alone and rank {rank}'s capture for ranks "
        f"{ranks_text(others)} (the script does work on some ranks that the others do not)")
    entry.ranks = [entry.representative]
    entry.why += "; split: its requests differ from the other ranks'"
    split = _entry(Role(others, rank, roles[index].why + "; split from rank "
                        f"{entry.representative}"), run, len(entries))
    split.verified_by = None
    return entries + [split]
