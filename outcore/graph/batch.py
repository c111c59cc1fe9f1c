"""A graph's costs at another micro-batch size (no torch).

Gradient accumulation trades memory for steps: ``M`` micro-batches of ``B / M`` samples each
keep ``1 / M`` of the saved activations of one batch of ``B`` in flight, for the same parameter
state. The search (:mod:`outcore.search.layouts`) weighs micro-batch counts without
capturing the model again, by rescaling the captured graph: activation bytes (saved, output and
edge bytes) and compute times scale with the samples per micro-batch; parameters, and the
outputs of parameter and constant nodes, do not. Times scale linearly (a roofline's view: the
same work per sample) above a fixed cost per node (the device's launch cost); the job captures
the model again at the size the plan chose before it trains, so the runtime never uses a
rescaled graph.
"""

from __future__ import annotations

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph

__all__ = ["CONSTANT_OPS", "at_microbatch", "batch_factor", "bytes_at_scale", "divisors"]

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

    def timed(t: np.ndarray) -> np.ndarray:
        fixed = np.minimum(t, fixed_s)
        return fixed + (t - fixed) * scale

    return bytes_at_scale(g, scale).replace(batch_size=int(samples), fwd_s=timed(g.fwd_s),
                                            bwd_s=timed(g.bwd_s))


def batch_factor(g: Graph, scale: float) -> np.ndarray:
    """Per node, the factor its activation bytes take at ``scale`` times the graph's samples:
    ``scale``, but 1 for the nodes whose output does not grow with the batch
    (:data:`CONSTANT_OPS`: a parameter read and handed to another piece is the same tensor
    whatever the micro-batch)."""
    act = np.full(g.num_nodes, float(scale))
    for op in CONSTANT_OPS:  # the graph's index of nodes by op (made once per structure)
        act[g.nodes_with_op(op)] = 1.0
    return act


def bytes_at_scale(g: Graph, scale: float) -> Graph:
    """``g`` with its output, saved and edge bytes at ``scale`` times its samples (rounded
    up), those of :data:`CONSTANT_OPS` nodes as they are; times and batch size unchanged."""
    if scale == 1.0:
        return g
    act = batch_factor(g, scale)

    def scaled(x: np.ndarray, factor: np.ndarray) -> np.ndarray:
        return np.ceil(np.asarray(x, np.float64) * factor).astype(np.asarray(x).dtype)

    return g.replace(out_bytes=scaled(g.out_bytes, act), saved_bytes=scaled(g.saved_bytes, act),
                     edge_bytes=scaled(g.edge_bytes, act[g.src]))


def divisors(n: int, *, at_most: int | None = None) -> list[int]:
    """The divisors of ``n`` in ascending order (up to ``at_most``)."""
    top = n if at_most is None else min(n, at_most)
    return [d for d in range(1, top + 1) if n % d == 0]
