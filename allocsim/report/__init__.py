"""``allocsim report``: one self-contained, offline HTML page of a trace's replays (see ``build``)."""

from .build import build_report

__all__ = ["build_report"]
