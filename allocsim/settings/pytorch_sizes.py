"""PyTorch's caching-allocator size constants (``c10/cuda/CUDACachingAllocator.cpp``): import them from here.

They are fixed in PyTorch's source, not settings a user can change, but the settings are checked
against them (``max_split_size_mb`` below 20 MiB is refused) and the policies, the state report and
the readers' start-state inference all follow them: one definition, read by each.
"""

from __future__ import annotations

from ..units import MiB

K_SMALL_SIZE = 1 * MiB        #: largest "small" request: it goes to the small pool
K_SMALL_BUFFER = 2 * MiB      #: small requests are packed into 2 MiB segments (and 2 MiB expandable pages)
K_LARGE_BUFFER = 20 * MiB     #: 1-10 MiB requests get a 20 MiB segment; the smallest max_split_size accepted
K_MIN_LARGE_ALLOC = 10 * MiB  #: requests from here on get their own segment ...
K_ROUND_LARGE = 2 * MiB       #: ... rounded up to 2 MiB
K_MIN_BLOCK_SIZE = 512        #: every block size and address inside a segment is a multiple of this
