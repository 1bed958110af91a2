"""Run the backward pass with the capture's torch-function mode in place: ``run_backward(mode, func, args, kwargs)``.

``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` hand themselves to the
active torch-function mode first (``has_torch_function``), and a mode's handler runs with the mode
popped: the autograd engine would then run every Python function it calls -- above all the forward
recomputed by ``torch.utils.checkpoint`` (torchtitan's full and selective activation checkpointing,
``checkpoint_wrapper``) -- outside the capture's device mapping, on the CPU code path, so the
recomputation saves other tensors than the forward did (``CheckpointError``). Here the mode is pushed
back for the call and the three functions skip their hand-off for it (their module's
``has_torch_function`` answers False while this thread runs them), so the engine, which carries the
thread's mode stack into the nodes it runs, recomputes under the same mapping as the forward.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
import torch.autograd as autograd_module

#: The functions whose hand-off to the mode is skipped while the mode runs them itself.
ENTRY_POINTS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
_original_check = autograd_module.has_torch_function
_local = threading.local()


def is_entry_point(func: Any) -> bool:
    """Whether ``func`` is one of them, or what ``torch.autograd.backward`` / ``grad`` name now.

    ``torch.autograd.backward`` hands itself to the mode under its module's global name, so a wrapper
    installed there (allocsim's ``roles`` names the backward's requests through one) reaches the mode.
    """
    return func in ENTRY_POINTS or func is autograd_module.backward or func is autograd_module.grad


def _check(*args: Any, **kwargs: Any) -> bool:
    if getattr(_local, "depth", 0):
        return False
    return _original_check(*args, **kwargs)


@contextlib.contextmanager
def _no_hand_off() -> Any:
    _local.depth = getattr(_local, "depth", 0) + 1
    patched = autograd_module.__dict__.get("has_torch_function") is not _check
    if patched:
        autograd_module.has_torch_function = _check
    try:
        yield
    finally:
        _local.depth -= 1


def run_backward(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Call ``func`` (one of ``ENTRY_POINTS``) with ``mode`` on the stack and no hand-off to it."""
    with _no_hand_off(), mode:
        if func is torch.Tensor.backward:
            names = ("gradient", "retain_graph", "create_graph", "inputs")
            given = dict(zip(names, args[1:])) | kwargs
            return torch.autograd.backward(args[0], given.get("gradient"), given.get("retain_graph"),
                                           given.get("create_graph", False), inputs=given.get("inputs"))
        return func(*args, **kwargs)


def restore() -> None:
    """Put torch's own check back (the capture ends)."""
    autograd_module.has_torch_function = _original_check
