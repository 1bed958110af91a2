"""Build allocsim's optional compiled policy kernel (everything else is in pyproject.toml).

The extension is optional: without a C compiler (GCC or Clang: the kernel uses ``__int128`` and
the overflow builtins), or if it fails to build, ``pip install .`` still succeeds and allocsim runs
its pure-Python reference policies (``allocsim --version`` says which).
"""

from setuptools import Extension, setup

KERNEL_SOURCES = ["csrc/module.c", "csrc/freelist.c", "csrc/live.c", "csrc/pool_kernel.c"]
KERNEL_HEADERS = ["csrc/btree.h", "csrc/columns.h", "csrc/freelist.h", "csrc/live.h", "csrc/u64map.h"]

setup(
    ext_modules=[
        Extension(
            "allocsim.policies._kernel",
            sources=KERNEL_SOURCES,
            depends=KERNEL_HEADERS,
            include_dirs=["csrc"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
            optional=True,
        )
    ]
)
