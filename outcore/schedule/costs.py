"""Per-piece costs of one micro-batch: what the schedule builder and the simulator charge.

Node costs in the graph are for ``g.batch_size`` samples; a micro-batch of ``mb_size`` samples
scales times and activation bytes (not a parameter's, :func:`~outcore.graph.batch.batch_factor`)
by ``mb_size / batch_size`` (a linear model: accurate for
large layers, optimistic for tiny ones where fixed per-op costs dominate).

Memory policies change a piece's costs (``outcore.plan.policies``):

* ``checkpoint``: keeps only the piece's inputs between forward and backward; the backward
  first recomputes the forward (backward time + forward time) and holds the recomputed
  activations while it runs, plus the gradients flowing through the op being differentiated
  (three of the piece's largest outputs, as measured with the CPU tracker).
* ``offload-activations`` (device is not the host): nothing saved stays on the device; the
  copies out and back (``saved / host_bandwidth`` each way) overlap the piece's own forward and
  backward (a piece's time is the larger of compute and copy); the activations are back on the
  device while its backward runs.
* ``offload-params`` (device is not the host): the piece's parameters and optimizer state live
  on the host; the parameters are on the device only while the piece computes; fetching them
  (and returning gradients) overlaps compute the same way.

When the device *is* the host (CPU training) offloading changes nothing: no memory is saved,
no copy is paid.

Sharded parameters (a layout's ``depth``, FSDP / ZeRO-3) keep ``1 / depth`` of their parameters,
gradients and optimizer state on the device; every forward and backward first all-gathers the
piece's parameters (held while it runs), and the backward then reduce-scatters their gradients
(their flat copy and the shard it returns are held while it does; on CPU workers both
collectives are sums in place, so gloo holds no copies of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from outcore.cost.analytical import HALF_DTYPES
from outcore.cost.memory import state_factor
from outcore.graph.batch import batch_factor, bytes_at_scale
from outcore.graph.ir import Graph, attr_values, memo
from outcore.hardware.spec import DeviceSpec
from outcore.plan.pieces import Pieces
from outcore.schedule.backward import backward_working, pinned_gradients, requires_gradient
from outcore.schedule.ir import ENTRY_MIN_BYTES
from outcore.schedule.shared import shared_copies, shared_reads
from outcore.schedule.waiting import input_share, saves_own_output, waiting_outputs
from outcore.schedule.workspace import (
    broadcast_scratch,
    gather_scratch,
    matmul_broadcast_scratch,
    workspace_bytes,
)


@dataclass(frozen=True, eq=False)
class PieceCosts:
    """Costs per micro-batch, per piece / transfer / rank.

    Attributes:
        fwd_s, bwd_s: ``[pieces]`` forward and backward seconds of one micro-batch.
        saved_bytes: ``[pieces]`` activations kept from a piece's forward until its backward
            (less the received tensors its layers save: those are counted as received).
        transient_bytes: ``[pieces]`` working memory while the forward runs (largest output).
        transient_bwd_bytes: ``[pieces]`` working memory while the backward runs above what
            the piece holds when it starts: the gradients held at its costliest node less the
            saved activations already freed (:mod:`~outcore.schedule.backward`), and a fresh
            gradient of the largest layer's parameters (before it is accumulated into
            ``.grad``), plus recomputed or prefetched activations and fetched parameters
            under a memory policy.
        transfer_bytes: ``[transfers]`` bytes of one micro-batch's tensors.
        static_bytes: ``[ranks]`` parameters × optimizer state factor kept on the device,
            and the buffers read through constant nodes.
        param_bytes: ``[ranks]`` parameter bytes (what the optimizer updates).
        piece_param_bytes: ``[pieces]`` parameter bytes of each piece (its gradient bucket).
        policies: ``[pieces]`` memory policy of each piece.
        param_tensors: ``[ranks]`` parameter tensors each rank's optimizer updates (CPU
            optimizers pay a fixed cost per tensor).
        grad_bytes: ``[pieces]`` the part of ``static_bytes`` that is gradients made by the
            piece's first backward of a step and freed when the optimizer has stepped (the
            runtime clears them, ``zero_grad(set_to_none=True)``; a sharded piece's shard of
            them, which its reduce-scatter makes); 0 for pieces under a memory policy, whose
            state the policy accounts.
        collectives: per piece with any, the collectives its forward or backward runs inside
            itself (their time is in ``fwd_s`` / ``bwd_s``): ``(phase, kind, bytes, seconds)``
            per micro-batch, ``phase`` ``F`` or ``B`` (sharded parameters gathered and
            gradients reduce-scattered; tensor-parallel collectives), for the communication
            profile.
        out_grad_cap: ``[pieces]`` the bytes of a piece's distinct outputs that other pieces
            take: the gradients they hand back (or send) are summed into one per tensor and
            held until the piece's backward, so at most this much per micro-batch.
        first_bwd_extra: ``[pieces]`` what a step's first backward of the piece holds beyond
            ``transient_bwd_bytes``: the ``.grad`` tensors it has made so far at its costliest
            node (later backwards add into them, one fresh gradient at a time).
        fwd_held: ``[pieces]`` what the end of a piece's forward adds beside its saved
            bytes: its outputs waiting for later pieces of its rank, less those it was the
            last to wait for (:mod:`~outcore.schedule.waiting`).
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    saved_bytes: np.ndarray
    transient_bytes: np.ndarray
    transfer_bytes: np.ndarray
    static_bytes: np.ndarray
    param_bytes: np.ndarray
    piece_param_bytes: np.ndarray
    transient_bwd_bytes: np.ndarray | None = None
    policies: tuple[str, ...] = ()
    param_tensors: np.ndarray | None = None
    grad_bytes: np.ndarray | None = None
    collectives: dict[int, tuple[tuple[str, str, float, float], ...]] | None = None
    out_grad_cap: np.ndarray | None = None
    first_bwd_extra: np.ndarray | None = None
    fwd_held: np.ndarray | None = None

    @property
    def bwd_transient(self) -> np.ndarray:
        return self.transient_bwd_bytes if self.transient_bwd_bytes is not None \
            else self.transient_bytes


def mb_scale(g: Graph, mb_size: float | None) -> float:
    """Factor from the graph's batch to a micro-batch of ``mb_size`` samples."""
    if mb_size is None or not g.batch_size:
        return 1.0
    return float(mb_size) / float(g.batch_size)


def loss_cost_s(device: DeviceSpec) -> Callable[[float], tuple[float, float]]:
    """``bytes -> (forward, backward)`` seconds of the runtime's loss (cross-entropy or MSE,
    divided by the micro-batch count) on a model output of so many bytes: a few passes over
    the output, and a fixed cost. The fixed cost on CPU is measured here (one thread, 8 x 10
    logits: 11 us forward, 18 us backward); on an accelerator, a few kernel launches."""
    if device.host_is_device:
        fixed_f, fixed_b = 10e-6, 18e-6
    else:
        fixed_f, fixed_b = 3 * device.launch_s, 4 * device.launch_s
    bw = device.mem_bandwidth
    return lambda nbytes: (fixed_f + 3 * nbytes / bw, fixed_b + 3 * nbytes / bw)


def loss_bytes(g: Graph, output: int) -> float:
    """Bytes of the model output ``output`` as the loss computes on it: in float32 (autocast
    runs cross-entropy and MSE in float32, so a bfloat16 output's log-probabilities and their
    gradients take twice its bytes: without them a bf16-mixed transformer's peak was
    under-predicted by about its logits' size)."""
    nbytes = float(g.out_bytes[output])
    return nbytes * 2.0 if str(g.attr(output, "dtype", "float32")) in HALF_DTYPES else nbytes


def piece_costs(g: Graph, pieces: Pieces, num_ranks: int, *, scale: float = 1.0,
                optimizer: str = "adam", policies: tuple[str, ...] | None = None,
                host_bandwidth: float = 12e9, host_is_device: bool = False,
                fwd_overhead_s: float = 0.0, bwd_overhead_s: float = 0.0,
                overhead_overlaps: bool = False, sharded_bytes: np.ndarray | None = None,
                depth: int = 1, gather_s: Callable[[np.ndarray], np.ndarray] | None = None,
                scatter_s: Callable[[np.ndarray], np.ndarray] | None = None,
                loss_s: Callable[[float], tuple[float, float]] | None = None) -> PieceCosts:
    """Sum node costs over each piece, scaled to one micro-batch; apply memory policies.

    ``policies`` gives each piece's policy (default: none for every piece);
    ``fwd_overhead_s``/``bwd_overhead_s`` is the runtime's fixed cost per piece and micro-batch;
    with ``overhead_overlaps`` (GPUs) it is host work overlapping the device's, and a piece
    takes the longer of the two. ``sharded_bytes`` (per node) are parameter bytes sharded over
    ``depth`` copies; ``gather_s`` / ``scatter_s`` time an all-gather / reduce-scatter of so many
    (whole) bytes over them, per piece (an array of bytes in, of seconds out). ``loss_s``
    times the loss (forward, backward) on a model output of so many bytes
    (:func:`loss_cost_s`): the piece holding the output pays it.
    """
    n_p = pieces.num_pieces
    piece_of = pieces.piece_of
    fwd = np.bincount(piece_of, weights=g.fwd_s, minlength=n_p) * scale
    bwd = np.bincount(piece_of, weights=g.bwd_s, minlength=n_p) * scale
    tbytes = _transfer_bytes(g, pieces, scale)
    # bytes at the micro-batch (a parameter's do not change with it); times scaled above
    whole, g = g, bytes_at_scale(g, scale)
    # operators' scratch memory, as measured on CPU (an accelerator's libraries differ); the
    # same for every placement of the graph, so remembered with it
    if host_is_device:
        known = memo(whole, "workspace")
        if scale not in known:
            known[scale] = workspace_bytes(g)
        ws_f, ws_b = known[scale]
    else:
        ws_f = ws_b = np.zeros(g.num_nodes)
    gathers = gather_scratch(g)  # tensor parallelism's gathered outputs, on every device
    if gathers is not None:
        ws_f, ws_b = ws_f + gathers[0], ws_b + gathers[1]
    broadcast = broadcast_scratch(g)  # broadcast inputs' gradients at full size, likewise
    if broadcast is not None:
        ws_b = ws_b + broadcast
    products = matmul_broadcast_scratch(g)  # a broadcast operand of a batched product, too
    if products is not None:
        ws_f, ws_b = ws_f + products[0], ws_b + products[1]
    if loss_s is not None:
        for v in g.nodes_with_op("output").tolist():
            f, b = loss_s(loss_bytes(g, v))
            fwd[piece_of[v]] += f
            bwd[piece_of[v]] += b
    if overhead_overlaps:
        fwd, bwd = np.maximum(fwd, fwd_overhead_s), np.maximum(bwd, bwd_overhead_s)
    else:
        fwd, bwd = fwd + fwd_overhead_s, bwd + bwd_overhead_s
    saved = np.bincount(piece_of, weights=g.saved_bytes, minlength=n_p).astype(np.float64)
    rank_of_piece = pieces.device_of
    saved -= _saved_received(g, piece_of, rank_of_piece, n_p)
    pol = tuple(policies) if policies is not None else ("none",) * n_p
    saved += _resaved_held(g, pieces, np.array(
        [p == "checkpoint" or (p == "offload-activations" and not host_is_device)
         for p in pol], dtype=bool))
    # the inputs pieces hold: a checkpointed piece's (its saved bytes, below), other pieces'
    # small local inputs
    inputs = _held_inputs(g, pieces, pol)
    ckpt = np.array([p == "checkpoint" for p in pol], dtype=bool)
    saved[~ckpt] += inputs[~ckpt]
    if loss_s is not None:  # the runtime's loss keeps the output's log-probabilities
        # (cross-entropy) or its difference from the target (MSE) for its backward: hf:llama's
        # 256 KiB of logits were the whole gap between its measured peak and the prediction
        for v in g.nodes_with_op("output").tolist():
            saved[piece_of[v]] += loss_bytes(g, v)
    transient = np.zeros(n_p)
    np.maximum.at(transient, piece_of, g.out_bytes.astype(np.float64) + ws_f)
    piece_params = np.bincount(piece_of, weights=g.param_bytes, minlength=n_p)
    factor = state_factor(optimizer)
    # the loss's saved bytes are freed by its backward, before any node's
    loss_freed = np.zeros(n_p)
    if loss_s is not None:
        for v in g.nodes_with_op("output").tolist():
            loss_freed[piece_of[v]] += loss_bytes(g, v)
    reads = shared_reads(whole)  # the same for every placement and micro-batch
    t_bwd, grad_tmp, t_first = _backward_bytes(g, piece_of, n_p, pol, ws_b, loss_freed, reads)
    if loss_s is not None:  # the loss's backward: the gradients of the log-probabilities and
        # of the output together (GPT-2's stage of logits: 0.13 MiB over without the first)
        for v in g.nodes_with_op("output").tolist():
            p = piece_of[v]
            t_bwd[p] = max(t_bwd[p], 2.0 * loss_bytes(g, v))
    # the .grad tensors a backward has made so far, beyond its working memory
    made = np.maximum(t_first - t_bwd, 0.0) if n_p else np.zeros(0)
    plain = np.array([p == "none" for p in pol], dtype=bool)
    # a rank's own copy of a shared weight another rank owns (not in the piece's bucket: the
    # shared parameters' all-reduce sums it)
    copies = shared_copies(g, piece_of, rank_of_piece, n_p, reads)
    # and the buffers it reads through constant nodes (a causal mask of 128x128 positions per
    # layer in hf:openai-gpt) or its layers hold (batch norm's running statistics: 28 KiB of a
    # ShuffleNet stage past its limit), all run long as the parameters are, without gradients
    constants = g.nodes_with_op("constant")
    static_piece = (piece_params + copies) * factor + np.bincount(
        piece_of[constants], weights=np.asarray(g.out_bytes, np.float64)[constants],
        minlength=n_p) + np.bincount(piece_of, weights=buffer_bytes(g), minlength=n_p)
    if any(p != "none" for p in pol):
        _apply_policies(g, pieces, pol, host_bandwidth, host_is_device, fwd, bwd,
                        saved, transient, t_bwd, grad_tmp, static_piece, piece_params, inputs)
    inner = None
    if sharded_bytes is not None and depth > 1:
        inner = _shard(piece_of, n_p, np.asarray(sharded_bytes, dtype=np.float64), depth,
                       factor, gather_s, scatter_s, fwd, bwd, transient, t_bwd, static_piece,
                       piece_params, grad_tmp, made, plain)
    # a sharded piece's gradient shard is made by its first reduce-scatter, like a whole one
    # (with the output gradients parameters' .grad views keep alive)
    pinned = np.bincount(piece_of, weights=pinned_gradients(g), minlength=n_p)
    grads = np.where(plain, piece_params + copies + pinned, 0.0) if n_p else np.zeros(0)
    static_piece = static_piece + np.where(plain, pinned, 0.0)
    # a step's first backward of a piece holds the .grad tensors it has made so far (a
    # sharded piece's whole gradients are in its own term)
    first_extra = np.where(plain, np.maximum(t_first - t_bwd, 0.0), 0.0) if n_p \
        else np.zeros(0)
    if inner:
        first_extra[list(inner)] = 0.0
    if n_p:  # a forward holds what its earlier layers saved beside a late layer's output and
        # scratch (a ResNet's pooling of its joined bfloat16 tiles peaked in the forward)
        known = memo(whole, "layer_inputs")  # the same for every placement of the graph
        if scale not in known:
            known[scale] = _layer_inputs(g)
        late = _forward_peaks(g, piece_of, n_p, ws_f, known[scale])
        transient = np.where(plain, np.maximum(transient, late), transient)
    static = np.bincount(rank_of_piece, weights=static_piece, minlength=num_ranks) \
        if n_p else np.zeros(num_ranks)
    params = np.bincount(rank_of_piece, weights=piece_params + copies, minlength=num_ranks) \
        if n_p else np.zeros(num_ranks)
    tensors = np.zeros(num_ranks)
    if n_p:
        if g.attrs is not None:
            held: list[set[str]] = [set() for _ in range(num_ranks)]
            for v in range(g.num_nodes):
                names = (g.attr(v, "params", []) or []) + (g.attr(v, "shared_params", []) or [])
                held[rank_of_piece[piece_of[v]]].update(names)
            tensors = np.array([len(h) for h in held], dtype=np.float64)
    waiting = waiting_outputs(g, pieces, _storage_bytes(g, np.arange(g.num_nodes)))
    return PieceCosts(fwd, bwd, saved, transient, tbytes, static, params, piece_params, t_bwd,
                      pol, tensors, grads, inner, _taken_outputs(g, pieces), first_extra,
                      waiting)


def _layer_inputs(g: Graph) -> np.ndarray:
    """Per node, the bytes of the activations it reads (weights, read through parameter and
    constant nodes, are the rank's static memory already)."""
    inputs = np.zeros(g.num_nodes)
    held = np.asarray(g.edge_bytes, np.float64).copy()
    for op in ("param", "constant"):
        held[np.isin(g.src, g.nodes_with_op(op))] = 0.0
    np.add.at(inputs, g.dst, held)
    return inputs


def _forward_peaks(g: Graph, piece_of: np.ndarray, n_p: int, ws_f: np.ndarray,
                   inputs: np.ndarray) -> np.ndarray:
    """Per piece, the most its forward holds above where it began: over its layers in order,
    what the layers before saved, plus the layer's ``inputs``, output and scratch."""
    order = np.argsort(piece_of, kind="stable")  # by piece, each in graph (topological) order
    saved = np.asarray(g.saved_bytes, np.float64)[order]
    before = np.cumsum(saved) - saved
    pieces = piece_of[order]
    starts = np.flatnonzero(np.r_[True, pieces[1:] != pieces[:-1]])
    before -= np.repeat(before[starts], np.diff(np.r_[starts, len(order)]))
    out = np.zeros(n_p)
    np.maximum.at(out, pieces, before + inputs[order] + np.asarray(g.out_bytes, np.float64)[order]
                  + ws_f[order])
    return out


def _backward_bytes(g: Graph, piece_of: np.ndarray, n_p: int, pol: tuple[str, ...],
                    workspace: np.ndarray | None = None, freed: np.ndarray | None = None,
                    reads: tuple[np.ndarray, ...] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per piece, its backward's working memory (:mod:`~outcore.schedule.backward`), the
    fresh gradient of its largest layer alone, and the first backward's working memory (with
    the ``.grad`` tensors it has made so far). The backward holds a layer's fresh gradient
    while that layer's backward runs, until it is added into ``.grad`` (an embedding's, counted
    while the layers after it ran theirs, put an LM's first stage 14 % over what it
    measured); a parameter that is a node of its own, as torch.export captures them, passes
    its gradient along an edge, which the working memory counts already."""
    grad_tmp = np.zeros(n_p)
    layer_params = g.param_bytes.astype(np.float64)
    layer_params[g.nodes_with_op("param")] = 0.0
    np.maximum.at(grad_tmp, piece_of, layer_params)
    t_bwd, t_first = backward_working(g, piece_of, n_p, workspace=workspace, first=True,
                                      freed=freed, reads=reads)
    if "checkpoint" in pol:  # a recomputing backward sums a forked output's gradients out of
        # place (a checkpointed ResNet: 17.0 MiB measured, 14.4 predicted with the in-place sum)
        ck = np.array([p == "checkpoint" for p in pol], dtype=bool)
        t_bwd[ck] = backward_working(g, piece_of, n_p, summed=3, workspace=workspace,
                                     freed=freed, reads=reads)[ck]
    return t_bwd, grad_tmp, t_first


def _saved_received(g: Graph, piece_of: np.ndarray, rank_of_piece: np.ndarray,
                    n_p: int, *, same_rank: bool = False) -> np.ndarray:
    """Per piece, the saved bytes that are tensors it receives from another rank: the
    received copy is what autograd saves, held from its receive (counted there) to the
    backward, so the piece's saved activations must not count it again. With ``same_rank``,
    those it takes from other pieces of its own rank instead (a checkpointed piece keeps them
    rather than recomputing them)."""
    savers, producers = g.saved_input_pairs
    if not savers.size or not n_p:
        return np.zeros(n_p)
    p_s, p_u = piece_of[savers], piece_of[producers]
    cross = rank_of_piece[p_s] != rank_of_piece[p_u]
    if same_rank:
        cross = ~cross & (p_s != p_u)
    if not cross.any():
        return np.zeros(n_p)
    s, u = savers[cross], producers[cross]
    return np.bincount(piece_of[s], weights=input_share(g, s, u), minlength=n_p)


def _resaved_held(g: Graph, pieces: Pieces, dropped: np.ndarray) -> np.ndarray:
    """Per piece, the bytes of tensors its layers save for their backward whose bytes another
    layer's saved bytes count but do not hold on this rank: that layer's piece recomputes or
    offloads what it saved (``dropped``), or runs on another rank (which saves its received
    copy). A checkpointed block's last ReLU saves its output, which the next block's plain
    convolutions save too: dropped with the ReLU's saved bytes, it was a bfloat16 CNN's whole
    gap over its prediction. Each tensor once per rank, at its first such piece (which holds it
    longest); tensors received from another rank are held as received (counted there)."""
    n_p = pieces.num_pieces
    savers, producers = g.resaved_input_pairs
    if not savers.size or not n_p:
        return np.zeros(n_p)
    piece_of, device, root = pieces.piece_of, pieces.device_of, g.storage_root
    # the layer whose saved bytes count each storage: its first saver, else the node that
    # made it
    counted = np.arange(g.num_nodes)
    first_s, first_u = g.saved_input_pairs
    if first_s.size:  # the earliest saver where several are listed
        counted[root[first_u[::-1]]] = first_s[::-1]
    rank = device[piece_of[producers]]
    c = counted[root[producers]]
    held = (device[piece_of[savers]] == rank) & ~dropped[piece_of[savers]]
    held &= (device[piece_of[c]] != rank) | dropped[piece_of[c]]
    if not held.any():
        return np.zeros(n_p)
    s, r = savers[held], root[producers[held]]
    o = np.lexsort((piece_of[s], r))
    _, first = np.unique(r[o], return_index=True)
    keep = o[first]
    return np.bincount(piece_of[s[keep]], weights=_storage_bytes(g, r[keep]), minlength=n_p)


def buffer_bytes(g: Graph) -> np.ndarray:
    """Per node, the bytes of its layer's buffers (``attrs['buffer_bytes']``, recorded by the
    capture: batch norm's running statistics; a torch.export graph reads them through
    constant nodes instead)."""
    return attr_values(g, "buffer_bytes")


def _storage_bytes(g: Graph, nodes: np.ndarray) -> np.ndarray:
    """The bytes of the storages the outputs of ``nodes`` (storage roots) hold."""
    return g.out_bytes[nodes].astype(np.float64) * _storage_share(g)[nodes]


def _taken_outputs(g: Graph, pieces: Pieces) -> np.ndarray:
    """Per piece, the bytes of its distinct outputs that other pieces take."""
    n_p = pieces.num_pieces
    prods = np.unique(pieces.tensor_idx)
    return np.bincount(pieces.piece_of[prods], weights=g.out_bytes[prods].astype(np.float64),
                       minlength=n_p)


def _transfer_bytes(g: Graph, pieces: Pieces, scale: float) -> np.ndarray:
    """Per transfer, the bytes of one micro-batch at ``scale``: a tensor that does not grow
    with the batch (a tied weight one piece reads and hands on) at its whole size."""
    total = pieces.transfer_bytes.astype(np.float64)
    if scale == 1.0 or not total.size:
        return total
    fixed = batch_factor(g, scale)[pieces.tensor_idx] == 1.0
    const = np.zeros(total.size)
    if fixed.any():
        tid = np.repeat(np.arange(total.size), np.diff(pieces.tensor_ptr))
        np.add.at(const, tid[fixed], g.out_bytes[pieces.tensor_idx[fixed]].astype(np.float64))
        const = np.minimum(const, total)
    return (total - const) * scale + const


def _shard(piece_of: np.ndarray, n_p: int, sharded: np.ndarray, depth: int, factor: float,
           gather_s: Callable[[np.ndarray], np.ndarray] | None,
           scatter_s: Callable[[np.ndarray], np.ndarray] | None,
           fwd: np.ndarray, bwd: np.ndarray, transient: np.ndarray, t_bwd: np.ndarray,
           static_piece: np.ndarray, piece_params: np.ndarray, grad_tmp: np.ndarray,
           made: np.ndarray, plain: np.ndarray
           ) -> dict[int, tuple[tuple[str, str, float, float], ...]]:
    """Apply FSDP / ZeRO-3 sharding to the piece costs in place (see the module docstring);
    ``gather_s`` / ``scatter_s`` take the pieces' sharded bytes as an array; ``made``: per
    piece, what its backward holds beyond its working memory in the whole gradients it has
    made so far, which a ``plain`` piece (no memory policy) counts (every backward of a
    sharded piece makes them anew; one under a policy counts them whole from its first
    node). Returns the gathers and reduce-scatters per piece
    (:attr:`PieceCosts.collectives`)."""
    sb = np.bincount(piece_of, weights=sharded, minlength=n_p)
    p = np.flatnonzero(sb > 0)
    b = sb[p]
    static_piece[p] -= b * factor * (1 - 1 / depth)
    piece_params[p] -= b * (1 - 1 / depth)  # what this rank's optimizer updates
    transient[p] += b  # the gathered parameters, while the forward runs
    # gathered parameters and the whole gradients (which hold the fresh gradient of the
    # largest layer already counted); then the reduce-scatter: the gradients' flat copy and
    # the shard it returns (on a CPU a sum in place, without gloo's copy of the flat input:
    # ``parallel/sharding._sums_in_place``)
    scatter_bytes = b * (1 + 1 / depth)
    # a plain piece's gradients as its backward makes them (GPT-2's last stage counted them
    # whole at its output layer, whose weight another piece owns: 13 % over what a bfloat16
    # rank measured)
    whole = np.where(plain[p], b + made[p], 2 * b - np.minimum(grad_tmp[p], b))
    t_bwd[p] = np.maximum(t_bwd[p] + whole, scatter_bytes)
    gather = gather_s(b) if gather_s is not None else np.zeros_like(b)
    scatter = scatter_s(b) if scatter_s is not None else np.zeros_like(b)
    fwd[p] += gather
    bwd[p] += gather + scatter
    gather, scatter = np.broadcast_to(gather, b.shape), np.broadcast_to(scatter, b.shape)
    return {int(q): (("F", "shard allgather", float(x), float(tg)),
                     ("B", "shard allgather", float(x), float(tg)),
                     ("B", "shard reduce_scatter", float(x), float(ts)))
            for q, x, tg, ts in zip(p, b, gather, scatter)}


def _held_inputs(g: Graph, pieces: Pieces, pol: tuple[str, ...]) -> np.ndarray:
    """Per piece, the bytes of the inputs it holds until its backward that nothing else
    holds: a checkpointed piece keeps the tensors it takes from pieces of its own rank and the
    model inputs it reads; any other piece the differentiable tensors under
    :data:`~outcore.schedule.ir.ENTRY_MIN_BYTES` it takes from pieces of its own rank (the
    executor's autograd leaves: 36 KiB of a checkpointed LM's heads over its prediction).
    Each tensor once per rank (at its first consumer piece, which holds it longest: its
    backward runs last) and not when a layer without a policy saves it already (its consumer,
    or its producer when that saves its output). Tensors received from another rank are held
    as received (the simulator counts them there)."""
    n_p, piece_of, n, device = pieces.num_pieces, pieces.piece_of, g.num_nodes, pieces.device_of
    ckpt = np.array([name == "checkpoint" for name in pol], dtype=bool)
    held = g.nodes_with_op("input").astype(np.int64)
    # every tensor of a local transfer, with its destination piece, in transfer order
    tid = np.repeat(np.arange(pieces.num_transfers), np.diff(pieces.tensor_ptr))
    local = pieces.transfer_local[tid]
    P = np.concatenate([piece_of[held], pieces.transfer_dst[tid[local]]])
    U = np.concatenate([held, pieces.tensor_idx[local]])
    root = g.storage_root  # a view holds the storage it views: each storage once per rank
    is_param = np.zeros(n, dtype=bool)
    is_param[g.nodes_with_op("param")] = True
    rest = U[held.size:]
    leaf = np.r_[np.zeros(held.size, bool), (g.out_bytes[rest] < ENTRY_MIN_BYTES)
                 & ~is_param[root[rest]] & requires_gradient(g)[rest]]
    take = ckpt[P] | leaf
    P, U = P[take], U[take]
    if not P.size:
        return np.zeros(n_p)
    R = root[U]
    key = device[P] * n + R
    # held already: by a layer without a policy that saves it (first or again), or by the
    # node that made it when that saves its output (a ReLU: what it saves beyond the inputs it
    # first saves covers its output) and is not checkpointed itself
    holds = saves_own_output(g) & ~ckpt[piece_of]
    covered = (holds[U] | holds[R]) & (device[piece_of[R]] == device[P])
    for s, u in (g.saved_input_pairs, g.resaved_input_pairs):
        plain = ~ckpt[piece_of[s]]
        covered |= np.isin(key, device[piece_of[s[plain]]] * n + root[u[plain]])
    o = np.lexsort((U, P))
    o = o[~covered[o]]  # uncovered, by consumer piece
    _, first = np.unique(key[o], return_index=True)  # each storage once per rank, first piece
    keep = o[first]
    return np.bincount(P[keep], weights=_storage_bytes(g, R[keep]), minlength=n_p)


def _storage_share(g: Graph) -> np.ndarray:
    """Per node, how many times its output's bytes the storage it views holds (``attrs
    ['storage_share']``, recorded by the capture; 1 for most): a chunk of a tensor keeps the
    whole tensor alive (ShuffleNet's checkpointed branches keep their inputs, half of a
    block's output each, and measured 1 % over without the other half)."""
    return attr_values(g, "storage_share", 1.0)  # recorded only where the storage is larger


# torch.utils.checkpoint keeps the CPU generator's state (``torch.get_rng_state()``, a
# Mersenne Twister's) from a checkpointed forward to its recompute, in host memory: on a CPU
# device, a checkpointed piece's saved bytes
CPU_RNG_STATE_BYTES = 5056


def _apply_policies(g: Graph, pieces: Pieces, pol: tuple[str, ...], host_bandwidth: float,
                    host_is_device: bool,
                    fwd: np.ndarray, bwd: np.ndarray, saved: np.ndarray, transient: np.ndarray,
                    t_bwd: np.ndarray, grad_tmp: np.ndarray, static_piece: np.ndarray,
                    piece_params: np.ndarray, inputs: np.ndarray) -> None:
    """Apply the pieces' memory policies to their costs in place (see the module docstring);
    ``inputs``: per checkpointed piece, what it keeps (:func:`_held_inputs`)."""
    n_p, piece_of = pieces.num_pieces, pieces.piece_of
    kept_saved = _saved_received(g, piece_of, pieces.device_of, n_p, same_rank=True)
    for p, name in enumerate(pol):
        if name == "checkpoint":
            # the recompute brings back what the forward saved (but the inputs, kept) and
            # runs with one working buffer; the backward then works as it would have
            t_bwd[p] = saved[p] - kept_saved[p] + max(transient[p], t_bwd[p])
            bwd[p] += fwd[p]
            saved[p] = inputs[p] + (CPU_RNG_STATE_BYTES if host_is_device else 0.0)
        elif name == "offload-activations" and not host_is_device:
            copy_s = saved[p] / host_bandwidth
            fwd[p] = max(fwd[p], copy_s)
            bwd[p] = max(bwd[p], copy_s)
            t_bwd[p] = saved[p] + max(transient[p], t_bwd[p])  # fetched back, then as usual
            saved[p] = 0.0
        elif name == "offload-params" and not host_is_device:
            copy_s = piece_params[p] / host_bandwidth
            fwd[p] = max(fwd[p], copy_s)
            bwd[p] = max(bwd[p], 2 * copy_s)
            transient[p] += piece_params[p]
            t_bwd[p] += 2 * piece_params[p]  # parameters and their gradients
            static_piece[p] = 0.0
