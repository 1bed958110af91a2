"""Allocator policies: build one by name with ``build_policy(name, device=..., params=...)``.

``policy_specs()`` lists every registered policy and its parameters. Policies are plain
synchronous objects (see ``base.Policy``); presets are configurations of the generic pool in
``pool.py`` built from the free list (``freelist.py``) and growth rules (``growth.py``).
"""

from typing import Any

from .base import Policy

_REGISTRY_NAMES = {"ParamSpec", "PolicySpec", "accepted_params", "build_policy", "parse_param", "policy_specs"}
__all__ = ["Policy", *sorted(_REGISTRY_NAMES)]


def __getattr__(name: str) -> Any:
    # The registry imports every policy and the adaptors, and the adaptors import ``base``: loading
    # it lazily lets ``allocsim.policies.adaptors`` be imported first without a circular import.
    if name in _REGISTRY_NAMES:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
