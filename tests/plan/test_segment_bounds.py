"""The compiled segmentation of many pieces at once (``segment_bounds``, which memory-policy
pricing uses) cuts every piece as ``policies.segments`` cuts it alone."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.plan.pieces_kernel import segment_bounds
from outcore.plan.policies import segments


@pytest.mark.parametrize("seed", range(6))
def test_segment_bounds_cut_each_row_as_segments_does(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, size=30)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    weights = rng.choice([0.0, 1.0, 3.0, 1e6, 0.5], size=int(ptr[-1]))
    weights[ptr[3]:ptr[4]] = 0.0  # a row that weighs nothing: equal lengths
    weights[ptr[5]:ptr[6]] = 7.0  # equal weights: ties on every threshold
    counts = rng.integers(1, 9, size=sizes.size).astype(np.int64)
    rows = np.sort(rng.choice(sizes.size, size=20, replace=False)).astype(np.int64)
    start, row = segment_bounds(ptr, rows, weights, counts)
    nodes = np.arange(int(ptr[-1])) * 10  # any values: segments splits them by position
    for r in rows.tolist():
        mine = start[row == r]
        ends = np.append(mine[1:], ptr[r + 1])
        got = [nodes[a:b] for a, b in zip(mine.tolist(), ends.tolist())]
        want = segments(nodes[ptr[r]:ptr[r + 1]], int(counts[r]), weights[ptr[r]:ptr[r + 1]])
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert set(row.tolist()) == set(rows.tolist())
