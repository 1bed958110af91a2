"""cuDNN convolution workspaces in ``allocsim capture``: where they are requested and how large, exactly.

The script has one convolution of each kind PyTorch's CUDA backend treats differently under the
model: an image stem (3 input channels: cuDNN, no workspace), a 3x3 convolution (cuDNN, a
workspace per phase), a float32 depthwise one (PyTorch's own kernel, none) and a 1x1 one (cuDNN, a
workspace in backward data only). At ratios 0.5,0.25 the 3x3 convolution's workspaces are half its
larger feature map, its output 2 x 16 x 16 x 16 float32 = 32768 bytes -> 16384 bytes, and the 1x1
convolution's backward data a quarter of the gradient it computes, its input 2 x 16 x 16 x 16
float32 -> 8192 bytes. In the backward pass the 1x1 convolution comes first, then the 3x3 one's
backward data and backward filter; the stem's input needs no gradient.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.torch_capture import cudnn, session  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402

SCRIPT = '''
import torch
device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 16, 3, padding=1),
                            torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.Conv2d(16, 4, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    x = torch.randn(2, 3, 16, 16).to(device)
    model(x).sum().backward()
    opt.step()
'''
OUT_BYTES = 2 * 16 * 16 * 16 * 4      # the 3x3 convolution's output, its larger feature map
GRAD_WEIGHT_BYTES = 16 * 8 * 3 * 3 * 4
GRAD_INPUT_BYTES = 2 * 8 * 16 * 16 * 4
POINTWISE_GRAD_BYTES = 2 * 16 * 16 * 16 * 4    # the gradient of the 1x1 convolution's input
X3, W3, Y3 = [2, 8, 16, 16], [16, 8, 3, 3], [2, 16, 16, 16]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cudnn")
    script = folder / "conv.py"
    script.write_text(SCRIPT)
    out = folder / "conv.parquet"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO", "0.5,0.25")
        result, _trace = session.capture([sys.executable, str(script)], str(out), steps=1)
        assert result.status == 0
    return read_trace(str(out))


def _workspace_events(trace):
    events = trace.events
    rows = []
    for i, (kind, alloc_id, size, sid) in enumerate(zip(events["kind"], events["alloc_id"], events["size_bytes"],
                                                        events["stack_id"])):
        if kind == EventKind.ALLOC and sid >= 0:
            parsed = cudnn.parse_label(trace.stack(int(sid))[0][2])
            if parsed is not None:
                rows.append((i, int(alloc_id), int(size), parsed))
    return rows


@pytest.mark.full          # a torch capture or a real GPU step: seconds each
def test_the_3x3_convolution_asks_for_its_workspaces_at_its_kernels(captured):
    trace = captured
    events = trace.events
    found = _workspace_events(trace)
    assert [(size, parsed[0]) for _i, _a, size, parsed in found] == [
        (OUT_BYTES // 2, "forward"), (POINTWISE_GRAD_BYTES // 4, "backward data"),
        (OUT_BYTES // 2, "backward data"), (OUT_BYTES // 2, "backward filter")]
    for i, alloc_id, _size, _parsed in found:
        # handed back right after the kernel, before any other request
        assert events["kind"][i + 1] == EventKind.FREE_REQUESTED and events["alloc_id"][i + 1] == alloc_id
    for _i, _a, _size, parsed in (found[0], found[2], found[3]):
        assert parsed[1:4] == (X3, W3, Y3)
    assert found[1][3][1:4] == ([2, 16, 16, 16], [4, 16, 1, 1], [2, 4, 16, 16])
    fwd, pointwise, data, weight = (f[0] for f in found)
    assert events["size_bytes"][fwd - 1] == OUT_BYTES                   # the output exists first
    assert events["size_bytes"][pointwise - 1] == POINTWISE_GRAD_BYTES  # each gradient, then its workspace
    assert events["size_bytes"][data - 1] == GRAD_INPUT_BYTES
    assert events["size_bytes"][weight - 1] == GRAD_WEIGHT_BYTES
    assert trace.meta.version_hints["cudnn_workspace_ratios"] == {"kernel": 0.5, "pointwise_data": 0.25}


@pytest.mark.full          # starts a capture child
def test_a_bad_ratio_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO", "lots")
    script = tmp_path / "s.py"
    script.write_text("open('ran', 'w').close()\n")
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", str(tmp_path / "s.parquet"), "--",
                           sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "ALLOCSIM_CUDNN_WORKSPACE_RATIO" in err[0], done.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "s.parquet").exists()


def test_which_convolutions_run_on_cudnn():
    assert cudnn.runs_on_cudnn([8, 32, 10, 10], [32, 1, 3, 3], 32, 4) is False      # fp32 depthwise
    assert cudnn.runs_on_cudnn([8, 32, 10, 10], [64, 1, 3, 3], 32, 4) is False      # depthwise, multiplier 2
    assert cudnn.runs_on_cudnn([8, 32, 10, 10], [32, 1, 3, 3], 32, 2) is True       # half: cuDNN depthwise
    assert cudnn.runs_on_cudnn([8, 32, 10, 10], [32, 8, 3, 3], 4, 4) is True        # grouped, not depthwise
    ratios = cudnn.WorkspaceRatios(kernel=0.25, pointwise_data=2.0)
    for phase in cudnn.PHASES:       # a larger kernel: the larger feature map (here the input) in every phase
        assert cudnn.workspace_bytes(phase, [8, 32, 10, 10], [64, 32, 3, 3], [8, 64, 5, 5], 1, 4, ratios) == 8 * 32 * 100
    # a 1x1 kernel: only backward data, on the gradient it computes (the input's bytes)
    assert cudnn.workspace_bytes("backward data", [8, 32, 10, 10], [64, 32, 1, 1], [8, 64, 10, 10], 1, 4,
                                 ratios) == 2 * 8 * 32 * 100 * 4
    assert cudnn.workspace_bytes("forward", [8, 32, 10, 10], [64, 32, 1, 1], [8, 64, 10, 10], 1, 4, ratios) == 0
    assert cudnn.workspace_bytes("backward filter", [8, 32, 10, 10], [64, 32, 1, 1], [8, 64, 10, 10], 1, 4,
                                 ratios) == 0
    # an image stem (at most 4 input channels) asks for none
    assert cudnn.workspace_bytes("forward", [8, 3, 10, 10], [64, 3, 7, 7], [8, 64, 5, 5], 1, 4, ratios) == 0
    assert cudnn.workspace_bytes("forward", [8, 5, 10, 10], [64, 5, 3, 3], [8, 64, 5, 5], 1, 4, ratios) == 8 * 64 * 25
    # fp32 depthwise runs PyTorch's kernel: no workspace whatever the ratios
    assert cudnn.workspace_bytes("forward", [8, 32, 10, 10], [32, 1, 3, 3], [8, 32, 10, 10], 32, 4, 5.0) == 0


def test_the_ratios_setting_takes_one_number_or_two(monkeypatch):
    monkeypatch.setenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO", "3")
    assert cudnn.workspace_ratio() == cudnn.WorkspaceRatios(3.0, 3.0)
    monkeypatch.setenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO", "3,0.5")
    assert cudnn.workspace_ratio() == cudnn.WorkspaceRatios(3.0, 0.5)
    for bad in ("1,2,3", "nan", "-1,1", "1,"):
        monkeypatch.setenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO", bad)
        with pytest.raises(ValueError, match="ALLOCSIM_CUDNN_WORKSPACE_RATIO"):
            cudnn.workspace_ratio()
    monkeypatch.delenv("ALLOCSIM_CUDNN_WORKSPACE_RATIO")
    assert cudnn.workspace_ratio() == cudnn.WORKSPACE_RATIOS_CALIBRATED


def test_labels_round_trip_and_other_frames_do_not_parse():
    name = cudnn.label("backward data", [4, 3, 8, 8], [5, 3, 3, 3], [4, 5, 6, 6], 1, 4)
    assert cudnn.parse_label(name) == ("backward data", [4, 3, 8, 8], [5, 3, 3, 3], [4, 5, 6, 6], 1, 4)
    assert cudnn.parse_label("aten::convolution") is None
    assert cudnn.parse_label(name + " ") is None


@pytest.mark.full          # a torch capture or a real GPU step: seconds each
def test_rescaling_a_capture_sets_every_workspace_to_the_new_ratio(captured):
    from validate.xmem import rescale_workspaces

    trace = captured
    rescaled = rescale_workspaces(trace, cudnn.WorkspaceRatios(2.0, 3.0))
    assert rescaled.meta.version_hints["cudnn_workspace_ratios"] == {"kernel": 2.0, "pointwise_data": 3.0}
    assert trace.meta.version_hints["cudnn_workspace_ratios"]["kernel"] == 0.5    # the capture is left as it was
    new_sizes = [2 * OUT_BYTES, 3 * POINTWISE_GRAD_BYTES, 2 * OUT_BYTES, 2 * OUT_BYTES]
    assert [size for _i, _a, size, _p in _workspace_events(rescaled)] == new_sizes
    events = rescaled.events
    for (_i, alloc_id, _size, _p), size in zip(_workspace_events(rescaled), new_sizes):   # the frees too
        rows = events[(events["alloc_id"] == alloc_id) & (events["kind"] != EventKind.MARKER)]
        assert len(rows) == 3 and set(rows["size_bytes"]) == {size}
    only_pointwise = rescale_workspaces(trace, cudnn.WorkspaceRatios(0.0, 1.0))
    assert [size for _i, _a, size, _p in _workspace_events(only_pointwise)] == [POINTWISE_GRAD_BYTES]
    none = rescale_workspaces(trace, 0.0)
    # four requests, each with its free requested and completed
    assert _workspace_events(none) == [] and len(none.events) == len(trace.events) - 12
    workspaces = 3 * OUT_BYTES // 2 + POINTWISE_GRAD_BYTES // 4
    kept = trace.events[trace.events["kind"] == EventKind.ALLOC]["size_bytes"].sum() - workspaces
    assert none.events[none.events["kind"] == EventKind.ALLOC]["size_bytes"].sum() == kept


@pytest.mark.full          # a torch capture or a real GPU step: seconds each
def test_cli_capture_refuses_a_bad_ratio_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "s.py"
    script.write_text("pass\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), ALLOCSIM_CUDNN_WORKSPACE_RATIO="-1")
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", str(tmp_path / "s.parquet"), "--",
                           sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "allocsim capture: error: ALLOCSIM_CUDNN_WORKSPACE_RATIO must be R or R,P with numbers in [0, 1e6], "
        "got '-1'"]


@pytest.mark.full          # a torch capture or a real GPU step: seconds each
def test_the_real_gpu_step_shows_the_models_shape(shared_dir):
    """The Kineto ResNet-50 step (a V100): 1x1 forward calls take next to no workspace, larger kernels one each,
    and the 1x1 backward-data calls that take one take exactly the gradient's bytes."""
    from validate.cudnn_evidence import summary, workspaces

    path = shared_dir / "traces" / "kineto-gpu" / "pytorch_kineto_resnet50_nw0_1623143566756.json.gz"
    found = summary(workspaces(str(path)))
    larger, one_by_one = found["forward, larger than 1x1"], found["forward, 1x1"]
    assert larger["calls"] == larger["with_workspace"] == 17 and larger["median_ratio"] > 1
    assert one_by_one["calls"] == 36 and one_by_one["max_ratio"] < 0.01
    pointwise_data = found["backward data, 1x1"]
    assert pointwise_data["calls"] == 36 and pointwise_data["with_workspace"] == pointwise_data["at_gradient_bytes"] == 12
    assert sum(g["with_workspace"] for g in found.values()) == 74
