"""Name each device storage by what the script made it: ``Roles(tracker).install()`` inside the capture.

The capture sees what a trace's stacks can only guess: every ``nn.Parameter`` and buffer a module
registers (PyTorch's global registration hooks: the modules are kept, weakly, and their
``_parameters`` and ``_buffers`` read at each checkpoint, since ``Module._apply`` (``.cuda()``,
``.to()``, ``.half()``) puts new tensors there without registering them again), every ``.grad``, every tensor in an optimizer's
state (its step hooks) and when the autograd engine or an optimizer is running. At each optimizer
step and after each ``backward()`` it names the storages it finds: ``parameter`` (a parameter or a
module buffer), ``gradient`` (a parameter's ``.grad``), ``optimizer_state``. Workspaces are named
where they are made (``tracker.scratch``); everything else is named by ``allocsim capture`` from the
phase it was made in (see ``allocsim.torch_capture.session``).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch

from .tracker import StorageTracker


class _WeakIdSet:
    """Objects held weakly and compared by identity (tensors compare elementwise, so ``WeakSet`` cannot hold them)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, item: Any) -> None:
        key = id(item)
        if key not in self._refs:
            self._refs[key] = weakref.ref(item, lambda _ref, key=key: self._refs.pop(key, None))

    def __iter__(self) -> Iterator[Any]:
        for ref in list(self._refs.values()):
            item = ref()
            if item is not None:
                yield item


class Roles:
    """Tracks parameters, buffers and optimizers; ``checkpoint()`` sends the categories it can name now."""

    def __init__(self, tracker: StorageTracker):
        self.tracker = tracker
        # parameters are found through their modules and optimizers, never held: a weak reference on a
        # tensor makes torch.utils.swap_tensors refuse it (torch 2.6's FSDPModule.to_empty swaps DTensor parameters)
        self.modules = _WeakIdSet()
        self.optimizers = _WeakIdSet()

    def _on_parameter(self, module: Any, name: str, param: Any) -> None:
        self.modules.add(module)

    def _on_buffer(self, module: Any, name: str, buffer: Any) -> None:
        self.modules.add(module)

    def checkpoint(self) -> None:
        """Name the storages of every known parameter, buffer, gradient and optimizer state as they are now."""
        categorize = self.tracker.categorize
        params: dict[int, Any] = {}
        for module in self.modules:
            for param in list(getattr(module, "_parameters", {}).values()):
                if isinstance(param, torch.Tensor):
                    params.setdefault(id(param), param)
            for buffer in list(getattr(module, "_buffers", {}).values()):
                if isinstance(buffer, torch.Tensor):
                    categorize(buffer, "parameter")
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for param in group.get("params", ()):
                    if isinstance(param, torch.Tensor):
                        params.setdefault(id(param), param)
        for param in params.values():
            categorize(param, "parameter")
            if param.grad is not None:
                categorize(param.grad, "gradient")
        for optimizer in self.optimizers:
            for state in list(optimizer.state.values()):
                for value in state.values() if isinstance(state, dict) else ():
                    if isinstance(value, torch.Tensor):
                        categorize(value, "optimizer_state")

    def _before_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.optimizers.add(optimizer)
        self.checkpoint()
        self.tracker.flags.optimizer += 1

    def _after_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.tracker.flags.optimizer = max(0, self.tracker.flags.optimizer - 1)
        self.checkpoint()

    @contextlib.contextmanager
    def installed(self) -> Iterator["Roles"]:
        """Register the hooks (and wrap ``torch.autograd.backward``) for the block."""
        from torch.nn.modules import module as module_mod  # noqa: PLC0415
        from torch.optim.optimizer import (register_optimizer_step_post_hook,  # noqa: PLC0415
                                           register_optimizer_step_pre_hook)

        handles = [module_mod.register_module_parameter_registration_hook(self._on_parameter),
                   module_mod.register_module_buffer_registration_hook(self._on_buffer),
                   register_optimizer_step_pre_hook(self._before_step)]
        # registered first so that it runs before the step-counting hook, which may end the script
        handles.append(register_optimizer_step_post_hook(self._after_step))
        backward = torch.autograd.backward

        def backward_and_name(*args: Any, **kwargs: Any) -> Any:
            try:
                return backward(*args, **kwargs)
            finally:
                self.checkpoint()

        torch.autograd.backward = backward_and_name
        try:
            yield self
        finally:
            torch.autograd.backward = backward
            for handle in handles:
                handle.remove()
