"""A graph's costs at another micro-batch size (no torch).

Gradient accumulation trades memory for steps: ``M`` micro-batches of ``B / M`` samples each
keep ``1 / M`` of the saved activations of one batch of ``B`` in flight, for the same parameter
state. The search (:mod:`outcore.search.layouts`) weighs micro-batch counts without
capturing the model again, by rescaling the captured graph: activation bytes (saved, output and
edge bytes) and compute times scale with the samples per micro-batch; parameters, and what
nodes compute from parameters and constants alone (a parameter read, weight standardisation,
a transposed tied weight), do not. Times scale linearly (a roofline's view: the
same work per sample) above a fixed cost per node (the device's launch cost); the job captures
the model again at the size the plan chose before it trains, so the runtime never uses a
rescaled graph.
"""

from __future__ import annotations

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph, attr_values, memo
from outcore.graph.order import topological_order

__all__ = ["CONSTANT_OPS", "at_microbatch", "batch_dependent", "batch_factor", "bytes_at_scale",
           "divisors"]

# nodes whose output does not grow with the batch (parameter reads, constants, shapes)
CONSTANT_OPS = frozenset({"param", "constant", "get_attr", "scalar_tensor", "full", "ones",
                          "zeros", "arange", "sym_size", "size"})


def at_microbatch(g: Graph, samples: int, fixed_s: float = 0.0) -> Graph:
    """``g`` (costed for ``g.batch_size`` samples) with the costs of ``samples`` samples.

    ``fixed_s``: what a node's forward, and its backward, cost whatever the samples (the
    device's ``launch_s``: dispatch and kernel launch); up to that much of each time stays,
    the rest scales. Linear scaling alone priced 2 of 16 samples at 0.13-0.26x of their
    profiled time on the zoo MLP, transformer and hf:mixtral, 5.7 us kept per node 0.5-0.6x
    (the zoo ResNet: 0.66x linear, 0.75x kept; measured 2026-11-27).

    Raises :class:`UsageError` when the graph does not say its batch size.
    """
    if not g.batch_size:
        raise UsageError(f"graph {g.name!r} does not record its batch size: micro-batch "
                         "counts cannot be searched; pass --microbatches N")
    if samples == g.batch_size:
        return g
    scale = samples / g.batch_size
    grows = batch_dependent(g)

    def timed(t: np.ndarray) -> np.ndarray:
        fixed = np.minimum(t, fixed_s)
        return np.where(grows, fixed + (t - fixed) * scale, t)

    return bytes_at_scale(g, scale).replace(batch_size=int(samples), fwd_s=timed(g.fwd_s),
                                            bwd_s=timed(g.bwd_s))


def batch_dependent(g: Graph) -> np.ndarray:
    """Per node, whether its output grows with the batch: a node that reads the data (an
    ``input`` node) or another such node. What is computed from parameters and constants
    alone (the weight standardisation of BiT's convolutions, a transposed tied weight, a
    position embedding) is the same tensor whatever the micro-batch, and so are the nodes of
    :data:`CONSTANT_OPS`, but for one made from a size of the data whose recorded shape leads
    with the batch (``arange(batch)``, ``zeros(batch, seq)``: a mask built for each sample).
    A graph that records no ``input`` node (a hand-written one) has every node but
    :data:`CONSTANT_OPS` grow. Remembered per structure and ops."""
    known = memo(g.structure, "batch dependent")
    key = (id(g.ops), id(g.attrs))
    if key not in known:
        constant = np.zeros(g.num_nodes, dtype=np.bool_)
        for op in CONSTANT_OPS:
            constant[g.nodes_with_op(op)] = True
        inputs = g.nodes_with_op("input")
        if inputs.size == 0:
            known[key] = ~constant
            return known[key]
        flag = [False] * g.num_nodes
        for v in inputs.tolist():
            flag[v] = True
        ptr, pred, fixed = g.pred_ptr.tolist(), g.pred_idx.tolist(), constant.tolist()
        for v in topological_order(g, strict=False).tolist():
            if flag[v] or not any(flag[u] for u in pred[ptr[v]:ptr[v + 1]]):
                continue
            if not fixed[v]:
                flag[v] = True
            elif g.ops is not None and g.ops[v] in _SIZE_OPS:
                flag[v] = True  # a size of the data: what is made from it may grow
            else:
                shape = g.attr(v, "shape")
                flag[v] = bool(shape) and isinstance(shape, list) and shape[0] == g.batch_size
        grows = np.array(flag, dtype=np.bool_)
        grows[g.nodes_with_op("sym_size")] = False
        grows[g.nodes_with_op("size")] = False
        known[key] = grows
    return known[key]


# ops that give a tensor's sizes: no bytes of their own, but what they size may grow
_SIZE_OPS = frozenset({"sym_size", "size"})


def batch_factor(g: Graph, scale: float) -> np.ndarray:
    """Per node, the factor its activation bytes take at ``scale`` times the graph's samples:
    ``scale`` where its output grows with the batch (:func:`batch_dependent`), else 1."""
    return np.where(batch_dependent(g), float(scale), 1.0)


def bytes_at_scale(g: Graph, scale: float) -> Graph:
    """``g`` with its output, saved and edge bytes at ``scale`` times its samples (rounded
    up), those of :data:`CONSTANT_OPS` nodes as they are; times and batch size unchanged."""
    if scale == 1.0:
        return g
    act = batch_factor(g, scale)

    def scaled(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
        return np.ceil(np.asarray(x, np.float64) * factor).astype(np.asarray(x).dtype)

    saved = np.asarray(g.saved_bytes, np.float64)
    # what a node saves of an input computed from parameters alone (BiT's convolutions save
    # their standardised weights) stays as it is; parameters and buffers themselves are not in
    # the saved bytes (the capture leaves them out); nor does what a node makes from
    # parameters alone inside itself ("fixed_saved", recorded by the capture: an einsum's
    # permuted copy of its weight)
    savers, producers = g.saved_input_pairs
    fixed = act == 1.0
    for op in ("param", "get_attr"):
        fixed[g.nodes_with_op(op)] = False
    keep = np.minimum(saved, np.bincount(
        savers, weights=np.asarray(g.out_bytes, np.float64)[producers] * fixed[producers],
        minlength=g.num_nodes) + attr_values(g, "fixed_saved"))
    return g.replace(out_bytes=scaled(g.out_bytes, act),
                     saved_bytes=(keep + scaled(saved - keep, act)).astype(g.saved_bytes.dtype),
                     edge_bytes=scaled(g.edge_bytes, act[g.src]))


def divisors(n: int, *, at_most: int | None = None) -> list[int]:
    """The divisors of ``n`` in ascending order (up to ``at_most``)."""
    top = n if at_most is None else min(n, at_most)
    return [d for d in range(1, top + 1) if n % d == 0]
