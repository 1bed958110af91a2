"""Capture the public scripts that wrote the shared GPU snapshots and compare: ``python -m validate snapshots``.

The snapshots under ``../shared/traces/scale-series/`` were dumped by public CS336 scripts on real GPUs
(``torch.cuda.memory._dump_snapshot``). ``validate/snapshot_recipes.json`` says, per snapshot file,
which repository and commit holds the script, the script and its arguments (found from the snapshot's
own event counts and Python frames, the script's git history and the commit that added the file),
the ``PYTHONPATH`` folders, the GPU, and the marker that ends its window. For each recipe
``allocsim capture`` runs the script on this machine's CPU (once per distinct command; kept in
``--work``), and the capture is compared with the snapshot over the same window:

* the window ends at the last ``memory snapshot FILE`` marker of the recipe's file (a later dump
  overwrites an earlier one) and opens at the last ``memory_history start`` before it. Disabling the
  history clears PyTorch's ring buffer (``recordHistory``), so nothing before that start is in the file;
* a history started with ``max_entries=N`` keeps only its last N entries. Entries are counted as a
  snapshot's ``device_traces`` counts them: ``alloc``, ``free_requested`` and ``free_completed`` are
  separate entries (a capture's free is a FREE_REQUESTED and a FREE_COMPLETED event, two entries, as
  ``allocsim.trace.formats.snapshot.reader`` reads them back), and the allocator's own
  ``segment_alloc`` / ``segment_free`` entries are counted from the replay (one per event at which the
  simulated reserved bytes change). Such a window opens mid-run, with everything live at that point;
* the capture is replayed through the pytorch preset from its start and its peaks are taken over
  the window, the state just before the window's first event included; the real peaks are
  ``allocsim.run(snapshot, "pytorch").summary`` (the snapshot's window replayed from the start state
  the reader reconstructs from its final segments).

``--repos DIR`` is a folder holding each repository's files at the recipe's commit as
``DIR/OWNER+REPO/`` (the ``.py`` files are enough; ``--extract-from GITS`` writes them from local
clones named ``GITS/OWNER+REPO``, bare or not). A recipe whose tree is missing, whose script fails
before its window ends or whose marker never comes is reported as such, with the reason. The
scripts import what their projects install (einops, einx, jaxtyping, pandas): not allocsim's
dependencies, install them beside torch. ``--explain N`` aligns the window's allocation sizes,
capture against snapshot, and names the ops of the first N places where they differ (``divergences``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

HERE = Path(__file__).resolve().parent
RECIPES_PATH = HERE / "snapshot_recipes.json"
#: ``../shared`` beside the repository root, where the real snapshots are.
DEFAULT_SHARED = HERE.parent.parent / "shared"
SERIES_FOLDER = Path("traces") / "scale-series"
#: Targets: |peak allocated error| and |peak reserved error|.
ALLOCATED_TARGET = 0.005
RESERVED_TARGET = 0.02

START_PREFIX = "memory_history start"
STOP_LABEL = "memory_history stop"
SNAPSHOT_PREFIX = "memory snapshot "
_MAX_ENTRIES = re.compile(r"max_entries=(\d+)")
#: Event kinds (``allocsim.trace.schema.EventKind``) a snapshot's history records one entry for.
_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, _EMPTY_CACHE, _MARKER = 1, 2, 3, 4, 5
_ENTRY_KINDS = (_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED)


# ---------------------------------------------------------------------------------------------- recipes
def load_recipes(path: str | os.PathLike = RECIPES_PATH) -> dict[str, Any]:
    """The recipe table: ``captures`` (name -> how to run the script) and ``snapshots`` (one per file)."""
    with open(path, encoding="utf-8") as fh:
        table = json.load(fh)
    for snap in table["snapshots"]:
        if snap["capture"] not in table["captures"]:
            raise ValueError(f"{path}: snapshot {snap['file']} names capture {snap['capture']!r}, "
                             "which the table does not have")
    return table


def tree_name(repo: str) -> str:
    """The folder name of ``owner/name`` under ``--repos``: ``owner+name``."""
    return repo.replace("/", "+")


def capture_key(cap: Mapping[str, Any]) -> str:
    """A short hash of what makes a capture (a changed recipe is captured afresh)."""
    fields = {k: cap.get(k) for k in ("repo", "commit", "script", "module", "args", "pythonpath", "gpu", "env")}
    fields.update({k: cap[k] for k in ("distributions",) if cap.get(k)})
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def capture_argv(cap: Mapping[str, Any], output: str, python: str | None = None) -> list[str]:
    """``python -m allocsim capture`` for one capture recipe, writing ``output``; the script runs in ``python``
    (an interpreter with torch and the scripts' imports; default: this one)."""
    target = ["-m", cap["module"]] if cap.get("module") else [cap["script"]]
    return [sys.executable, "-m", "allocsim", "capture", "--gpu", cap["gpu"], "-o", output, "--",
            python or sys.executable, *target, *cap.get("args", [])]


def extract_tree(git_dir: str | os.PathLike, commit: str, dest: str | os.PathLike,
                 suffixes: tuple[str, ...] = (".py", ".yaml", ".yml")) -> int:
    """Write the files of ``commit`` ending in ``suffixes`` from the clone ``git_dir`` under ``dest``; their number."""
    names = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "-r", "-z", "--name-only", commit],
                           capture_output=True, check=True).stdout.decode().split("\0")
    count = 0
    for name in names:
        if not name.endswith(suffixes):
            continue
        blob = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{name}"], capture_output=True)
        if blob.returncode != 0:
            continue             # a blob the clone does not hold (LFS-like); the scripts never need them
        target = Path(dest) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
        count += 1
    return count


def extract_all(table: Mapping[str, Any], gits: str | os.PathLike, repos: str | os.PathLike) -> list[str]:
    """Extract every capture's tree from ``gits/OWNER+REPO`` (or its ``repo`` subfolder); lines saying what was done."""
    lines = []
    done: set[tuple[str, str]] = set()
    for cap in table["captures"].values():
        key = (cap["repo"], cap["commit"])
        if key in done:
            continue
        done.add(key)
        base = Path(gits) / tree_name(cap["repo"])
        git_dir = base / "repo" if (base / "repo").is_dir() else base
        if not git_dir.is_dir():
            lines.append(f"{cap['repo']}: no clone at {base}")
            continue
        n = extract_tree(git_dir, cap["commit"], Path(repos) / tree_name(cap["repo"]))
        lines.append(f"{cap['repo']}@{cap['commit'][:8]}: {n} files")
    return lines


def stub_distributions(folder: Path, names: Iterable[str]) -> Path:
    """A folder of bare ``NAME-0.dist-info`` entries, so ``importlib.metadata.version(NAME)`` answers.

    The repositories' ``cs336_systems/__init__.py`` asks for its own installed version (``uv`` installs
    the project); the capture runs the tree from ``PYTHONPATH`` instead, so the metadata is stubbed.
    """
    for name in names:
        info = folder / f"{name.replace('-', '_')}-0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    return folder.resolve()


@dataclasses.dataclass
class CaptureOutcome:
    """One capture: its trace (None when there is none) and what happened."""

    path: str | None
    returncode: int | None
    message: str          # "" when the script ran to its end; else the script's error or why nothing ran
    seconds: float = 0.0
    reused: bool = False


def run_capture(name: str, cap: Mapping[str, Any], repos: str | os.PathLike, work: str | os.PathLike,
                timeout: float | None = None, python: str | None = None) -> CaptureOutcome:
    """Capture ``cap`` in ``work`` unless a capture of the same recipe is there; never raises for a failed script."""
    tree = Path(repos) / tree_name(cap["repo"])
    work = Path(work)
    stem = f"{name}-{capture_key(cap)}"
    output, sidecar = work / f"{stem}.parquet", work / f"{stem}.json"
    if sidecar.exists():
        info = json.loads(sidecar.read_text())
        if info.get("path") is None or output.exists():
            return CaptureOutcome(str(output) if info.get("path") else None, info.get("returncode"),
                                  info.get("message", ""), info.get("seconds", 0.0), reused=True)
    script = tree / (cap["script"] if not cap.get("module") else cap["module"].replace(".", "/") + ".py")
    if not script.is_file():
        return CaptureOutcome(None, None, f"not extracted: {tree_name(cap['repo'])}/"
                              f"{script.relative_to(tree)} is missing under --repos "
                              f"(files of {cap['repo']}@{cap['commit'][:8]})")
    work.mkdir(parents=True, exist_ok=True)
    for folder in cap.get("mkdir", []):
        (tree / folder).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    paths = [str((tree / p).resolve()) for p in cap.get("pythonpath", [])]
    if cap.get("distributions"):
        paths.append(str(stub_distributions(work / "distributions", cap["distributions"])))
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(cap.get("env", {}))
    argv = capture_argv(cap, str(output), python)
    if timeout:
        argv[4:4] = ["--timeout", str(int(timeout))]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    message = ""
    stops = [line for line in done.stderr.splitlines() if "the trace stops where the script raised" in line]
    if stops:
        message = stops[-1].split("raised", 1)[1].strip()
    elif done.returncode != 0:
        message = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    path = str(output) if output.exists() else None
    if path is None and not message:
        message = f"allocsim capture wrote no trace (exit status {done.returncode})"
    sidecar.write_text(json.dumps({"path": path, "returncode": done.returncode, "message": message,
                                   "seconds": round(seconds, 1), "argv": argv[1:], "recipe": dict(cap)},
                                  indent=1) + "\n")
    return CaptureOutcome(path, done.returncode, message, seconds)


# ---------------------------------------------------------------------------------------------- window
@dataclasses.dataclass
class Window:
    """Where a snapshot's history window lies in a capture's events."""

    start: int            # index of the ``memory_history start`` marker
    end: int              # index of the ``memory snapshot FILE`` marker
    first: int            # first event whose entry is in the window (start + 1 unless a ring buffer cut it)
    max_entries: int | None
    entries: int          # entries the window holds (at most max_entries)
    entries_since_start: int   # entries recorded from start to end (more than max_entries: a tail)

    @property
    def is_tail(self) -> bool:
        return self.first > self.start + 1


def markers(kinds: np.ndarray, alloc_ids: np.ndarray, labels: list[str]) -> list[tuple[int, str]]:
    """(event index, label) of every marker event."""
    return [(int(i), labels[int(alloc_ids[i])]) for i in np.flatnonzero(kinds == _MARKER)]


def entry_counts(kinds: np.ndarray, reserved: np.ndarray | None = None, initial: int | None = None) -> np.ndarray:
    """Snapshot entries each event makes: 1 per alloc / free_requested / free_completed, plus 1 where the
    simulated reserved bytes change (``reserved[i]``: after event i; ``initial``: before event 0, by
    default ``reserved[0]``; a segment_alloc or segment_free)."""
    counts = np.isin(kinds, _ENTRY_KINDS).astype(np.int64)
    if reserved is not None and len(reserved):
        before = np.concatenate(([reserved[0] if initial is None else initial], reserved[:-1]))
        counts += (reserved != before).astype(np.int64)
    return counts


def history_window(kinds: np.ndarray, marks: list[tuple[int, str]], end_label: str,
                   counts: np.ndarray | None = None, max_entries: int | None = None) -> Window:
    """The window of the snapshot ``end_label`` names (``memory snapshot FILE``) in a capture's events.

    ``counts`` are the entries per event (``entry_counts``; default: requests only); ``max_entries``
    overrides the one the start marker carries. Raises ``LookupError`` when the markers are not there.
    """
    ends = [i for i, label in marks if label == end_label]
    if not ends:
        dumps = sorted({label[len(SNAPSHOT_PREFIX):] for _, label in marks if label.startswith(SNAPSHOT_PREFIX)})
        raise LookupError(f"no marker {end_label!r} in the capture (its dumps: {', '.join(dumps) or 'none'})")
    end = ends[-1]
    starts = [(i, label) for i, label in marks if label.startswith(START_PREFIX) and i < end]
    if not starts:
        raise LookupError(f"no {START_PREFIX!r} marker before {end_label!r}")
    start, start_label = starts[-1]
    stops = [i for i, label in marks if label == STOP_LABEL and start < i < end]
    if stops:
        raise LookupError(f"the history was stopped (event {stops[0]}) before {end_label!r}: the dump has no trace")
    if max_entries is None:
        found = _MAX_ENTRIES.search(start_label)
        max_entries = int(found.group(1)) if found else None
    if counts is None:
        counts = entry_counts(kinds)
    inside = counts[start + 1:end]
    total = int(inside.sum())
    first = start + 1
    kept = total
    if max_entries is not None and total > max_entries:
        # The ring buffer keeps the last max_entries entries: walk back from the end.
        from_end = np.cumsum(inside[::-1])
        k = int(np.searchsorted(from_end, max_entries, side="left"))   # entries of the last k+1 events >= N
        first = end - 1 - k
        kept = max_entries
    return Window(start=start, end=end, first=first, max_entries=max_entries, entries=kept,
                  entries_since_start=total)


def window_peaks(event_index: np.ndarray, series: Mapping[str, np.ndarray], window: Window) -> dict[str, int]:
    """Peaks of the replay's series over the window, the state just before its first event included."""
    keep = (event_index >= window.first - 1) & (event_index <= window.end)
    return {name: int(values[keep].max()) for name, values in series.items()}


# ---------------------------------------------------------------------------------------------- compare
PEAKS = ("requested", "allocated", "reserved")


def replay_capture(trace: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The capture replayed through the pytorch preset: event_index and the byte series per event."""
    import allocsim
    ts = allocsim.run(trace, "pytorch", fast=True).timeseries
    return ts["event_index"].to_numpy(), {p: ts[f"{p}_bytes"].to_numpy() for p in PEAKS}


def real_peaks(snapshot: Any) -> dict[str, int]:
    """The snapshot's window replayed through the pytorch preset from its reconstructed start state."""
    import allocsim
    summary = allocsim.run(snapshot, "pytorch", fast=True).summary
    return {p: int(summary[f"peak_{p}_bytes"]) for p in PEAKS}


def compare_window(capture: Any, end_label: str, snapshot: Any,
                   replayed: tuple[np.ndarray, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """Capture (a ``Trace``) vs snapshot (a ``Trace``) over the window ``end_label`` ends; a row's figures."""
    event_index, series = replayed if replayed is not None else replay_capture(capture)
    events = capture.events
    kinds = events["kind"].to_numpy()
    reserved = np.zeros(len(kinds), np.int64)
    rows = event_index >= 0
    reserved[event_index[rows]] = series["reserved"][rows]
    initial = series["reserved"][event_index < 0]
    window = history_window(kinds, markers(kinds, events["alloc_id"].to_numpy(), capture.labels), end_label,
                            entry_counts(kinds, reserved, int(initial[0]) if len(initial) else None))
    got = window_peaks(event_index, series, window)
    real = real_peaks(snapshot)
    real_kinds = snapshot.events["kind"].to_numpy()
    return {
        "real": real, "capture": got,
        "error": {p: got[p] / real[p] - 1 if real[p] else None for p in PEAKS},
        "window": dataclasses.asdict(window) | {"is_tail": window.is_tail},
        "real_entries": int(np.isin(real_kinds, _ENTRY_KINDS).sum()),
        "real_allocs": int((real_kinds == _ALLOC).sum()),
        "capture_allocs": int((kinds[window.first:window.end] == _ALLOC).sum()),
    }


def on_target(row: Mapping[str, Any]) -> bool | None:
    """Whether a compared row meets both targets (None for a row without figures)."""
    err = row.get("error")
    if not err:
        return None
    return abs(err["allocated"]) <= ALLOCATED_TARGET and abs(err["reserved"]) <= RESERVED_TARGET


def evaluate(table: Mapping[str, Any], repos: str | os.PathLike, work: str | os.PathLike,
             shared: str | os.PathLike = DEFAULT_SHARED, only: Iterable[str] | None = None, jobs: int = 2,
             timeout: float | None = None, explain: int = 0, explain_all: bool = False,
             python: str | None = None) -> list[dict[str, Any]]:
    """One row per snapshot recipe (those whose file or series contains one of ``only``), captured in ``python``.

    ``explain=N`` adds the first N divergences (``divergences``) to each row off target, or to every
    row with ``explain_all``.
    """
    import allocsim

    snaps = [s for s in table["snapshots"]
             if not only or any(o in s["file"] or o == s["series"] for o in only)]
    needed = sorted({s["capture"] for s in snaps})
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        outcomes = dict(zip(needed, pool.map(
            lambda name: run_capture(name, table["captures"][name], repos, work, timeout, python), needed)))
    loaded: dict[str, Any] = {}
    rows = []
    for snap in snaps:
        cap = table["captures"][snap["capture"]]
        row: dict[str, Any] = {"file": snap["file"], "series": snap["series"], "size": snap["size"],
                               "precision": snap["precision"], "gpu": cap["gpu"],
                               "command": " ".join([cap.get("script") or f"-m {cap['module']}", *cap.get("args", [])])}
        outcome = outcomes[snap["capture"]]
        row["script_error"] = outcome.message or None
        path = Path(shared) / SERIES_FOLDER / snap["file"]
        if not path.is_file():
            row["status"] = f"no snapshot: {path} is absent"
        elif outcome.path is None:
            row["status"] = f"not captured: {outcome.message}"
        else:
            if snap["capture"] not in loaded:
                trace = allocsim.read_trace(outcome.path)
                loaded[snap["capture"]] = (trace, replay_capture(trace))
            trace, replayed = loaded[snap["capture"]]
            snapshot = allocsim.read_trace(str(path))
            try:
                row.update(compare_window(trace, SNAPSHOT_PREFIX + snap["end_marker"], snapshot, replayed))
                row["status"] = "ok"
                if explain and (explain_all or not on_target(row)):
                    w = row["window"]
                    row["divergences"] = divergences(trace, w["first"], w["end"], snapshot, explain, w["is_tail"])
            except LookupError as exc:
                why = f"; the script stopped early: {outcome.message}" if outcome.message else ""
                row["status"] = f"window not found: {exc}{why}"
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- divergences
_ALLOCATOR_FRAMES = re.compile(
    r"unwind|CapturedTraceback|gather_with_cpp|CachingAllocator|StorageImpl|empty_generic|empty_strided|"
    r"empty_cuda|_empty_generic|create_out|make_storage|TensorBase|allocate\(|at::empty|at::detail::|"
    r"c10::intrusive_ptr|at::_ops::|wrapper_CUDA|c10::impl::|c10::Dispatcher|torch::autograd::VariableType|"
    r"c10::BoxedKernel|c10::KernelFunction|at::Tensor::|at::TensorBase")


def _describe_real(trace: Any, stack_id: int) -> str:
    """The op of a snapshot allocation: the first C++ frames past the allocator, and the innermost Python line."""
    if stack_id < 0:
        return "no frames"
    frames = trace.stack(stack_id)
    ops = [name for file, _line, name in frames
           if not file.endswith(".py") and name and not _ALLOCATOR_FRAMES.search(name)]
    py = [f"{os.path.basename(file)}:{line} {name}" for file, line, name in frames if file.endswith(".py")
          and "site-packages" not in file and "/lib/python" not in file]
    op = " < ".join(_short(n) for n in ops[:2]) or "?"
    return f"{op} @ {py[0] if py else '?'}"


def _describe_capture(trace: Any, stack_id: int) -> str:
    if stack_id < 0:
        return "no frames"
    frames = trace.stack(stack_id)
    op = [name for file, _line, name in frames if file == "aten"]
    py = [f"{os.path.basename(file)}:{line} {name}" for file, line, name in frames if file.endswith(".py")
          and "site-packages" not in file and "/lib/python" not in file]
    return f"{op[0] if op else '?'} @ {py[0] if py else '?'}"


def _short(name: str) -> str:
    """A C++ frame name without its argument list."""
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0 and out and out[-1] not in ":<":
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out)[:120]


def align(real: list[int], capture: list[int], *, from_end: bool = False, run: int = 4, reach: int = 400,
          max_blocks: int = 5000) -> list[tuple[int, int, int, int]]:
    """Non-matching blocks ``(i1, i2, j1, j2)`` of two size sequences, in order of position.

    A greedy walk in lockstep that, at a mismatch, skips the fewest items on either side (at most
    ``reach`` in all) after which ``run`` items match again. ``from_end`` anchors the walk at the
    ends (a ring-buffer tail: both windows end at the dump, their starts differ). Unlike ``difflib``
    (longest block first) it does not pair a forward pass with the next one of a periodic sequence.
    """
    a, b = (real[::-1], capture[::-1]) if from_end else (real, capture)
    n, m = len(a), len(b)
    i = j = 0
    blocks = []
    while i < n and j < m and len(blocks) < max_blocks:
        if a[i] == b[j]:
            i += 1
            j += 1
            continue
        found = None
        for total in range(1, reach + 1):
            for di in range(total + 1):
                dj = total - di
                k = min(run, n - i - di, m - j - dj)
                if k > 0 and a[i + di:i + di + k] == b[j + dj:j + dj + k]:
                    found = (di, dj)
                    break
            if found:
                break
        if found is None:
            break
        blocks.append((i, i + found[0], j, j + found[1]))
        i += found[0]
        j += found[1]
    if (i < n or j < m) and len(blocks) < max_blocks:
        blocks.append((i, n, j, m))
    if from_end:
        blocks = [(n - i2, n - i1, m - j2, m - j1) for i1, i2, j1, j2 in reversed(blocks)]
    return blocks


def divergences(capture: Any, first: int, end: int, snapshot: Any, limit: int = 5,
                tail: bool = False) -> dict[str, Any]:
    """Where the window's allocations differ, capture vs snapshot: the first ``limit`` blocks and totals by op.

    Allocation sizes are aligned in order (``align``; from the dump backwards for a ring-buffer
    ``tail``, whose first block, where the two windows open at different points, is left out).
    Each block gives the sizes on both sides, their bytes, and what allocated them (the snapshot's
    C++ op and Python line; the capture's ATen op and line); ``by_op`` sums every block's
    allocations per side and op.
    """
    ev = capture.events
    kinds = ev["kind"].to_numpy()[first:end]
    cap_idx = np.flatnonzero(kinds == _ALLOC) + first
    cap_sizes = ev["size_bytes"].to_numpy()[cap_idx].tolist()
    cap_stacks = ev["stack_id"].to_numpy()[cap_idx]
    sev = snapshot.events
    s_idx = np.flatnonzero(sev["kind"].to_numpy() == _ALLOC)
    real_sizes = sev["size_bytes"].to_numpy()[s_idx].tolist()
    real_stacks = sev["stack_id"].to_numpy()[s_idx]
    blocks = align(real_sizes, cap_sizes, from_end=tail)
    if tail and blocks and (blocks[0][0] == 0 or blocks[0][2] == 0):
        blocks = blocks[1:]
    real_desc: dict[int, str] = {}
    cap_desc: dict[int, str] = {}

    def rdesc(k: int) -> str:
        sid = int(real_stacks[k])
        if sid not in real_desc:
            real_desc[sid] = _describe_real(snapshot, sid)
        return real_desc[sid]

    def cdesc(k: int) -> str:
        sid = int(cap_stacks[k])
        if sid not in cap_desc:
            cap_desc[sid] = _describe_capture(capture, sid)
        return cap_desc[sid]

    by_op: dict[tuple[str, str], list[int]] = {}
    first_blocks = []
    for i1, i2, j1, j2 in blocks:
        for k in range(i1, i2):
            tally = by_op.setdefault(("real", rdesc(k)), [0, 0])
            tally[0] += 1
            tally[1] += real_sizes[k]
        for k in range(j1, j2):
            tally = by_op.setdefault(("capture", cdesc(k)), [0, 0])
            tally[0] += 1
            tally[1] += cap_sizes[k]
        if len(first_blocks) < limit:
            first_blocks.append({
                "kind": ("differ" if i2 > i1 and j2 > j1 else
                         "only in the real run" if i2 > i1 else "only in the capture"),
                "real_position": i1, "capture_position": j1,
                "real_sizes": real_sizes[i1:i2][:8], "real_bytes": int(sum(real_sizes[i1:i2])), "real_count": i2 - i1,
                "capture_sizes": cap_sizes[j1:j2][:8], "capture_bytes": int(sum(cap_sizes[j1:j2])),
                "capture_count": j2 - j1,
                "real_ops": sorted({rdesc(k) for k in range(i1, i2)})[:3],
                "capture_ops": sorted({cdesc(k) for k in range(j1, j2)})[:3],
            })
    totals = sorted(([side, op, n, nbytes] for (side, op), (n, nbytes) in by_op.items()), key=lambda r: -r[3])
    return {"blocks": len(blocks), "first": first_blocks, "by_op": totals[:12]}


# ---------------------------------------------------------------------------------------------- output
def _gb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.3f}%"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one table per precision group (fp32, then autocast), a row per snapshot; figures in GB (1e9)."""
    header = ("| series | size | real requested | real allocated | real reserved | capture requested | "
              "capture allocated | capture reserved | err requested | err allocated | err reserved | on target |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["precision"], []).append(row)
    order = sorted(groups, key=lambda g: (g != "fp32", g))
    parts = []
    notes: dict[tuple[str, str], list[str]] = {}
    for group in order:
        lines = [f"**{group}**", "", header]
        for row in groups[group]:
            if row.get("status") != "ok":
                lines.append(f"| {row['series']} | {row['size']} | " + " | ".join(["-"] * 9)
                             + f" | no: {row['status']} |")
                continue
            real, got, err = row["real"], row["capture"], row["error"]
            mark = "yes" if on_target(row) else "**no**"
            lines.append(f"| {row['series']} | {row['size']} | " + " | ".join(
                [_gb(real[p]) for p in PEAKS] + [_gb(got[p]) for p in PEAKS] + [_pct(err[p]) for p in PEAKS])
                + f" | {mark} |")
            if row.get("script_error"):
                notes.setdefault((f"{row['series']} ({row['precision']})", row["script_error"]), []).append(
                    str(row["size"]))
        parts.append("\n".join(lines))
    text = "\n\n".join(parts)
    text += (f"\n\nGB = 1e9 bytes; errors are capture / real - 1; targets |allocated| <= {ALLOCATED_TARGET:.1%}, "
             f"|reserved| <= {RESERVED_TARGET:.0%}.")
    for (series, error), sizes in sorted(notes.items()):
        text += (f"\n- {series}, sizes {', '.join(sizes)}: the script raised after the window ({error}); "
                 "the trace up to there was used")
    windows = [row for row in rows if row.get("status") == "ok"]
    if windows:
        text += "\n\nWindows (events of the capture; entries as the snapshot counts them):"
        for row in windows:
            w = row["window"]
            what = (f"ring-buffer tail: the last {w['entries']:,} of {w['entries_since_start']:,} entries "
                    "since the start" if w["is_tail"] else f"{w['entries']:,} entries from the start")
            text += (f"\n- {row['series']} {row['size']} ({row['precision']}): events {w['first']}..{w['end']}, "
                     f"{what}; allocations in the window: capture {row['capture_allocs']:,}, "
                     f"real {row['real_allocs']:,}")
    return text


def format_divergences(rows: list[dict[str, Any]]) -> str:
    """The first divergences of each off-target row."""
    out = []
    for row in rows:
        if not row.get("divergences"):
            continue
        out.append(f"\n{row['series']} {row['size']} ({row['precision']}; allocs in window: real {row['real_allocs']}, "
                   f"capture {row['capture_allocs']}):")
        div = row["divergences"]
        out.append(f"  {div['blocks']} non-matching blocks; largest by op: " + "; ".join(
            f"{side} {op}: {n} x, {nbytes:,} B" for side, op, n, nbytes in div["by_op"][:6]))
        for d in div["first"]:
            out.append(f"  {d['kind']} at real alloc #{d['real_position']} / capture #{d['capture_position']}: "
                       f"real {d['real_count']} x {d['real_sizes']} ({d['real_bytes']:,} B) {d['real_ops']}; "
                       f"capture {d['capture_count']} x {d['capture_sizes']} ({d['capture_bytes']:,} B) "
                       f"{d['capture_ops']}")
    return "\n".join(out)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of rows compared and on target."""
    compared = [r for r in rows if r.get("status") == "ok"]
    return {"rows": len(rows), "compared": len(compared), "on_target": sum(bool(on_target(r)) for r in compared),
            "max_abs_allocated_error": max((abs(r["error"]["allocated"]) for r in compared), default=None),
            "max_abs_reserved_error": max((abs(r["error"]["reserved"]) for r in compared), default=None)}
