"""``stream-bound``: per-stream pools whose free blocks go back to the stream that allocated them.

This is the PyTorch / CuPy / Paddle stream rule in isolation: a segment belongs to the stream whose
request created it, a freed block returns to that stream's pool when its free completes, and a
request searches only its own stream's pool. Memory cached for stream A is invisible to stream B:
``stranded_bytes(B)`` reports how much that is, so metrics can show what stream binding costs.

With ``cross_stream_reuse=True`` a request that misses its own pool may take a block other
streams freed before growing (RMM's pool does this after a ``cudaStreamWaitEvent``); only completed
frees are ever in a pool, so such reuse is safe in the model. The block still belongs to its owner.
"""

from __future__ import annotations

from typing import Any

from ..units import MiB
from .freelist import FreeList
from .pool import PoolPolicy


class StreamBoundPolicy(PoolPolicy):
    """Best fit per stream: frees return to the allocating stream's pool; ``stranded_bytes()`` shows the cost."""

    name = "stream-bound"

    def __init__(self, upstream: Any, *, alignment_bytes: int = 512, growth: str = "exact",
                 chunk_bytes: int = 2 * MiB, min_split_remainder_bytes: int = 512,
                 cross_stream_reuse: bool = False, oom_release: str = "all"):
        super().__init__(upstream, alignment_bytes=alignment_bytes, growth=growth, chunk_bytes=chunk_bytes,
                         min_split_remainder_bytes=min_split_remainder_bytes, stream_bound=True,
                         oom_release=oom_release)
        self.cross_stream_reuse = cross_stream_reuse
        self.n_cross_stream_hits = 0
        self._attach_kernel()

    def _find_elsewhere(self, pool: FreeList, stream_key: int, size_bytes: int) -> tuple[int, int] | None:
        if not self.cross_stream_reuse:
            return None
        best = -1
        owner = stream_key
        # Best fit over the other streams, ties to the lowest stream id then address.
        for other in sorted(pool.stream_keys()):
            if other == stream_key:
                continue
            key = pool.best_fit(other, size_bytes)
            if key >= 0 and (best < 0 or key < best):
                best, owner = key, other
        if best < 0:
            return None
        self.n_cross_stream_hits += 1
        return best, owner

    def params(self) -> dict[str, Any]:
        out = super().params()
        out["cross_stream_reuse"] = self.cross_stream_reuse
        return out
