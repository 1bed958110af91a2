"""Run one script under the capture and write its trace: ``python -m allocsim.torch_capture.child OUT STEPS -- SCRIPT ARGS``.

``allocsim capture`` starts this module with the interpreter the user named, so the script sees its
own environment, ``sys.argv`` and ``__main__`` as with ``python SCRIPT ARGS`` (or ``python -m
MODULE ARGS``). ``STEPS`` > 0 ends the script after that many optimizer steps (each one is also a
``ProfilerStep#N`` marker in the trace); 0 runs it to its end. The trace is written even when the
script stops with an error, so the allocations up to the failure can be studied; the exit status
says which: 0 the script ended (or reached STEPS), 3 it raised, 2 bad arguments.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

EXIT_SCRIPT_FAILED = 3


class _StepsDone(BaseException):
    """Raised from the optimizer hook to end the script after the requested steps (not an error)."""


def _run(argv: list[str]) -> None:
    sys.argv = list(argv)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("capture: '-m' needs a module name")
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script_dir = os.path.dirname(os.path.abspath(argv[0]))
    sys.path.insert(0, script_dir)
    runpy.run_path(argv[0], run_name="__main__")


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        print("usage: python -m allocsim.torch_capture.child OUT STEPS -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    out_path, steps, script = args[0], int(args[1]), args[3:]
    from .cudnn import workspace_ratio  # noqa: PLC0415

    try:
        workspace_ratio()              # refused before torch is imported or the script runs
    except ValueError as exc:
        print(f"allocsim capture: error: {exc}", file=sys.stderr)
        return 2

    import torch  # noqa: PLC0415
    from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: PLC0415

    from ..trace import write_trace  # noqa: PLC0415
    from ..trace.reading.builder import TraceBuilder  # noqa: PLC0415
    from ..trace.reading.frames import FrameTable  # noqa: PLC0415
    from ..trace.schema import FRAME_DTYPES, STACK_DTYPES, frame_from_columns  # noqa: PLC0415
    from . import FORMAT  # noqa: PLC0415
    from .devicemap import cuda_on_meta  # noqa: PLC0415
    from .tracker import StorageTracker  # noqa: PLC0415

    name = " ".join(script)
    builder = TraceBuilder(out_path, FORMAT)
    frames = FrameTable(out_path)
    tracker = StorageTracker(builder, frames)
    done = {"steps": 0}

    def after_step(optimizer, _args, _kwargs):
        done["steps"] += 1
        tracker.marker(f"ProfilerStep#{done['steps']}")
        if steps and done["steps"] >= steps:
            raise _StepsDone()

    handle = register_optimizer_step_post_hook(after_step)
    status, failure = 0, ""
    tracker.marker("ProfilerStep#0")
    try:
        with cuda_on_meta(tracker):
            _run(script)
    except _StepsDone:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status, failure = EXIT_SCRIPT_FAILED, f"the script exited with {exc.code}"
    except BaseException as exc:   # the user's code: any error ends the capture, the trace is kept
        status = EXIT_SCRIPT_FAILED
        failure = f"the script raised {type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        handle.remove()
        tracker.stop()
    meta = builder.meta
    meta.source = os.path.basename(script[1] if script[0] == "-m" else script[0])
    meta.version_hints.update({"torch": torch.__version__, "capture": "cuda on meta",
                               "optimizer_steps": done["steps"],
                               "cudnn_workspace_ratios": tracker.workspace_ratio._asdict()})
    meta.notes.append(f"allocsim capture of `{name}`: cuda mapped to the meta device; requests are the "
                      "storages ATen operators create, frees are their release; cuDNN convolution "
                      f"workspaces are modelled ({tracker.n_workspaces} requests, ratio "
                      f"{tracker.workspace_ratio.kernel:g} of the larger feature map for kernels larger than "
                      f"1x1, {tracker.workspace_ratio.pointwise_data:g} of the input for 1x1 backward data, "
                      "allocsim.torch_capture.cudnn); "
                      "cuBLAS workspaces are added by run --gpu")
    if failure:
        meta.notes.append(f"incomplete: {failure}")
    trace = builder.finish()
    tables = frames.tables()
    trace.frames = frame_from_columns(tables["frames"], FRAME_DTYPES)
    trace.stacks = frame_from_columns(tables["stacks"], STACK_DTYPES)
    write_trace(trace, out_path)
    summary = {"trace": out_path, "allocs": tracker.n_allocs, "frees": tracker.n_frees,
               "cudnn_workspaces": tracker.n_workspaces,
               "optimizer_steps": done["steps"], "peak_allocated_bytes": tracker.peak_bytes,
               "status": "ok" if not failure else failure}
    print(json.dumps(summary), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
