"""The convolution workspaces cuDNN asks the caching allocator for, which a meta run cannot show.

Set ``ALLOCSIM_CUDNN_WORKSPACE_RATIO`` to try another ratio; the default is calibrated (see below).

What PyTorch does on a CUDA device (``aten/src/ATen/native/Convolution.cpp``, ``cudnn/Conv_v8.cpp``),
and what the capture copies:

* a 2-D float32 depthwise convolution (``groups == in_channels``, ``out_channels`` a multiple of it)
  runs PyTorch's own kernel (``_conv_depthwise2d``; ``use_cudnn_depthwise`` is only for half
  precision or channels-last): no workspace;
* every other convolution runs cuDNN three times per training step (forward, backward data,
  backward filter). With ``torch.backends.cudnn.benchmark`` off (the default), ``run_single_conv``
  takes the top engine of cuDNN's instant heuristic and ``run_conv_plan`` allocates that engine's
  workspace through the caching allocator right before the kernel and hands it back right after;
  an engine whose workspace does not fit raises out-of-memory and the next one (in the end the
  fallback list, whose engines need none) is tried: "the first engine whose workspace fits".

Which engine cuDNN's heuristic picks, and its workspace, is decided inside the closed library per
shape and GPU architecture; no public table gives it. The model here is therefore two calibrated
ratios, one per kind of call whose real workspaces have a different shape
(``validate/cudnn_evidence.py`` on the Kineto ResNet-50 trace, a V100 with ``cudnn.benchmark``):

* ``kernel``: a convolution whose kernel is larger than 1x1 (the shapes where cuDNN chooses
  Winograd, FFT-tiling or split reductions, whose workspaces grow with the feature map) asks for
  ``kernel`` times the bytes of its larger feature map (input or output) in each of its three
  phases. In the Kineto step every forward call with a larger kernel takes one, median 4.7 times it,
  and each such layer takes the same bytes in its three phases (one ratio covers them).
* ``pointwise_data``: the backward-data phase of a 1x1 convolution asks for ``pointwise_data``
  times the bytes of the gradient it computes (the convolution's input). In the Kineto step 12 of
  the 36 such calls take a workspace of exactly those bytes (1.00 times, to the MiB) and the others none.
* every other 1x1 phase asks for none: the 36 forward 1x1 calls take at most 0.5% of their feature
  map; backward-filter calls of 1x1 kernels take at most 0.41 times it and most none.
* a convolution over at most ``STEM_MAX_CHANNELS`` input channels (groups 1: the stem that reads
  the image) asks for none: the Kineto step's stem (3 channels, 7x7) takes 0.6% of its feature map
  forward and none in backward filter. Under a flat ratio it would be the first and one of the
  largest workspaces of the step, and that early segment, reused by the activations that follow,
  moved the simulated reserved peak of an xMem row by hundreds of MiB (RegNetY400MF at ratio 4:
  3.22 GiB with it, 3.89 GiB without).

Both ratios are fitted on xMem's 001-Anova RTX 3060 runs only (``validate/xmem_calibration.json``,
``python -m validate xmem --calibrate``).
The capture inserts each workspace as an allocation and a free at its convolution, so the replay
sees it where it happens (inside the backward pass, next to the activations' peak), not as a flat sum.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Sequence


class WorkspaceRatios(NamedTuple):
    """The model's two ratios: larger-than-1x1 kernels (every phase) and 1x1 backward data."""

    kernel: float
    pointwise_data: float

    def __str__(self) -> str:
        return f"{self.kernel:g},{self.pointwise_data:g}"


#: Fitted on xMem's 001-Anova rows (RTX 3060, sm86); validate/xmem_calibration.json has the fit.
WORKSPACE_RATIOS_CALIBRATED = WorkspaceRatios(4.0, 0.0)
#: A convolution over this many input channels or fewer (groups 1) is an image stem: no workspace.
STEM_MAX_CHANNELS = 4
#: The phases of one convolution in a training step, in the order the CUDA run allocates them.
PHASES = ("forward", "backward data", "backward filter")
#: Frame name of a workspace request: the phase and the convolution's shapes, parseable again.
_LABEL = re.compile(r"^cudnn workspace: convolution (forward|backward data|backward filter) "
                    r"x=(\d+(?:x\d+)*) w=(\d+(?:x\d+)*) y=(\d+(?:x\d+)*) groups=(\d+) dtype_bytes=(\d+)$")


def _parse_ratios(text: str) -> WorkspaceRatios:
    parts = text.split(",")
    if len(parts) > 2:
        raise ValueError
    values = [float(p) for p in parts]
    if not all(0 <= v <= 1e6 for v in values):       # also refuses nan
        raise ValueError
    return WorkspaceRatios(values[0], values[-1])


def workspace_ratio() -> WorkspaceRatios:
    """The ratios in force: ``ALLOCSIM_CUDNN_WORKSPACE_RATIO`` when set, else the calibrated ones.

    ``R`` sets both ratios to R (0: no workspaces); ``R,P`` sets R for larger kernels and P for 1x1
    backward data.
    """
    text = os.environ.get("ALLOCSIM_CUDNN_WORKSPACE_RATIO", "").strip()
    if not text:
        return WORKSPACE_RATIOS_CALIBRATED
    try:
        return _parse_ratios(text)
    except ValueError:
        raise ValueError("ALLOCSIM_CUDNN_WORKSPACE_RATIO must be R or R,P with numbers in [0, 1e6], "
                         f"got {text!r}") from None


def runs_on_cudnn(x_shape: Sequence[int], w_shape: Sequence[int], groups: int, dtype_bytes: int) -> bool:
    """Whether PyTorch's CUDA backend sends this convolution to cuDNN (else its own depthwise kernel)."""
    in_channels, out_channels = int(x_shape[1]), int(w_shape[0])
    depthwise = (len(x_shape) == 4 and groups > 1 and groups == in_channels
                 and out_channels % in_channels == 0)
    # cuDNN depthwise is chosen only for half precision (or channels-last, which the capture does not see).
    return not (depthwise and dtype_bytes >= 4)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def workspace_bytes(phase: str, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
                    groups: int, dtype_bytes: int, ratios: WorkspaceRatios | float) -> int:
    """Bytes this cuDNN phase of the convolution asks for under the model (0 off cuDNN).

    ``x_shape`` is the convolution's input (the gradient backward data computes), ``y_shape`` its
    output; a plain number as ``ratios`` is both ratios.
    """
    if not isinstance(ratios, WorkspaceRatios):
        ratios = WorkspaceRatios(float(ratios), float(ratios))
    if not runs_on_cudnn(x_shape, w_shape, groups, dtype_bytes):
        return 0
    if int(groups) == 1 and int(w_shape[1]) <= STEM_MAX_CHANNELS:
        return 0
    if _numel(w_shape[2:]) <= 1:
        if phase != "backward data":
            return 0
        return int(ratios.pointwise_data * _numel(x_shape) * dtype_bytes)
    feature_map = max(_numel(x_shape), _numel(y_shape)) * dtype_bytes
    return int(ratios.kernel * feature_map)


def label(phase: str, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
          groups: int, dtype_bytes: int) -> str:
    """The frame name a workspace request carries: phase and shapes, so a trace says which convolution asked."""
    def dims(shape):
        return "x".join(str(int(d)) for d in shape)
    return (f"cudnn workspace: convolution {phase} x={dims(x_shape)} w={dims(w_shape)} y={dims(y_shape)} "
            f"groups={int(groups)} dtype_bytes={int(dtype_bytes)}")


def is_workspace_label(name: str) -> bool:
    """Whether a frame name is a cuDNN workspace request's (``label``)."""
    return name.startswith("cudnn workspace: convolution ")


def parse_label(name: str) -> tuple[str, list[int], list[int], list[int], int, int] | None:
    """``(phase, x, w, y, groups, dtype_bytes)`` of a workspace frame name, or None for any other name."""
    m = _LABEL.match(name)
    if m is None:
        return None
    phase, x, w, y, groups, dtype_bytes = m.groups()
    return (phase, [int(d) for d in x.split("x")], [int(d) for d in w.split("x")],
            [int(d) for d in y.split("x")], int(groups), int(dtype_bytes))
