"""The compiled list scheduler (outcore.schedule._list_kernel) runs the tasks in the order of
its plain-Python twin (outcore.schedule.build._ListState), ties included."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from outcore.graph.generators import make
from outcore.plan.pieces import cut
from outcore.schedule.costs import piece_costs

build = importlib.import_module("outcore.schedule.build")  # the module, not the function


def _python_order(pieces, ranks, M, kind, costs, link_time):
    state = build._ListState(pieces, ranks, M, kind, costs, link_time)
    for _ in range(2 * len(pieces.pieces) * M):
        state.run_next()
    return state.order


@pytest.mark.parametrize("family", ["nas", "unet", "transformer"])
def test_the_compiled_list_scheduler_runs_tasks_in_the_reference_order(family):
    rng = np.random.default_rng(7)
    g = make(family, 400)
    cases = 0
    for ranks in (2, 3):
        scattered = rng.integers(0, ranks, g.num_nodes)
        stages = np.arange(g.num_nodes) * ranks // g.num_nodes
        for a in (scattered, stages):
            pieces = cut(g, a)
            costs = piece_costs(g, pieces, ranks)
            # equal durations everywhere: every choice is decided by the tie rules
            flat = type(costs)(**{**costs.__dict__, "fwd_s": np.ones_like(costs.fwd_s),
                                  "bwd_s": np.full_like(costs.bwd_s, 2.0)})
            for c in (costs, flat):
                def link_time(x, y, nbytes):  # direction-dependent, to catch a swap
                    return 1e-4 * (1 + (x > y)) + nbytes / 1e9
                for M in (1, 3):
                    for kind in ("1f1b", "gpipe"):
                        want = _python_order(pieces, ranks, M, kind, c, link_time)
                        got = build._compiled_list_schedule(pieces, ranks, M, kind, c,
                                                            link_time)
                        assert got == want, (ranks, M, kind)
                        cases += 1
    assert cases == 32
