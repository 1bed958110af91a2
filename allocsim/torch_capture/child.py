"""Run one script under the capture, sending its records to ``allocsim capture``: ``python -m allocsim.torch_capture.child -- SCRIPT ARGS``.

``allocsim capture`` starts this module with the interpreter the user named, so the script sees its
own environment, ``sys.argv`` and ``__main__`` as with ``python SCRIPT ARGS`` (or ``python -m
MODULE ARGS``). It needs torch and the standard library only: records go to the parent over a
private pipe (``channel``), and the parent writes the trace. Settings come from the parent in
``ALLOCSIM_CAPTURE_CONFIG`` (JSON): ``steps`` (> 0 ends the script after that many optimizer
steps, each also a ``ProfilerStep#N`` marker), ``gpu`` (the card's properties) and ``scratch`` (the
folder the script's writes go to instead of the user's files: ``writeguard``). The exit status
says how the script ended: 0 it ended (or reached ``steps``), 3 it raised, 130 it was interrupted,
2 the capture could not start (no torch, bad settings).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys

EXIT_SCRIPT_FAILED = 3
EXIT_INTERRUPTED = 130
EXIT_CANNOT_START = 2


class _StepsDone(BaseException):
    """Raised from the optimizer hook to end the script after the requested steps (not an error)."""


def _run(argv: list[str]) -> None:
    sys.argv = list(argv)
    if argv[0] == "-c":                  # `python -c CODE ARGS`: sys.argv and sys.path as Python sets them
        if len(argv) < 2:
            raise SystemExit("capture: '-c' needs a command")
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("capture: '-m' needs a module name")
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script_dir = os.path.dirname(os.path.abspath(argv[0]))
    sys.path.insert(0, script_dir)
    runpy.run_path(argv[0], run_name="__main__")


def _config() -> dict:
    text = os.environ.pop("ALLOCSIM_CAPTURE_CONFIG", "") or "{}"
    try:
        config = json.loads(text)
    except ValueError:
        config = {}
    return config if isinstance(config, dict) else {}


def main(args: list[str]) -> int:
    from .channel import Channel, NullChannel  # noqa: PLC0415

    channel = Channel.from_env() or NullChannel()
    if not args or args[0] != "--" or len(args) < 2:
        print("usage: python -m allocsim.torch_capture.child -- SCRIPT [ARGS...] (run by allocsim capture)",
              file=sys.stderr)
        return EXIT_CANNOT_START
    script = args[1:]
    config = _config()
    steps = int(config.get("steps") or 0)
    gpu = config.get("gpu") if isinstance(config.get("gpu"), dict) else {}
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        channel.send(["D", {"status": "no torch", "error": str(exc), "python": sys.executable}])
        channel.close()
        return EXIT_CANNOT_START
    from .cudnn import workspace_ratio  # noqa: PLC0415

    try:
        workspace_ratio()              # refused before the script runs
    except ValueError as exc:
        channel.send(["D", {"status": "bad settings", "error": str(exc)}])
        channel.close()
        return EXIT_CANNOT_START

    from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: PLC0415

    from .writeguard import WriteGuard  # noqa: PLC0415

    # Before anything of the script runs: its writes go to the scratch folder, never to the user's files.
    guard = WriteGuard(config["scratch"]).install() if isinstance(config.get("scratch"), str) else None

    from .devicemap import HOST_ABSTRACT_BYTES, cuda_on_meta  # noqa: PLC0415
    from .distributed.rank import RankHooks  # noqa: PLC0415
    from .roles import Roles  # noqa: PLC0415
    from .tracker import StorageTracker  # noqa: PLC0415

    tracker = StorageTracker(channel, gpu)
    done = {"steps": 0}

    def after_step(optimizer, _args, _kwargs):
        done["steps"] += 1
        tracker.marker(f"ProfilerStep#{done['steps']}")
        if steps and done["steps"] >= steps:
            raise _StepsDone()

    status, failure = 0, ""
    autocast = None

    def finish(status: int, failure: str) -> None:
        channel.send(["D", {
            "status": "ok" if not failure else failure, "exit": status,
            "torch": torch.__version__, "optimizer_steps": done["steps"], "script": script,
            "allocs": tracker.n_allocs, "frees": tracker.n_frees, "cudnn_workspaces": tracker.n_workspaces,
            "peak_requested_bytes": tracker.peak_bytes,
            "cudnn_workspace_ratios": tracker.workspace_ratio._asdict(),
            "cublas_workspace_bytes": tracker.cublas.bytes,
            "host_abstract_bytes": HOST_ABSTRACT_BYTES, "gpu": gpu,
            # as the script left them: cuDNN's engine choice (and its trial workspaces) follows them on a GPU
            "cudnn_flags": {"benchmark": bool(torch.backends.cudnn.benchmark),
                            "allow_tf32": bool(torch.backends.cudnn.allow_tf32)},
            "autocast": {"source": autocast.source if autocast else "", "casts": autocast.n_casts if autocast else 0,
                         "cached": autocast.n_cached if autocast else 0,
                         "missing_ops": autocast.missing if autocast else []},
            "writes": guard.journal() if guard is not None else None,
        }])
        channel.close()

    os_exit = os._exit

    def exit_now(code: int) -> None:
        # os._exit skips every handler: the records sent so far and the summary go first
        if os.getpid() == channel_pid:
            tracker.stop()
            finish(EXIT_SCRIPT_FAILED if code else 0, f"the script called os._exit({code})" if code else "")
        os_exit(code)

    channel_pid = os.getpid()
    os._exit = exit_now
    # Started with SIGINT ignored (a background job, nohup), Python installs no KeyboardInterrupt:
    # the SIGINT allocsim sends for Ctrl-C and --timeout must still end the script as Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tracker.marker("ProfilerStep#0")
    try:
        rank = RankHooks(tracker, config.get("distributed"))
        with rank.installed(), Roles(tracker).installed() as roles, cuda_on_meta(tracker, gpu) as autocast:
            handle = register_optimizer_step_post_hook(after_step)
            try:
                _run(script)
            finally:
                handle.remove()
                roles.checkpoint()
    except _StepsDone:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status, failure = EXIT_SCRIPT_FAILED, f"the script exited with {exc.code}"
    except KeyboardInterrupt:
        status, failure = EXIT_INTERRUPTED, "the script was interrupted (SIGINT)"
    except BaseException as exc:   # the user's code: any error ends the capture, the trace is kept
        status = EXIT_SCRIPT_FAILED
        failure = f"the script raised {type(exc).__name__}: {exc}"
        from .tracebacks import print_script_traceback  # noqa: PLC0415

        print_script_traceback(exc)        # as `python SCRIPT` shows it: no child.py or runpy frames
    finally:
        # the records are complete from here on: a second Ctrl-C must not cut them short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        tracker.stop()
    os._exit = os_exit
    finish(status, failure)
    return status


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # The script's own threads and atexit handlers ran; leave without waiting on foreign threads.
    sys.exit(code)
