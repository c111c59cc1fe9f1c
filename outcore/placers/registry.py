"""The placers by name: each placer is one module with a :class:`Placer` registered by
:func:`register`; ``outcore plan --strategy`` and ``outcore.strategies()`` list this registry.

A placer puts every node of a graph on one of K devices under a memory limit and is judged by
the node-level emulator (:mod:`outcore.placers.emulate`); the plan search above it
(:mod:`outcore.search`) simulates the best placements and chooses among them. Adding a placer
is one module and one registration:

    from outcore.placers import Placement, Placer, register
    from outcore.placers.result import evaluate

    class Striped(Placer):
        name = "striped"
        summary = "node i on device i mod K"

        def place(self, ctx, seed):
            a = np.arange(ctx.g.num_nodes) % ctx.devices
            cand = evaluate(ctx, a, "striped")
            return Placement(cand if cand.fits else None, [], [cand])

    register(Striped)

then ``outcore.plan(g, 4, "16GiB", strategy="striped")``. The package's own placers are
registered by :mod:`outcore.placers` in a fixed order: the order ``auto`` runs them in and
breaks ties by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from outcore.errors import InfeasibleError, UsageError
from outcore.placers.context import Context
from outcore.placers.feasibility import infeasible
from outcore.placers.result import Candidate

__all__ = ["Placement", "Placer", "always_simulated", "auto_placers", "get_placer",
           "placer_names", "register", "strategies", "unregister"]


@dataclass
class Placement:
    """What a placer found.

    Attributes:
        best: the placement it chooses among those that fit; None when none fits.
        notes: what it did and decided, one line each (kept in the plan's notes).
        considered: every placement it evaluated (the refusal names the least memory any of
            them needed).
    """

    best: Candidate | None
    notes: list[str] = field(default_factory=list)
    considered: list[Candidate] = field(default_factory=list)


class Placer:
    """One placement algorithm. Subclasses set :attr:`name` and :attr:`summary` and implement
    :meth:`place`; the other members have defaults.

    Attributes:
        name: what ``--strategy`` calls it.
        summary: one line for ``--help`` and ``outcore.strategies()``.
        in_auto: ``strategy="auto"`` runs it (and compares its placements with the others').
        inflight: the memory model its placement is judged by: ``all`` (every micro-batch's
            activations held at once) or ``1f1b`` (a pipeline's in-flight micro-batches).
        fixed: its placement ignores the memory limit (a baseline): a refusal then names the
            device count with which ``pardnn`` or ``pipeline`` fit.
        always_simulated: the search simulates every placement it offers, however the
            emulator ranks them (the simple splits no plan may be slower than).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    in_auto: ClassVar[bool] = False
    inflight: ClassVar[str] = "all"
    fixed: ClassVar[bool] = False
    always_simulated: ClassVar[bool] = False

    def place(self, ctx: Context, seed: int) -> Placement:
        """Place ``ctx.g`` on at most ``ctx.devices`` devices under ``ctx.memory_bytes``;
        ``seed`` for randomised placers."""
        raise NotImplementedError

    def offers(self, ctx: Context, placed: Placement) -> list[tuple[Candidate, list[str]]]:
        """The placements the search should judge with the simulator, each with its notes:
        the best one, unless the placer knows the emulator cannot tell some apart."""
        assert placed.best is not None
        return [(placed.best, placed.notes)]

    def refusal(self, ctx: Context, placed: Placement) -> InfeasibleError:
        """Why nothing fits, with the device count and memory that would."""
        peaks = [float(c.peak_bytes.max()) for c in placed.considered]
        return infeasible(ctx, self.name, min(peaks) if peaks else None,
                          inflight=self.inflight, own_placement=not self.fixed)


_PLACERS: dict[str, Placer] = {}


def register(placer: type[Placer] | Placer, *, replace: bool = False) -> type[Placer] | Placer:
    """Add a placer (a :class:`Placer` subclass or instance) under its ``name``; usable as a
    class decorator. ``replace``: allow a name already registered."""
    instance = placer() if isinstance(placer, type) else placer
    name = instance.name
    if not name or not isinstance(name, str) or name in ("auto", "single"):
        raise UsageError(f"a placer needs a name other than auto and single, got {name!r}")
    if name in _PLACERS and not replace:
        raise UsageError(f"a placer named {name!r} is registered already: pick another name, "
                         "or pass replace=True")
    _PLACERS[name] = instance
    return placer


def unregister(name: str) -> None:
    """Remove a placer (tests that register their own)."""
    _PLACERS.pop(name, None)


def get_placer(name: str) -> Placer:
    """The placer registered as ``name``."""
    try:
        return _PLACERS[name]
    except KeyError:
        raise UsageError(f"unknown strategy {name!r}: use one of {', '.join(_PLACERS)}") \
            from None


def placer_names() -> list[str]:
    """Every registered placer, in registration order."""
    return list(_PLACERS)


def auto_placers() -> tuple[str, ...]:
    """The placers ``strategy="auto"`` runs, in registration order."""
    return tuple(n for n, p in _PLACERS.items() if p.in_auto)


def always_simulated() -> frozenset[str]:
    """The placers whose every placement the search simulates."""
    return frozenset(n for n, p in _PLACERS.items() if p.always_simulated)


def strategies() -> dict[str, str]:
    """Each registered placer's name and summary."""
    return {n: p.summary for n, p in _PLACERS.items()}
