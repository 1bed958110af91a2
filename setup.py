"""Build allocsim's optional compiled code (everything else is in pyproject.toml).

Two extensions, both optional: the policy kernel (``allocsim.policies._kernel``) and the readers'
compiled halves (``allocsim.trace._readers``). Without a C compiler (GCC or Clang: the kernel uses
``__int128`` and the overflow builtins), or if one fails to build, ``pip install .`` still succeeds
and allocsim runs its pure-Python reference code (``allocsim --version`` says which).
"""

from setuptools import Extension, setup

KERNEL_SOURCES = ["csrc/kernel/module.c", "csrc/kernel/freelist.c", "csrc/kernel/live.c", "csrc/kernel/pool_kernel.c"]
#: Both extensions hash keys a trace file chooses with the same SipHash-1-3.
COMMON_HEADERS = ["csrc/common/siphash.h"]
KERNEL_HEADERS = ["csrc/kernel/btree.h", "csrc/kernel/columns.h", "csrc/kernel/freelist.h", "csrc/kernel/live.h",
                  "csrc/kernel/u64map.h", *COMMON_HEADERS]
READER_SOURCES = ["csrc/readers/module.c", "csrc/readers/pvm.c", "csrc/readers/snapshot_scan.c",
                  "csrc/readers/records.c", "csrc/readers/chrome_scan.c",
                  "csrc/readers/op_sweep.c", "csrc/readers/rmm_scan.c",
                  "csrc/readers/events_check.c"]
READER_HEADERS = ["csrc/readers/rd_common.h", "csrc/readers/pvm.h", *COMMON_HEADERS]
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
            "-Wno-cast-function-type"]

setup(
    ext_modules=[
        Extension(
            "allocsim.policies._kernel",
            sources=KERNEL_SOURCES,
            depends=KERNEL_HEADERS,
            include_dirs=["csrc/kernel"],
            extra_compile_args=["-O2", *WARNINGS],
            optional=True,
        ),
        Extension(
            "allocsim.trace._readers",
            sources=READER_SOURCES,
            depends=READER_HEADERS,
            include_dirs=["csrc/readers"],
            extra_compile_args=["-O2", *WARNINGS],
            optional=True,
        ),
    ]
)
