"""Run one script under the capture, sending its records to ``allocsim capture``: ``python bootstrap.py -- SCRIPT ARGS``.

``allocsim capture`` starts this module (through ``bootstrap``, by path) with the interpreter the
user named, so the script sees its own environment, ``sys.path``, ``sys.argv`` and ``__main__`` as
with ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``, ``python -c CODE ARGS``). It needs torch
and the standard library only: records go to the parent over a private pipe (``channel``), and the
parent writes the trace. Settings come from the parent in ``ALLOCSIM_CAPTURE_CONFIG`` (JSON):
``steps`` (> 0 ends the script after that many optimizer steps, each also a ``ProfilerStep#N``
marker), ``gpu`` (the card's properties), ``memory_bytes`` (the card's memory for tensors: requests
beyond what the modelled allocator can serve raise ``torch.cuda.OutOfMemoryError``; absent, no
limit), ``outside_dir`` and ``hooks_dir`` (how a process the script starts reports CUDA work, see
``outside/sitecustomize.py``), ``scratch`` (the folder the script's writes go to instead of the
user's files: ``writeguard``) and ``distributed`` (a rank's settings: ``distributed.rank``).

Every way the script can end leaves a summary or lets the parent see why there is none: the main
module returns or raises (then, as Python's own exit does, the child waits for the script's
non-daemon threads and runs its ``atexit`` handlers, still under the capture, until neither adds
more work); ``--steps`` is reached (the process ends from the step hook, after the summary, so no
``except`` in the script can swallow it); ``os._exit`` (the summary first); a request the capture
cannot take (the summary says which, exit status 4); ``os.exec*`` (a ``Z`` record first; the new
program runs without the capture); a signal (the parent sees it in its wait status and reads the
unsent records from the tail mapping). The exit status says how the script ended: 0 it ended (or
reached ``steps``), 3 it raised or exited with an error, 4 the capture refused a request, 130 it was
interrupted, 2 the capture could not start (no torch, bad settings); the parent checks it against
its own wait status.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import json
import os
import runpy
import signal
import sys
import threading
import types

EXIT_SCRIPT_FAILED = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130
EXIT_CANNOT_START = 2
#: Environment variable naming the folder where a process the script starts reports CUDA work.
ENV_OUTSIDE = "ALLOCSIM_CAPTURE_OUTSIDE"


def _run(argv: list[str]) -> None:
    """Run the script as ``python ARGV`` would: ``sys.argv``, ``sys.path[0]`` and ``__main__`` as there."""
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("capture: '-m' needs a module name")
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if argv[0] == "-c":
        if len(argv) < 2:
            raise SystemExit("capture: '-c' needs the code to run")
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)   # noqa: S102  (the user's own code, as python -c runs it)
        return
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


def _config() -> dict:
    text = os.environ.pop("ALLOCSIM_CAPTURE_CONFIG", "") or "{}"
    try:
        config = json.loads(text)
    except ValueError:
        config = {}
    return config if isinstance(config, dict) else {}


def _wait_like_python_exit() -> None:
    """What the interpreter does after the main module: wait for non-daemon threads, then run ``atexit`` handlers.

    Repeated while either adds work (a handler that starts a thread, a thread that registers a
    handler). ``atexit._run_exitfuncs`` prints a handler's exception and goes on, as Python's exit does.
    """
    me = threading.current_thread()
    while True:
        waiting = [t for t in threading.enumerate()
                   if t is not me and not t.daemon and t.is_alive() and t is not threading.main_thread()]
        if waiting:
            for thread in waiting:
                thread.join()
            continue
        if getattr(atexit, "_ncallbacks", lambda: 0)():
            atexit._run_exitfuncs()
            continue
        return


def _outcome(exc: BaseException) -> tuple[int, str]:
    """The status and the words for how the script's code ended with ``exc``."""
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return 0, ""
        if not isinstance(exc.code, int):      # sys.exit("message"): Python prints it and exits with 1
            print(exc.code, file=sys.stderr)
        return EXIT_SCRIPT_FAILED, f"the script exited with {str(exc.code)[:200]}"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "the script was interrupted (SIGINT)"
    from .tracebacks import print_script_traceback  # noqa: PLC0415

    print_script_traceback(exc)        # as `python SCRIPT` shows it: no child.py or runpy frames
    return EXIT_SCRIPT_FAILED, f"the script raised {type(exc).__name__}: {str(exc)[:500]}"


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: nothing to flush
            pass


def _watch_exec(channel) -> None:
    """``os.execv``/``os.execve`` (and ``execl*``, ``execvp*``, which call them) say first that the capture ends there."""
    for name in ("execv", "execve"):
        original = getattr(os, name, None)
        if original is None:
            continue

        def replaced(path, args, *rest, _original=original, _name=name):
            shown = " ".join(str(a) for a in list(args)[:8])[:300]
            channel.send(["Z", f"the script replaced its process with os.{_name}({shown}); what runs after that is "
                               "not captured"])
            channel.flush()
            return _original(path, args, *rest)
        setattr(os, name, replaced)


def _tell_descendants(config: dict) -> None:
    """Processes the script starts find the report folder and the ``sitecustomize`` that watches their CUDA use."""
    outside, hooks = config.get("outside_dir"), config.get("hooks_dir")
    if isinstance(outside, str) and isinstance(hooks, str) and outside and hooks:
        os.environ[ENV_OUTSIDE] = outside
        # first, so that a user's own sitecustomize on their PYTHONPATH still runs: this one hands over to it
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH", "")) if p)


def main(args: list[str]) -> int:
    from .channel import Channel, NullChannel, text  # noqa: PLC0415

    channel = Channel.from_env() or NullChannel()
    if not args or args[0] != "--" or len(args) < 2:
        print("usage: python bootstrap.py -- SCRIPT [ARGS...] (run by allocsim capture)", file=sys.stderr)
        return EXIT_CANNOT_START
    script = args[1:]
    config = _config()
    steps = config.get("steps") if type(config.get("steps")) is int else 0
    gpu = config.get("gpu") if isinstance(config.get("gpu"), dict) else {}
    memory_bytes = config.get("memory_bytes") if type(config.get("memory_bytes")) is int else None
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        channel.send(["D", {"status": "no torch", "error": text(exc), "python": text(sys.executable)}])
        channel.close()
        return EXIT_CANNOT_START
    from .cudnn import workspace_ratio  # noqa: PLC0415

    try:
        workspace_ratio()              # refused before the script runs
    except ValueError as exc:
        channel.send(["D", {"status": "bad settings", "error": text(exc)}])
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

    # torch's and the capture's own objects are there for good: the cycle collector need not walk them again at
    # every full collection while the script runs (a tenth of a capture of 10^5 live tensors)
    gc.freeze()
    tracker = StorageTracker(channel, gpu, memory_bytes=memory_bytes)
    tracker.stack_floor = frozenset({_run.__code__})      # below the script's own frames: runpy, the child
    channel.send(["H", {"torch": torch.__version__, "script": [text(a) for a in script[:64]]}])
    done = {"steps": 0}
    autocast = None
    channel_pid = os.getpid()
    os_exit = os._exit

    def finish(status: int, failure: str) -> None:
        channel.send(["D", {
            "status": "ok" if not failure else text(failure), "exit": status,
            "torch": torch.__version__, "optimizer_steps": done["steps"],
            "allocs": tracker.n_allocs, "frees": tracker.n_frees, "cudnn_workspaces": tracker.n_workspaces,
            "peak_requested_bytes": tracker.peak_bytes,
            "cudnn_workspace_ratios": tracker.workspace_ratio._asdict(),
            "cublas_workspace_bytes": tracker.cublas.bytes,
            "host_abstract_bytes": HOST_ABSTRACT_BYTES, "gpu": gpu,
            # as the script left them: cuDNN's engine choice (and its trial workspaces) follows them on a GPU
            "cudnn_flags": {"benchmark": bool(torch.backends.cudnn.benchmark),
                            "allow_tf32": bool(torch.backends.cudnn.allow_tf32)},
            "autocast": {"source": text(autocast.source) if autocast else "",
                         "casts": autocast.n_casts if autocast else 0,
                         "cached": autocast.n_cached if autocast else 0,
                         "missing_ops": [text(op) for op in autocast.missing[:64]] if autocast else []},
            "writes": guard.journal() if guard is not None else None,
        }])
        channel.close()

    def end_now(status: int, failure: str) -> None:
        """End the process here, the records and the summary written first (no ``except`` in the script can stop it)."""
        if os.getpid() == channel_pid:
            tracker.stop()
            finish(status, failure)
            _flush_stdio()
        os_exit(status)

    def after_step(optimizer, _args, _kwargs):
        done["steps"] += 1
        tracker.marker(f"ProfilerStep#{done['steps']}")
        if steps and done["steps"] >= steps:
            end_now(0, "")

    def exit_now(code: int) -> None:
        # os._exit skips every handler: the records sent so far and the summary go first
        if os.getpid() == channel_pid:
            tracker.stop()
            finish(code if type(code) is int else EXIT_SCRIPT_FAILED,
                   f"the script called os._exit({code})" if code else "")
        os_exit(code)

    tracker.on_refused = lambda reason: end_now(EXIT_REFUSED, reason)
    channel.on_parent_gone = lambda: os_exit(EXIT_CANNOT_START)    # nobody records any more: end the script
    _watch_exec(channel)
    _tell_descendants(config)
    os._exit = exit_now
    status, failure = 0, ""
    # Started with SIGINT ignored (a background job, nohup), Python installs no KeyboardInterrupt:
    # the SIGINT allocsim sends for Ctrl-C and --timeout must still end the script as Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tracker.marker("ProfilerStep#0")
    try:
        rank = RankHooks(tracker, config.get("distributed"))
        with rank.installed(), Roles(tracker).installed() as roles, cuda_on_meta(tracker, gpu) as autocast:
            handle = register_optimizer_step_post_hook(after_step)
            try:
                try:
                    _run(script)
                except BaseException as exc:   # the user's code: any end of it is an outcome, the trace is kept
                    status, failure = _outcome(exc)
                try:
                    _wait_like_python_exit()
                except BaseException as exc:   # Ctrl-C or --timeout while waiting for threads, a handler's os._exit
                    later, why = _outcome(exc)
                    if later:
                        status, failure = later, failure or why
            finally:
                handle.remove()
                roles.checkpoint()
    except BaseException as exc:               # the capture's own exits (a second Ctrl-C while they ran)
        later, why = _outcome(exc)
        status, failure = (later, failure or why) if later else (status, failure)
    finally:
        # the records are complete from here on: a second Ctrl-C must not cut them short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        tracker.stop()
    os._exit = os_exit
    finish(status, failure)
    return status


def run(args: list[str]) -> None:
    """``bootstrap``'s entry: run the capture, then leave as Python leaves (stdio flushed, the exit status passed on)."""
    code = main(args)
    _flush_stdio()
    sys.exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
