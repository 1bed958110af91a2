"""``allocsim scale`` with code-site keys: snapshots whose allocations carry real stack frames.

A small training program is written as a PyTorch snapshot (``tests/recorder.py``) at any scale v:
each allocation has the Python stack of the line that made it, sizes follow known laws of v, and a
per-run object address appears in one frame (``<built-in method ... at 0x...>``), as in real
stacks. Windows cut from the front of the trace stand for ring buffers that began at different
points of a step. The real snapshots of ``../shared`` are cut the same way.
"""

from __future__ import annotations

import importlib
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from allocsim.scale import load_input, scale_inputs
from allocsim.scale.evaluate import peaks
from allocsim.scale.sites import allocation_sites, site_text
from allocsim.trace import EventKind, read_trace
from tests.recorder import BASE, S1, Recorder

TRACES = Path(__file__).resolve().parents[1] / "traces"
sys.path.insert(0, str(TRACES))
scale_windows = importlib.import_module("scale_windows")

LAYERS = 3
SEGMENT = 1 << 34


def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def stack(line: int, name: str, v: int) -> list[dict]:
    """Innermost first: the model line, a builtin whose repr holds a per-run address, the loop."""
    return [frame("model.py", line, name), frame("", 0, f"<built-in method apply of object at {hex(0x7f00 + v)}>"),
            frame("train.py", 40, "train_step"), frame("train.py", 90, "<module>")]


def step_allocs(v: int, appear_from: int | None) -> list[tuple[int, str, int, bool]]:
    """(line, function, size_bytes, freed within the step) of one step's allocations, in order."""
    out = [(10, "embed", 512 * v, False)]
    for _ in range(LAYERS):
        out += [(20, "attention", 48 * v * v + 64 * v, False),
                (21, "mlp", 96 + 3072 * v, False),
                (22, "residual", 64, True)]
        if appear_from is not None and v >= appear_from:
            out.append((23, "workspace", 4096 * v, True))     # a kernel that needs a buffer past some size
    out.append((30, "loss", 4, True))
    return out


def record(v: int, steps: int = 3, appear_from: int | None = None) -> Recorder:
    """The program's snapshot at scale v: ``steps`` training steps inside one pre-existing segment."""
    rec = Recorder()
    rec.before(BASE, SEGMENT, S1)
    addr = BASE
    for _ in range(steps):
        kept = []
        for line, name, size, temp in step_allocs(v, appear_from):
            rec.alloc(addr, size, S1, block=-(-size // 512) * 512)
            rec.entries[-1]["frames"] = stack(line, name, v)
            (rec.free(addr, S1) if temp else kept.append(addr))
            addr += 1 << 24
        for a in reversed(kept):
            rec.free(a, S1)
    return rec


def write(tmp_path: Path, name: str, rec: Recorder, drop_entries: int = 0) -> str:
    """Dump ``rec`` as a ring buffer would have kept it without its first ``drop_entries`` entries."""
    kept = Recorder()
    kept.__dict__.update(vars(rec), entries=rec.entries[drop_entries:])
    return str(kept.dump(tmp_path / name))


def alloc_sizes(trace) -> list[int]:
    ev = trace.events
    return ev.loc[ev["kind"] == EventKind.ALLOC, "size_bytes"].tolist()


def test_site_text_masks_object_addresses_only():
    a = site_text([("m.py", 3, "<built-in method add of Tensor object at 0x7f3a2c>"), ("t.py", 9, "run")], "code")
    b = site_text([("m.py", 3, "<built-in method add of Tensor object at 0x55d10e>"), ("t.py", 9, "run")], "code")
    c = site_text([("m.py", 4, "<built-in method add of Tensor object at 0x7f3a2c>"), ("t.py", 9, "run")], "code")
    assert a == b != c
    assert site_text([("", 0, "ProfilerStep#3"), ("", 0, "aten::mm")], "operators") == "aten::mm"
    assert "ProfilerStep#3" in site_text([("", 0, "ProfilerStep#3")], "code")   # code stacks keep every frame


def test_prediction_from_snapshots_is_byte_for_byte_and_keyed_by_code_site(tmp_path):
    inputs = [load_input(write(tmp_path, f"s{v}.pickle", record(v)), Fraction(v)) for v in (1, 2, 3, 4)]
    origin, sites = allocation_sites(inputs[0].trace)
    assert origin == "code" and sites[0].startswith("model.py:10:embed")
    result = scale_inputs(inputs, Fraction(8), "seq")
    report = result.report
    truth = read_trace(write(tmp_path, "s8.pickle", record(8)))
    assert alloc_sizes(result.trace) == alloc_sizes(truth)
    assert report.keyer == "code-site"
    assert report.aligned_all == report.allocations == 3 * (2 + 3 * LAYERS)
    assert report.laws["quadratic"] == 3 * LAYERS            # attention, every layer, three steps
    assert report.laws["linear"] == 3 * LAYERS                # mlp (96 + 3072 v: no monomial)
    assert report.laws["proportional"] == 3                   # embed (512 v)
    # The frames travel with the prediction, so the scaled trace names its sites too.
    assert allocation_sites(result.trace)[1] == allocation_sites(inputs[-1].trace)[1]


def test_a_site_that_appears_with_scale_moves_nothing_else(tmp_path):
    inputs = [load_input(write(tmp_path, f"a{v}.pickle", record(v, appear_from=3)), Fraction(v))
              for v in (1, 2, 3, 4)]
    result = scale_inputs(inputs, Fraction(8), "batch")
    report = result.report
    extra = 3 * LAYERS
    assert report.aligned_some == extra and report.unaligned == 0
    assert report.aligned_all == report.allocations - extra
    truth = read_trace(write(tmp_path, "a8.pickle", record(8, appear_from=3)))
    assert alloc_sizes(result.trace) == alloc_sizes(truth)


def test_ring_buffer_windows_cut_at_different_points_align_by_site(tmp_path):
    # Each scale kept a different tail of the same 3-step run: the windows start mid-step, at
    # different points, and end where the snapshot was dumped.
    drops = {2: 0, 3: 17, 4: 29}
    inputs = [load_input(write(tmp_path, f"w{v}.pickle", record(v), drop), Fraction(v)) for v, drop in drops.items()]
    reference = inputs[-1]
    assert reference.steps.source == "none" and reference.steps.steps[0].from_end
    result = scale_inputs(inputs, Fraction(8), "seq")
    assert result.report.keyer == "code-site"
    assert result.report.unaligned == 0 and result.report.aligned_all == result.report.allocations
    truth = read_trace(write(tmp_path, "w8.pickle", record(8), drops[4]))
    assert alloc_sizes(result.trace) == alloc_sizes(truth)


def real_snapshot(shared_dir: Path, name: str) -> Path:
    path = shared_dir / "traces" / "pytorch-snapshots" / name
    if not path.exists():
        pytest.skip(f"{name} is absent")
    return path


@pytest.mark.full
def test_windows_of_a_real_gpu_snapshot_align_by_site(shared_dir, tmp_path):
    path = real_snapshot(shared_dir, "Wedsonlin__medium_128_training_memory_snapshot.pickle")
    rows = scale_windows.windows_rows(path, (0.0, 0.3, 0.6), workdir=tmp_path)
    assert len(rows) == 6
    for row in rows:
        site, position = row["site"], row["position"]
        assert site["keyer"] == "code-site"
        # Every allocation found is the same allocation of the recording.
        assert site["same_allocation"] == site["aligned"]
        if row["reference_cut"] > row["other_cut"]:
            assert site["aligned"] == site["allocations"]        # the later window is inside the earlier
        else:
            later = next(r for r in rows if r["reference_cut"] == row["other_cut"])
            assert site["aligned"] == later["site"]["allocations"]
        # Without frames, live-byte troughs cut these windows in the wrong places.
        assert position["same_allocation"] < 0.05 * position["allocations"]


def test_windows_of_a_python_stacks_snapshot_align_past_the_forward_pass(shared_dir, tmp_path):
    # Recorded with Python stacks only: the backward pass's allocations (made by the autograd
    # engine's C++ thread) have no frames, and a window cut after the forward pass holds only those.
    path = real_snapshot(shared_dir, "MAGMA27__memory_snapshot.pickle")
    rows = scale_windows.windows_rows(path, (0.0, 0.6), workdir=tmp_path)
    late = next(r for r in rows if r["reference_cut"] == 0.6)["site"]
    assert late["keyer"] == "code-site"
    assert late["aligned"] == late["same_allocation"] == late["allocations"] > 500


@pytest.mark.full
def test_the_same_runs_scaled_keep_every_size(shared_dir):
    path = real_snapshot(shared_dir, "Wedsonlin__medium_128_training_memory_snapshot.pickle")
    first = load_input(str(path), Fraction(1))
    import dataclasses

    from allocsim.errors import AllocsimError
    from allocsim.scale import prepare_input

    with pytest.raises(AllocsimError, match="hold the same events"):       # one recording twice is refused
        scale_inputs([first, prepare_input(first.trace, Fraction(2), path=str(path))], Fraction(4), "batch")
    # a second run with the same sizes (its clock 1 ns later): every size is constant
    events = first.trace.events.copy()
    events["t_ns"] = events["t_ns"] + 1
    again = prepare_input(dataclasses.replace(first.trace, events=events), Fraction(2), path=str(path))
    result = scale_inputs([first, again], Fraction(4), "batch")
    report = result.report
    assert report.keyer == "code-site" and first.steps.source == "none"
    assert report.aligned_all == report.allocations == len(first.alloc_id)
    assert report.laws["constant"] == report.allocations
    assert report.initial["aligned"] == len(first.trace.initial_allocs) > 0
    assert np.array_equal(result.trace.events["size_bytes"].to_numpy(), first.trace.events["size_bytes"].to_numpy())
    assert len(result.trace.decisions) == 0
    # Two inputs whose start segments nest (here: the same) keep the reference's layout, cache and all:
    # the prediction from one run twice is that run.
    assert result.trace.meta.version_hints["scale"]["start_layout"] == "cached"
    assert result.trace.initial_segments["addr"].tolist() == first.trace.initial_segments["addr"].tolist()
    assert peaks(result.trace) == peaks(first.trace)
