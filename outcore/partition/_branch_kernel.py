"""Compiled helpers of :mod:`outcore.partition.branches`: the fork-join region search (one
bounded search per fork over the post-dominator tree) and the feeder closure."""

from __future__ import annotations

import numpy as np

from outcore.partition._jit import njit, njit_borrowing
from outcore.partition._sched_kernel import _fheap_pop, _fheap_push
from outcore.partition.dominators import _lca


@njit_borrowing
def _find(uf, x):
    while uf[x] != x:
        uf[x] = uf[uf[x]]
        x = uf[x]
    return x


@njit
def _grow(arr, need):
    if need <= arr.shape[0]:
        return arr
    out = np.empty(max(need, 2 * arr.shape[0]), arr.dtype)
    out[:arr.shape[0]] = arr
    return out


@njit
def _tree_intervals(parent, root):
    """Preorder entry and exit numbers of the post-dominator tree (children by index)."""
    m = parent.shape[0]
    cnt = np.zeros(m + 1, np.int64)
    for v in range(m):
        if v != root:
            cnt[parent[v] + 1] += 1
    ptr = np.cumsum(cnt)
    fill = ptr[:-1].copy()
    kids = np.empty(max(m - 1, 1), np.int64)
    for v in range(m):  # ascending v: children listed by index
        if v != root:
            kids[fill[parent[v]]] = v
            fill[parent[v]] += 1
    tin = np.zeros(m, np.int64)
    tout = np.zeros(m, np.int64)
    stack = np.empty(m, np.int64)
    pos = ptr[:-1].copy()
    top = 0
    stack[0] = root
    t = 0
    tin[root] = 0
    t = 1
    while top >= 0:
        v = stack[top]
        if pos[v] < ptr[v + 1]:
            c = kids[pos[v]]
            pos[v] += 1
            tin[c] = t
            t += 1
            top += 1
            stack[top] = c
        else:
            tout[v] = t
            top -= 1
    return tin, tout


@njit_borrowing
def _search(f, c, starts, nstart, sid, ptr, idx, rank, stamp, lab, keys, items, uf, buf):
    """Branches of the region from fork ``f``'s successors ``starts`` to the join ``c``.

    A search from the successors, in topological order, stops at ``c``; union-find over the
    successors merges the sets that meet. Gives up as soon as everything has merged into one
    branch. Returns (nodes found, branches left, edge visits); nodes are ``buf[:count]`` and
    ``lab`` holds a union-find label per node.
    """
    size = 0
    nb = 0
    for t in range(nstart):
        s = starts[t]
        stamp[s] = sid
        lab[s] = t
        uf[t] = t
        size = _fheap_push(keys, items, size, float(rank[s]), s)
        buf[nb] = s
        nb += 1
    comps = nstart
    visits = 0
    while size > 0 and comps > 1:
        v = items[0]
        size = _fheap_pop(keys, items, size)
        for k in range(ptr[v], ptr[v + 1]):
            w = idx[k]
            if w == c:
                continue
            visits += 1
            if stamp[w] == sid:
                a = _find(uf, lab[w])
                b = _find(uf, lab[v])
                if a != b:
                    if a < b:
                        uf[b] = a
                    else:
                        uf[a] = b
                    comps -= 1
            else:
                stamp[w] = sid
                lab[w] = _find(uf, lab[v])
                size = _fheap_push(keys, items, size, float(rank[w]), w)
                buf[nb] = w
                nb += 1
    return nb, comps, visits


@njit
def _regions_kernel(forks, ipdom, jump, depth, tin, tout, rank, ptr, idx, sink, max_visits,
                    max_stored):
    """Every useful region of every fork: (fork, join, ptr, nodes, labels, truncated).

    The joins of fork ``f`` are the points where its successors meet in the post-dominator
    tree: the LCAs of successors adjacent in preorder, its immediate post-dominator among them.
    For each join ``c`` the successors below ``c`` (other than ``c``) are searched.
    """
    m = ipdom.shape[0]
    stamp = np.full(m, -1, np.int64)
    lab = np.zeros(m, np.int64)
    keys = np.empty(m, np.float64)
    items = np.empty(m, np.int64)
    uf = np.empty(m, np.int64)
    buf = np.empty(m, np.int64)
    seen = np.full(m, -1, np.int64)
    out_f = np.empty(16, np.int64)
    out_j = np.empty(16, np.int64)
    out_ptr = np.zeros(17, np.int64)
    out_nodes = np.empty(1024, np.int64)
    out_lab = np.empty(1024, np.int64)
    nreg = 0
    visits = 0
    sid = 0
    truncated = False
    succ = np.empty(m, np.int64)
    starts = np.empty(m, np.int64)
    for fi in range(forks.shape[0]):
        f = forks[fi]
        ns = 0
        for k in range(ptr[f], ptr[f + 1]):
            s = idx[k]
            if s != sink and seen[s] != fi:
                seen[s] = fi
                succ[ns] = s
                ns += 1
        if ns < 2:
            continue
        pre = succ[:ns][np.argsort(tin[succ[:ns]])]
        joins = np.empty(ns - 1, np.int64)
        for t in range(ns - 1):
            joins[t] = _lca(pre[t], pre[t + 1], ipdom, jump, depth)
        joins = np.unique(joins)
        for ci in range(joins.shape[0]):
            c = joins[ci]
            nstart = 0
            for t in range(ns):
                s = pre[t]
                if s != c and tin[c] <= tin[s] and tin[s] < tout[c]:
                    starts[nstart] = s
                    nstart += 1
            if nstart < 2:
                continue
            sid += 1
            nb, comps, vis = _search(f, c, starts, nstart, sid, ptr, idx, rank, stamp, lab,
                                     keys, items, uf, buf)
            visits += vis
            if visits > max_visits:
                truncated = True
                break
            if comps < 2:
                continue
            if out_ptr[nreg] + nb > max_stored:
                truncated = True
                break
            out_f = _grow(out_f, nreg + 1)
            out_j = _grow(out_j, nreg + 1)
            out_ptr = _grow(out_ptr, nreg + 2)
            start = out_ptr[nreg]
            out_nodes = _grow(out_nodes, start + nb)
            out_lab = _grow(out_lab, start + nb)
            for t in range(nb):
                out_nodes[start + t] = buf[t]
                out_lab[start + t] = _find(uf, lab[buf[t]])
            out_f[nreg] = f
            out_j[nreg] = c
            out_ptr[nreg + 1] = start + nb
            nreg += 1
        if truncated:
            break
    return (out_f[:nreg].copy(), out_j[:nreg].copy(), out_ptr[:nreg + 1].copy(),
            out_nodes[:out_ptr[nreg]].copy(), out_lab[:out_ptr[nreg]].copy(), truncated)


@njit_borrowing
def _closure_kernel(targets, blocked, mark, stamp, sp, si, pp, pi, stack, out):
    """`outcore.partition.branches._Adjacency.closure` on arrays. ``mark[v]``: ``stamp`` a
    target, ``stamp + 2`` a target whose predecessors were pushed (a target listed twice pushes
    them once, so the stack holds at most one entry per edge), ``stamp + 1`` a node of the
    result. Returns how many nodes it wrote to ``out`` (unsorted)."""
    for i in range(targets.size):
        mark[targets[i]] = stamp
    top = 0
    for i in range(targets.size):
        v = targets[i]
        if mark[v] != stamp:
            continue
        mark[v] = stamp + 2
        for j in range(pp[v], pp[v + 1]):
            u = pi[j]
            if blocked[u] == 0 and mark[u] != stamp and mark[u] != stamp + 2:
                stack[top] = u
                top += 1
    found = 0
    while top > 0:
        top -= 1
        u = stack[top]
        if mark[u] >= stamp or blocked[u] != 0:  # a target, or already in the result
            continue
        ok = True
        for j in range(sp[u], sp[u + 1]):
            if mark[si[j]] < stamp:
                ok = False
                break
        if ok:
            mark[u] = stamp + 1
            out[found] = u
            found += 1
            for j in range(pp[u], pp[u + 1]):
                q = pi[j]
                if mark[q] < stamp and blocked[q] == 0:
                    stack[top] = q
                    top += 1
    return found
