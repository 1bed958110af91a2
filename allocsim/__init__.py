"""allocsim: replay real GPU allocation traces through allocator policies and see what memory they need.

Start with ``allocsim.read_trace(path)``; the command line is ``allocsim --help``.
"""

from .trace import EventKind, Trace, read_trace, write_trace

__version__ = "0.1.0"
__all__ = ["EventKind", "Trace", "read_trace", "write_trace", "__version__"]
