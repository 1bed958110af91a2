"""Tell ``allocsim capture`` when a process the captured script started uses CUDA, which the capture does not follow.

The capture records the script's own process. A Python process it starts (``subprocess.run([sys.executable,
"other.py"])``, ``os.execv`` of itself, ``multiprocessing``'s spawn) runs without the capture, where
CUDA is not there: its first CUDA call (``torch.cuda._lazy_init``, which every CUDA tensor goes
through) would fail with "Torch not compiled with CUDA enabled" and its memory would be missing from
the trace while the capture said nothing. The capture child puts this folder (which holds nothing
else a script could import) first on the ``PYTHONPATH`` its children inherit and names a report
folder in ``ALLOCSIM_CAPTURE_OUTSIDE``; here,
once torch is imported, that first CUDA call writes a report there (the parent ends the capture
incomplete, naming the process) and raises an error that says why. Nothing else changes: without
``ALLOCSIM_CAPTURE_OUTSIDE`` this file only hands over to the next ``sitecustomize`` on the path,
which it always does (a user's, or the distribution's).
"""

import importlib.machinery
import importlib.util
import os
import sys

ENV_OUTSIDE = "ALLOCSIM_CAPTURE_OUTSIDE"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _report(folder):
    command = " ".join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])[:1000]
    try:
        fd = os.open(os.path.join(folder, f"cuda-{os.getpid()}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
            fh.write(command)
    except OSError:
        pass
    return command


def _watch_cuda(torch, folder):
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not hasattr(cuda, "_lazy_init"):
        return

    def _lazy_init():
        command = _report(folder)
        raise RuntimeError(f"allocsim capture: this process ({command[:200]}) was started by the captured script and "
                           "runs without the capture, so its CUDA work cannot be recorded; allocsim captures the "
                           "script's own process only (the capture ends incomplete and says so)")
    cuda._lazy_init = _lazy_init


class _TorchWatch:
    """A meta-path finder that lets torch load as usual, then watches its first CUDA call."""

    def __init__(self, folder):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, folder = spec.loader.exec_module, self.folder

        def exec_then_watch(module):
            exec_module(module)
            _watch_cuda(module, folder)

        spec.loader.exec_module = exec_then_watch     # this spec's own loader object: torch's __loader__ stays it
        return spec


def _chain():
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    path = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(_HERE)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_folder = os.environ.get(ENV_OUTSIDE, "")
if _folder and os.path.isdir(_folder) and "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchWatch(_folder))
_chain()
