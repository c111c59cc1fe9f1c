"""The compiled cut (hop levels + union-find, vectorised members and transfers) against a plain
reference: the definition in ``outcore.plan.pieces`` written out with Python loops, including
the relay of a tensor several pieces of one device take from another device."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.graph.algorithms import topological_order
from outcore.graph.generators import make
from outcore.plan.pieces import cut


def reference_cut(g, assignment, groups=None):
    """(pieces as (device, hop, nodes, group), transfers as (src, dst, tensors, bytes, local))."""
    n = g.num_nodes
    key = assignment if groups is None else assignment * (int(groups.max()) + 2) + groups + 1
    sends = [False] * n
    for e in range(g.num_edges):
        if assignment[g.src[e]] != assignment[g.dst[e]]:
            sends[int(g.src[e])] = True
    order = topological_order(g).tolist()
    preds = [[] for _ in range(n)]
    succs = [[] for _ in range(n)]
    for e in range(g.num_edges):
        preds[int(g.dst[e])].append(int(g.src[e]))
        succs[int(g.src[e])].append(int(g.dst[e]))
    hop = [0] * n
    for v in order:
        hop[v] = max([hop[u] + (key[u] != key[v] or sends[u]) for u in preds[v]], default=0)
    senders = {(key[v], hop[v]) for v in range(n) if sends[v]}
    earliest = list(hop)
    for v in reversed(order):
        # a node that sends nothing runs just in time for its earliest consumer when a message
        # of its key departs in between; a source whose consumers share its key always does
        if sends[v] or not succs[v]:
            continue
        low = min(hop[w] - (key[w] != key[v]) for w in succs[v])
        between = any((key[v], h) in senders for h in range(earliest[v], low))
        alone = not preds[v] and all(key[w] == key[v] for w in succs[v])
        if low > earliest[v] and (between or alone):
            hop[v] = low
    label = list(range(n))

    def find(x):
        while label[x] != x:
            x = label[x]
        return x

    for e in range(g.num_edges):
        a, b = int(g.src[e]), int(g.dst[e])
        if key[a] == key[b] and hop[a] == hop[b]:
            ra, rb = find(a), find(b)
            label[max(ra, rb)] = min(ra, rb)
    pos = {v: i for i, v in enumerate(order)}
    comps = {}
    for v in order:
        comps.setdefault(find(v), []).append(v)
    ranked = sorted(comps.values(), key=lambda m: (hop[m[0]], pos[m[0]]))
    piece_of = {v: k for k, m in enumerate(ranked) for v in m}
    pieces = [(int(assignment[m[0]]), hop[m[0]], tuple(m),
               int(groups[m[0]]) if groups is not None else -1) for m in ranked]
    crossing = {}
    for e in range(g.num_edges):
        a, b = piece_of[int(g.src[e])], piece_of[int(g.dst[e])]
        if a != b:
            d = crossing.setdefault((a, b), {})
            d[int(g.src[e])] = max(d.get(int(g.src[e]), 0), int(g.edge_bytes[e]))
    # a tensor crosses to a device once: the first of that device's pieces taking it from
    # another device receives it (at the largest of their edges) and hands it on locally
    takers = {}
    for (a, b), t in crossing.items():
        for u, nbytes in t.items():
            if pieces[a][0] != pieces[b][0]:
                takers.setdefault((u, pieces[b][0]), []).append((b, a, nbytes))
    for (u, _), rows in takers.items():
        rows.sort()
        first_b, _, _ = rows[0]
        crossing[(rows[0][1], first_b)][u] = max(nbytes for _, _, nbytes in rows)
        for b, a, nbytes in rows[1:]:
            del crossing[(a, b)][u]
            crossing.setdefault((first_b, b), {})[u] = nbytes
    transfers = [(a, b, tuple(sorted(t)), sum(t.values()), pieces[a][0] == pieces[b][0])
                 for (a, b), t in sorted(crossing.items()) if t]
    return pieces, transfers


@pytest.mark.parametrize("family", ["transformer", "unet", "rnn", "nas", "resnet"])
def test_cut_matches_the_reference(family):
    g = make(family, 400)
    rng = np.random.default_rng(7)
    n = g.num_nodes
    cases = [(np.zeros(n, np.int64), None),
             (rng.integers(0, 3, n), None),
             (np.minimum(np.arange(n) * 3 // n, 2)[np.argsort(np.argsort(topological_order(g)))],
              rng.integers(-1, 2, n))]
    for a, groups in cases:
        got = cut(g, a, groups)
        pieces, transfers = reference_cut(g, a, groups)
        assert [(p.device, p.hop, p.nodes, p.group) for p in got.pieces] == pieces
        assert [(t.src, t.dst, t.tensors, t.bytes, t.local) for t in got.transfers] == transfers
        assert all(got.piece_of[v] == p.id for p in got.pieces for v in p.nodes)
