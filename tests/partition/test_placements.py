"""The planners placing side by side (outcore.partition.placements, two threads) give what
they give one at a time: the same placements in the same order, the same notes and refusal,
and the same emulations."""

from __future__ import annotations

import numpy as np
import pytest

import outcore
from outcore.errors import InfeasibleError
from outcore.graph.generators import make
from outcore.partition import placements
from outcore.partition.context import make_context
from outcore.partition.search import AUTO_CANDIDATES


def _placed(g, req, budget, threads, monkeypatch):
    monkeypatch.setattr(placements, "PLANNER_THREADS", threads)
    try:
        placed, notes, error, runs = placements.place(g, req, budget, AUTO_CANDIDATES, True,
                                                      contend=True)
    except InfeasibleError as e:  # (place reports refusals; it raises none of its own)
        return ("raised", str(e))
    after = placements.contended_runs(g, req, placed)  # after the planners, not overlapped
    assert [(em.makespan_s, list(em.busy_s)) for em in runs] == \
        [(em.makespan_s, list(em.busy_s)) for em in after]
    return ([(name, r.strategy, r.assignment.tolist()) for name, r in placed], notes,
            str(error) if error else None, [(em.makespan_s, list(em.busy_s)) for em in runs])


@pytest.mark.parametrize("family", ["nas", "rnn", "unet"])
@pytest.mark.parametrize("share", [1.3, 0.9])
def test_planners_side_by_side_place_as_one_at_a_time(family, share, monkeypatch):
    g = make(family, 400)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    # 0.9 of the fair share: every planner fails under the budget and places under a relaxed
    # one (memory policies may close the gap), or reports why not
    req = outcore.plan_request(3, share * one / 3, bandwidth="16GB/s",
                               memory_policy="auto")
    alone = _placed(g, req, req.memory_bytes, 1, monkeypatch)
    together = _placed(g, req, req.memory_bytes, 2, monkeypatch)
    assert alone == together
    assert len(alone[0]) >= len(AUTO_CANDIDATES)  # every planner placed something


def test_a_bad_thread_count_is_refused_with_its_setting(monkeypatch):
    from outcore.errors import UsageError

    monkeypatch.setenv("OUTCORE_PLANNER_THREADS", "two")
    with pytest.raises(UsageError, match="OUTCORE_PLANNER_THREADS='two'"):
        placements.planner_threads()
    monkeypatch.setenv("OUTCORE_PLANNER_THREADS", "1")
    assert placements.planner_threads() == 1


def test_placements_alike_are_emulated_once(monkeypatch):
    """Planners that agree (pardnn and pipeline on a chain) cost one contended emulation, and
    each placement gets the emulation its own run would give."""
    import importlib

    from outcore.partition.emulate import run

    emulate = importlib.import_module("outcore.partition.emulate")
    g = make("unet", 1500)
    req = outcore.plan_request(4, None, bandwidth="16GB/s")
    placed, _, _ = placements.place(g, req, None, AUTO_CANDIDATES, True)
    twice = placed + placed[:2]
    calls = []
    monkeypatch.setattr(emulate, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    runs = placements.contended_runs(g, req, twice)
    distinct = {r.assignment.tobytes() for _, r in placed}
    assert len(calls) == len(distinct) < len(twice)
    assert runs[-2] is runs[0] and runs[-1] is runs[1]
    for item, em in zip(twice, runs):
        own = placements.contended_runs(g, req, [item])[0]
        assert em.makespan_s == own.makespan_s and np.array_equal(em.busy_s, own.busy_s)
