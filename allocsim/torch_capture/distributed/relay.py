"""Pipeline stages captured at the same time: ``Relay`` hands each capture the shapes the others send, as they come.

A ``PipelineStage`` learns the shapes of its inputs from the stage before it (``_StageForwardMeta``,
see ``pipelining``). Captured one after the other, a stage's capture gets the messages the earlier
ones sent; captured at once, it asks allocsim's process for them over the capture channel
(``["Q", "pipeline_message:SRC:DST:N"]``: the N-th message from stage SRC to stage DST) and waits
while another capture of the job is still running and may yet send it (one that is not itself waiting
for a message: when every running capture waits, none of them will get one). Every capture of the job
shares one ``Relay`` (threads of ``capture_job``), so the stages run side by side and a stage's
capture waits only for its predecessor's warm-up, not for its whole run. A stage whose predecessor
never sends (its capture failed) gets no answer once no other capture runs, and falls back as a
capture alone does.
"""

from __future__ import annotations

import threading
from typing import Any

#: The question's prefix on the capture channel.
QUESTION = "pipeline_message:"
#: Characters of payload the relay keeps for one job (beyond, messages are dropped: the stage falls back).
MAX_RELAY_CHARS = 64 << 20


def question(src_stage: int, dst_stage: int, index: int) -> str:
    return f"{QUESTION}{int(src_stage)}:{int(dst_stage)}:{int(index)}"


class Relay:
    """The pipeline messages of one job's captures, shared between them (thread-safe)."""

    def __init__(self, messages: list[dict[str, Any]] | None = None):
        self._lock = threading.Lock()
        self._edges: dict[tuple[int, int], list[str]] = {}
        self._chars = 0
        self._running = 0
        # captures (their converters' ids) told to wait, and the message each waits for; one whose message
        # has come since counts as running again
        self._waiting: dict[int, tuple[int, int, int]] = {}
        for m in messages or []:
            self.put(int(m["src_stage"]), int(m["dst_stage"]), str(m["payload"]))

    def put(self, src_stage: int, dst_stage: int, payload: str) -> None:
        with self._lock:
            if self._chars + len(payload) > MAX_RELAY_CHARS:
                return
            self._chars += len(payload)
            queue = self._edges.setdefault((src_stage, dst_stage), [])
            queue.append(payload)
            for asker, (src, dst, index) in list(self._waiting.items()):
                if (src, dst) == (src_stage, dst_stage) and index < len(queue):
                    del self._waiting[asker]

    def started(self) -> None:
        with self._lock:
            self._running += 1

    def finished(self, asker: int | None = None) -> None:
        with self._lock:
            self._running -= 1
            self._waiting.pop(asker, None)

    def answer(self, name: str, asker: int = 0) -> Any:
        """``{"payload": ...}``, ``{"wait": True}`` (a capture that may still send it runs) or None (it will not come)."""
        try:
            src, dst, index = (int(part) for part in name[len(QUESTION):].split(":"))
        except ValueError:
            return None
        with self._lock:
            queue = self._edges.get((src, dst), [])
            if 0 <= index < len(queue):
                self._waiting.pop(asker, None)
                return {"payload": queue[index]}
            self._waiting[asker] = (src, dst, index)
            if self._running > len(self._waiting):
                return {"wait": True}
            del self._waiting[asker]
            return None
