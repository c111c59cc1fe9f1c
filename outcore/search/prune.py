"""Which of a layout's placements the simulator judges: those of the few placers fastest by
the node-level emulator with port contention and every contiguous split, minus those the
emulation already puts too far behind the best simulated plan (no torch)."""

from __future__ import annotations

__all__ = ["PRUNE_RATIO", "SIMULATED_PER_SEARCH", "not_simulated", "to_simulate"]


# the placements the simulator may judge: those of the few planners fastest by the emulator,
# and every contiguous split (the simple plans the search must never lose to); any of them the
# estimate puts past PRUNE_RATIO x the best simulated plan is still skipped
SIMULATED_PER_SEARCH = 2


def to_simulate(placed: list, est: list[float], always: frozenset[str]) -> set[int]:
    """Indices of the placements that may be simulated: those of the placers named in
    ``always`` (the contiguous splits), and of the few other placers whose first placement is
    fastest by ``est`` (the emulator with port contention; a placer may offer a near-tie the
    emulator cannot tell apart)."""
    first: dict[str, int] = {}
    for k, (name, _) in enumerate(placed):
        first.setdefault(name, k)
    others = sorted((k for name, k in first.items() if name not in always),
                    key=lambda k: (est[k], k))
    names = {placed[k][0] for k in others[:SIMULATED_PER_SEARCH]} | always
    return {k for k, (name, _) in enumerate(placed) if name in names}


# a placement is not simulated when the emulator with port contention finds it this many times
# slower than the best simulated plan that fits: the contended emulation is at most 1.12x the
# simulated time over 299 placements of five graph families (benchmarks/
# emulator_vs_simulator.py: 3k and 10k nodes, 16 and 300 GB/s, 1 and 4 micro-batches), so a
# placement past 1.2x the best cannot be faster. (It under-estimates by up to 1.6x: the
# per-piece overhead of fine-grained placements, 1F1B against its all-forwards-first order.)
PRUNE_RATIO = 1.2


def not_simulated(name: str, result, est: float, chosen: bool, bound: float | None,
                   beat_s: float | None, replicas: int) -> tuple[str, bool] | None:
    """Why :func:`~outcore.search.placement.best_placement` does not simulate a placement
    emulated at ``est`` seconds (with port contention; as ``replicas`` replicas, at least their
    busiest device's compute), and whether it lost to ``beat_s``; None: simulate it."""
    if not chosen:
        return (f"{name}: emulated {result.makespan_s * 1e3:.2f} ms per iteration "
                f"({est * 1e3:.2f} ms with port contention), not simulated (slower than the "
                "best by the emulator)", False)
    if replicas > 1 and beat_s is not None and est >= beat_s:
        return (f"{name}: its {replicas} replicas take at least {est * 1e3:.2f} ms (the "
                f"contended emulation, and the compute of its busiest device over them), no "
                f"faster than another layout's plan ({beat_s * 1e3:.2f} ms); not simulated",
                True)
    if bound is not None and est > PRUNE_RATIO * bound:
        whose = "another layout's plan" if bound == beat_s else \
            "the best simulated plan that fits"
        return (f"{name}: emulated {est * 1e3:.2f} ms per iteration with port contention, "
                f"over {PRUNE_RATIO}x {whose} ({bound * 1e3:.2f} ms); not simulated",
                bound == beat_s)
    return None
