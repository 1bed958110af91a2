"""``allocsim scale`` on synthetic Kineto traces whose size laws are known exactly.

A small "training step" program is written as a Kineto Chrome trace (``[memory]`` events inside
``cpu_op`` events, ``ProfilerStep#N`` markers) at any scale value v; its tensors grow as constants,
linear and quadratic laws of v. The prediction at v=8 from smaller values must equal the program
run at v=8 byte for byte, and the report must count what aligned and what was assumed.
"""

from __future__ import annotations

import gzip
import json
from fractions import Fraction

import numpy as np
import pytest

from allocsim.scale import load_input, prepare_input, scale_inputs
from allocsim.scale.align import align
from allocsim.scale.consistency import MixedInputs
from allocsim.scale.sites import MAX_OP_DEPTH, allocation_sites, innermost
from allocsim.scale.steps import find_steps
from allocsim.trace import EventKind, read_trace

LAYERS = 3


def step_ops(v: int, appear_from: int | None = None, appear_top: bool = False,
             appear_op: str = "aten::empty") -> list[tuple[str, list]]:
    """(outer op, [(inner op, size_bytes, lifetime), ...]) of one step at scale v.

    From ``appear_from`` on, each layer gets a workspace (``appear_op``, 4096 v bytes): inside its
    ``aten::linear``, or with ``appear_top`` in a new ``aten::linear`` call at the end of the layer.
    """
    grows = appear_from is not None and v >= appear_from
    ops = [("aten::embedding", [("aten::empty", 512 * v, "saved")])]
    for _ in range(LAYERS):
        linear = [("aten::addmm", 96 + 3072 * v, "saved")]
        if grows and not appear_top:
            linear.append(("aten::empty", 4096 * v, "temp"))                   # a workspace that appears
        ops += [("aten::linear", linear),
                ("aten::matmul", [("aten::bmm", 48 * v * v, "saved")]),         # attention-like: v^2
                ("aten::softmax", [("aten::_softmax", 40 * v * v + 8 * v, "temp")]),
                ("aten::add", [("aten::add", 64, "temp")])]                     # constant
        if grows and appear_top:
            ops.append(("aten::linear", [(appear_op, 4096 * v, "temp")]))      # a new top-level op
    ops.append(("aten::mse_loss", [("aten::sum", 4, "temp")]))
    return ops


def program_events(v: int, steps: int = 2, *, ops: bool = True, markers: bool = True,
                   appear_from: int | None = None, appear_top: bool = False,
                   appear_op: str = "aten::empty", work_us_per_v: int = 10) -> list[dict]:
    """Kineto trace events of ``steps`` training steps at scale v, in time order.

    Each step spends ``work_us_per_v * v`` microseconds between its forward allocations and its frees.
    """
    events: list[dict] = []
    t = 1000
    addr = 1 << 20

    def mem(ts: int, a: int, nbytes: int) -> None:
        events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                       "ts": ts, "args": {"Addr": a, "Bytes": nbytes, "Device Type": 0, "Device Id": -1}})

    for step in range(steps):
        step_start = t
        saved: list[tuple[int, int]] = []
        for outer, inners in step_ops(v, appear_from, appear_top, appear_op):
            op_start = t
            for inner, size, lifetime in inners:
                inner_start = t
                t += 1
                a = addr
                addr += 64 * ((size + 63) // 64 + 1)
                mem(t, a, size)
                t += 1
                if lifetime == "temp":
                    mem(t, a, -size)
                    t += 1
                else:
                    saved.append((a, size))
                if ops:
                    events.append({"ph": "X", "cat": "cpu_op", "name": inner, "pid": 1, "tid": 1,
                                   "ts": inner_start, "dur": t - inner_start})
                t += 1
            if ops:
                events.append({"ph": "X", "cat": "cpu_op", "name": outer, "pid": 1, "tid": 1,
                               "ts": op_start, "dur": t - op_start})
            t += 1
        t += work_us_per_v * v   # steps take longer at larger scales
        for a, size in reversed(saved):
            mem(t, a, -size)
            t += 1
        if markers:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 1}", "pid": 1,
                           "tid": 1, "ts": step_start, "dur": t - step_start})
        t += 10
    return events


def write_kineto(path, events: list[dict]) -> str:
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": sorted(events, key=lambda e: e["ts"])}, fh)
    return str(path)


def cut_window(events: list[dict], first_ts: int, end_ts: int | None = None) -> list[dict]:
    """The events a ring buffer would hold between two times: spans that started earlier are lost."""
    return [e for e in events if e["ts"] >= first_ts and (end_ts is None or e["ts"] < end_ts)]


def kinds_and_sizes(trace) -> list[tuple[int, int]]:
    ev = trace.events
    return list(zip(ev["kind"].tolist(), ev["size_bytes"].tolist()))


@pytest.fixture
def series(tmp_path):
    def make(values, **kwargs):
        return [load_input(write_kineto(tmp_path / f"p{v}.json.gz", program_events(v, **kwargs)), Fraction(v))
                for v in values]
    return make


def test_prediction_is_byte_for_byte_the_program_at_the_target(series, tmp_path):
    inputs = series([1, 2, 3, 4])
    result = scale_inputs(inputs, Fraction(8), "seq")
    truth = read_trace(write_kineto(tmp_path / "p8.json.gz", program_events(8)))
    assert kinds_and_sizes(result.trace) == kinds_and_sizes(truth)
    report = result.report
    assert report.keyer == "operator"
    assert (report.aligned_all, report.aligned_some, report.unaligned) == (report.allocations, 0, 0)
    per_step = 1 + 4 * LAYERS + 1
    assert report.allocations == 2 * per_step
    # Monomials first: bmm is c*v^2, the embedding c*v; softmax (40 v^2 + 8 v) and addmm (96 + 3072 v)
    # follow no monomial and get the polynomial through their points.
    assert report.laws["quadratic-only"] == 2 * LAYERS          # bmm, every layer, both steps
    assert report.laws["quadratic"] == 2 * LAYERS               # softmax
    assert report.laws["proportional"] == 2                      # embedding
    assert report.laws["linear"] == 2 * LAYERS                  # addmm
    assert report.laws["constant"] == 2 * (LAYERS + 1)
    assert report.no_monomial == 2 * 2 * LAYERS and report.shrinking == 0
    # Three or more points determine every law: the range is the point.
    rng = report.prediction_range
    assert rng["determined"] and rng["peak_live_bytes"]["low"] == rng["peak_live_bytes"]["high"]
    assert report.rounded == report.clamped == 0
    assert result.trace.meta.format == "allocsim-scale"


def test_times_keep_their_order_and_stretch_with_the_step_duration(series):
    inputs = series([1, 2, 3, 4])
    result = scale_inputs(inputs, Fraction(8), "seq")
    t = result.trace.events["t_ns"].to_numpy()
    ref = inputs[-1].trace.events["t_ns"].to_numpy()
    assert np.all(np.diff(t) >= 0)
    assert t[0] == ref[0]
    # Steps last 69 + 10 v microseconds: the line through them gives 149/109 at 8 from the reference at 4.
    assert result.report.time_ratio == float(Fraction(149, 109))
    assert t[-1] - t[0] == int((ref[-1] - ref[0]) * result.report.time_ratio)


def test_inputs_whose_steps_last_the_same_keep_their_times_exactly(tmp_path):
    """Equal step durations fit a flat line: the ratio is exactly 1 and the reference's times are kept."""
    inputs = [load_input(write_kineto(tmp_path / f"f{v}.json.gz", program_events(v, work_us_per_v=0)), Fraction(v))
              for v in (1, 2, 3, 4)]
    result = scale_inputs(inputs, Fraction(8), "seq")
    assert {item.step_duration_ns() for item in inputs} == {Fraction(69_000)}
    assert result.report.time_ratio == 1.0
    assert result.trace.events["t_ns"].tolist() == inputs[-1].trace.events["t_ns"].tolist()


def test_two_inputs_state_their_assumptions(series, tmp_path):
    inputs = series([2, 4])
    as_seq = scale_inputs(inputs, Fraction(8), "seq")
    # bmm (48 v^2) is a monomial, determined by two points; softmax (40 v^2 + 8 v) and addmm (96 + 3072 v)
    # follow none, and two points cannot tell a + b v from a + c v^2: c assumed 0, both in the range.
    assert as_seq.report.laws["quadratic-only"] == 2 * LAYERS
    assert as_seq.report.assumed == {"b": 0, "c": 2 * LAYERS + 2 * LAYERS}
    truth = read_trace(write_kineto(tmp_path / "p8.json.gz", program_events(8)))
    from allocsim.scale.evaluate import peaks
    true_live = peaks(truth)["peak_live_bytes"]
    rng = as_seq.report.prediction_range
    assert not rng["determined"] and as_seq.report.undetermined == 2 * 2 * LAYERS
    assert rng["peak_live_bytes"]["low"] < true_live <= rng["peak_live_bytes"]["high"]
    text = as_seq.report.format_text()
    assert "assumed zero" in text and "two points cannot determine" in text
    assert "record a third input" in text.split("check:", 1)[1].split("limits:", 1)[0]
    # 8 is twice the largest input, what the leave-one-out check covers; 16 is further than that.
    assert "seq 8 is 2x the largest input (4)" in text and "covers 2x" not in text
    far = scale_inputs(inputs, Fraction(16), "seq").report
    assert far.extrapolation == 4 and "record an input nearer the target" in " ".join(far.checks)
    truth = read_trace(write_kineto(tmp_path / "p8.json.gz", program_events(8)))
    predicted = dict(zip(range(len(truth.events)), as_seq.trace.events["size_bytes"].tolist()))
    wrong = [i for i, (k, s) in enumerate(kinds_and_sizes(truth)) if predicted[i] != s]
    assert wrong and all(truth.events["size_bytes"][i] in {40 * 64 + 64} for i in wrong)


@pytest.mark.full
def test_allocations_that_appear_with_scale_are_counted_and_carried(series):
    inputs = series([1, 2, 3, 4], appear_from=3)
    result = scale_inputs(inputs, Fraction(8), "batch")
    report = result.report
    extra = 2 * LAYERS                                   # one workspace per layer, two steps
    assert report.aligned_some == extra                  # seen at 3 and 4, not at 1 and 2
    assert report.aligned_all == report.allocations - extra
    assert report.bytes_aligned_some == extra * 4096 * 4
    assert report.unaligned == 0
    # The workspace itself scales linearly from its two points (4096 v): 4096 * 8 at the target.
    ws = result.trace.events.query("kind == 1 and size_bytes == 32768")
    assert len(ws) == extra
    # Seen from the smaller side, the appearing allocation exists only at the reference: not aligned.
    lower = scale_inputs([inputs[2], inputs[0]], Fraction(3), "batch").report
    assert lower.unaligned == extra and lower.bytes_unaligned == extra * 4096 * 3


def test_a_new_op_call_at_a_new_site_moves_nothing_else(series, tmp_path):
    inputs = series([1, 2, 3, 4], appear_from=3, appear_top=True)
    result = scale_inputs(inputs, Fraction(8), "batch")
    report = result.report
    extra = 2 * LAYERS
    # The new aten::linear > aten::empty site exists at 3 and 4 only; every other allocation keeps
    # its site and its ordinal there, so it aligns in every input.
    assert report.aligned_some == extra
    assert report.aligned_all == report.allocations - extra and report.unaligned == 0
    truth = read_trace(write_kineto(tmp_path / "t8.json.gz", program_events(8, appear_from=3, appear_top=True)))
    assert kinds_and_sizes(result.trace) == kinds_and_sizes(truth)


def test_an_extra_allocation_at_a_known_site_shifts_only_that_sites_later_allocations(series):
    inputs = series([1, 2, 3, 4], appear_from=3, appear_top=True, appear_op="aten::addmm")
    reference = inputs[-1]
    result = scale_inputs(inputs, Fraction(8), "batch")
    report = result.report
    # Per step the addmm site allocates n0 x0 n1 x1 n2 x2 from batch 3 on and n0 n1 n2 before: by
    # ordinal, x0 meets n1 and n1 meets n2 in the smaller inputs, and the last three of the site
    # are found at 3 only. Allocations of every other site align in every input.
    per_step_shifted = LAYERS
    assert report.aligned_some == 2 * per_step_shifted and report.unaligned == 0
    alignment = align(reference, [item for item in inputs if item is not reference])
    addmm = np.array(["aten::addmm" in site for site in reference.key_source.sites])
    found_everywhere = alignment.matched_counts() == len(inputs) - 1
    assert found_everywhere[~addmm].all()
    assert int((~found_everywhere[addmm]).sum()) == 2 * per_step_shifted


def test_ring_buffer_windows_align_by_step_not_by_file(tmp_path):
    # Each input is a different window of a 3-step run: the reference starts mid-step.
    def window(v, start_step_fraction, steps=3):
        events = program_events(v, steps=steps)
        times = sorted(e["ts"] for e in events if e["name"] == "[memory]")
        cut = times[int(len(times) * start_step_fraction)]
        op_starts = sorted(e["ts"] for e in events if e.get("cat") == "cpu_op" and e["ts"] >= cut)
        return cut_window(events, op_starts[0])       # cut where an op starts

    inputs = []
    for v, frac in ((2, 0.0), (3, 0.45), (4, 0.2)):
        inputs.append(load_input(write_kineto(tmp_path / f"w{v}.json.gz", window(v, frac)), Fraction(v)))
    reference = inputs[-1]
    assert reference.steps.steps[0].prologue and len(reference.trace.initial_allocs) > 0
    result = scale_inputs(inputs, Fraction(8), "seq")
    report = result.report
    assert report.unaligned == 0 and report.aligned_all == report.allocations
    truth = read_trace(write_kineto(tmp_path / "w8.json.gz", window(8, 0.2)))
    in_window = ~truth.events["alloc_id"].isin(truth.initial_allocs["alloc_id"]).to_numpy()
    assert in_window.sum() > 0.8 * len(in_window)
    got, want = kinds_and_sizes(result.trace), kinds_and_sizes(truth)
    assert [g for g, keep in zip(got, in_window) if keep] == [w for w, keep in zip(want, in_window) if keep]
    # Start-of-window allocations (freed in the window) pair by size class, never by position: those
    # whose class every window holds get their law (and the size the program has at 8); the rest keep
    # the reference size, as the report says.
    predicted = result.trace.initial_allocs["size_bytes"].tolist()
    kept = reference.trace.initial_allocs["size_bytes"].tolist()
    true_sizes = truth.initial_allocs["size_bytes"].tolist()
    grown = [k for k, (p, r) in enumerate(zip(predicted, kept)) if p != r]
    assert 0 < report.initial["aligned"] < len(kept) and len(grown) <= report.initial["aligned"]
    assert all(predicted[k] == true_sizes[k] for k in grown)
    same_cut = [load_input(write_kineto(tmp_path / f"s{v}.json.gz", window(v, 0.2)), Fraction(v)) for v in (2, 3, 4)]
    exact = scale_inputs(same_cut, Fraction(8), "seq")
    assert exact.report.initial["aligned"] == len(truth.initial_allocs) > 0
    assert kinds_and_sizes(exact.trace) == kinds_and_sizes(truth)
    assert exact.trace.initial_allocs["size_bytes"].tolist() == truth.initial_allocs["size_bytes"].tolist()


def test_markerless_traces_split_at_live_troughs_and_align_by_position(tmp_path):
    inputs = [load_input(write_kineto(tmp_path / f"m{v}.json", program_events(v, steps=3, ops=False, markers=False)),
                         Fraction(v)) for v in (1, 2, 3)]
    assert inputs[0].steps.source == "troughs"
    assert len(inputs[0].steps.body) == 2                   # boundaries before steps 2 and 3
    result = scale_inputs(inputs, Fraction(6), "seq")
    assert result.report.keyer == "position"
    assert result.report.unaligned == 0
    truth = read_trace(write_kineto(tmp_path / "m6.json", program_events(6, steps=3, ops=False, markers=False)))
    assert kinds_and_sizes(result.trace) == kinds_and_sizes(truth)


def test_position_keys_refuse_steps_of_different_length(tmp_path):
    a = load_input(write_kineto(tmp_path / "a.json", program_events(2, ops=False)), Fraction(2))
    b = load_input(write_kineto(tmp_path / "b.json", program_events(4, ops=False, appear_from=4)), Fraction(4))
    alignment = align(b, [a])
    assert alignment.keyer == "position"
    assert (alignment.partner == -1).all()
    # Nothing aligned is not one program: refused, unless allowed (then every size is kept, and said so).
    with pytest.raises(MixedInputs, match="only 0.0% of the allocations of b.json are found in a.json"):
        scale_inputs([a, b], Fraction(8), "batch")
    report = scale_inputs([a, b], Fraction(8), "batch", allow_mixed=True).report
    assert report.unaligned == report.allocations and not report.consistent


def test_steps_come_from_markers_with_a_prologue_for_events_before_the_first(tmp_path):
    events = program_events(2, steps=2)
    trace = read_trace(write_kineto(tmp_path / "t.json.gz", events))
    steps = find_steps(trace)
    assert steps.source == "markers"
    assert [s.label for s in steps.steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert steps.steps[-1].end == len(trace.events)


def test_operator_sites_come_from_the_readers_pseudo_frames_without_step_frames(tmp_path):
    trace = read_trace(write_kineto(tmp_path / "p2.json.gz", program_events(2)))
    origin, sites = allocation_sites(trace)
    assert origin == "operators" and len(sites) == int((trace.events["kind"] == EventKind.ALLOC).sum())
    # Innermost first; the ProfilerStep#N annotation around everything is not part of any site.
    assert sites[0].split("\n") == ["aten::empty", "aten::embedding"]
    assert not any("ProfilerStep" in site for site in sites)
    # Both steps name their allocations alike: the step number is not in the site.
    first = load_input(str(tmp_path / "p2.json.gz"), Fraction(2))
    step_sites = [[sites[k] for k in first.step_allocs(i)] for i in range(len(first.steps.steps))]
    assert len(step_sites) == 2 and step_sites[0] == step_sites[1]


def test_a_trace_whose_only_frames_are_step_markers_has_no_sites(tmp_path):
    trace = read_trace(write_kineto(tmp_path / "m.json.gz", program_events(2, ops=False)))
    assert (trace.events["stack_id"] >= 0).any()          # the ProfilerStep#N pseudo-frame
    assert allocation_sites(trace) == ("none", None)


@pytest.mark.parametrize("ops, keyer", [(True, "operator"), (False, "position")])
def test_inputs_in_memory_work_without_files(tmp_path, ops, keyer):
    traces = [read_trace(write_kineto(tmp_path / f"p{v}.json.gz", program_events(v, ops=ops))) for v in (1, 2, 3)]
    inputs = [prepare_input(t, Fraction(v)) for t, v in zip(traces, (1, 2, 3))]
    result = scale_inputs(inputs, Fraction(5), "seq")
    truth = read_trace(write_kineto(tmp_path / "p5.json.gz", program_events(5, ops=ops)))
    assert kinds_and_sizes(result.trace) == kinds_and_sizes(truth)
    assert result.report.keyer == keyer


def test_alloc_and_free_sizes_stay_paired(series):
    result = scale_inputs(series([1, 2, 4]), Fraction(8), "seq")
    ev = result.trace.events
    alloc = ev[ev["kind"] == EventKind.ALLOC].set_index("alloc_id")["size_bytes"]
    for kind in (EventKind.FREE_REQUESTED, EventKind.FREE_COMPLETED):
        frees = ev[ev["kind"] == kind].set_index("alloc_id")["size_bytes"]
        assert (alloc.loc[frees.index] == frees).all()


def test_only_step_markers_are_step_boundaries(tmp_path):
    events = program_events(2, steps=3, ops=False, markers=False)
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
                   "ts": events[0]["ts"], "dur": 1})
    trace = read_trace(write_kineto(tmp_path / "one.json", events))
    assert find_steps(trace).source == "markers"
    from allocsim.trace.reading.builder import TraceBuilder

    b = TraceBuilder("x", "test")
    b.marker(0, 0, "snapshot")
    for i in range(3):
        b.alloc(i, 10 * i + 1, 0, 0, 64, 1000)
        b.free(i, 10 * i + 5, 0, 0, 64)
    steps = find_steps(b.finish())
    assert steps.source == "troughs" and len(steps.body) == 3


def test_hostile_op_nesting_costs_a_bounded_site(tmp_path):
    depth = 5 * MAX_OP_DEPTH
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 10_000 - 2 * i}
              for i in range(depth)]
    events += [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5000, "args": {"Addr": 64, "Bytes": 8}},
               {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5001, "args": {"Addr": 64, "Bytes": -8}}]
    _, sites = allocation_sites(read_trace(write_kineto(tmp_path / "deep.json", events)))
    frames = sites[0].split("\n")
    assert len(frames) == MAX_OP_DEPTH
    assert innermost(sites[0]) == f"op{depth - 1}"          # the innermost ops are kept
