"""Patch a module when the script first imports it: ``Patches`` applies ``(owner, name, value)`` now or on import.

DTensor, FSDP2 and ``torch.distributed.pipelining`` take seconds to import; a capture of a script
that never uses them must not pay that. Their patches wait for the module: an import hook (a
``sys.meta_path`` finder in front of the others) runs the patch right after the module's own code,
before the script gets it. Everything applied is undone, newest first, when the capture ends.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, Callable

Patch = tuple[Any, str, Any]
_MISSING = object()


class Patches:
    """Attribute patches, applied now or when their module is imported; ``undo()`` restores them all."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._waiting: dict[str, list[Callable[[], list[Patch]]]] = {}
        self._lock = threading.RLock()
        self._finder: _AfterImport | None = None

    def apply(self, patches: list[Patch]) -> None:
        with self._lock:
            for owner, name, value in patches:
                old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
                self._saved.append((owner, name, old))
                setattr(owner, name, value)

    def when_imported(self, module: str, make: Callable[[], list[Patch]]) -> None:
        """Apply ``make()``'s patches once ``module`` is imported (now, if it already is)."""
        if module in sys.modules:
            self.apply(make())
            return
        with self._lock:
            self._waiting.setdefault(module, []).append(make)
            if self._finder is None:
                self._finder = _AfterImport(self)
                sys.meta_path.insert(0, self._finder)

    def _imported(self, module: str) -> None:
        with self._lock:
            makers = self._waiting.pop(module, [])
        for make in makers:
            self.apply(make())

    def waiting(self, module: str) -> bool:
        return module in self._waiting

    def undo(self) -> None:
        with self._lock:
            if self._finder is not None and self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            self._finder = None
            self._waiting.clear()
            for owner, name, old in reversed(self._saved):
                if old is _MISSING:
                    try:
                        delattr(owner, name)
                    except AttributeError:
                        pass
                else:
                    setattr(owner, name, old)
            self._saved.clear()


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patches waiting for it."""

    def __init__(self, loader: Any, patches: Patches, name: str):
        self._loader = loader
        self._patches = patches
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._patches._imported(self._name)

    def __getattr__(self, name: str) -> Any:          # get_source, is_package... as the real loader answers
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches: Patches):
        self._patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not self._patches.waiting(name):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._patches, name)
        return spec
