"""triton's active driver during a capture: what the GPU's answers without a CUDA driver, the rest as triton's own.

Before 3.4, ``@triton.autotune`` asks the active driver for its benchmarker when the decorated kernel is
defined (``Autotuner.__init__``: ``driver.active.get_benchmarker()``; triton-lang/triton#6570 made it lazy),
so importing a module that defines an autotuned kernel creates triton's CUDA driver, which compiles its
``cuda_utils`` against ``libcuda.so`` -- there on the GPU, absent where a capture runs ("libcuda.so cannot
found!"). torch 2.6 pins triton 3.2, and torch 2.6's ``torch._inductor`` (which torchao imports) cannot
import 3.4 (``AttrsDescriptor``), so torchtitan's ``torchtitan/models/norms.py`` under torch 2.6 stops the
capture at its import. During a capture ``driver.active`` answers ``get_benchmarker()`` as
``CudaDriver.get_benchmarker`` does (``triton.testing.do_bench``, a function nothing calls until a kernel
is tuned) and leaves everything else to triton's own driver, created when first asked, as before.
"""

from __future__ import annotations

import sys
from typing import Any

MODULE = "triton.runtime.driver"


class CaptureDriver:
    """``driver.active`` of a capture: the benchmarker without a driver, any other attribute from ``real``."""

    def __init__(self, real: Any):
        self._real = real

    def get_benchmarker(self) -> Any:
        from triton.testing import do_bench  # noqa: PLC0415  (CudaDriver.get_benchmarker's answer)
        return do_bench

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def patches() -> list[tuple[Any, str, Any]]:
    """The patch of ``triton.runtime.driver``'s ``driver.active`` (none when it has no such attribute)."""
    config = getattr(sys.modules.get(MODULE), "driver", None)
    active = getattr(config, "__dict__", {}).get("active")
    if active is None or isinstance(active, CaptureDriver):
        return []
    return [(config, "active", CaptureDriver(active))]
