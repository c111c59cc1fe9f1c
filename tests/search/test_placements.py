"""The planners placing side by side (outcore.search.threads, two threads) give what
they give one at a time: the same placements in the same order, the same notes and refusal,
and the same emulations."""

from __future__ import annotations

import numpy as np
import pytest

import outcore
from outcore.errors import InfeasibleError
from outcore.graph.generators import make
from outcore.placers import auto_placers
from outcore.placers.context import make_context
from outcore.search import threads as placements


def _placed(g, req, budget, threads, monkeypatch):
    monkeypatch.setattr(placements, "PLANNER_THREADS", threads)
    try:
        placed, notes, error, runs = placements.place(g, req, budget, auto_placers(), True,
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
    assert len(alone[0]) >= len(auto_placers())  # every planner placed something


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
    from outcore.placers.emulate import run

    g = make("unet", 1500)
    req = outcore.plan_request(4, None, bandwidth="16GB/s")
    placed, _, _ = placements.place(g, req, None, auto_placers(), True)
    twice = placed + placed[:2]
    calls = []
    monkeypatch.setattr(placements, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    runs = placements.contended_runs(g, req, twice)
    distinct = {r.assignment.tobytes() for _, r in placed}
    assert len(calls) == len(distinct) < len(twice)
    assert runs[-2] is runs[0] and runs[-1] is runs[1]
    for item, em in zip(twice, runs):
        own = placements.contended_runs(g, req, [item])[0]
        assert em.makespan_s == own.makespan_s and np.array_equal(em.busy_s, own.busy_s)


def _layout_search(family, threads, monkeypatch):
    monkeypatch.setattr(placements, "PLANNER_THREADS", threads)
    g = make(family, 1500)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(4, 1.25 * one / 4, bandwidth="16GB/s", search_layout=True,
                               tp=None, depth=None)
    p = outcore.plan(g, req)
    return (p.assignment.tolist(), p.layout, p.predicted["iteration_s"], p.notes,
            p.extra["candidates"])


@pytest.mark.parametrize("family", ["nas", "rnn", "transformer"])
def test_the_next_layouts_placements_made_ahead_change_nothing(family, monkeypatch):
    """The layout search starts the next layout's placements while it simulates the current
    one's (placements.place_ahead): with two planner threads the plan, its notes and every
    layout's record are those of one thread, where nothing starts ahead."""
    taken = []
    take = placements.SharedThreads.take

    def counted(self, key):
        found = take(self, key)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(placements.SharedThreads, "take", counted)
    alone = _layout_search(family, 1, monkeypatch)
    assert not any(taken)  # one thread: nothing is started ahead
    together = _layout_search(family, 2, monkeypatch)
    assert alone == together
    if family == "nas":  # its layouts are planned one after another, each started ahead
        assert sum(taken) >= 2, taken


def test_placements_started_ahead_serve_only_the_same_call(monkeypatch):
    """place takes what place_ahead started only for the same graph, request, budget, planners
    and flags; another call places afresh. Either way the result is a fresh place's."""
    monkeypatch.setattr(placements, "PLANNER_THREADS", 2)
    g = make("nas", 600)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(2, 0.55 * one, bandwidth="16GB/s")

    def shown(out):
        placed, notes, error, runs = out
        return ([(n, r.assignment.tolist()) for n, r in placed], notes, str(error),
                [em.makespan_s for em in runs])

    fresh = {b: shown(placements.place(g, req, b, auto_placers(), True, contend=True))
             for b in (req.memory_bytes, None)}
    with placements.shared_threads() as threads:
        assert placements.place_ahead(g, req, req.memory_bytes, auto_placers(), True,
                                      contend=True)
        other = placements.place(g, req, None, auto_placers(), True, contend=True)
        assert len(threads.ahead) == 1  # another budget: not taken
        same = placements.place(g, req, req.memory_bytes, auto_placers(), True, contend=True)
        assert not threads.ahead
    assert shown(other) == fresh[None] and shown(same) == fresh[req.memory_bytes]
    assert fresh[None] != fresh[req.memory_bytes]  # the budgets place differently
