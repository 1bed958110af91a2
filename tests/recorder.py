"""Write synthetic PyTorch snapshots as the real allocator would record them (for tests)."""

from __future__ import annotations

import pickle
from pathlib import Path

BASE = 0x7F00_0000_0000
S1, S2 = 0x1111, 0x2222


def rnd(size: int) -> int:
    return max(512, -(-size // 512) * 512)


class Recorder:
    """Write a snapshot as PyTorch would: trace entries plus the final segments (every block)."""

    def __init__(self):
        self.entries: list[dict] = []
        self.t_us = 1_700_000_000_000_000
        self.segments: dict[int, list] = {}      # addr -> [size, stream, pool]
        self.live: dict[int, list] = {}          # addr -> [block size, requested, state]

    def _entry(self, action: str, addr: int, size: int, stream: int, **extra) -> None:
        self.t_us += 10
        entry = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": self.t_us,
                 "frames": []}
        entry.update(extra)
        if action == "oom":
            del entry["addr"]
        self.entries.append(entry)

    # the state before the window (no entries)
    def before(self, addr: int, size: int, stream: int, blocks=(), pool: str = "large") -> None:
        self.segments[addr] = [size, stream, pool]
        for baddr, bsize, requested in blocks:
            self.live[baddr] = [bsize, requested, "active_allocated"]

    # what the real allocator recorded
    def segment_alloc(self, addr: int, size: int, stream: int, pool: str = "large") -> None:
        self._entry("segment_alloc", addr, size, stream)
        self.segments[addr] = [size, stream, pool]

    def segment_free(self, addr: int) -> None:
        size, stream, _pool = self.segments.pop(addr)
        self._entry("segment_free", addr, size, stream)

    def alloc(self, addr: int, size: int, stream: int, block: int | None = None) -> None:
        self._entry("alloc", addr, size, stream)
        self.live[addr] = [block or rnd(size), size, "active_allocated"]

    def free_requested(self, addr: int, stream: int) -> None:
        self._entry("free_requested", addr, self.live[addr][1], stream)
        self.live[addr][2] = "active_pending_free"

    def free_completed(self, addr: int, stream: int) -> None:
        self._entry("free_completed", addr, self.live.pop(addr)[1], stream)

    def free(self, addr: int, stream: int) -> None:
        self.free_requested(addr, stream)
        self.free_completed(addr, stream)

    def oom(self, size: int, stream: int, device_free: int) -> None:
        self._entry("oom", -1, size, stream, device_free=device_free)

    def dump(self, path: Path) -> Path:
        segments = []
        for addr, (size, stream, pool) in sorted(self.segments.items()):
            blocks, cursor = [], addr
            for baddr in sorted(a for a in self.live if addr <= a < addr + size):
                bsize, requested, state = self.live[baddr]
                if baddr > cursor:
                    blocks.append({"address": cursor, "size": baddr - cursor, "requested_size": 0,
                                   "state": "inactive", "frames": []})
                blocks.append({"address": baddr, "size": bsize, "requested_size": requested, "state": state,
                               "frames": []})
                cursor = baddr + bsize
            if cursor < addr + size:
                blocks.append({"address": cursor, "size": addr + size - cursor, "requested_size": 0,
                               "state": "inactive", "frames": []})
            segments.append({"device": 0, "address": addr, "total_size": size, "stream": stream,
                             "segment_type": pool, "segment_pool_id": (0, 0), "is_expandable": False,
                             "allocated_size": 0, "active_size": 0, "requested_size": 0, "frames": [],
                             "blocks": blocks})
        data = {"segments": segments, "device_traces": [self.entries],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0, "expandable_segments": False}}
        path.write_bytes(pickle.dumps(data, protocol=4))
        return path
