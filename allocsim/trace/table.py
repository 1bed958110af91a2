"""One schema table as numpy columns: read ``table["size_bytes"]`` without importing pandas.

Readers build their tables as ``Table``s; ``Trace`` turns one into a pandas DataFrame
(``Table.frame()``) only when code asks for the DataFrame, so a command that needs only columns
(``allocsim info``) never pays for importing pandas. The DataFrame is built from the very arrays
the table holds, exactly as ``frame_from_columns`` always built it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Columns a caller may leave out of ``Table.of``: filled with this value.
OPTIONAL_COLUMNS = {"stack_id": -1}

_OBJECT = np.dtype("object")


class Table:
    """Columns of one schema table, in schema order: ``table[name]`` is a numpy array, ``len(table)`` its rows."""

    __slots__ = ("dtypes", "columns")

    def __init__(self, columns: dict[str, Any], dtypes: dict[str, np.dtype]):
        self.dtypes = dtypes
        #: name -> numpy array (a text column may be a pandas string array from ``text_column``).
        self.columns = columns

    @classmethod
    def of(cls, columns: dict[str, Any], dtypes: dict[str, np.dtype]) -> "Table":
        """Cast column sequences to the schema dtypes; optional columns (``stack_id``) missing are filled.

        A text column may be given as ``text_column``'s result and is kept as it is.
        """
        missing = set(dtypes) - set(columns) - set(OPTIONAL_COLUMNS)
        if missing:
            raise ValueError(f"missing columns: {sorted(missing)}")
        n_rows = len(next(iter(columns.values()))) if columns else 0
        out = {}
        for name, dtype in dtypes.items():
            if name in columns:
                values = columns[name]
                if dtype == _OBJECT and _is_extension_array(values):
                    out[name] = values
                else:
                    out[name] = np.asarray(values, dtype=dtype)
            else:
                out[name] = np.full(n_rows, OPTIONAL_COLUMNS[name], dtype=dtype)
        return cls(out, dtypes)

    @classmethod
    def empty(cls, dtypes: dict[str, np.dtype]) -> "Table":
        """A table with the schema's columns and no rows."""
        return cls({name: np.empty(0, dtype=dtype) for name, dtype in dtypes.items()}, dtypes)

    @classmethod
    def from_frame(cls, frame: Any, dtypes: dict[str, np.dtype]) -> "Table":
        """The columns of a DataFrame (no copy; text columns as object arrays)."""
        return cls({name: frame[name].to_numpy() for name in frame.columns}, dtypes)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        values = self.columns[name]
        if isinstance(values, np.ndarray):
            return values
        return values.to_numpy()      # a pandas string array: object array of str, as a DataFrame gives

    @property
    def names(self) -> list[str]:
        """Column names, in order."""
        return list(self.columns)

    def concat(self, other: "Table") -> "Table":
        """This table's rows, then ``other``'s (as ``pd.concat(..., ignore_index=True)`` of the two)."""
        return Table({name: np.concatenate([self[name], other[name]]) for name in self.columns}, self.dtypes)

    def with_column(self, name: str, values: np.ndarray) -> "Table":
        """A copy of this table with column ``name`` replaced by ``values`` (cast to its dtype)."""
        return Table({**self.columns, name: np.asarray(values, dtype=self.dtypes[name])}, self.dtypes)

    def with_optional_columns(self) -> "Table":
        """This table with any missing optional column added (default value), in schema order."""
        if all(name in self.columns for name in self.dtypes):
            return self
        out = dict(self.columns)
        for name, default in OPTIONAL_COLUMNS.items():
            if name in self.dtypes and name not in out:
                out[name] = np.full(len(self), default, dtype=self.dtypes[name])
        order = [c for c in self.dtypes if c in out] + [c for c in out if c not in self.dtypes]
        return Table({c: out[c] for c in order}, self.dtypes)

    def frame(self) -> Any:
        """The pandas DataFrame of these columns (imports pandas; the arrays are shared, not copied)."""
        import pandas as pd

        # copy=False: one block per column, no consolidation copy (the arrays are fresh, ours to keep).
        return pd.DataFrame(dict(self.columns), copy=False)

    def check(self, name: str) -> None:
        """Raise ``ValueError`` if a column is missing or has the wrong dtype (``check_schema`` for tables)."""
        if list(self.columns) != list(self.dtypes):
            raise ValueError(f"{name}: columns {list(self.columns)} != {list(self.dtypes)}")
        for col, dtype in self.dtypes.items():
            got = self.columns[col].dtype
            if got == dtype or (dtype == _OBJECT and _is_extension_array(self.columns[col])):
                continue
            raise ValueError(f"{name}.{col}: dtype {got} != {dtype}")


def _is_extension_array(values: Any) -> bool:
    """True for a pandas ExtensionArray (a text column), without importing pandas to ask."""
    return not isinstance(values, (np.ndarray, list, tuple)) and hasattr(values, "take") and hasattr(values, "to_numpy")
