"""Weakly connected components (vectorised) against a plain union-find."""

import numpy as np
from hypothesis import given, settings, strategies as st

from outcore.graph import build
from outcore.graph.algorithms import weakly_connected_components


def reference(n, src, dst, keep):
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in zip(src, dst):
        if keep[a] and keep[b]:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    labels, seen = [], {}
    for i in range(n):
        labels.append(seen.setdefault(find(i), len(seen)) if keep[i] else -1)
    return labels


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60),
    st.lists(st.booleans(), min_size=n, max_size=n))))
def test_components_match_union_find(case):
    n, pairs, keep = case
    edges = sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})  # acyclic: low -> high
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    g = build("g", fwd_s=np.ones(n), src=src, dst=dst)
    got = weakly_connected_components(g, np.array(keep)).tolist()
    assert got == reference(n, src, dst, keep)


def test_long_chain_is_one_component():
    n = 5000
    g = build("chain", fwd_s=np.ones(n), src=np.arange(n - 1)[::-1], dst=np.arange(1, n)[::-1])
    assert (weakly_connected_components(g) == 0).all()
