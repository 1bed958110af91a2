"""What a trace states of the GPUs it was recorded on: Kineto's ``deviceProperties`` (name, total memory).

``torch.profiler`` writes one object per visible device, with the CUDA ``totalGlobalMem`` the driver
reported (``cudaGetDeviceProperties``): the memory of the real card, less than its product label. The
file is untrusted, so an entry without an integer ``id`` in range and a positive integer
``totalGlobalMem`` is left out (and counted), never an error: the memory events are the trace.
"""

from __future__ import annotations

from typing import Any

#: More entries than this are not devices of one machine; the rest are ignored.
MAX_DEVICES = 1024
#: CUDA's name field is 256 bytes.
MAX_NAME_CHARS = 256
_MAX_TOTAL_BYTES = 1 << 62


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recorded_devices(value: Any) -> tuple[dict[str, dict[str, Any]], int]:
    """``{str(id): {"name": str, "total_bytes": int}}`` for the usable entries of ``value``, and how many were not."""
    if not isinstance(value, list):
        return {}, 0 if value is None else 1
    devices: dict[str, dict[str, Any]] = {}
    unusable = max(0, len(value) - MAX_DEVICES)
    for entry in value[:MAX_DEVICES]:
        device = _int(entry.get("id")) if isinstance(entry, dict) else None
        total = _int(entry.get("totalGlobalMem")) if isinstance(entry, dict) else None
        if device is None or not 0 <= device < MAX_DEVICES or total is None or not 0 < total < _MAX_TOTAL_BYTES:
            unusable += 1
            continue
        name = entry.get("name")
        # Printable text only: the name goes into one-line verdicts.
        name = "".join(ch for ch in name[:MAX_NAME_CHARS] if ch.isprintable()) if isinstance(name, str) else ""
        devices[str(device)] = {"name": name, "total_bytes": total}
    return devices, unusable
