"""Times of tensor-parallel collectives (:mod:`outcore.cost.tensor`) on a link (pure).

All-reduce by :func:`outcore.sim.collectives.allreduce_s` (ring or recursive halving-doubling,
Thakur et al. 2005); all-gather and reduce-scatter by the ring's ``p - 1`` steps of ``n / p``
bytes (:func:`outcore.sim.collectives.ring_reduce_scatter_s`).
"""

from __future__ import annotations

from typing import Iterable

from outcore.cost.tensor import Collective
from outcore.hardware.spec import LinkSpec
from outcore.sim.collectives import allreduce_s, ring_reduce_scatter_s

__all__ = ["collective_s", "phase_s"]


def collective_s(c: Collective, link: LinkSpec, algorithm: str = "auto") -> float:
    """Seconds ``c`` takes over ``link``."""
    if c.kind == "all_reduce":
        return allreduce_s(c.nbytes, c.ranks, link, algorithm)
    return ring_reduce_scatter_s(c.nbytes, c.ranks, link)


def phase_s(collectives: Iterable[Collective], phase: str, link: LinkSpec,
            algorithm: str = "auto") -> float:
    """Total seconds of the ``phase`` (``fwd``/``bwd``) collectives, run one after another."""
    return sum(collective_s(c, link, algorithm) for c in collectives if c.phase == phase)
