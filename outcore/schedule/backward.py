"""The working memory of a piece's backward (:func:`backward_working`): what autograd holds
above what the piece held when its backward began, node by node in reverse order. Part of the
memory model of :mod:`outcore.schedule.costs`."""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph, memo
from outcore.graph.jit import njit
from outcore.schedule.shared import tied_bytes

__all__ = ["ALIASING_BACKWARD_OPS", "backward_working", "carries_gradient", "pinned_gradients",
           "requires_gradient"]


# ops whose backward returns a view of the output's gradient (no new memory): reshapes,
# transposes, permutes, (un)squeezes; not ``expand`` (its backward sums)
ALIASING_BACKWARD_OPS = ("view", "_unsafe_view", "reshape", "unflatten", "flatten",
                         "transpose", "permute", "unsqueeze", "squeeze", "t")


def pinned_gradients(g: Graph) -> np.ndarray:
    """Per node, the bytes of its output's gradient that a parameter's ``.grad`` keeps alive
    until the step ends. A concatenation's backward returns each input's gradient as a view
    of its output's; a parameter concatenated directly (read by nothing else, its part a
    contiguous slice) has that view stolen as its ``.grad``, which pins the whole buffer:
    the parts of the other inputs too (MobileBERT's output layer concatenates a transposed
    tied weight and a parameter; with hidden size equal to embedding size the parameter is
    empty and its empty ``.grad`` held the whole 128 KiB). The bytes beyond the stolen
    parameters' own, which the gradients count already."""
    known = memo(g.structure, "pinned gradients")
    key = (id(g.ops), id(g.attrs), id(g.out_bytes))
    if key not in known:
        pinned = np.zeros(g.num_nodes)
        if g.attrs is not None:
            is_param = np.zeros(g.num_nodes, dtype=np.bool_)
            is_param[g.nodes_with_op("param")] = True
            reads = np.bincount(g.src, minlength=g.num_nodes)
            for op in _JOINING_OPS:
                for v in g.nodes_with_op(op).tolist():
                    stolen = [u for u in g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]].tolist()
                              if is_param[u] and reads[u] == 1]
                    if stolen and _slices_contiguous(op, g.attr(v, "shape"),
                                                     g.attr(v, "in_shapes")):
                        kept = float(np.asarray(g.param_bytes, np.float64)[stolen].sum())
                        pinned[v] = max(float(g.out_bytes[v]) - kept, 0.0)
        known[key] = pinned
    return known[key]


_JOINING_OPS = ("cat", "concat", "concatenate", "stack")


def _slices_contiguous(op: str, shape: Any, in_shapes: Any) -> bool:
    """Whether an input's part of a joined output's gradient can be a contiguous slice of it:
    the output's dimensions before the joined one are all 1 (an unknown shape: assumed so,
    the bound)."""
    if not shape or not in_shapes:
        return True
    for d in range(len(shape)):
        if op == "stack":
            fits = all(list(s) == list(shape[:d]) + list(shape[d + 1:]) for s in in_shapes)
        else:
            fits = all(len(s) == len(shape) and all(a == b for k, (a, b) in
                                                    enumerate(zip(s, shape)) if k != d)
                       for s in in_shapes) and sum(s[d] for s in in_shapes) == shape[d]
        if fits and int(np.prod(shape[:d], dtype=np.int64)) == 1:
            return True
    return False


def backward_working(g: Graph, piece_of: np.ndarray, n_p: int, summed: int = 2,
                     workspace: np.ndarray | None = None, first: bool = False,
                     freed: np.ndarray | None = None,
                     reads: tuple[np.ndarray, ...] | None = None) -> Any:
    """Per piece, the working memory of its backward above what it holds when the backward
    starts: at each node (in reverse topological order), the gradient of its output (unless
    that is a received one, counted where it is received) and of its inputs from the same
    piece, less the saved activations the backward has freed already (those of the piece's
    later nodes); an output with several consumers holds two gradients while they are
    summed (``summed``: autograd adds the one arriving into the one held, in place; a
    checkpointed piece's recomputing backward sums out of place, three); and the gradient a
    fork's consumer that ran its backward first returned for it, waiting while the others run
    theirs; ``freed``: per piece, saved bytes freed before its first node's backward (the
    loss's); ``reads``: :func:`~outcore.schedule.shared.shared_reads` (else read from ``g``).
    The largest over the nodes; with ``first``, also the largest with the gradients
    of the parameters of the nodes done so far (a step's first backward of the piece makes
    its ``.grad`` tensors as it goes; later ones add into them). Autograd sums two gradients
    in place when it holds the only reference to one (the operator-watching tracker this
    project once used prevented that, and measured three); the checkpointed pieces' three was
    measured with that tracker and is kept as a bound."""
    n = g.num_nodes
    if not n or not n_p:
        return np.zeros(n_p)
    # a view's input gradient is a view of its output's (a transposed expert weight's 512 KiB
    # gradient counted twice put hf:mixtral's piece 1.19 MiB over its start, 0.44 measured)
    aliasing = np.zeros(n, dtype=np.bool_)
    for op in ALIASING_BACKWARD_OPS:
        aliasing[g.nodes_with_op(op)] = True
    is_param = np.zeros(n, dtype=np.bool_)
    is_param[g.nodes_with_op("param")] = True
    layer_params = np.where(is_param, 0.0, np.asarray(g.param_bytes, np.float64))
    shared, tied, apart = tied_bytes(g, np.asarray(piece_of), reads)
    layer_params = layer_params + apart  # a shared weight owned in another piece: its own
    # a tensor-parallel rank's parameters are DTensors, whose gradients autograd sums out of
    # place: a tied weight's two gradients and their sum at once (measured on a tp-2 LM whose
    # 32 MiB embedding is tied to its output layer); a plain tensor's are summed in place
    tied_sum = 1.0 if g.meta.get("tp", 1) > 1 else 0.0
    order = np.asarray(topological_order(g), np.int64)
    grad_edges = _grad_edges(g)
    out, out_first = _working_kernel(order, np.asarray(piece_of, np.int64), n_p, g.src, g.dst,
                                     grad_edges, _foreign_held(g, order, piece_of, grad_edges),
                                     np.asarray(g.saved_bytes, np.float64),
                                     np.asarray(g.out_bytes, np.float64), aliasing, summed,
                                     np.zeros(n) if workspace is None else workspace,
                                     g.pred_ptr, g.pred_idx, layer_params, is_param,
                                     shared, tied, tied_sum, pinned_gradients(g),
                                     np.zeros(n_p) if freed is None else freed,
                                     g.pred_edge)
    return (out, out_first) if first else out


def _foreign_held(g: Graph, order: np.ndarray, piece_of: np.ndarray,
                  grad_edges: np.ndarray) -> np.ndarray:
    """Per node, the bytes of the gradients it makes for inputs from other pieces that stay
    until its piece's backward ends: the piece hands each such gradient back (to the rank that
    sent the input, or to the local piece that made it) only then, so it is held from the
    backward of the input's first consumer in reverse order (counted there; later consumers
    add into it). A tied output weight another rank sends in held its 128 KiB gradient through
    the rest of hf:xlnet's backward, past the prediction."""
    out = np.zeros(g.num_nodes)
    piece_of = np.asarray(piece_of)
    cross = np.flatnonzero((piece_of[g.src] != piece_of[g.dst]) & (grad_edges > 0)
                           & requires_gradient(g)[g.src])
    if not cross.size:
        return out
    position = np.empty(g.num_nodes, np.int64)
    position[order] = np.arange(order.size)
    src, dst = g.src[cross], g.dst[cross]
    # per (input, consumer piece), the consumer latest in topological order
    by = np.lexsort((-position[dst], piece_of[dst], src))
    src, piece = src[by], piece_of[dst[by]]
    first = np.r_[True, (src[1:] != src[:-1]) | (piece[1:] != piece[:-1])]
    keep = cross[by[first]]
    np.add.at(out, g.dst[keep], grad_edges[keep])
    return out


def _grad_edges(g: Graph) -> np.ndarray:
    """Per edge, the bytes of the gradient its consumer's backward returns along it: each
    input it reads once (``x * x`` returns one gradient), none for a tensor that requires
    none (:func:`requires_gradient`: an integer or boolean tensor, the model's inputs, a float
    copy of a one-hot or of a mask). A backward makes all of them at once (a product's two
    factors: GPT-2's GELU held three activations, measured, where the largest input alone
    counted two)."""
    # the same for the rescaled copies, which share the structure, ops and attributes
    known = memo(g.structure, "gradient edges")
    key = (id(g.ops), id(g.attrs), id(g.param_bytes))
    if key not in known:
        carries = requires_gradient(g)
        if not carries.any():  # a graph without parameters (a synthetic one): every float
            carries = carries_gradient(g)  # tensor is taken to carry one
        first = np.ones(g.num_edges, dtype=bool)  # the first edge of each (producer, consumer)
        if g.num_edges:
            order = np.lexsort((np.arange(g.num_edges), g.dst, g.src))
            same = (g.src[order][1:] == g.src[order][:-1]) & \
                (g.dst[order][1:] == g.dst[order][:-1])
            first[order[1:][same]] = False
        known[key] = first & carries[g.src]
    return np.where(known[key], np.asarray(g.edge_bytes, np.float64), 0.0)


def carries_gradient(g: Graph) -> np.ndarray:
    """Per node, whether its output can have a gradient: not an integer or boolean tensor, nor
    a model input, a constant or a tensor made from sizes (the same for the rescaled copies,
    which share the structure, ops and attributes)."""
    known = memo(g.structure, "carries gradient")
    key = (id(g.ops), id(g.attrs))
    if key not in known:
        carries = np.ones(g.num_nodes, dtype=bool)
        for op in _NO_GRAD_OPS:
            carries[g.nodes_with_op(op)] = False
        if g.attrs is not None:
            carries &= np.array([str(g.attr(u, "dtype", "")) not in _NO_GRAD_DTYPES
                                 for u in range(g.num_nodes)], dtype=bool)
        known[key] = carries
    return known[key]


def requires_gradient(g: Graph) -> np.ndarray:
    """Per node, whether its output requires a gradient at run time: it carries one
    (:func:`carries_gradient`) and is a parameter, has parameters (its own or a layer's it
    calls again), or reads an output that requires one (a slice of a causal-mask buffer or a
    position table made from sizes does not)."""
    known = memo(g.structure, "requires gradient")
    key = (id(g.ops), id(g.attrs), id(g.param_bytes))
    if key not in known:
        carries = carries_gradient(g)
        needs = carries & (np.asarray(g.param_bytes) > 0)
        needs[g.nodes_with_op("param")] = True
        if g.attrs is not None:  # a second call of a layer reads the first call's weights
            needs |= carries & np.array([bool(a.get("shared_params")) for a in g.attrs])
        # in topological order, each node after the inputs it reads (once per structure)
        out, ptr, idx = needs.tolist(), g.pred_ptr.tolist(), g.pred_idx.tolist()
        for v in topological_order(g).tolist():
            if not out[v] and carries[v]:
                out[v] = any(out[u] for u in idx[ptr[v]:ptr[v + 1]])
        known[key] = np.array(out, dtype=bool)
    return known[key]


_NO_GRAD_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})
# the model's inputs, constants and tensors made from sizes: nothing returns a gradient to them
_NO_GRAD_OPS = ("input", "constant", "scalar_tensor", "full", "ones", "zeros", "new_ones",
                "new_zeros", "arange", "sym_size", "size")


@njit
def _working_kernel(order, piece_of, n_p, src, dst, grad_edges, foreign, saved, out_bytes,
                    aliasing, summed, workspace, pred_ptr, pred_idx, layer_params, is_param, shared,
                    tied, tied_sum, pinned, freed0, pred_edge):
    """:func:`backward_working` in two passes (compiled): the edges, then the nodes in
    reverse topological order, each piece's saved bytes freed so far summed as it goes; also
    the largest with the parameters' gradients made so far added (a step's first backward).
    A node reading a weight another node owns (``shared``) makes a gradient for it that
    waits, in every backward, until the owner's (``tied``: the weight's bytes) joins it; an
    out-of-place sum (``tied_sum`` 1) holds one more copy while it is made; ``pinned``: the
    output gradient a parameter's ``.grad`` keeps, made with the node's; ``foreign``: the
    gradients a node makes for other pieces' inputs that stay to the backward's end."""
    n = order.shape[0]
    grads_in = np.zeros(n)  # the gradients a node returns for its inputs, made at once
    consumers = np.zeros(n, np.int64)  # consumers in its own piece
    outside = np.zeros(n, np.int64)  # 1: a consumer in another piece
    for e in range(src.shape[0]):
        u, v = src[e], dst[e]
        # the gradient it returns for an input, from its piece or not: one from another piece
        # (a received activation, a tied weight another piece holds) is made here too, beside
        # the node's working memory, and leaves only when the piece's backward ends
        grads_in[v] += grad_edges[e]
        if piece_of[u] == piece_of[v]:
            consumers[u] += 1
        else:
            outside[u] = 1
    freed = freed0.copy()  # saved bytes of the piece's later nodes (and loss), freed already
    handed = np.zeros(n_p)  # gradients for other pieces' inputs, held to the backward's end
    out = np.zeros(n_p)
    made = np.zeros(n_p)  # parameters' gradients its backward has made so far (.grad)
    out_first = np.zeros(n_p)
    credited = np.zeros(n, np.bool_)
    begun = np.zeros(n, np.bool_)  # a fork whose first consumer's backward has run
    tied_waiting = np.zeros(n_p)  # shared weights' gradients waiting for their owner's
    # an activation's gradient, from the backward of its last reader (in forward order) to its
    # own: counted here while the nodes between run (Mamba-2's chunked C: 64 MiB from the last
    # einsum that reads it to the first, 46 nodes earlier), where no other term holds it
    pending = np.zeros(n_p)
    pend = np.zeros(n)  # its bytes while pending
    state = np.zeros(n, np.int64)  # 0: no gradient yet, 1: pending, 2: its backward has run
    for i in range(n - 1, -1, -1):
        v = order[i]
        p = piece_of[v]
        # an output two consumers return gradients for: the gradient held and the one
        # arriving (added into it in place), less one when it came from another piece
        if consumers[v] + outside[v] >= 2:
            held = summed - outside[v]
        else:
            held = min(consumers[v], 1)
        # an input another of its consumers has returned a gradient for already: that
        # gradient waits while this node makes its own (the second branch of a ResNet's
        # downsampling block: 0.3 MiB over the prediction without it)
        # (a weight several layers read, a parameter node of torch.export's: its first
        # gradient waits from its first consumer's backward to its own; the last one sums
        # the two out of place)
        waiting = 0.0
        first_reads = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            if piece_of[u] == p and consumers[u] >= 2:
                if begun[u]:
                    waiting += out_bytes[u]
                else:
                    begun[u] = True
                    if is_param[u]:
                        first_reads += out_bytes[u]
        # the pending gradients its own terms do not count (its output's, its inputs')
        between = pending[p] - (pend[v] if state[v] == 1 else 0.0)
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            if state[u] == 1 and piece_of[u] == p:
                between -= pend[u]
        # with the fresh gradient of its own weights, until it is added into .grad
        work = held * out_bytes[v] + (0.0 if aliasing[v] else grads_in[v]) + workspace[v] \
            + waiting - freed[p] + layer_params[v] + shared[v] + tied_waiting[p] + handed[p] \
            + max(between, 0.0)
        if tied[v] > 0.0 and tied_waiting[p] > 0.0:  # a tied weight's gradients summed
            work += tied_sum * tied[v]
        if work > out[p]:
            out[p] = work
        if work + made[p] > out_first[p]:
            out_first[p] = work + made[p]
        freed[p] += saved[v]
        handed[p] += foreign[v]
        if state[v] == 1:
            pending[p] -= pend[v]
        state[v] = 2
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            if state[u] == 0 and piece_of[u] == p and not is_param[u] \
                    and grad_edges[pred_edge[k]] > 0.0:
                state[u] = 1
                pend[u] = grad_edges[pred_edge[k]]
                pending[p] += pend[u]
        tied_waiting[p] += shared[v] + first_reads
        if tied[v] > 0.0:
            tied_waiting[p] = max(tied_waiting[p] - tied[v], 0.0)
        if is_param[v] and begun[v]:  # the summed gradient goes into .grad
            tied_waiting[p] = max(tied_waiting[p] - out_bytes[v], 0.0)
            made[p] += out_bytes[v]
        # its weights' gradients stay (a parameter node's, captured by torch.export, once
        # its consumer has returned it)
        made[p] += layer_params[v] + pinned[v]
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            if is_param[u] and piece_of[u] == p and not credited[u] and consumers[u] < 2:
                credited[u] = True
                made[p] += out_bytes[u]
    return out, out_first
