"""A capture's stand-in for a PyTorch function takes exactly that function's arguments: ``conform(original, impl)``.

Scripts call ``torch.cuda`` and ``torch.accelerator`` with keywords as well as positions
(``torch.cuda.stream(stream=s)`` in timm's prefetcher, ``torch.cuda.synchronize(device=0)``,
``torch.cuda.memory._record_memory_history(max_entries=100000)``), so a stand-in written with its
own parameter names or a catch-all ``*args`` either refuses a call the GPU accepts or accepts one
it refuses. ``conform`` reads the installed torch's signature of the function it replaces (names,
kinds, defaults), binds every call to it (the same ``TypeError`` for a wrong call) and passes
``impl`` the bound arguments with torch's defaults filled in, positionally where torch's are
positional. The stand-in's ``inspect.signature`` is torch's, so the capture's tests compare every
stand-in with the function it replaces. Where torch's function is a C builtin Python cannot read a
signature from, the stand-in's own signature (written to match the builtin) takes its place.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable


def signature_of(original: Any) -> inspect.Signature | None:
    """``inspect.signature`` of ``original`` (a class: its ``__new__`` or ``__init__`` written in Python), None when it has none."""
    if isinstance(original, type):
        for name in ("__new__", "__init__"):
            for klass in original.__mro__:
                member = klass.__dict__.get(name)
                if member is not None and (inspect.isfunction(member) or isinstance(member, staticmethod)):
                    signature = inspect.signature(member.__func__ if isinstance(member, staticmethod) else member)
                    parameters = list(signature.parameters.values())[1:]      # cls / self
                    return signature.replace(parameters=parameters)
        return None
    try:
        return inspect.signature(original)
    except (TypeError, ValueError):           # a builtin without a text signature
        return None


def conform(original: Any, impl: Callable[..., Any]) -> Callable[..., Any]:
    """``impl`` behind ``original``'s signature: calls are bound to it, defaults applied, and passed on as bound."""
    signature = signature_of(original)
    if signature is None:
        # A C builtin without a text signature (torch 2.14's ``torch.cuda._exchange_device`` is
        # ``torch._C._cuda_exchangeDevice`` itself, where 2.13 wraps it in Python): the stand-in's
        # own signature, written as the builtin takes its arguments, is the one calls are bound to.
        signature = inspect.signature(impl)

    def shim(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return impl(*bound.args, **bound.kwargs)

    shim.__signature__ = signature            # type: ignore[attr-defined]
    shim.__name__ = getattr(original, "__name__", "shim")
    shim.__qualname__ = getattr(original, "__qualname__", shim.__name__)
    shim.__module__ = getattr(original, "__module__", None) or __name__
    shim.__doc__ = getattr(original, "__doc__", None)
    return shim


def noop(*_args: Any, **_kwargs: Any) -> None:
    """What a stand-in does when the GPU call has no effect a capture can show (seeds, NVTX ranges, profiler switches)."""
    return None
