"""Small broadcasts answered with what rank 0 sent: ``BroadcastLog`` (rank 0 records, the other captures replay).

A job often lets one rank decide and tells the others: Megatron-LM builds its data loaders on the
first tensor-parallel rank and broadcasts ``flags = [do_train, do_valid, do_test]`` from rank 0
(megatron/training/training.py ``build_train_valid_test_data_iterators``); the other ranks put
zeros in and read rank 0's answer back. An answering process group alone cannot know what the
source sent, and zeros would make those ranks skip training. So rank 0's capture records every
broadcast it is the source of whose values it knows (host tensors, and device tensors with values
from the data, ``datadep``), small ones only; the later captures of the job get that list
(``capture_dir``) and, at a broadcast they are not the source of, take the next recorded one with
the same group size, source, dtype and shape. Bounded: at most ``MAX_RECORDED`` broadcasts of at
most ``MAX_ELEMENTS`` elements each.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

#: Elements of a broadcast tensor whose values are recorded (flags, counts, small lists).
MAX_ELEMENTS = 64
#: Broadcasts recorded by one capture.
MAX_RECORDED = 1024


def key_of(size: int, root: int, dtype: Any, shape: Any) -> str:
    """What a recorded broadcast must match: group size, source (rank in the group), dtype, shape."""
    return f"{int(size)}|{int(root)}|{dtype}|{tuple(int(d) for d in shape)}"


class BroadcastLog:
    """Records this rank's small broadcasts as the source; answers the others from rank 0's record."""

    def __init__(self, send: Callable[..., None], given: list[dict[str, Any]], values_of: Callable[[Any], Any],
                 set_values: Callable[[Any, Any], None]):
        self._send = send
        self._values_of = values_of
        self._set_values = set_values
        self._lock = threading.Lock()
        self.recorded = 0
        self._queues: dict[str, list[list[Any]]] = {}
        for item in given[:MAX_RECORDED]:
            if isinstance(item, dict) and isinstance(item.get("key"), str) and isinstance(item.get("values"), list):
                self._queues.setdefault(item["key"], []).append(item["values"][:MAX_ELEMENTS])

    def on_broadcast(self, size: int, rank_in_group: int, root: int, tensors: list[Any]) -> None:
        import torch  # noqa: PLC0415

        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() > MAX_ELEMENTS or t.is_complex():
                continue
            with torch._C.DisableTorchFunction():
                # the tensor's real device: under the capture's mode a device tensor may say cuda:N
                on_meta = t.device.type == "meta"
            key = key_of(size, root, t.dtype, t.shape)
            if rank_in_group == root:
                known = t if not on_meta else self._values_of(t)
                with self._lock:
                    if known is None or self.recorded >= MAX_RECORDED:
                        continue
                    self.recorded += 1
                self._send("broadcast", key=key, values=known.detach().reshape(-1).tolist())
                continue
            with self._lock:
                queue = self._queues.get(key)
                values = queue.pop(0) if queue else None
            if values is None or len(values) != t.numel():
                continue
            host = torch.tensor(values, dtype=t.dtype).reshape(t.shape)
            if on_meta:
                self._set_values(t, host)
            else:
                with torch.no_grad():
                    t.copy_(host)
