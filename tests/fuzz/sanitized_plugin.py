"""pytest plugin for runs on the sanitizer build: ``pytest -p tests.fuzz.sanitized_plugin ...``.

AddressSanitizer reserves terabytes of address space when a process starts, so a child started
under the attack suite's ``RLIMIT_AS`` cap could not even start. This plugin lets the suite start
its children without that cap; everything else it checks (exit codes, no traceback, one-line
errors, peak RSS within the cap, recounts) still holds.
"""

from __future__ import annotations

import resource

import pytest


class _WithoutAddressSpaceCap:
    """The ``resource`` module, except that an ``RLIMIT_AS`` cap is not set."""

    def __getattr__(self, name: str):
        return getattr(resource, name)

    @staticmethod
    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        if which != resource.RLIMIT_AS:
            resource.setrlimit(which, limits)


@pytest.fixture(autouse=True)
def _no_address_space_cap(request, monkeypatch):
    module = getattr(request, "module", None)
    if module is not None and module.__name__.endswith("test_attack"):
        monkeypatch.setattr(module, "resource", _WithoutAddressSpaceCap())
