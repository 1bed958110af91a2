"""``torch.distributed.pipelining`` stages run alone: what their neighbours would send, answered. ``patches(hooks)``.

Before the first step a ``PipelineStage`` (torch/distributed/pipelining/stage.py, torch 2.13) learns
the shapes crossing its boundaries from its neighbours over point-to-point messages, and all stages
vote on how to infer them (``_PipelineSchedule._warmup_p2p``). A rank captured alone has no
neighbours, so:

* **the vote**: every stage votes as this rank's stages do (``InferenceMode.needs_dynamic`` of their
  own metadata), as ranks running the same script do;
* **backward metadata** a stage receives from the next stage (``_StageBackwardMeta``) is the
  gradient metadata of this stage's own outputs (``_derive_grad_metas``; a DTensor output's
  gradient keeps its layout), which is what the next stage computes from the same tensors;
* **forward metadata** a stage receives from the previous stage (``_StageForwardMeta``: that
  stage's outputs) is what the previous stage's capture sent: every stage's sends are facts
  (``message``), and ``allocsim capture`` captures pipeline positions in order, handing each the
  messages the earlier ones sent (``config["messages"]``), or captures them at once and relays each
  message as it is sent (``relay``: the stage asks allocsim's process and waits for it). Where none was recorded (the last
  stage's output feeding rank 0's second virtual stage in an interleaved schedule), the outputs of
  the nearest earlier stage this rank holds stand in, and the trace says so.
"""

from __future__ import annotations

import base64
import dataclasses
import pickle
import time
from typing import Any

#: Largest pickled metadata message kept as a fact.
MAX_MESSAGE_BYTES = 1 << 20


def _grad_meta(meta: Any) -> Any:
    from torch.distributed.pipelining._utils import _derive_grad_metas  # noqa: PLC0415

    if meta is None or not getattr(meta, "requires_grad", False):
        return None
    derived = _derive_grad_metas((meta,))[0]
    if derived is None and dataclasses.is_dataclass(meta):
        try:
            derived = dataclasses.replace(meta, requires_grad=False)
        except (TypeError, ValueError):
            derived = meta
    return derived


def encode(meta: Any) -> str | None:
    try:
        data = pickle.dumps(meta)
    except Exception:  # noqa: BLE001  (metadata of the script's tensors)
        return None
    return base64.b64encode(data).decode("ascii") if len(data) <= MAX_MESSAGE_BYTES else None


def decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text.encode("ascii")))  # noqa: S301  (our own capture's message)


def _relayed(hooks: Any, src_stage: int, dst_stage: int, index: int) -> Any:
    """The ``index``-th message from ``src_stage`` to ``dst_stage`` another capture of the job sent, waiting for it; None if none will come."""
    from .relay import question  # noqa: PLC0415

    delay = 0.01
    while True:
        answer = hooks.tracker.channel.ask(question(src_stage, dst_stage, index))
        if isinstance(answer, dict) and isinstance(answer.get("payload"), str):
            return decode(answer["payload"])
        if not (isinstance(answer, dict) and answer.get("wait")):
            return None
        time.sleep(delay)                  # the stage before this one has not reached its warm-up yet
        delay = min(0.25, delay * 2)


def _incoming(hooks: Any, edge: tuple[int, int], received: dict, relayed: dict, relay: bool,
              outputs_of: dict[int, Any]) -> tuple[Any, bool]:
    """What stage ``edge[1]`` receives from stage ``edge[0]``: ``(message, False)`` as an earlier capture recorded
    it or the relay hands it over, else ``(outputs, True)`` of the nearest earlier stage this rank runs (noted);
    ``RuntimeError`` when there is neither."""
    src, dst = edge
    queue = received.get(edge)
    if queue:
        return decode(queue.pop(0)), False
    if relay:
        meta = _relayed(hooks, src, dst, relayed.get(edge, 0))
        if meta is not None:
            relayed[edge] = relayed.get(edge, 0) + 1
            return meta, False
    earlier = [s for s in outputs_of if s < dst]
    if earlier:
        nearest = max(earlier)
        hooks.tracker.note(f"pipeline stage {dst}'s input shapes were not recorded from stage {src}'s capture: "
                           f"the outputs of stage {nearest} (this rank's) stand in")
        return outputs_of[nearest], True
    raise RuntimeError(f"allocsim capture: pipeline stage {dst} needs the shapes stage {src} sends it, and no "
                       "capture recorded them; give the stage its input_args")


def patches(hooks: Any, messages: list[dict[str, Any]], relay: bool = False) -> list[tuple[Any, str, Any]]:
    """``(owner, name, replacement)`` for the stage's metadata exchange and the schedule's vote."""
    from torch.distributed.pipelining import _utils, schedules  # noqa: PLC0415
    from torch.distributed.pipelining.stage import PipelineStage  # noqa: PLC0415

    if not hasattr(_utils, "InferenceMode"):   # before the metadata exchange of 2.13 (torch 2.6: _shape_inference)
        return shape_inference_patches(hooks, messages, relay)
    InferenceMode, _StageBackwardMeta = _utils.InferenceMode, _utils._StageBackwardMeta  # noqa: N806

    received: dict[tuple[int, int], list[str]] = {}
    relayed: dict[tuple[int, int], int] = {}   # messages taken from the relay per (src, dst)
    for m in messages:
        received.setdefault((int(m["src_stage"]), int(m["dst_stage"])), []).append(str(m["payload"]))
    outputs_of: dict[int, Any] = {}            # stage index -> its output metas, as this rank computed them
    original_send = PipelineStage._send_meta
    original_prepare = PipelineStage._prepare_forward_infra

    def send_meta(stage: Any, meta: Any, dst_stage: int) -> None:
        payload = encode(meta)
        if payload is not None:
            hooks.facts.send("message", src_stage=int(stage.stage_index), dst_stage=int(dst_stage), payload=payload)
        original_send(stage, meta, dst_stage)

    def recv_meta(stage: Any, src_stage: int) -> Any:
        if src_stage > stage.stage_index:      # from the next stage: the gradients of this stage's outputs
            outputs = stage._stage_meta.outputs or ()
            return _StageBackwardMeta(backward_metas=tuple(_grad_meta(m) for m in outputs))
        value, own = _incoming(hooks, (int(src_stage), int(stage.stage_index)), received, relayed, relay, outputs_of)
        if own:
            from torch.distributed.pipelining._utils import _StageForwardMeta  # noqa: PLC0415

            return _StageForwardMeta(forward_metas=value)
        return value

    def prepare_forward_infra(stage: Any, *args: Any, **kwargs: Any) -> Any:
        out = original_prepare(stage, *args, **kwargs)
        if stage._stage_meta.outputs is not None:
            outputs_of[int(stage.stage_index)] = stage._stage_meta.outputs
        return out

    original_warmup = schedules._PipelineSchedule._warmup_p2p

    def warmup_p2p(schedule: Any, stages: list, has_backward: bool, p2p_done: bool) -> None:
        if not all(isinstance(s, PipelineStage) for s in stages):
            return original_warmup(schedule, stages, has_backward, p2p_done)
        dynamic = any(InferenceMode.needs_dynamic(s._user_meta, has_backward) for s in stages)
        for s in stages:
            s._inference_mode = InferenceMode.DYNAMIC if dynamic else InferenceMode.STATIC
        return None

    return [(PipelineStage, "_send_meta", send_meta), (PipelineStage, "_recv_meta", recv_meta),
            (PipelineStage, "_prepare_forward_infra", prepare_forward_infra),
            (schedules._PipelineSchedule, "_warmup_p2p", warmup_p2p)]


def shape_inference_patches(hooks: Any, messages: list[dict[str, Any]], relay: bool = False) -> list[tuple[Any, str, Any]]:
    """Releases whose ``PipelineStage._shape_inference`` (torch 2.6) sends its outputs' metadata to the next
    stage with ``dist.send_object_list`` and receives its inputs' from the previous one with
    ``dist.recv_object_list``: what it sends is a fact, as with 2.13's ``_send_meta``, and what it
    receives is what the previous stage's capture sent (handed on, relayed, or this rank's nearest earlier
    stage's outputs), as 2.13's ``_recv_meta`` above."""
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.pipelining.stage import PipelineStage  # noqa: PLC0415

    received: dict[tuple[int, int], list[str]] = {}
    relayed: dict[tuple[int, int], int] = {}
    for m in messages:
        received.setdefault((int(m["src_stage"]), int(m["dst_stage"])), []).append(str(m["payload"]))
    outputs_of: dict[int, Any] = {}
    original = PipelineStage._shape_inference

    def inputs_from(stage: Any) -> Any:
        return _incoming(hooks, (int(stage.stage_index) - 1, int(stage.stage_index)), received, relayed, relay,
                         outputs_of)[0]

    def shape_inference(stage: Any, args: Any, kwargs: Any = None) -> Any:
        send_objects, recv_objects = dist.send_object_list, dist.recv_object_list

        def send(object_list: list, *a: Any, **k: Any) -> Any:
            payload = encode(object_list[0])
            if payload is not None:
                hooks.facts.send("message", src_stage=int(stage.stage_index), dst_stage=int(stage.stage_index) + 1,
                                 payload=payload)
            return send_objects(object_list, *a, **k)

        def recv(object_list: list, *a: Any, **k: Any) -> Any:
            object_list[0] = inputs_from(stage)
            return None

        dist.send_object_list, dist.recv_object_list = send, recv
        try:
            out = original(stage, args, kwargs)
        finally:
            dist.send_object_list, dist.recv_object_list = send_objects, recv_objects
        if getattr(stage, "_outputs_meta", None) is not None:
            outputs_of[int(stage.stage_index)] = tuple(stage._outputs_meta)
        return out

    return [(PipelineStage, "_shape_inference", shape_inference)]
