"""Synthetic training graphs shaped like the models of the ParDNN paper, at any size.

Each ``make_<family>(target_nodes, seed)`` returns a :class:`~outcore.graph.ir.Graph` of about
``target_nodes`` nodes (within one repeated unit: a time step, a block, a layer, a cell), built
with numpy only (a 1M-node graph takes about a second), deterministic for a given seed. Nodes
are numbered in a topological order (every edge goes from a lower to a higher index).

Costs are plausible, not measured: forward time = 5 us launch + max(FLOPs / 20 TFLOP/s,
bytes touched / 1 TB/s), jittered by +-10 %; backward = 2x forward for layers with weights, 1x
otherwise; outputs and saved activations in fp32 bytes from the shapes; every edge carries its
producer's output. The families (Qararyah et al. 2021, section 5, evaluated word-RNNs, a character
RNN, Transformer-XL, AmoebaNet and a wide ResNet; the U-Net family adds long skips):

* ``rnn``: a stacked RNN unrolled in time, a grid of layers x time steps, with one weight node per
  layer feeding all its time steps (weights are shared across time, as TensorFlow graphs show).
* ``resnet``: a wide ResNet (three stages of basic blocks with identity skips).
* ``transformer``: transformer layers whose attention is split into parallel per-head branches.
* ``nas``: AmoebaNet-like cells: each reads the two previous cells and runs five pairs of random
  branches (a seeded normal and a reduction genotype, repeated as in the paper's model).
* ``unet``: an encoder-decoder with a long skip from each encoder level to its decoder level.
* ``chain``: a VGG-like chain of layers without skips, whose activations shrink and parameters
  grow with depth (a memory-balanced split and a time-balanced one differ), layer widths
  drawn at random per stage.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph, build

_FLOPS = 20e12        # effective FLOP/s
_MEM_BW = 1e12        # bytes/s
_LAUNCH_S = 5e-6
_F32 = 4


class _Nodes:
    """Accumulates node blocks (costs per node) and edge blocks, then builds the graph."""

    def __init__(self) -> None:
        self.n = 0
        self.ops: list[str] = []
        self.op_code: list[np.ndarray] = []
        self.flops: list[np.ndarray] = []
        self.out: list[np.ndarray] = []
        self.params: list[np.ndarray] = []
        self.saved: list[np.ndarray] = []
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []

    def _costs(self, idx: np.ndarray, code: int, flops: float, out_bytes: float,
               param_bytes: float, saved_bytes: float | None) -> None:
        k = idx.size
        self.op_code.append(np.stack([idx, np.full(k, code)]))
        self.flops.append(np.full(k, float(flops)))
        self.out.append(np.full(k, float(out_bytes)))
        self.params.append(np.full(k, float(param_bytes)))
        self.saved.append(np.full(k, float(out_bytes if saved_bytes is None else saved_bytes)))

    def at(self, idx: np.ndarray | Sequence[int | np.integer], op: str, flops: float,
           out_bytes: float, param_bytes: float = 0.0,
           saved_bytes: float | None = None) -> np.ndarray:
        """Give costs to explicit node indices (inside a range made by :meth:`grow`)."""
        if op not in self.ops:
            self.ops.append(op)
        self._costs(np.asarray(idx, np.int64), self.ops.index(op), flops, out_bytes,
                    param_bytes, saved_bytes)
        return np.asarray(idx, np.int64)

    def grow(self, count: int) -> int:
        """Reserve ``count`` consecutive indices; return the first."""
        first = self.n
        self.n += count
        return first

    def edges(self, s: np.ndarray | int | np.integer, d: np.ndarray | int | np.integer) -> None:
        s_arr, d_arr = np.broadcast_arrays(np.asarray(s, np.int64), np.asarray(d, np.int64))
        self.src.append(s_arr.ravel())
        self.dst.append(d_arr.ravel())

    def graph(self, name: str, seed: int, meta: dict, *, batch_size: int) -> Graph:
        """The graph of the nodes made so far, costed for ``batch_size`` samples (every
        activation and time scales with them: the layout search may split the batch)."""
        n = self.n
        rng = np.random.default_rng(seed)
        pos = np.concatenate([c[0] for c in self.op_code])
        if pos.size != n or np.unique(pos).size != n:
            raise AssertionError(f"generator {name}: {pos.size} costed nodes for {n} indices")
        code = np.empty(n, np.int64)
        flops, out, params, saved = (np.empty(n) for _ in range(4))
        code[pos] = np.concatenate([c[1] for c in self.op_code])
        flops[pos] = np.concatenate(self.flops)
        out[pos] = np.concatenate(self.out)
        params[pos] = np.concatenate(self.params)
        saved[pos] = np.concatenate(self.saved)
        touched = out + params + saved
        fwd = (_LAUNCH_S + np.maximum(flops / _FLOPS, touched / _MEM_BW)) * rng.uniform(0.9, 1.1, n)
        bwd = fwd * np.where(params > 0, 2.0, 1.0) * rng.uniform(0.9, 1.1, n)
        src = np.concatenate(self.src) if self.src else np.zeros(0, np.int64)
        dst = np.concatenate(self.dst) if self.dst else np.zeros(0, np.int64)
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        if src.size and not bool((src < dst).all()):
            raise AssertionError(f"generator {name}: an edge goes backwards in index order")
        ops = tuple(self.ops[c] for c in code.tolist())
        return build(name, fwd_s=fwd, bwd_s=bwd, src=src, dst=dst, edge_bytes=out[src],
                     param_bytes=params, out_bytes=out, saved_bytes=saved, ops=ops,
                     meta={"generator": name, "seed": seed, **meta}, batch_size=batch_size)


def _check(target_nodes: int, smallest: int, family: str) -> int:
    if not isinstance(target_nodes, (int, np.integer)) or target_nodes < smallest:
        raise UsageError(f"make_{family} needs target_nodes >= {smallest}, got {target_nodes!r}")
    return int(target_nodes)


def make_rnn(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """A stacked RNN (LSTM cells) unrolled in time: a grid of layers x time steps."""
    target = _check(target_nodes, 8, "rnn")
    rng = np.random.default_rng(seed)
    layers = int(np.clip(round(np.sqrt(target) / 16), 2, 32))
    steps = max(1, (target - layers - 2) // (layers + 3))
    h = int(rng.choice([512, 1024, 1536]))
    b, vocab = 32, 8192
    nb = _Nodes()
    p0 = nb.grow(layers + 2)
    w_emb = nb.at([p0], "param", 0, vocab * h * _F32, vocab * h * _F32, 0)
    w_cell = nb.at(p0 + 1 + np.arange(layers), "param", 0, 8 * h * h * _F32, 8 * h * h * _F32, 0)
    w_proj = nb.at([p0 + layers + 1], "param", 0, h * vocab * _F32, h * vocab * _F32, 0)
    unit = layers + 3
    base = nb.grow(steps * unit) + unit * np.arange(steps, dtype=np.int64)
    emb, proj, loss = base, base + layers + 1, base + layers + 2
    nb.at(emb, "embedding", 0, b * h * _F32)
    cells = base[:, None] + 1 + np.arange(layers)[None, :]
    nb.at(cells.ravel(), "lstm_cell", 16 * b * h * h, 2 * b * h * _F32, 0, 6 * b * h * _F32)
    nb.at(proj, "linear", 2 * b * h * vocab, b * vocab * _F32)
    nb.at(loss, "cross_entropy", 4 * b * vocab, b * _F32, 0, b * vocab * _F32)
    nb.edges(w_emb[0], emb)
    nb.edges(emb, cells[:, 0])
    nb.edges(cells[:, :-1], cells[:, 1:])
    nb.edges(w_cell[None, :], cells)
    nb.edges(cells[:-1, :], cells[1:, :])
    nb.edges(cells[:, -1], proj)
    nb.edges(w_proj[0], proj)
    nb.edges(proj, loss)
    nb.edges(loss[:-1], loss[1:])
    return nb.graph("rnn", seed, {"layers": layers, "steps": steps, "hidden": h}, batch_size=b)


def make_resnet(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """A wide ResNet: stem, three stages of basic blocks (conv-bn-relu-conv-bn + skip), head."""
    target = _check(target_nodes, 20, "resnet")
    rng = np.random.default_rng(seed)
    width = int(rng.choice([4, 8, 10]))
    b = 128
    blocks = max(3, (target - 8) // 7)
    per_stage = [blocks // 3 + (1 if s < blocks % 3 else 0) for s in range(3)]
    nb = _Nodes()
    stem = nb.grow(3) + np.arange(3)
    nb.at(stem[:1], "conv2d", 2 * b * 32 * 32 * 27 * 16, b * 32 * 32 * 16 * _F32,
          27 * 16 * _F32)
    nb.at(stem[1:2], "batch_norm", 10 * b * 32 * 32 * 16, b * 32 * 32 * 16 * _F32, 32 * _F32)
    nb.at(stem[2:], "relu", b * 32 * 32 * 16, b * 32 * 32 * 16 * _F32)
    nb.edges(stem[:-1], stem[1:])
    prev, cin = int(stem[-1]), 16
    for s, count in enumerate(per_stage):
        c, hw = 16 * width * 2 ** s, (32 >> s) ** 2
        act = b * hw * c * _F32
        shortcut = -1
        if cin != c:
            shortcut = nb.grow(1)
            nb.at([shortcut], "conv2d", 2 * b * hw * cin * c, act, cin * c * _F32)
            nb.edges(prev, shortcut)
        base = nb.grow(7 * count) + 7 * np.arange(count, dtype=np.int64)
        conv1, bn1, relu1, conv2, bn2, add, relu = (base + i for i in range(7))
        nb.at(conv1[:1], "conv2d", 2 * b * hw * 9 * cin * c, act, 9 * cin * c * _F32)
        nb.at(conv1[1:], "conv2d", 2 * b * hw * 9 * c * c, act, 9 * c * c * _F32)
        for idx in (conv2,):
            nb.at(idx, "conv2d", 2 * b * hw * 9 * c * c, act, 9 * c * c * _F32)
        for idx in (bn1, bn2):
            nb.at(idx, "batch_norm", 10 * b * hw * c, act, 2 * c * _F32)
        for idx in (relu1, relu):
            nb.at(idx, "relu", b * hw * c, act)
        nb.at(add, "add", b * hw * c, act, 0, 0)
        inputs = np.concatenate(([prev], relu[:-1]))
        nb.edges(inputs, conv1)
        for x, y in ((conv1, bn1), (bn1, relu1), (relu1, conv2), (conv2, bn2), (bn2, add),
                     (add, relu)):
            nb.edges(x, y)
        skip = inputs.copy()
        if shortcut >= 0:
            skip[0] = shortcut
        nb.edges(skip, add)
        prev, cin = int(relu[-1]), c
    head = nb.grow(3) + np.arange(3)
    nb.at(head[:1], "avg_pool", b * 64 * cin, b * cin * _F32)
    nb.at(head[1:2], "linear", 2 * b * cin * 1000, b * 1000 * _F32, cin * 1000 * _F32)
    nb.at(head[2:], "cross_entropy", 4 * b * 1000, b * _F32, 0, b * 1000 * _F32)
    nb.edges(np.concatenate(([prev], head[:-1])), head)
    return nb.graph("resnet", seed, {"blocks": blocks, "width": width}, batch_size=b)


def make_transformer(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """Transformer layers whose attention runs as parallel per-head branches (q, k, v, ...)."""
    target = _check(target_nodes, 30, "transformer")
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([8, 12, 16]))
    d, seq, b = 1024, 512, 4
    dh = d // heads
    unit = 6 * heads + 9
    layers = max(1, (target - 4) // unit)
    tok = b * seq
    act = tok * d * _F32
    nb = _Nodes()
    emb = nb.grow(1)
    nb.at([emb], "embedding", 0, act, 32000 * d * _F32)
    base = nb.grow(layers * unit) + unit * np.arange(layers, dtype=np.int64)
    x = np.concatenate(([emb], base[:-1] + unit - 1))
    ln1 = base
    nb.at(ln1, "layer_norm", 8 * tok * d, act, 2 * d * _F32)
    hb = base[:, None] + 1 + 6 * np.arange(heads)[None, :]
    q, k, v, sc, sm, ctx = (hb + i for i in range(6))
    for idx in (q, k, v):
        nb.at(idx.ravel(), "linear", 2 * tok * d * dh, tok * dh * _F32, d * dh * _F32)
    nb.at(sc.ravel(), "matmul", 2 * b * seq * seq * dh, b * seq * seq * _F32)
    nb.at(sm.ravel(), "softmax", 5 * b * seq * seq, b * seq * seq * _F32)
    nb.at(ctx.ravel(), "matmul", 2 * b * seq * seq * dh, tok * dh * _F32)
    tail = base + 1 + 6 * heads
    concat, out, add1, ln2, ff1, gelu, ff2, add2 = (tail + i for i in range(8))
    nb.at(concat, "cat", tok * d, act, 0, 0)
    nb.at(out, "linear", 2 * tok * d * d, act, d * d * _F32)
    nb.at(add1, "add", tok * d, act, 0, 0)
    nb.at(ln2, "layer_norm", 8 * tok * d, act, 2 * d * _F32)
    nb.at(ff1, "linear", 8 * tok * d * d, 4 * act, 4 * d * d * _F32)
    nb.at(gelu, "gelu", 8 * tok * d, 4 * act)
    nb.at(ff2, "linear", 8 * tok * d * d, act, 4 * d * d * _F32)
    nb.at(add2, "add", tok * d, act, 0, 0)
    nb.edges(x, ln1)
    for idx in (q, k, v):
        nb.edges(ln1[:, None], idx)
    nb.edges(q, sc)
    nb.edges(k, sc)
    nb.edges(sc, sm)
    nb.edges(sm, ctx)
    nb.edges(v, ctx)
    nb.edges(ctx, concat[:, None])
    for a, c in ((concat, out), (out, add1), (x, add1), (add1, ln2), (ln2, ff1), (ff1, gelu),
                 (gelu, ff2), (ff2, add2), (add1, add2)):
        nb.edges(a, c)
    head = nb.grow(3) + np.arange(3)
    nb.at(head[:1], "layer_norm", 8 * tok * d, act, 2 * d * _F32)
    nb.at(head[1:2], "linear", 2 * tok * d * 32000, tok * 32000 * _F32, d * 32000 * _F32)
    nb.at(head[2:], "cross_entropy", 4 * tok * 32000, _F32, 0, tok * 32000 * _F32)
    nb.edges(np.concatenate(([add2[-1]], head[:-1])), head)
    return nb.graph("transformer", seed, {"layers": layers, "heads": heads}, batch_size=b)


_NAS_OPS = (("sep_conv3", 9, 2), ("sep_conv5", 25, 2), ("avg_pool3", 9, 0),
            ("max_pool3", 9, 0), ("identity", 0, 0), ("conv7x1_1x7", 14, 1))


def _genotype(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Five blocks: two input states each (0, 1 = cell inputs, 2 + j = block j) and two ops."""
    inputs = np.array([[rng.integers(0, 2 + i), rng.integers(0, 2 + i)] for i in range(5)])
    ops = rng.integers(0, len(_NAS_OPS), size=(5, 2))
    return inputs, ops


def make_nas(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """AmoebaNet-like cells: normal cells with two reduction cells, five branch pairs per cell."""
    target = _check(target_nodes, 40, "nas")
    rng = np.random.default_rng(seed)
    normal, reduction = _genotype(rng), _genotype(rng)
    unit = 18  # pre0, pre1, 5 x (op a, op b, add), concat
    cells = max(3, (target - 5) // unit)
    red_at = {cells // 3, (2 * cells) // 3}
    b, c0, hw0 = 64, 64, 32 * 32
    nb = _Nodes()
    stem = nb.grow(2) + np.arange(2)
    nb.at(stem, "conv2d", 2 * b * hw0 * 27 * c0, b * hw0 * c0 * _F32, 27 * c0 * _F32)
    nb.edges(stem[0], stem[1])
    base = nb.grow(cells * unit) + unit * np.arange(cells, dtype=np.int64)
    outs = np.concatenate((stem, base + unit - 1))       # out(i) = outs[i + 2]
    a_in, b_in = outs[:-2], outs[1:-1]
    stage = np.searchsorted(np.array(sorted(red_at)), np.arange(cells), side="right")
    is_red = np.isin(np.arange(cells), list(red_at))
    for kind, (inputs, ops) in ((False, normal), (True, reduction)):
        sel = np.flatnonzero(is_red == kind)
        if sel.size == 0:
            continue
        cb = base[sel]
        for s in np.unique(stage[sel]):
            part = sel[stage[sel] == s]
            c, hw = c0 * 2 ** int(s), hw0 >> (2 * int(s))
            act = b * hw * c * _F32
            pb = base[part]
            nb.at(np.concatenate((pb, pb + 1)), "conv1x1", 2 * b * hw * c * c, act, c * c * _F32)
            for j in range(5):
                for side in range(2):
                    name, kk, mult = _NAS_OPS[int(ops[j, side])]
                    nb.at(pb + 2 + 3 * j + side, name, 2 * b * hw * c * (kk + mult * c), act,
                          (kk * c + mult * c * c) * _F32)
                nb.at(pb + 4 + 3 * j, "add", b * hw * c, act, 0, 0)
            nb.at(pb + 17, "cat", b * hw * c, act, 0, 0)
        nb.edges(a_in[sel], cb)
        nb.edges(b_in[sel], cb + 1)
        state = [cb, cb + 1] + [cb + 4 + 3 * j for j in range(5)]
        used = set()
        for j in range(5):
            for side in range(2):
                src_state = int(inputs[j, side])
                used.add(src_state)
                nb.edges(state[src_state], cb + 2 + 3 * j + side)
                nb.edges(cb + 2 + 3 * j + side, cb + 4 + 3 * j)
        unused = [s for s in range(2, 7) if s not in used] or [6]
        for s in unused:
            nb.edges(state[s], cb + 17)
    head = nb.grow(3) + np.arange(3)
    c_last = c0 * 4
    nb.at(head[:1], "avg_pool", b * 64 * c_last, b * c_last * _F32)
    nb.at(head[1:2], "linear", 2 * b * c_last * 1000, b * 1000 * _F32, c_last * 1000 * _F32)
    nb.at(head[2:], "cross_entropy", 4 * b * 1000, b * _F32, 0, b * 1000 * _F32)
    nb.edges(np.concatenate(([outs[-1]], head[:-1])), head)
    return nb.graph("nas", seed, {"cells": cells}, batch_size=b)


def make_unet(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """An encoder-decoder (U-Net): conv units per level, a long skip per level across the middle."""
    target = _check(target_nodes, 40, "unet")
    rng = np.random.default_rng(seed)
    levels = int(rng.choice([4, 5]))
    b, side = 4, 256
    segments = 2 * levels - 1
    per = max(1, (target - 2 - 3 * levels) // (3 * segments))
    nb = _Nodes()
    inp = nb.grow(1)
    nb.at([inp], "input", 0, b * side * side * 3 * _F32, 0, 0)
    prev, cin = inp, 3

    def convs(level: int, first_in: int | np.integer, cin: int) -> tuple[int, int]:
        c, hw = 64 * 2 ** level, (side >> level) ** 2
        act = b * hw * c * _F32
        base = nb.grow(3 * per) + 3 * np.arange(per, dtype=np.int64)
        nb.at(base[:1], "conv2d", 2 * b * hw * 9 * cin * c, act, 9 * cin * c * _F32)
        nb.at(base[1:], "conv2d", 2 * b * hw * 9 * c * c, act, 9 * c * c * _F32)
        nb.at(base + 1, "batch_norm", 10 * b * hw * c, act, 2 * c * _F32)
        nb.at(base + 2, "relu", b * hw * c, act)
        nb.edges(np.concatenate((np.array([first_in], np.int64), base[1:] - 1)), base)
        nb.edges(base, base + 1)
        nb.edges(base + 1, base + 2)
        return int(base[-1] + 2), c

    skips = []
    for lv in range(levels):
        prev, cin = convs(lv, prev, cin)
        if lv < levels - 1:
            skips.append((prev, cin))
            pool = nb.grow(1)
            hw = (side >> (lv + 1)) ** 2
            nb.at([pool], "max_pool", 4 * b * hw * cin, b * hw * cin * _F32)
            nb.edges(prev, pool)
            prev = pool
    for lv in range(levels - 2, -1, -1):
        c, hw = 64 * 2 ** lv, (side >> lv) ** 2
        up, cat = nb.grow(2) + np.arange(2)
        nb.at([up], "conv_transpose2d", 2 * b * hw * 4 * cin * c, b * hw * c * _F32,
              4 * cin * c * _F32)
        skip, skip_c = skips[lv]
        nb.at([cat], "cat", b * hw * 2 * c, b * hw * 2 * c * _F32, 0, 0)
        nb.edges(prev, up)
        nb.edges(up, cat)
        nb.edges(skip, cat)
        prev, cin = convs(lv, cat, c + skip_c)
    head = nb.grow(2) + np.arange(2)
    hw = side * side
    nb.at(head[:1], "conv2d", 2 * b * hw * cin * 2, b * hw * 2 * _F32, 2 * cin * _F32)
    nb.at(head[1:], "cross_entropy", 4 * b * hw * 2, _F32, 0, b * hw * 2 * _F32)
    nb.edges(np.array([prev, head[0]]), head)
    return nb.graph("unet", seed, {"levels": levels, "convs_per_level": per}, batch_size=b)


def make_chain(target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """A chain on 32 x 32 images: five stages of conv-relu layers (spatial size halving,
    channels doubling from a random width, a max-pool between stages), then a classifier of
    three wide linears."""
    target = _check(target_nodes, 20, "chain")
    rng = np.random.default_rng(seed)
    b = 32
    head = 7  # flatten, (linear, relu) x 2, linear, loss
    layers = max(5, (target - head - 4) // 2)
    per_stage = [layers // 5 + (1 if s < layers % 5 else 0) for s in range(5)]
    c0 = int(rng.choice([16, 32, 64]))
    nb = _Nodes()
    first = nb.grow(1)
    nb.at([first], "input", 0, b * 3 * 32 * 32 * _F32, 0, 0)
    prev, cin = first, 3
    for s, count in enumerate(per_stage):
        c, hw = c0 * 2 ** s, (32 >> s) ** 2
        act = b * hw * c * _F32
        if s:
            pool = nb.grow(1)
            nb.at([pool], "max_pool", b * hw * 4 * cin, b * hw * cin * _F32)
            nb.edges(prev, pool)
            prev = pool
        base = nb.grow(2 * count) + 2 * np.arange(count, dtype=np.int64)
        nb.at(base[:1], "conv2d", 2 * b * hw * 9 * cin * c, act, 9 * cin * c * _F32)
        nb.at(base[1:], "conv2d", 2 * b * hw * 9 * c * c, act, 9 * c * c * _F32)
        nb.at(base + 1, "relu", b * hw * c, act)
        nb.edges(np.concatenate(([prev], base[:-1] + 1)), base)
        nb.edges(base, base + 1)
        prev, cin = int(base[-1] + 1), c
    flat = cin  # after a last pool to 1 x 1
    wide = int(rng.choice([2048, 4096]))
    hd = nb.grow(head) + np.arange(head)
    nb.at(hd[:1], "flatten", b * flat, b * flat * _F32, 0, 0)
    nb.at(hd[1:2], "linear", 2 * b * flat * wide, b * wide * _F32, flat * wide * _F32)
    nb.at(hd[2:3], "relu", b * wide, b * wide * _F32)
    nb.at(hd[3:4], "linear", 2 * b * wide * wide, b * wide * _F32, wide * wide * _F32)
    nb.at(hd[4:5], "relu", b * wide, b * wide * _F32)
    nb.at(hd[5:6], "linear", 2 * b * wide * 1000, b * 1000 * _F32, wide * 1000 * _F32)
    nb.at(hd[6:], "cross_entropy", 4 * b * 1000, b * _F32, 0, b * 1000 * _F32)
    nb.edges(np.concatenate(([prev], hd[:-1])), hd)
    return nb.graph("chain", seed, {"layers": layers, "width": c0, "classifier": wide},
                    batch_size=b)


FAMILIES: dict[str, Callable[[int, int], Graph]] = {
    "rnn": make_rnn, "resnet": make_resnet, "transformer": make_transformer, "nas": make_nas,
    "unet": make_unet, "chain": make_chain,
}


def make(family: str, target_nodes: int = 10_000, seed: int = 0) -> Graph:
    """``make_<family>(target_nodes, seed)`` by name (see :data:`FAMILIES`)."""
    try:
        fn = FAMILIES[family]
    except KeyError:
        raise UsageError(f"unknown graph family {family!r}: use one of "
                         f"{', '.join(sorted(FAMILIES))}") from None
    return fn(target_nodes, seed)
