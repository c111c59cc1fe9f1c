"""Costs of a layer split over a tensor-parallel group (pure; no torch).

A layer split ``tp`` ways does ``1/tp`` of its arithmetic and holds ``1/tp`` of its weights,
gradients and optimizer state (Megatron-LM, Shoeybi et al. 2019, section 3); sharding the rest
over a depth group of ``depth`` ranks divides the resident state again (ZeRO-3, Rajbhandari et
al., SC 2020, section 5; AxoNN's depth dimension, Singh et al., SC 2024) at the price of
gathering each weight before it is used. The collectives each split style adds, per forward and
per backward, with the bytes of the *whole* tensor they act on (times: :func:`collective_s`):

=================  ==============================  ==============================
style              forward                         backward
=================  ==============================  ==============================
colwise (pair)     --                              all-reduce of the input's grad
rowwise (pair)     all-reduce of the output        --
colwise_gather     all-gather of the output        all-reduce of the input's grad
rowwise_alone      all-reduce of the output        all-gather of the input's grad
vocab (Embedding)  all-reduce of the output        --
embed_dim          all-gather of the output        --
depth (sharded)    all-gather of the weights       all-gather of the weights (resharded after
                                                   the forward) + reduce-scatter of the grads
=================  ==============================  ==============================

Megatron's attention block has one backward all-reduce for q, k and v together; DTensor's
``ColwiseParallel`` reduces each column's input gradient separately, and this table charges
what runs (one per column Linear).

Collective times: all-reduce by :func:`outcore.hardware.collectives.allreduce_s` (ring or
recursive halving-doubling, Thakur et al. 2005); all-gather and reduce-scatter by the ring's
``p - 1`` steps of ``n / p`` bytes. :func:`tensor_graph` folds all of it into a graph whose node
costs are one tensor-parallel rank's, so every planner, the lowering and the simulator cost a
``tp``-way plan without knowing about tensor parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, cast

import numpy as np

from outcore.cost.analytical import draws_random
from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.graph.tensor_pairs import DEFAULT_MIN_SPLIT_BYTES, TensorLayout, find_layout
from outcore.hardware.collectives import allreduce_s, ring_reduce_scatter_s
from outcore.hardware.spec import LinkSpec

__all__ = ["Collective", "STYLES", "split_compute_s", "split_state_bytes", "depth_peak_bytes",
           "style_collectives", "depth_collectives", "layout_collectives", "NodeCosts",
           "layout_node_costs", "collective_s", "phase_s", "tensor_graph",
           "PLAN_MIN_SPLIT_BYTES", "PLAN_MIN_PAIR_BYTES", "plan_layout"]

# A plan's tensor-parallel layout splits every Megatron pair whatever its size (the user asked for
# tp ranks; a pair costs one all-reduce each way), and a Linear / Embedding that does not pair
# only from 1 MiB of parameters up (alone, it costs a gather or an all-reduce per call, which a
# small layer does not earn back). ``tensor_graph`` and the runtime use these thresholds, so
# what is costed is what runs.
PLAN_MIN_SPLIT_BYTES = DEFAULT_MIN_SPLIT_BYTES
PLAN_MIN_PAIR_BYTES = 0

STYLES = ("whole", "colwise", "rowwise", "colwise_gather", "rowwise_alone", "vocab", "embed_dim")
KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective of a tensor-parallel layer.

    Attributes:
        kind: ``all_reduce``, ``all_gather`` or ``reduce_scatter``.
        nbytes: bytes of the whole (unsplit) tensor it produces or reduces.
        ranks: processes taking part.
        phase: ``fwd`` or ``bwd``.
        what: what it carries (for timelines and notes).
    """

    kind: str
    nbytes: int
    ranks: int
    phase: str
    what: str = ""


def split_compute_s(fwd_s: float | np.ndarray, bwd_s: float | np.ndarray, tp: int
                    ) -> tuple[float | np.ndarray, float | np.ndarray]:
    """Forward and backward seconds (floats or arrays) of a layer split ``tp`` ways
    (arithmetic divides evenly)."""
    _check_degree(tp, "tp")
    return fwd_s / tp, bwd_s / tp


def split_state_bytes(param_bytes: float, tp: int = 1, depth: int = 1,
                      factor: float = 4.0) -> float:
    """Resident bytes per rank of a layer's weights, gradients and optimizer state
    (``factor`` copies of ``param_bytes``: 4 for Adam) split ``tp`` ways and sharded over
    ``depth`` ranks."""
    _check_degree(tp, "tp")
    _check_degree(depth, "depth")
    return param_bytes * factor / (tp * depth)


def depth_peak_bytes(param_bytes: float, tp: int = 1, depth: int = 1,
                     factor: float = 4.0) -> float:
    """Peak per rank while a sharded layer runs: the resident shards
    (:func:`split_state_bytes`) plus its ``1/tp`` weights gathered whole and, in the backward,
    their whole gradient before the reduce-scatter: ``+ 2 x param_bytes / tp`` when
    ``depth > 1``."""
    resident = split_state_bytes(param_bytes, tp, depth, factor)
    return resident + (2 * param_bytes / tp if depth > 1 else 0.0)


def style_collectives(style: str, *, in_bytes: int, out_bytes: int,
                      tp: int) -> tuple[Collective, ...]:
    """The collectives of one module split in ``style`` over ``tp`` ranks (module docstring)."""
    if style not in STYLES:
        raise UsageError(f"unknown split style {style!r}: use one of {', '.join(STYLES)}")
    if tp <= 1 or style == "whole":
        return ()

    def c(kind: str, nbytes: int, phase: str, what: str) -> Collective:
        return Collective(kind=kind, nbytes=int(nbytes), ranks=tp, phase=phase, what=what)

    grad_in = c("all_reduce", in_bytes, "bwd", "input gradient")
    return {
        "colwise": (grad_in,),
        "rowwise": (c("all_reduce", out_bytes, "fwd", "output"),),
        "colwise_gather": (c("all_gather", out_bytes, "fwd", "output"), grad_in),
        "rowwise_alone": (c("all_reduce", out_bytes, "fwd", "output"),
                          c("all_gather", in_bytes, "bwd", "input gradient")),
        "vocab": (c("all_reduce", out_bytes, "fwd", "output"),),
        "embed_dim": (c("all_gather", out_bytes, "fwd", "output"),),
    }[style]


def depth_collectives(param_bytes: int, depth: int, *, tp: int = 1,
                      reshard_after_forward: bool = True) -> tuple[Collective, ...]:
    """FSDP/ZeRO-3 collectives of a layer whose (``1/tp``) weights are sharded over ``depth``."""
    _check_degree(depth, "depth")
    if depth <= 1 or param_bytes <= 0:
        return ()
    nbytes = int(param_bytes // tp)
    out = [Collective(kind="all_gather", nbytes=nbytes, ranks=depth, phase="fwd",
                      what="weights")]
    if reshard_after_forward:
        out.append(Collective(kind="all_gather", nbytes=nbytes, ranks=depth, phase="bwd",
                              what="weights"))
    out.append(Collective(kind="reduce_scatter", nbytes=nbytes, ranks=depth, phase="bwd",
                          what="weight gradients"))
    return tuple(out)


def layout_collectives(layout, depth: int = 1) -> dict[int, tuple[Collective, ...]]:
    """Collectives per graph node index of a :class:`~outcore.graph.tensor_pairs.TensorLayout`
    (and of depth sharding of each split module over ``depth`` ranks)."""
    out: dict[int, tuple[Collective, ...]] = {}
    for s in layout.splits:
        cs = style_collectives(s.style, in_bytes=s.in_bytes, out_bytes=s.out_bytes,
                               tp=layout.tp)
        cs += depth_collectives(s.param_bytes, depth, tp=layout.tp if s.style != "whole" else 1)
        if cs:
            out[s.node] = cs
    for pair in layout.pairs:  # per-head operands: their sliced gradient summed backward
        for _, v, nbytes in pair.sliced:
            out[v] = out.get(v, ()) + (Collective(kind="all_reduce", nbytes=nbytes,
                                                   ranks=layout.tp, phase="bwd",
                                                   what="per-head operand gradient"),)
    return out


@dataclass(frozen=True, eq=False)
class NodeCosts:
    """Per-rank costs of every graph node under a tensor-parallel layout (``float64[n]`` /
    ``int64[n]`` arrays indexed like the graph; collectives from :func:`layout_collectives`).
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    param_bytes: np.ndarray
    collectives: dict[int, tuple[Collective, ...]]


def layout_node_costs(g, layout, depth: int = 1) -> NodeCosts:
    """What one rank of a ``layout.tp``-way group (sharded over ``depth``) spends per node of
    ``g``: split Linears / Embeddings and the nodes inside Megatron pairs (they run on shards)
    take ``1/tp`` of the time; split modules hold ``1/tp`` of their parameters, and every
    parameter ``1/depth`` more. Whole nodes are unchanged."""
    tp = layout.tp
    fwd, bwd = g.fwd_s.astype(np.float64).copy(), g.bwd_s.astype(np.float64).copy()
    params = g.param_bytes.astype(np.float64).copy()
    split_nodes = np.array(sorted({s.node for s in layout.splits if s.style != "whole"}),
                           dtype=np.int64)
    split_modules = {s.module for s in layout.splits if s.style != "whole"}
    sharded = np.zeros(g.num_nodes, dtype=bool)
    sharded[split_nodes] = True
    sharded[[i for p in layout.pairs for i in p.region]] = True
    fwd[sharded], bwd[sharded] = split_compute_s(fwd[sharded], bwd[sharded], tp)
    # parameters divided: split nodes', and the parameter reads of split modules
    divided = np.zeros(g.num_nodes, dtype=bool)
    divided[split_nodes] = True
    divided[[i for i in g.nodes_with_op("param").tolist()
             if g.module_of(i) in split_modules]] = True
    params[divided] /= tp
    params /= depth
    return NodeCosts(fwd_s=fwd, bwd_s=bwd, param_bytes=np.ceil(params).astype(np.int64),
                     collectives=layout_collectives(layout, depth))


def collective_s(c: Collective, link: LinkSpec, algorithm: str = "auto") -> float:
    """Seconds ``c`` takes over ``link``."""
    if c.kind == "all_reduce":
        return cast(float, allreduce_s(c.nbytes, c.ranks, link, algorithm))
    return cast(float, ring_reduce_scatter_s(c.nbytes, c.ranks, link))


def phase_s(collectives: Iterable[Collective], phase: str, link: LinkSpec,
            algorithm: str = "auto") -> float:
    """Total seconds of the ``phase`` (``fwd``/``bwd``) collectives, run one after another."""
    return sum(collective_s(c, link, algorithm) for c in collectives if c.phase == phase)


def plan_layout(g: Graph, tp: int) -> TensorLayout:
    """The tensor-parallel layout a plan with ``layout.tp = tp`` uses on graph ``g``."""
    return find_layout(g, tp, min_split_bytes=PLAN_MIN_SPLIT_BYTES,
                       min_pair_bytes=PLAN_MIN_PAIR_BYTES, fused=True, conv1d=True)


def tensor_graph(g: Graph, tp: int, link: LinkSpec, *,
                 layout: TensorLayout | None = None) -> tuple[Graph, TensorLayout]:
    """``g`` as one rank of a ``tp``-way tensor-parallel group sees it, and the layout.

    Same nodes, names and edges (so a plan made on it is a plan of ``g``); per node: compute
    from :func:`layout_node_costs` plus the node's collectives over ``link`` (they are
    synchronous, on the node's critical path); parameters ``1/tp`` for split modules; the
    outputs of column-split Linears and of the nodes inside Megatron pairs (they hold shards)
    ``1/tp``, and so the bytes of their out-edges; saved bytes ``1/tp`` inside pairs only (a
    column-split Linear saves its whole input). ``meta["tp"]`` records ``tp`` (the lowering
    does not divide twice). ``tp = 1`` returns ``g`` itself.
    """
    _check_degree(tp, "tp")
    if tp == 1 or g.meta.get("tp") == tp:
        return g, layout or TensorLayout(tp=tp, pairs=(), splits=())
    if g.meta.get("tp"):
        raise UsageError(f"the graph is already costed for tp = {g.meta['tp']}, not {tp}")
    layout = layout or plan_layout(g, tp)
    nc = layout_node_costs(g, layout)
    fwd, bwd = nc.fwd_s.copy(), nc.bwd_s.copy()
    for i, cs in nc.collectives.items():
        fwd[i] += phase_s(cs, "fwd", link)
        bwd[i] += phase_s(cs, "bwd", link)
    inside = np.zeros(g.num_nodes, dtype=bool)
    inside[[i for p in layout.pairs for i in p.region]] = True
    sharded = inside.copy()
    sharded[[s.node for s in layout.splits if s.style == "colwise"]] = True
    shrink = np.where(sharded, 1.0 / tp, 1.0)
    # what a pair's inner nodes save is a shard; a column-split layer saves its whole input
    # (capture counts an input several layers save at the first of them: q of q, k, v), and
    # a random node on a shard draws each sample whole and keeps the whole mask it drew
    drawn = np.zeros(g.num_nodes, dtype=bool)
    for op, idx in g._nodes_by_op.items():
        drawn[idx] = draws_random(op)
    saved = g.saved_bytes * np.where(inside & ~drawn, 1.0 / tp, 1.0)
    out = g.replace(fwd_s=fwd, bwd_s=bwd, param_bytes=nc.param_bytes.astype(g.param_bytes.dtype),
                    out_bytes=np.ceil(g.out_bytes * shrink).astype(g.out_bytes.dtype),
                    saved_bytes=np.ceil(saved).astype(g.saved_bytes.dtype),
                    edge_bytes=np.ceil(g.edge_bytes * shrink[g.src]).astype(g.edge_bytes.dtype),
                    meta={**g.meta, "tp": tp, "tp_gathered": sorted(
                              s.node for s in layout.splits
                              if s.style in ("colwise_gather", "embed_dim")),
                          # the matrix products that multiply 1/tp of their columns / of
                          # their inner dimension (their scratch: schedule.workspace)
                          "tp_split_cols": sorted(s.node for s in layout.splits
                                                  if s.style in ("colwise", "colwise_gather")),
                          "tp_split_inner": sorted(s.node for s in layout.splits
                                                   if s.style in ("rowwise", "rowwise_alone")),
                          "tp_sharded": np.flatnonzero(sharded).tolist(),
                          "tp_split_modules": len(layout.split_modules),
                          "tp_pairs": len(layout.pairs)})
    return out, layout


def _check_degree(value: int, name: str) -> None:
    if int(value) != value or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
