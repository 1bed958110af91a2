"""The value syntax the settings readers share: ``finite_number(key, token)`` reads a setting's number."""

from __future__ import annotations

from ..errors import quote


def finite_number(key: str, token: str) -> float:
    """``token`` as a float, or one ``ValueError`` line naming ``key`` (NaN and infinities refused).

    PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` and Paddle's ``FLAGS_`` read numbers the same way
    (``strtod`` / gflags' double); a value that is not finite would poison every later comparison.
    """
    try:
        value = float(token)
    except ValueError:
        raise ValueError(f"{key} takes a number, got {quote(token)}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{key} takes a finite number, got {quote(token)}")
    return value
