"""The plan search: from a planning request to the fastest plan that fits, judged by the
simulator (which runs the schedule the runtime executes). :func:`search` is its entry point and
:mod:`outcore.search.loop` reads as its outline: layouts over placers over the placements
:mod:`outcore.placers` makes. No torch."""

from outcore.search.loop import search
from outcore.search.verdict import fits

__all__ = ["fits", "search"]
