"""Lone surrogates in a trace's text are replaced at read time, once, for every reader: ``repair_surrogates(trace)``.

A lone surrogate (``\\ud800``: one half of a UTF-16 pair) is not text: no UTF-8 file, terminal or
Arrow column can hold one, yet a pickle (whose strings are decoded "surrogatepass", on both the
compiled and the reference route) and a JSON ``\\ud800`` escape (Kineto, Paddle, allocsim CSV's
header) both make one. ``read_trace`` hands every reader's trace to ``repair_surrogates``: each
string that holds one (frame file and function names, op names, step labels, notes, recorded
settings and device names) gets U+FFFD in its place, a pair split in two is joined back first, and
the trace gets a note saying how many strings were repaired. Repaired, not refused: these strings
are names and labels, never a number the replay uses, so one bad character does not cost the trace;
the note says what changed, and ``run``, ``info``, ``report`` and ``convert`` never meet one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..table import Table

#: Nesting walked in the metadata at most (readers bound it already: ``Limits.depth``).
_MAX_DEPTH = 100


def has_surrogate(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (ASCII text is ruled out without encoding it)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def repair(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a high and low half in a row become their character)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _repair_array(values: np.ndarray) -> int:
    """Repair an object array of strings in place; the number of strings changed."""
    try:
        suspects = [i for i, ascii_only in enumerate(map(str.isascii, values)) if not ascii_only]
    except TypeError:       # not all strings (a column another reader filled with None): look at each
        suspects = [i for i, v in enumerate(values) if isinstance(v, str) and not v.isascii()]
    changed = 0
    for i in suspects:
        if has_surrogate(values[i]):
            values[i] = repair(values[i])
            changed += 1
    return changed


def repair_value(value: Any, depth: int = 0) -> tuple[Any, int]:
    """(``value`` with its strings repaired, how many were), through dicts and lists (changed in place)."""
    if isinstance(value, str):
        return (repair(value), 1) if has_surrogate(value) else (value, 0)
    if depth >= _MAX_DEPTH:
        return value, 0
    if isinstance(value, list):
        changed = 0
        for i, item in enumerate(value):
            value[i], n = repair_value(item, depth + 1)
            changed += n
        return value, changed
    if isinstance(value, dict):
        changed = 0
        out = {}
        for key, item in value.items():
            key, n_key = repair_value(key, depth + 1)
            out[key], n_item = repair_value(item, depth + 1)
            changed += n_key + n_item
        return (out, changed) if changed else (value, 0)
    return value, 0


def repair_surrogates(trace: Any) -> int:
    """Replace every lone surrogate in ``trace``'s text (see module doc); note and return how many strings changed."""
    from ..schema import _HELD, TABLE_DTYPES

    changed = 0
    for name, dtypes in TABLE_DTYPES.items():
        held = trace.__dict__[_HELD + name]
        for col, dtype in dtypes.items():
            if dtype != np.dtype(object):
                continue
            values = held.columns[col] if isinstance(held, Table) else held[col].array
            if isinstance(values, np.ndarray):
                changed += _repair_array(values)
            elif not isinstance(held, Table) and held[col].dtype == np.dtype(object):
                column = held[col].to_numpy(copy=True)
                n = _repair_array(column)
                if n:
                    held[col] = column
                    changed += n
            # (a pandas string column is Arrow, which cannot hold a lone surrogate: nothing to repair)
    trace.labels, n = repair_value(list(trace.labels))
    changed += n
    meta = trace.meta
    for field in ("source", "notes", "repairs", "version_hints", "allocator_settings", "device_properties"):
        value, n = repair_value(getattr(meta, field))
        if n:
            setattr(meta, field, value)
            changed += n
    # ``meta.recorded`` is inferred from the file's numbers; only its copy of the settings is file text,
    # counted above (walking the rest, 100k recorded OOMs and all, would cost a second per large trace).
    for run in meta.recorded.values():
        if isinstance(run, dict) and run.get("settings") is not None:
            run["settings"] = repair_value(run["settings"])[0]
    if changed:
        meta.notes.append(surrogate_note(changed))
    return changed


def surrogate_note(count: int) -> str:
    """The note a trace gets when ``count`` of its strings were repaired."""
    held = "1 string held a lone surrogate" if count == 1 else f"{count:,} strings held lone surrogates"
    return f"{held} (half of a UTF-16 pair, which is not text): each was replaced by U+FFFD"
