"""ParDNN's memory repair (outcore.partition.pardnn_memory): the consumer counts its greedy
keeps in place stay exact (the repair does not count them again after each relief), and a
repair that reports a fit fits."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.graph.generators import make
from outcore.partition import pardnn_memory
from outcore.partition.context import make_context


@pytest.mark.parametrize("family", ["nas", "rnn", "unet", "transformer"])
@pytest.mark.parametrize("share", [1.25, 1.6])
def test_the_counts_relief_keeps_are_the_counts_of_its_assignment(family, share, monkeypatch):
    g = make(family, 800)
    k = 3
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    ctx = make_context(g, k, memory_bytes=share * one / k)
    relieve = pardnn_memory._relieve
    checked = []

    def checking(d, need, limit, a, mem, cnt, *rest):
        moved = relieve(d, need, limit, a, mem, cnt, *rest)
        want = pardnn_memory._consumer_counts(g.src, g.dst, a, g.num_nodes, k)
        np.testing.assert_array_equal(cnt, want)
        checked.append(moved)
        return moved

    monkeypatch.setattr(pardnn_memory, "_relieve", checking)
    # every node on one device: the repair builds a split from nothing, moving many nodes
    a, stats = pardnn_memory.repair_memory(ctx, np.zeros(g.num_nodes, np.int64))
    assert sum(checked) > 10 and stats.moved_nodes > 10
    assert stats.fits == ctx.fits(ctx.memory(a))
