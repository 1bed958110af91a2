"""Refuse a capture folder before any capture when writing it would destroy something: ``check_job_folder(path)``.

The folder follows ``output_file.check_output_folder``: its parent must exist, it must be a folder
if it exists, and the files a capture writes there (``manifest.json``, ``rankN.parquet``,
``rankN.log``) may only replace files allocsim wrote (a log is ours when it starts with
``LOG_HEADER``).
"""

from __future__ import annotations

import os
import re

from ...output_file import check_output_folder
from .manifest import MANIFEST

#: First line of every log a capture writes for a rank (the mark that lets a later capture replace it).
LOG_HEADER = "# allocsim capture: output of rank "
_OURS = re.compile(r"rank\d+\.(parquet|log)")


def check_job_folder(path: str, shown: str) -> None:
    """ValueError (one line) unless a distributed capture may write ``path``."""
    names = [MANIFEST]
    if os.path.isdir(path):
        names += [n for n in os.listdir(path) if _OURS.fullmatch(n) and n.endswith(".parquet")]
        for name in os.listdir(path):
            if _OURS.fullmatch(name) and name.endswith(".log"):
                target = os.path.join(path, name)
                try:
                    with open(target, encoding="utf-8", errors="replace") as fh:
                        ours = fh.read(len(LOG_HEADER)) == LOG_HEADER
                except OSError:
                    ours = False
                if not ours and os.path.getsize(target):
                    raise ValueError(f"-o {shown}: {target} exists and is not a log allocsim capture wrote; "
                                     "refusing to replace it (remove it or choose another folder)")
    check_output_folder(path, files=names)
