"""Build the compiled readers and the policy kernel with AddressSanitizer + UBSan, in place.

Run from the repository root: ``python tests/fuzz/build_sanitized.py``. It compiles the same
sources as setup.py (every ``csrc/kernel/*.c`` into ``allocsim.policies._kernel``, every
``csrc/readers/*.c`` into ``allocsim.trace._readers``) with GCC and the flags below, replacing the
extensions an editable install built. ``python tests/fuzz/build_sanitized.py --normal`` puts the
ordinary build (setup.py's flags) back, and ``--coverage`` adds edge coverage to the readers
(``-fsanitize-coverage=trace-pc`` and coverage.c here), which the fuzzers use to keep inputs that
reach new code. Python then needs the sanitizer runtimes preloaded; see README.md in this folder.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import sysconfig

FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined",
         "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type"]
EXTENSIONS = {
    "allocsim/policies/_kernel": ("csrc/kernel", sorted(glob.glob("csrc/kernel/*.c"))),
    "allocsim/trace/_readers": ("csrc/readers", sorted(glob.glob("csrc/readers/*.c"))),
}


COVERAGE_RUNTIME = "tests/fuzz/coverage.c"


def build_sanitized(coverage: bool) -> None:
    """Compile each extension with the sanitizer flags (and the readers with coverage) in place."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths()["include"]
    for target, (include_dir, sources) in EXTENSIONS.items():
        extra: list[str] = []
        if coverage and target.endswith("_readers"):
            runtime = os.path.join("build", "fuzz-coverage.o")
            os.makedirs("build", exist_ok=True)
            subprocess.run(["gcc", "-c", "-fPIC", "-O2", COVERAGE_RUNTIME, "-o", runtime], check=True)
            extra = ["-fsanitize-coverage=trace-pc", runtime]
        out = target + suffix
        cmd = ["gcc", "-shared", "-fPIC", *FLAGS, *extra, f"-I{include}", f"-I{include_dir}", *sources, "-o", out]
        print(" ".join(cmd))
        subprocess.run(cmd, check=True)


def build_normal() -> None:
    """Rebuild the extensions with setup.py's own flags (what ``pip install -e .`` makes)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", "."], check=True)


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    if "--normal" in sys.argv[1:]:
        build_normal()
    else:
        build_sanitized(coverage="--coverage" in sys.argv[1:])
