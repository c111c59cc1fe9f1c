"""Compiled helpers of :mod:`outcore.placers.subgraph.branches`: the fork-join region search (one
bounded search per fork over the post-dominator tree) and the feeder closure."""

from __future__ import annotations

import numpy as np

from outcore.graph.heap import heap_pop as _fheap_pop, heap_push as _fheap_push
from outcore.placers._jit import njit, njit_borrowing
from outcore.placers.subgraph.dominators import lca


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
def tree_intervals(parent, root):
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
def regions_kernel(forks, ipdom, jump, depth, tin, tout, rank, ptr, idx, sink, max_visits,
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
            joins[t] = lca(pre[t], pre[t + 1], ipdom, jump, depth)
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
def closure_kernel(targets, blocked, mark, stamp, sp, si, pp, pi, stack, out, count):
    """`outcore.placers.subgraph.branches._Adjacency.closure` on arrays: the nodes, not blocked nor
    targets, whose successors all lie in the targets or the result, grown upward from the
    targets. ``mark[v]``: ``stamp`` a target, ``stamp + 2`` a target counted at its
    predecessors (a target listed twice counts once), ``stamp + 1`` a node of the result,
    ``stamp + 3`` a node counting (``count[v]``) its out-edges into the set so far; callers
    advance ``stamp`` by 4. Each node joining the set counts once at each predecessor, so the
    walk is linear in the edges (a walk that rechecked every successor whenever one joined
    was quadratic in a node's fan-out: the weight an RNN layer reads at each of 3k steps,
    1.9 s on a 1M-node grid's coarse graph). Returns how many nodes it wrote to ``out``
    (unsorted)."""
    for i in range(targets.size):
        mark[targets[i]] = stamp
    top = 0
    for i in range(targets.size):
        v = targets[i]
        if mark[v] == stamp:
            mark[v] = stamp + 2
            stack[top] = v
            top += 1
    found = 0
    while top > 0:
        top -= 1
        v = stack[top]
        for j in range(pp[v], pp[v + 1]):
            u = pi[j]
            if blocked[u] != 0 or (mark[u] >= stamp and mark[u] != stamp + 3):
                continue  # blocked, a target, or in the result already
            if mark[u] != stamp + 3:
                mark[u] = stamp + 3
                count[u] = 0
            count[u] += 1
            if count[u] == sp[u + 1] - sp[u]:
                mark[u] = stamp + 1
                out[found] = u
                found += 1
                stack[top] = u
                top += 1
    return found


@njit_borrowing
def _own(label, lo, hi, nodes, value):
    """``label[nodes[lo:hi]] = value``."""
    for k in range(lo, hi):
        label[nodes[k]] = value


@njit
def _side_components(side, sp, si, comp_of):
    """The weakly connected components among the nodes ``side`` (sorted), by least node, as
    ``(members, cptr)``: component ``c``'s nodes are ``side[members[cptr[c]:cptr[c + 1]]]``,
    ascending. ``comp_of``: scratch, -1 for every node, left so."""
    nside = side.shape[0]
    for i in range(nside):
        comp_of[side[i]] = side[i]
    for i in range(nside):
        v = side[i]
        for j in range(sp[v], sp[v + 1]):
            if comp_of[si[j]] >= 0:
                a = _find(comp_of, v)
                c = _find(comp_of, si[j])
                if a < c:
                    comp_of[c] = a
                elif c < a:
                    comp_of[a] = c
    root = np.empty(nside, np.int64)
    for i in range(nside):
        root[i] = _find(comp_of, side[i])
    for i in range(nside):
        comp_of[side[i]] = -1
    members = np.argsort(root, kind="mergesort")
    cptr = np.zeros(nside + 1, np.int64)
    ncomp = 0
    for k in range(nside):
        if k > 0 and root[members[k]] != root[members[k - 1]]:
            ncomp += 1
            cptr[ncomp] = k
    if nside:
        ncomp += 1
        cptr[ncomp] = nside
    return members, cptr[:ncomp + 1]


@njit
def _sole_feeders(side, members, cptr, sp, si, owner, hits):
    """Per component of :func:`_side_components`, the branch (``owner`` of a consumer) it
    feeds when that is the only branch its nodes feed, else -1. ``hits``: scratch."""
    assign = np.full(cptr.shape[0] - 1, -1, np.int64)
    for c in range(cptr.shape[0] - 1):
        nh = 0
        for k in range(cptr[c], cptr[c + 1]):
            v = side[members[k]]
            for j in range(sp[v], sp[v + 1]):
                o = owner[si[j]]
                if o >= 0:
                    seen = False
                    for q in range(nh):
                        if hits[q] == o:
                            seen = True
                            break
                    if not seen:
                        hits[nh] = o
                        nh += 1
        if nh == 1:
            assign[c] = hits[0]
    return assign


@njit
def _fed_rows(b0, b1, tptr, tmp, side, members, cptr, assign, fed_ptr, fed_nodes, nfed,
              blocked):
    """Each branch ``b0 .. b1 - 1``'s feeders, sorted, written from ``fed_nodes[nfed]`` on
    (``fed_ptr[b + 1]`` their end): its closure ``tmp[tptr[b]:tptr[b + 1]]`` and the side
    components :func:`_sole_feeders` gave it; each is blocked for later regions. Returns the
    new ``nfed``."""
    by_branch = np.argsort(assign, kind="mergesort")  # components by the branch they feed
    nxt = 0
    while nxt < by_branch.shape[0] and assign[by_branch[nxt]] < 0:
        nxt += 1
    for b in range(b0, b1):
        start = nfed
        for k in range(tptr[b], tptr[b + 1]):
            fed_nodes[nfed] = tmp[k]
            nfed += 1
        while nxt < by_branch.shape[0] and assign[by_branch[nxt]] == b - b0:
            c = by_branch[nxt]
            for k in range(cptr[c], cptr[c + 1]):
                fed_nodes[nfed] = side[members[k]]
                nfed += 1
            nxt += 1
        fed_nodes[start:nfed] = np.sort(fed_nodes[start:nfed])
        fed_ptr[b + 1] = nfed
        _own(blocked, start, nfed, fed_nodes, 1)
    return nfed


@njit
def feeders_kernel(n, forks, joins, int_ptr, int_nodes, rb_ptr, br_ptr, br_nodes, sp, si, pp,
                    pi):
    """`outcore.placers.subgraph.branches.attach_feeders` on arrays (for
    :meth:`outcore.placers.subgraph.region_sets.RegionSet.with_feeders`): for the chosen
    regions in order (interiors ``int_nodes[int_ptr[r]:int_ptr[r + 1]]``, branches
    ``rb_ptr[r]:rb_ptr[r + 1]``
    of ``br_ptr`` / ``br_nodes``), each branch's feeders (the closure of its nodes, and the
    side components that feed it alone) and each region's extra side branches. Returns
    ``(fed_ptr, fed_nodes, ex_rptr, ex_ptr, ex_nodes)``: per branch its feeders, sorted; per
    region its range of extra branches, each sorted, ordered by their smallest node."""
    R = forks.shape[0]
    blocked = np.zeros(n, np.uint8)  # the regions' forks, joins and interiors, then feeders
    for r in range(R):
        _own(blocked, int_ptr[r], int_ptr[r + 1], int_nodes, 1)
        for end in (forks[r], joins[r]):
            if end >= 0:
                blocked[end] = 1
    mark = np.full(n, -1, np.int64)
    count = np.zeros(n, np.int64)
    stack = np.empty(n + 1, np.int64)  # a closure pushes each node once
    out = np.empty(n + 1, np.int64)
    owner = np.full(n, -1, np.int64)
    comp_of = np.full(n, -1, np.int64)
    B = br_ptr.shape[0] - 1
    fed_ptr = np.zeros(B + 1, np.int64)
    fed_nodes = np.empty(n, np.int64)
    ex_rptr = np.zeros(R + 1, np.int64)
    ex_ptr = np.zeros(n + 1, np.int64)
    ex_nodes = np.empty(n, np.int64)
    tmp = np.empty(n, np.int64)  # this region's closures, branch after branch
    tptr = np.zeros(B + 1, np.int64)
    hits = np.empty(n, np.int64)
    stamp = 0
    nfed = 0
    nex = 0
    nexn = 0
    for r in range(R):
        b0, b1 = rb_ptr[r], rb_ptr[r + 1]
        ntmp = 0
        for b in range(b0, b1):  # each branch's closure
            stamp += 4
            found = closure_kernel(br_nodes[br_ptr[b]:br_ptr[b + 1]], blocked, mark, stamp,
                                    sp, si, pp, pi, stack, out, count)
            tptr[b] = ntmp
            tmp[ntmp:ntmp + found] = np.sort(out[:found])
            ntmp += found
        tptr[b1] = ntmp
        # the side: the closure of the interior, the feeders and the join
        m = int_ptr[r + 1] - int_ptr[r]
        inside = np.empty(m + ntmp + 1, np.int64)
        inside[:m] = int_nodes[int_ptr[r]:int_ptr[r + 1]]
        inside[m:m + ntmp] = tmp[:ntmp]
        size = m + ntmp
        if joins[r] >= 0:
            inside[size] = joins[r]
            size += 1
        stamp += 4
        nside = closure_kernel(inside[:size], blocked, mark, stamp, sp, si, pp, pi, stack,
                                out, count)
        side = np.sort(out[:nside])
        for b in range(b0, b1):  # the branch each branch node and feeder belongs to
            _own(owner, br_ptr[b], br_ptr[b + 1], br_nodes, b - b0)
            _own(owner, tptr[b], tptr[b + 1], tmp, b - b0)
        members, cptr = _side_components(side, sp, si, comp_of)
        # per branch: its closure and the components that feed it alone
        ex_rptr[r] = nex
        assign = _sole_feeders(side, members, cptr, sp, si, owner, hits)
        nfed = _fed_rows(b0, b1, tptr, tmp, side, members, cptr, assign, fed_ptr, fed_nodes,
                         nfed, blocked)
        for c in range(assign.shape[0]):
            if assign[c] >= 0:
                continue
            ex_ptr[nex] = nexn
            for k in range(cptr[c], cptr[c + 1]):
                ex_nodes[nexn] = side[members[k]]
                blocked[side[members[k]]] = 1
                nexn += 1
            nex += 1
            ex_ptr[nex] = nexn
        for b in range(b0, b1):  # reset this region's scratch
            _own(owner, br_ptr[b], br_ptr[b + 1], br_nodes, -1)
            _own(owner, tptr[b], tptr[b + 1], tmp, -1)
    ex_rptr[R] = nex
    return fed_ptr, fed_nodes[:nfed], ex_rptr, ex_ptr[:nex + 1], ex_nodes[:nexn]


@njit_borrowing
def _block_sum(a, lo, n):
    """numpy's sum of ``a[lo:lo + n]`` for ``n <= 128``: in order below 8 values, else eight
    accumulators combined pairwise and the remainder in order."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit_borrowing
def _pairwise(a, lo, n, st_lo, st_n, st_step, vals):
    """``a[lo:lo + n].sum()`` as numpy sums a contiguous float64 array, to the last bit: its
    pairwise summation (:func:`_block_sum` up to 128 values, else the sum of the halves, the
    first a multiple of 8), walked with an explicit stack (``st_*``, ``vals``: 64 entries;
    numba's cache does not load recursive kernels reliably)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    st_lo[0], st_n[0], st_step[0] = lo, n, 0
    top, nv = 1, 0
    while top > 0:
        k = top - 1
        at, m = st_lo[k], st_n[k]
        if m <= 128:
            vals[nv] = _block_sum(a, at, m)
            nv += 1
            top -= 1
            continue
        half = m // 2
        half -= half % 8
        if st_step[k] < 2:  # the first half, then the second
            st_step[k] += 1
            first = st_step[k] == 1
            st_lo[top] = at if first else at + half
            st_n[top] = half if first else m - half
            st_step[top] = 0
            top += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]


@njit
def row_sums(w, a_ptr, a_idx, b_ptr, b_idx):
    """Per row ``k``: ``w[a_idx[a_ptr[k]:a_ptr[k + 1]]].sum() + w[b_idx[...]].sum()``, the
    same floats as numpy's (:func:`_pairwise` on the gathered values)."""
    rows = a_ptr.shape[0] - 1
    out = np.empty(rows, np.float64)
    buf = np.empty(max(a_idx.shape[0], b_idx.shape[0], 1), np.float64)
    st_lo, st_n, st_step = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64, np.int64)
    vals = np.empty(64, np.float64)
    for k in range(rows):
        n = a_ptr[k + 1] - a_ptr[k]
        for i in range(n):
            buf[i] = w[a_idx[a_ptr[k] + i]]
        x = _pairwise(buf, 0, n, st_lo, st_n, st_step, vals)
        n = b_ptr[k + 1] - b_ptr[k]
        for i in range(n):
            buf[i] = w[b_idx[b_ptr[k] + i]]
        out[k] = x + _pairwise(buf, 0, n, st_lo, st_n, st_step, vals)
    return out


# ------------------------------------------------------- the choice among regions, on columns
@njit_borrowing
def nest(by_size, int_ptr, int_nodes, owner, parent):
    """``parent[i]``: the smallest larger region holding region ``i``'s first interior node
    (-1: none), regions visited in ``by_size`` order (larger first); ``owner``: ``int64[n]``
    of -1, scratch."""
    for k in range(by_size.shape[0]):
        i = by_size[k]
        parent[i] = owner[int_nodes[int_ptr[i]]]
        for t in range(int_ptr[i], int_ptr[i + 1]):
            owner[int_nodes[t]] = i


@njit_borrowing
def savings_choice(by_size, parent, ch_ptr, ch_idx, value, costed, best, take, covered,
                    picked):
    """Over the containment tree, inner regions first: a region is taken when its saving is
    at least its children's best choice (ties: the outer region) and positive (any, on a graph
    without costs); ``picked``: taken with no taken ancestor. ``best``, ``take``, ``covered``:
    scratch (zeros)."""
    R = by_size.shape[0]
    for k in range(R - 1, -1, -1):
        i = by_size[k]
        inner = 0.0
        for t in range(ch_ptr[i], ch_ptr[i + 1]):
            inner += best[ch_idx[t]]
        if value[i] >= inner * (1 - 1e-12) and (value[i] > 0 or not costed):
            best[i] = value[i]
            take[i] = True
        else:
            best[i] = inner
    for k in range(R):  # parents come first in by_size
        i = by_size[k]
        p = parent[i]
        covered[i] = p >= 0 and (take[p] or covered[p])
        picked[i] = take[i] and not covered[i]


@njit_borrowing
def keep_disjoint(picks, int_ptr, int_nodes, forks, joins, taken, ends, keep):
    """Regions ``picks`` in order, each kept when its interior meets no kept interior, fork or
    join and its fork and join lie in no kept interior. ``taken``, ``ends``: ``bool[n]``."""
    for k in range(picks.shape[0]):
        i = picks[k]
        clash = False
        for t in range(int_ptr[i], int_ptr[i + 1]):
            v = int_nodes[t]
            if taken[v] or ends[v]:
                clash = True
                break
        if clash or (forks[i] >= 0 and taken[forks[i]]) or (joins[i] >= 0 and taken[joins[i]]):
            continue
        keep[k] = True
        for t in range(int_ptr[i], int_ptr[i + 1]):
            taken[int_nodes[t]] = True
        if forks[i] >= 0:
            ends[forks[i]] = True
        if joins[i] >= 0:
            ends[joins[i]] = True


@njit
def sort_within(ptr, keys):
    """The permutation sorting ``keys`` within each row ``ptr[r]:ptr[r + 1]`` (rows stay in
    place; keys are distinct within a row): ``np.lexsort((keys, row))`` one row at a time."""
    perm = np.empty(keys.shape[0], np.int64)
    for r in range(ptr.shape[0] - 1):
        lo, hi = ptr[r], ptr[r + 1]
        if hi - lo:
            perm[lo:hi] = np.argsort(keys[lo:hi], kind="mergesort") + lo
    return perm
