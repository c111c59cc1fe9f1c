"""Fork-join regions as flat arrays: the candidates of a graph shape, the choice among them and
the chosen set with feeders, without a Python object per region.

:mod:`outcore.placers.subgraph.branches` describes what is found and chosen; this module does the
same on columns (row pointers and concatenated node lists). A 50k-node NAS graph has ~16k
candidate regions and keeps ~8k: making a :class:`~outcore.placers.subgraph.branches.Region` for
each took 0.2-0.25 s of every SUPER placement on a rescaled copy of the graph (the layout search
rescales one graph per layout), more than placing its branches. The region objects are still made,
from these columns, when read (:attr:`RegionSet.regions`, :attr:`Shapes.regions`), and
:func:`outcore.placers.subgraph.branches.select_regions` and ``attach_feeders``, which work on them,
are the reference the tests hold this module to (the same regions, branches and work to the last
bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from outcore.placers.subgraph._kernel import (
    feeders_kernel,
    keep_disjoint,
    nest,
    row_sums,
    savings_choice,
    sort_within,
)

__all__ = ["Region", "RegionSet", "Shapes", "gather_rows", "gather_slices"]


@dataclass(frozen=True, eq=False)
class Region:
    """A fork, its join and the parallel branches between them.

    Attributes:
        fork: node index of the fork, or -1 for the virtual source (the graph's inputs).
        join: node index of the join (the fork's immediate post-dominator), or -1 for the
            virtual sink (outputs that never meet).
        branches: per branch, ``int64`` node indices strictly between fork and join, sorted;
            branches are ordered by their smallest node index, side branches (below) last.
        feeders: per branch, ``int64`` indices of nodes outside the region that feed only that
            branch (empty until :func:`~outcore.placers.subgraph.branches.select_regions`
            attaches them).
        work_s: ``float64[B]`` forward + backward seconds of each branch with its feeders (node
            counts when the graph has no costs).
        side: how many of the branches (the last ones) are side branches: nodes the fork does
            not reach that feed only this region (see
            :func:`~outcore.placers.subgraph.branches.attach_feeders`); 0 until chosen.
    """

    fork: int
    join: int
    branches: tuple[np.ndarray, ...]
    feeders: tuple[np.ndarray, ...]
    work_s: np.ndarray
    side: int = 0

    @property
    def num_branches(self) -> int:
        return len(self.branches)

    @cached_property
    def interior(self) -> np.ndarray:
        """All branch nodes (without feeders, with side branches), sorted."""
        return np.sort(np.concatenate(self.branches))

    @property
    def saving_s(self) -> float:
        """Work no longer run in series with the branches apart: total - largest, seconds."""
        return float(self.work_s.sum() - self.work_s.max()) if self.work_s.size else 0.0


def gather_rows(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of the CSR ``(ptr, idx)``, in that order, as a new CSR."""
    return gather_slices(ptr[:-1], np.diff(ptr), idx, rows)


def gather_slices(starts: np.ndarray, lens: np.ndarray, idx: np.ndarray, rows: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of the slices ``idx[starts[k]:starts[k] + lens[k]]``, as a CSR."""
    rows = np.asarray(rows, np.int64)
    starts, lens = np.asarray(starts, np.int64)[rows], np.asarray(lens, np.int64)[rows]
    ptr = np.zeros(rows.size + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    pos = np.repeat(starts - ptr[:-1], lens) + np.arange(ptr[-1], dtype=np.int64)
    return ptr, idx[pos].astype(np.int64, copy=False)


def _rows(ptr: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, ...]:
    p = ptr.tolist()
    return tuple(idx[p[k]:p[k + 1]] for k in range(len(p) - 1))


@dataclass(frozen=True, eq=False)
class Shapes:
    """Every useful region of one graph shape (what its edges alone decide), inner forks first.

    Attributes:
        n: nodes of the graph.
        forks, joins: ``int64[R]``, ``VIRTUAL`` (-1) for the virtual source or sink.
        reg_ptr: branches of region ``r`` are ``reg_ptr[r]:reg_ptr[r + 1]``, by first node.
        br_ptr, br_nodes: CSR of each branch's nodes, sorted.
        int_ptr, int_nodes: CSR of each region's interior (all its branch nodes), sorted.
        sum_nodes, sum_start, sum_order: a branch's work is
            ``np.add.reduceat(w[sum_nodes], sum_start)[sum_order]`` (the order of summation
            the regions have always had).
        truncated: the search stopped at its visit budget.
    """

    n: int
    forks: np.ndarray
    joins: np.ndarray
    reg_ptr: np.ndarray
    br_ptr: np.ndarray
    br_nodes: np.ndarray
    int_ptr: np.ndarray
    int_nodes: np.ndarray
    sum_nodes: np.ndarray
    sum_start: np.ndarray
    sum_order: np.ndarray
    truncated: bool

    @staticmethod
    def from_search(f, j, rptr, nodes, labels, n: int, truncated: bool,
                    virtual: int) -> "Shapes":
        """From the compiled search's flat output (``branches._region_shapes``): per region
        its nodes (``rptr``) labelled by branch."""
        rptr = np.asarray(rptr, np.int64)
        # by region, branch label, node (labels < n + 2): np.lexsort's order, row by row
        key = labels.astype(np.int64)
        key *= n + 2
        key += nodes
        perm = sort_within(rptr, key)
        del key
        nodes, labels = nodes[perm], labels[perm]
        del perm
        # a branch (segment) starts where the label changes or a region starts
        cut = np.zeros(nodes.size + 1, np.bool_)
        cut[rptr] = True
        cut[1:nodes.size] |= labels[1:] != labels[:-1]
        start = np.flatnonzero(cut[:nodes.size])
        seg_reg = np.searchsorted(rptr, start, side="right") - 1
        order = np.lexsort((nodes[start], seg_reg))  # per region, branches by first node
        reg_ptr = np.searchsorted(seg_reg[order], np.arange(f.size + 1)).astype(np.int64)
        br_ptr, br_nodes = gather_rows(np.r_[start, nodes.size].astype(np.int64), nodes, order)
        inside = nodes[sort_within(rptr, nodes)]
        return Shapes(n, np.where(f < n, f, virtual).astype(np.int64),
                      np.where(j < n, j, virtual).astype(np.int64), reg_ptr, br_ptr, br_nodes,
                      rptr, inside.astype(np.int64, copy=False), nodes, start, order,
                      bool(truncated))

    @property
    def num_regions(self) -> int:
        return int(self.forks.size)

    def branch_work(self, w: np.ndarray) -> np.ndarray:
        """Each branch's work under node weights ``w``."""
        if self.sum_start.size == 0:
            return np.zeros(0)
        return np.add.reduceat(w[self.sum_nodes], self.sum_start)[self.sum_order]

    def savings(self, work: np.ndarray) -> np.ndarray:
        """Each region's parallel saving (total branch work - the largest branch's)."""
        counts = np.diff(self.reg_ptr)
        value = np.zeros(self.num_regions)
        some = counts > 0
        if some.any():
            starts = self.reg_ptr[:-1][some]
            value[some] = np.add.reduceat(work, starts) - np.maximum.reduceat(work, starts)
        return value

    def regions(self, w: np.ndarray) -> tuple:
        """The candidates as :class:`~outcore.placers.subgraph.branches.Region` objects."""
        work = self.branch_work(w)
        parts, inside = _rows(self.br_ptr, self.br_nodes), _rows(self.int_ptr, self.int_nodes)
        empty = np.zeros(0, np.int64)
        rp, forks, joins = self.reg_ptr.tolist(), self.forks.tolist(), self.joins.tolist()
        out = []
        for r in range(self.num_regions):
            b = parts[rp[r]:rp[r + 1]]
            region = Region(forks[r], joins[r], b, (empty,) * len(b), work[rp[r]:rp[r + 1]].copy())
            region.__dict__["interior"] = inside[r]  # the cached property
            out.append(region)
        return tuple(out)

    def select(self, w: np.ndarray, costed: bool, rank: np.ndarray) -> np.ndarray:
        """Indices of the disjoint regions with the largest total saving, ordered by the
        topological rank (``rank``) of their fork, then by join: ``branches.select_regions``'
        choice (its reference), on columns."""
        R = self.num_regions
        if R == 0:
            return np.zeros(0, np.int64)
        sizes = np.diff(self.int_ptr)
        value = self.savings(self.branch_work(w))
        by_size = np.lexsort((np.arange(R), self.forks, -sizes)).astype(np.int64)
        parent = np.empty(R, np.int64)
        nest(by_size, self.int_ptr, self.int_nodes, np.full(self.n, -1, np.int64), parent)
        kids = by_size[parent[by_size] >= 0]  # children of each region, in by_size order
        ch_idx = kids[np.argsort(parent[kids], kind="stable")]
        ch_ptr = np.zeros(R + 1, np.int64)
        np.cumsum(np.bincount(parent[kids], minlength=R), out=ch_ptr[1:])
        picked = np.zeros(R, np.bool_)
        savings_choice(by_size, parent, ch_ptr, ch_idx, value, costed, np.zeros(R),
                        np.zeros(R, np.bool_), np.zeros(R, np.bool_), picked)
        picks = np.flatnonzero(picked)
        picks = picks[np.lexsort((picks, self.forks[picks], -sizes[picks], -value[picks]))]
        keep = np.zeros(picks.size, np.bool_)
        keep_disjoint(picks, self.int_ptr, self.int_nodes, self.forks, self.joins,
                       np.zeros(self.n, np.bool_), np.zeros(self.n, np.bool_), keep)
        kept = picks[keep]
        fork_rank = np.where(self.forks[kept] >= 0, rank[np.maximum(self.forks[kept], 0)], -1)
        return kept[np.lexsort((self.joins[kept], fork_rank))]


@dataclass(frozen=True, eq=False)
class RegionSet:
    """Chosen regions with feeders and side branches, as columns (what SUPER places).

    Attributes:
        forks, joins: ``int64[R]``.
        reg_ptr: branches of region ``r`` are ``reg_ptr[r]:reg_ptr[r + 1]``: its branches by
            first node, then its side branches.
        side: ``int64[R]``, how many of a region's branches (the last) are side branches.
        br_ptr, br_nodes: CSR of each branch's nodes, sorted.
        fd_ptr, fd_nodes: CSR of each branch's feeders, sorted (none for side branches).
        work_s: ``float64[B]`` each branch's work with its feeders.
    """

    forks: np.ndarray
    joins: np.ndarray
    reg_ptr: np.ndarray
    side: np.ndarray
    br_ptr: np.ndarray
    br_nodes: np.ndarray
    fd_ptr: np.ndarray
    fd_nodes: np.ndarray
    work_s: np.ndarray

    @staticmethod
    def empty() -> "RegionSet":
        z, one = np.zeros(0, np.int64), np.zeros(1, np.int64)
        return RegionSet(z, z, one, z, one, z, one, z, np.zeros(0))

    @staticmethod
    def with_feeders(g, shapes: Shapes, kept: np.ndarray) -> "RegionSet":
        """The regions ``kept`` (indices into ``shapes``, in order) with feeders and side
        branches attached (``branches.attach_feeders``' reference walk, compiled); work zero
        until :meth:`weighed`."""
        if kept.size == 0:
            return RegionSet.empty()
        rb_ptr, branch_ids = gather_rows(shapes.reg_ptr, np.arange(shapes.br_ptr.size - 1), kept)
        counts = np.diff(rb_ptr)
        br_ptr, br_nodes = gather_rows(shapes.br_ptr, shapes.br_nodes, branch_ids)
        int_ptr, int_nodes = gather_rows(shapes.int_ptr, shapes.int_nodes, kept)
        forks, joins = shapes.forks[kept], shapes.joins[kept]
        fed_ptr, fed_nodes, ex_rptr, ex_ptr, ex_nodes = feeders_kernel(
            g.num_nodes, forks, joins, int_ptr, int_nodes, rb_ptr, br_ptr, br_nodes,
            g.succ_ptr, g.succ_idx, g.pred_ptr, g.pred_idx)
        side = np.diff(ex_rptr)
        nx = int(ex_rptr[-1])
        # per region: its branches (the pool's first rows), then its side branches
        region = np.r_[np.repeat(np.arange(kept.size), counts), np.repeat(np.arange(kept.size),
                                                                          side)]
        row = np.argsort(region, kind="stable")
        pool_ptr = np.r_[br_ptr[:-1], br_nodes.size + ex_ptr[:nx], br_nodes.size + ex_ptr[nx]]
        pool = np.concatenate([br_nodes, ex_nodes[:ex_ptr[nx]]])
        lens = np.diff(pool_ptr)
        all_ptr, all_nodes = gather_slices(pool_ptr[:-1], lens, pool, row)
        fd_lens = np.r_[np.diff(fed_ptr), np.zeros(nx, np.int64)][row]
        fd_starts = np.r_[fed_ptr[:-1], np.zeros(nx, np.int64)][row]
        fd_ptr, fd_nodes = gather_slices(fd_starts, fd_lens, fed_nodes, np.arange(row.size))
        reg_ptr = np.zeros(kept.size + 1, np.int64)
        np.cumsum(counts + side, out=reg_ptr[1:])
        return RegionSet(forks, joins, reg_ptr, side, all_ptr, all_nodes, fd_ptr, fd_nodes,
                         np.zeros(row.size))

    def weighed(self, w: np.ndarray) -> "RegionSet":
        """This set with each branch's work (with its feeders) under node weights ``w``."""
        work = row_sums(np.ascontiguousarray(w, np.float64), self.br_ptr, self.br_nodes,
                         self.fd_ptr, self.fd_nodes) if self.work_s.size else np.zeros(0)
        return RegionSet(self.forks, self.joins, self.reg_ptr, self.side, self.br_ptr,
                         self.br_nodes, self.fd_ptr, self.fd_nodes, work)

    @property
    def num_regions(self) -> int:
        return int(self.forks.size)

    @property
    def branch_nodes(self) -> int:
        """Nodes in branches and feeders."""
        return int(self.br_nodes.size + self.fd_nodes.size)

    @cached_property
    def regions(self) -> tuple:
        """The set as :class:`~outcore.placers.subgraph.branches.Region` objects."""
        parts, feds = _rows(self.br_ptr, self.br_nodes), _rows(self.fd_ptr, self.fd_nodes)
        rp = self.reg_ptr.tolist()
        return tuple(Region(int(f), int(j), parts[rp[r]:rp[r + 1]], feds[rp[r]:rp[r + 1]],
                            self.work_s[rp[r]:rp[r + 1]].copy(), int(s))
                     for r, (f, j, s) in enumerate(zip(self.forks, self.joins, self.side)))

