"""Hand-made timelines for the drawing tests: a 1F1B pipeline computed by hand, no simulator."""

from __future__ import annotations

import numpy as np

from outcore.trace import Event, Timeline


def one_f_one_b(ranks: int = 4, mbs: int = 6, f_s: float = 1e-3, b_s: float = 2e-3,
                comm_s: float = 2e-4, act_bytes: float = 2**27, static_bytes: float = 2**30,
                limit_bytes: float | None = 3 * 2**30, source: str = "simulated",
                jitter: float = 0.0, seed: int = 0) -> Timeline:
    """A 1F1B pipeline of ``ranks`` stages and ``mbs`` micro-batches, timed by dependencies.

    Each rank runs ``ranks - r - 1`` warm-up forwards, then alternates forward and backward.
    Sends of activations (forward) and gradients (backward) take ``comm_s``; every rank ends with
    a gradient all-reduce and an optimizer step. ``jitter`` scales durations randomly (a fake
    "measured" run).
    """
    rng = np.random.default_rng(seed)
    orders = []
    for r in range(ranks):
        warm = min(ranks - r - 1, mbs)
        seq = [("F", m) for m in range(warm)]
        f, b = warm, 0
        while b < mbs:
            if f < mbs:
                seq.append(("F", f))
                f += 1
            seq.append(("B", b))
            b += 1
        orders.append(seq)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * ranks
    pc = [0] * ranks
    events: list[Event] = []
    mem: list[list[tuple[float, float]]] = [[(0.0, static_bytes)] for _ in range(ranks)]
    while any(pc[r] < len(orders[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            if pc[r] == len(orders[r]):
                continue
            op, m = orders[r][pc[r]]
            dep = ("F", r - 1, m) if op == "F" and r > 0 else ("B", r + 1, m) \
                if op == "B" and r < ranks - 1 else None
            if dep is not None and dep not in done:
                continue
            ready = done[dep] + comm_s if dep is not None else 0.0
            start = max(free[r], ready)
            dur = (f_s if op == "F" else b_s) * (1 + jitter * rng.standard_normal())
            end = start + max(dur, 0.1 * f_s)
            events.append(Event(r, op, f"{r}{op}{m}", start, end, "compute", m, r))
            done[(op, r, m)] = end
            mem[r].append((end, act_bytes if op == "F" else -act_bytes))
            peer = r + 1 if op == "F" else r - 1
            if 0 <= peer < ranks:
                tag = "SF" if op == "F" else "SB"
                events.append(Event(r, "send", f"t{min(r, peer)}{tag}{m}", end, end + comm_s,
                                    "comm", m, -1, int(act_bytes)))
            free[r] = end
            pc[r] += 1
            progressed = True
        assert progressed, "hand-made 1F1B deadlocked"
    end_all = max(free)
    for r in range(ranks):
        events.append(Event(r, "allreduce", "AR0", end_all, end_all + 3 * comm_s, "comm",
                            bytes=int(static_bytes / 4)))
        events.append(Event(r, "optim", "OPT", end_all + 3 * comm_s, end_all + 3 * comm_s
                            + 0.3 * f_s, "compute"))
    iteration = end_all + 3 * comm_s + 0.3 * f_s
    memory = []
    for r in range(ranks):
        deltas = sorted(mem[r])
        memory.append((np.array([t for t, _ in deltas]), np.cumsum([d for _, d in deltas])))
    return Timeline(ranks, tuple(sorted(events, key=lambda e: (e.start_s, e.rank))), iteration,
                    tuple(memory), limit_bytes, source, {"schedule": "1f1b", "microbatches": mbs})
