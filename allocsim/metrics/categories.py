"""Name every live byte by what it is: ``categorize(trace)`` gives each allocation one memory category.

The categories are PyTorch's memory-profiler vocabulary (``torch.profiler._memory_profiler.Category``):
parameter, gradient, optimizer state, activation, temporary, autograd detail, workspace, unknown; and
``preallocated``: what an inference engine holds from before the window beside its weights (a KV cache);
``communication``: a collective's buffers (DDP's gradient buckets, FSDP's all-gather and
reduce-scatter buffers, a pipeline stage's receive buffers), named by ``allocsim capture`` only.
They are inferred once per trace from what it holds: the stack (or Kineto's enclosing operators) of
each allocation, its lifetime relative to the step, and the state before the window began. The
rules below are tried in order, the first that matches wins, and each counts the allocations it
decided (``Categories.rules``), so a user can see on what evidence a byte was named:

0. whatever ``allocsim capture`` named it: a capture knows each parameter, gradient, optimizer
   state and workspace it recorded, and the phase the rest was made in; it writes the category as
   the outermost frame of the allocation's stack (``category: parameter`` in ``allocsim-capture``).
1. ``workspace``: a frame names a library workspace (cuBLAS / cuDNN workspace or handle).
2. ``optimizer state`` / ``temporary``: made inside an optimizer step (a ``step`` frame in a file
   whose path names ``optim``, Kineto's ``Optimizer.step#...``, Adam's ``_single_tensor_`` /
   ``_multi_tensor_`` / fused kernels): kept past the window's end (state), else freed (temporary).
3. ``gradient``: made by ``AccumulateGrad``, or by the autograd engine (``torch::autograd::Engine``,
   ``autograd::engine::evaluate_function``) and still alive when its step's backward pass ended.
4. ``temporary`` / ``autograd detail``: the autograd engine's other allocations: freed within the
   operator that made them (temporary), else intermediate gradients freed during backward.
5. ``parameter``: made while a module was built or moved (``torch/nn/modules``' ``__init__``,
   ``_apply``, ``to``, ``cuda``; ``reset_parameters``; ``torch/nn/parameter.py``).
6. ``preallocated``: alive before the window began and through all of it, without frames, in an
   inference window (no backward pass, no optimizer step) whose frames name a KV cache (vLLM's
   ``_initialize_kv_caches``, ``reshape_and_cache``, a ``kv_cache`` op): an inference engine that
   preallocates its KV cache holds it there beside the weights, and the trace cannot tell them apart.
7. ``parameter``: alive before the window began and through all of it, without frames, when the
   window itself creates the optimizer state or runs no optimizer step (so the state held before
   the window cannot be optimizer state); else ``unknown`` (weights and optimizer state would look
   alike).
8. ``gradient`` (traces with step markers): made in the step and freed after its last allocation,
   in the run of frees that ends it (``zero_grad(set_to_none=True)`` after ``optimizer.step()``);
   on the CPU captures of ``traces/`` this finds the model's parameter bytes plus a few scalars.
   Only in traces that show a backward pass or no operator at all (inference frees its outputs
   and caches at the end of a step too).
9. ``temporary``: freed within the operator that made it: before any allocation by another code
   site (no frames: before the next allocation at all).
10. ``activation``: made before its step's peak of live bytes and freed after it, or made with
   program frames outside backward and optimizer (forward outputs that live on).
11. ``unknown``: everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..trace.schema import EventKind, Trace
from .sites.rule import SiteFilter, SiteIndex
from .sites.rows import group_sums

#: Category names, in the order they are listed; codes are indices into this tuple.
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "temporary", "autograd_detail",
              "workspace", "unknown", "preallocated", "communication")
(PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, AUTOGRAD_DETAIL, WORKSPACE, UNKNOWN,
 PREALLOCATED, COMMUNICATION) = range(10)
#: What a user reads for each category.
LABELS = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state",
          "activation": "activations", "temporary": "temporaries", "autograd_detail": "autograd detail",
          "workspace": "workspace", "unknown": "unknown",
          "preallocated": "preallocated before the window", "communication": "communication buffers"}

_WORKSPACE = re.compile(r"(?i)workspace|getCurrentCUDABlasHandle|cublasLt.*Handle|cudnnCreate")
_OPTIMIZER = re.compile(r"Optimizer\.step#|optimizer\.step|_single_tensor_(adam|sgd|rmsprop|adagrad)|"
                        r"_multi_tensor_(adam|sgd|rmsprop|adagrad)|_fused_adam|fused_adamw?\b")
_ACCUMULATE = re.compile(r"AccumulateGrad")
#: A frame that names a KV cache: an inference engine that preallocates one (vLLM's ``_initialize_kv_caches``).
_KV_CACHE = re.compile(r"(?i)kv_?cache|reshape_and_cache|paged_?attention")
_ENGINE = re.compile(r"torch::autograd::Engine::|autograd::engine::evaluate_function|Backward\d*\b")
_STEP = re.compile(r"^(\[op\] )?ProfilerStep#\d+$")
#: The frame a capture names an allocation's category with (``allocsim.torch_capture.session``).
CAPTURE_FILE = "allocsim-capture"   # not a .py or <...> file: never taken for a code site
CAPTURE_PREFIX = "category: "
_BUILD_FILES = ("torch/nn/modules/", "torch/nn/parameter.py")
_BUILD_NAMES = frozenset({"__init__", "_apply", "to", "cuda", "reset_parameters", "__new__"})


@dataclass
class Categories:
    """The category of every allocation of a trace (start state included) and the evidence per rule."""

    alloc_ids: np.ndarray            #: sorted
    codes: np.ndarray                #: index into ``CATEGORIES`` per ``alloc_ids`` entry
    rules: list[dict[str, Any]] = field(default_factory=list)

    def of(self, alloc_ids: np.ndarray) -> np.ndarray:
        """The category code of each of ``alloc_ids`` (``UNKNOWN`` for ids this trace never made)."""
        want = np.asarray(alloc_ids, dtype=np.int64)
        if not len(self.alloc_ids):
            return np.full(len(want), UNKNOWN, dtype=np.int8)
        pos = np.minimum(np.searchsorted(self.alloc_ids, want), len(self.alloc_ids) - 1)
        return np.where(self.alloc_ids[pos] == want, self.codes[pos], UNKNOWN).astype(np.int8)

    def split(self, alloc_ids: np.ndarray, size_bytes: np.ndarray) -> dict[str, int]:
        """Bytes per category of the allocations given; the values add up exactly to ``sum(size_bytes)``."""
        sums = group_sums(self.of(alloc_ids), np.asarray(size_bytes, dtype=np.int64), len(CATEGORIES))
        return dict(zip(CATEGORIES, sums))


def split_check(split: dict[str, int], total_bytes: int, where: str) -> dict[str, int]:
    """Return ``split`` after checking it adds up to ``total_bytes`` (an ``AssertionError`` names ``where``)."""
    if sum(split.values()) != total_bytes:
        raise AssertionError(f"categories at {where} add up to {sum(split.values())} bytes, not {total_bytes}")
    return split


# ----------------------------------------------------------------------------- per stack
def _per_value(test: Any, values: list) -> np.ndarray:
    """``test`` of each value, run once per distinct value: frames share their strings (one file name
    for thousands of frames), and a file's strings may be long, so the work follows the distinct text."""
    seen: dict[Any, bool] = {}
    out = np.zeros(len(values), dtype=bool)
    for i, value in enumerate(values):
        hit = seen.get(value)
        if hit is None:
            hit = seen[value] = bool(test(value))
        out[i] = hit
    return out


def _stack_flags(trace: Trace) -> dict[str, np.ndarray]:
    """Per stack id: which of the rules' frame tests it meets (one pass over the distinct stacks)."""
    st, fr = trace.table("stacks"), trace.table("frames")
    n_stacks = int(st["stack_id"].max()) + 1 if len(st) else 0
    flags = {k: np.zeros(n_stacks, dtype=bool) for k in ("workspace", "optimizer", "accumulate", "engine", "build",
                                                          "kv_cache")}
    flags["capture"] = np.full(n_stacks, -1, dtype=np.int8)
    if not n_stacks:
        return flags
    names = [str(v) for v in fr["name"].tolist()]
    files = [str(v) for v in fr["filename"].tolist()]
    per_frame = {
        "workspace": _per_value(lambda n: bool(_WORKSPACE.search(n)), names),
        "optimizer": _per_value(lambda nf: bool(_OPTIMIZER.search(nf[0])) or (nf[0] == "step" and "optim" in nf[1].lower()),
                                list(zip(names, files))),
        "accumulate": _per_value(lambda n: bool(_ACCUMULATE.search(n)), names),
        "kv_cache": _per_value(lambda n: bool(_KV_CACHE.search(n)), names),
        "engine": _per_value(lambda n: bool(_ENGINE.search(n)), names),
        "build": _per_value(lambda nf: (nf[0] in _BUILD_NAMES and any(b in nf[1].replace("\\", "/") for b in _BUILD_FILES))
                            or nf[1].replace("\\", "/").endswith("torch/nn/parameter.py"), list(zip(names, files))),
    }
    frame_ids = fr["frame_id"]
    pos = np.zeros(int(frame_ids.max()) + 1 if len(frame_ids) else 0, dtype=np.int64)
    pos[frame_ids] = np.arange(len(frame_ids))
    rows = pos[st["frame_id"]]
    sid = st["stack_id"].astype(np.int64)
    for key, hit in per_frame.items():
        flags[key][sid[hit[rows]]] = True
    captured = np.array([CATEGORIES.index(n[len(CAPTURE_PREFIX):]) if f == CAPTURE_FILE and n.startswith(CAPTURE_PREFIX)
                         and n[len(CAPTURE_PREFIX):] in CATEGORIES else -1 for n, f in zip(names, files)], dtype=np.int8)
    hit = captured[rows] >= 0
    flags["capture"][sid[hit]] = captured[rows][hit]
    return flags


# ----------------------------------------------------------------------------- per allocation
def categorize(trace: Trace, site_filter: SiteFilter | None = None) -> Categories:
    """Name every allocation of ``trace`` (one device) by the rules of this module, first match wins."""
    ev = trace.table("events")
    kind = ev["kind"]
    ids = ev["alloc_id"].astype(np.int64)
    n_events = len(kind)
    alloc_pos = np.flatnonzero(kind == EventKind.ALLOC)
    init = trace.table("initial_allocs")
    init_ids = init["alloc_id"].astype(np.int64)
    all_ids = np.concatenate([init_ids, ids[alloc_pos]])
    born = np.concatenate([np.full(len(init_ids), -1, dtype=np.int64), alloc_pos.astype(np.int64)])
    stacks = np.concatenate([init["stack_id"], ev["stack_id"][alloc_pos]]).astype(np.int64)
    sizes = np.concatenate([init["size_bytes"], ev["size_bytes"][alloc_pos]]).astype(np.int64)
    n = len(all_ids)
    order = np.argsort(all_ids, kind="stable")
    sorted_ids = all_ids[order]

    def index_of(event_ids: np.ndarray) -> np.ndarray:
        if not n:
            return np.zeros(0, dtype=np.int64)
        p = np.minimum(np.searchsorted(sorted_ids, event_ids), n - 1)
        return np.where(sorted_ids[p] == event_ids, order[p], -1)

    # The end of each lifetime: the program's free (requested; completed when no request was recorded).
    died = np.full(n, n_events, dtype=np.int64)           # n_events: alive at the end of the window
    for k in (EventKind.FREE_COMPLETED, EventKind.FREE_REQUESTED):   # requested wins: written last
        where = np.flatnonzero(kind == k)
        owner = index_of(ids[where])
        ok = owner >= 0
        died[owner[ok]] = where[ok]
    freed = died < n_events

    # Steps: markers split the window; without markers it is one step.
    marker_pos = np.flatnonzero(kind == EventKind.MARKER)
    step_of_event = np.searchsorted(marker_pos, np.arange(n_events), side="right")
    n_steps = len(marker_pos) + 1
    step_born = np.where(born >= 0, step_of_event[np.maximum(born, 0)] if n_events else 0, -1)

    flags = _stack_flags(trace)
    n_stacks = len(flags["engine"])

    def flag(key: str) -> np.ndarray:
        ok = (stacks >= 0) & (stacks < n_stacks)
        out = np.zeros(n, dtype=bool)
        out[ok] = flags[key][stacks[ok]]
        return out

    workspace, optimizer, accumulate, engine, build = (flag(k) for k in
                                                       ("workspace", "optimizer", "accumulate", "engine", "build"))
    captured = np.full(n, -1, dtype=np.int8)
    known = (stacks >= 0) & (stacks < n_stacks)
    captured[known] = flags["capture"][stacks[known]]
    index = SiteIndex(trace, site_filter or SiteFilter())
    site = index.site_of(stacks)
    # A Kineto step label alone ("ProfilerStep#3") says nothing about the code.
    label_only = np.array([bool(_STEP.match(name)) for name in index.names], dtype=bool)
    has_frames = (site >= 0) & ~label_only[np.maximum(site, 0)] if len(index.names) else site >= 0
    site = np.where(has_frames, site, -1)

    # The end of each step's backward pass: its last allocation by the autograd engine.
    backward_end = np.full(n_steps, -1, dtype=np.int64)
    in_window = born >= 0
    if np.any(engine & in_window):
        np.maximum.at(backward_end, step_born[engine & in_window], born[engine & in_window])

    # Within the operator: freed before the next allocation by another site (no frames: any allocation).
    temporary = np.zeros(n, dtype=bool)
    win = np.flatnonzero(in_window)
    if len(win):
        w_born = born[win]
        w_order = np.argsort(w_born, kind="stable")
        w = win[w_order]
        key = np.where(site[w] >= 0, site[w], -2 - np.arange(len(w)))   # no frames: each its own site
        change = np.flatnonzero(np.diff(key) != 0) + 1
        run_start = np.concatenate([[0], change])
        run_next = np.concatenate([change, [len(w)]])
        run_of = np.repeat(np.arange(len(run_start)), np.diff(np.append(run_start, len(w))))
        nxt = run_next[run_of]
        next_born = np.where(nxt < len(w), born[w[np.minimum(nxt, len(w) - 1)]], n_events)
        temporary[w] = died[w] < next_born

    # Each step's peak of live bytes (window allocations only): the turn from forward to backward.
    from ..trace.inference.stats import live_bytes_series

    step_peak = np.full(n_steps, -1, dtype=np.int64)
    if n_events:
        window_live, _ = live_bytes_series(trace)
        for s in range(n_steps):
            lo = marker_pos[s - 1] if s > 0 else 0
            hi = marker_pos[s] if s < len(marker_pos) else n_events
            if hi > lo:
                step_peak[s] = lo + int(np.argmax(window_live[lo:hi]))
    peak_of = np.where(step_born >= 0, step_peak[np.maximum(step_born, 0)], -1)

    # Step-ending runs of frees (zero_grad): freed after the step's last allocation, inside the step.
    ends_step = np.zeros(n, dtype=bool)
    if len(marker_pos) and len(alloc_pos):
        last_alloc = np.full(n_steps, -1, dtype=np.int64)
        np.maximum.at(last_alloc, step_of_event[alloc_pos], alloc_pos)
        step_end = np.append(marker_pos, n_events)
        s = np.maximum(step_born, 0)
        ends_step = in_window & freed & (died > last_alloc[s]) & (died < step_end[s])

    optimizer_made_state = bool(np.any(optimizer & in_window & ~freed))
    runs_optimizer = bool(np.any(optimizer))
    # An inference window of an engine with a KV cache: what it holds from before is not only weights.
    kv_cache_inference = (n_events > 0 and bool(np.any(flags["kv_cache"])) and not runs_optimizer
                          and not bool(np.any(flags["engine"])))

    codes = np.full(n, -1, dtype=np.int8)
    rules: list[dict[str, Any]] = []

    def apply(rule: str, mask: np.ndarray, code: int) -> None:
        hit = mask & (codes < 0)
        codes[hit] = code
        rules.append({"rule": rule, "category": CATEGORIES[code], "allocations": int(np.count_nonzero(hit)),
                      "bytes": group_sums(np.zeros(int(np.count_nonzero(hit)), dtype=np.int64), sizes[hit], 1)[0]})

    bw_end = np.where(step_born >= 0, backward_end[np.maximum(step_born, 0)], -1)
    for code, name in enumerate(CATEGORIES):
        apply(f"named by allocsim capture ({LABELS[name]})", captured == code, code)
    apply("a frame names a library workspace", workspace, WORKSPACE)
    apply("made in an optimizer step, kept past the window", optimizer & ~freed, OPTIMIZER_STATE)
    apply("made in an optimizer step, freed in the window", optimizer & freed, TEMPORARY)
    apply("made by AccumulateGrad", accumulate, GRADIENT)
    apply("made in backward, alive when the step's backward ended", engine & (died > bw_end), GRADIENT)
    apply("made in backward, freed within its operator", engine & temporary, TEMPORARY)
    apply("made in backward, freed during backward", engine, AUTOGRAD_DETAIL)
    apply("made while a module was built or moved", build, PARAMETER)
    start_kept = ~in_window & ~freed & ~has_frames
    if kv_cache_inference:
        apply("alive before and through an inference window whose frames name a KV cache: the weights and the "
              "KV cache preallocated before it, not told apart", start_kept, PREALLOCATED)
    if optimizer_made_state or not runs_optimizer:
        apply("alive before and through the window; the window holds no older optimizer state", start_kept,
              PARAMETER)
    # Only where a backward pass can have run: the trace shows one, or shows no operator at all (a
    # step-only capture). An inference window also frees its outputs and caches at its end.
    if bool(np.any(engine)) or not bool(np.any(has_frames)):
        apply("freed by the run of frees that ends a step (zero_grad)", ends_step, GRADIENT)
    apply("freed within the operator that made it", in_window & temporary, TEMPORARY)
    apply("made before the step's peak of live bytes, freed after it", in_window & (born <= peak_of) & (died > peak_of),
          ACTIVATION)
    apply("made by the program outside backward and optimizer, kept past its operator", in_window & has_frames,
          ACTIVATION)
    apply("no rule matched", np.ones(n, dtype=bool), UNKNOWN)
    return Categories(alloc_ids=sorted_ids, codes=codes[order], rules=[r for r in rules if r["allocations"]])


# ----------------------------------------------------------------------------- text
def format_split(split: dict[str, int], total_bytes: int | None = None) -> str:
    """``parameters 12.69 GiB (25%), gradients ...``: the non-zero categories, largest first."""
    from ..units import format_bytes

    total = sum(split.values()) if total_bytes is None else total_bytes
    parts = []
    for name, value in sorted(split.items(), key=lambda kv: (-kv[1], CATEGORIES.index(kv[0]))):
        if value:
            share = f" ({100 * value / total:.0f}%)" if total else ""
            parts.append(f"{LABELS[name]} {format_bytes(value)}{share}")
    return ", ".join(parts) if parts else "nothing live"


def dominant(split: dict[str, int]) -> str:
    """The category holding the most bytes of ``split`` (ties: the first listed); "unknown" when empty."""
    best = max(CATEGORIES, key=lambda c: (split.get(c, 0), -CATEGORIES.index(c)))
    return best if split.get(best, 0) > 0 else "unknown"


# ----------------------------------------------------------------------------- a run's moments
def run_categories(trace: Trace, result: Any, categories: Categories, *, continue_on_oom: bool = False
                   ) -> dict[str, Any]:
    """The ``categories`` object of a run: bytes per category at its peak of requested memory and first OOM.

    Each split adds up exactly to the run's live requested bytes there (checked), the same live set
    as the code-site tables (``sites.live_at_row``).
    """
    from .sites.rows import live_at_row, oom_row, peak_row

    ts, ooms, summary = result.timeseries, result.ooms, result.summary
    peak = live_at_row(trace, ts, ooms, peak_row(ts), continue_on_oom=continue_on_oom)
    out: dict[str, Any] = {
        "at_peak": split_check(categories.split(peak.alloc_ids, peak.size_bytes), peak.live_bytes, "the peak"),
        "at_oom": None,
        "moments": {"at_peak": {"event_index": peak.event_index, "bytes": peak.live_bytes}, "at_oom": None},
        "rules": categories.rules,
    }
    oom = summary.get("oom")
    if oom is not None:
        live = live_at_row(trace, ts, ooms, oom_row(ts, int(oom["event_index"])), continue_on_oom=continue_on_oom)
        out["at_oom"] = split_check(categories.split(live.alloc_ids, live.size_bytes), live.live_bytes, "the OOM")
        out["moments"]["at_oom"] = {"event_index": int(oom["event_index"]), "bytes": live.live_bytes}
    return out


def label_site_rows(rows: list[dict[str, Any]], index: Any, alloc_ids: np.ndarray, stack_ids: np.ndarray,
                    size_bytes: np.ndarray, categories: Categories) -> None:
    """Give each site row (``sites.rows_by_site`` over these allocations) its ``category``: the one holding
    most of its bytes, and ``categories``: its bytes per category (adding up to the row's bytes)."""
    from .sites.rows import OTHER, UNATTRIBUTED

    site = index.site_of(np.asarray(stack_ids, dtype=np.int64))
    codes = categories.of(alloc_ids)
    shown = {r["site"] for r in rows if r["site"] not in (OTHER, UNATTRIBUTED)}
    names = np.array([UNATTRIBUTED if s < 0 else (index.names[s] if index.names[s] in shown else OTHER)
                      for s in site.tolist()], dtype=object)
    for r in rows:
        mask = names == r["site"]
        split = {k: v for k, v in zip(CATEGORIES, group_sums(codes[mask], np.asarray(size_bytes)[mask],
                                                             len(CATEGORIES))) if v}
        r["category"] = dominant(split)
        r["categories"] = split


def format_run_categories(categories: dict[str, Any]) -> list[str]:
    """Text lines of a run's ``categories`` (before its code sites and verdict)."""
    m = categories["moments"]
    lines = [f"Memory by category at the peak of requested memory: "
             f"{format_split(categories['at_peak'], m['at_peak']['bytes'])}"]
    if categories.get("at_oom") is not None:
        lines.append(f"Memory by category at the first out-of-memory: "
                     f"{format_split(categories['at_oom'], m['at_oom']['bytes'])}")
    return lines


def trace_categories(trace: Trace, site_filter: SiteFilter | None = None) -> dict[str, Any]:
    """Bytes per category at the trace's own peak of live bytes (``info``), with the rules' evidence."""
    from .sites.rows import live_at_peak

    categories = categorize(trace, site_filter)
    peak = live_at_peak(trace, granted_only=True)     # the peak info reports: what the real run held
    return {"at_peak": split_check(categories.split(peak.alloc_ids, peak.size_bytes), peak.live_bytes, "the peak"),
            "moments": {"at_peak": {"event_index": peak.event_index, "bytes": peak.live_bytes}},
            "rules": categories.rules}


def format_rules(rules: list[dict[str, Any]], indent: str = "    ") -> list[str]:
    """One line per rule that decided anything: allocations, bytes, category, the rule."""
    from ..units import format_bytes

    width = max([16, *(len(LABELS[r["category"]]) for r in rules)])
    return [f"{indent}{r['allocations']:>7,} {format_bytes(r['bytes']):>12}  {LABELS[r['category']]:<{width}} {r['rule']}"
            for r in rules]


def category_timeline(trace: Trace, categories: Categories, columns: int = 2000) -> dict[str, Any]:
    """Live bytes per category over the trace, thinned by the per-pixel rule (``metrics.decimate``).

    ``x``: the first event of each bucket; ``event_index``: the bucket's event of largest live total;
    ``bytes``: per category, the live bytes there (they add up to that total, so the drawn stack
    reaches every bucket's peak). An allocation counts from its ALLOC event until its free completes.
    """
    from .decimate import bucket_starts, max_rows

    kind = trace.column("kind")
    ids = trace.column("alloc_id").astype(np.int64)
    sizes = trace.column("size_bytes").astype(np.int64)
    init = trace.table("initial_allocs")
    alloc = kind == EventKind.ALLOC
    done = kind == EventKind.FREE_COMPLETED
    code = np.full(len(kind), -1, dtype=np.int64)
    code[alloc] = categories.of(ids[alloc])
    known = np.isin(ids[done], categories.alloc_ids)
    freed = np.flatnonzero(done)[known]
    code[freed] = categories.of(ids[freed])
    delta = np.where(alloc, sizes, 0) - np.where(done & (code >= 0), sizes, 0)
    baseline = group_sums(categories.of(init["alloc_id"]), init["size_bytes"], len(CATEGORIES))
    total = np.cumsum(np.where(code >= 0, delta, 0)) + sum(baseline)
    if not len(total):
        return {"x": [], "event_index": [], "bytes": {c: [] for c in CATEGORIES}}
    starts = bucket_starts(np.arange(len(total)), columns)
    picks = max_rows(total, starts)
    out = {"x": starts.tolist(), "event_index": picks.tolist(), "bytes": {}}
    for k, name in enumerate(CATEGORIES):
        out["bytes"][name] = (np.cumsum(np.where(code == k, delta, 0))[picks] + baseline[k]).tolist()
    return out
