"""A trace or a capture folder, opened the one way every command does: ``open_capture_folder(path)``.

``allocsim capture`` of a distributed job writes a folder: one trace per role of ranks and
``manifest.json`` (``allocsim.torch_capture.distributed.manifest``). ``run``, ``advise``,
``report`` and ``fit`` take such a folder wherever they take a trace and answer per role; this
module is where a path is recognised as one and where each role's trace path comes from (a plain
file name in the folder, checked when the manifest is read).
"""

from __future__ import annotations

import dataclasses
import os

from .torch_capture.distributed.manifest import Manifest, RoleEntry, is_capture_folder


@dataclasses.dataclass
class CaptureFolder:
    """A folder of per-role captures and its manifest."""

    path: str
    manifest: Manifest

    @property
    def roles(self) -> list[RoleEntry]:
        """The roles that have a trace (a capture that could not start has none)."""
        return [r for r in self.manifest.roles if r.trace]

    def trace_path(self, role: RoleEntry) -> str:
        """The file of ``role``'s trace (the manifest's plain name, in the folder)."""
        if not role.trace:
            raise ValueError(f"{self.path}: role of ranks {role.to_dict()['ranks_text']} has no trace")
        return os.path.join(self.path, role.trace)


def is_capture_folder_path(path: str) -> bool:
    """Whether ``path`` names a capture folder (and not a trace file)."""
    return isinstance(path, str) and is_capture_folder(path)


def open_capture_folder(path: str) -> CaptureFolder:
    """The folder at ``path`` with its checked manifest (ValueError with one line when it is not one)."""
    manifest = Manifest.read(path)
    folder = CaptureFolder(path, manifest)
    if not folder.roles:
        raise ValueError(f"{path}: no role has a trace (the captures did not start: see manifest.json)")
    for role in folder.roles:
        trace = folder.trace_path(role)
        if not os.path.isfile(trace):
            raise ValueError(f"{path}: {role.trace} (ranks {role.to_dict()['ranks_text']}) is missing")
    return folder
