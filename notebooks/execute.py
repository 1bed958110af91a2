"""Run notebooks top to bottom and save them with their outputs: ``python notebooks/execute.py notebooks/*.ipynb``.

The notebooks are committed executed, so they read on a code host without running; run this after a
change that moves a number, then commit the result. The kernel is this interpreter, registered under a
temporary ``JUPYTER_PATH`` (needs the test extras: ``pip install -e '.[test]'``). A cell that fails (an
assertion of the text's claims) stops with the error and leaves the file as it was.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

KERNEL = "allocsim-notebooks"


def _kernel_dir() -> Path:
    """A kernelspec that runs ipykernel on this very interpreter."""
    root = Path(tempfile.mkdtemp(prefix="allocsim-kernels-"))
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python",
            "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


def execute(path: Path) -> float:
    """Execute ``path`` in its own folder and write it back with outputs; return the seconds it took."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=600,
                            resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    # The committed notebook names the usual kernel, not the temporary one that ran it.
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    os.environ["JUPYTER_PATH"] = str(_kernel_dir())
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    for name in argv:
        print(f"{name}: {execute(Path(name)):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
